//! The shared file system's consistency protocol (`docs/fs.md`): a
//! primary running the real [`Tree`] and the soft state and decisions
//! the metadata service ships ([`shoal_fs::primary`]), and mounts running
//! the cache and table of opens the FUSE mount ships
//! ([`shoal_fs::cache`], driven as the mount drives them: `fs/mount.rs`),
//! exchanging the real requests and replies ([`shoal_fs::op`]) through a
//! network that delays (and so reorders) every message; callbacks reach
//! each mount on the answer to its parked `Events` request, as they do
//! the mount; contents live on a file store as the file servers keep
//! them.  A tick is 100 ms of the lease clock: a lease is 100 ticks, and
//! a crashed mount's session ends when its lease runs out.  Programs open, read, write, append,
//! close and `fsync` files at random while the mounts' callbacks threads
//! write back and answer recalls, and mounts crash.
//!
//! The checks are the file system's promises:
//! - **no stale read**: every read, from a mount's cache or from the
//!   primary, returns the file's current bytes: those of the mount
//!   holding the file's `Write` token, with its dirty changes, else the
//!   primary's (so a close on one node is seen by the next open on
//!   another, and write-shared files read each write once made);
//! - **no lost write**: no mount's write-back is refused (its changes
//!   would be lost), and every record a program appended to a log file
//!   whose mount did not crash is in the file exactly once at the end, in
//!   the order that program wrote them (a crashed mount's records at most
//!   once, in order);
//! - **no lost fsync**: after a mount crash, a file `fsync`ed and not
//!   written since still holds the bytes it was synced with;
//! - **liveness**: every request is answered, and every callbacks
//!   thread's work done.
//!
//! Files exist from the start (no names change) and the primary does
//! not crash (so its grace period, which is for the clients of a primary
//! before it, is cut to nothing).

mod mount;
mod primary;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_cap::PutPort;
use shoal_fs::model::{Identity, Ino, Kind, ROOT};
use shoal_fs::op::{self, Op};
use shoal_fs::primary::{Config, Soft};
use shoal_fs::tokens::{ClientId, Level, OpenId};
use shoal_fs::update::{Answer, UpdateOp};
use shoal_proto::Time;

use crate::timeline::{Timeline, Trace};
use mount::{Mount, ToMount};
pub(crate) use primary::World;

/// The lease clock's µs in a tick.
const TICK_US: u64 = 100_000;

/// The lease clock at tick `tick` (the fs scenarios count time in ticks;
/// the cores take it as a `Time`).
pub(crate) fn lease_clock(tick: u64) -> Time {
    Time(tick * TICK_US)
}

/// `ticks` ticks of the lease clock.
pub(crate) fn ticks(ticks: u64) -> Duration {
    Duration::from_micros(ticks * TICK_US)
}

/// What a run does.
#[derive(Debug, Clone)]
pub struct FsSimConfig {
    pub clients: usize,
    /// Files written at offsets.
    pub files: usize,
    /// Files only appended to (`O_APPEND`), records of each program.
    pub logs: usize,
    /// Ticks in the run (the network's delays are 1 to `delay_max`).
    pub ticks: u64,
    pub delay_max: u64,
    /// Chance per tick that an idle program starts an operation.
    pub op_chance: f64,
    /// Chance per tick that a mount crashes.
    pub crash_chance: f64,
    /// Chance per tick that a mount writing back for a recall crashes
    /// (before its commit's answer, so mid-recall).
    pub crash_mid_recall: f64,
    /// How long dirty bytes wait before they are written back.
    pub write_back_after: Duration,
}

impl Default for FsSimConfig {
    fn default() -> Self {
        FsSimConfig {
            clients: 3,
            files: 2,
            logs: 0,
            ticks: 600,
            delay_max: 6,
            op_chance: 0.3,
            crash_chance: 0.004,
            crash_mid_recall: 0.0,
            write_back_after: ticks(40),
        }
    }
}

/// What a run found.
#[derive(Debug, Default)]
pub struct FsReport {
    pub reads_checked: usize,
    pub uncached_opens: usize,
    pub recalls: usize,
    pub crashes: usize,
    pub fsyncs_checked: usize,
    pub records_checked: usize,
    pub violations: Vec<String>,
}

/// What a mount asked, to make sense of the answer.
#[derive(Debug, Clone)]
enum Asked {
    Hello,
    Events,
    Open {
        ino: Ino,
        id: OpenId,
        write: bool,
        append: bool,
        have: Vec<(OpenId, bool)>,
    },
    /// A close a program waits for (`program`), or one the mount makes
    /// of opens it learned were its own.
    Close {
        program: bool,
    },
    Read {
        ino: Ino,
    },
    /// A write through the primary (the `n`th record of an append, or 0).
    Write {
        ino: Ino,
        data: Vec<u8>,
        n: u64,
    },
    Commit {
        ino: Ino,
    },
    Return,
}

#[derive(Debug, Clone)]
enum Msg {
    ToPrimary(Asked, op::Request),
    ToMount(ToMount),
}

/// Whom an answer of the primary goes to: the mount's slot, its session
/// then, and what it asked.
type To = (usize, ClientId, Asked);

/// One seeded run.
pub struct FsSim {
    rng: ChaCha8Rng,
    cfg: FsSimConfig,
    now: u64,
    /// Messages in flight: (mount slot, the mount's session then, body).
    wire: Timeline<(usize, ClientId, Msg)>,
    /// Messages in flight other than `Events` and their answers (which
    /// are always under way).
    in_flight: usize,
    /// The replicas' tree and the file servers, as the primary sees them.
    world: World,
    /// The primary's soft state, as the metadata service runs it.
    soft: Soft<To>,
    files: Vec<Ino>,
    logs: BTreeSet<Ino>,
    mounts: Vec<Mount>,
    next_id: ClientId,
    /// Records appended by sessions that crashed: how many each had
    /// acknowledged.
    crashed: BTreeMap<ClientId, u64>,
    /// Each file's bytes as the programs were told they wrote them, in the
    /// order they were told (a crashed mount's unwritten changes go).
    model: BTreeMap<Ino, Vec<u8>>,
    /// Files `fsync`ed and not written since: their bytes then.
    synced: BTreeMap<Ino, Vec<u8>>,
    report: FsReport,
    trace: Trace,
}

impl FsSim {
    pub fn new(seed: u64, cfg: FsSimConfig) -> FsSim {
        let soft = Soft::new(Config {
            port: PutPort::from_bytes([3; 16]),
            servers: Vec::new(),
            copies: 1,
            allow_root: true,
            grace: Duration::ZERO,
        });
        let mut sim = FsSim {
            rng: ChaCha8Rng::seed_from_u64(seed),
            now: 0,
            wire: Timeline::new(),
            in_flight: 0,
            world: World::new(),
            soft,
            files: Vec::new(),
            logs: BTreeSet::new(),
            mounts: Vec::new(),
            next_id: ClientId(1),
            crashed: BTreeMap::new(),
            model: BTreeMap::new(),
            synced: BTreeMap::new(),
            report: FsReport::default(),
            trace: Trace::from_env(),
            cfg,
        };
        let Ok(Answer::Range { first, .. }) = sim.world.set_up(UpdateOp::Range { count: 64 })
        else {
            unreachable!("a fresh tree hands out numbers")
        };
        for i in 0..sim.cfg.files + sim.cfg.logs {
            let ino = first.plus(i as u64);
            sim.world
                .set_up(UpdateOp::Create {
                    parent: ROOT,
                    name: format!("f{i}").into_bytes(),
                    kind: Kind::File,
                    perm: 0o666,
                    rdev: 0,
                    ino,
                    secret: [1; 16],
                    target: Vec::new(),
                    excl: true,
                })
                .expect("set-up update");
            sim.files.push(ino);
            if i >= sim.cfg.files {
                sim.logs.insert(ino);
            }
        }
        sim.soft.start(1, 1, Time::ZERO);
        for slot in 0..sim.cfg.clients {
            let id = sim.fresh_id();
            sim.mounts.push(Mount::new(id));
            sim.hello(slot);
        }
        sim
    }

    /// The run's trace (with `SHOAL_SIM_TRACE` set, the tests print it).
    pub fn trace(&self) -> &[String] {
        self.trace.lines()
    }

    /// A new session number (odd, as the metadata service's are).
    fn fresh_id(&mut self) -> ClientId {
        self.next_id = ClientId(self.next_id.0 + 2);
        self.next_id
    }

    fn log(&mut self, line: String) {
        self.trace.line(self.now, || line);
    }

    fn violation(&mut self, v: String) {
        let now = self.now;
        self.trace.violation(now, &mut self.report.violations, v);
    }

    /// The lease clock now.
    pub(crate) fn clock(&self) -> Time {
        lease_clock(self.now)
    }

    fn send(&mut self, slot: usize, id: ClientId, body: Msg) {
        let events = matches!(
            body,
            Msg::ToPrimary(Asked::Events, _) | Msg::ToMount(ToMount::Events(_))
        );
        if !events {
            self.in_flight += 1;
        }
        let delay = self.rng.random_range(1..=self.cfg.delay_max);
        self.wire
            .at(lease_clock(self.now + delay), (slot, id, body));
    }

    /// A request of mount `slot` to the primary, numbered in its session.
    fn send_primary(&mut self, slot: usize, asked: Asked, op: Op) {
        let m = &mut self.mounts[slot];
        m.seq += 1;
        let req = op::Request {
            session: m.id,
            seq: m.seq,
            who: Identity::root(),
            op,
        };
        let id = m.id;
        self.send(slot, id, Msg::ToPrimary(asked, req));
    }

    fn send_mount(&mut self, slot: usize, id: ClientId, m: ToMount) {
        self.send(slot, id, Msg::ToMount(m));
    }

    /// The file's bytes at the primary: its content version's with the
    /// overlay made.
    fn contents(&self, ino: Ino) -> Vec<u8> {
        self.world.contents(ino)
    }

    /// The file as its `Write` holder reads it (its dirty changes made),
    /// else as the primary has it.
    fn holder_view(&self, ino: Ino) -> Vec<u8> {
        for m in &self.mounts {
            if self.soft.tokens().level(m.id, ino) == Level::Write
                && let Some(c) = m.cache.content(ino)
                && let Some(b) = m.cache.finish_read(
                    ino,
                    c.version,
                    0,
                    mount::READ_MAX,
                    &self.world.store.read(&c.content),
                )
            {
                return b;
            }
        }
        self.contents(ino)
    }

    /// A write a program was told was made: into the model of the file.
    fn made(&mut self, ino: Ino, at: u64, data: &[u8]) {
        let b = self.model.entry(ino).or_default();
        let end = at as usize + data.len();
        if b.len() < end {
            b.resize(end, 0);
        }
        b[at as usize..end].copy_from_slice(data);
    }

    fn check_read(&mut self, slot: usize, ino: Ino, bytes: &[u8], from: &str) {
        self.report.reads_checked += 1;
        let truth = self.model.get(&ino).cloned().unwrap_or_default();
        if bytes != truth {
            self.violation(format!(
                "mount {slot} read file {ino} from {from}: {:?}, but it holds {:?}",
                String::from_utf8_lossy(bytes),
                String::from_utf8_lossy(&truth)
            ));
        }
    }

    pub fn run(&mut self) -> FsReport {
        while self.now < self.cfg.ticks {
            self.now += 1;
            self.deliver_due();
            self.primary_tick();
            for slot in 0..self.mounts.len() {
                let recalling = matches!(
                    self.mounts[slot].doing,
                    Some(mount::Doing {
                        then: mount::Then::Recall { .. },
                        ..
                    })
                );
                if self.rng.random_bool(self.cfg.crash_chance)
                    || (recalling && self.rng.random_bool(self.cfg.crash_mid_recall))
                {
                    self.crash(slot);
                    continue;
                }
                self.callbacks_thread(slot);
                if self.mounts[slot].busy.is_none() && self.rng.random_bool(self.cfg.op_chance) {
                    self.start_op(slot);
                }
            }
        }
        // Quiet: no new operations; everything under way must finish.
        let until = self.now + 3000;
        while self.now < until && !self.settled() {
            self.now += 1;
            self.deliver_due();
            self.primary_tick();
            for slot in 0..self.mounts.len() {
                self.callbacks_thread(slot);
            }
        }
        for slot in 0..self.mounts.len() {
            if let Some(b) = self.mounts[slot].busy.clone() {
                self.violation(format!("mount {slot}'s {b:?} never answered"));
            }
            if self.mounts[slot].doing.is_some() || !self.mounts[slot].work.is_empty() {
                self.violation(format!("mount {slot}'s callbacks thread never finished"));
            }
        }
        for ino in self.files.clone() {
            let want = self.model.get(&ino).cloned().unwrap_or_default();
            if self.settled() && self.contents(ino) != want {
                self.violation(format!(
                    "file {ino} ends as {:?}, but its programs wrote {:?}",
                    String::from_utf8_lossy(&self.contents(ino)),
                    String::from_utf8_lossy(&want)
                ));
            }
        }
        self.check_logs();
        std::mem::take(&mut self.report)
    }

    /// Nothing in flight (`Events` aside), waiting at the primary, or
    /// waiting to be written back.
    fn settled(&self) -> bool {
        self.in_flight == 0
            && !self.soft.is_waiting()
            && self
                .mounts
                .iter()
                .all(|m| m.doing.is_none() && m.work.is_empty() && m.cache.all_dirty().is_empty())
    }

    /// Every record a live session appended is in its log once, in order;
    /// a crashed session's at most once, in order.
    fn check_logs(&mut self) {
        let mut acked: BTreeMap<ClientId, u64> = self.crashed.clone();
        let live: BTreeSet<ClientId> = self.mounts.iter().map(|m| m.id).collect();
        for m in &self.mounts {
            acked.insert(m.id, m.appended);
        }
        let logs: Vec<Ino> = self.logs.iter().copied().collect();
        // Each session's records, by log.
        let mut seen: BTreeMap<ClientId, BTreeMap<Ino, Vec<u64>>> = BTreeMap::new();
        for ino in logs {
            let bytes = self.contents(ino);
            let text = String::from_utf8_lossy(&bytes).into_owned();
            for rec in text.split_terminator('>') {
                let parsed = rec
                    .strip_prefix('<')
                    .and_then(|r| r.split_once(':'))
                    .and_then(|(s, n)| Some((ClientId(s.parse().ok()?), n.parse().ok()?)));
                match parsed {
                    Some((s, n)) => seen.entry(s).or_default().entry(ino).or_default().push(n),
                    None => self.violation(format!("log {ino} holds a torn record {rec:?}")),
                }
            }
        }
        let mut counts: BTreeMap<ClientId, u64> = BTreeMap::new();
        for (session, by_log) in &seen {
            let mut all = BTreeSet::new();
            for (ino, ns) in by_log {
                self.report.records_checked += ns.len();
                if !ns.is_sorted_by(|a, b| a < b) {
                    self.violation(format!(
                        "session {session}'s records in log {ino} are out of order or twice: {ns:?}"
                    ));
                }
                for n in ns {
                    if !all.insert(*n) {
                        self.violation(format!("session {session}'s record {n} is in two logs"));
                    }
                }
            }
            counts.insert(*session, all.len() as u64);
        }
        for (session, n) in acked {
            if !live.contains(&session) || n == 0 {
                continue;
            }
            let have = counts.get(&session).copied().unwrap_or(0);
            if have != n {
                self.violation(format!(
                    "session {session} appended {n} records; the logs hold {have}"
                ));
            }
        }
    }

    fn deliver_due(&mut self) {
        while let Some((slot, id, body)) = self.wire.due(self.clock()) {
            if !matches!(
                body,
                Msg::ToPrimary(Asked::Events, _) | Msg::ToMount(ToMount::Events(_))
            ) {
                self.in_flight -= 1;
            }
            // A crashed mount's requests under way die with it, and its
            // answers find nobody.
            if self.mounts[slot].id != id {
                continue;
            }
            match body {
                Msg::ToPrimary(asked, req) => {
                    let now = self.clock();
                    self.soft
                        .request(&mut self.world, now, (slot, id, asked), req);
                    self.answer();
                }
                Msg::ToMount(m) => self.mount(slot, m),
            }
        }
    }

    /// The primary's timers.
    fn primary_tick(&mut self) {
        let now = self.clock();
        self.soft.tick(&mut self.world, now);
        self.answer();
    }

    /// Mount `slot` (new, or restarted by its node) says hello, and parks
    /// its first `Events` request.
    fn hello(&mut self, slot: usize) {
        let m = &mut self.mounts[slot];
        m.seq += 1;
        let (id, seq) = (m.id, m.seq);
        let hello = op::Request {
            session: id,
            seq,
            who: Identity::root(),
            op: Op::Hello {
                instance: [0; 16],
                node: format!("node{slot}").into_bytes(),
            },
        };
        let now = self.clock();
        (self.soft).request(&mut self.world, now, (slot, id, Asked::Hello), hello);
        self.answer();
        self.send_primary(
            slot,
            Asked::Events,
            Op::Events {
                confirm: Vec::new(),
            },
        );
    }

    fn crash(&mut self, slot: usize) {
        self.report.crashes += 1;
        let old = self.mounts[slot].id;
        self.log(format!("mount {slot} (session {old}) crashes"));
        self.crashed.insert(old, self.mounts[slot].appended);
        // Its changes not written back are gone with it; its tokens stay
        // until its lease runs out.
        let lost = self.mounts[slot].cache.all_dirty();
        let id = self.fresh_id();
        self.mounts[slot] = Mount::new(id);
        self.hello(slot);
        for ino in lost {
            let b = self.holder_view(ino);
            self.model.insert(ino, b);
        }
        let synced: Vec<(Ino, Vec<u8>)> =
            self.synced.iter().map(|(i, b)| (*i, b.clone())).collect();
        for (ino, b) in synced {
            self.report.fsyncs_checked += 1;
            if self.contents(ino) != b {
                self.violation(format!("file {ino} lost bytes it was fsynced with"));
            }
        }
    }
}
