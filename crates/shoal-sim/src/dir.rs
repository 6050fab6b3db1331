//! Simulation of the replicated directory service: every replica runs the
//! real group core (`GroupCore`) and the real replica decisions
//! (`shoal_dir::replica`: applying group messages, answering reads,
//! durability, the forming rule) over a simulated disk whose unsynced
//! bytes are lost — or torn — in a crash; clients run the client
//! library's retry rules (same request number, another replica, their
//! highest seen index) over a network that loses, duplicates and reorders.
//!
//! Faults: replica crashes and restarts (recovering from the simulated
//! disk with `shoal_dir::log::recover`), every replica at once (the `fsync`
//! mode), partitions, pauses (SIGSTOP: the process holds its datagrams and
//! timers, then runs them late), and network faults.  Checkers
//! ([`DirReport::violations`] names the broken one):
//!
//! - `linearizable`: the clients' history (appends, deletes, replaces,
//!   atomic moves, linearizable lookups, and final lookups of every name
//!   after the faults) is linearizable (Wing–Gong search, [`crate::linearize`]);
//!   so every acknowledged update survives recovery and an install is all
//!   or nothing;
//! - `replica_agreement`: replicas at the same index hold the same state;
//! - `liveness`: after the faults stop, the replicas form one group and
//!   every client operation completes.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_cap::{Capability, GetPort, PutPort};
use shoal_dir::log;
use shoal_dir::op::FLAG_LINEARIZABLE;
use shoal_dir::replica::{
    Durability, Formation, PeerStatus, Phase, ReplicaState, STUCK_AFTER_US, Stuck, behind, decide,
    encode_entry, group_tag, when_stuck,
};
use shoal_dir::{Answer, DirError, DirState, Op, Request, Response};
use shoal_group::{Event, GroupConfig, GroupCore, GroupDest, MemberEntry, MemberId, Status};
use shoal_proto::Time;
use shoal_wire::ClusterKey;

use crate::linearize::{self, CheckResult, Model, Operation};
use crate::net::Faults;
use crate::timeline::Timeline;

// ---- the model the history is checked against ----------------------------

pub use shoal_dir::history::{Input as DirInput, Output as DirOutput, op_for, output_of};

/// The directory as a map from names to values, for the checker
/// (`shoal_dir::history::step` is the specification).
pub struct DirModel {
    pub names: usize,
}

impl Model for DirModel {
    type State = Vec<Option<u64>>;
    type Input = DirInput;
    type Output = DirOutput;

    fn init(&self) -> Self::State {
        vec![None; self.names]
    }

    fn step(
        &self,
        state: &Self::State,
        input: &DirInput,
        output: &DirOutput,
    ) -> Option<Self::State> {
        let (out, next) = shoal_dir::history::step(state, input);
        (out == *output).then_some(next)
    }

    fn step_unknown(&self, state: &Self::State, input: &DirInput) -> Option<Self::State> {
        Some(shoal_dir::history::step(state, input).1)
    }
}

// ---- the simulation ------------------------------------------------------

/// Shape of one directory simulation.
#[derive(Debug, Clone)]
pub struct DirSimConfig {
    pub replicas: usize,
    pub resilience: usize,
    pub durability: Durability,
    pub clients: usize,
    pub ops_per_client: usize,
    /// Names in the test directory.
    pub names: usize,
    /// Network behaviour during the fault phase; clean afterwards.
    pub faults: Faults,
    pub fault_phase_us: u64,
    /// Single replica crashes (each restarts later).
    pub crashes: usize,
    /// Times every replica crashes at once (then they all restart).
    pub total_crashes: usize,
    /// Cut one replica off for a while.
    pub partition: bool,
    /// Pause one replica for a while (SIGSTOP).
    pub pause: bool,
    /// Time after the faults for everything to settle.
    pub settle_us: u64,
    /// Log flush interval of the replicated mode.
    pub flush_us: u64,
    /// Log size that triggers a snapshot.
    pub snapshot_bytes: usize,
}

impl Default for DirSimConfig {
    fn default() -> Self {
        Self {
            replicas: 3,
            resilience: 2,
            durability: Durability::Fsync,
            clients: 3,
            ops_per_client: 25,
            names: 3,
            faults: Faults::harsh(),
            fault_phase_us: 3_000_000,
            crashes: 0,
            total_crashes: 0,
            partition: false,
            pause: false,
            settle_us: 10_000_000,
            flush_us: 200_000,
            snapshot_bytes: 2_048,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct DirReport {
    pub violations: Vec<String>,
    /// Operations with a known outcome.
    pub ops_ok: usize,
    /// Operations whose outcome the client never learned.
    pub ops_unknown: usize,
    /// Highest group generation formed.
    pub generations: u64,
    /// Append/delete pairs that cancelled in a log buffer.
    pub cancelled_pairs: u64,
    /// Snapshots taken.
    pub snapshots: u64,
}

#[derive(Debug)]
enum Ev {
    /// A group datagram.
    Datagram {
        to: usize,
        from: SocketAddr,
        bytes: Vec<u8>,
    },
    /// A client request reaching a replica.
    Request {
        to: usize,
        client: usize,
        op: u64,
        body: Vec<u8>,
    },
    /// A replica's answer reaching a client.
    Reply {
        client: usize,
        op: u64,
        body: Vec<u8>,
    },
    Tick {
        r: usize,
    },
    Form {
        r: usize,
    },
    Flush {
        r: usize,
    },
    Synced {
        r: usize,
        boot: u64,
        len: usize,
        index: u64,
    },
    ClientTick {
        c: usize,
    },
    Crash {
        r: Option<usize>,
    },
    Restart {
        r: usize,
    },
    Partition {
        r: usize,
        on: bool,
    },
    Pause {
        r: usize,
        on: bool,
    },
    Heal,
}

/// The simulated disk of one replica.
#[derive(Debug, Clone, Default)]
struct Disk {
    snapshot: Option<Vec<u8>>,
    /// (base, bytes, bytes known synced).
    logs: Vec<(u64, Vec<u8>, usize)>,
    generation: u64,
}

#[derive(Debug, Clone, Copy)]
enum Waiting {
    Write,
    /// A linearizable read waiting for its no-op.
    Sync,
}

#[derive(Debug, Clone)]
struct Pending {
    client: usize,
    op: u64,
    req: Request,
    kind: Waiting,
}

struct Rep {
    addr: SocketAddr,
    alive: bool,
    boot: u64,
    cut: bool,
    paused: bool,
    held: Vec<Ev>,
    core: Option<GroupCore>,
    generation: u64,
    phase: Phase,
    joined_at: Time,
    /// Since when the group core has not been normal.
    abnormal_since: Option<Time>,
    rs: ReplicaState,
    origin: u64,
    disk: Disk,
    durable: u64,
    syncing: bool,
    by_msg: BTreeMap<u64, Pending>,
    by_seq: BTreeMap<u64, Pending>,
    results: BTreeMap<u64, Response>,
    for_disk: Vec<(u64, Pending, Response)>,
    for_index: Vec<(Time, Pending)>,
    scheduled: Option<Time>,
}

struct Cli {
    id: u64,
    seq: u64,
    seen: u64,
    left: usize,
    target: usize,
    next_op: u64,
    /// (op id, request body, input, history index, give-up time)
    current: Option<(u64, Vec<u8>, DirInput, usize, Time)>,
    retry_at: Option<Time>,
    last: BTreeMap<u8, u64>,
    /// Final lookups done (client 0 looks every name up after the faults).
    finals: usize,
}

/// A seeded simulation of the directory service.
pub struct DirSim {
    cfg: DirSimConfig,
    rng: ChaCha8Rng,
    key: ClusterKey,
    port: PutPort,
    dir: Capability,
    now: Time,
    timeline: Timeline<Ev>,
    reps: Vec<Rep>,
    clis: Vec<Cli>,
    faults_on: bool,
    history: Vec<Operation<DirInput, DirOutput>>,
    report: DirReport,
    trace: Vec<String>,
    tracing: bool,
}

const CLIENT_TIMEOUT_US: u64 = 300_000;
const GIVE_UP_US: u64 = 6_000_000;
const CATCH_UP_US: u64 = 1_000_000;

fn group_port(key: &ClusterKey, generation: u64) -> PutPort {
    GetPort::derive(key.as_bytes(), &format!("dirsim group {generation}")).put_port()
}

impl DirSim {
    pub fn new(seed: u64, cfg: DirSimConfig) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let key = ClusterKey::from_bytes(rng.random());
        let port = GetPort::from_bytes(rng.random()).put_port();
        // Every replica starts from the same snapshot: one directory.
        let mut state = DirState::new(port);
        let mk = Request {
            client: 1,
            seq: 1,
            min_index: 0,
            flags: 0,
            op: Op::CreateDir {
                columns: vec![b"owner".to_vec()],
                secret: rng.random(),
            },
        };
        let dir = match state.apply(&mk).response().result {
            Ok(Answer::Cap(c)) => c,
            ref r => panic!("create: {r:?}"),
        };
        let snapshot = state.encode_snapshot();
        let reps = (0..cfg.replicas)
            .map(|i| Rep {
                addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1, 0, 1 + i as u8)), 7000),
                alive: true,
                boot: 0,
                cut: false,
                paused: false,
                held: Vec::new(),
                core: None,
                generation: 0,
                phase: Phase::Forming,
                joined_at: Time(0),
                abnormal_since: None,
                rs: ReplicaState::new(state.clone()),
                origin: rng.random::<u64>() | 1,
                disk: Disk {
                    snapshot: Some(snapshot.clone()),
                    logs: vec![(1, log::header(1).to_vec(), log::LOG_HEADER)],
                    generation: 0,
                },
                durable: 1,
                syncing: false,
                by_msg: BTreeMap::new(),
                by_seq: BTreeMap::new(),
                results: BTreeMap::new(),
                for_disk: Vec::new(),
                for_index: Vec::new(),
                scheduled: None,
            })
            .collect();
        let clis = (0..cfg.clients)
            .map(|c| Cli {
                id: 1000 + c as u64,
                seq: 0,
                seen: 0,
                left: cfg.ops_per_client,
                target: c % cfg.replicas,
                next_op: 0,
                current: None,
                retry_at: None,
                last: BTreeMap::new(),
                finals: 0,
            })
            .collect();
        let mut sim = DirSim {
            cfg,
            rng,
            key,
            port,
            dir,
            now: Time(0),
            timeline: Timeline::new(),
            reps,
            clis,
            faults_on: true,
            history: Vec::new(),
            report: DirReport::default(),
            trace: Vec::new(),
            tracing: std::env::var_os("SHOAL_SIM_TRACE").is_some(),
        };
        sim.setup();
        sim
    }

    /// The event trace (with `SHOAL_SIM_TRACE` set).
    pub fn trace(&self) -> &[String] {
        &self.trace
    }

    /// The clients' history.
    pub fn history(&self) -> &[Operation<DirInput, DirOutput>] {
        &self.history
    }

    fn setup(&mut self) {
        for r in 0..self.reps.len() {
            self.at(Time(1_000 + r as u64 * 7_000), Ev::Form { r });
            if self.cfg.durability == Durability::Replicated {
                self.at(Time(self.cfg.flush_us), Ev::Flush { r });
            }
        }
        // Clients start once the group has formed.
        for c in 0..self.clis.len() {
            self.at(Time(400_000 + c as u64 * 1_000), Ev::ClientTick { c });
        }
        let start = 500_000;
        let end = start + self.cfg.fault_phase_us;
        for _ in 0..self.cfg.crashes {
            let t = self.rng.random_range(start..end);
            self.at(Time(t), Ev::Crash { r: None });
        }
        for _ in 0..self.cfg.total_crashes {
            let t = self.rng.random_range(start..end);
            for r in 0..self.reps.len() {
                self.at(Time(t), Ev::Crash { r: Some(r) });
            }
        }
        if self.cfg.partition {
            let r = self.rng.random_range(0..self.reps.len());
            let t = self.rng.random_range(start..end);
            let len = self.rng.random_range(100_000..1_500_000);
            self.at(Time(t), Ev::Partition { r, on: true });
            self.at(Time((t + len).min(end)), Ev::Partition { r, on: false });
        }
        if self.cfg.pause {
            let r = self.rng.random_range(0..self.reps.len());
            let t = self.rng.random_range(start..end);
            let len = self.rng.random_range(100_000..1_500_000);
            self.at(Time(t), Ev::Pause { r, on: true });
            self.at(Time((t + len).min(end)), Ev::Pause { r, on: false });
        }
        self.at(Time(end), Ev::Heal);
    }

    fn at(&mut self, t: Time, ev: Ev) {
        self.timeline.at(t, ev);
    }

    fn log(&mut self, line: impl FnOnce() -> String) {
        if self.tracing {
            let l = line();
            self.trace.push(format!("{:>10} {l}", self.now.0));
        }
    }

    fn violation(&mut self, what: String) {
        if self.report.violations.len() < 20 {
            self.log(|| format!("VIOLATION {what}"));
            self.report.violations.push(what);
        }
    }

    fn group_config(&self) -> GroupConfig {
        GroupConfig {
            resilience: self.cfg.resilience,
            ..GroupConfig::default()
        }
    }

    /// Runs to the end and checks every promise.
    pub fn run(&mut self) -> DirReport {
        let end = Time(500_000 + self.cfg.fault_phase_us + self.cfg.settle_us);
        while let Some((t, ev)) = self.timeline.next(end) {
            self.now = t;
            self.step(ev);
        }
        self.now = end;
        self.final_checks();
        self.report.clone()
    }

    fn usable(&self, r: usize) -> bool {
        let p = &self.reps[r];
        p.alive && !p.cut
    }

    fn step(&mut self, ev: Ev) {
        // A paused replica holds what reaches it and runs it on resume.
        let target = match &ev {
            Ev::Datagram { to, .. } | Ev::Request { to, .. } => Some(*to),
            Ev::Tick { r } | Ev::Form { r } | Ev::Flush { r } | Ev::Synced { r, .. } => Some(*r),
            _ => None,
        };
        if let Some(r) = target
            && self.reps[r].paused
            && self.reps[r].alive
        {
            self.reps[r].held.push(ev);
            return;
        }
        match ev {
            Ev::Datagram { to, from, bytes } => {
                if !self.usable(to) {
                    return;
                }
                let now = self.now;
                if let Some(core) = self.reps[to].core.as_mut() {
                    core.handle_datagram(now, from, &bytes);
                }
                self.after(to);
            }
            Ev::Request {
                to,
                client,
                op,
                body,
            } => {
                if self.usable(to) {
                    self.on_request(to, client, op, &body);
                    self.after(to);
                }
            }
            Ev::Reply { client, op, body } => self.on_reply(client, op, &body),
            Ev::Tick { r } => {
                if self.reps[r].scheduled != Some(self.now) {
                    return;
                }
                self.reps[r].scheduled = None;
                if !self.reps[r].alive {
                    return;
                }
                let now = self.now;
                if let Some(core) = self.reps[r].core.as_mut() {
                    core.handle_timeout(now);
                }
                self.expire_reads(r);
                self.after(r);
            }
            Ev::Form { r } => {
                if self.reps[r].alive {
                    self.form(r);
                    self.after(r);
                    self.at(Time(self.now.0 + 100_000), Ev::Form { r });
                }
            }
            Ev::Flush { r } => {
                if self.reps[r].alive {
                    self.flush(r);
                    self.at(Time(self.now.0 + self.cfg.flush_us), Ev::Flush { r });
                }
            }
            Ev::Synced {
                r,
                boot,
                len,
                index,
            } => {
                let p = &mut self.reps[r];
                if !p.alive || p.boot != boot {
                    return;
                }
                if let Some(l) = p.disk.logs.last_mut() {
                    l.2 = l.2.max(len.min(l.1.len()));
                }
                p.durable = p.durable.max(index);
                p.syncing = false;
                self.release_durable(r);
                if self.cfg.durability == Durability::Fsync && !self.reps[r].rs.log.is_empty() {
                    self.flush(r);
                }
                self.maybe_snapshot(r);
            }
            Ev::ClientTick { c } => self.client_tick(c),
            Ev::Crash { r } => {
                let victim = r.or_else(|| {
                    let alive: Vec<usize> = (0..self.reps.len())
                        .filter(|&i| self.reps[i].alive)
                        .collect();
                    // The replicated mode promises to survive r replicas
                    // lost at once: a replica that restarted holds the state
                    // again only once it is a member (after its state
                    // transfer).  The fsync mode survives any crash.
                    let holding = (0..self.reps.len())
                        .filter(|&i| self.reps[i].alive && self.reps[i].phase == Phase::Member)
                        .count();
                    let lost = self.reps.len() - holding;
                    if alive.is_empty()
                        || (self.cfg.durability == Durability::Replicated
                            && lost >= self.cfg.resilience)
                    {
                        return None;
                    }
                    Some(alive[self.rng.random_range(0..alive.len())])
                });
                if let Some(v) = victim
                    && self.reps[v].alive
                {
                    self.crash(v);
                    let back = self.rng.random_range(50_000..800_000);
                    self.at(Time(self.now.0 + back), Ev::Restart { r: v });
                }
            }
            Ev::Restart { r } => self.restart(r),
            Ev::Partition { r, on } => {
                self.log(|| format!("partition r{r} {on}"));
                self.reps[r].cut = on;
            }
            Ev::Pause { r, on } => {
                self.log(|| format!("pause r{r} {on}"));
                self.set_pause(r, on);
            }
            Ev::Heal => {
                self.log(|| "heal".into());
                self.faults_on = false;
                for r in 0..self.reps.len() {
                    self.reps[r].cut = false;
                    self.set_pause(r, false);
                    if !self.reps[r].alive {
                        self.restart(r);
                    }
                }
            }
        }
    }

    fn set_pause(&mut self, r: usize, on: bool) {
        self.reps[r].paused = on;
        if !on {
            let held = std::mem::take(&mut self.reps[r].held);
            for ev in held {
                self.step(ev);
            }
            // Timers that came due meanwhile fire now.
            self.reps[r].scheduled = None;
            self.after(r);
        }
    }

    fn crash(&mut self, r: usize) {
        self.log(|| format!("crash r{r}"));
        let p = &mut self.reps[r];
        p.alive = false;
        p.paused = false;
        p.held.clear();
        p.core = None;
        p.by_msg.clear();
        p.by_seq.clear();
        p.results.clear();
        p.for_disk.clear();
        p.for_index.clear();
        // Unsynced log bytes are lost, except perhaps a torn prefix.
        for i in 0..p.disk.logs.len() {
            let (_, bytes, synced) = &mut p.disk.logs[i];
            let extra = bytes.len() - *synced;
            let keep = if extra > 0 && self.rng.random_bool(0.5) {
                *synced + self.rng.random_range(0..=extra)
            } else {
                *synced
            };
            bytes.truncate(keep);
            *synced = keep;
        }
    }

    fn restart(&mut self, r: usize) {
        if self.reps[r].alive {
            return;
        }
        let logs: Vec<(u64, &[u8])> = self.reps[r]
            .disk
            .logs
            .iter()
            .map(|(b, bytes, _)| (*b, bytes.as_slice()))
            .collect();
        let rec = match log::recover(self.port, self.reps[r].disk.snapshot.as_deref(), &logs) {
            Ok(rec) => rec,
            Err(e) => {
                self.violation(format!("recovery: r{r} cannot recover: {e}"));
                return;
            }
        };
        let keep = rec.keep.clone();
        let index = rec.state.index();
        self.log(|| format!("restart r{r} at index {index} ({} replayed)", rec.replayed));
        let p = &mut self.reps[r];
        let mut logs = std::mem::take(&mut p.disk.logs);
        let mut kept = Vec::new();
        for ((base, mut bytes, _), k) in logs.drain(..).zip(keep) {
            match k {
                None => {}
                Some(0) => kept.push((base, log::header(base).to_vec(), log::LOG_HEADER)),
                Some(len) => {
                    bytes.truncate(len);
                    kept.push((base, bytes, len));
                }
            }
        }
        if kept.is_empty() {
            kept.push((index, log::header(index).to_vec(), log::LOG_HEADER));
        }
        p.disk.logs = kept;
        p.rs = ReplicaState::new(rec.state);
        p.durable = index;
        p.alive = true;
        p.boot += 1;
        p.generation = p.disk.generation;
        p.phase = Phase::Forming;
        p.syncing = false;
        p.origin = self.rng.random::<u64>() | 1;
        self.at(Time(self.now.0 + 1_000), Ev::Form { r });
        if self.cfg.durability == Durability::Replicated {
            self.at(Time(self.now.0 + self.cfg.flush_us), Ev::Flush { r });
        }
    }

    // ---- the replica ------------------------------------------------------

    fn status_of(&self, r: usize) -> PeerStatus {
        let p = &self.reps[r];
        // A member whose group has been in a reset for long reports itself
        // stuck, so replicas outside do not wait to join it.
        let stuck = p.phase == Phase::Member
            && p.abnormal_since
                .is_some_and(|t| self.now.0 >= t.0 + STUCK_AFTER_US);
        PeerStatus {
            phase: if stuck { Phase::Stuck } else { p.phase },
            generation: p.generation,
            index: p.rs.state.index(),
            group: self.tag(r),
        }
    }

    fn tag(&self, r: usize) -> u64 {
        self.reps[r].core.as_ref().map_or(0, |c| {
            let info = c.info();
            group_tag(info.incarnation, &info.sequencer)
        })
    }

    /// Asks every other replica where it is (an RPC that may be lost).
    fn ask_peers(&mut self, r: usize) -> Vec<(usize, Option<PeerStatus>)> {
        let drop = if self.faults_on {
            self.cfg.faults.drop
        } else {
            0.0
        };
        (0..self.reps.len())
            .filter(|&i| i != r)
            .map(|i| {
                let reachable = self.usable(i) && !self.reps[i].paused && self.usable(r);
                let lost = self.rng.random_bool(drop);
                (i, (reachable && !lost).then(|| self.status_of(i)))
            })
            .collect()
    }

    fn form(&mut self, r: usize) {
        match self.reps[r].phase {
            Phase::Member => {
                let peers = self.ask_peers(r);
                if behind(self.reps[r].rs.state.index(), &peers) {
                    self.lose_group(r, "a replica outside the group has applied more");
                }
            }
            Phase::Joining => {
                if self.now.0 > self.reps[r].joined_at.0 + 15_000_000 {
                    self.lose_group(r, "no state transfer");
                }
            }
            Phase::Stuck => {
                let peers = self.ask_peers(r);
                let works = self.reps[r]
                    .core
                    .as_ref()
                    .is_some_and(|c| c.status() == Status::Normal);
                let tag = self.tag(r);
                match when_stuck(r, self.reps[r].rs.state.index(), tag, works, &peers) {
                    Stuck::Reset => {
                        self.log(|| format!("r{r} stuck: resets with whoever it reaches"));
                        let now = self.now;
                        if let Some(core) = self.reps[r].core.as_mut() {
                            core.reset(now, Some(1));
                        }
                    }
                    Stuck::Serve => {
                        self.log(|| {
                            format!("r{r} stuck: its group works again and holds the most")
                        });
                        self.reps[r].phase = Phase::Member;
                    }
                    Stuck::Leave => self.lose_group(r, "stuck, and another replica goes on"),
                    Stuck::Wait => {}
                }
            }
            Phase::Forming => {
                let peers = self.ask_peers(r);
                let index = self.reps[r].rs.state.index();
                let decision = decide(r, index, self.reps[r].generation, &peers);
                let cfg = self.group_config();
                let id = MemberId(self.rng.random_range(1..u64::MAX));
                let me = MemberEntry {
                    id,
                    addr: self.reps[r].addr,
                };
                match decision {
                    Formation::Join(g) => {
                        let contacts: Vec<SocketAddr> = peers
                            .iter()
                            .filter(|(_, s)| {
                                s.is_some_and(|s| s.phase == Phase::Member && s.generation == g)
                            })
                            .map(|(i, _)| self.reps[*i].addr)
                            .collect();
                        let nonce = self.rng.random();
                        let core = GroupCore::join(
                            self.now,
                            self.key.clone(),
                            group_port(&self.key, g),
                            me,
                            cfg,
                            contacts,
                            nonce,
                        );
                        self.log(|| format!("r{r} joins generation {g}"));
                        let p = &mut self.reps[r];
                        p.core = Some(core);
                        p.phase = Phase::Joining;
                        p.joined_at = self.now;
                        p.generation = g;
                        p.disk.generation = g;
                    }
                    Formation::Create(g) => {
                        self.log(|| format!("r{r} forms generation {g} at index {index}"));
                        self.report.generations = self.report.generations.max(g);
                        let core = GroupCore::create(
                            self.now,
                            self.key.clone(),
                            group_port(&self.key, g),
                            me,
                            cfg,
                        );
                        let p = &mut self.reps[r];
                        p.core = Some(core);
                        p.phase = Phase::Member;
                        p.generation = g;
                        p.disk.generation = g;
                    }
                    Formation::Wait { .. } => {}
                }
            }
        }
    }

    fn lose_group(&mut self, r: usize, why: &str) {
        self.log(|| format!("r{r} out of its group: {why}"));
        let p = &mut self.reps[r];
        p.core = None;
        p.phase = Phase::Forming;
        p.abnormal_since = None;
        p.results.clear();
        let pending: Vec<Pending> = std::mem::take(&mut p.by_msg)
            .into_values()
            .chain(std::mem::take(&mut p.by_seq).into_values())
            .chain(std::mem::take(&mut p.for_index).into_iter().map(|(_, p)| p))
            .collect();
        for p in pending {
            self.answer(r, &p, self.unavailable(r));
        }
    }

    fn unavailable(&self, r: usize) -> Response {
        Response {
            index: self.reps[r].rs.state.index(),
            result: Err(DirError::Unavailable("not in the group".into())),
        }
    }

    fn answer(&mut self, r: usize, p: &Pending, resp: Response) {
        if self.reps[r].cut {
            return;
        }
        // Only a serving replica answers about the directory: one whose
        // group is stuck may yet be dissolved, with what it applied.
        let resp = if self.reps[r].phase == Phase::Member || output_of(&resp.result).is_none() {
            resp
        } else {
            self.unavailable(r)
        };
        let body = resp.encode();
        let faults = self.net();
        for d in faults.verdict(&mut self.rng) {
            self.at(
                Time(self.now.0 + d),
                Ev::Reply {
                    client: p.client,
                    op: p.op,
                    body: body.clone(),
                },
            );
        }
    }

    fn net(&self) -> Faults {
        if self.faults_on {
            self.cfg.faults.clone()
        } else {
            Faults::none()
        }
    }

    fn on_request(&mut self, r: usize, client: usize, op: u64, body: &[u8]) {
        let Ok(req) = Request::decode(body) else {
            return;
        };
        let pending = Pending {
            client,
            op,
            req: req.clone(),
            kind: if req.op.is_write() {
                Waiting::Write
            } else {
                Waiting::Sync
            },
        };
        if self.reps[r].phase != Phase::Member || self.reps[r].core.is_none() {
            let resp = self.unavailable(r);
            self.answer(r, &pending, resp);
            return;
        }
        let linearizable = req.flags & FLAG_LINEARIZABLE != 0;
        if !req.op.is_write() && !linearizable {
            self.serve_read(r, pending);
            return;
        }
        let entry = if req.op.is_write() {
            encode_entry(self.reps[r].origin, &req)
        } else {
            encode_entry(
                self.reps[r].origin,
                &Request {
                    client: 0,
                    seq: 0,
                    min_index: 0,
                    flags: 0,
                    op: Op::Sync,
                },
            )
        };
        let now = self.now;
        let sent = self.reps[r]
            .core
            .as_mut()
            .expect("member")
            .send(now, Bytes::from(entry));
        match sent {
            Ok(msg) => {
                self.reps[r].by_msg.insert(msg, pending);
            }
            Err(_) => {
                let resp = self.unavailable(r);
                self.answer(r, &pending, resp);
            }
        }
    }

    fn serve_read(&mut self, r: usize, p: Pending) {
        let resp = self.reps[r].rs.read(&p.req);
        if matches!(resp.result, Err(DirError::Behind { .. })) {
            self.reps[r]
                .for_index
                .push((Time(self.now.0 + CATCH_UP_US), p));
            return;
        }
        self.answer_when_durable(r, p, resp);
    }

    /// Answers once the log holds the state the answer saw (the fsync
    /// mode): a read must not show a write that a crash of every replica
    /// could still take back.
    fn answer_when_durable(&mut self, r: usize, p: Pending, resp: Response) {
        if self
            .cfg
            .durability
            .reply_ready(resp.index, self.reps[r].durable)
        {
            self.answer(r, &p, resp);
        } else {
            self.reps[r].for_disk.push((resp.index, p, resp));
            self.flush(r);
        }
    }

    fn expire_reads(&mut self, r: usize) {
        let now = self.now;
        let index = self.reps[r].rs.state.index();
        let waiting = std::mem::take(&mut self.reps[r].for_index);
        for (deadline, p) in waiting {
            if index >= p.req.min_index || deadline <= now {
                let resp = self.reps[r].rs.read(&p.req);
                if matches!(resp.result, Err(DirError::Behind { .. })) {
                    self.answer(r, &p, resp);
                } else {
                    self.answer_when_durable(r, p, resp);
                }
            } else {
                self.reps[r].for_index.push((deadline, p));
            }
        }
    }

    /// A group message of this replica's was applied: answer it.
    fn finish(&mut self, r: usize, p: Pending, resp: Response) {
        match p.kind {
            Waiting::Write => self.answer_when_durable(r, p, resp),
            Waiting::Sync => self.serve_read(r, p),
        }
    }

    fn release_durable(&mut self, r: usize) {
        let durable = self.reps[r].durable;
        let waiting = std::mem::take(&mut self.reps[r].for_disk);
        for (index, p, resp) in waiting {
            if index <= durable {
                self.answer(r, &p, resp);
            } else {
                self.reps[r].for_disk.push((index, p, resp));
            }
        }
    }

    /// Starts writing the log buffer (one sync at a time).
    fn flush(&mut self, r: usize) {
        let p = &mut self.reps[r];
        if p.syncing || !p.alive {
            return;
        }
        let last = p.rs.log.last_index();
        let bytes = p.rs.log.take(self.cfg.durability.marks());
        if bytes.is_none() && last <= p.durable {
            return;
        }
        let log = p.disk.logs.last_mut().expect("a current log");
        if let Some(b) = bytes {
            log.1.extend_from_slice(&b);
        }
        let len = log.1.len();
        p.syncing = true;
        let boot = p.boot;
        let d = self.rng.random_range(300..8_000);
        self.at(
            Time(self.now.0 + d),
            Ev::Synced {
                r,
                boot,
                len,
                index: last,
            },
        );
    }

    fn maybe_snapshot(&mut self, r: usize) {
        let p = &mut self.reps[r];
        let len = p.disk.logs.last().map(|l| l.1.len()).unwrap_or(0);
        if len < self.cfg.snapshot_bytes || p.syncing {
            return;
        }
        // As the shell does: flush and sync the buffer, start a new log,
        // write the snapshot (atomically: tmp, sync, rename), drop old logs.
        if let Some(b) = p.rs.log.take(false) {
            p.disk
                .logs
                .last_mut()
                .expect("a current log")
                .1
                .extend_from_slice(&b);
        }
        for l in &mut p.disk.logs {
            l.2 = l.1.len();
        }
        let index = p.rs.state.index();
        p.durable = p.durable.max(index);
        p.disk
            .logs
            .push((index, log::header(index).to_vec(), log::LOG_HEADER));
        p.disk.snapshot = Some(p.rs.state.encode_snapshot());
        p.disk.logs.retain(|(b, _, _)| *b >= index);
        self.report.snapshots += 1;
        self.release_durable(r);
    }

    fn install_state(&mut self, r: usize, bytes: &[u8]) {
        let state = match DirState::decode_snapshot(bytes) {
            Ok(s) => s,
            Err(e) => {
                self.violation(format!(
                    "state_transfer: r{r} got an undecodable state: {e}"
                ));
                return;
            }
        };
        let index = state.index();
        self.log(|| format!("r{r} state transfer at index {index}"));
        let p = &mut self.reps[r];
        self.report.cancelled_pairs += p.rs.log.cancelled_pairs;
        p.rs = ReplicaState::new(state);
        p.disk.snapshot = Some(bytes.to_vec());
        p.disk.logs = vec![(index, log::header(index).to_vec(), log::LOG_HEADER)];
        p.durable = index;
        p.syncing = false;
        p.boot += 1;
        if p.phase == Phase::Joining {
            p.phase = Phase::Member;
        }
    }

    fn on_event(&mut self, r: usize, ev: Event) {
        if !matches!(ev, Event::Message { .. }) {
            self.log(|| format!("r{r} event {ev:?}").chars().take(160).collect());
        }
        match ev {
            Event::Message { seq, body, .. } => {
                let Some((origin, resp)) = self.reps[r].rs.deliver(&body) else {
                    self.violation(format!("replica_agreement: r{r} got an undecodable entry"));
                    return;
                };
                if self.cfg.durability == Durability::Fsync {
                    self.flush(r);
                }
                if origin == self.reps[r].origin {
                    match self.reps[r].by_seq.remove(&seq) {
                        Some(p) => self.finish(r, p, resp),
                        None => {
                            self.reps[r].results.insert(seq, resp);
                        }
                    }
                }
                self.expire_reads(r);
            }
            Event::State { state, .. } => self.install_state(r, &state),
            Event::StateWanted { joiner } => {
                let state = self.reps[r].rs.state.encode_snapshot();
                let now = self.now;
                if let Some(core) = self.reps[r].core.as_mut() {
                    core.provide_state(now, joiner, &state);
                }
            }
            Event::View { .. } => {}
            Event::ResetFailed { .. } => {
                if self.reps[r].phase == Phase::Member {
                    self.reps[r].phase = Phase::Stuck;
                }
            }
            Event::Expelled | Event::LeftGroup | Event::JoinFailed => {
                self.lose_group(r, "expelled");
            }
            Event::Joined { .. } | Event::Left { .. } => {}
        }
    }

    /// After a replica's core ran: its completions and deliveries, its
    /// datagrams, its timer.
    fn after(&mut self, r: usize) {
        if !self.reps[r].alive || self.reps[r].paused {
            return;
        }
        while let Some((msg, seq)) = self.reps[r].core.as_mut().and_then(|c| c.poll_sent()) {
            if let Some(p) = self.reps[r].by_msg.remove(&msg) {
                match self.reps[r].results.remove(&seq) {
                    Some(resp) => self.finish(r, p, resp),
                    None => {
                        self.reps[r].by_seq.insert(seq, p);
                    }
                }
            }
        }
        loop {
            let Some(ev) = self.reps[r].core.as_mut().and_then(|c| c.poll_event()) else {
                break;
            };
            self.on_event(r, ev);
        }
        let normal = self.reps[r]
            .core
            .as_ref()
            .is_some_and(|c| c.status() == Status::Normal);
        let now = self.now;
        let p = &mut self.reps[r];
        p.abnormal_since = if normal {
            None
        } else {
            p.abnormal_since.or(Some(now))
        };
        let mut out = Vec::new();
        let mut members = Vec::new();
        if let Some(core) = self.reps[r].core.as_mut() {
            while let Some(t) = core.poll_transmit() {
                out.push(t);
            }
            members = core.members().iter().map(|m| m.addr).collect();
        }
        let from = self.reps[r].addr;
        for t in out {
            let targets: Vec<SocketAddr> = match t.dest {
                GroupDest::Addr(a) => vec![a],
                GroupDest::Members => members.iter().copied().filter(|a| *a != from).collect(),
            };
            for to in targets {
                self.datagram(r, to, t.bytes.clone());
            }
        }
        let mut next = self.reps[r].core.as_ref().and_then(|c| c.poll_timeout());
        if let Some(d) = self.reps[r].for_index.iter().map(|(d, _)| *d).min() {
            next = Some(next.map_or(d, |n| n.min(d)));
        }
        if let Some(t) = next {
            let t = t.max(Time(self.now.0 + 1));
            if self.reps[r].scheduled.is_none_or(|s| s > t || s < self.now) {
                self.reps[r].scheduled = Some(t);
                self.at(t, Ev::Tick { r });
            }
        }
    }

    fn datagram(&mut self, from_r: usize, to: SocketAddr, bytes: Vec<u8>) {
        let Some(dst) = self.reps.iter().position(|q| q.addr == to) else {
            return;
        };
        if self.reps[from_r].cut || self.reps[dst].cut {
            return;
        }
        let from = self.reps[from_r].addr;
        for d in self.net().verdict(&mut self.rng) {
            self.at(
                Time(self.now.0 + d),
                Ev::Datagram {
                    to: dst,
                    from,
                    bytes: bytes.clone(),
                },
            );
        }
    }

    // ---- the clients ------------------------------------------------------

    fn pick_input(&mut self, c: usize) -> DirInput {
        let names = self.cfg.names as u8;
        let k = self.rng.random_range(0..names);
        let fresh = (c as u64) << 32 | self.clis[c].next_op;
        let known = self.clis[c].last.get(&k).copied().unwrap_or(fresh);
        match self.rng.random_range(0..10) {
            0..=2 => DirInput::Append(k, fresh),
            3 | 4 => DirInput::Delete(k),
            5 => DirInput::Replace(k, known, fresh),
            6 => {
                let mut to = self.rng.random_range(0..names);
                if to == k {
                    to = (k + 1) % names;
                }
                DirInput::Move(k, to, known)
            }
            _ => DirInput::Lookup(k),
        }
    }

    fn client_tick(&mut self, c: usize) {
        if let Some((_, _, _, h, give_up)) = self.clis[c].current.clone() {
            if self.now >= give_up {
                // Outcome unknown: the history keeps it without a return.
                self.log(|| format!("c{c} gives up on op {h}"));
                self.clis[c].current = None;
                self.report.ops_unknown += 1;
            } else if self.clis[c].retry_at.is_some_and(|t| t <= self.now) {
                self.send_current(c, true);
                return;
            } else {
                return;
            }
        }
        // The next operation; then client 0 looks every name up (after
        // the faults), so every acknowledged update is checked.
        let input = if self.clis[c].left > 0 {
            self.clis[c].left -= 1;
            self.pick_input(c)
        } else if c == 0 && !self.faults_on && self.clis[c].finals < self.cfg.names {
            self.clis[c].finals += 1;
            DirInput::Lookup(self.clis[c].finals as u8 - 1)
        } else {
            if c == 0 && self.clis[c].finals < self.cfg.names {
                self.at(Time(self.now.0 + 100_000), Ev::ClientTick { c });
            }
            return;
        };
        self.clis[c].next_op += 1;
        let write = !matches!(input, DirInput::Lookup(_));
        let cli = &mut self.clis[c];
        if write {
            cli.seq += 1;
        }
        let req = Request {
            client: cli.id,
            seq: cli.seq,
            min_index: cli.seen,
            flags: if write { 0 } else { FLAG_LINEARIZABLE },
            op: op_for(self.dir, &input),
        };
        let h = self.history.len();
        self.history.push(Operation {
            client: c as u64,
            input: input.clone(),
            call: self.now.0,
            output: None,
            ret: None,
        });
        let op = self.clis[c].next_op;
        self.clis[c].current = Some((op, req.encode(), input, h, Time(self.now.0 + GIVE_UP_US)));
        self.send_current(c, false);
    }

    fn send_current(&mut self, c: usize, retry: bool) {
        let Some((op, body, _, _, _)) = self.clis[c].current.clone() else {
            return;
        };
        if retry {
            self.clis[c].target = self.rng.random_range(0..self.reps.len());
        }
        let to = self.clis[c].target;
        self.clis[c].retry_at = Some(Time(self.now.0 + CLIENT_TIMEOUT_US));
        self.at(Time(self.now.0 + CLIENT_TIMEOUT_US), Ev::ClientTick { c });
        if !self.reps[to].cut {
            for d in self.net().verdict(&mut self.rng) {
                self.at(
                    Time(self.now.0 + d),
                    Ev::Request {
                        to,
                        client: c,
                        op,
                        body: body.clone(),
                    },
                );
            }
        }
    }

    fn on_reply(&mut self, c: usize, op: u64, body: &[u8]) {
        let Some((cur, _, input, h, _)) = self.clis[c].current.clone() else {
            return;
        };
        if cur != op {
            return;
        }
        let Ok(resp) = Response::decode(body) else {
            return;
        };
        let Some(out) = output_of(&resp.result) else {
            // Try another replica soon.
            self.clis[c].retry_at = Some(Time(self.now.0 + 20_000));
            self.at(Time(self.now.0 + 20_000), Ev::ClientTick { c });
            return;
        };
        self.log(|| format!("c{c} {input:?} -> {out:?} at {}", resp.index));
        let cli = &mut self.clis[c];
        cli.seen = cli.seen.max(resp.index);
        if let (DirInput::Lookup(k), DirOutput::Value(v)) = (&input, &out) {
            cli.last.insert(*k, *v);
        }
        cli.current = None;
        cli.retry_at = None;
        self.history[h].output = Some(out);
        self.history[h].ret = Some(self.now.0);
        self.report.ops_ok += 1;
        let think = self.rng.random_range(0..3_000);
        self.at(Time(self.now.0 + think), Ev::ClientTick { c });
    }

    // ---- the end ------------------------------------------------------------

    fn final_checks(&mut self) {
        // Liveness: one group, every operation done.
        let members: Vec<usize> = (0..self.reps.len())
            .filter(|&r| self.reps[r].alive && self.reps[r].phase == Phase::Member)
            .collect();
        if members.len() != self.reps.len() {
            let phases: Vec<String> = self
                .reps
                .iter()
                .map(|p| match &p.core {
                    Some(c) => {
                        let i = c.info();
                        format!(
                            "{} (group {:?}, inc {}, {} members, sequencer {})",
                            p.phase.name(),
                            i.status,
                            i.incarnation,
                            i.members.len(),
                            i.is_sequencer
                        )
                    }
                    None => p.phase.name().to_string(),
                })
                .collect();
            self.violation(format!(
                "liveness: after the faults, replicas are {phases:?}, not all members"
            ));
        }
        let gens: Vec<u64> = members.iter().map(|&r| self.reps[r].generation).collect();
        if gens.windows(2).any(|w| w[0] != w[1]) {
            self.violation(format!(
                "liveness: replicas in different generations {gens:?}"
            ));
        }
        for c in 0..self.clis.len() {
            let finals_left = c == 0 && self.clis[c].finals < self.cfg.names;
            if self.clis[c].current.is_some() || self.clis[c].left > 0 || finals_left {
                self.violation(format!(
                    "liveness: client c{c} did not finish its operations"
                ));
            }
        }
        // Replicas at the same index hold the same state.
        let mut by_index: BTreeMap<u64, (usize, Vec<u8>)> = BTreeMap::new();
        for &r in &members {
            let st = &self.reps[r].rs.state;
            let snap = st.encode_snapshot();
            match by_index.get(&st.index()) {
                Some((q, s)) if *s != snap => {
                    let q = *q;
                    self.violation(format!(
                        "replica_agreement: r{r} and r{q} differ at index {}",
                        st.index()
                    ));
                }
                Some(_) => {}
                None => {
                    by_index.insert(st.index(), (r, snap));
                }
            }
        }
        for p in &self.reps {
            self.report.cancelled_pairs += p.rs.log.cancelled_pairs;
        }
        // Linearizability of the whole history.
        let model = DirModel {
            names: self.cfg.names,
        };
        match linearize::check(&model, &self.history, None) {
            CheckResult::Ok => {}
            CheckResult::Illegal { longest_prefix, .. } => {
                let n = longest_prefix.len();
                self.violation(format!(
                    "linearizable: the history of {} operations is not linearizable (longest legal prefix {n})",
                    self.history.len()
                ));
                if self.tracing {
                    let lines: Vec<String> = self
                        .history
                        .iter()
                        .enumerate()
                        .map(|(i, o)| {
                            format!(
                                "h{i} c{} {:?} [{}, {:?}] -> {:?}",
                                o.client, o.input, o.call, o.ret, o.output
                            )
                        })
                        .collect();
                    self.trace.extend(lines);
                }
            }
            CheckResult::Unknown => {
                self.violation("linearizable: the checker ran out of budget".into());
            }
        }
    }
}
