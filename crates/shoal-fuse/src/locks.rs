//! What the mount knows of its programs' advisory locks (`docs/fs.md`,
//! "Locks"): the `fcntl` locks the primary gave them (reclaimed at a new
//! primary), and those it gave them itself on private inodes, which no
//! other mount can lock (handed to the primary when the privacy ends),
//! the lock owners that took locks through each open file (whose
//! locks go when it is closed: the mount asks the kernel for no flush at
//! close, so the release is when it learns of it), and, per inode, a count
//! of the primary's `Unlocked` callbacks that a program waiting for a lock
//! sleeps on.  No I/O here.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use shoal_fs::locks::{Lock, Locks, Mode, Owner, Refused, Style};
use shoal_fs::model::Ino;
use shoal_fs::op::{LockHow, Op};
use shoal_fs::tokens::ClientId;

/// The request that asks the primary for `lock`, held here, on `ino`
/// (`how`: a reclaim at a new primary, or a try when a private inode's
/// locks go to the primary).
pub(crate) fn asking(ino: Ino, lock: &Lock, how: LockHow) -> Op {
    Op::Lock {
        ino,
        owner: lock.owner.owner,
        style: lock.style,
        mode: Some(lock.mode),
        start: lock.start,
        end: lock.end,
        pid: lock.pid,
        how,
    }
}

/// A `fcntl` lock of this mount's lock owner `owner`.
fn posix(owner: u64, mode: Mode, (start, end, pid): (u64, u64, u32)) -> Lock {
    Lock {
        owner: Owner {
            client: ClientId(0),
            owner,
        },
        style: Style::Posix,
        mode,
        start,
        end,
        pid,
    }
}

#[derive(Default)]
pub(crate) struct MountLocks {
    /// The locks this mount's programs hold (client 0 stands for the
    /// mount).
    held: Mutex<Locks>,
    /// For each open file (kernel handle): its inode and the lock owners
    /// that took locks through it.
    owners: Mutex<HashMap<u64, (Ino, BTreeSet<u64>)>>,
    /// How many times locks on each inode were released.
    released: Mutex<HashMap<Ino, u64>>,
    changed: Condvar,
    stopping: AtomicBool,
}

impl MountLocks {
    /// `owner` took a lock on `ino` through handle `fh`: its locks there
    /// go when the handle is closed.
    fn took(&self, fh: u64, ino: Ino, owner: u64) {
        self.owners
            .lock()
            .entry(fh)
            .or_insert_with(|| (ino, BTreeSet::new()))
            .1
            .insert(owner);
    }

    /// The primary took (`mode`) or released (`None`) a lock of `owner`
    /// through handle `fh`.
    pub(crate) fn record(
        &self,
        fh: u64,
        ino: Ino,
        owner: u64,
        mode: Option<Mode>,
        (start, end, pid): (u64, u64, u32),
    ) {
        let who = Owner {
            client: ClientId(0),
            owner,
        };
        let mut held = self.held.lock();
        match mode {
            None => {
                held.unlock(ino, who, Style::Posix, start, end);
            }
            Some(mode) => {
                let lock = posix(owner, mode, (start, end, pid));
                if held.lock(ino, lock, false).is_err() {
                    // Only the primary decides: a lock it gave is held.
                    tracing::warn!(
                        "the mount's record of locks on {ino} disagrees with the primary"
                    );
                }
                self.took(fh, ino, owner);
            }
        }
    }

    /// A lock (`mode`) or unlock (`None`) of `owner` through handle `fh`
    /// on a private inode, which no other mount can hold locks on: decided
    /// here, as the primary would (`docs/fs.md`, "Locks").  Whether it was
    /// taken; an unlock always is, and wakes the programs waiting.
    pub(crate) fn local(
        &self,
        fh: u64,
        ino: Ino,
        owner: u64,
        mode: Option<Mode>,
        (start, end, pid): (u64, u64, u32),
    ) -> Result<bool, Refused> {
        let who = Owner {
            client: ClientId(0),
            owner,
        };
        let Some(mode) = mode else {
            self.held.lock().unlock(ino, who, Style::Posix, start, end);
            self.wake(ino);
            return Ok(true);
        };
        match self
            .held
            .lock()
            .lock(ino, posix(owner, mode, (start, end, pid)), false)
        {
            Ok(()) => {}
            Err(Refused::Conflict(_)) => return Ok(false),
            Err(e) => return Err(e),
        }
        self.took(fh, ino, owner);
        Ok(true)
    }

    /// The lock in the way of `owner`'s `mode` lock on `start..=end` of a
    /// private inode (`F_GETLK`, decided here).
    pub(crate) fn local_conflict(
        &self,
        ino: Ino,
        owner: u64,
        mode: Mode,
        (start, end): (u64, u64),
    ) -> Option<Lock> {
        self.held
            .lock()
            .conflict(ino, &posix(owner, mode, (start, end, 0)))
    }

    /// The locks held on `ino` (to hand to the primary when the inode
    /// stops being private).
    pub(crate) fn on(&self, ino: Ino) -> Vec<Lock> {
        self.held.lock().on(ino).to_vec()
    }

    /// Every lock on `ino` goes (a private inode lost with its session).
    pub(crate) fn forget(&self, ino: Ino) {
        let mut held = self.held.lock();
        for l in held.on(ino).to_vec() {
            held.unlock(ino, l.owner, l.style, l.start, l.end);
        }
        drop(held);
        self.wake(ino);
    }

    /// Handle `fh` closed: the inode and the owners whose locks on it go.
    pub(crate) fn closed(&self, fh: u64) -> Option<(Ino, Vec<u64>)> {
        let (ino, owners) = self.owners.lock().remove(&fh)?;
        let held = self.held.lock();
        let holding = |o: &u64| {
            let who = Owner {
                client: ClientId(0),
                owner: *o,
            };
            held.on(ino).iter().any(|l| l.owner == who)
        };
        Some((ino, owners.into_iter().filter(holding).collect()))
    }

    /// Whether lock owner `owner` holds a lock on `ino`.
    pub(crate) fn holds(&self, ino: Ino, owner: u64) -> bool {
        let who = Owner {
            client: ClientId(0),
            owner,
        };
        self.held.lock().on(ino).iter().any(|l| l.owner == who)
    }

    /// Every lock held, to reclaim at a new primary.
    pub(crate) fn held(&self) -> Vec<(Ino, Lock)> {
        self.held.lock().held_by(ClientId(0))
    }

    /// A lock the new primary would not give back.
    pub(crate) fn lost(&self, ino: Ino, lock: &Lock) {
        self.held
            .lock()
            .unlock(ino, lock.owner, lock.style, lock.start, lock.end);
    }

    /// How many times locks on `ino` were released so far.
    pub(crate) fn generation(&self, ino: Ino) -> u64 {
        self.released.lock().get(&ino).copied().unwrap_or(0)
    }

    /// The primary said locks on `ino` were released.
    pub(crate) fn wake(&self, ino: Ino) {
        *self.released.lock().entry(ino).or_default() += 1;
        self.changed.notify_all();
    }

    /// Waits until locks on `ino` are released after generation `seen`,
    /// the mount stops, or `most` passes.
    pub(crate) fn wait(&self, ino: Ino, seen: u64, most: Duration) {
        let mut released = self.released.lock();
        if released.get(&ino).copied().unwrap_or(0) == seen && !self.is_stopping() {
            self.changed.wait_for(&mut released, most);
        }
    }

    /// The mount is going: waiting programs give up.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.changed.notify_all();
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
}
