//! A client's private directories (`docs/fs.md`, "Private directories"):
//! the directories a client made and holds `Write` on, which nobody else
//! can have looked at, changed in the client's own copy without a message.
//!
//! The copy is a [`Tree`], the very state machine the replicas run: each
//! change is made there first, as its maker and at its time, and kept in
//! the pending list only if it succeeded.  Pushed to the primary (one
//! [`UpdateOp::Push`]), the list brings the replicas to the state the
//! client showed its programs, errno for errno, time for time.
//!
//! A change that only made and then removed an inode the primary never
//! heard of (a temporary file, created, written, closed and unlinked) is
//! taken out of the list, with the directory's times set in its place, so
//! it costs no message at all.
//!
//! Times and identities are arguments; nothing here does I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rustc_hash::FxHashMap;
use shoal_time::Time;

use crate::model::{Attr, FsError, Identity, Ino, Kind, Timestamp};
use crate::tree::{Body, Inode, Tree};
use crate::update::{Answer, Pushed, SetAttr, TimeSet, UpdateOp};

#[cfg(test)]
mod tests;

/// The inodes a change of names or attributes names by number: the
/// directories whose names it changes, and the inode it links or whose
/// attributes it changes (not one it makes).  `None` for any other
/// change: only these are made in a private copy and pushed.
pub fn numbered(op: &UpdateOp) -> Option<Numbered> {
    Some(match op {
        UpdateOp::Create { parent, .. } => Numbered::one(*parent),
        UpdateOp::Link { ino, parent, .. } => Numbered::two(*ino, *parent),
        UpdateOp::Unlink { parent, .. } => Numbered::one(*parent),
        UpdateOp::Rename { from, to, .. } => Numbered::two(*from, *to),
        UpdateOp::SetAttr { ino, .. } => Numbered::one(*ino),
        _ => return None,
    })
}

/// The one or two inodes a change names by number ([`numbered`]), kept
/// without an allocation: every change a mount makes asks for them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Numbered {
    inos: [Ino; 2],
    len: u8,
}

impl Numbered {
    fn one(ino: Ino) -> Numbered {
        Numbered {
            inos: [ino, Ino(0)],
            len: 1,
        }
    }

    fn two(a: Ino, b: Ino) -> Numbered {
        Numbered {
            inos: [a, b],
            len: 2,
        }
    }
}

impl std::ops::Deref for Numbered {
    type Target = [Ino];

    fn deref(&self) -> &[Ino] {
        &self.inos[..self.len as usize]
    }
}

/// Whether a client may push `ops` (the primary's rule): every inode
/// they name by number ([`numbered`]) is one they make or one the client
/// holds `Write` on (`holds_write`).  Nobody else can then hold a token
/// on any of them.  The inodes they make, in order of number.
///
/// A push may also carry a client's commit of a file's write-back
/// (`UpdateOp::Commit`, not the primary's own flush of an overlay) of a
/// file it makes or holds `Write` on, so that an `fsync` of a file in a
/// private directory costs one request: the file's name and its bytes
/// reach the primary in one ordered update.
pub fn check_push(ops: &[Pushed], holds_write: impl Fn(Ino) -> bool) -> Result<Vec<Ino>, FsError> {
    let mut made = BTreeSet::new();
    for p in ops {
        let named = match &p.op {
            UpdateOp::Commit {
                ino, flush: false, ..
            } => Numbered::one(*ino),
            op => numbered(op).ok_or(FsError::Invalid(
                "a push carries changes of names and attributes, and commits, only",
            ))?,
        };
        if let UpdateOp::Create { ino, .. } = &p.op {
            made.insert(*ino);
        }
        if named.iter().any(|i| !made.contains(i) && !holds_write(*i)) {
            return Err(FsError::Stale(
                "a push changes a directory or inode its client does not hold",
            ));
        }
    }
    Ok(made.into_iter().collect())
}

/// The distance between two changes' positions in the pending list.
const SPACING: u64 = 1 << 16;

/// One change not yet pushed.
#[derive(Debug, Clone)]
struct Pending {
    change: Pushed,
    /// When it was made (the caller's clock).
    clock: Time,
    /// The versions of the inodes it names that the copy had before it.
    versions: Vec<(Ino, u64)>,
    /// The inodes it needs to exist: made, named, moved, removed or
    /// changed by it.
    inos: Vec<Ino>,
    /// The directories whose names it changes.
    dirs: Vec<Ino>,
    /// A directory's times, set in place of changes taken out.
    fix: bool,
}

/// The client's copy of its private directories, and the changes the
/// primary has not heard of yet.
#[derive(Debug, Clone)]
pub struct Private {
    tree: Tree,
    /// The pending changes, by position (gaps where changes were taken
    /// out); boxed, as a node of the map moves its values when it
    /// changes.
    pending: BTreeMap<u64, Box<Pending>>,
    next: u64,
    /// The positions of the pending changes that need each inode or
    /// change names in it: a cancelled inode's changes are found without
    /// a look at the others.
    by_ino: FxHashMap<Ino, BTreeSet<u64>>,
    /// Inodes made since the last push, with the position of the change
    /// that made each: the primary does not know them.
    fresh: FxHashMap<Ino, u64>,
    /// Inodes the primary knows that a pending change named, with their
    /// versions then (the primary's still): one the copy has removed since
    /// must be held at a new primary as much as one it keeps.
    named: FxHashMap<Ino, u64>,
    /// When the oldest pending change was made (the caller's clock).
    since: Option<Time>,
    /// The changes at positions below this are in a push on its way
    /// ([`Private::start_push`]): nothing takes them out.
    sent: Option<u64>,
}

impl Default for Private {
    fn default() -> Private {
        Private::new()
    }
}

impl Private {
    pub fn new() -> Private {
        Private {
            tree: Tree::private(),
            pending: BTreeMap::new(),
            next: 0,
            by_ino: FxHashMap::default(),
            fresh: FxHashMap::default(),
            named: FxHashMap::default(),
            since: None,
            sent: None,
        }
    }

    /// Whether `ino` is private: a private directory, or an inode made
    /// in one.
    pub fn holds(&self, ino: Ino) -> bool {
        self.tree.get(ino).is_some()
    }

    /// Whether `ino` is private, or a pending change needs it (an inode
    /// the copy removed, which the primary still has): a recall of it, or
    /// anything sent to the primary about it, must follow the push.
    pub fn mentions(&self, ino: Ino) -> bool {
        self.holds(ino) || self.by_ino.contains_key(&ino)
    }

    /// Whether nothing is private.
    pub fn is_empty(&self) -> bool {
        self.tree.inode_count() == 0
    }

    /// Whether `ino` was made since the last push.
    pub fn is_fresh(&self, ino: Ino) -> bool {
        self.fresh.contains_key(&ino)
    }

    /// Whether the change at position `at` is in a push on its way.
    fn is_sent(&self, at: u64) -> bool {
        self.sent.is_some_and(|upto| at < upto)
    }

    /// How many changes wait for a push.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// A private inode.
    pub fn get(&self, ino: Ino) -> Option<&Inode> {
        self.tree.get(ino)
    }

    /// Every private inode.
    pub fn inodes(&self) -> impl Iterator<Item = &Inode> {
        self.tree.inodes()
    }

    /// A private inode's attributes.
    pub fn attr(&self, ino: Ino) -> Option<Attr> {
        self.tree.get(ino).map(|i| i.attr)
    }

    /// The inode `name` names in private directory `parent`.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr, FsError> {
        self.tree.lookup(parent, name).map(|i| i.attr)
    }

    /// A private directory's parent (for `..`).
    pub fn parent(&self, dir: Ino) -> Option<Ino> {
        match &self.tree.get(dir)?.body {
            Body::Dir { parent, .. } => Some(*parent),
            _ => None,
        }
    }

    /// Whether a private directory is named in directory `dir` (which is
    /// not private itself: a change of names there may remove or move
    /// it).
    pub fn names_in(&self, dir: Ino) -> bool {
        self.tree
            .inodes()
            .any(|i| matches!(i.body, Body::Dir { parent, .. } if parent == dir))
    }

    /// A private directory's entries: name, inode, kind.
    pub fn entries(&self, dir: Ino) -> Result<Vec<(Vec<u8>, Ino, Kind)>, FsError> {
        Ok(self
            .tree
            .entries(dir)?
            .iter()
            .filter_map(|(n, i)| Some((n.clone(), *i, self.tree.get(*i)?.attr.kind)))
            .collect())
    }

    /// Takes in a directory the primary made for this client and granted
    /// it `Write` on in the same answer: private from birth.
    pub fn adopt_dir(&mut self, attr: Attr, secret: [u8; 16], parent: Ino) {
        self.tree.adopt_dir(attr, secret, parent);
    }

    /// Makes a change in private directories as `who` at `now` (`clock`:
    /// the caller's clock, for [`Private::due`]): a create, link, unlink,
    /// rename or change of attributes whose directories and inodes are
    /// all private.  Kept for the push if it succeeded.
    pub fn change(
        &mut self,
        who: &Identity,
        now: Timestamp,
        op: UpdateOp,
        clock: Time,
    ) -> Result<Answer, FsError> {
        let (inos, dirs) = self.involves(&op)?;
        // Before the change, which may remove them from the copy.
        let versions: Vec<(Ino, u64)> = inos
            .iter()
            .chain(&dirs)
            .filter_map(|ino| self.tree.get(*ino).map(|i| (*ino, i.attr.version)))
            .collect();
        let answer = self.tree.change(who, now, &op)?;
        for (ino, version) in &versions {
            if !self.fresh.contains_key(ino) {
                self.named.entry(*ino).or_insert(*version);
            }
        }
        // Spaced, so that the settings of directories' times that take a
        // cancelled change's place fit in after it.
        let at = self.next;
        self.next += SPACING;
        if let (
            UpdateOp::Create { .. },
            Answer::Entry {
                attr,
                existed: false,
            },
        ) = (&op, &answer)
        {
            self.fresh.insert(attr.ino, at);
        }
        self.insert(
            at,
            Pending {
                change: Pushed {
                    who: who.clone(),
                    now,
                    op,
                },
                clock,
                versions,
                inos,
                dirs,
                fix: false,
            },
        );
        self.since.get_or_insert(clock);
        if let Answer::Removed {
            gone: Some(ino), ..
        } = &answer
        {
            self.cancel(*ino);
        }
        Ok(answer)
    }

    /// The inodes a change needs, and the directories whose names it
    /// changes; only changes of names and attributes are made here.
    fn involves(&self, op: &UpdateOp) -> Result<(Vec<Ino>, Vec<Ino>), FsError> {
        let named = |dir: Ino, name: &[u8]| self.tree.lookup(dir, name).ok().map(|i| i.attr.ino);
        Ok(match op {
            UpdateOp::Create { parent, ino, .. } => (vec![*ino], vec![*parent]),
            UpdateOp::Link { ino, parent, .. } => (vec![*ino], vec![*parent]),
            UpdateOp::Unlink { parent, name, .. } => {
                (named(*parent, name).into_iter().collect(), vec![*parent])
            }
            UpdateOp::Rename {
                from,
                from_name,
                to,
                to_name,
                ..
            } => (
                named(*from, from_name)
                    .into_iter()
                    .chain(named(*to, to_name))
                    .collect(),
                vec![*from, *to],
            ),
            UpdateOp::SetAttr { ino, .. } => (vec![*ino], Vec::new()),
            _ => return Err(FsError::Invalid("not a change made in a private directory")),
        })
    }

    /// A write-back of private file `ino` was committed at the primary
    /// (`op`, an `UpdateOp::Commit` the primary applied at `now`): the
    /// copy applies it too, so that it shows the file as the replicas
    /// hold it (size, version, content, times).  Not a pending change:
    /// the primary has it already.
    pub fn committed(&mut self, now: Timestamp, op: &UpdateOp) {
        let UpdateOp::Commit { ino, .. } = op else {
            return;
        };
        if self.tree.get(*ino).is_none() || self.tree.change(&Identity::root(), now, op).is_err() {
            return;
        }
        // A change named it after the push: the primary's version is now
        // the committed one, for every change not yet pushed too (each
        // reaches the primary after the commit).
        let Some(version) = self.tree.get(*ino).map(|i| i.attr.version) else {
            return;
        };
        if let Some(v) = self.named.get_mut(ino) {
            *v = version;
        }
        for at in self.by_ino.get(ino).into_iter().flatten() {
            if let Some(p) = self.pending.get_mut(at) {
                for (i, v) in &mut p.versions {
                    if i == ino {
                        *v = version;
                    }
                }
            }
        }
    }

    /// The last open of private inode `ino` closed: if it has no name
    /// left it goes (and, made since the last push, leaves no trace in
    /// the pending list).  Whether it went.
    pub fn closed(&mut self, ino: Ino) -> bool {
        if self.tree.get(ino).is_none_or(|i| i.attr.nlink > 0) {
            return false;
        }
        let _ = self.tree.change(
            &Identity::root(),
            Timestamp::default(),
            &UpdateOp::Forget { ino },
        );
        self.cancel(ino);
        true
    }

    fn insert(&mut self, at: u64, p: Pending) {
        for ino in p.inos.iter().chain(&p.dirs) {
            self.by_ino.entry(*ino).or_default().insert(at);
        }
        self.pending.insert(at, Box::new(p));
    }

    fn remove(&mut self, at: u64) -> Option<Box<Pending>> {
        let p = self.pending.remove(&at)?;
        for ino in p.inos.iter().chain(&p.dirs) {
            if let Some(set) = self.by_ino.get_mut(ino) {
                set.remove(&at);
                if set.is_empty() {
                    self.by_ino.remove(ino);
                }
            }
        }
        Some(p)
    }

    /// Takes out every pending change of inode `ino`, which went before
    /// the primary heard of it, if those changes touch nothing else; the
    /// times of the directories they changed are set in their place.
    fn cancel(&mut self, ino: Ino) {
        if self.fresh.get(&ino).is_none_or(|at| self.is_sent(*at)) {
            // Never made, or made by a push on its way: the primary hears
            // of it, and so of its end.
            return;
        }
        let touching: Vec<u64> = self
            .by_ino
            .get(&ino)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        if touching
            .iter()
            .any(|at| self.is_sent(*at) || self.pending[at].inos.iter().any(|i| *i != ino))
        {
            // Another inode's fate hangs on one of them (a rename over
            // it, say): everything goes to the primary.
            return;
        }
        self.fresh.remove(&ino);
        // Where each directory's times were last set by a change taken
        // out: a setting of them takes that change's place.  (A file's
        // changes touch one directory or two: lists, not maps.)
        let mut last: Vec<(Ino, u64, Timestamp, Time)> = Vec::new();
        for at in touching {
            let p = self.remove(at).expect("pending");
            for d in p.dirs {
                if d == ino {
                    continue;
                }
                match last.iter_mut().find(|(dir, ..)| *dir == d) {
                    Some(l) => *l = (d, at, p.change.now, p.clock),
                    None => last.push((d, at, p.change.now, p.clock)),
                }
            }
        }
        last.sort_unstable_by_key(|(dir, ..)| *dir);
        // Settings that take one change's place go one after another.
        let mut taken: Vec<u64> = Vec::new();
        for (dir, at, now, clock) in last {
            let k = taken.iter().filter(|t| **t == at).count() as u64;
            taken.push(at);
            self.fix_times(dir, at + k, (now, clock));
        }
        if self.pending.is_empty() {
            self.since = None;
        }
    }

    /// Sets `dir`'s times to `now` (as a change of its names at `now` left
    /// them) at position `at`, in place of such a setting just before
    /// (unless that one is on its way); `clock`: when the change it takes
    /// the place of was made.
    fn fix_times(&mut self, dir: Ino, at: u64, (now, clock): (Timestamp, Time)) {
        let before = self
            .pending
            .range(..at)
            .next_back()
            .filter(|(k, p)| !self.is_sent(**k) && p.fix && p.inos == [dir])
            .map(|(k, _)| *k);
        if let Some(k) = before {
            self.remove(k);
        }
        self.insert(
            at,
            Pending {
                change: Pushed {
                    who: Identity::root(),
                    now,
                    op: UpdateOp::SetAttr {
                        ino: dir,
                        set: SetAttr {
                            mtime: Some(TimeSet::At(now)),
                            ..SetAttr::default()
                        },
                    },
                },
                clock,
                versions: Vec::new(),
                inos: vec![dir],
                dirs: Vec::new(),
                fix: true,
            },
        );
    }

    /// Whether the oldest pending change was made `age` or more before
    /// `clock`.
    pub fn due(&self, clock: Time, age: Duration) -> bool {
        self.since.is_some_and(|s| clock.saturating_since(s) >= age)
    }

    /// The pending changes, for a push (they stay until
    /// [`Private::pushed`]).
    pub fn to_push(&self) -> Vec<Pushed> {
        self.pending.values().map(|p| p.change.clone()).collect()
    }

    /// The pending changes, for a push that goes while changes go on
    /// being made: those made from now on wait for the next push, and
    /// none of these is taken out (a temporary file one of them made is
    /// the primary's to remove) until [`Private::pushed`] or
    /// [`Private::push_failed`].
    pub fn start_push(&mut self) -> Vec<Pushed> {
        self.sent = Some(self.next);
        self.to_push()
    }

    /// The changes of the push on its way, as [`Private::start_push`]
    /// gave them (to send again, at a new primary); none without one.
    pub fn on_its_way(&self) -> Vec<Pushed> {
        let upto = self.sent.unwrap_or(0);
        (self.pending.range(..upto))
            .map(|(_, p)| p.change.clone())
            .collect()
    }

    /// Whether a push is on its way.
    pub fn is_pushing(&self) -> bool {
        self.sent.is_some()
    }

    /// The push was applied: of [`Private::start_push`]'s changes if one
    /// started, else of [`Private::to_push`]'s (all of them).  The primary
    /// knows every inode they made; changes made since wait.
    pub fn pushed(&mut self) {
        let upto = self.sent.take().unwrap_or(u64::MAX);
        let gone: Vec<u64> = self.pending.range(..upto).map(|(at, _)| *at).collect();
        for at in gone {
            self.remove(at);
        }
        self.fresh.retain(|_, at| *at >= upto);
        // The primary's versions now are those the changes still to come
        // found.
        self.named.clear();
        for p in self.pending.values() {
            for (ino, version) in &p.versions {
                if !self.fresh.contains_key(ino) {
                    self.named.entry(*ino).or_insert(*version);
                }
            }
        }
        self.since = self.pending.values().map(|p| p.clock).min();
    }

    /// The push on its way failed: its changes are pending as before, to
    /// go with the next.
    pub fn push_failed(&mut self) {
        self.sent = None;
    }

    /// What a client reclaims `Write` on at a new primary, with the version
    /// of each: every inode of the copy (those made since the last push
    /// too, for a push whose answer was lost with the old primary may have
    /// made them; the primary has not heard of them otherwise) and every
    /// inode a pending change names (one the copy removed is the primary's
    /// still).
    pub fn known(&self) -> Vec<(Ino, u64)> {
        let mut known: Vec<(Ino, u64)> = self
            .tree
            .inodes()
            .map(|i| (i.attr.ino, i.attr.version))
            .collect();
        known.extend(
            self.named
                .iter()
                .filter(|(ino, _)| self.tree.get(**ino).is_none() && self.by_ino.contains_key(ino))
                .map(|(ino, v)| (*ino, *v)),
        );
        known.sort_unstable();
        known
    }

    /// The inodes made since the last push (whose data cannot be written
    /// back before they are pushed).
    pub fn fresh(&self) -> Vec<Ino> {
        self.fresh.keys().copied().collect()
    }

    /// Nothing is private any more (after a push, or when the client's
    /// tokens went): every inode that was, and the pending changes that
    /// were never pushed.
    pub fn dissolve(&mut self) -> (Vec<Inode>, Vec<Pushed>) {
        let lost = self.to_push();
        let inodes = self.tree.inodes().cloned().collect();
        *self = Private::new();
        (inodes, lost)
    }
}
