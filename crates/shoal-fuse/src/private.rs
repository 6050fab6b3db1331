//! The mount's private directories (`docs/fs.md`, "Private
//! directories"): directories this mount made and holds `Write` on, which
//! no other mount can have looked at.  Their names and the inodes made in
//! them change in the mount's own copy (`shoal_fs::private`, the replicas'
//! state machine) without a message, and go to the primary as one push:
//!
//! - before another mount's look at any of them is answered (the recall
//!   of a private inode's token), and before a change the copy cannot
//!   make touches one (a rename or link out of them, a change of
//!   extended attributes): then nothing is private any more, and the
//!   mount holds the inodes as any others, under the `Write` tokens the
//!   push brought;
//! - before a request the primary answers for a private inode it must
//!   know (a read of extended attributes, a file's write-back or
//!   `fsync`, carried in the same push), when the oldest pending change is as old as the
//!   write-back window, and at `fsync` of a private directory: they stay
//!   private (a file's committed write-back is applied to the copy too);
//! - at unmount.
//!
//! A temporary file made and removed between two pushes never reaches
//! the primary at all.  `fcntl` locks on private inodes are the mount's
//! to decide (`MountLocks::local`), and go to the primary after the push
//! that ends the privacy.
//!
//! Locks: the pushes' client is taken before the private state's, and
//! that before the cache's and the opens'.  A push holds its client for
//! its round trip, so pushes go one at a time and in order, but not the
//! private state: changes go on being made in the copy meanwhile, and go
//! with the next push (`Private::start_push`).  The end of the privacy
//! pushes the rest again with the state held, so that nothing made
//! meanwhile is left out.  Nothing here waits for the session's client,
//! so a push can answer a recall while another thread's request waits at
//! the primary.  A session that ended takes
//! the private state with it: changes not yet pushed are lost, as a
//! client crash loses them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;
use shoal_fs::locks::{Lock, Mode};
use shoal_fs::model::{Attr, FsError, Identity, Ino, Kind};
use shoal_fs::op::{Failure, Grant, LockHow, Op, Reply};
use shoal_fs::private::{Private, numbered};
use shoal_fs::tokens::OpenId;
use shoal_fs::update::{Answer, Pushed, UpdateOp};
use shoal_fssvc::FsClient;
use shoal_time::Time;

use crate::conn::Conn;

/// The private state and the client its pushes go through.
#[derive(Default)]
pub(crate) struct Privates {
    state: Mutex<State>,
    /// The pushes' own client of the session, made at the first use, and
    /// held for each push's round trip.
    pusher: Mutex<Option<FsClient>>,
    /// Write-backs of private files waiting to be pushed: whoever pushes
    /// next carries every one (a group commit), so concurrent `fsync`s
    /// share one request instead of queueing for one each.
    commits: Mutex<Vec<Queued>>,
}

/// A write-back's commit waiting for a push, and where its result goes.
struct Queued {
    ino: Ino,
    commit: Pushed,
    /// A write-back of an `fsync`: the push must be durable.
    durable: bool,
    result: Arc<Mutex<Option<Committed>>>,
}

/// What a push made of a queued commit: its answer, `None` if nothing
/// about the file was private any more (it goes on its own), or why the
/// push failed.
type Committed = Result<Option<Result<Answer, FsError>>, Failure>;

#[derive(Default)]
struct State {
    core: Private,
}

/// The pushes' client, held.
type Pusher<'a> = parking_lot::MutexGuard<'a, Option<FsClient>>;

/// Where a change goes.
pub(crate) enum Routed {
    /// Made in private directories: its answer.
    Local(Result<Answer, FsError>),
    /// To the primary, as any change (whatever it touched was pushed and
    /// is private no more).
    Shared(UpdateOp),
}

/// Every inode a change names by number.
pub(crate) fn named(op: &UpdateOp) -> Vec<Ino> {
    match op {
        UpdateOp::Commit { ino, .. }
        | UpdateOp::Overlay { ino, .. }
        | UpdateOp::SetXattr { ino, .. }
        | UpdateOp::RemoveXattr { ino, .. }
        | UpdateOp::Revoke { ino, .. }
        | UpdateOp::Forget { ino } => vec![*ino],
        _ => numbered(op).map_or_else(Vec::new, |n| n.to_vec()),
    }
}

/// Microseconds on the mount's clock, for the push window.
fn clock(conn: &Conn) -> Time {
    conn.lease.now()
}

impl Conn {
    /// Whether `ino` is private, or named by a pending change: anything
    /// sent to the primary about it must follow the push.
    pub(crate) fn private_mentions(&self, ino: Ino) -> bool {
        self.privates.state.lock().core.mentions(ino)
    }

    /// A lock (`mode`) or unlock (`None`) of `owner` through handle `fh`
    /// on `ino`, decided here if `ino` is private (no other mount can hold
    /// locks on it): whether it was taken.  `None` if `ino` is not
    /// private: the primary decides.
    pub(crate) fn private_lock(
        &self,
        (fh, ino, owner): (u64, Ino, u64),
        mode: Option<Mode>,
        range: (u64, u64, u32),
    ) -> Option<Result<bool, Failure>> {
        let s = self.privates.state.lock();
        if !s.core.holds(ino) {
            return None;
        }
        Some(
            self.locks
                .local(fh, ino, owner, mode, range)
                .map_err(|_| Failure::Fs(FsError::Invalid("an empty or backward lock range"))),
        )
    }

    /// The lock in the way of `owner`'s `mode` lock on `range` of `ino`,
    /// decided here if `ino` is private; `None` if it is not.
    pub(crate) fn private_lock_test(
        &self,
        ino: Ino,
        owner: u64,
        mode: Mode,
        range: (u64, u64),
    ) -> Option<Option<Lock>> {
        let s = self.privates.state.lock();
        if !s.core.holds(ino) {
            return None;
        }
        Some(self.locks.local_conflict(ino, owner, mode, range))
    }

    /// Whether `ino` is private.
    pub(crate) fn is_private(&self, ino: Ino) -> bool {
        self.privates.state.lock().core.holds(ino)
    }

    /// A private inode's attributes, with the mount's dirty changes made.
    pub(crate) fn private_attr(&self, ino: Ino) -> Option<Attr> {
        let mut attr = self.privates.state.lock().core.attr(ino)?;
        self.cache.lock().patch(&mut attr);
        Some(attr)
    }

    /// The inode `name` names in `parent`, if `parent` is private.
    pub(crate) fn private_lookup(&self, parent: Ino, name: &[u8]) -> Option<Result<Attr, FsError>> {
        let s = self.privates.state.lock();
        if !s.core.holds(parent) {
            return None;
        }
        Some(s.core.lookup(parent, name).map(|mut a| {
            self.cache.lock().patch(&mut a);
            a
        }))
    }

    /// A private directory's parent and entries.
    #[allow(clippy::type_complexity)]
    pub(crate) fn private_entries(
        &self,
        dir: Ino,
    ) -> Option<Result<(Ino, Vec<(Vec<u8>, Ino, Kind)>), FsError>> {
        let s = self.privates.state.lock();
        let parent = s.core.parent(dir)?;
        Some(s.core.entries(dir).map(|e| (parent, e)))
    }

    /// A private symbolic link's target.
    pub(crate) fn private_target(&self, ino: Ino) -> Option<Result<Vec<u8>, FsError>> {
        let s = self.privates.state.lock();
        let i = s.core.get(ino)?;
        Some(match &i.body {
            shoal_fs::tree::Body::Symlink { target } => Ok(target.clone()),
            _ => Err(FsError::Invalid("not a symbolic link")),
        })
    }

    /// Makes `op` as `who` in the private directories if everything it
    /// touches is private; otherwise hands it back for the primary, after
    /// pushing (and so ending the privacy of) whatever it touches that
    /// was.
    pub(crate) fn private_change(&self, who: &Identity, op: UpdateOp) -> Result<Routed, Failure> {
        self.pushing(|| self.private_change_once(who, op.clone(), None))
    }

    /// A create of a file and its open (`open`, for writing or not), in
    /// one step if the directory is private: no other thread's unlink can
    /// come between them and find the file unopened.
    pub(crate) fn private_create_open(
        &self,
        who: &Identity,
        op: UpdateOp,
        open: (OpenId, bool),
    ) -> Result<Routed, Failure> {
        self.pushing(|| self.private_change_once(who, op.clone(), Some(open)))
    }

    fn private_change_once(
        &self,
        who: &Identity,
        op: UpdateOp,
        open: Option<(OpenId, bool)>,
    ) -> Result<Routed, Failure> {
        let inos = numbered(&op).unwrap_or_default();
        let mut s = self.privates.state.lock();
        let private = inos.iter().filter(|i| s.core.holds(**i)).count();
        if inos.is_empty() || private == 0 {
            // A change of names in a shared directory may remove or move a
            // private directory named there (its entries are not the
            // primary's yet).
            let names = matches!(op, UpdateOp::Unlink { .. } | UpdateOp::Rename { .. });
            if names && inos.iter().any(|d| s.core.names_in(*d)) {
                drop(s);
                self.dissolve(&mut self.privates.pusher.lock())?;
            }
            return Ok(Routed::Shared(op));
        }
        if private < inos.len() {
            drop(s);
            self.dissolve(&mut self.privates.pusher.lock())?;
            return Ok(Routed::Shared(op));
        }
        let op = self.with_opens(&s.core, op);
        let now = crate::fs::attr::time_of(std::time::SystemTime::now());
        let answer = s.core.change(who, now, op, clock(self));
        match &answer {
            Ok(Answer::Entry { attr, .. }) => {
                self.cache.lock().hold_local(attr);
                if let Some((id, write)) = open {
                    self.record_open(attr.ino, id, write);
                }
            }
            Ok(Answer::Removed {
                gone: Some(ino), ..
            }) => self.cache.lock().forget(*ino),
            _ => {}
        }
        Ok(Routed::Local(answer))
    }

    /// Makes `op` as `who` in the private copy if it can be, else at the
    /// primary: its answer, and whether it was made in the copy.
    pub(crate) fn route(&self, who: &Identity, op: UpdateOp) -> Result<(Answer, bool), Failure> {
        match self.private_change(who, op)? {
            Routed::Local(answer) => Ok((answer.map_err(Failure::Fs)?, true)),
            Routed::Shared(op) => Ok((self.change(who, op)?, false)),
        }
    }

    /// `op` with whether its victim is open here (the primary keeps such
    /// an inode without a name until its last close).
    fn with_opens(&self, core: &Private, mut op: UpdateOp) -> UpdateOp {
        let open =
            |dir: Ino, name: &[u8]| core.lookup(dir, name).is_ok_and(|a| self.is_open(a.ino));
        match &mut op {
            UpdateOp::Unlink {
                parent,
                name,
                open: o,
                ..
            } => *o = open(*parent, name),
            UpdateOp::Rename {
                to,
                to_name,
                open_victim,
                ..
            } => *open_victim = open(*to, to_name),
            _ => {}
        }
        op
    }

    /// A directory the primary made for this mount, granting it `Write`
    /// (`grant`): private from birth.
    pub(crate) fn adopt(&self, attr: &Attr, secret: [u8; 16], parent: Ino, grant: &Grant) {
        let mut s = self.privates.state.lock();
        self.cache.lock().install(attr, grant);
        // Private only if the token is still held: a lookup of the new
        // directory by another thread may have answered first, and a
        // recall of that later grant been carried out with it.  Adopted
        // before the recalls waiting for this grant go.
        if self.cache.lock().holds_write(attr.ino) {
            s.core.adopt_dir(*attr, secret, parent);
        } else {
            tracing::debug!(
                "directory {} was recalled before its mkdir answered",
                attr.ino
            );
        }
        drop(s);
        self.settle();
    }

    /// The last open of `ino` here closed: a private inode with no name
    /// left goes.
    pub(crate) fn private_closed(&self, ino: Ino) {
        let mut s = self.privates.state.lock();
        if s.core.closed(ino) {
            self.cache.lock().forget(ino);
        }
    }

    /// Pushes the pending changes; the directories stay private.
    pub(crate) fn push(&self) -> Result<(), Failure> {
        self.push_as(false)
    }

    /// [`Conn::push`] as the end of an `fsync`: a push made is durable
    /// (`crate::writeback::durable_answers` counts it).
    pub(crate) fn push_durable(&self) -> Result<(), Failure> {
        self.push_as(true)
    }

    fn push_as(&self, durable: bool) -> Result<(), Failure> {
        self.pushing(|| {
            self.push_with(&mut self.privates.pusher.lock(), Vec::new(), durable)
                .map(drop)
        })
    }

    /// Runs `f`, which may push, again after the session was started
    /// again if the primary no longer knew it (a new primary, whose grace
    /// period takes the private inodes back, or a lease that ended).  The
    /// hello is said outside the private state's lock: it takes the
    /// session client's.
    fn pushing<T>(&self, f: impl Fn() -> Result<T, Failure>) -> Result<T, Failure> {
        let mut tries = 0;
        loop {
            let seen = self.hellos();
            match f() {
                Err(Failure::NoSession) if tries < 5 => {
                    tries += 1;
                    self.recover(seen)?;
                }
                other => return other,
            }
        }
    }

    /// Whether the oldest pending change is as old as the write-back
    /// window.
    pub(crate) fn push_due(&self) -> bool {
        (self.privates.state.lock().core).due(clock(self), self.tuning.write_back_after)
    }

    /// The private inodes to reclaim at a new primary, with their versions
    /// (`Private::known`), and those made since the last push (which the
    /// primary knows only if a push whose answer was lost made them).
    pub(crate) fn private_inodes(&self) -> (HashMap<Ino, u64>, HashSet<Ino>) {
        let s = self.privates.state.lock();
        let fresh: HashSet<Ino> = s.core.fresh().into_iter().collect();
        (s.core.known().into_iter().collect(), fresh)
    }

    /// The session started again and every private inode the primary
    /// knows came back at `Write`: those made since the last push are
    /// held again too.
    pub(crate) fn private_rehold(&self, fresh: &HashSet<Ino>) {
        let s = self.privates.state.lock();
        for ino in fresh {
            if let Some(attr) = s.core.attr(*ino) {
                self.cache.lock().hold_local(&attr);
            }
        }
    }

    /// Ends the privacy of everything if any of `inos` is private, or
    /// named by a pending change (removed from the copy, not yet at the
    /// primary), its pending changes pushed first: a change the private
    /// copy cannot make goes to the primary.
    pub(crate) fn unprivate(&self, inos: &[Ino]) -> Result<(), Failure> {
        self.before_primary(inos, true, false)
    }

    /// Pushes the pending changes if any of `inos` is private or named by
    /// one, so that the primary knows them before a request about them
    /// goes there (a lock, a write-back, an `fsync`, a read of extended
    /// attributes); the directories stay private.
    pub(crate) fn publish(&self, inos: &[Ino]) -> Result<(), Failure> {
        self.before_primary(inos, false, false)
    }

    /// [`Conn::publish`] as the end of an `fsync`: a push made is durable.
    pub(crate) fn publish_durable(&self, inos: &[Ino]) -> Result<(), Failure> {
        self.before_primary(inos, false, true)
    }

    fn before_primary(&self, inos: &[Ino], dissolve: bool, durable: bool) -> Result<(), Failure> {
        let mentioned = || {
            let s = self.privates.state.lock();
            inos.iter().any(|i| s.core.mentions(*i))
        };
        self.pushing(|| {
            if !mentioned() {
                return Ok(());
            }
            // After the push on its way, if any.
            let mut p = self.privates.pusher.lock();
            if !mentioned() {
                Ok(())
            } else if dissolve {
                self.dissolve(&mut p)
            } else {
                self.push_with(&mut p, Vec::new(), durable).map(drop)
            }
        })
    }

    /// The primary committed `op`, a write-back of a private file, at
    /// `at`: the copy shows what it made (`Private::committed`).
    pub(crate) fn private_committed(&self, op: &UpdateOp, at: shoal_fs::model::Timestamp) {
        self.privates.state.lock().core.committed(at, op);
    }

    /// The session ended: its tokens, and so the private directories, are
    /// gone; changes not yet pushed are lost (as at a crash of the mount),
    /// with the unwritten bytes of the files they made.
    pub(crate) fn lose_private(&self) {
        let mut s = self.privates.state.lock();
        self.lose_locked(&mut s);
    }

    fn lose_locked(&self, s: &mut State) {
        let fresh = s.core.fresh();
        let (inodes, lost) = s.core.dissolve();
        // What the kernel keeps of them goes (the primary may never have
        // heard of them, or may hold them otherwise by now), and so do
        // the locks this mount gave on them.
        let inodes: Vec<Ino> = inodes.iter().map(|i| i.attr.ino).collect();
        for ino in &inodes {
            self.locks.forget(*ino);
        }
        let names = self.cache.lock().forget_held(&inodes);
        if !inodes.is_empty() {
            self.post(crate::callbacks::Work::Inval {
                inodes: inodes.iter().map(|i| (*i, 0, 0)).collect(),
                names,
            });
        }
        if !lost.is_empty() {
            tracing::warn!(
                "{} changes in private directories were lost: the session ended before they were pushed",
                lost.len()
            );
        }
        for ino in fresh {
            if self.cache.lock().is_dirty(ino) {
                self.cache.lock().lose(ino);
            }
        }
    }

    /// Ends the privacy of everything: the pending changes go while
    /// changes go on, then those made meanwhile with the private state
    /// held, and then nothing is private.
    fn dissolve(&self, p: &mut Pusher<'_>) -> Result<(), Failure> {
        self.push_with(p, Vec::new(), false)?;
        let mut s = self.privates.state.lock();
        self.push_held(p, &mut s, Vec::new())?;
        let (inodes, _) = s.core.dissolve();
        tracing::debug!("{} private inodes are shared now", inodes.len());
        let inodes: Vec<Ino> = inodes.iter().map(|i| i.attr.ino).collect();
        self.hand_over_locks(p, &inodes)
    }

    /// The locks this mount gave its programs on `inodes`, private until
    /// now, go to the primary, which decides from now on: before the
    /// privacy's end is answered (a recall), so no other mount can take a
    /// lock in their way.  Through the pushes' own client (the private
    /// state's lock is held).  A lock the primary refuses (none can be in
    /// its way) is lost, and logged.
    fn hand_over_locks(&self, p: &mut Pusher<'_>, inodes: &[Ino]) -> Result<(), Failure> {
        for &ino in inodes {
            let locks = self.locks.on(ino);
            if locks.is_empty() {
                continue;
            }
            let pusher = self.pusher(p)?;
            for lock in locks {
                let op = crate::locks::asking(ino, &lock, LockHow::Try);
                match pusher.call(&Identity::root(), op) {
                    Ok(Reply::Locked(None)) => {}
                    other => {
                        tracing::warn!(
                            "a lock on inode {ino} of process {} is lost: the primary would not take it from the private copy ({other:?})",
                            lock.pid
                        );
                        self.locks.lost(ino, &lock);
                    }
                }
            }
        }
        Ok(())
    }

    /// Pushes the pending changes and then `commit` (a write-back of
    /// private file `ino`, its bytes stored already) in the same request:
    /// the file's name and its bytes reach the primary in one ordered
    /// update, as `fsync` asks (`docs/fs.md`, "Messages per operation").
    /// `None` if nothing about the file is private any more: its commit
    /// goes on its own.  Otherwise the commit's result.  Commits queued
    /// while another push was on its way go together in the next one.
    pub(crate) fn push_commit(
        &self,
        ino: Ino,
        commit: &UpdateOp,
        durable: bool,
    ) -> Result<Option<Result<Answer, FsError>>, Failure> {
        let mut tries = 0;
        loop {
            let seen = self.hellos();
            let result = Arc::new(Mutex::new(None));
            self.privates.commits.lock().push(Queued {
                ino,
                commit: Pushed {
                    who: Identity::root(),
                    now: crate::fs::attr::time_of(std::time::SystemTime::now()),
                    op: commit.clone(),
                },
                durable,
                result: result.clone(),
            });
            let mut p = self.privates.pusher.lock();
            // Pushed by the push before this one, while this thread
            // waited for it?  Else this thread pushes every commit queued.
            let taken = result.lock().take();
            let committed = match taken {
                Some(r) => r,
                None => {
                    self.push_queued(&mut p);
                    result.lock().take().expect("a queued commit's result")
                }
            };
            drop(p);
            match committed {
                Err(Failure::NoSession) if tries < 5 => {
                    tries += 1;
                    self.recover(seen)?;
                }
                other => return other,
            }
        }
    }

    /// Pushes the pending changes and, after them, every queued commit of
    /// a file still private or named by a pending change (the others are
    /// answered `None`), in one request; each queued write-back gets its
    /// own result.
    fn push_queued(&self, p: &mut Pusher<'_>) {
        let queued = std::mem::take(&mut *self.privates.commits.lock());
        let (mentioned, alone): (Vec<Queued>, Vec<Queued>) = {
            let s = self.privates.state.lock();
            queued.into_iter().partition(|q| s.core.mentions(q.ino))
        };
        for q in alone {
            *q.result.lock() = Some(Ok(None));
        }
        if mentioned.is_empty() {
            return;
        }
        let commits = mentioned.iter().map(|q| q.commit.clone()).collect();
        let durable = mentioned.iter().any(|q| q.durable);
        match self.push_with(p, commits, durable) {
            Ok(results) if results.len() != mentioned.len() => {
                let e = Failure::Unavailable(format!(
                    "a push of {} commits was answered with {} results",
                    mentioned.len(),
                    results.len()
                ));
                for q in &mentioned {
                    *q.result.lock() = Some(Err(e.clone()));
                }
            }
            Ok(results) => {
                for (q, r) in mentioned.iter().zip(results) {
                    *q.result.lock() = Some(Ok(Some(r)));
                }
            }
            Err(e) => {
                for q in &mentioned {
                    *q.result.lock() = Some(Err(e.clone()));
                }
            }
        }
    }

    /// The pushes' own client of the session, made at the first use.
    fn pusher<'a>(&self, p: &'a mut Pusher<'_>) -> Result<&'a mut FsClient, Failure> {
        if p.is_none() {
            **p = Some(FsClient::for_session(
                &self.ctx,
                &self.name,
                self.session(),
            )?);
        }
        Ok(p.as_mut().expect("made"))
    }

    /// Pushes the pending changes, and `commits` after them: their
    /// results.  The private state is not held on the way: changes made
    /// meanwhile go with the next push.  A `durable` push is answered
    /// once the primary's log holds it on disk.
    fn push_with(
        &self,
        p: &mut Pusher<'_>,
        commits: Vec<Pushed>,
        durable: bool,
    ) -> Result<Vec<Result<Answer, FsError>>, Failure> {
        let pusher = self.pusher(p)?;
        let Some((push, n)) = start(&mut self.privates.state.lock(), commits, durable) else {
            return Ok(Vec::new());
        };
        let reply = pusher.call(&Identity::root(), push);
        if durable && reply.is_ok() {
            crate::writeback::answered_durable();
        }
        self.pushed(p, &mut self.privates.state.lock(), n, reply)
    }

    /// [`Conn::push_with`] with the private state held throughout.
    fn push_held(
        &self,
        p: &mut Pusher<'_>,
        s: &mut State,
        commits: Vec<Pushed>,
    ) -> Result<Vec<Result<Answer, FsError>>, Failure> {
        let pusher = self.pusher(p)?;
        let Some((push, n)) = start(s, commits, false) else {
            return Ok(Vec::new());
        };
        let reply = pusher.call(&Identity::root(), push);
        self.pushed(p, s, n, reply)
    }

    /// A push's answer (`n` pending changes, then the commits): the
    /// commits' results.
    fn pushed(
        &self,
        p: &mut Pusher<'_>,
        s: &mut State,
        n: usize,
        reply: Result<Reply, Failure>,
    ) -> Result<Vec<Result<Answer, FsError>>, Failure> {
        match reply {
            Ok(Reply::Pushed { mut results, made }) => {
                let committed = results.split_off(n.min(results.len()));
                let refused = results.iter().filter(|r| r.is_err()).count();
                s.core.pushed();
                for (attr, grant) in &made {
                    self.granted(attr, grant);
                }
                if refused > 0 {
                    // The copy and the replicas differ: what the kernel
                    // keeps of the private inodes goes, and the changes
                    // made since the push started with them.
                    tracing::warn!("{refused} of {n} pushed changes were refused");
                    let (inodes, lost) = s.core.dissolve();
                    if !lost.is_empty() {
                        tracing::warn!(
                            "{} changes in private directories made since are lost with them",
                            lost.len()
                        );
                    }
                    let inodes: Vec<Ino> = inodes.iter().map(|i| i.attr.ino).collect();
                    self.hand_over_locks(p, &inodes)?;
                    self.post(crate::callbacks::Work::Inval {
                        inodes: inodes.iter().map(|i| (*i, 0, 0)).collect(),
                        names: Vec::new(),
                    });
                }
                tracing::debug!("pushed {n} changes, {} inodes made", made.len());
                Ok(committed)
            }
            Ok(other) => {
                s.core.push_failed();
                Err(shoal_fssvc::client::unexpected(&other))
            }
            Err(e @ Failure::Fs(FsError::Stale(_))) => {
                // The tokens went with the session: the primary will not
                // take the changes.
                tracing::warn!("pushing {n} changes: {e}");
                s.core.push_failed();
                self.lose_locked(s);
                Err(Failure::Fs(FsError::Io))
            }
            Err(e) => {
                s.core.push_failed();
                Err(e)
            }
        }
    }
}

/// The request of a push of the pending changes and then `commits`
/// (`durable`: answered once on the primary's disk), and how many of its
/// changes were pending; `None` if there is nothing to push.
fn start(s: &mut State, commits: Vec<Pushed>, durable: bool) -> Option<(Op, usize)> {
    let mut ops = s.core.start_push();
    let n = ops.len();
    ops.extend(commits);
    if ops.is_empty() {
        s.core.push_failed();
        return None;
    }
    Some((
        Op::Change {
            op: UpdateOp::Push { ops },
            durable,
        },
        n,
    ))
}
