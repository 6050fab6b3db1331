//! Advisory locks at the primary (`docs/fs.md`, "Locks"): the lock table
//! (`shoal_fs::locks`) is its soft state, like the tokens.  A request
//! refused for a conflict is answered at once with the lock in the way;
//! one that may wait leaves its client a waiter, told `Unlocked` when a
//! lock on the inode is released, to try again.  In a new primary's grace
//! period only reclaims are taken; other lock requests wait for its end,
//! so no lock is given that an old holder is about to reclaim.

use crate::locks::{Lock, Owner, Refused};
use crate::model::{FsError, Ino};
use crate::op::{Conflict, Failure, LockHow, Op, Reply};
use crate::tokens::{Callback, ClientId};

use super::{Outcome, Shell, Soft, fs};

impl<H> Soft<H> {
    /// A `Lock` request of `client`.
    pub(super) fn lock(&mut self, shell: &mut impl Shell, client: ClientId, op: &Op) -> Outcome {
        let Op::Lock {
            ino,
            owner,
            style,
            mode,
            start,
            end,
            pid,
            how,
        } = *op
        else {
            unreachable!("only lock requests come here")
        };
        let in_grace = self.tokens.in_grace();
        if in_grace && how != LockHow::Reclaim {
            return Outcome::Wait;
        }
        if how == LockHow::Reclaim && !in_grace {
            return Outcome::Reply(Err(fs(FsError::Invalid(
                "a lock is reclaimed only in a new primary's grace period",
            ))));
        }
        if shell.read(|t| t.get(ino).is_none()) {
            return Outcome::Reply(Err(fs(FsError::NotFound)));
        }
        let owner = Owner { client, owner };
        let Some(mode) = mode else {
            if how == LockHow::Test {
                return Outcome::Reply(Err(fs(FsError::Invalid("a test of no lock"))));
            }
            let woken = self.locks.unlock(ino, owner, style, start, end);
            self.unlocked(ino, woken);
            return Outcome::Reply(Ok(Reply::Locked(None)));
        };
        let want = Lock {
            owner,
            style,
            mode,
            start,
            end,
            pid,
        };
        let result = match how {
            LockHow::Test => {
                return Outcome::Reply(Ok(Reply::Locked(
                    self.locks.conflict(ino, &want).map(conflict),
                )));
            }
            LockHow::Try | LockHow::Reclaim => self.locks.lock(ino, want, false),
            LockHow::Wait => self.locks.lock(ino, want, true),
        };
        Outcome::Reply(match result {
            Ok(()) => Ok(Reply::Locked(None)),
            Err(Refused::Conflict(c)) => {
                if how == LockHow::Reclaim {
                    tracing::warn!(
                        "client {client:016x}'s reclaim of a lock on {ino} conflicts with another"
                    );
                }
                Ok(Reply::Locked(Some(conflict(c))))
            }
            Err(Refused::BadRange) => Err(Failure::Fs(FsError::Invalid("a backwards lock range"))),
        })
    }

    /// Locks on `ino` were released: the clients waiting on it are told.
    fn unlocked(&mut self, ino: Ino, woken: Vec<ClientId>) {
        for c in woken {
            self.queued
                .entry(c)
                .or_default()
                .push(Callback::Unlocked { ino });
        }
    }

    /// A client's lease ended: its locks go, and their waiters are told.
    pub(super) fn release_locks(&mut self, client: ClientId) {
        for (ino, c) in self.locks.release_client(client) {
            self.unlocked(ino, vec![c]);
        }
    }
}

/// What a lock in the way tells the client (not whose it is).
fn conflict(l: Lock) -> Conflict {
    Conflict {
        mode: l.mode,
        start: l.start,
        end: l.end,
        pid: l.pid,
    }
}
