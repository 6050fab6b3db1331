//! One replica of the directory service, group variant.
//!
//! Replicas form a process group (`shoal_rpc::group`) with resilience r.
//! A write arrives by RPC at any replica, which sends it to the group; every
//! replica applies the group's messages in order to its `DirState` and
//! logs them; the replica that sent the write answers the client once it
//! has applied it and — in the `fsync` mode — once its log holds it on
//! disk.  Reads are served by the replica the client reaches, once that
//! replica has applied every write the client has seen; a linearizable
//! read first sends an ordered no-op through the group and waits for it.
//!
//! Threads: `threads` RPC server threads serve clients; the thread that
//! waits for its own write reads the group's deliveries itself (no
//! hand-over on the latency path); a background thread applies deliveries
//! when no request is waiting; a flusher writes the log (at once in the
//! `fsync` mode, every flush interval in the `replicated` mode) and takes
//! snapshots; a control thread forms, joins and re-forms the group.
//!
//! Forming: a replica that is not in the group asks its peers.  If one is
//! in a group, it joins (and gets the state by state transfer).  If none
//! is, and every replica answered, the one with the most updates (ties:
//! the lowest number) creates the next generation's group from its state
//! and the others join it: after a total failure no replica starts alone
//! with a state that may miss an update another replica acknowledged.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use shoal_cap::PutPort;
use shoal_dir::log::LogBuffer;
use shoal_dir::op::FLAG_LINEARIZABLE;
use shoal_dir::{Answer, Applied, DirError, DirState, Op, Request, Response};
use shoal_rpc::group::{Delivery, Group, GroupError, GroupOptions};
use shoal_rpc::{CallOptions, Context, Server};

use crate::store::{DiskStats, Store};

/// When a replica's log reaches the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Each replica appends the update to its log and fsyncs it; the replica
    /// that answers does so before it answers.  Losing every replica at
    /// once loses no acknowledged update.
    Fsync,
    /// The update is acknowledged once r + 1 replicas hold it in memory;
    /// logs are flushed in the background.  Survives any r simultaneous
    /// crashes, not the loss of every replica at once.
    Replicated,
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fsync" => Ok(Durability::Fsync),
            "replicated" => Ok(Durability::Replicated),
            _ => Err(format!("unknown durability {s:?}: use fsync or replicated")),
        }
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Durability::Fsync => "fsync",
            Durability::Replicated => "replicated",
        })
    }
}

/// How a replica runs.
#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    /// The service's name (its port derives from it and the cluster key).
    pub service: String,
    /// This replica's number, 0..replicas.
    pub replica: usize,
    /// How many replicas the service has.
    pub replicas: usize,
    /// Resilience degree r of the group (default replicas − 1).
    pub resilience: Option<usize>,
    pub durability: Durability,
    /// Where the snapshot and logs live.
    pub data_dir: PathBuf,
    /// How often the `replicated` mode flushes its log.
    pub flush_interval: Duration,
    /// Log size that triggers a snapshot.
    pub snapshot_bytes: u64,
    /// RPC server threads.
    pub threads: usize,
    /// How long a read waits for this replica to catch up with the client.
    pub catch_up: Duration,
}

impl ReplicaConfig {
    /// Defaults for replica `replica` of `replicas`, storing in `data_dir`.
    pub fn new(replica: usize, replicas: usize, data_dir: PathBuf) -> ReplicaConfig {
        ReplicaConfig {
            service: crate::DEFAULT_SERVICE.into(),
            replica,
            replicas,
            resilience: None,
            durability: Durability::Fsync,
            data_dir,
            flush_interval: Duration::from_millis(500),
            snapshot_bytes: 8 << 20,
            threads: 2,
            catch_up: Duration::from_secs(1),
        }
    }

    fn resilience(&self) -> usize {
        self.resilience
            .unwrap_or(self.replicas.saturating_sub(1))
            .min(self.replicas.saturating_sub(1))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not in a group: asking peers.
    Forming,
    /// Joined; waiting for the state transfer.
    Joining,
    /// In the group and serving.
    Member,
    /// In a group that cannot reset (too few members answer).
    Stuck,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Forming => "forming",
            Phase::Joining => "joining",
            Phase::Member => "member",
            Phase::Stuck => "stuck",
        }
    }
}

struct Applying {
    /// Group sequence number applied up to (in the current group).
    seq: u64,
    /// Group instance counter, bumped when the group changes.
    epoch: u64,
}

struct Durable {
    store: Store,
    /// Index up to which the log is on disk.
    index: u64,
}

struct Shared {
    cfg: ReplicaConfig,
    ctx: Context,
    port: PutPort,
    origin: u64,
    state: RwLock<DirState>,
    applying: Mutex<Applying>,
    applied_cv: Condvar,
    results: Mutex<HashMap<u64, Response>>,
    recv: Mutex<()>,
    group: RwLock<Option<Arc<Group>>>,
    phase: Mutex<Phase>,
    generation: AtomicU64,
    buffer: Mutex<LogBuffer>,
    buffer_cv: Condvar,
    durable: Mutex<Durable>,
    durable_cv: Condvar,
    disk: Arc<DiskStats>,
    server: Mutex<Option<(Arc<Server>, Vec<JoinHandle<()>>)>>,
    stop: AtomicBool,
    writes: AtomicU64,
    reads: AtomicU64,
}

/// A running replica.
pub struct Replica {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    _peer: Arc<Server>,
}

fn unavailable(e: impl std::fmt::Display) -> DirError {
    DirError::Unavailable(e.to_string())
}

/// Longest a write waits for its group message to be applied.
const WRITE_WAIT: Duration = Duration::from_secs(10);

impl Replica {
    /// Recovers from the data directory and starts the replica's threads.
    pub fn start(ctx: Context, cfg: ReplicaConfig) -> std::io::Result<Replica> {
        if cfg.replicas == 0 || cfg.replica >= cfg.replicas {
            return Err(std::io::Error::other(format!(
                "replica number {} is not below the replica count {}",
                cfg.replica, cfg.replicas
            )));
        }
        let key = ctx.config().key.clone();
        let port = crate::service_port(&key, &cfg.service).put_port();
        let (store, rec) = Store::open(&cfg.data_dir, port)?;
        tracing::info!(
            index = rec.state.index(),
            replayed = rec.replayed,
            cut = rec.cut,
            "recovered from {}",
            cfg.data_dir.display()
        );
        let peer = Arc::new(
            ctx.serve(crate::peer_port(&key, &cfg.service, cfg.replica))
                .map_err(std::io::Error::other)?,
        );
        let index = rec.state.index();
        let shared = Arc::new(Shared {
            origin: rand::random::<u64>() | 1,
            port,
            state: RwLock::new(rec.state),
            applying: Mutex::new(Applying { seq: 0, epoch: 0 }),
            applied_cv: Condvar::new(),
            results: Mutex::new(HashMap::new()),
            recv: Mutex::new(()),
            group: RwLock::new(None),
            phase: Mutex::new(Phase::Forming),
            generation: AtomicU64::new(rec.generation),
            buffer: Mutex::new(LogBuffer::new()),
            buffer_cv: Condvar::new(),
            disk: store.stats.clone(),
            durable: Mutex::new(Durable { store, index }),
            durable_cv: Condvar::new(),
            server: Mutex::new(None),
            stop: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            cfg,
            ctx,
        });
        let mut threads = Vec::new();
        let spawn = |name: &str, f: fn(&Arc<Shared>)| {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || f(&s))
                .expect("spawn a replica thread")
        };
        threads.push(spawn("dir-control", Shared::control));
        threads.push(spawn("dir-apply", |s| s.background_apply()));
        threads.push(spawn("dir-flush", |s| s.flusher()));
        {
            let s = shared.clone();
            let p = peer.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("dir-peer".into())
                    .spawn(move || s.serve_peers(&p))
                    .expect("spawn a replica thread"),
            );
        }
        Ok(Replica {
            shared,
            threads,
            _peer: peer,
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

    /// Whether the replica is in its group and serving.
    pub fn is_serving(&self) -> bool {
        *self.shared.phase.lock() == Phase::Member
    }

    /// Flushes the log, leaves the group and stops.
    pub fn stop(mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.stop_serving();
        let _ = self.shared.flush(true);
        if let Some(g) = self.shared.group.write().take() {
            g.leave();
        }
        let _ = self._peer.shutdown();
        self.shared.buffer_cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn status(&self) -> serde_json::Value {
        let st = self.state.read();
        let buffer = self.buffer.lock();
        let durable = self.durable.lock();
        serde_json::json!({
            "service": self.cfg.service,
            "port": self.port.to_string(),
            "replica": self.cfg.replica,
            "replicas": self.cfg.replicas,
            "resilience": self.cfg.resilience(),
            "durability": self.cfg.durability.to_string(),
            "phase": self.phase.lock().name(),
            "generation": self.generation.load(Ordering::Relaxed),
            "index": st.index(),
            "durable_index": durable.index,
            "directories": st.dir_count(),
            "rows": st.row_count(),
            "writes": self.writes.load(Ordering::Relaxed),
            "reads": self.reads.load(Ordering::Relaxed),
            "cancelled_pairs": buffer.cancelled_pairs,
            "log_bytes": durable.store.log_len(),
            "disk": self.disk.json(),
        })
    }

    fn group(&self) -> Result<Arc<Group>, DirError> {
        if *self.phase.lock() != Phase::Member {
            return Err(DirError::Unavailable("replica is not in its group".into()));
        }
        self.group
            .read()
            .clone()
            .ok_or_else(|| DirError::Unavailable("replica is not in its group".into()))
    }

    // ---- applying -------------------------------------------------------

    /// Applies one delivery of the group.
    fn deliver(&self, d: Delivery) {
        let seq = match d {
            Delivery::Message { seq, body, .. } => {
                if body.len() >= 8 {
                    let origin = u64::from_le_bytes(body[..8].try_into().unwrap());
                    match Request::decode(&body[8..]) {
                        Ok(req) => self.apply(seq, origin, &req, &body[8..]),
                        Err(e) => tracing::warn!("undecodable group message {seq}: {e}"),
                    }
                }
                seq
            }
            Delivery::State { seq, state } => {
                self.install_state(&state);
                seq
            }
            Delivery::Joined { seq, member, .. } => {
                tracing::info!("member {member} joined at {seq}");
                seq
            }
            Delivery::Left { seq, member } => {
                tracing::info!("member {member} left at {seq}");
                seq
            }
            Delivery::View {
                seq,
                incarnation,
                members,
            } => {
                tracing::info!("view {incarnation}: {} members at {seq}", members.len());
                let mut p = self.phase.lock();
                if *p == Phase::Stuck {
                    *p = Phase::Member;
                }
                seq
            }
            Delivery::ResetFailed { have, need } => {
                tracing::warn!("group reset failed: {have} of {need} members answer");
                let mut p = self.phase.lock();
                if *p == Phase::Member {
                    *p = Phase::Stuck;
                }
                return;
            }
        };
        let mut a = self.applying.lock();
        a.seq = a.seq.max(seq);
        drop(a);
        self.applied_cv.notify_all();
    }

    fn apply(&self, seq: u64, origin: u64, req: &Request, encoded: &[u8]) {
        let response = if matches!(req.op, Op::Sync) {
            Response {
                index: self.state.read().index(),
                result: Ok(Answer::Done),
            }
        } else {
            let mut st = self.state.write();
            let applied = st.apply(req);
            if let Applied::New(r) = &applied {
                let mut b = self.buffer.lock();
                if r.result.is_ok() {
                    b.push(r.index, req, encoded);
                } else {
                    b.note_refused(r.index);
                }
                drop(b);
                self.buffer_cv.notify_one();
            }
            match applied {
                Applied::New(r) | Applied::Duplicate(r) => r,
            }
        };
        if origin == self.origin {
            let mut results = self.results.lock();
            if results.len() > 4096 {
                results.retain(|s, _| *s + 4096 > seq);
            }
            results.insert(seq, response);
        }
    }

    /// The joiner's state transfer: replace the state and make the disk
    /// match it (snapshot, then a new log).
    fn install_state(&self, bytes: &[u8]) {
        let new = match DirState::decode_snapshot(bytes) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("state transfer undecodable: {e}");
                return;
            }
        };
        let index = new.index();
        let mut st = self.state.write();
        let mut durable = self.durable.lock();
        *self.buffer.lock() = LogBuffer::new();
        let snaps = durable.store.snapshots();
        if let Err(e) = snaps
            .write(index, bytes)
            .and_then(|_| durable.store.rotate(index))
        {
            tracing::error!("writing the transferred state failed: {e}");
        }
        durable.index = index;
        *st = new;
        drop(durable);
        drop(st);
        let mut p = self.phase.lock();
        if *p == Phase::Joining {
            *p = Phase::Member;
        }
        tracing::info!("state transfer installed at index {index}");
    }

    /// Reads deliveries (on this thread) until `done` or `deadline`.
    fn pump_until(
        &self,
        group: &Group,
        epoch: u64,
        done: impl Fn(&Applying) -> bool,
        deadline: Instant,
    ) -> Result<(), DirError> {
        loop {
            {
                let a = self.applying.lock();
                if a.epoch != epoch {
                    return Err(DirError::Unavailable("the replica's group changed".into()));
                }
                if done(&a) {
                    return Ok(());
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(DirError::Unavailable(
                    "timed out waiting for the group to order the request".into(),
                ));
            }
            if let Some(_g) = self.recv.try_lock() {
                if done(&self.applying.lock()) {
                    continue;
                }
                let wait = (deadline - now).min(Duration::from_millis(5));
                match group.receive_timeout(Some(wait)) {
                    Ok(Some(d)) => self.deliver(d),
                    Ok(None) => {}
                    Err(e) => {
                        self.lose_group(&e);
                        return Err(unavailable(e));
                    }
                }
            } else {
                let mut a = self.applying.lock();
                if !done(&a) {
                    self.applied_cv.wait_for(&mut a, Duration::from_millis(2));
                }
            }
        }
    }

    /// Applies deliveries while no request thread is waiting for one.
    fn background_apply(&self) {
        while !self.stop.load(Ordering::Relaxed) {
            let group = self.group.read().clone();
            let Some(group) = group else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            if let Some(_g) = self.recv.try_lock() {
                loop {
                    match group.receive_timeout(Some(Duration::ZERO)) {
                        Ok(Some(d)) => self.deliver(d),
                        Ok(None) => break,
                        Err(e) => {
                            self.lose_group(&e);
                            break;
                        }
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn lose_group(&self, e: &GroupError) {
        let mut p = self.phase.lock();
        if *p == Phase::Forming {
            return;
        }
        tracing::warn!("left the group: {e}");
        *p = Phase::Forming;
        drop(p);
        self.group.write().take();
        self.new_epoch();
    }

    fn new_epoch(&self) {
        let mut a = self.applying.lock();
        a.epoch += 1;
        a.seq = 0;
        drop(a);
        self.results.lock().clear();
        self.applied_cv.notify_all();
    }

    // ---- the log --------------------------------------------------------

    /// Writes what the log buffer holds; with `sync`, to disk.  Returns the
    /// index the disk holds.
    fn flush(&self, sync: bool) -> std::io::Result<u64> {
        let mut d = self.durable.lock();
        let (bytes, last) = {
            let mut b = self.buffer.lock();
            let mark = self.cfg.durability == Durability::Fsync;
            (b.take(mark), b.last_index())
        };
        if let Some(bytes) = bytes {
            d.store.append(&bytes, sync)?;
        }
        if sync {
            d.index = d.index.max(last);
        }
        drop(d);
        self.durable_cv.notify_all();
        Ok(last)
    }

    /// Returns once the log holds `index` on disk (fsync mode).
    fn make_durable(&self, index: u64) -> Result<(), DirError> {
        if self.durable.lock().index >= index {
            return Ok(());
        }
        self.flush(true)
            .map_err(|e| DirError::Unavailable(format!("log write failed: {e}")))?;
        Ok(())
    }

    fn flusher(&self) {
        while !self.stop.load(Ordering::Relaxed) {
            match self.cfg.durability {
                Durability::Fsync => {
                    let mut b = self.buffer.lock();
                    if b.is_empty() {
                        self.buffer_cv.wait_for(&mut b, Duration::from_millis(50));
                    }
                }
                Durability::Replicated => std::thread::sleep(self.cfg.flush_interval),
            }
            if let Err(e) = self.flush(true) {
                tracing::error!("log flush failed: {e}");
            }
            if self.durable.lock().store.log_len() > self.cfg.snapshot_bytes
                && let Err(e) = self.snapshot()
            {
                tracing::error!("snapshot failed: {e}");
            }
        }
    }

    /// Compacts: the state at its index becomes the snapshot, a new log
    /// starts after it.
    fn snapshot(&self) -> std::io::Result<()> {
        let (index, bytes, snaps) = {
            let st = self.state.read();
            let mut d = self.durable.lock();
            let bytes = self.buffer.lock().take(false);
            if let Some(bytes) = bytes {
                d.store.append(&bytes, true)?;
            }
            let index = st.index();
            d.index = d.index.max(index);
            d.store.rotate(index)?;
            (index, st.encode_snapshot(), d.store.snapshots())
        };
        snaps.write(index, &bytes)?;
        tracing::info!("snapshot at index {index}: {} bytes", bytes.len());
        Ok(())
    }

    // ---- serving clients ------------------------------------------------

    fn handle(&self, req: Request) -> Response {
        let result = if matches!(req.op, Op::Status) {
            Ok(Answer::Status(self.status().to_string()))
        } else if req.op.is_write() {
            self.writes.fetch_add(1, Ordering::Relaxed);
            return self.write(req).unwrap_or_else(|e| self.error(e));
        } else {
            self.reads.fetch_add(1, Ordering::Relaxed);
            return self.read(req).unwrap_or_else(|e| self.error(e));
        };
        Response {
            index: self.state.read().index(),
            result,
        }
    }

    fn error(&self, e: DirError) -> Response {
        Response {
            index: self.state.read().index(),
            result: Err(e),
        }
    }

    /// Sends `req` through the group and waits until it is applied here.
    fn order(&self, req: &Request) -> Result<Response, DirError> {
        let group = self.group()?;
        let epoch = self.applying.lock().epoch;
        let mut body = Vec::with_capacity(128);
        body.extend_from_slice(&self.origin.to_le_bytes());
        body.extend_from_slice(&req.encode());
        let seq = group.send(&body).map_err(|e| {
            if matches!(e, GroupError::NotMember) {
                self.lose_group(&e);
            }
            unavailable(e)
        })?;
        self.pump_until(&group, epoch, |a| a.seq >= seq, Instant::now() + WRITE_WAIT)?;
        self.results
            .lock()
            .remove(&seq)
            .ok_or_else(|| DirError::Unavailable("the replica lost track of the request".into()))
    }

    fn write(&self, mut req: Request) -> Result<Response, DirError> {
        if req.client == 0 {
            return Err(DirError::BadRequest("writes need a client id".into()));
        }
        if let Op::CreateDir { secret, .. } = &mut req.op {
            *secret = rand::random();
        }
        let response = self.order(&req)?;
        if self.cfg.durability == Durability::Fsync {
            self.make_durable(response.index)?;
        }
        Ok(response)
    }

    fn read(&self, req: Request) -> Result<Response, DirError> {
        let group = self.group()?;
        if req.flags & FLAG_LINEARIZABLE != 0 {
            self.order(&Request {
                client: 0,
                seq: 0,
                min_index: 0,
                flags: 0,
                op: Op::Sync,
            })?;
        }
        if self.state.read().index() < req.min_index {
            let epoch = self.applying.lock().epoch;
            let deadline = Instant::now() + self.cfg.catch_up;
            let _ = self.pump_until(
                &group,
                epoch,
                |_| self.state.read().index() >= req.min_index,
                deadline,
            );
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

    fn serve(&self, server: &Server) {
        loop {
            let request = match server.getreq() {
                Ok(r) => r,
                Err(_) => return,
            };
            let response = match Request::decode(request.body()) {
                Ok(req) => self.handle(req),
                Err(e) => self.error(DirError::BadRequest(e.to_string())),
            };
            let _ = server.putrep(&request, response.encode());
        }
    }

    fn start_serving(self: &Arc<Self>) -> Result<(), shoal_rpc::Error> {
        let mut slot = self.server.lock();
        if slot.is_some() {
            return Ok(());
        }
        let key = self.ctx.config().key.clone();
        let server = Arc::new(
            self.ctx
                .serve(crate::service_port(&key, &self.cfg.service))?,
        );
        let threads = (0..self.cfg.threads.max(1))
            .map(|i| {
                let s = self.clone();
                let srv = server.clone();
                std::thread::Builder::new()
                    .name(format!("dir-serve-{i}"))
                    .spawn(move || s.serve(&srv))
                    .expect("spawn a server thread")
            })
            .collect();
        *slot = Some((server, threads));
        Ok(())
    }

    fn stop_serving(&self) {
        let taken = self.server.lock().take();
        if let Some((server, threads)) = taken {
            let _ = server.shutdown();
            for t in threads {
                let _ = t.join();
            }
        }
    }

    // ---- forming the group ----------------------------------------------

    fn serve_peers(&self, server: &Server) {
        loop {
            let Ok(request) = server.getreq() else { return };
            let _ = server.putrep(&request, self.status().to_string().into_bytes());
        }
    }

    /// Every other replica's status (None: did not answer).
    fn ask_peers(&self) -> Vec<(usize, Option<serde_json::Value>)> {
        let key = self.ctx.config().key.clone();
        let Ok(mut client) = self.ctx.client() else {
            return Vec::new();
        };
        let opts = CallOptions {
            deadline: Some(Duration::from_millis(400)),
            cancel: None,
        };
        (0..self.cfg.replicas)
            .filter(|&i| i != self.cfg.replica)
            .map(|i| {
                let port = crate::peer_port(&key, &self.cfg.service, i).put_port();
                let answer = client
                    .trans_with(&port, Vec::new(), &opts)
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok());
                (i, answer)
            })
            .collect()
    }

    fn group_options(&self, generation: u64) -> GroupOptions {
        GroupOptions {
            resilience: self.cfg.resilience(),
            port: Some(crate::group_port(
                &self.ctx.config().key,
                &self.cfg.service,
                generation,
            )),
            ..GroupOptions::default()
        }
    }

    fn install_group(self: &Arc<Self>, group: Group, generation: u64, phase: Phase) {
        let weak = Arc::downgrade(self);
        group.on_state_wanted(move || {
            weak.upgrade()
                .map(|s| s.state.read().encode_snapshot())
                .unwrap_or_default()
        });
        self.new_epoch();
        *self.group.write() = Some(Arc::new(group));
        if self.generation.swap(generation, Ordering::SeqCst) != generation
            && let Err(e) = self.durable.lock().store.write_generation(generation)
        {
            tracing::error!("recording generation {generation} failed: {e}");
        }
        *self.phase.lock() = phase;
    }

    fn leave_group(&self) {
        self.stop_serving();
        if let Some(g) = self.group.write().take() {
            g.leave();
        }
        *self.phase.lock() = Phase::Forming;
        self.new_epoch();
    }

    /// Forms, joins and re-forms the group; starts and stops serving.
    fn control(self: &Arc<Self>) {
        let mut joined_at = Instant::now();
        let mut said = Instant::now() - Duration::from_secs(60);
        while !self.stop.load(Ordering::Relaxed) {
            let phase = *self.phase.lock();
            match phase {
                Phase::Member => {
                    if self.server.lock().is_none()
                        && let Err(e) = self.start_serving()
                    {
                        tracing::error!("cannot serve the directory port: {e}");
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Phase::Joining => {
                    if joined_at.elapsed() > Duration::from_secs(15) {
                        tracing::warn!("no state transfer within 15 s; joining again");
                        self.leave_group();
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Phase::Stuck => {
                    let peers = self.ask_peers();
                    if peers
                        .iter()
                        .all(|(_, s)| s.as_ref().is_some_and(|s| s["phase"] == "forming"))
                    {
                        tracing::warn!(
                            "the group cannot reset and every other replica is out of it: re-forming from this replica's state"
                        );
                        self.leave_group();
                    } else {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
                Phase::Forming => {
                    self.stop_serving();
                    let peers = self.ask_peers();
                    let member_gen = peers
                        .iter()
                        .filter_map(|(_, s)| s.as_ref())
                        .filter(|s| s["phase"] == "member")
                        .filter_map(|s| s["generation"].as_u64())
                        .max();
                    if let Some(generation) = member_gen {
                        let port = crate::group_port(
                            &self.ctx.config().key,
                            &self.cfg.service,
                            generation,
                        );
                        match Group::join(&self.ctx, port, self.group_options(generation)) {
                            Ok(g) => {
                                tracing::info!("joined the group of generation {generation}");
                                joined_at = Instant::now();
                                self.install_group(g, generation, Phase::Joining);
                            }
                            Err(e) => {
                                tracing::warn!("joining generation {generation} failed: {e}");
                                std::thread::sleep(Duration::from_millis(200));
                            }
                        }
                        continue;
                    }
                    let missing: Vec<usize> = peers
                        .iter()
                        .filter(|(_, s)| s.is_none())
                        .map(|(i, _)| *i)
                        .collect();
                    if !missing.is_empty()
                        || peers
                            .iter()
                            .any(|(_, s)| s.as_ref().is_some_and(|s| s["phase"] != "forming"))
                    {
                        if said.elapsed() > Duration::from_secs(5) {
                            tracing::info!(
                                "waiting for replicas {missing:?}: after the group is lost, every replica must be heard before it re-forms"
                            );
                            said = Instant::now();
                        }
                        std::thread::sleep(Duration::from_millis(300));
                        continue;
                    }
                    let mine = (
                        self.state.read().index(),
                        std::cmp::Reverse(self.cfg.replica),
                    );
                    let best = peers
                        .iter()
                        .filter_map(|(i, s)| {
                            let s = s.as_ref()?;
                            Some((s["index"].as_u64()?, std::cmp::Reverse(*i)))
                        })
                        .max();
                    if best.is_some_and(|b| b > mine) {
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                    let generation = peers
                        .iter()
                        .filter_map(|(_, s)| s.as_ref()?["generation"].as_u64())
                        .chain([self.generation.load(Ordering::SeqCst)])
                        .max()
                        .unwrap_or(0)
                        + 1;
                    match Group::create(&self.ctx, self.group_options(generation)) {
                        Ok(g) => {
                            tracing::info!(
                                "formed the group of generation {generation} at index {}",
                                mine.0
                            );
                            self.install_group(g, generation, Phase::Member);
                        }
                        Err(e) => {
                            tracing::error!("creating the group failed: {e}");
                            std::thread::sleep(Duration::from_millis(500));
                        }
                    }
                }
            }
        }
    }
}
