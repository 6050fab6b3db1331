//! The primary's soft state and decisions (`docs/fs.md`, "Tokens"): the
//! tokens each client holds, the opens it knows of, the recalls out, the
//! advisory locks, the callbacks waiting for each client's parked
//! `Events` request, the requests waiting for recalls, the changes
//! waiting for their notices' confirmations, and a new primary's grace
//! period.  The metadata service's primary (`shoal-fssvc`) and the
//! simulator both run this, each through its own [`Shell`]: the tree as
//! the replicas hold it, the ordering of updates, and the file servers.
//!
//! Every entry point is one step: [`Soft::request`] decides a request
//! (answering it, or holding it to answer later), [`Soft::tick`] ends
//! leases and holds, and [`Soft::start`]/[`Soft::stop`] follow the group.
//! What a step answers, the held requests included, is taken with
//! [`Soft::answers`]: `H` is whatever the shell needs to send an answer
//! (an RPC request; a simulated mount's message).
//!
//! A request that must wait for recalls is held with its arguments and
//! decided again, with the same arguments, whenever something it may
//! wait on changes (a recall answered, an open closed, a lease ended):
//! `Tokens::request`'s contract.
//!
//! Time is the shell's: a lease clock ([`Time`]), passed to every step.

mod caps;
mod change;
mod decide;
mod locks;
mod push;

use std::collections::BTreeMap;
use std::time::Duration;

use shoal_cap::{Capability, PutPort};
use shoal_time::Time;

use crate::locks::Locks;
use crate::model::{FsError, Identity, Ino, Timestamp};
use crate::op::{self, Failure, Reply};
use crate::tokens::{Callback, ClientId, LEASE, Tokens};
use crate::tree::{OverlayEntry, Tree};
use crate::update::{Answer, Update, UpdateOp};

/// How long a parked `Events` request is held before it is answered
/// empty (the client sends the next at once, renewing its lease).
pub const EVENTS_HOLD: Duration = Duration::from_secs(2);

/// How long a new primary's grace period lasts: a lease, so every client
/// that held tokens from the old primary either reclaims them or has lost
/// them by its lease's end.
pub const GRACE: Duration = LEASE;

/// The uid and gid root is squashed to.
pub const NOBODY: u32 = 65_534;

/// What the primary works on: the replicated tree, its ordering, and the
/// file servers that keep the contents.
pub trait Shell {
    /// Reads the tree as this replica has applied it.
    fn read<T>(&self, f: impl FnOnce(&Tree) -> T) -> T;

    /// Orders an update: its result once it is durable, if this replica
    /// still serves (an answer from a primary that lost its place could
    /// tell of a change the next one never made).
    fn order(&mut self, update: &Update) -> Result<Result<Answer, FsError>, Failure>;

    /// The time of an update made now.
    fn wall(&mut self) -> Timestamp;

    /// A new inode capability secret.
    fn secret(&mut self) -> [u8; 16];

    /// Up to `len` bytes of content version `content` at `offset` (none
    /// past its end), from a file server.
    fn read_content(
        &mut self,
        content: &[Capability],
        offset: u64,
        len: u32,
    ) -> Result<Vec<u8>, Failure>;

    /// Stores a write-shared file's bytes (its content version with its
    /// overlay made) as a new content version: that version's
    /// capabilities and the bytes it holds.
    fn store(&mut self, ino: Ino, flush: &Flush<'_>) -> Result<(Vec<Capability>, u64), Failure>;
}

/// A file whose overlay becomes a content version of its own.
#[derive(Debug, Clone, Copy)]
pub struct Flush<'a> {
    pub base: &'a [Capability],
    /// At least what the base holds below every truncation.
    pub base_held: u64,
    pub overlay: &'a [OverlayEntry],
    pub size: u64,
}

/// What the primary tells every client, and how it treats root.
#[derive(Debug, Clone)]
pub struct Config {
    /// The service's port: capabilities for inodes are made for it.
    pub port: PutPort,
    /// The file servers that keep the contents, and how many copies of
    /// each a mount stores.
    pub servers: Vec<Capability>,
    pub copies: usize,
    /// Whether root stays root (else it is squashed to `nobody`).
    pub allow_root: bool,
    /// How long a new primary's grace period lasts ([`GRACE`]).
    pub grace: Duration,
}

/// The primary's figures, for the service's status.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub clients_parked: usize,
    pub requests_waiting: usize,
    pub changes_noticing: usize,
    /// Client requests decided, leases' renewals aside: what the clients'
    /// caches did not save; and by kind.
    pub requests: u64,
    pub requests_by_kind: BTreeMap<&'static str, u64>,
    pub locks: usize,
}

/// What deciding a request came to.
enum Outcome {
    Reply(Result<Reply, Failure>),
    /// Wait for recalls (held with the waiting requests).
    Wait,
    /// An `Events` request with nothing to carry yet.
    Park,
    /// A change made, answered once these notices are confirmed.
    Notified(Result<Reply, Failure>, Vec<u64>),
}

fn fs(e: FsError) -> Failure {
    Failure::Fs(e)
}

/// The primary's soft state; `H` answers a held request.
pub struct Soft<H> {
    cfg: Config,
    /// The group instance the state belongs to (0: not the primary).
    instance: u64,
    /// The lease clock at the step under way.
    now: Time,
    tokens: Tokens,
    /// The advisory locks the clients' programs hold, and who waits.
    locks: Locks,
    /// Callbacks for each client, until its `Events` request takes them.
    queued: BTreeMap<ClientId, Vec<Callback>>,
    /// Each client's parked `Events` request, and when it came.
    events: BTreeMap<ClientId, (H, Time)>,
    /// Requests waiting for recalls.
    waiting: Vec<(H, op::Request)>,
    /// Changes made, waiting for their notices' confirmations.
    noticing: Vec<(H, Vec<u64>, Result<Reply, Failure>)>,
    /// Updates the primary orders itself (`Forget`, overlay flushes).
    own_seq: u64,
    /// When a new primary's grace period ends (clients reclaim until
    /// then).
    grace_until: Option<Time>,
    requests: u64,
    requests_by_kind: BTreeMap<&'static str, u64>,
    /// Answers made, for the shell to send.
    out: Vec<(H, Result<Reply, Failure>)>,
}

impl<H> Soft<H> {
    /// The state of a replica that is not the primary.
    pub fn new(cfg: Config) -> Soft<H> {
        Soft {
            cfg,
            instance: 0,
            now: Time::ZERO,
            tokens: Tokens::new(),
            locks: Locks::new(),
            queued: BTreeMap::new(),
            events: BTreeMap::new(),
            waiting: Vec::new(),
            noticing: Vec::new(),
            own_seq: 0,
            grace_until: None,
            requests: 0,
            requests_by_kind: BTreeMap::new(),
            out: Vec::new(),
        }
    }

    /// The answers made since the last call, to send.
    pub fn answers(&mut self) -> Vec<(H, Result<Reply, Failure>)> {
        std::mem::take(&mut self.out)
    }

    /// The tokens, for a checker.
    pub fn tokens(&self) -> &Tokens {
        &self.tokens
    }

    /// Whether this state is a primary's (started and not stopped).
    pub fn is_primary(&self) -> bool {
        self.instance != 0
    }

    /// Whether a new primary's grace period is under way.
    pub fn in_grace(&self) -> bool {
        self.grace_until.is_some()
    }

    /// Whether anything waits: requests for recalls, or changes for
    /// their notices.
    pub fn is_waiting(&self) -> bool {
        !self.waiting.is_empty() || !self.noticing.is_empty()
    }

    pub fn figures(&self) -> Figures {
        Figures {
            clients_parked: self.events.len(),
            requests_waiting: self.waiting.len(),
            changes_noticing: self.noticing.len(),
            requests: self.requests,
            requests_by_kind: self.requests_by_kind.clone(),
            locks: self.locks.count(),
        }
    }

    /// Makes the state group instance `instance`'s (not 0): a replica that
    /// became the primary starts empty, numbering its grants above every
    /// earlier primary's (`epoch`), and in its grace period: every client
    /// says hello again and reclaims its tokens, opens and locks, and no
    /// new token is granted until the period ends.  The same instance
    /// again changes nothing.
    pub fn start(&mut self, instance: u64, epoch: u32, now: Time) {
        self.now = now;
        if self.instance != instance {
            self.drop_held(&Err(Failure::NoSession));
            self.tokens = Tokens::after_change(epoch);
            self.locks = Locks::new();
            self.grace_until = Some(now + self.cfg.grace);
            self.instance = instance;
        }
    }

    /// This replica is no longer the primary: every held request is
    /// answered so.
    pub fn stop(&mut self) {
        if self.instance != 0 {
            self.drop_held(&Err(Failure::NotPrimary));
            self.instance = 0;
        }
    }

    /// Answers every held request (the state they wait on is gone).
    fn drop_held(&mut self, why: &Result<Reply, Failure>) {
        for (_, (h, _)) in std::mem::take(&mut self.events) {
            self.out.push((h, why.clone()));
        }
        for (h, _) in self.waiting.drain(..) {
            self.out.push((h, why.clone()));
        }
        // These changes were made: their answers stand.
        for (h, _, reply) in self.noticing.drain(..) {
            self.out.push((h, reply));
        }
        self.queued.clear();
    }

    /// Root squashed unless allowed.
    pub fn squash(&self, mut who: Identity) -> Identity {
        if who.is_root() && !self.cfg.allow_root {
            who = Identity::user(NOBODY, NOBODY);
        }
        who
    }

    /// Decides request `req` of a mount (or a caller by capability),
    /// which `held` answers: at once, or once what it waits on is done.
    /// The caller's right to claim the request's identity is the shell's
    /// to check first.
    pub fn request(&mut self, shell: &mut impl Shell, now: Time, held: H, req: op::Request) {
        self.now = now;
        if self.instance == 0 {
            self.out.push((held, Err(Failure::NotPrimary)));
            return;
        }
        let req = op::Request {
            who: self.squash(req.who),
            ..req
        };
        if !matches!(req.op, op::Op::Events { .. }) {
            self.requests += 1;
            *self.requests_by_kind.entry(req.op.kind()).or_default() += 1;
        }
        match self.handle(shell, &req) {
            Outcome::Reply(reply) => self.out.push((held, reply)),
            Outcome::Wait => self.waiting.push((held, req)),
            Outcome::Notified(reply, ids) => self.noticing.push((held, ids, reply)),
            Outcome::Park => {
                let queued = self.queued.remove(&req.session).unwrap_or_default();
                if !queued.is_empty() {
                    self.out.push((held, Ok(Reply::Events(queued))));
                } else if let Some((old, _)) = self.events.insert(req.session, (held, now)) {
                    self.out.push((old, Ok(Reply::Events(Vec::new()))));
                }
            }
        }
        self.deliver();
    }

    /// Every little while: the grace period ends when its time is up,
    /// leases that ran out end (their opens close, their locks go, and an
    /// unlinked file whose last open went is forgotten), parked `Events`
    /// older than [`EVENTS_HOLD`] are answered empty, and requests
    /// waiting on a client that went are decided again.
    pub fn tick(&mut self, shell: &mut impl Shell, now: Time) {
        self.now = now;
        if self.instance == 0 {
            return;
        }
        if self.grace_until.is_some_and(|t| now >= t) {
            self.grace_until = None;
            self.tokens.end_grace();
            tracing::info!("the grace period ended: tokens are granted again");
            let orphans: Vec<Ino> = shell.read(|t| t.orphans());
            for ino in orphans {
                self.maybe_forget(shell, ino);
            }
            self.retry(shell);
        }
        let (gone, closed) = self.tokens.expire(now, None);
        for c in &gone {
            tracing::info!("client {c:016x}'s lease ended");
            self.release_locks(*c);
            self.queued.remove(c);
            if let Some((h, _)) = self.events.remove(c) {
                self.out.push((h, Err(Failure::NoSession)));
            }
        }
        for ino in closed {
            self.maybe_forget(shell, ino);
        }
        let old: Vec<ClientId> = self
            .events
            .iter()
            .filter(|(_, (_, at))| now.saturating_since(*at) >= EVENTS_HOLD)
            .map(|(c, _)| *c)
            .collect();
        for c in old {
            if let Some((h, _)) = self.events.remove(&c) {
                self.out.push((h, Ok(Reply::Events(Vec::new()))));
            }
        }
        if !gone.is_empty() {
            self.noticed();
            self.retry(shell);
        }
        self.deliver();
    }

    /// Moves the tokens' callbacks to the clients' queues, and answers the
    /// parked `Events` of each client that has some.
    fn deliver(&mut self) {
        while let Some((to, cb)) = self.tokens.poll_callback() {
            self.queued.entry(to).or_default().push(cb);
        }
        let ready: Vec<ClientId> = self
            .queued
            .iter()
            .filter(|(c, q)| !q.is_empty() && self.events.contains_key(c))
            .map(|(c, _)| *c)
            .collect();
        for c in ready {
            let list = self.queued.remove(&c).unwrap_or_default();
            if let Some((h, _)) = self.events.remove(&c) {
                self.out.push((h, Ok(Reply::Events(list))));
            }
        }
    }

    /// Decides the waiting requests again.
    fn retry(&mut self, shell: &mut impl Shell) {
        for (held, req) in std::mem::take(&mut self.waiting) {
            if !req.op.by_capability() && !self.tokens.knows(req.session) {
                self.out.push((held, Err(Failure::NoSession)));
                continue;
            }
            match self.handle(shell, &req) {
                Outcome::Reply(reply) => self.out.push((held, reply)),
                Outcome::Wait | Outcome::Park => self.waiting.push((held, req)),
                Outcome::Notified(reply, ids) => self.noticing.push((held, ids, reply)),
            }
        }
    }

    /// Orders an update the primary makes itself.
    fn order_own(&mut self, shell: &mut impl Shell, op: UpdateOp) -> Result<Answer, Failure> {
        self.own_seq += 1;
        let update = Update {
            session: ClientId(0),
            seq: self.own_seq,
            who: Identity::root(),
            now: shell.wall(),
            op,
        };
        shell.order(&update)?.map_err(fs)
    }

    /// Forgets an inode with no names once nobody has it open or holds a
    /// token on it.
    fn maybe_forget(&mut self, shell: &mut impl Shell, ino: Ino) {
        // In a grace period the opens are not all known yet: the period's
        // end looks at every inode without names.
        if self.tokens.in_grace() {
            return;
        }
        let orphan = shell.read(|t| t.get(ino).is_some_and(|i| i.attr.nlink == 0));
        if !orphan || self.tokens.is_open(ino) {
            return;
        }
        if self.tokens.is_held(ino) {
            // A holder may have it open without the primary knowing: its
            // answer to the recall tells, and comes back here.
            self.tokens.recall_all(ino);
        } else if let Err(e) = self.order_own(shell, UpdateOp::Forget { ino }) {
            tracing::warn!("forgetting inode {ino} failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests;
