//! The daemon's threads and shared state.
//!
//! - `net`: the node socket: everything on it travels sealed in node
//!   sessions (`shoal_session::Sessions`: a Noise handshake with each
//!   peer, whose certificate must name the node its messages speak for):
//!   heartbeats, revocation and service map news, and locate questions and answers
//!   (`crate::locate`), which it answers from the registry.
//! - `link-accept` and one `link` thread per program (see `link_server`).
//! - `service-N`: the node service, a shoal RPC server like any other
//!   (status, and the home's answers for its processes).
//! - `exec-N`: the exec service (programs placed on this node).
//! - `metrics`: Prometheus text over HTTP, when configured.
//!
//! They share one [`State`] under a mutex; nothing on the RPC data path
//! takes it.

use std::net::{SocketAddr, UdpSocket};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use shoal_node::gossip;
use shoal_proto::{Dest, Membership, MembershipConfig, Registry, Stats, Time};
use shoal_rpc::{Context, Server};
use shoal_session::table::{Config as SessionConfig, Output as SessionOutput};
use shoal_session::{Algorithm, Sessions};
use shoal_wire::{ClusterKey, MAX_DATAGRAM, NodeId, NodeMsg, Owner, Packet, decode, decode_plain};

use crate::config::NodeConfig;
use crate::load::Sampler;
use crate::service::{
    MemberLoad, MemberStatus, NodeRequest, NodeStatus, ProcAnswer, ServiceAction, ServiceAnswer,
    node_port,
};

/// Longest the net thread sleeps before it looks at the stop flag.
const POLL: Duration = Duration::from_millis(50);
/// How often the load is measured (heartbeats in between carry the last).
const LOAD_EVERY: Duration = Duration::from_millis(500);
/// Threads serving the exec service (a write to a full pipe holds one).
const EXEC_THREADS: usize = 4;
/// Threads serving the node service (a `wait` holds one up to 2 s).
const SERVICE_THREADS: usize = 4;

/// Now on the process's protocol clock (the RPC library's, which the
/// node service also runs on).
pub(crate) fn now() -> Time {
    shoal_rpc::clock::now()
}

pub(crate) struct State {
    pub registry: Registry,
    pub membership: Membership,
    pub stats: Stats,
    pub links: u64,
    /// Open links by uid (`crate::link_server`: a uid's are bounded).
    pub links_by_uid: std::collections::HashMap<u32, usize>,
    /// Chooses nodes for the programs started here.
    pub placer: shoal_pool::Placer,
}

/// The load the heartbeats carry, measured apart from [`State`]: a
/// measurement reads `/proc`, which must not hold up the node's socket.
pub(crate) struct Load {
    /// Measures it; holds the owner's state.
    pub sampler: Sampler,
    /// When it was last measured (`None`: measure at once).
    pub at: Option<Time>,
}

pub(crate) struct Shared {
    pub config: NodeConfig,
    pub load: Mutex<Load>,
    /// The programs placed on this node.
    pub exec: Arc<crate::exec::Exec>,
    /// The nodes' names, to show process ids with (`names.rs`).
    pub(crate) names: Arc<crate::names::Names>,
    /// The processes this node is the home of (`crate::home`).
    pub procs: Mutex<shoal_pool::ProcTable>,
    /// Where the process numbers reserved on disk end (`crate::home`).
    pub procs_reserved: std::sync::atomic::AtomicU64,
    /// Notified when a process of `procs` ends.
    pub procs_changed: Condvar,
    /// The daemon's own RPC context, once it serves.
    pub rpc: OnceLock<Context>,
    /// The old shared cluster key, if the configuration names one: only
    /// to recognize (and count as forged) a heartbeat sent outside a
    /// session under it.
    pub key: Option<ClusterKey>,
    /// This node's certificate and what it trusts.
    pub identity: crate::identity::Identity,
    /// Sessions with the other nodes (heartbeats travel in them).
    pub sessions: Mutex<Sessions>,
    /// The node socket, for link threads to send locates on.
    pub socket: UdpSocket,
    /// Locates under way and the answers they gathered
    /// (`crate::locate`); `located` is notified as answers come.
    pub locating: Mutex<crate::locate::Pending>,
    pub located: Condvar,
    /// The newest revocation list held: its version and signed bytes.
    pub revocations: Mutex<Option<(u64, Vec<u8>)>>,
    /// The newest service map held (`crate::service_map`).
    pub service_map: Mutex<Option<crate::service_map::Held>>,
    /// Tell every peer the revocation list's and service map's versions
    /// at the next turn.
    pub announce: AtomicBool,
    /// Heartbeats refused: unsealed, or naming another node than the
    /// session's.
    pub forged_heartbeats: std::sync::atomic::AtomicU64,
    /// `kill` and `wait` refused: not the process's owner.
    pub refused_procs: std::sync::atomic::AtomicU64,
    /// System services a program that is neither the daemon nor root
    /// tried to serve.
    pub refused_system: std::sync::atomic::AtomicU64,
    /// Locate answers dropped: another node's own system service (its
    /// node or exec service) answered for by a node that is not it.
    pub refused_system_answers: std::sync::atomic::AtomicU64,
    /// The services this daemon keeps (`crate::supervise_io`).
    pub services: Arc<crate::supervise_io::Services>,
    /// Service requests refused for want of authority.
    pub refused_services: std::sync::atomic::AtomicU64,
    pub node: NodeId,
    pub started: Instant,
    pub state: Mutex<State>,
    pub stop: Arc<AtomicBool>,
}

impl Shared {
    pub fn status(&self) -> NodeStatus {
        let state = self.state.lock();
        let members = state
            .membership
            .view(now())
            .into_iter()
            .map(|m| MemberStatus {
                name: m.name,
                node: m.node.to_string(),
                addr: m.addr.to_string(),
                alive: m.alive,
                silent_ms: m.silent_for.map(|d| d.as_millis() as u64),
                load: m.load.map(|(l, _)| MemberLoad {
                    cores: l.cores,
                    run_queue: l.run_queue_centi as f64 / 100.0,
                    foreign_cpu: l.foreign_cpu_milli as f64 / 1000.0,
                    mem_free_mib: l.mem_free_mib,
                    shoal_procs: l.shoal_procs,
                    owner_active: l.owner == Owner::Active,
                }),
            })
            .collect();
        NodeStatus {
            name: self.config.name.clone(),
            node: self.node.to_string(),
            addr: self.config.addr.to_string(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            ports: state.registry.len(),
            links: state.links,
            members,
            counters: state
                .stats
                .entries()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .chain(self.session_counters())
                .collect(),
            cluster: self.identity.trust.cluster.to_hex(),
            cert_serial: self.identity.me.cert().serial,
            revocations: self.sessions.lock().trust().revoked.version,
            service_map: crate::service_map::version(self),
            services: self.services.list(),
        }
    }
}

impl Shared {
    /// The session table's counters and the refused heartbeats, named as
    /// the metrics export them.
    fn session_counters(&self) -> Vec<(String, u64)> {
        let s = self.sessions.lock().stats().clone();
        vec![
            ("session_handshakes".into(), s.handshakes),
            ("session_handshake_failures".into(), s.handshake_failures),
            ("session_replays".into(), s.replays),
            ("session_bad_tags".into(), s.bad_tags),
            ("session_unknown_index".into(), s.unknown_index),
            ("session_dropped_queued".into(), s.dropped_queued),
            (
                "forged_heartbeats".into(),
                self.forged_heartbeats.load(Ordering::Relaxed),
            ),
            (
                "refused_system_registrations".into(),
                self.refused_system.load(Ordering::Relaxed),
            ),
            (
                "refused_system_answers".into(),
                self.refused_system_answers.load(Ordering::Relaxed),
            ),
            (
                "refused_proc_requests".into(),
                self.refused_procs.load(Ordering::Relaxed) + self.exec.refused(),
            ),
            (
                "refused_service_requests".into(),
                self.refused_services.load(Ordering::Relaxed),
            ),
        ]
    }
}

/// A running node daemon.
pub struct Daemon {
    shared: Arc<Shared>,
    service: Server,
    metrics: Option<SocketAddr>,
    /// The `supervise` thread, which ends once every service has.
    supervise: std::thread::JoinHandle<()>,
}

impl Daemon {
    /// Starts every thread of a node with `config`.  `stop` ends it.
    pub fn start(config: NodeConfig, stop: Arc<AtomicBool>) -> Result<Daemon, String> {
        let remote_root = config.remote_root;
        let key = match &config.key_file {
            Some(path) => {
                let bytes =
                    shoal_rpc::secrets::read(path).map_err(|e| format!("cluster key: {e}"))?;
                let text = String::from_utf8_lossy(&bytes);
                Some(ClusterKey::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?)
            }
            None => None,
        };
        let identity = crate::identity::load(
            &config.name,
            &config.state_dir,
            &config.cert_file,
            config.cluster,
            config.admin,
            crate::identity::wall(),
        )?;
        let node = crate::identity::node_id(identity.me.public());
        let revocations = {
            let path = config.state_dir.join(crate::identity::REVOKED);
            path.exists()
                .then(|| crate::identity::read_hex(&path))
                .transpose()?
                .map(|bytes| (identity.trust.revoked.version, bytes))
        };
        let service_map = crate::service_map::load(&config.state_dir, &identity.trust)?;
        let sessions = Sessions::new(
            SessionConfig::default(),
            identity.me.clone(),
            identity.trust.clone(),
            Algorithm::cpu_has_aes(),
            rand::random(),
        );
        let socket = shoal_rpc_socket(config.bind)?;
        let incarnation: u64 = rand::random();
        let membership = Membership::new(
            node,
            config.name.clone(),
            config.addr,
            incarnation,
            config.seeds.clone(),
            MembershipConfig::default(),
        );
        // Namespaces need root; without it programs run without.
        // SAFETY: geteuid cannot fail.
        let names = Arc::new(crate::names::Names::new(node, &config.name));
        let exec = Arc::new(crate::exec::Exec::new(
            unsafe { libc::geteuid() } == 0,
            node,
            remote_root,
            names.clone(),
        )?);
        let (first_number, numbers_reserved) = crate::home::first_number(&config.state_dir)?;
        let services = crate::supervise_io::Services::new(
            exec.spawner(),
            &config.state_dir,
            config.socket.clone(),
        )?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                registry: Registry::new(node),
                membership,
                stats: Stats::default(),
                links: 0,
                links_by_uid: Default::default(),
                placer: shoal_pool::Placer::new(rand::random()),
            }),
            load: Mutex::new(Load {
                sampler: Sampler::new(&config.state_dir, config.owner_detect),
                at: None,
            }),
            key,
            identity,
            sessions: Mutex::new(sessions),
            socket: socket
                .try_clone()
                .map_err(|e| format!("cannot share the node socket: {e}"))?,
            locating: Mutex::new(Default::default()),
            located: Condvar::new(),
            revocations: Mutex::new(revocations),
            service_map: Mutex::new(service_map),
            announce: AtomicBool::new(true),
            forged_heartbeats: Default::default(),
            refused_procs: Default::default(),
            refused_system: Default::default(),
            refused_system_answers: Default::default(),
            services,
            refused_services: Default::default(),
            node,
            started: Instant::now(),
            stop,
            config,
            exec,
            names,
            // Small numbers, reserved in blocks on disk: a restarted home
            // does not reuse the ids of its previous incarnation.
            procs: Mutex::new(shoal_pool::ProcTable::new(node, first_number)),
            procs_reserved: std::sync::atomic::AtomicU64::new(numbers_reserved),
            procs_changed: Condvar::new(),
            rpc: OnceLock::new(),
        });
        {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("net".into())
                .spawn(move || net_loop(&shared, &socket))
                .map_err(|e| format!("cannot start net thread: {e}"))?;
        }
        crate::link_server::start(shared.clone())?;
        let metrics = match shared.config.metrics {
            Some(addr) => Some(crate::metrics::start(shared.clone(), addr)?),
            None => None,
        };
        let ctx = Context::attach(&shared.config.socket).map_err(|e| e.to_string())?;
        let service = ctx
            .serve(node_port(
                &shared.identity.trust.cluster.0,
                &shared.config.name,
            ))
            .map_err(|e| format!("cannot serve the node service: {e}"))?;
        for i in 0..SERVICE_THREADS {
            let shared = shared.clone();
            let service = service.clone();
            std::thread::Builder::new()
                .name(format!("service-{i}"))
                .spawn(move || service_loop(&shared, &service))
                .map_err(|e| format!("cannot start service thread: {e}"))?;
        }
        let exec_server = ctx
            .serve(shoal_poolsvc::exec_service(
                &shared.identity.trust.cluster.0,
                &shared.config.name,
            ))
            .map_err(|e| format!("cannot serve the exec service: {e}"))?;
        for i in 0..EXEC_THREADS {
            let exec = shared.exec.clone();
            let server = exec_server.clone();
            std::thread::Builder::new()
                .name(format!("exec-{i}"))
                .spawn({
                    let shared = shared.clone();
                    move || exec.serve(&server, &move |sealed| open_grant(&shared, sealed))
                })
                .map_err(|e| format!("cannot start exec thread: {e}"))?;
        }
        let _ = shared.rpc.set(ctx);
        // The services last: they attach to the node as it now serves.
        shared.services.reload(&shared.config.services)?;
        let supervise = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("supervise".into())
                .spawn(move || shared.services.run(&shared.stop))
                .map_err(|e| format!("cannot start the supervise thread: {e}"))?
        };
        let pid_file = shared.config.state_dir.join("node.pid");
        std::fs::write(&pid_file, format!("{}\n", std::process::id()))
            .map_err(|e| format!("cannot write {}: {e}", pid_file.display()))?;
        tracing::info!(
            name = %shared.config.name,
            node = %shared.node,
            addr = %shared.config.addr,
            socket = %shared.config.socket.display(),
            "node up"
        );
        Ok(Daemon {
            shared,
            service,
            metrics,
            supervise,
        })
    }

    /// The metrics endpoint, if serving.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics
    }

    /// This node's status.
    pub fn status(&self) -> NodeStatus {
        self.shared.status()
    }

    /// Takes a new set of services (the configuration was read again):
    /// new ones start, removed ones stop, changed ones restart.
    pub fn reload_services(&self, services: &[crate::ServiceConfig]) -> Result<(), String> {
        self.shared.services.reload(services)
    }

    /// Stops the node: stops its services, drains its node service and
    /// removes the link socket.
    pub fn shutdown(self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.services.wake();
        if self.supervise.join().is_err() {
            tracing::warn!("the supervise thread panicked");
        }
        if let Err(e) = self.service.shutdown() {
            tracing::warn!("node service shutdown: {e}");
        }
        let _ = std::fs::remove_file(&self.shared.config.socket);
        let _ = std::fs::remove_file(self.shared.config.state_dir.join("node.pid"));
        tracing::info!(name = %self.shared.config.name, "node down");
    }
}

fn shoal_rpc_socket(bind: SocketAddr) -> Result<UdpSocket, String> {
    let socket =
        UdpSocket::bind(bind).map_err(|e| format!("cannot bind node address {bind}: {e}"))?;
    socket
        .set_broadcast(true)
        .map_err(|e| format!("cannot allow broadcast: {e}"))?;
    Ok(socket)
}

/// Runs a node until SIGTERM or SIGINT; on SIGHUP, takes the services
/// `reload` reads (the configuration file's), or keeps the old ones and
/// logs why not.
pub fn run(
    config: NodeConfig,
    reload: impl Fn() -> Result<Vec<crate::ServiceConfig>, String>,
) -> Result<(), String> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.clone())
            .map_err(|e| format!("cannot handle signals: {e}"))?;
    }
    let hup = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, hup.clone())
        .map_err(|e| format!("cannot handle signals: {e}"))?;
    let daemon = Daemon::start(config, stop.clone())?;
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(POLL);
        if hup.swap(false, Ordering::AcqRel) {
            match reload().and_then(|s| daemon.reload_services(&s)) {
                Ok(()) => tracing::info!("configuration read again: services updated"),
                Err(e) => tracing::error!("configuration not taken, services unchanged: {e}"),
            }
        }
    }
    daemon.shutdown();
    Ok(())
}

fn net_loop(shared: &Shared, socket: &UdpSocket) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut announcer = gossip::Announcer::new();
    while !shared.stop.load(Ordering::Acquire) {
        let timeout = {
            let state = shared.state.lock();
            let next = state.membership.poll_timeout();
            Duration::from_micros(next.0.saturating_sub(now().0))
                .clamp(Duration::from_micros(100), POLL)
        };
        let _ = socket.set_read_timeout(Some(timeout));
        let received = socket.recv_from(&mut buf);
        let now = now();
        let mut out: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
        // Plaintexts that opened in a node session, with the peer's name,
        // address and node id (from its certificate's key).
        let mut opened: Vec<(Peer, Vec<u8>)> = Vec::new();
        let mut unsealed = None;
        if let Ok((n, from)) = received {
            if n >= 3 && buf[2] == shoal_session::datagram::VERSION {
                let mut sessions = shared.sessions.lock();
                let mut outputs = Vec::new();
                let wall = crate::identity::wall();
                match sessions.handle(now, wall, from, &mut buf[..n], &mut outputs) {
                    Ok(Some(o)) => {
                        let (index, plaintext) = (o.index, o.plaintext.to_vec());
                        if let Some((peer, addr, _)) = sessions.session(index) {
                            opened.push((Peer::of(peer, addr), plaintext));
                        }
                    }
                    Ok(None) => {}
                    Err(e) => tracing::debug!(%from, "node datagram dropped: {e}"),
                }
                route(&sessions, outputs, &mut out, &mut opened);
            } else {
                unsealed = Some((n, from));
            }
        }
        let load = {
            let mut load = shared.load.lock();
            load.at
                .is_none_or(|t| now.saturating_since(t) >= LOAD_EVERY)
                .then(|| {
                    load.at = Some(now);
                    load.sampler
                        .sample(shared.exec.count(), shared.exec.cpu_jiffies())
                })
        };
        // What to seal for other nodes: heartbeats, revocation news; and
        // revocation lists and service maps peers sent.
        let mut heartbeats: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
        let mut lists: Vec<(NodeMsg, Vec<u8>)> = Vec::new();
        {
            let mut state = shared.state.lock();
            if received.is_ok() {
                state.stats.datagrams_in += 1;
            }
            if let Some((n, _)) = unsealed {
                // Nothing is taken outside a node session; a heartbeat
                // sent so (even under the cluster key) is counted forged.
                match shared.key.as_ref().map(|key| decode(&buf[..n], key)) {
                    Some(Ok(Packet::Heartbeat(_))) => {
                        shared.forged_heartbeats.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(Ok(_)) | None => state.stats.dropped_stale += 1,
                    Some(Err(e)) => state.stats.count_wire_error(e),
                }
            }
            for (peer, plaintext) in &opened {
                hear(
                    shared,
                    &mut state,
                    now,
                    peer,
                    plaintext,
                    &mut heartbeats,
                    &mut lists,
                );
            }
            if let Some(load) = load {
                state.membership.set_load(now, load);
                // Homes known and silent past the deadline; a home not
                // heard of yet is given the lease's time instead.
                let dead: Vec<NodeId> = state
                    .membership
                    .view(now)
                    .into_iter()
                    .filter(|m| !m.alive)
                    .map(|m| m.node)
                    .collect();
                shared.exec.sweep(|home| !dead.contains(&home));
            }
            state.membership.handle_timeout(now);
            while let Some(t) = state.membership.poll_transmit() {
                if let Dest::Addr(addr) = t.dest {
                    heartbeats.push((addr, NodeMsg::Packet.with(&t.bytes)));
                }
            }
            if shared.announce.swap(false, Ordering::AcqRel) {
                announcer.soon();
            }
            if announcer.poll(now) {
                let news = [revocation_version(shared), service_map_version(shared)];
                for member in state.membership.view(now).iter().skip(1) {
                    for m in &news {
                        heartbeats.push((member.addr, m.clone()));
                    }
                }
            }
        }
        let mut late = Vec::new();
        seal(shared, now, &heartbeats, true, &mut out, &mut late);
        // (Lock order: `state` before `sessions`, so never the other way.)
        if !late.is_empty() {
            let mut state = shared.state.lock();
            let mut replies = Vec::new();
            for (peer, plaintext) in &late {
                hear(
                    shared,
                    &mut state,
                    now,
                    peer,
                    plaintext,
                    &mut replies,
                    &mut lists,
                );
            }
            drop(state);
            // Rare (a handshake's end): what they open is heard next turn.
            seal(shared, now, &replies, false, &mut out, &mut Vec::new());
        }
        for (kind, signed) in lists {
            let taken = if kind == NodeMsg::ServiceMap {
                crate::service_map::take(shared, &signed)
            } else {
                crate::revocation::take(shared, &signed)
            };
            if let Err(e) = taken {
                tracing::debug!("signed news from a peer not taken: {e}");
            }
        }
        shared.state.lock().stats.datagrams_out += out.len() as u64;
        for (addr, bytes) in out {
            let _ = socket.send_to(&bytes, addr);
        }
    }
}

/// The node at the other end of a session, as its certificate says.
struct Peer {
    name: String,
    addr: SocketAddr,
    node: NodeId,
}

impl Peer {
    fn of(cert: &shoal_session::NodeCert, addr: SocketAddr) -> Peer {
        Peer {
            name: cert.name.clone(),
            addr,
            node: crate::identity::node_id(&cert.static_key),
        }
    }
}

/// Handles what node `peer` sealed in its session: a heartbeat, which must
/// speak for `peer` itself, or news of revocations.
fn hear(
    shared: &Shared,
    state: &mut State,
    now: Time,
    peer: &Peer,
    plaintext: &[u8],
    replies: &mut Vec<(SocketAddr, Vec<u8>)>,
    lists: &mut Vec<(NodeMsg, Vec<u8>)>,
) {
    let addr = peer.addr;
    match NodeMsg::split(plaintext) {
        Some((NodeMsg::Packet, packet)) => hear_packet(shared, state, now, peer, packet),
        Some((NodeMsg::Revocations, version)) if version.len() == 8 => {
            let ours = shared.revocations.lock().clone();
            let reply = signed_news(version, ours, NodeMsg::RevocationList, || {
                revocation_version(shared)
            });
            replies.extend(reply.map(|m| (addr, m)));
        }
        Some((NodeMsg::Services, version)) if version.len() == 8 => {
            let ours = (shared.service_map.lock().as_ref()).map(|h| (h.version, h.bytes.clone()));
            let reply = signed_news(version, ours, NodeMsg::ServiceMap, || {
                service_map_version(shared)
            });
            replies.extend(reply.map(|m| (addr, m)));
        }
        // Taken once the state lock is released (they write a file).
        Some((kind @ (NodeMsg::RevocationList | NodeMsg::ServiceMap), signed)) => {
            lists.push((kind, signed.to_vec()))
        }
        Some((NodeMsg::Locate, plain)) => {
            state.stats.locates += 1;
            if let Some(answer) = crate::locate::answer(&state.registry, plain) {
                replies.push((addr, answer));
            }
        }
        Some((NodeMsg::Here, plain)) => {
            if !crate::locate::heard(shared, peer.node, addr, plain) {
                state.stats.dropped_stale += 1;
            }
        }
        _ => state.stats.dropped_malformed += 1,
    }
}

/// The answer to a peer that holds version `theirs` (8 bytes) of a
/// signed record of which this node holds `ours` (`gossip::answer`): the
/// record (tagged `record`), or this node's version (`mine`), or nothing.
fn signed_news(
    theirs: &[u8],
    ours: Option<(u64, Vec<u8>)>,
    record: NodeMsg,
    mine: impl FnOnce() -> Vec<u8>,
) -> Option<Vec<u8>> {
    let theirs = u64::from_le_bytes(theirs.try_into().expect("8 bytes"));
    match gossip::answer(theirs, ours.as_ref().map(|(v, b)| (*v, &b[..])))? {
        gossip::Answer::Record(bytes) => Some(record.with(bytes)),
        gossip::Answer::OurVersion => Some(mine()),
    }
}

/// The message telling a peer which revocation list this node holds.
fn revocation_version(shared: &Shared) -> Vec<u8> {
    let version = shared.revocations.lock().as_ref().map_or(0, |(v, _)| *v);
    NodeMsg::Revocations.with(&version.to_le_bytes())
}

/// The message telling a peer which service map this node holds.
fn service_map_version(shared: &Shared) -> Vec<u8> {
    NodeMsg::Services.with(&crate::service_map::version(shared).to_le_bytes())
}

/// A packet a node sealed in its session.
fn hear_packet(shared: &Shared, state: &mut State, now: Time, peer: &Peer, plaintext: &[u8]) {
    match decode_plain(plaintext) {
        // A node speaks only for itself: its name and id are its
        // certificate's.
        Ok(Packet::Heartbeat(h)) if h.name == peer.name && h.node == peer.node => {
            shared.names.learn(h.node, &h.name);
            state.membership.handle_heartbeat(now, &h)
        }
        Ok(Packet::Heartbeat(h)) => {
            tracing::warn!(session = %peer.name, claims = %h.name, id = %h.node, "heartbeat for another node");
            shared.forged_heartbeats.fetch_add(1, Ordering::Relaxed);
        }
        Ok(_) => state.stats.dropped_stale += 1,
        Err(e) => state.stats.count_wire_error(e),
    }
}

/// Seals `messages` in the sessions with their nodes (starting sessions
/// where needed) and, with `poll`, runs the table's timers: the datagrams
/// go to `out`, plaintexts the table opened meanwhile to `opened`.
fn seal(
    shared: &Shared,
    now: Time,
    messages: &[(SocketAddr, Vec<u8>)],
    poll: bool,
    out: &mut Vec<(SocketAddr, Vec<u8>)>,
    opened: &mut Vec<(Peer, Vec<u8>)>,
) {
    let mut sessions = shared.sessions.lock();
    let mut outputs = Vec::new();
    for (addr, m) in messages {
        sessions.send(now, *addr, m, &mut outputs);
    }
    if poll {
        sessions.poll(now, &mut outputs);
    }
    route(&sessions, outputs, out, opened);
}

/// Sorts the session table's outputs: datagrams to send, plaintexts to
/// handle (with the peer's name), and news for the log.
fn route(
    sessions: &Sessions,
    outputs: Vec<SessionOutput>,
    out: &mut Vec<(SocketAddr, Vec<u8>)>,
    opened: &mut Vec<(Peer, Vec<u8>)>,
) {
    for o in outputs {
        match o {
            SessionOutput::Send { to, datagram } => out.push((to, datagram)),
            SessionOutput::Deliver {
                index, plaintext, ..
            } => {
                if let Some((peer, addr, _)) = sessions.session(index) {
                    opened.push((Peer::of(peer, addr), plaintext));
                }
            }
            SessionOutput::Up { addr, name, serial } => {
                tracing::info!(%addr, %name, serial, "node session up")
            }
            SessionOutput::Refused { addr, why } => {
                tracing::warn!(%addr, "node session refused: {why}")
            }
        }
    }
}

/// Opens a start grant sealed for this node: the node that sealed it (the
/// other end of the session it names) and its plaintext.
fn open_grant(shared: &Shared, sealed: &[u8]) -> Result<(NodeId, Vec<u8>), String> {
    let index = shoal_session::grant::index(sealed).map_err(|e| e.to_string())?;
    let sessions = shared.sessions.lock();
    let (peer, root) = sessions
        .root_at(now(), index)
        .ok_or_else(|| format!("no session {index:08x} on this node"))?;
    let from = peer.map_or(shared.node, |cert| {
        crate::identity::node_id(&cert.static_key)
    });
    let plain = shoal_session::grant::open(&root, sealed).map_err(|e| e.to_string())?;
    Ok((from, plain))
}

fn service_loop(shared: &Shared, service: &Server) {
    while let Ok(request) = service.getreq() {
        let reply = match serde_json::from_slice::<NodeRequest>(request.body()) {
            Ok(NodeRequest::Status) => serde_json::to_vec(&shared.status()),
            Ok(NodeRequest::Procs { ended }) => {
                serde_json::to_vec(&crate::home::procs(shared, ended, request.caller()))
            }
            Ok(NodeRequest::Kill { id, signal }) => {
                let answer = match crate::home::may(shared, request.caller(), &id) {
                    Ok(()) => crate::home::kill(shared, &id, signal),
                    Err(message) => ProcAnswer::Error { message },
                };
                serde_json::to_vec(&answer)
            }
            Ok(NodeRequest::Wait { id, wait_ms }) => {
                let answer = match crate::home::may(shared, request.caller(), &id) {
                    Ok(()) => crate::home::wait(shared, &id, wait_ms),
                    Err(message) => ProcAnswer::Error { message },
                };
                serde_json::to_vec(&answer)
            }
            Ok(NodeRequest::Services) => serde_json::to_vec(&ServiceAnswer::Services {
                services: shared.services.list(),
            }),
            Ok(NodeRequest::ServiceCtl { name, action }) => {
                let answer = may_control(shared, request.caller())
                    .and_then(|()| shared.services.command(&name, command_of(action)))
                    .map_or_else(
                        |message| ServiceAnswer::Error { message },
                        |()| ServiceAnswer::Done,
                    );
                serde_json::to_vec(&answer)
            }
            Ok(NodeRequest::ServiceLogs { name, lines, from }) => {
                serde_json::to_vec(&service_logs(shared, request.caller(), &name, lines, from))
            }
            Err(e) => serde_json::to_vec(&serde_json::json!({ "error": e.to_string() })),
        }
        .expect("status serializes");
        if service.putrep(&request, reply).is_err() {
            break;
        }
    }
}

/// Whether `caller` may start, stop or restart this node's services:
/// root here, or root on another node when this one's `remote_root` is
/// `allow`.  Refusals are counted.
fn may_control(shared: &Shared, caller: shoal_rpc::Caller) -> Result<(), String> {
    let remote_ok = shared.config.remote_root == crate::RemoteRoot::Allow;
    if caller.uid == 0 && (caller.node == shared.node || remote_ok) {
        return Ok(());
    }
    shared.refused_services.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(node = %caller.node, uid = caller.uid, "service request refused");
    Err(if caller.uid == 0 {
        format!(
            "root on another node may not control {}'s services (its remote_root is squash)",
            shared.config.name
        )
    } else {
        format!(
            "only root may control {}'s services (you are uid {})",
            shared.config.name, caller.uid
        )
    })
}

fn command_of(action: ServiceAction) -> shoal_node::supervise::Command {
    match action {
        ServiceAction::Start => shoal_node::supervise::Command::Start,
        ServiceAction::Stop => shoal_node::supervise::Command::Stop,
        ServiceAction::Restart => shoal_node::supervise::Command::Restart,
    }
}

/// A service's log, for whoever may control it and its own user (not
/// root, who is whoever may control it).
fn service_logs(
    shared: &Shared,
    caller: shoal_rpc::Caller,
    name: &str,
    lines: u32,
    from: Option<u64>,
) -> ServiceAnswer {
    let Some((uid, log)) = shared.services.log(name) else {
        return ServiceAnswer::Error {
            message: format!("no service named {name:?} on {}", shared.config.name),
        };
    };
    // A service's own user reads its log from any node (a uid is one
    // user cluster-wide), but root's are read only as `may_control` says:
    // root on another node is not root here where remote root is squashed.
    let own = caller.uid == uid && uid != 0;
    if !own && let Err(message) = may_control(shared, caller) {
        return ServiceAnswer::Error { message };
    }
    let log = log.lock();
    let (text, end) = match from {
        Some(from) => log.since(from),
        None => log.tail(lines.clamp(1, 100_000) as usize),
    };
    ServiceAnswer::Logs { text, end }
}
