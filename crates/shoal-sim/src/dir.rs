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
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_cap::{Capability, GetPort, PutPort};
use shoal_dir::log;
use shoal_dir::op::FLAG_LINEARIZABLE;
use shoal_dir::replica::{ReplicaState, encode_entry};
use shoal_dir::{Answer, DirError, DirState, Op, Request, Response};
use shoal_group::{
    Event, GroupConfig, GroupCore, GroupDest, GroupSeq, MemberEntry, MemberId, Status,
};
use shoal_proto::Time;
use shoal_replica::{
    Control, Durability, Formation, PeerStatus, Phase, STUCK_AFTER, Standing, Why, control,
    group_tag,
};

use crate::linearize::{self, CheckResult, Model, Operation};
use crate::net::Faults;
use crate::timeline::{Timeline, Trace};

mod client;
mod replica;

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
    by_msg: BTreeMap<shoal_group::MsgId, Pending>,
    by_seq: BTreeMap<GroupSeq, Pending>,
    results: BTreeMap<GroupSeq, Response>,
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
    /// The secret each generation's group port is derived from.
    ports: [u8; 32],
    port: PutPort,
    dir: Capability,
    now: Time,
    timeline: Timeline<Ev>,
    reps: Vec<Rep>,
    clis: Vec<Cli>,
    faults_on: bool,
    history: Vec<Operation<DirInput, DirOutput>>,
    report: DirReport,
    trace: Trace,
}

const CLIENT_TIMEOUT: Duration = Duration::from_millis(300);
const GIVE_UP: Duration = Duration::from_secs(6);
const CATCH_UP: Duration = Duration::from_secs(1);

/// Each generation's group port, from the run's secret `ports`.
fn group_port(ports: &[u8; 32], generation: u64) -> PutPort {
    GetPort::derive(ports, &format!("dirsim group {generation}")).put_port()
}

impl DirSim {
    pub fn new(seed: u64, cfg: DirSimConfig) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let ports: [u8; 32] = rng.random();
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
            ports,
            port,
            dir,
            now: Time(0),
            timeline: Timeline::new(),
            reps,
            clis,
            faults_on: true,
            history: Vec::new(),
            report: DirReport::default(),
            trace: Trace::from_env(),
        };
        sim.setup();
        sim
    }

    /// The event trace (with `SHOAL_SIM_TRACE` set).
    pub fn trace(&self) -> &[String] {
        self.trace.lines()
    }

    /// The clients' history.
    pub fn history(&self) -> &[Operation<DirInput, DirOutput>] {
        &self.history
    }

    fn setup(&mut self) {
        for r in 0..self.reps.len() {
            self.timeline
                .at(Time(1_000 + r as u64 * 7_000), Ev::Form { r });
            if self.cfg.durability == Durability::Replicated {
                self.timeline.at(Time(self.cfg.flush_us), Ev::Flush { r });
            }
        }
        // Clients start once the group has formed.
        for c in 0..self.clis.len() {
            self.timeline
                .at(Time(400_000 + c as u64 * 1_000), Ev::ClientTick { c });
        }
        let start = 500_000;
        let end = start + self.cfg.fault_phase_us;
        for _ in 0..self.cfg.crashes {
            let t = self.rng.random_range(start..end);
            self.timeline.at(Time(t), Ev::Crash { r: None });
        }
        for _ in 0..self.cfg.total_crashes {
            let t = self.rng.random_range(start..end);
            for r in 0..self.reps.len() {
                self.timeline.at(Time(t), Ev::Crash { r: Some(r) });
            }
        }
        if self.cfg.partition {
            let r = self.rng.random_range(0..self.reps.len());
            let t = self.rng.random_range(start..end);
            let len = self.rng.random_range(100_000..1_500_000);
            self.timeline.at(Time(t), Ev::Partition { r, on: true });
            self.timeline
                .at(Time((t + len).min(end)), Ev::Partition { r, on: false });
        }
        if self.cfg.pause {
            let r = self.rng.random_range(0..self.reps.len());
            let t = self.rng.random_range(start..end);
            let len = self.rng.random_range(100_000..1_500_000);
            self.timeline.at(Time(t), Ev::Pause { r, on: true });
            self.timeline
                .at(Time((t + len).min(end)), Ev::Pause { r, on: false });
        }
        self.timeline.at(Time(end), Ev::Heal);
    }

    fn log(&mut self, line: impl FnOnce() -> String) {
        self.trace.line(self.now.0, line);
    }

    fn violation(&mut self, what: String) {
        let now = self.now.0;
        self.trace.violation(now, &mut self.report.violations, what);
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
                    self.timeline
                        .at(self.now + Duration::from_millis(100), Ev::Form { r });
                }
            }
            Ev::Flush { r } => {
                if self.reps[r].alive {
                    self.flush(r);
                    self.timeline.at(
                        self.now + Duration::from_micros(self.cfg.flush_us),
                        Ev::Flush { r },
                    );
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
                    // transfer) and holds every entry its group committed
                    // (those committed while it joined went to the members
                    // before and after the join, not to it).  The fsync
                    // mode survives any crash.
                    let holding = (0..self.reps.len())
                        .filter(|&i| self.reps[i].alive && self.reps[i].phase == Phase::Member)
                        .filter(|&i| self.caught_up(i))
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
                    self.timeline
                        .at(self.now + Duration::from_micros(back), Ev::Restart { r: v });
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

    /// Whether replica `i`'s member holds every entry that any live member
    /// of its group has seen committed.
    fn caught_up(&self, i: usize) -> bool {
        let Some(core) = self.reps[i].core.as_ref() else {
            return false;
        };
        let tag = self.tag(i);
        let committed = (0..self.reps.len())
            .filter(|&j| self.reps[j].alive && self.tag(j) == tag)
            .filter_map(|j| self.reps[j].core.as_ref().map(|c| c.committed()))
            .max()
            .unwrap_or_default();
        core.held() >= committed
    }

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
                if self.trace.on() {
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
