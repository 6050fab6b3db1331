//! The simulated cluster and its event loop.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_cap::GetPort;
use shoal_proto::{
    ClientConfig, ClientCore, Dest, Membership, MembershipConfig, Registry, ServerConfig,
    ServerCore, Time, Via,
};
use shoal_wire::{ClientId, Endpoint, Instance, NodeId, Packet, TxnId, decode_plain, encode_plain};

use crate::net::Faults;
use crate::seal::{Seals, Unopened};

mod check;
pub use check::Report;

const DAEMON_PORT: u16 = 7700;

/// Shape of one simulation run.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Nodes in the cluster.
    pub nodes: usize,
    /// Server endpoints on the one simulated port (more than one is a
    /// replicated service).
    pub servers: usize,
    /// Client endpoints, spread over the nodes.
    pub clients: usize,
    /// Transactions each client runs.
    pub txns_per_client: usize,
    /// Request bodies are 0 to this many bytes.
    pub max_body: usize,
    /// Fragment size, small so that bodies span many fragments.
    pub frag_bytes: usize,
    /// Fragments per window, clients.
    pub window: u32,
    /// Fragments per window, servers (peers need not agree).
    pub server_window: u32,
    /// Client records a server holds before it refuses new clients.
    pub server_max_records: usize,
    /// Largest request a server accepts.
    pub server_max_request: u64,
    /// Network behaviour until `fault_phase_us`; clean afterwards.
    pub faults: Faults,
    /// Length of the fault phase (microseconds of virtual time).
    pub fault_phase_us: u64,
    /// Crash, restart and move servers during the fault phase.
    pub crash_servers: bool,
    /// Take whole nodes down during the fault phase.
    pub crash_nodes: bool,
    /// Cut nodes off during the fault phase.
    pub partitions: bool,
    /// Deadline of every transaction.
    pub deadline_us: u64,
    /// Server execution time range (microseconds).
    pub service_us: (u64, u64),
    /// Client think time between transactions (microseconds).
    pub think_us: (u64, u64),
    /// How long a stopping server drains (microseconds); must exceed the
    /// client's first retransmission timeout plus the network's delay.
    pub drain_us: u64,
    /// How long a server keeps a caller's record after its last datagram
    /// (microseconds); must exceed the deadline.
    pub record_ttl_us: u64,
    /// Chance that a datagram between endpoints is captured and sent again
    /// after the server's records of it expired (a replay attack; drawn
    /// from a stream of its own, so the rest of a seed's run is as
    /// without it).
    pub replay: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            nodes: 4,
            servers: 2,
            clients: 4,
            txns_per_client: 25,
            max_body: 6_000,
            frag_bytes: 1_000,
            window: 4,
            server_window: 4,
            server_max_records: 64,
            server_max_request: 1 << 30,
            faults: Faults::harsh(),
            fault_phase_us: 3_000_000,
            crash_servers: true,
            crash_nodes: true,
            partitions: true,
            deadline_us: 2_000_000,
            service_us: (0, 20_000),
            think_us: (0, 50_000),
            drain_us: 200_000,
            record_ttl_us: 3_000_000,
            replay: 0.0,
        }
    }
}

/// How one transaction ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub txn: TxnId,
    pub started: Time,
    pub ended: Time,
    /// `Ok` or the error's stable code.
    pub result: Result<(), &'static str>,
}

#[derive(Debug)]
enum Event {
    Deliver {
        from: SocketAddr,
        to: SocketAddr,
        bytes: Vec<u8>,
    },
    Unreachable {
        to: SocketAddr,
        addr: SocketAddr,
    },
    Reply {
        server: usize,
        instance: Instance,
        caller: shoal_proto::Caller,
        txn: TxnId,
        body: Vec<u8>,
    },
    /// A draining server instance closes.
    Close {
        server: usize,
    },
    Fault(Fault),
    Heal,
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Stop a server (crash, or drain and stop); it comes back after a while.
    CrashServer {
        restart_after_us: u64,
        elsewhere: bool,
        graceful: bool,
    },
    /// Take a node down (no packets in or out, its servers die).
    CrashNode {
        node: usize,
        down_us: u64,
    },
    /// Cut a node off from all others for a while.
    Partition {
        node: usize,
        for_us: u64,
    },
    /// Bring a crashed server back.
    RestartServer {
        server: usize,
        node: usize,
    },
    NodeUp {
        node: usize,
    },
    Unpartition {
        node: usize,
    },
}

struct Node {
    ip: Ipv4Addr,
    /// Its id: a node's id is its static key's, so a restart keeps it.
    id: NodeId,
    up: bool,
    registry: Registry,
    membership: Membership,
}

/// One server instance (one incarnation of a logical server).
struct Server {
    node: usize,
    addr: SocketAddr,
    core: Option<ServerCore>,
}

/// A logical server: the instances that succeed each other as it crashes,
/// restarts and moves.
struct Logical {
    node: usize,
    current: Option<usize>,
}

struct Client {
    addr: SocketAddr,
    core: ClientCore,
    remaining: usize,
    next_start: Time,
    current: Option<(TxnId, Time, Vec<u8>, Time)>,
}

#[derive(Clone, Copy)]
enum Entity {
    Daemon(usize),
    Server(usize),
    Client(usize),
}

/// One simulated cluster.
pub struct Sim {
    seed: u64,
    config: SimConfig,
    rng: ChaCha8Rng,
    now: Time,
    port: shoal_cap::PutPort,
    nodes: Vec<Node>,
    servers: Vec<Server>,
    logical: Vec<Logical>,
    clients: Vec<Client>,
    entities: HashMap<SocketAddr, Entity>,
    queue: BinaryHeap<Reverse<(Time, u64)>>,
    events: HashMap<u64, Event>,
    next_event: u64,
    next_port: u16,
    faults: Faults,
    cut: Vec<bool>,
    healed_at: Option<Time>,
    /// Executions per transaction, over every server instance ever.
    executions: BTreeMap<TxnId, u32>,
    /// What each transaction sent.
    requests: BTreeMap<TxnId, Vec<u8>>,
    outcomes: Vec<Outcome>,
    violations: Vec<String>,
    trace: Option<Vec<String>>,
    /// Every endpoint channel, sealed and opened by the real session code.
    seals: Seals,
    /// Draws replays apart from everything else.
    replay_rng: ChaCha8Rng,
}

impl Sim {
    /// A cluster built from `seed`; nothing has happened yet.
    pub fn new(seed: u64, config: SimConfig) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // (Drawn, though datagrams are no longer sealed here, so that each
        // seed replays the cluster it always did.)
        let _: [u8; 32] = rng.random();
        let port = GetPort::from_bytes(rng.random()).put_port();
        let nodes: Vec<Node> = (0..config.nodes)
            .map(|i| {
                let ip = Ipv4Addr::new(10, 0, 0, i as u8 + 1);
                let addr = SocketAddr::new(IpAddr::V4(ip), DAEMON_PORT);
                let id = NodeId(rng.random());
                let seeds = vec![SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                    DAEMON_PORT,
                )];
                Node {
                    ip,
                    id,
                    up: true,
                    registry: Registry::new(id),
                    membership: Membership::new(
                        id,
                        format!("n{}", i + 1),
                        addr,
                        rng.random(),
                        seeds,
                        MembershipConfig::default(),
                    ),
                }
            })
            .collect();
        let mut sim = Self {
            seed,
            faults: config.faults.clone(),
            cut: vec![false; config.nodes],
            config,
            rng,
            now: Time(0),
            port,
            nodes,
            servers: Vec::new(),
            logical: Vec::new(),
            clients: Vec::new(),
            entities: HashMap::new(),
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            next_event: 0,
            next_port: 20_000,
            healed_at: None,
            executions: BTreeMap::new(),
            requests: BTreeMap::new(),
            outcomes: Vec::new(),
            violations: Vec::new(),
            trace: std::env::var_os("SHOAL_SIM_TRACE").map(|_| Vec::new()),
            seals: Seals::new(seed, port),
            replay_rng: ChaCha8Rng::seed_from_u64(seed ^ 0x7265_706c_6179),
        };
        for i in 0..sim.nodes.len() {
            sim.entities.insert(sim.daemon_addr(i), Entity::Daemon(i));
        }
        for s in 0..sim.config.servers {
            let node = s % sim.config.nodes;
            sim.logical.push(Logical {
                node,
                current: None,
            });
            sim.start_server(s, node);
        }
        let client_config = ClientConfig {
            frag_bytes: sim.config.frag_bytes,
            window: sim.config.window,
            ..ClientConfig::default()
        };
        for c in 0..sim.config.clients {
            let node = c % sim.config.nodes;
            let addr = SocketAddr::new(IpAddr::V4(sim.nodes[node].ip), 30_000 + c as u16);
            let id = ClientId(sim.rng.random::<u64>() | 1);
            sim.entities.insert(addr, Entity::Client(c));
            sim.clients.push(Client {
                addr,
                core: ClientCore::new(id, client_config.clone()),
                remaining: sim.config.txns_per_client,
                next_start: Time(sim.rng.random_range(0..10_000)),
                current: None,
            });
        }
        sim.schedule_faults();
        let heal = Time(sim.config.fault_phase_us);
        sim.schedule(heal, Event::Heal);
        sim
    }

    /// Runs until every client finished its script, then checks the
    /// promises.  `Err` describes the first broken one, with the seed.
    pub fn run(&mut self) -> Result<Report, String> {
        let limit = Time(self.config.fault_phase_us + 600_000_000);
        while self
            .clients
            .iter()
            .any(|c| c.remaining > 0 || c.current.is_some())
        {
            if self.now > limit {
                self.violations
                    .push("simulation did not finish (livelock)".into());
                break;
            }
            self.step();
            if !self.violations.is_empty() {
                break;
            }
        }
        self.check()
    }

    /// Runs until `until` holds or the clients are done; returns whether
    /// `until` held.
    pub fn run_until(&mut self, mut until: impl FnMut(&Sim) -> bool) -> bool {
        while self
            .clients
            .iter()
            .any(|c| c.remaining > 0 || c.current.is_some())
        {
            if until(self) {
                return true;
            }
            self.step();
        }
        until(self)
    }

    /// Every finished transaction so far.
    pub fn outcomes(&self) -> &[Outcome] {
        &self.outcomes
    }

    /// Whether client `c` is in a transaction.
    pub fn client_busy(&self, c: usize) -> bool {
        self.clients[c].current.is_some()
    }

    /// Stops server `s` (draining) and starts it again on `node`, as an
    /// operator moving a service would.
    pub fn move_server(&mut self, s: usize, node: usize) {
        self.stop_server(s);
        self.start_server(s, node);
    }

    /// The recorded trace (when `SHOAL_SIM_TRACE` is set).
    pub fn trace(&self) -> &[String] {
        self.trace.as_deref().unwrap_or(&[])
    }

    fn log(&mut self, what: impl FnOnce() -> String) {
        if let Some(t) = &mut self.trace {
            t.push(format!("{:>12} {}", self.now.0, what()));
        }
    }

    fn daemon_addr(&self, node: usize) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.nodes[node].ip), DAEMON_PORT)
    }

    fn node_of(&self, addr: SocketAddr) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| IpAddr::V4(n.ip) == addr.ip())
    }

    fn schedule(&mut self, at: Time, event: Event) {
        let id = self.next_event;
        self.next_event += 1;
        self.events.insert(id, event);
        self.queue.push(Reverse((at, id)));
    }

    fn schedule_faults(&mut self) {
        let phase = self.config.fault_phase_us;
        let mut t = 0;
        loop {
            t += self.rng.random_range(100_000..600_000);
            if t >= phase {
                break;
            }
            let kind = self.rng.random_range(0..3);
            let fault = match kind {
                0 if self.config.crash_servers => Fault::CrashServer {
                    restart_after_us: self.rng.random_range(0..800_000),
                    elsewhere: self.rng.random_bool(0.5),
                    graceful: self.rng.random_bool(0.5),
                },
                1 if self.config.crash_nodes => Fault::CrashNode {
                    node: self.rng.random_range(0..self.config.nodes),
                    down_us: self.rng.random_range(100_000..1_000_000),
                },
                2 if self.config.partitions => Fault::Partition {
                    node: self.rng.random_range(0..self.config.nodes),
                    for_us: self.rng.random_range(100_000..1_000_000),
                },
                _ => continue,
            };
            self.schedule(Time(t), Event::Fault(fault));
        }
    }

    /// Starts logical server `s` on `node` as a new instance; at its old
    /// address if it stays on the same node and the address is free.
    fn start_server(&mut self, s: usize, node: usize) {
        // A fresh port, as a real server binds port 0: an instance that
        // took over its predecessor's address could not open what was
        // sealed for it, so could not refuse it (`NotHere`) either.
        self.next_port += 1;
        let addr = SocketAddr::new(IpAddr::V4(self.nodes[node].ip), self.next_port);
        let instance = Instance(self.rng.random::<u64>() | 1);
        let config = ServerConfig {
            frag_bytes: self.config.frag_bytes,
            window: self.config.server_window,
            max_records: self.config.server_max_records,
            max_request_bytes: self.config.server_max_request,
            record_ttl: Duration::from_micros(self.config.record_ttl_us),
            ..ServerConfig::default()
        };
        let i = self.servers.len();
        self.servers.push(Server {
            node,
            addr,
            core: Some(ServerCore::new(self.port, instance, config)),
        });
        self.logical[s] = Logical {
            node,
            current: Some(i),
        };
        self.entities.insert(addr, Entity::Server(i));
        self.nodes[node]
            .registry
            .register(
                self.port,
                Endpoint {
                    addr,
                    instance,
                    uid: 0,
                    system: false,
                },
            )
            .expect("every incarnation is a fresh instance");
        self.log(|| format!("server {s} up on node {node} at {addr} as {instance}"));
    }

    /// Logical server `s` crashes: its instance is gone at once.
    fn kill_server(&mut self, s: usize) {
        if let Some(i) = self.logical[s].current.take() {
            self.kill_instance(i);
        }
    }

    fn kill_instance(&mut self, i: usize) {
        let Some(core) = self.servers[i].core.take() else {
            return;
        };
        let (node, addr) = (self.servers[i].node, self.servers[i].addr);
        self.nodes[node]
            .registry
            .deregister(self.port, core.instance());
        self.entities.remove(&addr);
        self.log(|| format!("instance {} killed at {addr}", core.instance()));
    }

    /// Logical server `s` stops on purpose: it drains, then closes.
    fn stop_server(&mut self, s: usize) {
        let Some(i) = self.logical[s].current.take() else {
            return;
        };
        let node = self.servers[i].node;
        let core = self.servers[i]
            .core
            .as_mut()
            .expect("current instance is alive");
        core.drain();
        let instance = core.instance();
        self.nodes[node].registry.deregister(self.port, instance);
        let at = self.now + Duration::from_micros(self.config.drain_us);
        self.schedule(at, Event::Close { server: i });
        self.log(|| format!("instance {instance} draining"));
    }

    fn next_timer(&self) -> Option<Time> {
        let clients = self.clients.iter().filter_map(|c| c.core.poll_timeout());
        let starts = self
            .clients
            .iter()
            .filter(|c| c.current.is_none() && c.remaining > 0)
            .map(|c| c.next_start);
        let servers = self
            .servers
            .iter()
            .filter_map(|s| s.core.as_ref().map(ServerCore::poll_timeout));
        let members = self
            .nodes
            .iter()
            .filter(|n| n.up)
            .map(|n| n.membership.poll_timeout());
        clients.chain(starts).chain(servers).chain(members).min()
    }

    fn step(&mut self) {
        let timer = self.next_timer();
        let event_at = self.queue.peek().map(|Reverse((t, _))| *t);
        match (timer, event_at) {
            (Some(t), e) if e.is_none_or(|e| t <= e) => {
                self.now = self.now.max(t);
                self.fire_timers();
            }
            (_, Some(_)) => {
                let Reverse((t, id)) = self.queue.pop().expect("peeked");
                self.now = self.now.max(t);
                let event = self.events.remove(&id).expect("scheduled");
                self.handle_event(event);
            }
            (Some(t), None) => {
                self.now = self.now.max(t);
                self.fire_timers();
            }
            (None, None) => {}
        }
        self.flush();
    }

    fn fire_timers(&mut self) {
        let now = self.now;
        for c in 0..self.clients.len() {
            let client = &mut self.clients[c];
            if client.core.poll_timeout().is_some_and(|t| t <= now) {
                client.core.handle_timeout(now);
                self.collect_outcome(c);
            }
            let client = &mut self.clients[c];
            if client.current.is_none() && client.remaining > 0 && client.next_start <= now {
                self.start_txn(c);
            }
        }
        for s in &mut self.servers {
            if let Some(core) = &mut s.core
                && core.poll_timeout() <= now
            {
                core.handle_timeout(now);
            }
        }
        for n in &mut self.nodes {
            if n.up && n.membership.poll_timeout() <= now {
                n.membership.handle_timeout(now);
            }
        }
    }

    fn start_txn(&mut self, c: usize) {
        let len = self.rng.random_range(0..=self.config.max_body);
        let body: Vec<u8> = (0..len).map(|_| self.rng.random()).collect();
        let deadline = self.now + Duration::from_micros(self.config.deadline_us);
        let client = &mut self.clients[c];
        client.remaining -= 1;
        let txn = client
            .core
            .start(self.now, self.port, Bytes::from(body.clone()), deadline);
        client.current = Some((txn, self.now, body.clone(), deadline));
        self.requests.insert(txn, body);
        self.log(|| format!("client {c} starts {txn} ({len} bytes)"));
        self.collect_outcome(c);
    }

    fn collect_outcome(&mut self, c: usize) {
        let Some(result) = self.clients[c].core.poll_outcome() else {
            return;
        };
        let (txn, started, body, deadline) = self.clients[c].current.take().expect("in a txn");
        let result = match result {
            Ok(reply) => {
                let mut expect = body;
                expect.reverse();
                if reply != expect {
                    self.violations
                        .push(format!("{txn}: reply does not match the request"));
                }
                Ok(())
            }
            Err(e) => Err(e.code()),
        };
        if self.now > deadline {
            self.violations
                .push(format!("{txn} ended after its deadline"));
        }
        self.log(|| format!("client {c} ends {txn}: {result:?}"));
        self.outcomes.push(Outcome {
            txn,
            started,
            ended: self.now,
            result,
        });
        let (lo, hi) = self.config.think_us;
        let think = self.rng.random_range(lo..=hi);
        self.clients[c].next_start = self.now + Duration::from_micros(think);
    }

    fn handle_event(&mut self, event: Event) {
        match event {
            Event::Deliver { from, to, bytes } => self.deliver(from, to, &bytes),
            Event::Unreachable { to, addr } => {
                if let Some(Entity::Client(c)) = self.entities.get(&to).copied() {
                    self.clients[c].core.handle_unreachable(self.now, addr);
                    self.collect_outcome(c);
                }
            }
            Event::Reply {
                server,
                instance,
                caller,
                txn,
                body,
            } => {
                if let Some(core) = &mut self.servers[server].core
                    && core.instance() == instance
                {
                    core.reply(self.now, caller, txn, Bytes::from(body));
                }
            }
            Event::Close { server } => {
                let node = self.servers[server].node;
                if let Some(core) = &self.servers[server].core {
                    let instance = core.instance();
                    self.kill_instance(server);
                    if self.nodes[node].up {
                        self.nodes[node].registry.drained(instance);
                    }
                }
            }
            Event::Fault(f) => self.fault(f),
            Event::Heal => self.heal(),
        }
    }

    fn fault(&mut self, fault: Fault) {
        self.log(|| format!("fault {fault:?}"));
        match fault {
            Fault::CrashServer {
                restart_after_us,
                elsewhere,
                graceful,
            } => {
                let s = self.rng.random_range(0..self.logical.len());
                if self.logical[s].current.is_none() {
                    return;
                }
                let old = self.logical[s].node;
                if graceful {
                    self.stop_server(s);
                } else {
                    self.kill_server(s);
                }
                let node = if elsewhere {
                    self.rng.random_range(0..self.nodes.len())
                } else {
                    old
                };
                let at = self.now + Duration::from_micros(restart_after_us);
                self.schedule(at, Event::Fault(Fault::RestartServer { server: s, node }));
            }
            Fault::RestartServer { server, node } => {
                if self.logical[server].current.is_none() && self.nodes[node].up {
                    self.start_server(server, node);
                }
            }
            Fault::CrashNode { node, down_us } => {
                if !self.nodes[node].up {
                    return;
                }
                self.nodes[node].up = false;
                for s in 0..self.logical.len() {
                    if self.logical[s].node == node {
                        self.logical[s].current = None;
                    }
                }
                for i in 0..self.servers.len() {
                    if self.servers[i].node == node {
                        self.kill_instance(i);
                    }
                }
                let at = self.now + Duration::from_micros(down_us);
                self.schedule(at, Event::Fault(Fault::NodeUp { node }));
            }
            Fault::NodeUp { node } => self.node_up(node),
            Fault::Partition { node, for_us } => {
                self.cut[node] = true;
                let at = self.now + Duration::from_micros(for_us);
                self.schedule(at, Event::Fault(Fault::Unpartition { node }));
            }
            Fault::Unpartition { node } => self.cut[node] = false,
        }
    }

    fn node_up(&mut self, node: usize) {
        if self.nodes[node].up {
            return;
        }
        // A restarted daemon knows nothing: a fresh registry and membership
        // (its id, its key's, is the same; the draw keeps seeds replaying).
        let _: u64 = self.rng.random();
        let id = self.nodes[node].id;
        let addr = self.daemon_addr(node);
        let seeds = vec![self.daemon_addr(0)];
        let n = &mut self.nodes[node];
        n.registry = Registry::new(id);
        n.membership = Membership::new(
            id,
            format!("n{}", node + 1),
            addr,
            self.rng.random(),
            seeds,
            MembershipConfig::default(),
        );
        self.nodes[node].up = true;
        self.log(|| format!("node {node} up"));
    }

    fn heal(&mut self) {
        self.log(|| "heal".to_string());
        self.faults = Faults::none();
        self.cut.iter_mut().for_each(|c| *c = false);
        for node in 0..self.nodes.len() {
            self.node_up(node);
        }
        for s in 0..self.logical.len() {
            if self.logical[s].current.is_none() {
                let node = self.logical[s].node;
                self.start_server(s, node);
            }
        }
        self.healed_at = Some(self.now);
    }

    fn reachable(&self, from: SocketAddr, to: SocketAddr) -> bool {
        match (self.node_of(from), self.node_of(to)) {
            (Some(a), Some(b)) => {
                self.nodes[a].up && self.nodes[b].up && (a == b || (!self.cut[a] && !self.cut[b]))
            }
            _ => false,
        }
    }

    fn send(&mut self, from: SocketAddr, to: SocketAddr, bytes: Vec<u8>) {
        if !self.reachable(from, to) {
            return;
        }
        let delays = self.faults.verdict(&mut self.rng);
        for d in delays {
            let at = self.now + Duration::from_micros(d);
            self.schedule(
                at,
                Event::Deliver {
                    from,
                    to,
                    bytes: bytes.clone(),
                },
            );
        }
        let endpoints = !matches!(self.entities.get(&to), Some(Entity::Daemon(_)) | None)
            && !matches!(self.entities.get(&from), Some(Entity::Daemon(_)));
        if endpoints && self.config.replay > 0.0 && self.replay_rng.random_bool(self.config.replay)
        {
            // Captured, and sent again once the server has forgotten it.
            let later =
                self.config.record_ttl_us + self.replay_rng.random_range(500_000..2_000_000);
            let at = self.now + Duration::from_micros(later);
            self.schedule(at, Event::Deliver { from, to, bytes });
        }
    }

    fn flush(&mut self) {
        let mut out = Vec::new();
        let nodes = &self.nodes;
        let node_index = |addr: SocketAddr| {
            nodes
                .iter()
                .position(|n| IpAddr::V4(n.ip) == addr.ip())
                .unwrap_or(0)
        };
        for c in &mut self.clients {
            while let Some(t) = c.core.poll_transmit() {
                let (dest, via) = (t.dest, t.via);
                let bytes = t.into_plain();
                match dest {
                    Dest::Addr(a) => {
                        let Via::Server(instance) = via else { continue };
                        let node = node_index(c.addr) as u32;
                        let sealed = self
                            .seals
                            .seal_to_server(c.core.id(), node, instance, &bytes);
                        out.push((c.addr, a, sealed));
                    }
                    Dest::Nodes => {
                        for i in 0..self.nodes.len() {
                            let a = SocketAddr::new(IpAddr::V4(self.nodes[i].ip), DAEMON_PORT);
                            out.push((c.addr, a, bytes.clone()));
                        }
                    }
                    Dest::Node(id) => {
                        if let Some(n) = self.nodes.iter().find(|n| n.id == id) {
                            let a = SocketAddr::new(IpAddr::V4(n.ip), DAEMON_PORT);
                            out.push((c.addr, a, bytes));
                        }
                    }
                }
            }
        }
        for s in &mut self.servers {
            if let Some(core) = &mut s.core {
                while let Some(t) = core.poll_transmit() {
                    if let (Dest::Addr(a), Via::Client { caller, channel }) = (t.dest, t.via) {
                        let instance = core.instance();
                        let plain = t.into_plain();
                        if let Some(sealed) =
                            self.seals.seal_to_client(instance, channel, caller, &plain)
                        {
                            out.push((s.addr, a, sealed));
                        }
                    }
                }
            }
        }
        for i in 0..self.nodes.len() {
            let from = self.daemon_addr(i);
            while let Some(t) = self.nodes[i].membership.poll_transmit() {
                if let Dest::Addr(a) = t.dest {
                    out.push((from, a, t.bytes));
                }
            }
        }
        for (from, to, bytes) in out {
            self.send(from, to, bytes);
        }
    }

    fn deliver(&mut self, from: SocketAddr, to: SocketAddr, bytes: &[u8]) {
        // Conditions may have changed while the datagram was in flight.
        if !self.reachable(from, to) {
            return;
        }
        let now = self.now;
        match self.entities.get(&to).copied() {
            Some(Entity::Daemon(n)) => {
                let node = &mut self.nodes[n];
                match decode_plain(bytes) {
                    Ok(Packet::Locate(l)) => {
                        if let Some(here) = node.registry.handle_locate(&l) {
                            let mut plain = Vec::new();
                            encode_plain(&Packet::Here(here), &mut plain);
                            self.send(to, from, plain);
                        }
                    }
                    Ok(Packet::Heartbeat(h)) => node.membership.handle_heartbeat(now, &h),
                    _ => {}
                }
            }
            Some(Entity::Server(s)) => {
                let server = &mut self.servers[s];
                let Some(core) = &mut server.core else { return };
                let instance = core.instance();
                let ids: Vec<NodeId> = self.nodes.iter().map(|n| n.id).collect();
                match self.seals.open_at_server(instance, &ids, bytes) {
                    Ok((caller, channel, plain)) => {
                        core.handle_packet(now, from, caller, channel, decode_plain(&plain))
                    }
                    Err(Unopened::Replayed) => core.handle_unopened(true),
                    Err(Unopened::Bad) => core.handle_unopened(false),
                }
                let mut delivered = Vec::new();
                while let Some(req) = core.poll_request() {
                    delivered.push(req);
                }
                for req in delivered {
                    let runs = self.executions.entry(req.txn).or_default();
                    *runs += 1;
                    if *runs > 1 {
                        self.violations.push(format!(
                            "at-most-once broken: {} executed {} times",
                            req.txn, runs
                        ));
                    }
                    if self.requests.get(&req.txn) != Some(&req.body) {
                        self.violations
                            .push(format!("{} delivered a body that was not sent", req.txn));
                    }
                    let mut body = req.body;
                    body.reverse();
                    let (lo, hi) = self.config.service_us;
                    let at = now + Duration::from_micros(self.rng.random_range(lo..=hi));
                    self.log(|| format!("server {s} executes {}", req.txn));
                    self.schedule(
                        at,
                        Event::Reply {
                            server: s,
                            instance,
                            caller: req.caller,
                            txn: req.txn,
                            body,
                        },
                    );
                }
            }
            Some(Entity::Client(c)) => {
                let core = &mut self.clients[c].core;
                if bytes.starts_with(b"SH") {
                    match self.seals.open_at_client(core.id(), bytes) {
                        Ok((sender, plain)) => core.handle_sealed(now, from, sender, &plain),
                        Err(Unopened::Replayed) => core.handle_unopened(true),
                        Err(Unopened::Bad) => core.handle_unopened(false),
                    }
                } else {
                    // From a daemon: locate answers, plaintexts.
                    core.handle_datagram(now, from, bytes);
                }
                self.collect_outcome(c);
            }
            None => {
                // A closed port on a live node: the kernel says so (and the
                // ICMP itself may be lost).
                if self.node_of(to).is_some() {
                    let delays = self.faults.verdict(&mut self.rng);
                    if let Some(d) = delays.first() {
                        let at = now + Duration::from_micros(*d);
                        self.schedule(at, Event::Unreachable { to: from, addr: to });
                    }
                }
            }
        }
    }
}
