//! Tests of the tokens: sharing, sequential and concurrent write
//! sharing, recalls, directories owned alone, leases, and Sprite's
//! consistency rule as a property over random actions.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;

use super::*;

const A: ClientId = ClientId(1);
const B: ClientId = ClientId(2);
const C: ClientId = ClientId(3);
const F: Ino = Ino(10);

fn with_clients(clients: &[ClientId]) -> Tokens {
    let mut t = Tokens::new();
    for c in clients {
        t.hello(Time::ZERO, *c);
    }
    t
}

/// A decision without its grant number, to compare.
fn plain(d: Decision) -> Decision {
    match d {
        Decision::Grant {
            level, uncached, ..
        } => Decision::Grant {
            level,
            uncached,
            grant: 0,
        },
        other => other,
    }
}

fn grant(level: Level) -> Decision {
    Decision::Grant {
        level,
        uncached: false,
        grant: 0,
    }
}

/// A callback without its grant number, to compare.
fn plain_cb(cb: (ClientId, Callback)) -> (ClientId, Callback) {
    match cb {
        (c, Callback::Recall { ino, to, .. }) => (c, Callback::Recall { ino, to, grant: 0 }),
        (c, Callback::StopCaching { ino, .. }) => (c, Callback::StopCaching { ino, grant: 0 }),
        other => other,
    }
}

fn callbacks(t: &mut Tokens) -> Vec<(ClientId, Callback)> {
    std::iter::from_fn(|| t.poll_callback()).collect()
}

/// Client `c` asks for `want` on the file `F`, opening it (`OpenId(90)`).
fn ask(t: &mut Tokens, c: ClientId, want: Want) -> Decision {
    t.request(c, F, want, &[], Some(OpenId(90)))
}

/// Client `c` gives back its token on `F` for its current grant, keeping
/// `kept`, with its opens as `opens`.
fn give_back(t: &mut Tokens, c: ClientId, kept: Level, opens: &[(OpenId, bool)]) {
    let grant = t.grant_of(c, F);
    t.returned(c, F, grant, kept, opens);
}

#[test]
fn unknown_clients_say_hello_first() {
    let mut t = Tokens::new();
    assert_eq!(ask(&mut t, A, Want::Look), Decision::NoSession);
    assert!(!t.renew(Time::ZERO, A));
    assert!(t.renew(Time(1), A));
}

#[test]
fn readers_share() {
    let mut t = with_clients(&[A, B]);
    assert_eq!(plain(ask(&mut t, A, Want::OpenRead)), grant(Level::Read));
    assert_eq!(plain(ask(&mut t, B, Want::OpenRead)), grant(Level::Read));
    assert_eq!(ask(&mut t, C, Want::Look), Decision::NoSession);
    assert!(callbacks(&mut t).is_empty());
}

#[test]
fn sequential_write_sharing_recalls_the_writer() {
    let mut t = with_clients(&[A, B]);
    assert_eq!(plain(ask(&mut t, A, Want::OpenWrite)), grant(Level::Write));
    // A closed its file (no message); B opens it.
    assert_eq!(
        ask(&mut t, B, Want::OpenRead),
        Decision::Wait { recalled: vec![A] }
    );
    assert_eq!(
        callbacks(&mut t)
            .into_iter()
            .map(plain_cb)
            .collect::<Vec<_>>(),
        vec![(
            A,
            Callback::Recall {
                ino: F,
                to: Level::Read,
                grant: 0
            }
        )]
    );
    // Asking again while the recall is out sends no second recall.
    assert_eq!(
        ask(&mut t, B, Want::OpenRead),
        Decision::Wait { recalled: vec![A] }
    );
    assert!(callbacks(&mut t).is_empty());
    // A wrote back and keeps Read; B gets Read.
    give_back(&mut t, A, Level::Read, &[]);
    assert_eq!(plain(ask(&mut t, B, Want::OpenRead)), grant(Level::Read));
    assert_eq!(t.level(A, F), Level::Read);
    assert!(!t.is_shared(F));
    t.check();
}

#[test]
fn concurrent_write_sharing_stops_caching_until_it_ends() {
    let mut t = with_clients(&[A, B]);
    assert_eq!(plain(ask(&mut t, A, Want::OpenWrite)), grant(Level::Write));
    assert!(matches!(
        ask(&mut t, B, Want::OpenRead),
        Decision::Wait { .. }
    ));
    callbacks(&mut t);
    // A still has the file open for writing.
    give_back(&mut t, A, Level::Read, &[(OpenId(1), true)]);
    assert_eq!(
        ask(&mut t, B, Want::OpenRead),
        Decision::Wait { recalled: vec![A] }
    );
    assert_eq!(
        callbacks(&mut t)
            .into_iter()
            .map(plain_cb)
            .collect::<Vec<_>>(),
        vec![(
            A,
            Callback::Recall {
                ino: F,
                to: Level::None,
                grant: 0
            }
        )]
    );
    give_back(&mut t, A, Level::None, &[(OpenId(1), true)]);
    assert_eq!(
        plain(ask(&mut t, B, Want::OpenRead)),
        Decision::Grant {
            level: Level::None,
            uncached: true,
            grant: 0
        }
    );
    assert_eq!(
        callbacks(&mut t)
            .into_iter()
            .map(plain_cb)
            .collect::<Vec<_>>(),
        vec![(A, Callback::StopCaching { ino: F, grant: 0 })]
    );
    assert!(t.is_shared(F));
    t.check();
    // A third client looking at it gets nothing to cache either.
    t.hello(Time::ZERO, C);
    assert_eq!(
        plain(ask(&mut t, C, Want::Look)),
        Decision::Grant {
            level: Level::None,
            uncached: true,
            grant: 0
        }
    );
    // The writer closes: only B has it open, the sharing ends.
    assert!(t.close(A, F, OpenId(1)));
    assert!(!t.is_shared(F));
    assert_eq!(plain(ask(&mut t, C, Want::OpenRead)), grant(Level::Read));
    t.check();
}

#[test]
fn a_writer_recalls_readers_and_learns_their_opens() {
    let mut t = with_clients(&[A, B, C]);
    assert_eq!(plain(ask(&mut t, A, Want::OpenRead)), grant(Level::Read));
    assert_eq!(plain(ask(&mut t, B, Want::Look)), grant(Level::Read));
    let Decision::Wait { recalled } = ask(&mut t, C, Want::OpenWrite) else {
        panic!()
    };
    assert_eq!(recalled, vec![A, B]);
    give_back(&mut t, A, Level::None, &[(OpenId(1), false)]);
    assert!(matches!(
        ask(&mut t, C, Want::OpenWrite),
        Decision::Wait { .. }
    ));
    give_back(&mut t, B, Level::None, &[]);
    assert_eq!(
        plain(ask(&mut t, C, Want::OpenWrite)),
        Decision::Grant {
            level: Level::None,
            uncached: true,
            grant: 0
        }
    );
    assert!(t.is_shared(F));
    // The reader closes: the sharing ends, C's next open may cache.
    assert!(t.close(A, F, OpenId(1)));
    t.check();
}

#[test]
fn directories_are_owned_alone_or_changed_at_the_primary() {
    let mut t = with_clients(&[A, B, C]);
    let d = Ino(20);
    assert_eq!(
        plain(t.request(A, d, Want::Change, &[], Some(OpenId(90)))),
        grant(Level::Write)
    );
    assert!(matches!(
        t.request(B, d, Want::Look, &[], Some(OpenId(90))),
        Decision::Wait { .. }
    ));
    t.returned(A, d, t.grant_of(A, d), Level::Read, &[]);
    assert_eq!(
        plain(t.request(B, d, Want::Look, &[], Some(OpenId(90)))),
        grant(Level::Read)
    );
    callbacks(&mut t);
    // C wants to change a name in it: others hold it, so no recall; the
    // change is the primary's, and A and B are told.
    assert_eq!(
        plain(t.request(C, d, Want::Change, &[], Some(OpenId(90)))),
        grant(Level::Read)
    );
    assert!(callbacks(&mut t).is_empty());
    let id = t.notify(C, d, b"x").expect("readers to tell");
    assert_eq!(
        callbacks(&mut t)
            .into_iter()
            .map(plain_cb)
            .collect::<Vec<_>>(),
        vec![
            (
                A,
                Callback::Notice {
                    id,
                    dir: d,
                    name: b"x".to_vec()
                }
            ),
            (
                B,
                Callback::Notice {
                    id,
                    dir: d,
                    name: b"x".to_vec()
                }
            )
        ]
    );
    assert!(!t.notice_done(id));
    t.confirm(A, id);
    assert!(!t.notice_done(id));
    // B's lease ends instead of its confirmation.
    t.expire(Time::ZERO, Some(B));
    assert!(t.notice_done(id));
    // C holds Read since its change: A's next change tells C alone.
    let next = t.notify(A, d, b"y").expect("C holds it");
    assert_eq!(
        callbacks(&mut t)
            .into_iter()
            .map(plain_cb)
            .collect::<Vec<_>>(),
        vec![(
            C,
            Callback::Notice {
                id: next,
                dir: d,
                name: b"y".to_vec()
            }
        )]
    );
    t.expire(Time::ZERO, Some(C));
    assert_eq!(t.notify(A, d, b"z"), None, "nobody else holds it now");
}

#[test]
fn leases_release_everything() {
    let mut t = with_clients(&[A, B]);
    assert_eq!(plain(ask(&mut t, A, Want::OpenWrite)), grant(Level::Write));
    assert!(matches!(
        ask(&mut t, B, Want::OpenRead),
        Decision::Wait { .. }
    ));
    callbacks(&mut t);
    give_back(&mut t, A, Level::None, &[(OpenId(1), true)]);
    assert!(matches!(
        ask(&mut t, B, Want::OpenRead),
        Decision::Grant { uncached: true, .. }
    ));
    callbacks(&mut t);
    t.renew(Time::ZERO + LEASE / 2, B);
    assert_eq!(t.next_expiry(), Some(Time::ZERO + LEASE));
    let (gone, closed) = t.expire(Time::ZERO + LEASE, None);
    assert_eq!(gone, vec![A]);
    assert_eq!(closed, Vec::<Ino>::new(), "B still has it open");
    assert!(!t.is_shared(F));
    assert_eq!(ask(&mut t, A, Want::Look), Decision::NoSession);
    let (gone, closed) = t.expire(Time::ZERO + LEASE / 2 + LEASE, None);
    assert_eq!((gone, closed), (vec![B], vec![F]));
    assert!(t.inodes.is_empty());
}

/// One client as the model sees it: its opens of each file (for writing
/// or not) and which of them the primary may know of.
#[derive(Default, Clone)]
struct Model {
    opens: HashMap<Ino, BTreeMap<OpenId, bool>>,
    known: BTreeSet<OpenId>,
    next: OpenId,
}

/// Asks until the answer is not "wait", delivering the recalls between
/// (honest clients answer at once); at most a few rounds.
fn settle(
    t: &mut Tokens,
    models: &mut HashMap<ClientId, Model>,
    mut ask: impl FnMut(&mut Tokens) -> Decision,
) -> Decision {
    let mut answer = ask(t);
    for _ in 0..4 {
        if !matches!(answer, Decision::Wait { .. }) {
            break;
        }
        deliver(t, models);
        answer = ask(t);
    }
    answer
}

fn deliver(t: &mut Tokens, models: &mut HashMap<ClientId, Model>) {
    while let Some((c, cb)) = t.poll_callback() {
        if let Callback::Recall { ino, to, grant } = cb {
            let m = models.entry(c).or_default();
            let list: Vec<(OpenId, bool)> = m
                .opens
                .get(&ino)
                .map(|o| o.iter().map(|(i, w)| (*i, *w)).collect())
                .unwrap_or_default();
            m.known.extend(list.iter().map(|(i, _)| *i));
            let kept = if list.iter().any(|(_, w)| *w) {
                Level::None
            } else {
                to
            };
            t.returned(c, ino, grant, kept, &list);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Honest clients opening, closing, looking, changing names and
    /// crashing in any order: the token rules always hold, every request
    /// is answered once its recalls are, and whenever two clients have a
    /// file open and one of them writes, neither may cache it (Sprite's
    /// rule).
    #[test]
    fn sprites_rule_holds(actions in proptest::collection::vec((0u8..7, 1u64..4, 10u64..13), 1..80)) {
        let mut t = Tokens::new();
        let mut epoch = 1;
        let mut models: HashMap<ClientId, Model> = HashMap::new();
        for (action, c, ino) in actions {
            let (c, ino) = (ClientId(c), Ino(ino));
            if !t.knows(ClientId(c.0)) {
                t.hello(Time::ZERO, ClientId(c.0));
                models.insert(ClientId(c.0), Model::default());
            }
            match action {
                0..=2 => {
                    let want = [Want::Look, Want::OpenRead, Want::OpenWrite][action as usize];
                    let m = models.get_mut(&c).unwrap();
                    m.next.0 += 1;
                    let id = m.next;
                    let have: Vec<(OpenId, bool)> = m.opens.get(&ino)
                        .map(|o| o.iter().map(|(i, w)| (*i, *w)).collect())
                        .unwrap_or_default();
                    let new = (want != Want::Look).then_some(id);
                    let answer = settle(&mut t, &mut models, |t| t.request(ClientId(c.0), Ino(ino.0), want, &have, new));
                    let Decision::Grant { uncached, .. } = answer else {
                        panic!("no answer after the recalls: {answer:?}");
                    };
                    let m = models.get_mut(&c).unwrap();
                    if want != Want::Look {
                        m.opens.entry(Ino(ino.0)).or_default().insert(id, want == Want::OpenWrite);
                    }
                    if uncached {
                        m.known.extend(have.iter().map(|(i, _)| *i));
                        m.known.insert(id);
                    }
                }
                3 => {
                    let m = models.get_mut(&c).unwrap();
                    if let Some(o) = m.opens.get_mut(&ino)
                        && let Some((&id, _)) = o.iter().next()
                    {
                        o.remove(&id);
                        if m.known.remove(&id) {
                            t.close(ClientId(c.0), Ino(ino.0), id);
                        }
                    }
                }
                4 => {
                    t.expire(Time::ZERO, Some(ClientId(c.0)));
                    models.remove(&c);
                }
                6 => {
                    // The primary changes: every client reclaims what it
                    // holds; honest clients' reclaims all agree.
                    let old = std::mem::replace(&mut t, Tokens::after_change(epoch));
                    epoch += 1;
                    for (c, m) in models.iter_mut() {
                        t.hello(Time::ZERO, *c);
                        for ino in (10..13).chain(20..23).map(Ino) {
                            let level = old.level(*c, ino);
                            let list: Vec<(OpenId, bool)> = m.opens.get(&ino)
                                .map(|o| o.iter().map(|(i, w)| (*i, *w)).collect())
                                .unwrap_or_default();
                            if level == Level::None && list.is_empty() {
                                continue;
                            }
                            m.known.extend(list.iter().map(|(i, _)| *i));
                            let r = t.reclaim(Time::ZERO, *c, ino, level, true, &list);
                            prop_assert!(r.is_ok(), "client {} reclaiming {:?} on {}: {:?}", c, level, ino, r);
                        }
                    }
                    t.end_grace();
                }
                _ => {
                    // A name change in a directory (inodes 20..23).
                    let dir = ino.plus(10);
                    let answer = settle(&mut t, &mut models, |t| t.request(ClientId(c.0), dir, Want::Change, &[], None));
                    prop_assert!(matches!(answer, Decision::Grant { uncached: false, .. }), "{:?}", answer);
                }
            }
            deliver(&mut t, &mut models);
            t.check();
            for ino in (10..13).map(Ino) {
                let open: Vec<(ClientId, Opens)> = models.iter()
                    .filter_map(|(c, m)| m.opens.get(&ino).filter(|o| !o.is_empty()).map(|o| {
                        let list: Vec<(OpenId, bool)> = o.iter().map(|(i, w)| (*i, *w)).collect();
                        (*c, Opens::of(&list))
                    }))
                    .collect();
                if open.len() > 1 && open.iter().any(|(_, o)| o.writers > 0) {
                    for (c, _) in &open {
                        prop_assert_eq!(t.level(*c, ino), Level::None, "client {} caches write-shared {}", c, ino);
                    }
                }
            }
        }
    }
}

#[test]
fn a_new_primary_takes_reclaims_in_its_grace_period() {
    let mut t = Tokens::after_change(3);
    assert!(t.in_grace());
    // A writer's Write, a reader's Read of another file.
    let g = t
        .reclaim(Time::ZERO, A, F, Level::Write, true, &[(OpenId(1), true)])
        .unwrap();
    assert!(g > 3 << 40, "grants numbered above the earlier primaries'");
    assert_eq!(
        t.reclaim(Time::ZERO, B, Ino(11), Level::Read, true, &[]),
        Ok(g + 1)
    );
    // Conflicting and stale reclaims are refused; their opens are learned.
    assert_eq!(
        t.reclaim(Time::ZERO, C, F, Level::Read, true, &[(OpenId(5), false)]),
        Err(Refused::Conflict)
    );
    assert_eq!(
        t.reclaim(Time::ZERO, C, Ino(11), Level::Read, false, &[]),
        Err(Refused::Stale)
    );
    assert!(t.is_open(F));
    // Nothing new is granted until the grace period ends.
    assert!(matches!(
        t.request(B, Ino(12), Want::Look, &[], None),
        Decision::Wait { .. }
    ));
    t.end_grace();
    assert!(!t.in_grace());
    assert_eq!(
        t.reclaim(Time::ZERO, B, Ino(12), Level::Read, true, &[]),
        Err(Refused::Late)
    );
    // A and C both have F open, A writing: A's reclaimed token is
    // recalled, and C's next open finds the sharing.
    assert_eq!(
        callbacks(&mut t)
            .into_iter()
            .map(plain_cb)
            .collect::<Vec<_>>(),
        vec![(
            A,
            Callback::Recall {
                ino: F,
                to: Level::None,
                grant: 0
            }
        )]
    );
    t.returned(A, F, g, Level::None, &[(OpenId(1), true)]);
    assert_eq!(
        plain(t.request(C, F, Want::OpenRead, &[(OpenId(5), false)], Some(OpenId(6)))),
        Decision::Grant {
            level: Level::None,
            uncached: true,
            grant: 0
        }
    );
    assert_eq!(
        plain(t.request(B, Ino(12), Want::Look, &[], None)),
        grant(Level::Read)
    );
    t.check();
}

#[test]
fn an_inode_without_names_has_every_token_recalled() {
    let mut t = with_clients(&[A, B, C]);
    assert_eq!(
        plain(t.request(A, F, Want::Look, &[], None)),
        grant(Level::Read)
    );
    assert_eq!(
        plain(t.request(B, F, Want::Look, &[], None)),
        grant(Level::Read)
    );
    assert!(t.is_held(F));
    t.recall_all(F);
    let recall = |c| {
        (
            c,
            Callback::Recall {
                ino: F,
                to: Level::None,
                grant: 0,
            },
        )
    };
    let orphan = |c| (c, Callback::Orphan { ino: F });
    let got: Vec<_> = callbacks(&mut t).into_iter().map(plain_cb).collect();
    assert_eq!(got, vec![orphan(A), recall(A), orphan(B), recall(B)]);
    // Their answers: B has it open; then nobody holds it.
    give_back(&mut t, A, Level::None, &[]);
    give_back(&mut t, B, Level::None, &[(OpenId(7), false)]);
    assert!(!t.is_held(F));
    assert!(t.is_open(F));
    t.close(B, F, OpenId(7));
    assert!(!t.is_open(F));
    // Nothing to recall on an inode nobody holds.
    t.recall_all(F);
    assert!(callbacks(&mut t).is_empty());
    t.check();
}

#[test]
fn a_read_by_capability_waits_for_the_writers_write_back() {
    let mut t = with_clients(&[A, B]);
    assert!(t.writers_flushed(F), "nobody holds anything");
    assert_eq!(plain(ask(&mut t, A, Want::OpenWrite)), grant(Level::Write));
    assert!(!t.writers_flushed(F));
    assert_eq!(
        callbacks(&mut t)
            .into_iter()
            .map(plain_cb)
            .collect::<Vec<_>>(),
        vec![(
            A,
            Callback::Recall {
                ino: F,
                to: Level::Read,
                grant: 0
            }
        )]
    );
    // Asked again while the recall is out: still waiting, no second one.
    assert!(!t.writers_flushed(F));
    assert!(callbacks(&mut t).is_empty());
    // A wrote back and keeps Read, as a reader B may also hold.
    give_back(&mut t, A, Level::Read, &[]);
    assert!(t.writers_flushed(F));
    assert_eq!(t.level(A, F), Level::Read);
    t.check();
    // A new primary's grace period: the holders are not known yet.
    let mut after = Tokens::after_change(2);
    assert!(!after.writers_flushed(F));
}

#[test]
fn only_the_sole_holder_without_known_opens_may_take_an_inode_with_its_name() {
    let mut t = with_clients(&[A, B]);
    assert!(!t.only(A, F), "nobody holds it");
    assert_eq!(
        plain(t.request(A, F, Want::OpenWrite, &[], Some(OpenId(1)))),
        grant(Level::Write)
    );
    assert!(t.only(A, F));
    assert!(!t.only(B, F));
    // Another client's look recalls A: not A's alone while that is out.
    assert!(matches!(
        t.request(B, F, Want::Look, &[], None),
        Decision::Wait { .. }
    ));
    assert!(!t.only(A, F));
    let _ = callbacks(&mut t);
    t.forget(F);
    assert!(!t.is_held(F) && !t.is_open(F));
}
