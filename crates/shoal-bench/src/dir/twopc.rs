//! One replica of the directory service, RPC variant: two replicas kept
//! consistent by two-phase commit (the 1992 paper's baseline, §2).
//!
//! Two replicas, each with its own data directory, serve the same service
//! port, so the unchanged [`shoal_dirsvc::DirClient`] reaches whichever answers.
//! A READ is served locally, once the replica has applied every write the
//! client has seen (else [`DirError::Behind`]).  A WRITE at replica A:
//!
//! ```text
//!  client        A (initiator)                      B (the other)
//!    │ write ──▶ lock; intention ── RPC ──────────▶ lock (or BUSY)
//!    │           (request, its secret filled in)    ACK ─┐ then: intention to
//!    │                                   ◀───────────────┘ disk (fsync), apply,
//!    │           intention to disk (fsync), apply         result to disk (fsync),
//!    │ ◀──────── reply                                    remove intention (fsync),
//!    │           result to disk (fsync),                  unlock
//!    │           remove intention (fsync), unlock
//! ```
//!
//! So every write costs A three disk operations, two of them after the
//! reply but inside the write lock, which the next write waits for (as a
//! single-threaded server of 1992 would), and B the same three.  The
//! intention is the encoded request in the file `intent` (log record
//! format, `shoal_dir::log`); the result is a record appended to the
//! replica's log (`shoal_replicasvc::store`, the group variant's format, snapshots
//! when it grows).  Both replicas apply writes in the initiator's order
//! through [`DirState::apply`], so sessions make retries exactly-once.
//!
//! Writes are serialized by one lock per replica (an operation, own or the
//! peer's, at a time).  When both replicas start a write at once, each
//! holds its lock and asks the other: the lower-numbered replica wins: it
//! answers BUSY at once, and the higher one, on BUSY, lets go of its lock
//! and retries, so the winner's intention gets through.
//!
//! **Failures.**  If the intention RPC fails (the peer is down, cut off, or
//! restarting), A goes on alone ("degraded": it logs so) and breaks the
//! pairing.  A replica that has been left behind — restarted, or refused
//! by a peer that went on alone — serves nothing until it has copied the
//! peer's state: it asks for `encode_snapshot()` by RPC (the peer takes
//! its write lock, so no write is half done, and pairs again), writes it
//! as its snapshot and serves again.  A replica that runs alone asks its
//! peer's status every few hundred milliseconds and tells a peer that
//! still believes in the old pairing to copy its state.  After both
//! replicas restarted, a replica waits until it hears from the other; the
//! one with more writes (ties: the lower number) then serves first and the
//! other copies it — so no replica serves alone a state that may miss an
//! acknowledged write, as in the group variant.  The intention file makes
//! a replica that crashed between intention and result finish the write
//! on recovery.
//!
//! Like the paper's, this variant survives the crash of either replica,
//! not a network partition: two replicas cut off from each other both go
//! on alone, and when they meet again the one with fewer writes (ties: the
//! higher number) loses its solo writes (logged as an error).
//!
//! The peer port (`shoal_dirsvc::peer_port`) carries, one RPC each: an empty
//! request (the status JSON), `1 | pair u64 | index u64 | request` (an
//! intention at state index `index` under pairing `pair`), `2` (copy the
//! state: answer `ACK | pair u64 | snapshot`), `3 | pair u64` (the pairing
//! `pair` is broken: copy the state again).  Answers start with ACK (1),
//! BUSY (2) or REFUSED (3) followed by the refusing replica's phase.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};
use shoal_cap::PutPort;
use shoal_dir::log::{self, LogBuffer, LogRecord};
use shoal_dir::op::FLAG_LINEARIZABLE;
use shoal_dir::{Answer, Applied, DirError, DirState, Op, Request, Response};
use shoal_replicasvc::store::{DiskStats, Store};
use shoal_rpc::{CallOptions, Client, Context, Server};

mod peer;

/// How a two-phase-commit replica runs.
#[derive(Debug, Clone)]
pub struct TwoPcConfig {
    /// The service's name (its ports derive from it and the cluster id).
    pub service: String,
    /// This replica's number: 0 or 1.
    pub replica: usize,
    /// Where the snapshot, the log and the intention live.
    pub data_dir: PathBuf,
    /// Log size that triggers a snapshot.
    pub snapshot_bytes: u64,
    /// RPC server threads for clients.
    pub threads: usize,
    /// How long a read waits for this replica to catch up with the client.
    pub catch_up: Duration,
}

impl TwoPcConfig {
    /// Defaults for replica `replica` (0 or 1), storing in `data_dir`.
    pub fn new(replica: usize, data_dir: PathBuf) -> TwoPcConfig {
        TwoPcConfig {
            service: shoal_dirsvc::DEFAULT_SERVICE.into(),
            replica,
            data_dir,
            snapshot_bytes: 8 << 20,
            threads: 2,
            catch_up: Duration::from_secs(1),
        }
    }
}

/// Where a replica stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Recovered from disk; waiting to hear from the peer.
    Starting = 0,
    /// Copying the peer's state.
    Joining = 1,
    /// Serving; writes go to both replicas.
    Paired = 2,
    /// Serving; the peer is down or left behind (degraded).
    Alone = 3,
}

impl Phase {
    fn from_u8(b: u8) -> Option<Phase> {
        Some(match b {
            0 => Phase::Starting,
            1 => Phase::Joining,
            2 => Phase::Paired,
            3 => Phase::Alone,
            _ => return None,
        })
    }

    fn parse(s: &str) -> Option<Phase> {
        Some(match s {
            "starting" => Phase::Starting,
            "joining" => Phase::Joining,
            "paired" => Phase::Paired,
            "alone" => Phase::Alone,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Joining => "joining",
            Phase::Paired => "paired",
            Phase::Alone => "alone",
        }
    }

    fn serving(self) -> bool {
        matches!(self, Phase::Paired | Phase::Alone)
    }
}

const TAG_INTENT: u8 = 1;
const TAG_JOIN: u8 = 2;
const TAG_UNPAIR: u8 = 3;
const ACK: u8 = 1;
const BUSY: u8 = 2;
const REFUSED: u8 = 3;

/// Longest an intention RPC waits for the peer (its lock wait is shorter).
const INTENT_DEADLINE: Duration = Duration::from_secs(2);
/// Longest the peer waits for its write lock before it answers BUSY.
const LOCK_WAIT: Duration = Duration::from_millis(500);
/// Longest a write keeps retrying a BUSY peer.
const WRITE_WAIT: Duration = Duration::from_secs(10);
/// Peer-port server threads (intentions, state copies, status).
const PEER_THREADS: usize = 2;

/// What the write lock guards: the disk and the peer client.
struct Work {
    store: Store,
    intent: File,
    log: LogBuffer,
    /// Talks to the peer (one call at a time: the lock holder's).
    peer: Client,
    stats: Arc<DiskStats>,
}

impl Work {
    /// Writes the intention to apply `req` at `index` and syncs it.
    fn write_intent(&mut self, index: u64, req: &Request, encoded: &[u8]) -> std::io::Result<()> {
        let mut record = LogBuffer::new();
        record.push(index, req, encoded);
        let mut bytes = log::header(0).to_vec();
        bytes.extend_from_slice(&record.take(false).expect("one record"));
        self.intent.write_all_at(&bytes, 0)?;
        self.intent.sync_data()?;
        self.count(bytes.len());
        Ok(())
    }

    /// Removes the intention (empties the file) and syncs.
    fn remove_intent(&mut self) -> std::io::Result<()> {
        self.intent.set_len(0)?;
        self.intent.sync_data()?;
        self.count(0);
        Ok(())
    }

    fn count(&self, bytes: usize) {
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
    }

    /// Stores the result of an applied write: a log record, synced.
    fn store_result(
        &mut self,
        applied: &Applied,
        req: &Request,
        encoded: &[u8],
    ) -> std::io::Result<()> {
        let Applied::New(r) = applied else {
            return Ok(());
        };
        if r.result.is_ok() {
            self.log.push(r.index, req, encoded);
        } else {
            self.log.note_refused(r.index);
        }
        if let Some(bytes) = self.log.take(true) {
            self.store.append(&bytes, true)?;
        }
        Ok(())
    }
}

struct Shared {
    cfg: TwoPcConfig,
    ctx: Context,
    /// The service's put-port.
    port: PutPort,
    /// The other replica's peer port.
    peer_port: PutPort,
    /// The nodes the service map names as its servers.
    peer_served_by: shoal_rpc::served_by::ServedBy,
    state: RwLock<DirState>,
    /// The index applied, for readers waiting to catch up.
    applied: Mutex<u64>,
    applied_cv: Condvar,
    /// The write lock: one operation (own or the peer's) at a time.
    work: Mutex<Work>,
    /// The lock holder waits for the peer's answer to its intention.
    committing: AtomicBool,
    phase: AtomicU8,
    /// The current pairing (0: none); both replicas hold the same number
    /// while paired.
    pair: AtomicU64,
    disk: Arc<DiskStats>,
    server: shoal_replicasvc::serving::Serving,
    stop: AtomicBool,
    writes: AtomicU64,
    reads: AtomicU64,
    peer_writes: AtomicU64,
    alone_writes: AtomicU64,
    busy: AtomicU64,
}

/// A running replica of the RPC variant.
pub struct TwoPc {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    peer_server: Arc<Server>,
}

fn unavailable(s: &str) -> DirError {
    DirError::Unavailable(s.into())
}

/// A disk failure in the middle of a commit: the replica can no longer
/// keep its promises, so it stops (the peer goes on alone).
fn fatal(what: &str, e: std::io::Error) -> ! {
    tracing::error!("{what} failed: {e}; stopping the replica");
    std::process::abort()
}

impl TwoPc {
    /// Recovers from the data directory (snapshot, log, then an intention
    /// left by a crash) and starts the replica's threads.
    pub fn start(ctx: Context, cfg: TwoPcConfig) -> std::io::Result<TwoPc> {
        if cfg.replica > 1 {
            return Err(std::io::Error::other(format!(
                "replica number {} is not 0 or 1: the RPC variant has two replicas",
                cfg.replica
            )));
        }
        let cluster = ctx.config().cluster;
        let port = shoal_dirsvc::service_port(&cluster, &cfg.service).put_port();
        let (store, rec) = Store::open::<shoal_dir::replica::ReplicaState>(&cfg.data_dir, port)?;
        let mut state = rec.state.state;
        let intent = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(cfg.data_dir.join("intent"))?;
        let stats = store.stats.clone();
        let mut work = Work {
            store,
            intent,
            log: LogBuffer::new(),
            peer: ctx.client().map_err(std::io::Error::other)?,
            stats: stats.clone(),
        };
        // An intention not yet stored as a result: the write was under
        // way; finish it.
        let mut bytes = Vec::new();
        {
            use std::io::Read;
            (&work.intent).read_to_end(&mut bytes)?;
        }
        if let Some(parsed) = log::parse(&bytes) {
            for rec in parsed.records {
                if let LogRecord::Entry { index, request } = rec
                    && index == state.index() + 1
                {
                    let encoded = request.encode();
                    let applied = state.apply(&request);
                    work.store_result(&applied, &request, &encoded)?;
                    tracing::info!("finished the write under way at index {index}");
                }
            }
        }
        if !bytes.is_empty() {
            work.remove_intent()?;
        }
        tracing::info!(
            index = state.index(),
            replayed = rec.replayed,
            cut = rec.cut,
            "recovered from {}",
            cfg.data_dir.display()
        );
        let peer_server = Arc::new(
            ctx.serve(shoal_dirsvc::peer_port(&cluster, &cfg.service, cfg.replica))
                .map_err(std::io::Error::other)?,
        );
        let index = state.index();
        let peer_port = shoal_dirsvc::peer_port(&cluster, &cfg.service, 1 - cfg.replica).put_port();
        let shared = Arc::new(Shared {
            port,
            peer_port,
            peer_served_by: shoal_rpc::served_by::ServedBy::new(&ctx, peer_port),
            state: RwLock::new(state),
            applied: Mutex::new(index),
            applied_cv: Condvar::new(),
            work: Mutex::new(work),
            committing: AtomicBool::new(false),
            phase: AtomicU8::new(Phase::Starting as u8),
            pair: AtomicU64::new(0),
            disk: stats,
            server: Default::default(),
            stop: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            peer_writes: AtomicU64::new(0),
            alone_writes: AtomicU64::new(0),
            busy: AtomicU64::new(0),
            cfg,
            ctx,
        });
        let mut threads = Vec::new();
        for i in 0..PEER_THREADS {
            let (s, p) = (shared.clone(), peer_server.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("dir2pc-peer-{i}"))
                    .spawn(move || s.serve_peer(&p))
                    .expect("spawn a replica thread"),
            );
        }
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("dir2pc-control".into())
                .spawn(move || s.control())
                .expect("spawn a replica thread"),
        );
        Ok(TwoPc {
            shared,
            threads,
            peer_server,
        })
    }

    /// The service's port.
    pub fn port(&self) -> PutPort {
        self.shared.port
    }

    /// The replica's status as JSON.
    pub fn status(&self) -> serde_json::Value {
        self.shared.status()
    }

    /// Whether the replica serves clients (paired, or alone).
    pub fn is_serving(&self) -> bool {
        self.shared.phase().serving()
    }

    /// Serves one request here, as if it had come by RPC (for tests and
    /// tools that must aim at one replica).
    pub fn execute(&self, req: Request) -> Response {
        let mut out = None;
        self.shared.handle(req, &mut |r| out = Some(r));
        out.expect("every request is answered")
    }

    /// Stops serving and stops the threads (the disk holds every write
    /// this replica applied).
    pub fn stop(mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.stop_serving();
        let _ = self.peer_server.shutdown();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Acquire)).expect("valid phase")
    }

    fn set_phase(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Release);
    }

    fn peer_number(&self) -> usize {
        1 - self.cfg.replica
    }

    fn status(&self) -> serde_json::Value {
        let (index, dirs, rows) = {
            let st = self.state.read();
            (st.index(), st.dir_count(), st.row_count())
        };
        serde_json::json!({
            "service": self.cfg.service,
            "port": self.port.to_string(),
            "variant": "rpc2pc",
            "replica": self.cfg.replica,
            "replicas": 2,
            "phase": self.phase().name(),
            "pair": self.pair.load(Ordering::Acquire),
            "index": index,
            "directories": dirs,
            "rows": rows,
            "writes": self.writes.load(Ordering::Relaxed),
            "reads": self.reads.load(Ordering::Relaxed),
            "peer_writes": self.peer_writes.load(Ordering::Relaxed),
            "alone_writes": self.alone_writes.load(Ordering::Relaxed),
            "busy_retries": self.busy.load(Ordering::Relaxed),
            "cancelled_pairs": 0,
            "disk": self.disk.json(),
        })
    }

    /// Applies a write (under the write lock) and wakes waiting readers.
    fn apply(&self, req: &Request) -> Applied {
        let applied = self.state.write().apply(req);
        let index = applied.response().index;
        let mut a = self.applied.lock();
        *a = (*a).max(index);
        drop(a);
        self.applied_cv.notify_all();
        applied
    }

    /// Phase 2 at either replica: intention to disk, apply.
    fn commit(&self, w: &mut Work, req: &Request, encoded: &[u8]) -> Applied {
        let index = self.state.read().index() + 1;
        if let Err(e) = w.write_intent(index, req, encoded) {
            fatal("writing the intention", e);
        }
        self.apply(req)
    }

    /// After the reply: the result to disk, the intention removed.
    fn finish(&self, w: &mut Work, applied: &Applied, req: &Request, encoded: &[u8]) {
        if let Err(e) = w.store_result(applied, req, encoded) {
            fatal("storing the result", e);
        }
        if let Err(e) = w.remove_intent() {
            fatal("removing the intention", e);
        }
        if w.store.log_len() > self.cfg.snapshot_bytes
            && let Err(e) = self.snapshot(w)
        {
            tracing::error!("snapshot failed: {e}");
        }
    }

    fn snapshot(&self, w: &mut Work) -> std::io::Result<()> {
        let (index, bytes) = {
            let st = self.state.read();
            (st.index(), st.encode_snapshot())
        };
        w.store.rotate(index)?;
        w.store.snapshots().write(index, &bytes)?;
        tracing::info!("snapshot at index {index}: {} bytes", bytes.len());
        Ok(())
    }

    fn go_alone(&self, why: &str) {
        if self.phase() == Phase::Paired {
            tracing::warn!(
                "the peer (replica {}) is unreachable ({why}): running degraded, alone; it copies this replica's state when it is back",
                self.peer_number()
            );
            self.pair.store(0, Ordering::Release);
            self.set_phase(Phase::Alone);
        }
    }

    // ---- serving clients ------------------------------------------------

    /// Answers one client request through `reply`; a write replies before
    /// its post-reply disk work, which it does before returning.
    fn handle(&self, req: Request, reply: &mut dyn FnMut(Response)) {
        let index = || self.state.read().index();
        if matches!(req.op, Op::Status) {
            reply(Response {
                index: index(),
                result: Ok(Answer::Status(self.status().to_string())),
            });
        } else if req.op.is_write() {
            self.writes.fetch_add(1, Ordering::Relaxed);
            self.write(req, reply);
        } else {
            self.reads.fetch_add(1, Ordering::Relaxed);
            let r = self.read(&req).unwrap_or_else(|e| Response {
                index: index(),
                result: Err(e),
            });
            reply(r);
        }
    }

    fn read(&self, req: &Request) -> Result<Response, DirError> {
        if !self.phase().serving() {
            return Err(unavailable("replica is catching up with its peer"));
        }
        // Linearizable: a completed write was acknowledged by this replica
        // under its write lock, which it holds until the write is applied.
        let _lock = (req.flags & FLAG_LINEARIZABLE != 0).then(|| self.work.lock());
        if self.state.read().index() < req.min_index {
            let deadline = Instant::now() + self.cfg.catch_up;
            let mut a = self.applied.lock();
            while *a < req.min_index && Instant::now() < deadline {
                self.applied_cv.wait_until(&mut a, deadline);
            }
        }
        let st = self.state.read();
        if st.index() < req.min_index {
            return Err(DirError::Behind {
                have: st.index(),
                want: req.min_index,
            });
        }
        Ok(Response {
            index: st.index(),
            result: st.read(&req.op),
        })
    }

    fn write(&self, mut req: Request, reply: &mut dyn FnMut(Response)) {
        let refuse = |e: DirError| Response {
            index: self.state.read().index(),
            result: Err(e),
        };
        if req.client == 0 {
            return reply(refuse(DirError::BadRequest(
                "writes need a client id".into(),
            )));
        }
        if let Op::CreateDir { secret, .. } = &mut req.op {
            *secret = rand::random();
        }
        let encoded = req.encode();
        let mut w = match self.prepare(&encoded) {
            Ok(w) => w,
            Err(e) => return reply(refuse(e)),
        };
        let applied = self.commit(&mut w, &req, &encoded);
        reply(applied.response().clone());
        self.finish(&mut w, &applied, &req, &encoded);
    }

    /// Phase 1 at the initiator: takes the write lock and gets the peer's
    /// acknowledgement of the intention (or finds the peer gone, and goes
    /// on alone).  Returns holding the lock.
    fn prepare(&self, encoded: &[u8]) -> Result<MutexGuard<'_, Work>, DirError> {
        let deadline = Instant::now() + WRITE_WAIT;
        let mut w = self.work.lock();
        loop {
            match self.phase() {
                Phase::Alone => {
                    self.alone_writes.fetch_add(1, Ordering::Relaxed);
                    return Ok(w);
                }
                Phase::Paired => {}
                Phase::Starting | Phase::Joining => {
                    return Err(unavailable("replica is catching up with its peer"));
                }
            }
            let index = self.state.read().index();
            let mut msg = Vec::with_capacity(17 + encoded.len());
            msg.push(TAG_INTENT);
            msg.extend_from_slice(&self.pair.load(Ordering::Acquire).to_le_bytes());
            msg.extend_from_slice(&index.to_le_bytes());
            msg.extend_from_slice(encoded);
            let opts = CallOptions {
                deadline: Some(INTENT_DEADLINE),
                cancel: None,
            };
            self.committing.store(true, Ordering::Release);
            let answer = w.peer.trans_with(&self.peer_port, msg, &opts);
            self.committing.store(false, Ordering::Release);
            let answer = match answer {
                Ok(a) => a,
                Err(e) => {
                    w.peer.forget(&self.peer_port);
                    self.go_alone(&e.to_string());
                    continue;
                }
            };
            match answer.first().copied() {
                Some(ACK) => return Ok(w),
                Some(BUSY) => {
                    self.busy.fetch_add(1, Ordering::Relaxed);
                    if Instant::now() > deadline {
                        return Err(unavailable("the peer stayed busy"));
                    }
                    if self.cfg.replica == 0 {
                        // The peer yields to replica 0: keep the lock.
                        std::thread::sleep(Duration::from_micros(50));
                    } else {
                        // Yield: let the peer's intention through.
                        drop(w);
                        let us = 100 + rand::random::<u64>() % 900;
                        std::thread::sleep(Duration::from_micros(us));
                        w = self.work.lock();
                    }
                }
                Some(REFUSED) => {
                    let theirs = answer.get(1).copied().and_then(Phase::from_u8);
                    if theirs.is_some_and(Phase::serving) {
                        // The peer went on without this replica: its state
                        // may be newer.  Copy it before serving again.
                        tracing::warn!(
                            "the peer (replica {}) is {} without this replica: copying its state",
                            self.peer_number(),
                            theirs.map_or("?", Phase::name)
                        );
                        self.pair.store(0, Ordering::Release);
                        self.set_phase(Phase::Joining);
                        return Err(unavailable("replica fell behind its peer; catching up"));
                    }
                    self.go_alone("it is restarting");
                }
                _ => self.go_alone("undecodable answer"),
            }
        }
    }

    fn serve_clients(&self, server: &Server) {
        loop {
            let Ok(request) = server.getreq() else { return };
            match Request::decode(request.body()) {
                Ok(req) => self.handle(req, &mut |r| {
                    let _ = server.putrep(&request, r.encode());
                }),
                Err(e) => {
                    let r = Response {
                        index: self.state.read().index(),
                        result: Err(DirError::BadRequest(e.to_string())),
                    };
                    let _ = server.putrep(&request, r.encode());
                }
            }
        }
    }

    fn start_serving(self: &Arc<Self>) -> Result<(), shoal_rpc::Error> {
        let cluster = self.ctx.config().cluster;
        let me = self.clone();
        self.server.start(
            &self.ctx,
            shoal_dirsvc::service_port(&cluster, &self.cfg.service),
            self.cfg.threads,
            "dir2pc-serve",
            || self.stop.load(Ordering::SeqCst),
            move |srv| me.serve_clients(srv),
        )
    }

    fn stop_serving(&self) {
        self.server.stop();
    }
}
