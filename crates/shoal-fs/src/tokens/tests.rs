use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

const A: ClientId = 1;
const B: ClientId = 2;
const C: ClientId = 3;
const F: Ino = 10;

fn with_clients(clients: &[ClientId]) -> Tokens {
    let mut t = Tokens::new();
    for c in clients {
        t.hello(0, *c);
    }
    t
}

fn grant(level: Level) -> Decision {
    Decision::Grant {
        level,
        uncached: false,
    }
}

fn callbacks(t: &mut Tokens) -> Vec<(ClientId, Callback)> {
    std::iter::from_fn(|| t.poll_callback()).collect()
}

#[test]
fn unknown_clients_say_hello_first() {
    let mut t = Tokens::new();
    assert_eq!(
        t.request(A, F, Want::Look, Opens::default()),
        Decision::NoSession
    );
    assert!(!t.renew(0, A));
    assert!(t.renew(1, A));
}

#[test]
fn readers_share() {
    let mut t = with_clients(&[A, B]);
    assert_eq!(
        t.request(A, F, Want::OpenRead, Opens::default()),
        grant(Level::Read)
    );
    assert_eq!(
        t.request(B, F, Want::OpenRead, Opens::default()),
        grant(Level::Read)
    );
    assert_eq!(
        t.request(C, F, Want::Look, Opens::default()),
        Decision::NoSession
    );
    assert!(callbacks(&mut t).is_empty());
}

#[test]
fn sequential_write_sharing_recalls_the_writer() {
    let mut t = with_clients(&[A, B]);
    assert_eq!(
        t.request(A, F, Want::OpenWrite, Opens::default()),
        grant(Level::Write)
    );
    // A closed its file (no message); B opens it.
    assert_eq!(
        t.request(B, F, Want::OpenRead, Opens::default()),
        Decision::Wait { recalled: vec![A] }
    );
    assert_eq!(
        callbacks(&mut t),
        vec![(
            A,
            Callback::Recall {
                ino: F,
                to: Level::Read
            }
        )]
    );
    // Asking again while the recall is out sends no second recall.
    assert_eq!(
        t.request(B, F, Want::OpenRead, Opens::default()),
        Decision::Wait { recalled: vec![A] }
    );
    assert!(callbacks(&mut t).is_empty());
    // A wrote back and keeps Read; B gets Read.
    t.returned(A, F, Level::Read, Opens::default());
    assert_eq!(
        t.request(B, F, Want::OpenRead, Opens::default()),
        grant(Level::Read)
    );
    assert_eq!(t.level(A, F), Level::Read);
    assert!(!t.is_shared(F));
    t.check();
}

#[test]
fn concurrent_write_sharing_stops_caching_until_it_ends() {
    let mut t = with_clients(&[A, B]);
    assert_eq!(
        t.request(A, F, Want::OpenWrite, Opens::default()),
        grant(Level::Write)
    );
    assert!(matches!(
        t.request(B, F, Want::OpenRead, Opens::default()),
        Decision::Wait { .. }
    ));
    callbacks(&mut t);
    // A still has the file open for writing.
    t.returned(
        A,
        F,
        Level::Read,
        Opens {
            readers: 0,
            writers: 1,
        },
    );
    assert_eq!(
        t.request(B, F, Want::OpenRead, Opens::default()),
        Decision::Wait { recalled: vec![A] }
    );
    assert_eq!(
        callbacks(&mut t),
        vec![(
            A,
            Callback::Recall {
                ino: F,
                to: Level::None
            }
        )]
    );
    t.returned(
        A,
        F,
        Level::None,
        Opens {
            readers: 0,
            writers: 1,
        },
    );
    assert_eq!(
        t.request(B, F, Want::OpenRead, Opens::default()),
        Decision::Grant {
            level: Level::None,
            uncached: true
        }
    );
    assert_eq!(
        callbacks(&mut t),
        vec![(A, Callback::StopCaching { ino: F })]
    );
    assert!(t.is_shared(F));
    t.check();
    // A third client looking at it gets nothing to cache either.
    t.hello(0, C);
    assert_eq!(
        t.request(C, F, Want::Look, Opens::default()),
        Decision::Grant {
            level: Level::None,
            uncached: true
        }
    );
    // The writer closes: only B has it open, the sharing ends.
    assert!(t.close(A, F, true));
    assert!(!t.is_shared(F));
    assert_eq!(
        t.request(C, F, Want::OpenRead, Opens::default()),
        grant(Level::Read)
    );
    t.check();
}

#[test]
fn a_writer_recalls_readers_and_learns_their_opens() {
    let mut t = with_clients(&[A, B, C]);
    assert_eq!(
        t.request(A, F, Want::OpenRead, Opens::default()),
        grant(Level::Read)
    );
    assert_eq!(
        t.request(B, F, Want::Look, Opens::default()),
        grant(Level::Read)
    );
    let Decision::Wait { recalled } = t.request(C, F, Want::OpenWrite, Opens::default()) else {
        panic!()
    };
    assert_eq!(recalled, vec![A, B]);
    t.returned(
        A,
        F,
        Level::None,
        Opens {
            readers: 1,
            writers: 0,
        },
    );
    assert!(matches!(
        t.request(C, F, Want::OpenWrite, Opens::default()),
        Decision::Wait { .. }
    ));
    t.returned(B, F, Level::None, Opens::default());
    assert_eq!(
        t.request(C, F, Want::OpenWrite, Opens::default()),
        Decision::Grant {
            level: Level::None,
            uncached: true
        }
    );
    assert!(t.is_shared(F));
    // The reader closes: the sharing ends, C's next open may cache.
    assert!(t.close(A, F, false));
    t.check();
}

#[test]
fn directories_are_owned_alone_or_changed_at_the_primary() {
    let mut t = with_clients(&[A, B, C]);
    let d = 20;
    assert_eq!(
        t.request(A, d, Want::Change, Opens::default()),
        grant(Level::Write)
    );
    assert!(matches!(
        t.request(B, d, Want::Look, Opens::default()),
        Decision::Wait { .. }
    ));
    t.returned(A, d, Level::Read, Opens::default());
    assert_eq!(
        t.request(B, d, Want::Look, Opens::default()),
        grant(Level::Read)
    );
    callbacks(&mut t);
    // C wants to change a name in it: others hold it, so no recall; the
    // change is the primary's, and A and B are told.
    assert_eq!(
        t.request(C, d, Want::Change, Opens::default()),
        grant(Level::Read)
    );
    assert!(callbacks(&mut t).is_empty());
    let id = t.notify(C, d).expect("readers to tell");
    assert_eq!(
        callbacks(&mut t),
        vec![
            (A, Callback::Notice { id, dir: d }),
            (B, Callback::Notice { id, dir: d })
        ]
    );
    assert!(!t.notice_done(id));
    t.confirm(A, id);
    assert!(!t.notice_done(id));
    // B's lease ends instead of its confirmation.
    t.expire(0, Some(B));
    assert!(t.notice_done(id));
    // C holds Read since its change: A's next change tells C alone.
    let next = t.notify(A, d).expect("C holds it");
    assert_eq!(
        callbacks(&mut t),
        vec![(C, Callback::Notice { id: next, dir: d })]
    );
    t.expire(0, Some(C));
    assert_eq!(t.notify(A, d), None, "nobody else holds it now");
}

#[test]
fn leases_release_everything() {
    let mut t = with_clients(&[A, B]);
    assert_eq!(
        t.request(A, F, Want::OpenWrite, Opens::default()),
        grant(Level::Write)
    );
    assert!(matches!(
        t.request(B, F, Want::OpenRead, Opens::default()),
        Decision::Wait { .. }
    ));
    callbacks(&mut t);
    t.returned(
        A,
        F,
        Level::None,
        Opens {
            readers: 0,
            writers: 1,
        },
    );
    assert!(matches!(
        t.request(B, F, Want::OpenRead, Opens::default()),
        Decision::Grant { uncached: true, .. }
    ));
    callbacks(&mut t);
    t.renew(LEASE_US / 2, B);
    assert_eq!(t.next_expiry(), Some(LEASE_US));
    let (gone, closed) = t.expire(LEASE_US, None);
    assert_eq!(gone, vec![A]);
    assert_eq!(closed, Vec::<Ino>::new(), "B still has it open");
    assert!(!t.is_shared(F));
    assert_eq!(
        t.request(A, F, Want::Look, Opens::default()),
        Decision::NoSession
    );
    let (gone, closed) = t.expire(LEASE_US / 2 + LEASE_US, None);
    assert_eq!((gone, closed), (vec![B], vec![F]));
    assert!(t.inodes.is_empty());
}

/// One client as the model sees it: what it really has open.
#[derive(Default, Clone)]
struct Model {
    opens: HashMap<Ino, (Opens, bool)>,
}

fn deliver(t: &mut Tokens, models: &HashMap<ClientId, Model>) {
    while let Some((c, cb)) = t.poll_callback() {
        if let Callback::Recall { ino, to } = cb {
            let opens = models
                .get(&c)
                .and_then(|m| m.opens.get(&ino))
                .map(|(o, _)| *o)
                .unwrap_or_default();
            t.returned(c, ino, to, opens);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Honest clients opening, closing, looking and crashing in any order:
    /// the token rules always hold, every request is answered once its
    /// recalls are, and whenever two clients have a file open and one of
    /// them writes, neither may cache it (Sprite's rule).
    #[test]
    fn sprites_rule_holds(actions in proptest::collection::vec((0u8..6, 1u64..4, 10u64..13), 1..80)) {
        let mut t = Tokens::new();
        let mut models: HashMap<ClientId, Model> = HashMap::new();
        for (action, c, ino) in actions {
            if !t.knows(c) {
                t.hello(0, c);
                models.insert(c, Model::default());
            }
            match action {
                0..=2 => {
                    let want = [Want::Look, Want::OpenRead, Want::OpenWrite][action as usize];
                    let have = models[&c].opens.get(&ino).map(|(o, _)| *o).unwrap_or_default();
                    let mut answer = t.request(c, ino, want, have);
                    for _ in 0..4 {
                        if !matches!(answer, Decision::Wait { .. }) {
                            break;
                        }
                        deliver(&mut t, &models);
                        answer = t.request(c, ino, want, have);
                    }
                    let Decision::Grant { uncached, .. } = answer else {
                        panic!("no answer after the recalls: {answer:?}");
                    };
                    if want != Want::Look {
                        let m = models.get_mut(&c).unwrap();
                        let (o, known) = m.opens.entry(ino).or_default();
                        if want == Want::OpenWrite { o.writers += 1 } else { o.readers += 1 }
                        *known |= uncached;
                    }
                }
                3 => {
                    let m = models.get_mut(&c).unwrap();
                    if let Some((o, known)) = m.opens.get_mut(&ino) {
                        let writer = o.writers > 0;
                        if writer { o.writers -= 1 } else { o.readers -= 1 }
                        let known = *known;
                        if o.is_empty() {
                            m.opens.remove(&ino);
                        }
                        if known || t.inodes.get(&ino).is_some_and(|s| s.opens.contains_key(&c)) {
                            t.close(c, ino, writer);
                        }
                    }
                }
                4 => {
                    t.expire(0, Some(c));
                    models.remove(&c);
                }
                _ => {
                    // A name change in a directory (inodes 20..23).
                    let dir = ino + 10;
                    let mut answer = t.request(c, dir, Want::Change, Opens::default());
                    for _ in 0..4 {
                        if !matches!(answer, Decision::Wait { .. }) {
                            break;
                        }
                        deliver(&mut t, &models);
                        answer = t.request(c, dir, Want::Change, Opens::default());
                    }
                    prop_assert!(matches!(answer, Decision::Grant { uncached: false, .. }), "{:?}", answer);
                }
            }
            deliver(&mut t, &models);
            t.check();
            for ino in 10..13 {
                let open: Vec<(ClientId, Opens)> = models.iter()
                    .filter_map(|(c, m)| m.opens.get(&ino).map(|(o, _)| (*c, *o)))
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
