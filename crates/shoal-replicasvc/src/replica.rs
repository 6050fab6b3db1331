//! One replica of a replicated service, group variant.
//!
//! Replicas form a process group (`shoal_groupsvc`) with resilience r.
//! A write arrives by RPC at any replica, whose handler sends it to the
//! group ([`Replicated::order`]); every replica applies the group's
//! messages in order to its [`Machine`] and logs them; the replica that
//! sent the write answers the client once it has applied it and — in the
//! `fsync` mode — once its log holds it on disk ([`Replicated::durable`]).
//! What a request means, and how a read is answered, is the service's
//! [`Handler`]: the directory's in `shoal_dirsvc`, the file system's
//! metadata service's in `shoal_fssvc`.
//!
//! Threads: `threads` RPC server threads serve clients; the thread that
//! waits for its own write reads the group's deliveries itself (no
//! hand-over on the latency path); a background thread applies deliveries
//! when no request is waiting; a flusher writes the log (at once in the
//! `fsync` mode, every flush interval in the `replicated` mode) and takes
//! snapshots; a control thread forms, joins and re-forms the group; a
//! peer thread (`SERVICE-peer`) answers the other replicas' questions on
//! the peer port (`serve_peers`: its status, for forming and for
//! `writes_at`).
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
use shoal_groupsvc::{Delivery, Group, GroupError, GroupSeq};
use shoal_replica::{Durability, Machine, Phase, STUCK_AFTER, group_tag};
use shoal_rpc::{Context, Server, Service};

use crate::store::{DiskStats, Store};
use crate::writes_at::Endpoint;

mod forming;

/// How a replica runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The service's name (for its status, its threads and its logs).
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

impl Config {
    /// Defaults for replica `replica` of `replicas` of `service`, storing
    /// in `data_dir`.
    pub fn new(service: &str, replica: usize, replicas: usize, data_dir: PathBuf) -> Config {
        Config {
            service: service.into(),
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

/// The ports of a service's replicas: the one clients call (every replica
/// serves it) and the one each replica answers its peers on.
#[derive(Debug, Clone)]
pub struct Ports {
    pub service: Service,
    /// Replica i's peer port at index i.
    pub peers: Vec<Service>,
}

/// What a service does with its clients' requests, on the replica's
/// serving threads.
pub trait Handler<M: Machine>: Send + Sync + 'static {
    /// Answers one request (with `server.putrep`).  An ordered write is
    /// sent with [`Replicated::order`].
    fn serve(&self, replica: &Replicated<M>, server: &Server, request: shoal_rpc::Request);
}

/// Why a replica cannot do something now (the client may try another, or
/// again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn unavailable(e: impl std::fmt::Display) -> Unavailable {
    Unavailable(e.to_string())
}

struct Applying {
    /// Group sequence number applied up to (in the current group).
    seq: GroupSeq,
    /// Group instance counter, bumped when the group changes.
    epoch: u64,
}

struct Durable {
    store: Store,
    /// Index up to which the log is on disk.
    index: u64,
}

/// A replica's shared state: what its threads and its service's
/// [`Handler`] work on.
pub struct Replicated<M: Machine> {
    cfg: Config,
    ports: Ports,
    ctx: Context,
    port: PutPort,
    origin: u64,
    /// The state and its unflushed log.
    rs: RwLock<M>,
    applying: Mutex<Applying>,
    applied_cv: Condvar,
    results: Mutex<HashMap<GroupSeq, M::Output>>,
    /// Held by the one thread reading the group's deliveries (a request
    /// thread waiting for its own write, or the background applier); only
    /// ever `try_lock`ed, so it waits for nothing and adds no lock order.
    recv: Mutex<()>,
    group: RwLock<Option<Arc<Group>>>,
    phase: Mutex<Phase>,
    /// Since when the group has been in a reset (a member reports itself
    /// stuck after `STUCK_AFTER`).
    abnormal_since: Mutex<Option<Instant>>,
    generation: AtomicU64,
    /// Set when the log buffer gained records (wakes the flusher).
    unflushed: Mutex<bool>,
    buffer_cv: Condvar,
    /// The log file and what it holds.  Lock order: `durable` before `rs`
    /// (a flush takes the buffer and writes it under `durable`, so the log
    /// stays in index order).
    durable: Mutex<Durable>,
    durable_cv: Condvar,
    disk: Arc<DiskStats>,
    server: crate::serving::Serving,
    handler: Arc<dyn Handler<M>>,
    stop: AtomicBool,
    writes: AtomicU64,
    reads: AtomicU64,
    /// Where the service's writes go best (`writes_at`).
    writes_at: Mutex<Option<Endpoint>>,
    /// The nodes the service map names as the service's servers: its
    /// peers are root on those alone.
    served_by: shoal_rpc::served_by::ServedBy,
}

/// A running replica.
pub struct Replica<M: Machine> {
    shared: Arc<Replicated<M>>,
    threads: Vec<JoinHandle<()>>,
    _peer: Arc<Server>,
}

/// Longest a write waits for its group message to be applied.
const WRITE_WAIT: Duration = Duration::from_secs(10);

impl<M: Machine> Replica<M> {
    /// Recovers from the data directory and starts the replica's threads;
    /// `handler` answers clients while the replica serves.
    pub fn start(
        ctx: Context,
        cfg: Config,
        ports: Ports,
        handler: Arc<dyn Handler<M>>,
    ) -> std::io::Result<Replica<M>> {
        if cfg.replicas == 0 || cfg.replica >= cfg.replicas {
            return Err(std::io::Error::other(format!(
                "replica number {} is not below the replica count {}",
                cfg.replica, cfg.replicas
            )));
        }
        if ports.peers.len() != cfg.replicas {
            return Err(std::io::Error::other(format!(
                "{} peer ports for {} replicas",
                ports.peers.len(),
                cfg.replicas
            )));
        }
        let port = ports.service.put_port();
        let (store, rec) = Store::open::<M>(&cfg.data_dir, port)?;
        tracing::info!(
            index = rec.state.index(),
            replayed = rec.replayed,
            cut = rec.cut,
            "recovered from {}",
            cfg.data_dir.display()
        );
        let peer = Arc::new(
            ctx.serve(ports.peers[cfg.replica])
                .map_err(std::io::Error::other)?,
        );
        let index = rec.state.index();
        let shared = Arc::new(Replicated {
            origin: rand::random::<u64>() | 1,
            port,
            rs: RwLock::new(rec.state),
            applying: Mutex::new(Applying {
                seq: GroupSeq(0),
                epoch: 0,
            }),
            applied_cv: Condvar::new(),
            results: Mutex::new(HashMap::new()),
            recv: Mutex::new(()),
            group: RwLock::new(None),
            phase: Mutex::new(Phase::Forming),
            abnormal_since: Mutex::new(None),
            generation: AtomicU64::new(rec.generation),
            unflushed: Mutex::new(false),
            buffer_cv: Condvar::new(),
            disk: store.stats.clone(),
            durable: Mutex::new(Durable { store, index }),
            durable_cv: Condvar::new(),
            server: Default::default(),
            handler,
            stop: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            writes_at: Mutex::new(None),
            served_by: shoal_rpc::served_by::ServedBy::new(&ctx, port),
            cfg,
            ports,
            ctx,
        });
        let mut threads = Vec::new();
        let spawn = |name: &str, f: fn(&Arc<Replicated<M>>)| {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(format!("{}-{name}", s.cfg.service))
                .spawn(move || f(&s))
                .expect("spawn a replica thread")
        };
        threads.push(spawn("control", Replicated::control));
        threads.push(spawn("apply", |s| s.background_apply()));
        threads.push(spawn("flush", |s| s.flusher()));
        {
            let s = shared.clone();
            let p = peer.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{}-peer", s.cfg.service))
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

    /// The replica's status as JSON, as its own process sees it (its
    /// group's port included).
    pub fn status(&self) -> serde_json::Value {
        self.shared.status(true)
    }

    /// The replica's shared state.
    pub fn shared(&self) -> &Arc<Replicated<M>> {
        &self.shared
    }

    /// Whether the replica is in its group and serving.
    pub fn is_serving(&self) -> bool {
        *self.shared.phase.lock() == Phase::Member
    }

    /// Flushes the log, leaves the group and stops.
    pub fn stop(mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.stop_serving();
        let _ = self.shared.flush(u64::MAX);
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

impl<M: Machine> Replicated<M> {
    /// Whether `caller` may be one of this replica's peers (and learn its
    /// group's port): root, on a node the service map names for the
    /// service where it names any (`docs/security.md`, "Which nodes serve
    /// the system").
    pub fn is_peer(&self, caller: shoal_rpc::Caller) -> bool {
        caller.uid == 0 && self.served_by.admits(caller.node)
    }

    /// The replica's status; with `group_port`, the port of its group,
    /// which is for its peers alone: whoever knows it may join the group
    /// and read, and send, the replicas' traffic.
    pub fn status(&self, group_port: bool) -> serde_json::Value {
        // Lock order: durable, then rs (as flush, which must keep the log in
        // index order).
        let durable = self.durable.lock();
        let rs = self.rs.read();
        let mut status = serde_json::json!({
            "service": self.cfg.service,
            "port": self.port.to_string(),
            "replica": self.cfg.replica,
            "replicas": self.cfg.replicas,
            "resilience": self.cfg.resilience(),
            "durability": self.cfg.durability.to_string(),
            "phase": self.reported_phase().name(),
            "generation": self.generation.load(Ordering::Relaxed),
            "group": self.group_tag(),
            "group_port": self
                .group
                .read()
                .as_ref()
                .filter(|_| group_port)
                .map(|g| g.port().to_string()),
            "member": self.group.read().as_ref().map(|g| g.info().member),
            "endpoint": self.endpoint().map(Endpoint::to_json),
            "writes_at": self.writes_at.lock().map(Endpoint::to_json),
            "index": rs.index(),
            "durable_index": durable.index,
            "writes": self.writes.load(Ordering::Relaxed),
            "reads": self.reads.load(Ordering::Relaxed),
            "log_bytes": durable.store.log_len(),
            "disk": self.disk.json(),
        });
        for (name, value) in rs.counts() {
            status[name] = value.into();
        }
        status
    }

    /// The phase peers see: a member whose group has been in a reset for
    /// long is stuck.
    fn reported_phase(&self) -> Phase {
        let phase = *self.phase.lock();
        let long = self
            .abnormal_since
            .lock()
            .is_some_and(|t| t.elapsed() >= STUCK_AFTER);
        if phase == Phase::Member && long {
            Phase::Stuck
        } else {
            phase
        }
    }

    /// Which group instance this replica is in (0: none).
    fn group_tag(&self) -> u64 {
        self.group.read().as_ref().map_or(0, |g| {
            let (incarnation, sequencer) = g.sequencer();
            group_tag(incarnation.0, &sequencer.to_string())
        })
    }

    fn group(&self) -> Result<Arc<Group>, Unavailable> {
        let not = || Unavailable("replica is not in its group".into());
        if *self.phase.lock() != Phase::Member {
            return Err(not());
        }
        self.group.read().clone().ok_or_else(not)
    }

    // ---- applying -------------------------------------------------------

    /// Applies one delivery of the group.
    fn deliver(&self, d: Delivery) {
        let seq = match d {
            Delivery::Message { seq, body, .. } => {
                self.apply(seq, &body);
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

    fn apply(&self, seq: GroupSeq, body: &[u8]) {
        let delivered = shoal_replica::split_entry(body)
            .and_then(|(origin, message)| Some((origin, self.rs.write().deliver(message)?)));
        let Some((origin, response)) = delivered else {
            tracing::warn!("undecodable group message {seq}");
            return;
        };
        *self.unflushed.lock() = true;
        self.buffer_cv.notify_one();
        if origin == self.origin {
            let mut results = self.results.lock();
            if results.len() > 4096 {
                results.retain(|s, _| s.plus(4096) > seq);
            }
            results.insert(seq, response);
        }
    }

    /// The joiner's state transfer: replace the state and make the disk
    /// match it (snapshot, then a new log).
    fn install_state(&self, bytes: &[u8]) {
        let new = match M::decode_snapshot(bytes) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("state transfer undecodable: {e}");
                return;
            }
        };
        let index = new.index();
        let mut durable = self.durable.lock();
        let mut rs = self.rs.write();
        let snaps = durable.store.snapshots();
        if let Err(e) = snaps
            .write(index, bytes)
            .and_then(|_| durable.store.rotate(index))
        {
            tracing::error!("writing the transferred state failed: {e}");
        }
        durable.index = index;
        *rs = new;
        drop(durable);
        drop(rs);
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
    ) -> Result<(), Unavailable> {
        loop {
            {
                let a = self.applying.lock();
                if a.epoch != epoch {
                    return Err(Unavailable("the replica's group changed".into()));
                }
                if done(&a) {
                    return Ok(());
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Unavailable(
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

    /// Applies deliveries while no request thread is waiting for one:
    /// every millisecond while they flow, backing off to 10 ms when idle
    /// (an idle replica should not cost a core a thousand wake-ups a
    /// second; a request thread that needs a delivery reads it itself).
    fn background_apply(&self) {
        let mut pause = Duration::from_millis(1);
        while !self.stop.load(Ordering::Relaxed) {
            let group = self.group.read().clone();
            let Some(group) = group else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            let mut applied = false;
            if let Some(_g) = self.recv.try_lock() {
                loop {
                    match group.receive_timeout(Some(Duration::ZERO)) {
                        Ok(Some(d)) => {
                            self.deliver(d);
                            applied = true;
                        }
                        Ok(None) => break,
                        Err(e) => {
                            self.lose_group(&e);
                            break;
                        }
                    }
                }
            }
            pause = if applied {
                Duration::from_millis(1)
            } else {
                (pause * 2).min(Duration::from_millis(10))
            };
            std::thread::sleep(pause);
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
        a.seq = GroupSeq(0);
        drop(a);
        self.results.lock().clear();
        // A new group has its own sequencer.
        *self.writes_at.lock() = None;
        self.applied_cv.notify_all();
    }

    // ---- the log --------------------------------------------------------

    /// Writes what the log buffer holds and syncs it, unless the disk
    /// already holds index `through`.
    fn flush(&self, through: u64) -> std::io::Result<()> {
        let mut d = self.durable.lock();
        if d.index >= through {
            // A sync that ended while this one waited for the lock covered
            // it: concurrent callers share one sync.
            return Ok(());
        }
        let (bytes, last) = {
            let mut rs = self.rs.write();
            let mark = self.cfg.durability.marks();
            (rs.take_log(mark), rs.logged_index())
        };
        if let Some(bytes) = bytes {
            d.store.append(&bytes, true)?;
        }
        d.index = d.index.max(last);
        drop(d);
        self.durable_cv.notify_all();
        Ok(())
    }

    /// Returns once the log holds `index` on disk.
    fn make_durable(&self, index: u64) -> Result<(), Unavailable> {
        self.flush(index)
            .map_err(|e| Unavailable(format!("log write failed: {e}")))
    }

    fn flusher(&self) {
        while !self.stop.load(Ordering::Relaxed) {
            match self.cfg.durability {
                Durability::Fsync => {
                    let mut u = self.unflushed.lock();
                    if !*u {
                        self.buffer_cv.wait_for(&mut u, Duration::from_millis(50));
                    }
                    *u = false;
                }
                Durability::Replicated => std::thread::sleep(self.cfg.flush_interval),
            }
            if let Err(e) = self.flush(u64::MAX) {
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
            let mut d = self.durable.lock();
            let mut rs = self.rs.write();
            // Marks and sessions too in the fsync mode: until the snapshot
            // is renamed into place, this log is what recovery reads.
            if let Some(bytes) = rs.take_log(self.cfg.durability.marks()) {
                d.store.append(&bytes, true)?;
            }
            let index = rs.index();
            d.index = d.index.max(index);
            d.store.rotate(index)?;
            (index, rs.encode_snapshot(), d.store.snapshots())
        };
        snaps.write(index, &bytes)?;
        tracing::info!("snapshot at index {index}: {} bytes", bytes.len());
        Ok(())
    }

    // ---- for the service's handler --------------------------------------

    /// The service's port (what the service's capabilities name).
    pub fn port(&self) -> PutPort {
        self.port
    }

    /// The state's index.
    pub fn index(&self) -> u64 {
        self.rs.read().index()
    }

    /// Group messages this replica's member holds and the replica has not
    /// applied yet ([`shoal_replica::behind`], [`shoal_replica::when_stuck`]).
    pub(crate) fn unapplied(&self) -> u64 {
        let Some(g) = self.group.read().clone() else {
            return 0;
        };
        let held = g.info().held;
        held.saturating_sub(self.applying.lock().seq.0)
    }

    /// Reads the state.
    pub fn read<R>(&self, f: impl FnOnce(&M) -> R) -> R {
        f(&self.rs.read())
    }

    /// Counts a request in the status (`writes` or `reads`).
    pub fn count(&self, write: bool) {
        let c = if write { &self.writes } else { &self.reads };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether this replica's group member is the group's sequencer (its
    /// replica is the service's primary, where one is needed).
    pub fn is_sequencer(&self) -> bool {
        self.group
            .read()
            .as_ref()
            .is_some_and(|g| g.names_me_sequencer())
    }

    /// The client-facing server, while serving: a handler that parks a
    /// request keeps it, to answer from another thread.
    pub fn server(&self) -> Option<Arc<Server>> {
        self.server.server()
    }

    /// Which instance of its group this replica is in (0: none): a new
    /// one means a new sequencer may have been chosen.
    pub fn group_instance(&self) -> u64 {
        self.group_tag()
    }

    /// Whether the replica is stopping.
    pub fn is_stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Sends `message` through the group and waits until it is applied
    /// here; returns what applying it answered.
    pub fn order(&self, message: &[u8]) -> Result<M::Output, Unavailable> {
        let group = self.group()?;
        let epoch = self.applying.lock().epoch;
        let body = shoal_replica::entry(self.origin, message);
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
            .ok_or_else(|| Unavailable("the replica lost track of the request".into()))
    }

    /// Waits (up to the catch-up time) until this replica has applied
    /// `index`; fails only if the replica is not in its group.  The caller
    /// checks the index again: a replica that did not catch up says so.
    pub fn catch_up(&self, index: u64) -> Result<(), Unavailable> {
        let group = self.group()?;
        if self.index() < index {
            let epoch = self.applying.lock().epoch;
            let deadline = Instant::now() + self.cfg.catch_up;
            let _ = self.pump_until(&group, epoch, |_| self.index() >= index, deadline);
        }
        Ok(())
    }

    /// Returns once an answer that shows the state at `index` may leave:
    /// at once in the `replicated` mode; in the `fsync` mode, once the log
    /// holds it on disk (a crash of every replica must not take back what
    /// a client saw).
    pub fn durable(&self, index: u64) -> Result<(), Unavailable> {
        if self
            .cfg
            .durability
            .reply_ready(index, self.durable.lock().index)
        {
            return Ok(());
        }
        self.make_durable(index)
    }

    /// Returns once every update this replica applied is in its log on
    /// disk, whatever the durability mode: for an answer that must
    /// survive the loss of every replica at once (a file system's
    /// `fsync`).  Concurrent callers share a sync.
    pub fn sync_applied(&self) -> Result<(), Unavailable> {
        self.make_durable(self.index())
    }

    /// Only a serving replica answers about the state: one whose group got
    /// stuck meanwhile may yet be dissolved, with what it applied.
    pub fn still_serving(&self) -> Result<(), Unavailable> {
        if *self.phase.lock() == Phase::Member {
            Ok(())
        } else {
            Err(Unavailable("the replica's group is being re-formed".into()))
        }
    }

    fn serve(&self, server: &Server) {
        loop {
            let request = match server.getreq() {
                Ok(r) => r,
                Err(_) => return,
            };
            self.handler.serve(self, server, request);
        }
    }

    fn start_serving(self: &Arc<Self>) -> Result<(), shoal_rpc::Error> {
        let me = self.clone();
        self.server.start(
            &self.ctx,
            self.ports.service,
            self.cfg.threads,
            &format!("{}-serve", self.cfg.service),
            || false,
            move |srv| me.serve(srv),
        )
    }

    fn stop_serving(&self) {
        self.server.stop();
    }
}
