//! The primary: the metadata replica whose group member is the sequencer
//! answers the clients, with the soft state only it holds (`docs/fs.md`,
//! "Tokens"): the tokens each client holds, the opens it knows of, the
//! recalls out, the callbacks waiting for each client's parked `Events`
//! request, and the leases.  Every other replica answers "not the
//! primary".
//!
//! One lock (`soft`) covers a request's decision and the update it
//! orders, so a token decision and the tree change it allows are one step
//! for every other client.  A request that must wait for recalls is
//! parked with its RPC request and answered, from whichever thread sees
//! the recall answered or the lease end, by re-deciding it with the same
//! arguments (`Tokens::request`'s contract).
//!
//! Who may call: a mount client is root on its node (the RPC layer tells
//! the caller's uid from its node's kernel), and claims the identity the
//! kernel gave each FUSE request; any other caller is refused.  Root is
//! squashed to `nobody` unless the service allows it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use shoal_cap::Capability;
use shoal_filesvc::FileClient;
use shoal_fs::access::{self, R, W, X};
use shoal_fs::locks::Locks;
use shoal_fs::model::{FsError, Identity, Ino, Kind, ROOT, Time};
use shoal_fs::op::{self, DirEntry, Failure, Grant, Op, Reply, StatFs};
use shoal_fs::replica::FsReplica;
use shoal_fs::tokens::{Callback, ClientId, Decision, LEASE_US, Level, Tokens, Want};
use shoal_fs::tree::{Body, OverlayEntry, overlaid_window};
use shoal_fs::update::{Answer, Update, UpdateOp};
use shoal_fs::xattr;
use shoal_replicasvc::{Handler, Replicated, Unavailable};
use shoal_rpc::{Context, Server};

use crate::FsConfig;
use crate::store::Changes;

mod contents;
mod locks;
mod push;
mod xattrs;

type Rep = Replicated<FsReplica>;

/// A file's content version, overlay and size.
type FileBody = (Vec<Capability>, Vec<OverlayEntry>, u64);

/// How long a parked `Events` request is held before it is answered
/// empty (the client sends the next at once, renewing its lease).
pub const EVENTS_HOLD: Duration = Duration::from_secs(2);

/// How long a new primary's grace period lasts: a lease, so every client
/// that held tokens from the old primary either reclaims them or has lost
/// them by its lease's end.
pub const GRACE: Duration = Duration::from_micros(LEASE_US);

/// The uid and gid root is squashed to.
const NOBODY: u32 = 65_534;

/// An RPC request held to be answered later.
struct Held {
    server: Arc<Server>,
    request: shoal_rpc::Request,
    at: Instant,
}

impl Held {
    fn answer(self, reply: &Result<Reply, Failure>) {
        let _ = self.server.putrep(&self.request, op::encode_reply(reply));
    }
}

/// The primary's soft state.
struct Soft {
    /// The group instance the state belongs to (0: none yet): a new one
    /// means this replica may have just become the primary.
    instance: u64,
    tokens: Tokens,
    /// The advisory locks the clients' programs hold, and who waits.
    locks: Locks,
    /// Callbacks for each client, until its `Events` request takes them.
    queued: HashMap<ClientId, Vec<Callback>>,
    /// Each client's parked `Events` request.
    events: HashMap<ClientId, Held>,
    /// Requests waiting for recalls.
    waiting: Vec<(Held, op::Request)>,
    /// Changes made, waiting for their notices' confirmations.
    noticing: Vec<(Held, Vec<u64>, Result<Reply, Failure>)>,
    /// Updates the primary orders itself (`Forget`, overlay flushes).
    own_seq: u64,
    /// When a new primary's grace period ends (clients reclaim until
    /// then).
    grace_until: Option<Instant>,
    /// Client requests handled, leases' renewals aside: what the
    /// clients' caches did not save; and by kind.
    requests: u64,
    requests_by_kind: std::collections::BTreeMap<&'static str, u64>,
}

impl Soft {
    fn new() -> Soft {
        Soft {
            instance: 0,
            tokens: Tokens::new(),
            locks: Locks::new(),
            queued: HashMap::new(),
            events: HashMap::new(),
            waiting: Vec::new(),
            noticing: Vec::new(),
            own_seq: 0,
            grace_until: None,
            requests: 0,
            requests_by_kind: std::collections::BTreeMap::new(),
        }
    }

    /// Answers every held request (the state they wait on is gone).
    fn drop_held(&mut self, why: &Result<Reply, Failure>) {
        for (_, h) in self.events.drain() {
            h.answer(why);
        }
        for (h, _) in self.waiting.drain(..) {
            h.answer(why);
        }
        // These changes were made: their answers stand.
        for (h, _, reply) in self.noticing.drain(..) {
            h.answer(&reply);
        }
        self.queued.clear();
    }
}

/// What handling a request came to.
enum Outcome {
    Reply(Result<Reply, Failure>),
    /// Wait for recalls (park the request with the waiting ones).
    Wait,
    /// An `Events` request with nothing to carry yet.
    Park,
    /// A change made, answered once these notices are confirmed.
    Notified(Result<Reply, Failure>, Vec<u64>),
}

/// The metadata service's handler, and the primary's state.
pub struct Primary {
    ctx: Context,
    allow_root: bool,
    file_servers: Vec<Capability>,
    copies: usize,
    soft: Mutex<Soft>,
    files: Mutex<Option<FileClient>>,
    started: Instant,
    stopped: AtomicBool,
}

fn fs(e: FsError) -> Failure {
    Failure::Fs(e)
}

fn unavailable(e: Unavailable) -> Failure {
    Failure::Unavailable(e.0)
}

/// The wall clock, as the time of an update.
fn wall() -> Time {
    let d = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    Time::new(d.as_secs() as i64, d.subsec_nanos())
}

fn granted(d: &Decision) -> Option<Grant> {
    match d {
        Decision::Grant {
            level,
            uncached,
            grant,
        } => Some(Grant {
            level: *level,
            grant: *grant,
            uncached: *uncached,
        }),
        _ => None,
    }
}

impl Primary {
    pub(crate) fn new(ctx: &Context, cfg: &FsConfig) -> Primary {
        Primary {
            ctx: ctx.clone(),
            allow_root: cfg.allow_root,
            file_servers: cfg.file_servers.clone(),
            copies: cfg.copies.max(1),
            soft: Mutex::new(Soft::new()),
            files: Mutex::new(None),
            started: Instant::now(),
            stopped: AtomicBool::new(false),
        }
    }

    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.soft.lock().drop_held(&Err(Failure::NotPrimary));
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// The lease clock, in µs.
    fn now(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    /// The replica's status, with the primary's figures.
    pub fn status(&self, r: &Rep, group_port: bool) -> serde_json::Value {
        let mut s = r.status(group_port);
        let soft = self.soft.lock();
        s["primary"] = r.is_sequencer().into();
        s["clients_parked"] = soft.events.len().into();
        s["requests_waiting"] = soft.waiting.len().into();
        s["changes_noticing"] = soft.noticing.len().into();
        s["requests"] = soft.requests.into();
        s["requests_by_kind"] = serde_json::json!(soft.requests_by_kind);
        s["locks"] = soft.locks.count().into();
        s
    }

    /// Root squashed unless allowed.
    pub(super) fn squash(&self, mut who: Identity) -> Identity {
        if who.is_root() && !self.allow_root {
            who = Identity::user(NOBODY, NOBODY);
        }
        who
    }

    /// Makes the soft state the current group instance's: a replica that
    /// became the primary starts empty, numbering its grants above every
    /// earlier primary's, and in its grace period: every client says hello
    /// again and reclaims its tokens and opens, and no new token is
    /// granted until the period ends.
    fn fresh(&self, r: &Rep, soft: &mut Soft) {
        let instance = r.group_instance();
        if soft.instance != instance {
            soft.drop_held(&Err(Failure::NoSession));
            let epoch = (r.index() as u32).wrapping_add(1);
            soft.tokens = Tokens::after_change(epoch);
            soft.locks = Locks::new();
            soft.grace_until = Some(Instant::now() + GRACE);
            soft.instance = instance;
        }
    }

    /// Every 100 ms: leases that ran out end (their opens close, and an
    /// unlinked file whose last open went is forgotten), parked `Events`
    /// older than [`EVENTS_HOLD`] are answered empty, and requests
    /// waiting on a client that went are decided again.
    pub(crate) fn tick(&self, r: &Rep) {
        let mut soft = self.soft.lock();
        if !r.is_sequencer() {
            if soft.instance != 0 {
                soft.drop_held(&Err(Failure::NotPrimary));
                soft.instance = 0;
            }
            return;
        }
        self.fresh(r, &mut soft);
        if soft.grace_until.is_some_and(|t| Instant::now() >= t) {
            soft.grace_until = None;
            soft.tokens.end_grace();
            tracing::info!("the grace period ended: tokens are granted again");
            let orphans: Vec<Ino> = r.read(|m| m.tree.orphans());
            for ino in orphans {
                self.maybe_forget(r, &mut soft, ino);
            }
            self.retry(r, &mut soft);
        }
        let (gone, closed) = soft.tokens.expire(self.now(), None);
        for c in &gone {
            tracing::info!("client {c:016x}'s lease ended");
            Self::release_locks(&mut soft, *c);
            soft.queued.remove(c);
            if let Some(h) = soft.events.remove(c) {
                h.answer(&Err(Failure::NoSession));
            }
        }
        for ino in closed {
            self.maybe_forget(r, &mut soft, ino);
        }
        let old: Vec<ClientId> = soft
            .events
            .iter()
            .filter(|(_, h)| h.at.elapsed() >= EVENTS_HOLD)
            .map(|(c, _)| *c)
            .collect();
        for c in old {
            if let Some(h) = soft.events.remove(&c) {
                h.answer(&Ok(Reply::Events(Vec::new())));
            }
        }
        if !gone.is_empty() {
            self.noticed(&mut soft);
            self.retry(r, &mut soft);
        }
        self.deliver(&mut soft);
    }

    /// Moves the tokens' callbacks to the clients' queues, and answers the
    /// parked `Events` of each client that has some.
    fn deliver(&self, soft: &mut Soft) {
        while let Some((to, cb)) = soft.tokens.poll_callback() {
            soft.queued.entry(to).or_default().push(cb);
        }
        let ready: Vec<ClientId> = soft
            .queued
            .iter()
            .filter(|(c, q)| !q.is_empty() && soft.events.contains_key(c))
            .map(|(c, _)| *c)
            .collect();
        for c in ready {
            let list = soft.queued.remove(&c).unwrap_or_default();
            if let Some(h) = soft.events.remove(&c) {
                h.answer(&Ok(Reply::Events(list)));
            }
        }
    }

    /// Decides the waiting requests again.
    fn retry(&self, r: &Rep, soft: &mut Soft) {
        for (held, req) in std::mem::take(&mut soft.waiting) {
            if !req.op.by_capability() && !soft.tokens.knows(req.session) {
                held.answer(&Err(Failure::NoSession));
                continue;
            }
            match self.handle(r, soft, &req) {
                Outcome::Reply(reply) => {
                    held.answer(&reply);
                }
                Outcome::Wait | Outcome::Park => soft.waiting.push((held, req)),
                Outcome::Notified(reply, ids) => soft.noticing.push((held, ids, reply)),
            }
        }
    }

    /// Orders an update the primary makes itself.
    fn order_own(&self, r: &Rep, soft: &mut Soft, op: UpdateOp) -> Result<Answer, Failure> {
        soft.own_seq += 1;
        let update = Update {
            session: 0,
            seq: soft.own_seq,
            who: Identity::root(),
            now: wall(),
            op,
        };
        let (index, result) = r.order(&update.encode()).map_err(unavailable)?;
        r.durable(index).map_err(unavailable)?;
        result.map_err(fs)
    }

    /// Forgets an inode with no names once nobody has it open or holds a
    /// token on it.
    fn maybe_forget(&self, r: &Rep, soft: &mut Soft, ino: Ino) {
        // In a grace period the opens are not all known yet: the period's
        // end looks at every inode without names.
        if soft.tokens.in_grace() {
            return;
        }
        let orphan = r.read(|m| m.tree.get(ino).is_some_and(|i| i.attr.nlink == 0));
        if !orphan || soft.tokens.is_open(ino) {
            return;
        }
        if soft.tokens.is_held(ino) {
            // A holder may have it open without the primary knowing: its
            // answer to the recall tells, and comes back here.
            soft.tokens.recall_all(ino);
        } else if let Err(e) = self.order_own(r, soft, UpdateOp::Forget { ino }) {
            tracing::warn!("forgetting inode {ino} failed: {e}");
        }
    }

    /// A file's content version, overlay and size.
    fn file_body(r: &Rep, ino: Ino) -> Result<FileBody, Failure> {
        r.read(|m| match m.tree.get(ino) {
            Some(i) => match &i.body {
                Body::File { content, overlay } => {
                    Ok((content.clone(), overlay.clone(), i.attr.size))
                }
                _ if i.attr.kind == Kind::Dir => Err(fs(FsError::IsDir)),
                _ => Err(fs(FsError::Invalid("only a regular file has contents"))),
            },
            None => Err(fs(FsError::NotFound)),
        })
    }

    /// `len` bytes of a file at `offset` (fewer at its end): that window
    /// of its content version, read from a file server, with the
    /// overlay's changes made.
    fn read_window(&self, r: &Rep, ino: Ino, offset: u64, len: u32) -> Result<Vec<u8>, Failure> {
        let (content, overlay, size) = Self::file_body(r, ino)?;
        let base = if content.is_empty() || offset >= size {
            Vec::new()
        } else {
            self.with_files(|f| {
                let (stat, replica) = f.stat(&content)?;
                if offset >= stat.size {
                    return Ok(Vec::new());
                }
                f.read(&replica, offset, len)
            })?
        };
        Ok(overlaid_window(&base, offset, len as usize, &overlay, size))
    }

    fn with_files<T>(
        &self,
        f: impl FnOnce(&mut FileClient) -> Result<T, shoal_filesvc::ClientError>,
    ) -> Result<T, Failure> {
        let mut files = self.files.lock();
        if files.is_none() {
            *files = Some(
                FileClient::new(&self.ctx)
                    .map_err(|e| Failure::Unavailable(format!("file client: {e}")))?,
            );
        }
        f(files.as_mut().expect("made above")).map_err(crate::files_failure)
    }

    /// Before a file is cached again, the bytes written while it was
    /// write-shared (its overlay) become a content version on the file
    /// servers.
    fn flush_overlay(&self, r: &Rep, soft: &mut Soft, ino: Ino) -> Result<(), Failure> {
        let pending = r.read(|m| {
            m.tree.get(ino).and_then(|i| {
                matches!(&i.body, Body::File { overlay, .. } if !overlay.is_empty())
                    .then_some(i.attr)
            })
        });
        let Some(attr) = pending else {
            return Ok(());
        };
        let (base, overlay, size) = Self::file_body(r, ino)?;
        let version = self.with_files(|f| {
            let base_size = if base.is_empty() {
                0
            } else {
                f.stat(&base)?.0.size
            };
            let changes = Changes {
                base: &base,
                base_size,
                // At least what the base holds below every truncation.
                base_held: attr.held,
                overlay: &overlay,
                size,
            };
            crate::store::store(f, &self.file_servers, self.copies, ino, &changes, true)
        })?;
        self.order_own(
            r,
            soft,
            UpdateOp::Commit {
                ino,
                base: attr.version,
                content: version.content,
                size: attr.size,
                held: version.held,
                mtime: attr.mtime,
                flush: true,
            },
        )?;
        Ok(())
    }

    /// Decides one request (of a client with a session).
    fn handle(&self, r: &Rep, soft: &mut Soft, req: &op::Request) -> Outcome {
        if req.op.by_capability() {
            return self.by_capability(r, soft, &req.op);
        }
        let client = req.session;
        let now = self.now();
        if let Op::Hello { node, .. } = &req.op {
            soft.tokens.hello(now, client);
            tracing::info!(
                "client {client:016x} on {} said hello",
                String::from_utf8_lossy(node)
            );
            let root = r.read(|m| m.tree.get(ROOT).map(|i| i.attr));
            return Outcome::Reply(root.map_or(Err(fs(FsError::Io)), |root| {
                Ok(Reply::Hello {
                    lease_ms: (LEASE_US / 1000) as u32,
                    root,
                    servers: self.file_servers.clone(),
                    copies: self.copies.min(u8::MAX as usize) as u8,
                })
            }));
        }
        if !soft.tokens.knows(client) {
            return Outcome::Reply(Err(Failure::NoSession));
        }
        soft.tokens.renew(now, client);
        let who = &req.who;
        let reply = match &req.op {
            Op::Hello { .. }
            | Op::Status
            | Op::CapStat { .. }
            | Op::CapRead { .. }
            | Op::TouchContents { .. } => {
                unreachable!("answered before")
            }
            Op::GetXattr { .. } | Op::ListXattr { .. } => self.xattr(r, who, &req.op),
            Op::Lock { .. } => return self.lock(r, soft, client, &req.op),
            Op::Events { confirm } => {
                for id in confirm {
                    soft.tokens.confirm(client, *id);
                }
                self.noticed(soft);
                return Outcome::Park;
            }
            Op::Confirm { ids } => {
                for id in ids {
                    soft.tokens.confirm(client, *id);
                }
                self.noticed(soft);
                Ok(Reply::Done)
            }
            Op::Lookup { parent, name } => {
                let found = r.read(|m| {
                    let dir = m.tree.get(*parent).ok_or(FsError::NotFound)?;
                    access::check(&dir.attr, who, X)?;
                    m.tree.lookup(*parent, name).map(|i| i.attr)
                });
                match found {
                    Ok(attr) => return self.look(soft, client, attr),
                    Err(e) => Err(fs(e)),
                }
            }
            Op::GetAttr { ino } => match r.read(|m| m.tree.get(*ino).map(|i| i.attr)) {
                Some(attr) => return self.look(soft, client, attr),
                None => Err(fs(FsError::NotFound)),
            },
            Op::ReadDir { ino } => {
                let listed = r.read(|m| {
                    let dir = m.tree.get(*ino).ok_or(FsError::NotFound)?;
                    access::check(&dir.attr, who, R)?;
                    let entries = m.tree.entries(*ino)?;
                    Ok::<_, FsError>(
                        entries
                            .iter()
                            .filter_map(|(name, i)| {
                                Some(DirEntry {
                                    name: name.clone(),
                                    ino: *i,
                                    kind: m.tree.get(*i)?.attr.kind,
                                })
                            })
                            .collect::<Vec<_>>(),
                    )
                });
                match listed {
                    Ok(entries) => match soft.tokens.request(client, *ino, Want::Look, &[], None) {
                        Decision::Wait { .. } => return Outcome::Wait,
                        Decision::NoSession => Err(Failure::NoSession),
                        d => Ok(Reply::Entries {
                            entries,
                            grant: granted(&d).expect("a grant"),
                        }),
                    },
                    Err(e) => Err(fs(e)),
                }
            }
            Op::ReadLink { ino } => r.read(|m| match m.tree.get(*ino).map(|i| &i.body) {
                Some(Body::Symlink { target }) => Ok(Reply::Target(target.clone())),
                Some(_) => Err(fs(FsError::Invalid("not a symbolic link"))),
                None => Err(fs(FsError::NotFound)),
            }),
            Op::Open {
                ino,
                want,
                have,
                id,
                ..
            } => return self.open(r, soft, req, *ino, *want, have, *id),
            Op::Close { ino, id } => {
                if soft.tokens.close(client, *ino, *id) {
                    tracing::debug!("inode {ino} is no longer write-shared");
                }
                self.maybe_forget(r, soft, *ino);
                self.retry(r, soft);
                Ok(Reply::Done)
            }
            Op::Read { ino, offset, len } => {
                self.read_window(r, *ino, *offset, *len).map(Reply::Data)
            }
            Op::Write { ino, offset, data } => match soft.tokens.write_through(client, *ino) {
                Decision::Wait { .. } => return Outcome::Wait,
                Decision::NoSession => Err(Failure::NoSession),
                Decision::Grant { .. } => {
                    return self.change(
                        r,
                        soft,
                        req,
                        UpdateOp::Overlay {
                            ino: *ino,
                            offset: *offset,
                            data: data.clone(),
                        },
                        None,
                    );
                }
            },
            // A change waits out a new primary's grace period: whether a
            // name's inode is open somewhere (and so kept when the name
            // goes) is known once the clients have reclaimed their opens.
            Op::Change { .. } if soft.tokens.in_grace() => return Outcome::Wait,
            Op::Change {
                op: UpdateOp::Push { ops },
            } => return self.push(r, soft, req, ops),
            Op::Change { op } => return self.change(r, soft, req, op.clone(), None),
            Op::CreateOpen { .. } if soft.tokens.in_grace() => return Outcome::Wait,
            Op::CreateOpen { op, id, want } => {
                if !matches!(
                    op,
                    UpdateOp::Create {
                        kind: Kind::File,
                        excl: true,
                        ..
                    }
                ) || !matches!(want, Want::OpenRead | Want::OpenWrite)
                {
                    return Outcome::Reply(Err(fs(FsError::Invalid(
                        "create-and-open makes a new regular file",
                    ))));
                }
                return self.change(r, soft, req, op.clone(), Some((*id, *want)));
            }
            Op::Return {
                ino,
                grant,
                kept,
                opens,
            } => {
                soft.tokens.returned(client, *ino, *grant, *kept, opens);
                self.maybe_forget(r, soft, *ino);
                self.retry(r, soft);
                Ok(Reply::Done)
            }
            Op::Reclaim {
                ino,
                level,
                version,
                opens,
            } => {
                let Some(attr) = r.read(|m| m.tree.get(*ino).map(|i| i.attr)) else {
                    // The inode went (its last name and open are gone):
                    // nothing to reclaim.
                    return Outcome::Reply(Err(fs(FsError::NotFound)));
                };
                let current = *version == Some(attr.version);
                let now = self.now();
                let grant = match soft
                    .tokens
                    .reclaim(now, client, *ino, *level, current, opens)
                {
                    Ok(grant) => Grant {
                        level: if grant == 0 { Level::None } else { *level },
                        grant,
                        uncached: false,
                    },
                    Err(refused) => {
                        tracing::debug!("client {client:016x}'s reclaim of {ino}: {refused:?}");
                        Grant {
                            level: Level::None,
                            grant: 0,
                            uncached: false,
                        }
                    }
                };
                Ok(Reply::Entry { attr, grant })
            }
            Op::StatFs => {
                let inodes = r.read(|m| m.tree.inode_count() as u64);
                // The file servers' space is not yet gathered here: the
                // figures say how many inodes there are, and no limit.
                Ok(Reply::StatFs(StatFs {
                    block_size: 4096,
                    blocks: 1 << 32,
                    blocks_free: 1 << 32,
                    files: inodes + (1 << 32),
                    files_free: 1 << 32,
                }))
            }
        };
        Outcome::Reply(reply)
    }

    /// A lookup or getattr found `attr`: it comes with `Read` if nothing
    /// conflicts.
    fn look(&self, soft: &mut Soft, client: ClientId, attr: shoal_fs::Attr) -> Outcome {
        match soft.tokens.request(client, attr.ino, Want::Look, &[], None) {
            Decision::Wait { .. } => Outcome::Wait,
            Decision::NoSession => Outcome::Reply(Err(Failure::NoSession)),
            d => Outcome::Reply(Ok(Reply::Entry {
                attr,
                grant: granted(&d).expect("a grant"),
            })),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn open(
        &self,
        r: &Rep,
        soft: &mut Soft,
        req: &op::Request,
        ino: Ino,
        want: Want,
        have: &[(u64, bool)],
        id: u64,
    ) -> Outcome {
        let checked = r.read(|m| {
            let i = m.tree.get(ino).ok_or(FsError::NotFound)?;
            match (i.attr.kind, want) {
                (Kind::Dir, Want::OpenWrite) => return Err(FsError::IsDir),
                (Kind::File | Kind::Dir, _) => {}
                _ => return Err(FsError::Invalid("only files and directories are opened")),
            }
            let bits = if want == Want::OpenWrite { W } else { R };
            access::check(&i.attr, &req.who, bits)?;
            Ok(())
        });
        if let Err(e) = checked {
            return Outcome::Reply(Err(fs(e)));
        }
        let grant = match soft.tokens.request(req.session, ino, want, have, Some(id)) {
            Decision::Wait { .. } => return Outcome::Wait,
            Decision::NoSession => return Outcome::Reply(Err(Failure::NoSession)),
            d => granted(&d).expect("a grant"),
        };
        if !grant.uncached
            && grant.level != Level::None
            && let Err(e) = self.flush_overlay(r, soft, ino)
        {
            return Outcome::Reply(Err(e));
        }
        Outcome::Reply(r.read(|m| match m.tree.get(ino) {
            Some(i) => Ok(Reply::Opened {
                attr: i.attr,
                grant,
                content: match &i.body {
                    Body::File { content, .. } if !grant.uncached => content.clone(),
                    _ => Vec::new(),
                },
            }),
            None => Err(fs(FsError::NotFound)),
        }))
    }

    /// Orders a client's change (after the checks only the primary can
    /// make).  Every other client's token on an inode whose attributes
    /// it changes is recalled first; once it is made, the clients that
    /// hold the directories it touched are told which names changed, and
    /// the change is answered when they confirmed (or their leases
    /// ended): a lookup anywhere that starts after the answer sees it.
    /// With `open` (a `CreateOpen`), the new file is opened for the
    /// creator once made, before any other request is decided.
    fn change(
        &self,
        r: &Rep,
        soft: &mut Soft,
        req: &op::Request,
        mut op: UpdateOp,
        open: Option<(u64, Want)>,
    ) -> Outcome {
        let mut p = Prepared::default();
        if let Err(e) = Self::prepare(r, soft, req.session, &mut op, &mut p) {
            return Outcome::Reply(Err(e));
        }
        let mut wait = false;
        for ino in &p.touched {
            // A commit by the holder of `Write` has nobody else to recall
            // (and must not wait for a recall of its own token, whose
            // answer follows it).
            if matches!(op, UpdateOp::Commit { .. })
                && soft.tokens.level(req.session, *ino) == Level::Write
            {
                continue;
            }
            match soft.tokens.exclusive(req.session, *ino) {
                Decision::Wait { .. } => wait = true,
                Decision::NoSession => return Outcome::Reply(Err(Failure::NoSession)),
                Decision::Grant { .. } => {}
            }
        }
        if wait {
            return Outcome::Wait;
        }
        // A client's commit names the version it was made from, so made
        // twice it fails the second time: it needs no exactly-once record,
        // and may come from any of the session's threads (whose request
        // numbers are their own).
        let session = if matches!(op, UpdateOp::Commit { .. }) {
            0
        } else {
            req.session
        };
        let update = Update {
            session,
            seq: req.seq,
            who: req.who.clone(),
            now: wall(),
            op,
        };
        let result = match order_for_client(r, &update) {
            Ok(result) => result,
            Err(e) => return Outcome::Reply(Err(e)),
        };
        let mut notices = Vec::new();
        if result.is_ok() {
            for (dir, name) in &p.names {
                notices.extend(soft.tokens.notify(req.session, *dir, name));
            }
        }
        // A victim kept because it may be open loses its tokens: their
        // answers report the opens, and the last close forgets it.
        if let Ok(Answer::Removed { gone: None, .. }) = &result {
            for ino in p.victims {
                self.maybe_forget(r, soft, ino);
            }
        }
        if let Ok(Answer::Removed {
            gone: Some(ino), ..
        }) = &result
            && p.mine.contains(ino)
        {
            soft.tokens.forget(*ino);
        }
        let reply = if p.names.is_empty() && open.is_none() {
            Ok(Reply::Updated(result))
        } else {
            // The creator's open of what it made: nobody else can hold the
            // new inode yet, so it is granted at once.  A directory made
            // is its maker's to change alone (`Write`: private) until
            // another mount looks at it.
            let asked = match (&result, open) {
                (Ok(Answer::Entry { attr, .. }), Some((id, want))) => {
                    Some((attr.ino, want, Some(id)))
                }
                (
                    Ok(Answer::Entry {
                        attr,
                        existed: false,
                    }),
                    None,
                ) if attr.kind == Kind::Dir && req.session != 0 => {
                    Some((attr.ino, Want::Change, None))
                }
                _ => None,
            };
            let opened = asked.and_then(|(ino, want, id)| {
                granted(&soft.tokens.request(req.session, ino, want, &[], id))
            });
            let mut dirs: Vec<Ino> = p.names.iter().map(|(d, _)| *d).collect();
            dirs.sort_unstable();
            dirs.dedup();
            let dirs = r.read(|m| {
                dirs.iter()
                    .filter_map(|d| m.tree.get(*d).map(|i| i.attr))
                    .collect()
            });
            Ok(Reply::Changed {
                result,
                dirs,
                opened,
            })
        };
        if notices.is_empty() {
            Outcome::Reply(reply)
        } else {
            Outcome::Notified(reply, notices)
        }
    }

    /// Answers the changes whose notices every receiver confirmed.
    fn noticed(&self, soft: &mut Soft) {
        let mut still = Vec::new();
        for (held, mut ids, reply) in std::mem::take(&mut soft.noticing) {
            ids.retain(|id| !soft.tokens.notice_done(*id));
            if ids.is_empty() {
                held.answer(&reply);
            } else {
                still.push((held, ids, reply));
            }
        }
        soft.noticing = still;
    }

    /// Checks a client's change and fills in what only the primary knows
    /// (whether a victim is open somewhere); collects the names it
    /// changes, the inodes whose attributes it changes and those it may
    /// take the last name of.
    fn prepare(
        r: &Rep,
        soft: &Soft,
        client: ClientId,
        op: &mut UpdateOp,
        p: &mut Prepared,
    ) -> Result<(), Failure> {
        let victim_of = |parent: Ino, name: &[u8]| {
            r.read(|m| m.tree.lookup(parent, name).map(|i| i.attr.ino).ok())
        };
        let in_use = |victim: Option<Ino>, p: &mut Prepared| {
            p.victims.extend(victim);
            p.touched.extend(victim);
            victim.is_some_and(|ino| soft.tokens.is_open(ino) || soft.tokens.is_held(ino))
        };
        // Removing `user.shoal.cap` revokes every capability of the inode
        // (`shoal fs revoke`), and so does a change of attributes that
        // takes rights away (`docs/fs.md`, "Authority"): the inode gets a
        // new secret.
        let revoke = match &*op {
            UpdateOp::RemoveXattr { ino, name } if name == xattr::CAP => Some((*ino, None)),
            UpdateOp::SetAttr { ino, set }
                if r.read(|m| m.tree.get(*ino).is_some_and(|i| set.takes_rights(&i.attr))) =>
            {
                Some((*ino, Some(set.clone())))
            }
            _ => None,
        };
        if let Some((ino, set)) = revoke {
            *op = UpdateOp::Revoke {
                ino,
                secret: [0; 16],
                set,
            };
        }
        match op {
            UpdateOp::Forget { .. } => {
                return Err(fs(FsError::Perm));
            }
            UpdateOp::Commit { flush: true, .. } => return Err(fs(FsError::Perm)),
            // A new inode's capability secret is the primary's to draw,
            // whatever the client put there.
            UpdateOp::Create {
                parent,
                name,
                secret,
                ..
            } => {
                *secret = rand::random();
                p.names.push((*parent, name.clone()));
            }
            UpdateOp::Revoke { ino, secret, .. } => {
                p.touched.push(*ino);
                *secret = rand::random();
            }
            UpdateOp::Link { ino, parent, name } => {
                p.names.push((*parent, name.clone()));
                p.touched.push(*ino);
            }
            UpdateOp::Unlink {
                parent, name, open, ..
            } => {
                // The client's `open` says whether it may have the inode
                // open without the primary knowing.  If it says not and is
                // the only one holding it, the inode goes with its name,
                // with no recall: the client drops its token on the answer.
                let victim = victim_of(*parent, name);
                match victim {
                    Some(ino) if !*open && soft.tokens.only(client, ino) => {
                        p.victims.push(ino);
                        p.mine.push(ino);
                    }
                    _ => *open = in_use(victim, p),
                }
                p.names.push((*parent, name.clone()));
            }
            UpdateOp::Rename {
                from,
                from_name,
                to,
                to_name,
                open_victim,
                ..
            } => {
                *open_victim = in_use(victim_of(*to, to_name), p);
                let moved = r.read(|m| m.tree.lookup(*from, from_name).map(|i| i.attr.ino).ok());
                p.touched.extend(moved);
                p.names.push((*from, from_name.clone()));
                p.names.push((*to, to_name.clone()));
            }
            UpdateOp::Push { .. } => {
                return Err(fs(FsError::Invalid("a push is a request of its own")));
            }
            UpdateOp::SetAttr { ino, .. }
            | UpdateOp::Commit { ino, .. }
            | UpdateOp::Overlay { ino, .. }
            | UpdateOp::SetXattr { ino, .. }
            | UpdateOp::RemoveXattr { ino, .. } => p.touched.push(*ino),
            UpdateOp::Range { .. } => {}
        }
        p.names.dedup();
        p.touched.sort_unstable();
        p.touched.dedup();
        Ok(())
    }
}

/// What a change touches, as [`Primary::prepare`] found it.
#[derive(Default)]
struct Prepared {
    /// The names it changes: directory, name.
    names: Vec<(Ino, Vec<u8>)>,
    /// The inodes whose attributes it changes.
    touched: Vec<Ino>,
    /// The inodes it may take the last name of.
    victims: Vec<Ino>,
    /// Victims only the asking client holds, which go with their name.
    mine: Vec<Ino>,
}

/// Orders a client's update: its result once it is durable, if this
/// replica still serves (an answer from a primary that lost its place
/// could tell of a change the next one never made).
fn order_for_client(r: &Rep, update: &Update) -> Result<Result<Answer, FsError>, Failure> {
    r.order(&update.encode())
        .and_then(|(index, result)| {
            r.durable(index)?;
            r.still_serving()?;
            Ok(result)
        })
        .map_err(unavailable)
}

fn reply_to(server: &Server, request: &shoal_rpc::Request, reply: &Result<Reply, Failure>) {
    let _ = server.putrep(request, op::encode_reply(reply));
}

impl Handler<FsReplica> for Primary {
    fn serve(&self, r: &Rep, server: &Server, request: shoal_rpc::Request) {
        let answer = |reply: &Result<Reply, Failure>| reply_to(server, &request, reply);
        let req = match op::Request::decode(request.body()) {
            Ok(q) => q,
            Err(e) => {
                tracing::debug!("undecodable request: {e}");
                return answer(&Err(fs(FsError::Invalid("undecodable request"))));
            }
        };
        if matches!(req.op, Op::Status) {
            let peer = r.is_peer(request.caller());
            return answer(&Ok(Reply::Status(self.status(r, peer).to_string())));
        }
        if !r.is_sequencer() {
            return answer(&Err(Failure::NotPrimary));
        }
        // Only a node's root (its mount client) may claim identities; a
        // request by capability claims none.
        if request.caller().uid != 0 && !req.op.by_capability() {
            return answer(&Err(fs(FsError::Perm)));
        }
        // Touching is file server I/O: made without the soft state's lock.
        if let Op::TouchContents { after } = req.op {
            return answer(&self.touch_contents(r, after));
        }
        let req = op::Request {
            who: self.squash(req.who),
            ..req
        };
        let mut soft = self.soft.lock();
        self.fresh(r, &mut soft);
        if !matches!(req.op, Op::Events { .. }) {
            soft.requests += 1;
            *soft.requests_by_kind.entry(req.op.kind()).or_default() += 1;
        }
        let outcome = self.handle(r, &mut soft, &req);
        let held = |request: shoal_rpc::Request| {
            r.server().map(|server| Held {
                server,
                request,
                at: Instant::now(),
            })
        };
        match outcome {
            Outcome::Reply(reply) => {
                reply_to(server, &request, &reply);
            }
            Outcome::Wait => match held(request) {
                Some(h) => soft.waiting.push((h, req)),
                None => tracing::warn!("a waiting request lost: the replica stopped serving"),
            },
            Outcome::Notified(reply, ids) => match held(request) {
                Some(h) => soft.noticing.push((h, ids, reply)),
                None => tracing::warn!("a change's answer lost: the replica stopped serving"),
            },
            Outcome::Park => {
                let queued = soft.queued.remove(&req.session).unwrap_or_default();
                if !queued.is_empty() {
                    reply_to(server, &request, &Ok(Reply::Events(queued)));
                } else if let Some(h) = held(request)
                    && let Some(old) = soft.events.insert(req.session, h)
                {
                    old.answer(&Ok(Reply::Events(Vec::new())));
                }
            }
        }
        self.deliver(&mut soft);
    }
}
