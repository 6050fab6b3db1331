//! Advisory locks, cluster-wide: the table the primary keeps of every
//! `fcntl` (POSIX) and `flock` lock its clients' programs hold
//! (`docs/fs.md`, "Locks").  No I/O: the primary asks and acts.
//!
//! A lock belongs to an **owner**: a client (a mount) and the lock owner
//! number its kernel gave (a process's file table for `fcntl` locks, an
//! open file description for `flock`).  The two styles never conflict with
//! each other, as on a local Linux file system.  Within a style two locks
//! conflict when their owners differ, their ranges overlap and one of them
//! is a write lock.
//!
//! POSIX rules for one owner: a new lock replaces whatever the owner held
//! in its range (an upgrade, a downgrade, or a hole punched by an unlock),
//! and the owner's adjacent or overlapping ranges of one mode merge, so an
//! owner holds at most one lock on any byte.  A `flock` lock is a lock on
//! the whole file.
//!
//! Locks are soft state: a client's go when its lease ends, and a new
//! primary learns them again from the clients (`reclaim`).  A request that
//! found a conflict and may wait is remembered as a **waiter** on the
//! inode; when a lock on it is released, the waiters are returned, to be
//! told to try again.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::Ino;
use crate::tokens::ClientId;

/// The last byte a lock can cover: a range to the end of the file, however
/// it grows.
pub const EOF: u64 = u64::MAX;

/// `fcntl` (byte ranges, one owner per process) or `flock` (the whole
/// file, one owner per open file description).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Style {
    Posix,
    Flock,
}

/// A shared (read) or exclusive (write) lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    Read,
    Write,
}

/// Who holds a lock: a client and its kernel's lock owner number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner {
    pub client: ClientId,
    pub owner: u64,
}

/// One lock held: bytes `start..=end` of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lock {
    pub owner: Owner,
    pub style: Style,
    pub mode: Mode,
    pub start: u64,
    pub end: u64,
    /// The process that took it (what `F_GETLK` reports; for a lock
    /// another node holds, a process of that node).
    pub pid: u32,
}

impl Lock {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }

    /// Whether `self` keeps `other` from being taken.
    fn blocks(&self, other: &Lock) -> bool {
        self.style == other.style
            && self.owner != other.owner
            && (self.mode == Mode::Write || other.mode == Mode::Write)
            && self.overlaps(other.start, other.end)
    }
}

/// Why a lock was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// A lock another owner holds stands in the way (the first found).
    Conflict(Lock),
    /// The range is empty or backwards.
    BadRange,
}

/// Every lock on every inode, and who waits for them.
#[derive(Debug, Default, Clone)]
pub struct Locks {
    held: BTreeMap<Ino, Vec<Lock>>,
    waiters: BTreeMap<Ino, BTreeSet<ClientId>>,
}

impl Locks {
    pub fn new() -> Locks {
        Locks::default()
    }

    /// The first lock that keeps `want` from being taken (`F_GETLK`).
    pub fn conflict(&self, ino: Ino, want: &Lock) -> Option<Lock> {
        self.held
            .get(&ino)?
            .iter()
            .find(|l| l.blocks(want))
            .copied()
    }

    /// Takes `want`, replacing what its owner held in its range; or, on a
    /// conflict, changes nothing and (if the caller will `wait`)
    /// remembers its client as a waiter on `ino`.
    pub fn lock(&mut self, ino: Ino, want: Lock, wait: bool) -> Result<(), Refused> {
        if want.start > want.end {
            return Err(Refused::BadRange);
        }
        if let Some(c) = self.conflict(ino, &want) {
            if wait {
                self.waiters
                    .entry(ino)
                    .or_default()
                    .insert(want.owner.client);
            }
            return Err(Refused::Conflict(c));
        }
        let list = self.held.entry(ino).or_default();
        cut(list, want.owner, want.style, want.start, want.end);
        list.push(want);
        merge(list, want.owner, want.style);
        Ok(())
    }

    /// Unlocks `start..=end` of what `owner` holds in `style` on `ino`
    /// (`F_UNLCK`, `LOCK_UN`; the whole file when a file is closed).
    /// Returns the clients waiting on `ino` if anything was released:
    /// they are no longer waiters, and should try again.
    pub fn unlock(
        &mut self,
        ino: Ino,
        owner: Owner,
        style: Style,
        start: u64,
        end: u64,
    ) -> Vec<ClientId> {
        let Some(list) = self.held.get_mut(&ino) else {
            return Vec::new();
        };
        let changed = cut(list, owner, style, start, end);
        if list.is_empty() {
            self.held.remove(&ino);
        }
        if changed { self.wake(ino) } else { Vec::new() }
    }

    /// Releases every lock `client` holds (its lease ended), and forgets
    /// it as a waiter.  Returns, for each inode that had one, the clients
    /// to tell to try again.
    pub fn release_client(&mut self, client: ClientId) -> Vec<(Ino, ClientId)> {
        for w in self.waiters.values_mut() {
            w.remove(&client);
        }
        self.waiters.retain(|_, w| !w.is_empty());
        let touched: Vec<Ino> = self
            .held
            .iter()
            .filter(|(_, l)| l.iter().any(|l| l.owner.client == client))
            .map(|(i, _)| *i)
            .collect();
        let mut wake = Vec::new();
        for ino in touched {
            if let Some(list) = self.held.get_mut(&ino) {
                list.retain(|l| l.owner.client != client);
                if list.is_empty() {
                    self.held.remove(&ino);
                }
            }
            wake.extend(self.wake(ino).into_iter().map(|c| (ino, c)));
        }
        wake
    }

    /// Every lock `client` holds, to reclaim at a new primary.
    pub fn held_by(&self, client: ClientId) -> Vec<(Ino, Lock)> {
        self.held
            .iter()
            .flat_map(|(ino, l)| l.iter().map(move |l| (*ino, *l)))
            .filter(|(_, l)| l.owner.client == client)
            .collect()
    }

    /// The locks held on `ino`, in no particular order.
    pub fn on(&self, ino: Ino) -> &[Lock] {
        self.held.get(&ino).map_or(&[], Vec::as_slice)
    }

    /// How many locks are held in all.
    pub fn count(&self) -> usize {
        self.held.values().map(Vec::len).sum()
    }

    fn wake(&mut self, ino: Ino) -> Vec<ClientId> {
        self.waiters
            .remove(&ino)
            .map(|w| w.into_iter().collect())
            .unwrap_or_default()
    }
}

/// Removes `start..=end` from `owner`'s locks of `style` in `list`,
/// splitting those that reach past it; whether any lock was in the range.
fn cut(list: &mut Vec<Lock>, owner: Owner, style: Style, start: u64, end: u64) -> bool {
    let mut kept = Vec::with_capacity(list.len() + 1);
    let mut cut = false;
    for l in list.drain(..) {
        if l.owner != owner || l.style != style || !l.overlaps(start, end) {
            kept.push(l);
            continue;
        }
        cut = true;
        if l.start < start {
            kept.push(Lock {
                end: start - 1,
                ..l
            });
        }
        if l.end > end {
            kept.push(Lock {
                start: end + 1,
                ..l
            });
        }
    }
    *list = kept;
    cut
}

/// Merges `owner`'s locks of `style` in `list` that overlap or touch and
/// have one mode.
fn merge(list: &mut Vec<Lock>, owner: Owner, style: Style) {
    let (mut mine, rest): (Vec<Lock>, Vec<Lock>) = list
        .drain(..)
        .partition(|l| l.owner == owner && l.style == style);
    mine.sort_by_key(|l| l.start);
    let mut merged: Vec<Lock> = Vec::with_capacity(mine.len());
    for l in mine {
        match merged.last_mut() {
            Some(m) if m.mode == l.mode && l.start <= m.end.saturating_add(1) => {
                m.end = m.end.max(l.end);
            }
            _ => merged.push(l),
        }
    }
    *list = rest;
    list.extend(merged);
}

#[cfg(test)]
mod tests;
