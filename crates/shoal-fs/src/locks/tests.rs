//! Tests of the lock table: shared and exclusive locks, splits and
//! merges of one owner's ranges, `flock` beside POSIX locks, a lease's
//! end, and a property against a byte-by-byte model.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

const F: Ino = Ino(10);

fn owner(client: ClientId, owner: u64) -> Owner {
    Owner { client, owner }
}

fn posix(o: Owner, mode: Mode, start: u64, end: u64) -> Lock {
    Lock {
        owner: o,
        style: Style::Posix,
        mode,
        start,
        end,
        pid: 100,
    }
}

fn flock(o: Owner, mode: Mode) -> Lock {
    Lock {
        style: Style::Flock,
        ..posix(o, mode, 0, EOF)
    }
}

/// The owner's locks on F, as (mode, start, end) sorted.
fn of(l: &Locks, o: Owner) -> Vec<(Mode, u64, u64)> {
    let mut v: Vec<_> = l
        .on(F)
        .iter()
        .filter(|x| x.owner == o)
        .map(|x| (x.mode, x.start, x.end))
        .collect();
    v.sort_by_key(|x| x.1);
    v
}

#[test]
fn readers_share_and_a_writer_waits() {
    let (a, b) = (owner(ClientId(1), 1), owner(ClientId(2), 1));
    let mut l = Locks::new();
    l.lock(F, posix(a, Mode::Read, 0, 99), false).unwrap();
    l.lock(F, posix(b, Mode::Read, 50, 149), false).unwrap();
    assert_eq!(
        l.lock(F, posix(b, Mode::Write, 90, 95), true),
        Err(Refused::Conflict(posix(a, Mode::Read, 0, 99)))
    );
    // Beyond a's range b may write.
    l.lock(F, posix(b, Mode::Write, 100, 149), false).unwrap();
    assert_eq!(
        of(&l, b),
        vec![(Mode::Read, 50, 99), (Mode::Write, 100, 149)]
    );
    // a's unlock wakes b (once).
    assert_eq!(l.unlock(F, a, Style::Posix, 0, EOF), vec![ClientId(2)]);
    assert_eq!(l.unlock(F, a, Style::Posix, 0, EOF), Vec::<ClientId>::new());
    l.lock(F, posix(b, Mode::Write, 0, 149), false).unwrap();
    assert_eq!(of(&l, b), vec![(Mode::Write, 0, 149)]);
}

#[test]
fn one_owner_splits_merges_upgrades_and_downgrades() {
    let a = owner(ClientId(1), 7);
    let mut l = Locks::new();
    l.lock(F, posix(a, Mode::Write, 0, EOF), false).unwrap();
    // A read lock in the middle splits the write lock in three.
    l.lock(F, posix(a, Mode::Read, 10, 19), false).unwrap();
    assert_eq!(
        of(&l, a),
        vec![
            (Mode::Write, 0, 9),
            (Mode::Read, 10, 19),
            (Mode::Write, 20, EOF)
        ]
    );
    // Back to write: one lock again.
    l.lock(F, posix(a, Mode::Write, 10, 19), false).unwrap();
    assert_eq!(of(&l, a), vec![(Mode::Write, 0, EOF)]);
    // An unlock punches a hole; touching ranges of one mode merge.
    l.unlock(F, a, Style::Posix, 5, 5);
    assert_eq!(of(&l, a), vec![(Mode::Write, 0, 4), (Mode::Write, 6, EOF)]);
    l.lock(F, posix(a, Mode::Write, 5, 5), false).unwrap();
    assert_eq!(of(&l, a), vec![(Mode::Write, 0, EOF)]);
    assert_eq!(
        l.lock(F, posix(a, Mode::Read, 9, 3), false),
        Err(Refused::BadRange)
    );
}

#[test]
fn flock_and_posix_locks_are_independent() {
    let (a, b) = (owner(ClientId(1), 1), owner(ClientId(2), 2));
    let mut l = Locks::new();
    l.lock(F, flock(a, Mode::Write), false).unwrap();
    // A POSIX lock on the same file does not see the flock.
    l.lock(F, posix(b, Mode::Write, 0, EOF), false).unwrap();
    assert_eq!(
        l.lock(F, flock(b, Mode::Read), false),
        Err(Refused::Conflict(flock(a, Mode::Write)))
    );
    // flock's upgrade and downgrade replace the owner's lock.
    l.lock(F, flock(a, Mode::Read), false).unwrap();
    l.lock(F, flock(b, Mode::Read), false).unwrap();
    assert_eq!(l.count(), 3);
}

#[test]
fn a_clients_lease_end_releases_its_locks_and_wakes_the_waiters() {
    let (a1, a2, b, c) = (
        owner(ClientId(1), 1),
        owner(ClientId(1), 2),
        owner(ClientId(2), 1),
        owner(ClientId(3), 1),
    );
    let mut l = Locks::new();
    l.lock(F, posix(a1, Mode::Write, 0, 9), false).unwrap();
    l.lock(F.plus(1), flock(a2, Mode::Write), false).unwrap();
    assert!(l.lock(F, posix(b, Mode::Read, 0, 0), true).is_err());
    assert!(l.lock(F.plus(1), flock(c, Mode::Read), true).is_err());
    assert_eq!(l.held_by(ClientId(1)).len(), 2);
    let mut woken = l.release_client(ClientId(1));
    woken.sort();
    assert_eq!(woken, vec![(F, ClientId(2)), (F.plus(1), ClientId(3))]);
    assert_eq!(l.count(), 0);
    assert!(l.held_by(ClientId(1)).is_empty());
    // A client that goes while waiting is forgotten as a waiter.
    l.lock(F, posix(b, Mode::Write, 0, 0), false).unwrap();
    assert!(l.lock(F, posix(c, Mode::Write, 0, 0), true).is_err());
    assert!(l.release_client(ClientId(3)).is_empty());
    assert_eq!(l.unlock(F, b, Style::Posix, 0, EOF), Vec::<ClientId>::new());
}

/// What every byte of a small file is locked as, by owner and style: the
/// obvious model the table must agree with.
type Model = HashMap<(Owner, Style, u64), Mode>;

const BYTES: u64 = 24;

fn model_conflicts(m: &Model, want: &Lock) -> bool {
    (want.start..=want.end.min(BYTES - 1)).any(|b| {
        m.iter().any(|((o, s, byte), mode)| {
            *byte == b
                && *s == want.style
                && *o != want.owner
                && (*mode == Mode::Write || want.mode == Mode::Write)
        })
    })
}

proptest! {
    /// Random locks and unlocks by four owners of two clients in both
    /// styles agree, byte by byte, with the model: a lock is refused
    /// exactly when the model has another owner's conflicting byte, the
    /// bytes each owner holds are those the model says, and one owner's
    /// locks never overlap and never touch with one mode (merged).
    #[test]
    fn the_table_agrees_with_a_byte_model(
        ops in proptest::collection::vec((0u8..4, 0u8..3, 0u64..BYTES, 0u64..BYTES, any::<bool>()), 1..60)
    ) {
        let mut l = Locks::new();
        let mut m = Model::new();
        for (who, what, a, b, flock_style) in ops {
            let o = owner(ClientId(1 + u64::from(who / 2)), u64::from(who % 2));
            let style = if flock_style { Style::Flock } else { Style::Posix };
            let (start, end) = if flock_style { (0, BYTES - 1) } else { (a.min(b), a.max(b)) };
            if what == 2 {
                l.unlock(F, o, style, start, end);
                for byte in start..=end {
                    m.remove(&(o, style, byte));
                }
                continue;
            }
            let mode = if what == 0 { Mode::Read } else { Mode::Write };
            let want = Lock { owner: o, style, mode, start, end, pid: 1 };
            let refused = model_conflicts(&m, &want);
            prop_assert_eq!(l.lock(F, want, false).is_err(), refused);
            prop_assert_eq!(l.conflict(F, &want).is_some(), refused);
            if !refused {
                for byte in start..=end {
                    m.insert((o, style, byte), mode);
                }
            }
            // Byte by byte, the table says what the model says.
            let mut seen = Model::new();
            for x in l.on(F) {
                for byte in x.start..=x.end {
                    prop_assert!(
                        seen.insert((x.owner, x.style, byte), x.mode).is_none(),
                        "one owner holds byte {} twice", byte
                    );
                }
            }
            prop_assert_eq!(&seen, &m);
            // Merged: no two locks of one owner, style and mode touch.
            for x in l.on(F) {
                for y in l.on(F) {
                    if x != y && x.owner == y.owner && x.style == y.style && x.mode == y.mode {
                        prop_assert!(x.end.saturating_add(1) < y.start || y.end.saturating_add(1) < x.start);
                    }
                }
            }
        }
    }
}
