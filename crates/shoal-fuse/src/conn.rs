//! A mount's connection to the metadata service: one session, shared by
//! the FUSE threads (its calls are serialized, so request numbers grow in
//! the order the primary sees them, as exactly-once needs), inode numbers
//! handed out in ranges, the opens this mount has of each inode and which
//! of them the primary knows (a recall's answer reports them; a close is
//! sent only for those), the cache state (`cache`), the kernel's
//! notifier, and the queue of callbacks to carry out (`callbacks`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};
use shoal_bulletsvc::FileClient;
use shoal_cap::Capability;
use shoal_fs::model::{Attr, FsError, Identity, Ino, Kind};
use shoal_fs::op::{Failure, Grant, LockHow, Op, Reply, StatFs};
use shoal_fs::tokens::{Level, OpenId, Want};
use shoal_fs::update::{Answer, UpdateOp};
use shoal_fssvc::FsClient;
use shoal_fssvc::store::{Changes, Version};
use shoal_rpc::Context;
use shoal_time::Time;

use crate::callbacks::{Kernel, Work};
use crate::locks::MountLocks;
use crate::private::Routed;
use shoal_fs::cache::opens::OpenTable;
use shoal_fs::cache::{Cache, Open, Stamp};

/// Inode numbers asked for at a time (private directories make inodes
/// without a message: one range lasts a long while).
const RANGE: u32 = 1 << 16;

/// The most copies of a write-back stored at once, each by a thread of
/// its own.
const STORE_LANES: usize = 4;

/// How long an `fsync` (or anything else waiting for a write-back)
/// waits before it fails with `EIO`.
const FLUSH_WAIT: Duration = Duration::from_secs(120);

/// The session and what the mount knows of its own opens.
pub(crate) struct Conn {
    client: Mutex<FsClient>,
    session: u64,
    pub(crate) ctx: Context,
    /// The file system's name.
    pub(crate) name: String,
    pub(crate) node: String,
    /// The private directories (`private`).
    pub(crate) privates: crate::private::Privates,
    pub(crate) cache: Mutex<Cache>,
    pub(crate) kernel: Kernel,
    work: Mutex<Option<Sender<Work>>>,
    /// File service clients for reads of cached files, one per thread
    /// reading at a time.
    files: Mutex<Vec<FileClient>>,
    /// The write-backs in flight, and the clients of those made on the
    /// thread that asks.
    pub(crate) write_backs: crate::writeback::WriteBacks,
    /// The file servers contents are written to, and how many copies.
    servers: Mutex<(Vec<Capability>, usize)>,
    /// Inode numbers handed to this mount and not yet used: next, end.
    range: Mutex<(Ino, Ino)>,
    /// This mount's opens, and which the primary knows.
    opens: Mutex<OpenTable>,
    /// Inodes the primary forgot while this mount had them open.
    gone: Mutex<FxHashSet<Ino>>,
    /// The advisory locks this mount's programs hold and wait for.
    pub(crate) locks: MountLocks,
    /// How many times the session was started again.
    hellos: AtomicU64,
    /// When the lease was last renewed.
    pub(crate) lease: LeaseClock,
    pub(crate) tuning: crate::Tuning,
    /// The primary's last `statfs` figures and when they came: kept a
    /// second (`STATFS_KEPT`).
    statfs: Mutex<Option<(Instant, StatFs)>>,
}

/// How long the mount answers `statfs` with the figures it has.
const STATFS_KEPT: Duration = Duration::from_secs(1);

/// When the mount's lease was last renewed, as the mount sees it: the
/// moment it *sent* the last request the primary answered that renews it
/// (an `Events` poll, or a hello), so its view of the lease ends before
/// the primary's.
pub(crate) struct LeaseClock {
    start: Instant,
    /// µs since `start` (a [`Time`]'s); 0 before the first renewal.
    renewed_at: AtomicU64,
}

impl LeaseClock {
    fn new() -> LeaseClock {
        LeaseClock {
            start: Instant::now(),
            renewed_at: AtomicU64::new(0),
        }
    }

    /// Now: the time since the clock started.
    pub(crate) fn now(&self) -> Time {
        Time::ZERO + self.start.elapsed()
    }

    /// A renewal sent at `sent` (a [`LeaseClock::now`]) was answered.
    pub(crate) fn renewed(&self, sent: Time) {
        self.renewed_at.fetch_max(sent.0.max(1), Ordering::Relaxed);
    }

    /// Whether the last renewal was sent more than `age` ago.
    pub(crate) fn older_than(&self, age: Duration) -> bool {
        let renewed = self.renewed_at.load(Ordering::Relaxed);
        renewed != 0 && self.now().saturating_since(Time(renewed)) > age
    }
}

impl Conn {
    /// A session with file system `name`, said hello to.
    pub(crate) fn open(
        ctx: &Context,
        name: &str,
        node: &str,
        tuning: crate::Tuning,
    ) -> Result<Conn, Failure> {
        let mut client = FsClient::new(ctx, name)?;
        let hello = client.hello(node)?;
        Ok(Conn {
            session: client.session(),
            client: Mutex::new(client),
            ctx: ctx.clone(),
            name: name.to_string(),
            node: node.to_string(),
            privates: Default::default(),
            cache: Mutex::new(Cache::default()),
            kernel: Kernel::default(),
            work: Mutex::new(None),
            files: Mutex::new(Vec::new()),
            write_backs: Default::default(),
            servers: Mutex::new((hello.servers, hello.copies)),
            range: Mutex::new((Ino(0), Ino(0))),
            opens: Mutex::new(OpenTable::default()),
            gone: Mutex::new(FxHashSet::default()),
            locks: MountLocks::default(),
            hellos: AtomicU64::new(0),
            lease: LeaseClock::new(),
            tuning,
            statfs: Mutex::new(None),
        })
    }

    /// The file system's figures: the primary's, asked at most once a
    /// second (`docs/fs.md`, "Messages per operation").
    pub(crate) fn statfs(&self, who: &Identity) -> Result<StatFs, Failure> {
        if let Some((at, s)) = *self.statfs.lock()
            && at.elapsed() < STATFS_KEPT
        {
            return Ok(s);
        }
        let asked = Instant::now();
        match self.call(who, Op::StatFs)? {
            Reply::StatFs(s) => {
                *self.statfs.lock() = Some((asked, s));
                Ok(s)
            }
            other => Err(shoal_fssvc::client::unexpected(&other)),
        }
    }

    /// The session's number (it stays the same through hellos).
    pub(crate) fn session(&self) -> u64 {
        self.session
    }

    /// One call as `who`; a session the primary no longer knows (its lease
    /// ended, or the primary changed) says hello again and the call is
    /// made once more.
    pub(crate) fn call(&self, who: &Identity, op: Op) -> Result<Reply, Failure> {
        let mut c = self.client.lock();
        match c.call(who, op.clone()) {
            Err(Failure::NoSession) => {
                self.again(&mut c)?;
                c.call(who, op)
            }
            other => other,
        }
    }

    /// How many times the session was started again so far: a caller
    /// outside the session's lock notes it before a call, and passes it to
    /// [`Conn::recover`] if the call finds the session unknown.
    pub(crate) fn hellos(&self) -> u64 {
        self.hellos.load(Ordering::SeqCst)
    }

    /// Starts the session again after the primary forgot it (its lease
    /// ended, or the primary changed), unless that was done since `seen`
    /// ([`Conn::hellos`]): hello, then reclaim every open of this mount,
    /// so the new primary knows who has each file open.  Twice would give
    /// up tokens the new primary granted in between, whose recalls would
    /// then never be answered.
    ///
    /// It waits for the session's client without blocking behind another
    /// thread's long call (one held in a new primary's grace period, say):
    /// that thread's call says hello itself if the session is unknown, and
    /// the events thread, which calls this, must go on renewing the lease.
    pub(crate) fn recover(&self, seen: u64) -> Result<(), Failure> {
        loop {
            if self.hellos() != seen {
                return Ok(());
            }
            if let Some(mut c) = self.client.try_lock_for(Duration::from_millis(100)) {
                if self.hellos() != seen {
                    return Ok(());
                }
                return self.again(&mut c);
            }
        }
    }

    /// Says hello again and reclaims, in the new primary's grace period,
    /// every open of this mount and the `Write` token of every file with
    /// changes not yet written back, at the version they were made over
    /// (Sprite's reopen): so no other mount changes such a file before
    /// they are written back.  Every other token is given up, and what the
    /// kernel keeps under it dropped.
    fn again(&self, c: &mut FsClient) -> Result<(), Failure> {
        tracing::info!("the metadata service forgot this mount's session: hello again");
        let dirty: HashMap<Ino, u64> = self.cache.lock().dirty_versions().into_iter().collect();
        // The private inodes the primary knows, reclaimed at `Write` as
        // dirty files are: the private directories stay private if every
        // one comes back (a new primary, in its grace period), and are
        // lost with their pending changes otherwise.
        let (private, fresh) = self.private_inodes();
        self.drop_kernel();
        let sent = self.lease.now();
        let hello = c.hello(&self.node)?;
        self.lease.renewed(sent);
        self.hellos.fetch_add(1, Ordering::SeqCst);
        *self.servers.lock() = (hello.servers, hello.copies);
        let mut reclaims: FxHashMap<Ino, Vec<(OpenId, bool)>> = self.opens.lock().all();
        for ino in dirty.keys().chain(private.keys()) {
            reclaims.entry(*ino).or_default();
        }
        let mut private_lost = false;
        (self.opens.lock()).learn(reclaims.values().flat_map(|o| o.iter().map(|(id, _)| *id)));
        for (ino, opens) in reclaims {
            let version = dirty.get(&ino).or(private.get(&ino)).copied();
            let op = Op::Reclaim {
                ino,
                level: if version.is_some() {
                    Level::Write
                } else {
                    Level::None
                },
                version,
                opens,
            };
            match c.call(&Identity::root(), op) {
                Ok(Reply::Entry { attr, grant }) if grant.level == Level::Write => {
                    self.cache.lock().reclaimed(&attr, &grant);
                    self.settle();
                }
                // Made since the last push, and the push did not reach
                // the old primary: the push makes it.
                Err(Failure::Fs(FsError::NotFound)) if fresh.contains(&ino) => {}
                Ok(_) | Err(Failure::Fs(_)) if private.contains_key(&ino) => private_lost = true,
                Ok(_) => {
                    if version.is_some() {
                        tracing::warn!(
                            "file {ino}: the new primary did not give its Write token back; \
                             its changes will be written back if the file did not change"
                        );
                    }
                }
                Err(Failure::Fs(_)) => {}
                Err(e) => return Err(e),
            }
        }
        if private_lost {
            self.lose_private();
        } else {
            self.private_rehold(&fresh);
        }
        for (ino, lock) in self.locks.held() {
            // A private inode's locks are the mount's own.
            if self.is_private(ino) {
                continue;
            }
            let op = crate::locks::asking(ino, &lock, LockHow::Reclaim);
            match c.call(&Identity::root(), op) {
                Ok(Reply::Locked(None)) => {}
                Ok(_) | Err(Failure::Fs(_)) => {
                    tracing::warn!(
                        "a lock on inode {ino} of process {} is lost: the new primary would not give it back",
                        lock.pid
                    );
                    self.locks.lost(ino, &lock);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// A change to the tree; its answer, or the tree's refusal.
    pub(crate) fn change(&self, who: &Identity, op: UpdateOp) -> Result<Answer, Failure> {
        self.changed(who, Op::Change { op, durable: false })
            .map(|c| c.answer)
    }

    /// Sends a change (or a create-and-open): its answer, the grant of
    /// its open (or of the directory it made), if any, and that
    /// directory's secret.  The directories whose names it changed get the
    /// attributes it left them, which this mount may then give the kernel
    /// without asking while it holds them ([`Cache::dirs_changed`]).
    fn changed(&self, who: &Identity, op: Op) -> Result<Changed, Failure> {
        let names = match &op {
            Op::Change { op, .. } | Op::CreateOpen { op, .. } => {
                // Whatever it touches must be the primary's to change.
                self.unprivate(&crate::private::named(op))?;
                Names::of(op)
            }
            _ => Names::default(),
        };
        // A name it makes is no longer known to be absent, from before the
        // request leaves.
        if let Some((dir, name)) = names.made {
            self.cache.lock().making(dir, name);
        }
        // The directories' attributes in the answer are as the change left
        // them; a notice of a later change may come first (the answer waits
        // for other mounts' confirmations): they are kept only if the
        // counts moved by this change's own two steps alone.
        let expected: Vec<(Ino, Stamp)> = names
            .dirs
            .iter()
            .map(|&dir| {
                let (all, own) = self.cache.lock().stamp(dir);
                match names.only_dir {
                    Some(d) if d == dir => (dir, (all, own + 2)),
                    Some(_) => (dir, (all, own)),
                    None => (dir, (all + 2, own)),
                }
            })
            .collect();
        // Counted before and after: attributes asked for meanwhile may
        // miss the change (`Cache::attr_held`).  A create changes only its
        // directory's.
        let only_dir = names.only_dir;
        let count = || match only_dir {
            Some(dir) => self.cache.lock().count_dir(dir),
            None => self.cache.lock().count_change(),
        };
        count();
        let answer = self.call(who, op);
        count();
        match answer? {
            Reply::Updated(result) => Ok(Changed {
                answer: result.map_err(Failure::Fs)?,
                grant: None,
                secret: None,
            }),
            Reply::Changed {
                result,
                dirs,
                opened,
                secret,
            } => {
                self.cache.lock().dirs_changed(&dirs, &expected);
                Ok(Changed {
                    answer: result.map_err(Failure::Fs)?,
                    grant: opened,
                    secret,
                })
            }
            other => Err(shoal_fssvc::client::unexpected(&other)),
        }
    }

    /// Creates a regular file as `who` (`op`, a create made by
    /// [`Conn::create_op`]) and opens it (open `id`, for `want`) in the
    /// same request: its attributes, and the open's grant (`None`: the
    /// caller opens it with its own request).
    pub(crate) fn create_open(
        &self,
        who: &Identity,
        op: UpdateOp,
        id: OpenId,
        want: Want,
    ) -> Result<(Attr, Option<Grant>), Failure> {
        let op = Op::CreateOpen { op, id, want };
        match self.changed(who, op)? {
            Changed {
                answer: Answer::Entry { attr, .. },
                grant,
                ..
            } => Ok((attr, grant)),
            other => Err(Failure::Unavailable(format!(
                "unexpected answer {:?}",
                other.answer
            ))),
        }
    }

    /// A create of `name` in `parent`, with a fresh inode number and
    /// capability secret (the primary draws its own for what it creates:
    /// this one is kept only where the inode stays private).
    pub(crate) fn create_op(
        &self,
        parent: Ino,
        name: &[u8],
        (kind, perm, rdev): (Kind, u32, u32),
        target: &[u8],
    ) -> Result<UpdateOp, Failure> {
        Ok(UpdateOp::Create {
            parent,
            name: name.to_vec(),
            kind,
            perm: (perm & 0o7777) as u16,
            rdev,
            ino: self.new_ino()?,
            secret: rand::random(),
            target: target.to_vec(),
            excl: true,
        })
    }

    /// Makes a new inode named `name` in `parent` as `who`: a `kind`
    /// with permissions `perm` (and device `rdev`), or a symbolic link to
    /// `target`; its attributes.
    pub(crate) fn make(
        &self,
        who: &Identity,
        parent: Ino,
        name: &[u8],
        kind: (Kind, u32, u32),
        target: &[u8],
    ) -> Result<Attr, Failure> {
        let op = self.create_op(parent, name, kind, target)?;
        let op = match self.private_change(who, op)? {
            Routed::Local(answer) => return entry(answer.map_err(Failure::Fs)?),
            Routed::Shared(op) => op,
        };
        let made = self.changed(who, Op::Change { op, durable: false })?;
        let attr = entry(made.answer)?;
        // A directory made comes with `Write` on it, and the secret the
        // primary drew for it: private.
        if let (Some(grant), Some(secret)) = (made.grant, made.secret)
            && attr.kind == Kind::Dir
            && grant.level == Level::Write
        {
            self.adopt(&attr, secret, parent, &grant);
        }
        Ok(attr)
    }

    /// A fresh inode number for a new inode.
    pub(crate) fn new_ino(&self) -> Result<Ino, Failure> {
        let mut r = self.range.lock();
        if r.0 >= r.1 {
            match self.change(&Identity::root(), UpdateOp::Range { count: RANGE })? {
                Answer::Range { first, count } => *r = (first, first.plus(u64::from(count))),
                other => {
                    return Err(Failure::Unavailable(format!(
                        "unexpected answer to a range: {other:?}"
                    )));
                }
            }
        }
        Ok(r.0.take())
    }

    /// Numbers a new open of `ino` (not yet recorded).
    pub(crate) fn next_open(&self) -> OpenId {
        self.opens.lock().number()
    }

    /// This mount's opens of `ino`.
    pub(crate) fn opens_of(&self, ino: Ino) -> Vec<(OpenId, bool)> {
        self.opens.lock().of(ino)
    }

    /// Whether `ino` is open on this mount.
    pub(crate) fn is_open(&self, ino: Ino) -> bool {
        self.opens.lock().is_open(ino)
    }

    pub(crate) fn record_open(&self, ino: Ino, id: OpenId, write: bool) {
        self.opens.lock().record(ino, id, write);
    }

    /// Forgets open `id` of `ino`; whether the primary knows it (then its
    /// close is sent).
    pub(crate) fn forget_open(&self, ino: Ino, id: OpenId) -> bool {
        self.opens.lock().forget(ino, id)
    }

    /// Whether the mount has opens the primary does not know of (opens
    /// for reading under a token): an unlink then lets the primary keep
    /// the inode it takes the last name of, and recall it to learn them.
    /// Opens of private inodes do not count: no name outside the private
    /// directories leads to them.
    pub(crate) fn opens_unknown(&self) -> bool {
        let unknown = self.opens.lock().unknown();
        unknown.into_iter().any(|ino| !self.is_private(ino))
    }

    /// The primary forgot `ino` with the last name this mount removed
    /// (this mount was the only one holding it): its token and unwritten
    /// changes go, now or, if it was opened meanwhile, at its last close.
    pub(crate) fn gone(&self, ino: Ino) {
        if !self.is_open(ino) {
            self.cache.lock().forget(ino);
        } else {
            self.gone.lock().insert(ino);
        }
    }

    /// An open of `ino` closed: if it was the last of an inode gone
    /// ([`Conn::gone`]), the inode goes from the cache.
    pub(crate) fn gone_closed(&self, ino: Ino) {
        if !self.is_open(ino) && self.gone.lock().remove(&ino) {
            self.cache.lock().forget(ino);
        }
    }

    /// The opens of `ino` a recall's answer reports: the primary knows
    /// them from then on.
    pub(crate) fn report(&self, ino: Ino) -> Vec<(OpenId, bool)> {
        self.opens.lock().report(ino)
    }

    /// The primary learned the opens `listed` of `ino` (an uncached
    /// open's answer): those still open are known from then on; returns
    /// those closed meanwhile, whose closes must be sent now.
    pub(crate) fn learned(&self, ino: Ino, listed: &[(OpenId, bool)]) -> Vec<OpenId> {
        self.opens.lock().learned(ino, listed)
    }

    /// The primary learned a new open (an uncached open's answer).
    pub(crate) fn learn_new(&self, id: OpenId) {
        self.opens.lock().learn([id]);
    }

    /// Where the callbacks go.
    pub(crate) fn set_work(&self, tx: Sender<Work>) {
        *self.work.lock() = Some(tx);
    }

    pub(crate) fn post(&self, w: Work) {
        if let Some(tx) = self.work.lock().as_ref() {
            let _ = tx.send(w);
        }
    }

    /// Recalls that were waiting for a grant just seen.
    pub(crate) fn settle(&self) {
        let ready = self.cache.lock().ready();
        for (ino, to, grant) in ready {
            self.post(Work::Recall { ino, to, grant });
        }
    }

    /// Stores a file's new version on the file servers the hello named
    /// (`shoal_fssvc::store`).
    pub(crate) fn store(
        &self,
        ino: Ino,
        changes: &Changes<'_>,
        safety: bool,
    ) -> Result<Version, Failure> {
        let (servers, copies) = self.servers.lock().clone();
        // A client for each copy (up to `STORE_LANES`), so that they are
        // written at once.
        let lanes = copies.clamp(1, STORE_LANES);
        let mut clients = Vec::with_capacity(lanes);
        while clients.len() < lanes {
            match self.file_client() {
                Ok(c) => clients.push(c),
                Err(e) => {
                    self.files.lock().extend(clients);
                    return Err(e);
                }
            }
        }
        let stored =
            shoal_fssvc::store::store(&mut clients, &servers, copies, ino, changes, safety)
                .map_err(shoal_fssvc::files_failure);
        self.files.lock().extend(clients);
        stored
    }

    /// Writes `ino` back on this thread (`writeback::write_back_here`), or
    /// asks the callbacks thread to write every dirty file back (`None`)
    /// and waits for it.
    pub(crate) fn flush(self: &Arc<Self>, ino: Option<Ino>, safety: bool) -> Result<(), Failure> {
        if let Some(ino) = ino {
            return crate::writeback::write_back_here(self, ino, safety);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        self.post(Work::Flush {
            ino,
            safety,
            done: tx,
        });
        match rx.recv_timeout(FLUSH_WAIT) {
            Ok(r) => r,
            Err(_) => Err(Failure::Unavailable(format!(
                "no write-back within {FLUSH_WAIT:?}"
            ))),
        }
    }

    /// An answer granted `grant` on `attr`'s inode: the attribute timeout
    /// the kernel gets.
    pub(crate) fn granted(&self, attr: &Attr, grant: &Grant) -> Duration {
        let ttl = self.cache.lock().install(attr, grant);
        self.settle();
        ttl
    }

    /// An answer granted `grant` on `ino` without its attributes (a
    /// listing): the grant is seen (a recall of it is carried out), and
    /// the token is kept at the level the mount knew.
    pub(crate) fn saw(&self, ino: Ino, grant: &Grant) {
        self.cache.lock().saw(ino, grant.grant);
        self.settle();
    }

    /// An open's answer.
    pub(crate) fn opened(&self, attr: &Attr, grant: &Grant, content: Vec<Capability>) -> Open {
        let open = self.cache.lock().opened(attr, grant, content);
        self.settle();
        open
    }

    /// Every token is gone (a new session, or the lease ran out): the
    /// kernel forgets what they covered.
    pub(crate) fn drop_caches(&self) {
        self.lose_private();
        self.drop_kernel();
    }

    /// Every token is gone: the kernel forgets what they covered.
    fn drop_kernel(&self) {
        let (inodes, names) = self.cache.lock().drop_all();
        let names: Vec<(Ino, Vec<u8>)> = names
            .into_iter()
            .flat_map(|(d, list)| list.into_iter().map(move |n| (d, n)))
            .collect();
        let inodes: Vec<(Ino, i64, i64)> = inodes.into_iter().map(|i| (i, 0, 0)).collect();
        if !inodes.is_empty() || !names.is_empty() {
            self.post(Work::Inval { inodes, names });
        }
    }

    /// A file service client for a while.
    pub(crate) fn with_files<T>(
        &self,
        f: impl FnOnce(&mut FileClient) -> Result<T, shoal_bulletsvc::ClientError>,
    ) -> Result<T, Failure> {
        let mut client = self.file_client()?;
        let out = f(&mut client).map_err(shoal_fssvc::files_failure);
        self.files.lock().push(client);
        out
    }

    /// A file service client from the pool, or a new one; the caller
    /// puts it back.
    fn file_client(&self) -> Result<FileClient, Failure> {
        let taken = self.files.lock().pop();
        match taken {
            Some(c) => Ok(c),
            None => FileClient::new(&self.ctx)
                .map_err(|e| Failure::Unavailable(format!("file client: {e}"))),
        }
    }
}

/// The inode an answer made.
fn entry(answer: Answer) -> Result<Attr, Failure> {
    match answer {
        Answer::Entry { attr, .. } => Ok(attr),
        other => Err(Failure::Unavailable(format!("unexpected answer {other:?}"))),
    }
}

/// The names a change touches, as the mount's caches see them.
#[derive(Default)]
struct Names<'a> {
    /// The directories whose names it changes.
    dirs: Vec<Ino>,
    /// The name it makes, if any.
    made: Option<(Ino, &'a [u8])>,
    /// A create: it changes its directory's attributes alone.
    only_dir: Option<Ino>,
}

impl<'a> Names<'a> {
    fn of(op: &'a UpdateOp) -> Names<'a> {
        match op {
            UpdateOp::Create { parent, name, .. } => Names {
                dirs: vec![*parent],
                made: Some((*parent, name)),
                only_dir: Some(*parent),
            },
            UpdateOp::Link { parent, name, .. } => Names {
                dirs: vec![*parent],
                made: Some((*parent, name)),
                only_dir: None,
            },
            UpdateOp::Unlink { parent, .. } => Names {
                dirs: vec![*parent],
                ..Names::default()
            },
            UpdateOp::Rename {
                from, to, to_name, ..
            } => Names {
                dirs: vec![*from, *to],
                made: Some((*to, to_name)),
                only_dir: None,
            },
            _ => Names::default(),
        }
    }
}

/// What the primary answered a change.
pub(crate) struct Changed {
    pub answer: Answer,
    /// The grant of a create-and-open's open, or `Write` on a directory
    /// made.
    pub grant: Option<Grant>,
    /// The capability secret of a directory made, held with `Write`.
    pub secret: Option<[u8; 16]>,
}
