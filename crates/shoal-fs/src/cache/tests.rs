//! Tests of the client cache: what a token lets the kernel keep, recalls
//! and the grants they wait for, pages kept per version, dirty data until
//! write-back, and what a lost session or lease drops.

use super::*;
use crate::model::Timestamp;

fn attr(ino: Ino, kind: Kind, version: u64) -> Attr {
    Attr {
        ino,
        kind,
        perm: 0o644,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        size: 10,
        held: 0,
        atime: Timestamp::new(0, 0),
        mtime: Timestamp::new(0, 0),
        ctime: Timestamp::new(0, 0),
        version,
    }
}

fn answered(step: RecallStep) -> Recall {
    match step {
        RecallStep::Answer(r) => r,
        other => panic!("not answered: {other:?}"),
    }
}

fn grant(level: Level, n: u64) -> Grant {
    Grant {
        level,
        grant: n,
        uncached: false,
    }
}

#[test]
fn a_token_lets_the_kernel_keep_attributes_and_names() {
    let mut c = Cache::default();
    assert_eq!(
        c.entry_ttl(Ino(1), b"a"),
        Duration::ZERO,
        "no token on the directory"
    );
    assert_eq!(
        c.install(&attr(Ino(1), Kind::Dir, 0), &grant(Level::Read, 1)),
        FOREVER
    );
    assert_eq!(c.entry_ttl(Ino(1), b"a"), FOREVER);
    assert!(c.notice(Ino(1), b"a"), "the kernel holds the name");
    assert!(!c.notice(Ino(1), b"a"), "and no longer once invalidated");
    let uncached = Grant {
        uncached: true,
        ..grant(Level::Read, 2)
    };
    assert_eq!(
        c.install(&attr(Ino(2), Kind::File, 0), &uncached),
        Duration::ZERO
    );
}

#[test]
fn a_recall_waits_for_its_grant_and_takes_what_it_names() {
    let mut c = Cache::default();
    c.install(&attr(Ino(1), Kind::Dir, 0), &grant(Level::Read, 1));
    c.entry_ttl(Ino(1), b"x");
    // A recall of grant 3, not seen yet, waits.
    assert!(c.recall(Ino(1), Level::None, 3).is_none());
    assert!(c.ready().is_empty());
    c.install(&attr(Ino(1), Kind::Dir, 0), &grant(Level::Read, 3));
    let ready = c.ready();
    assert_eq!(ready, vec![(Ino(1), Level::None, 3)]);
    let r = answered(c.recall_step(Ino(1), Level::None, 3, 0));
    assert!(r.inval);
    assert_eq!(r.names, vec![b"x".to_vec()]);
    assert_eq!(c.entry_ttl(Ino(1), b"y"), Duration::ZERO, "the token went");
    // An answer carrying a grant older than the recall does not bring
    // the token back.
    assert_eq!(
        c.install(&attr(Ino(1), Kind::Dir, 0), &grant(Level::Read, 2)),
        Duration::ZERO
    );
    // A later grant does.
    assert_eq!(
        c.install(&attr(Ino(1), Kind::Dir, 0), &grant(Level::Read, 4)),
        FOREVER
    );
}

#[test]
fn pages_are_kept_only_for_the_version_they_belong_to() {
    let mut c = Cache::default();
    let open = c.opened(
        &attr(Ino(5), Kind::File, 1),
        &grant(Level::Read, 1),
        Vec::new(),
    );
    assert_eq!(open, Open::Cached { keep: false }, "nothing cached yet");
    assert_eq!(c.open_cached(Ino(5)), Some(Open::Cached { keep: true }));
    assert!(c.content(Ino(5)).is_some());
    // A new version (granted after a recall) drops the pages.
    let (ino, to, g) = c.recall(Ino(5), Level::None, 1).expect("grant seen");
    assert!(answered(c.recall_step(ino, to, g, 0)).inval);
    assert_eq!(c.open_cached(Ino(5)), None, "no token");
    let open = c.opened(
        &attr(Ino(5), Kind::File, 2),
        &grant(Level::Read, 2),
        Vec::new(),
    );
    assert_eq!(open, Open::Cached { keep: false });
    // A stale "stop caching" is ignored; a current one takes the token.
    assert!(!c.stop_caching(Ino(5), 1));
    assert!(c.stop_caching(Ino(5), 2));
    assert!(c.content(Ino(5)).is_none());
}

#[test]
fn a_lost_session_drops_everything() {
    let mut c = Cache::default();
    c.install(&attr(Ino(1), Kind::Dir, 0), &grant(Level::Read, 1));
    c.entry_ttl(Ino(1), b"n");
    let (inodes, names) = c.drop_all();
    assert_eq!(inodes, vec![Ino(1)]);
    assert_eq!(names, vec![(Ino(1), vec![b"n".to_vec()])]);
    assert_eq!(c.entry_ttl(Ino(1), b"n"), Duration::ZERO);
}

#[test]
fn writes_under_write_stay_dirty_until_written_back() {
    let mut c = Cache::default();
    let t = Timestamp::new(5, 0);
    // Without Write, a write goes through the primary.
    c.opened(
        &attr(Ino(7), Kind::File, 1),
        &grant(Level::Read, 1),
        Vec::new(),
    );
    assert_eq!(c.write(Ino(7), Some(0), b"x", (t, Time::ZERO)), None);
    c.opened(
        &attr(Ino(7), Kind::File, 1),
        &grant(Level::Write, 2),
        Vec::new(),
    );
    assert_eq!(c.write(Ino(7), Some(2), b"abc", (t, Time::ZERO)), Some(2));
    assert_eq!(
        c.write(Ino(7), None, b"de", (t, Time::ZERO)),
        Some(10),
        "appends at the size"
    );
    let mut a = attr(Ino(7), Kind::File, 1);
    c.patch(&mut a);
    assert_eq!(a.size, 12);
    assert_eq!(c.dirty_bytes(), 5);
    // A read finishes the base window with the changes.
    let got = c.finish_read(Ino(7), 1, 0, 6, b"0123456789").unwrap();
    assert_eq!(got, b"01abc5");
    // A write-back when due: a write made meanwhile stays dirty.
    let job = c.flush_job(Ino(7)).unwrap();
    assert_eq!(job.changes.len(), 2);
    assert_eq!(c.write(Ino(7), Some(0), b"Z", (t, Time::ZERO)), Some(0));
    let mut committed = attr(Ino(7), Kind::File, 2);
    committed.size = 12;
    c.flushed(&job, &committed, Vec::new(), Time::ZERO);
    assert_eq!(c.dirty_bytes(), 1);
    // A recall cannot take the token while changes are left, and keeps
    // no new one from then on: a program writing all the while goes
    // through the primary, so the write-back catches up.
    assert!(matches!(
        c.recall_step(Ino(7), Level::Read, 2, 0),
        RecallStep::WriteBack
    ));
    let job = c.flush_job(Ino(7)).unwrap();
    assert_eq!(job.version, 2);
    assert_eq!(c.write(Ino(7), None, b"more", (t, Time::ZERO)), None);
    let mut next = attr(Ino(7), Kind::File, 3);
    next.size = 12;
    c.flushed(&job, &next, Vec::new(), Time::ZERO);
    assert!(c.flush_job(Ino(7)).is_none());
    let r = answered(c.recall_step(Ino(7), Level::Read, 2, 1));
    assert!(!r.inval, "a recall to Read keeps the kernel's copy");
    assert_eq!(
        c.write(Ino(7), Some(0), b"x", (t, Time::ZERO)),
        None,
        "Read only now"
    );
}

#[test]
fn a_recall_of_a_token_dropped_with_the_lease_is_carried_out_at_once() {
    let mut c = Cache::default();
    c.install(&attr(Ino(1), Kind::File, 0), &grant(Level::Write, 5));
    c.install(&attr(Ino(2), Kind::File, 0), &grant(Level::Read, 7));
    // The mount's view of its lease ended; the primary's did not yet.
    c.drop_all();
    // The primary recalls the tokens it still thinks the mount holds:
    // waiting for their grants, seen before the drop, would be forever.
    assert_eq!(
        c.recall(Ino(1), Level::None, 5),
        Some((Ino(1), Level::None, 5)),
        "carried out at once"
    );
    // A recall of a grant not seen before the drop still waits for it.
    assert!(c.recall(Ino(2), Level::None, 8).is_none());
    assert!(c.ready().is_empty());
    c.install(&attr(Ino(2), Kind::File, 0), &grant(Level::Read, 8));
    assert_eq!(c.ready(), vec![(Ino(2), Level::None, 8)]);
}

#[test]
fn lost_changes_are_reported_once() {
    let mut c = Cache::default();
    assert!(!c.take_lost(Ino(3)));
    c.lose(Ino(3));
    assert!(c.take_lost(Ino(3)), "the next fsync hears of it");
    assert!(!c.take_lost(Ino(3)), "and only that one");
}

#[test]
fn a_recall_of_a_grant_seen_only_in_a_listing_is_carried_out() {
    let mut c = Cache::default();
    c.install(&attr(Ino(1), Kind::Dir, 0), &grant(Level::Write, 1));
    c.entry_ttl(Ino(1), b"x");
    // A listing's answer renewed the grant (number 2) without attributes;
    // the recall of grant 2 that follows must not wait for ever.
    assert!(c.recall(Ino(1), Level::Read, 2).is_none());
    c.saw(Ino(1), 2);
    assert_eq!(c.ready(), vec![(Ino(1), Level::Read, 2)]);
    let r = answered(c.recall_step(Ino(1), Level::Read, 2, 0));
    assert!(!r.inval, "a recall to Read keeps the names");
    assert!(!c.holds_write(Ino(1)));
    assert_eq!(c.entry_ttl(Ino(1), b"y"), FOREVER, "Read is kept");
}

#[test]
fn an_answer_older_than_the_version_seen_keeps_the_newer_content() {
    let mut c = Cache::default();
    let t = Timestamp::new(5, 0);
    c.opened(
        &attr(Ino(7), Kind::File, 4),
        &grant(Level::Write, 1),
        Vec::new(),
    );
    assert_eq!(c.write(Ino(7), Some(0), b"new", (t, Time::ZERO)), Some(0));
    let job = c.flush_job(Ino(7)).unwrap();
    // The commit's answer (version 5) comes before that of an open the
    // primary answered before the commit (version 4, a later grant).
    c.flushed(&job, &attr(Ino(7), Kind::File, 5), Vec::new(), Time::ZERO);
    let open = c.opened(
        &attr(Ino(7), Kind::File, 4),
        &grant(Level::Write, 2),
        Vec::new(),
    );
    assert_eq!(open, Open::Direct);
    let content = c.content(Ino(7)).expect("held");
    assert_eq!(content.version, 5, "the version written back stays");
    assert!(c.holds_write(Ino(7)), "the later grant holds");
    assert_eq!(c.attr(Ino(7)).unwrap().version, 5);
}

#[test]
fn a_write_over_the_last_one_is_kept_in_it() {
    let mut c = Cache::default();
    let t = Timestamp::new(5, 0);
    c.opened(
        &attr(Ino(7), Kind::File, 1),
        &grant(Level::Write, 1),
        Vec::new(),
    );
    // Over the last write, inside it, across its start and past its end:
    // one change; right after it, or apart: one more.
    for (at, bytes) in [
        (2, &b"cdef"[..]),
        (3, b"D"),
        (0, b"abC"),
        (5, b"FGH"),
        (8, b"ij"),
        (12, b"z"),
    ] {
        c.write(Ino(7), Some(at), bytes, (t, Time::ZERO)).unwrap();
    }
    assert_eq!(c.dirty_bytes(), 11, "each byte of the first four held once");
    let job = c.flush_job(Ino(7)).unwrap();
    assert_eq!(job.changes.len(), 3);
    assert_eq!(
        c.finish_read(Ino(7), 1, 0, 13, b"").unwrap(),
        b"abCDeFGHij\0\0z"
    );
    // A write-back under way keeps its changes as it took them.
    c.write(Ino(7), Some(12), b"!", (t, Time::ZERO)).unwrap();
    assert_eq!(c.dirty[&Ino(7)].work.changes.len(), 4);
    let mut committed = attr(Ino(7), Kind::File, 2);
    committed.size = 13;
    c.flushed(&job, &committed, Vec::new(), Time::ZERO);
    assert_eq!(c.dirty_bytes(), 1);
    // What is left after it takes writes over it again.
    c.write(Ino(7), Some(12), b"?", (t, Time::ZERO)).unwrap();
    assert_eq!(c.dirty_bytes(), 1);
}

/// Commits write-back `j`, which took the file as `bytes`: they are the
/// base of what is left.
fn commit(c: &mut Cache, (j, bytes): (FlushJob, Vec<u8>), base: &mut Vec<u8>, version: &mut u64) {
    *version += 1;
    let mut committed = attr(Ino(7), Kind::File, *version);
    committed.size = j.size;
    c.flushed(&j, &committed, Vec::new(), Time::ZERO);
    *base = bytes;
}

proptest::proptest! {
    /// However writes and truncations come, with write-backs taken and
    /// finished between them (writes going on while one is under way), a
    /// read shows what they made one after the other, over the bytes of
    /// the version last committed, and the dirty bytes count what the
    /// changes hold.
    #[test]
    fn kept_changes_read_as_made(
        steps in proptest::collection::vec(
            (0u8..6, 0u64..40, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..12)),
            1..40,
        )
    ) {
        let mut c = Cache::default();
        let t = Timestamp::new(5, 0);
        let mut a = attr(Ino(7), Kind::File, 1);
        a.size = 0;
        c.opened(&a, &grant(Level::Write, 1), Vec::new());
        let mut model: Vec<u8> = Vec::new();
        let mut version = 1;
        // The committed version's bytes, and the file as a write-back
        // under way took it.
        let mut base: Vec<u8> = Vec::new();
        let mut job: Option<(FlushJob, Vec<u8>)> = None;
        for (what, at, bytes) in steps {
            match what {
                0..=2 => {
                    c.write(Ino(7), Some(at), &bytes, (t, Time::ZERO)).unwrap();
                    let end = at as usize + bytes.len();
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[at as usize..end].copy_from_slice(&bytes);
                }
                3 => {
                    c.truncate(Ino(7), at, (t, Time::ZERO)).unwrap();
                    model.resize(at as usize, 0);
                }
                4 if job.is_none() => job = c.flush_job(Ino(7)).map(|j| (j, model.clone())),
                _ => {
                    if let Some(j) = job.take() {
                        commit(&mut c, j, &mut base, &mut version);
                    }
                }
            }
            if c.is_dirty(Ino(7)) {
                let got = c.finish_read(Ino(7), version, 0, 64, &base).unwrap();
                proptest::prop_assert_eq!(&got, &model);
            }
        }
        if let Some(j) = job.take() {
            commit(&mut c, j, &mut base, &mut version);
        }
        let held: u64 = c.dirty.get(&Ino(7)).map_or(0, |d| {
            d.work.changes.iter().map(|e| match &e.change {
                OverlayChange::Write { data, .. } => data.len() as u64,
                OverlayChange::Truncate { .. } => 0,
            }).sum()
        });
        proptest::prop_assert_eq!(c.dirty_bytes(), held);
    }
}
