//! Revocation and service-map gossip (`shoal_node::gossip`, the rules the
//! daemon ships, with the real signature checks of `shoal-session`)
//! between nodes over a network that loses, delays and partitions, while
//! nodes crash and come back and the administrator hands new records to
//! any node.  Forgers deliver records signed by another key, for another
//! cluster, damaged, or old ones replayed.  Each node does what the
//! daemon's `hear` does with a node-session plaintext (`NodeMsg`): answer
//! a version with the record or its own version, take a record if it
//! verifies and is newer.
//!
//! Checks:
//! - **only the admin's records**: a node never holds a record that does
//!   not verify under the cluster's admin key;
//! - **never back**: a node's version of each record never goes down,
//!   across crashes (what it took is on its disk);
//! - **everyone learns**: once the network heals and every node is up,
//!   every node holds the newest version of both records within two
//!   announcement intervals;
//! - **quiet when agreed**: once they agree, no record is sent again.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_node::gossip::{ANNOUNCE_EVERY, Announcer, Answer, answer, newer};
use shoal_proto::Time;
use shoal_session::{AdminKey, ClusterId, RevocationList, ServiceEntry, ServiceMap};
use shoal_wire::NodeMsg;

use crate::timeline::{Timeline, Trace};

/// A scenario's shape.
#[derive(Debug, Clone)]
pub struct GossipSimConfig {
    pub nodes: usize,
    /// Simulated time with faults, then time to settle.
    pub run: Duration,
    pub loss_chance: f64,
    /// Chance per second that a node crashes (it is back within 30 s).
    pub crash_chance: f64,
    /// Chance per second that a link between two nodes is cut (for up to
    /// 30 s).
    pub cut_chance: f64,
    /// Mean time between records the administrator issues.
    pub issue_every: Duration,
    /// Chance per second that a forger delivers a record to a node.
    pub forge_chance: f64,
}

impl Default for GossipSimConfig {
    fn default() -> Self {
        GossipSimConfig {
            nodes: 5,
            run: Duration::from_secs(300),
            loss_chance: 0.2,
            crash_chance: 0.01,
            cut_chance: 0.02,
            issue_every: Duration::from_secs(30),
            forge_chance: 0.05,
        }
    }
}

/// What a run saw.
#[derive(Debug, Default, Clone)]
pub struct GossipReport {
    pub issued: u64,
    pub taken_from_peers: u64,
    pub forgeries_refused: u64,
    pub crashes: u64,
    pub records_sent: u64,
    pub violations: Vec<String>,
    /// The run's trace (with `SHOAL_SIM_TRACE` set): its violations.
    pub trace: Vec<String>,
}

/// The two records, by the tags that carry their versions and bytes.
const KINDS: [(NodeMsg, NodeMsg); 2] = [
    (NodeMsg::Revocations, NodeMsg::RevocationList),
    (NodeMsg::Services, NodeMsg::ServiceMap),
];

struct Node {
    up: bool,
    /// When its pending tick is (one at a time).
    tick_at: Option<Time>,
    /// The highest version it ever held of each kind.
    high: [u64; 2],
    /// Each kind's record: version and signed bytes (on the node's disk).
    held: [Option<(u64, Vec<u8>)>; 2],
    announcer: Announcer,
}

enum Event {
    Deliver {
        to: usize,
        from: usize,
        bytes: Vec<u8>,
    },
    Tick(usize),
    Second,
    Restart(usize),
}

/// One seeded run.
pub struct GossipSim {
    cfg: GossipSimConfig,
    rng: ChaCha8Rng,
    now: Time,
    nodes: Vec<Node>,
    /// Cut links (a, b) with a < b, until when.
    cuts: BTreeMap<(usize, usize), Time>,
    events: Timeline<Event>,
    cluster: ClusterId,
    admin: AdminKey,
    /// The newest version issued of each kind, and every record issued.
    issued: [u64; 2],
    history: [Vec<Vec<u8>>; 2],
    calm: bool,
    /// Records sent since the last check.
    sent_records: u64,
    trace: Trace,
    report: GossipReport,
}

impl GossipSim {
    pub fn new(seed: u64, cfg: GossipSimConfig) -> GossipSim {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let cluster = ClusterId(rng.random());
        let admin = AdminKey::from_seed(rng.random());
        let nodes = (0..cfg.nodes)
            .map(|_| Node {
                up: true,
                tick_at: None,
                high: [0, 0],
                held: [None, None],
                announcer: Announcer::new(),
            })
            .collect();
        GossipSim {
            cfg,
            rng,
            now: Time::ZERO,
            nodes,
            cuts: BTreeMap::new(),
            events: Timeline::new(),
            cluster,
            admin,
            issued: [0, 0],
            history: [Vec::new(), Vec::new()],
            calm: false,
            sent_records: 0,
            trace: Trace::from_env(),
            report: GossipReport::default(),
        }
    }

    pub fn run(mut self) -> GossipReport {
        for i in 0..self.nodes.len() {
            self.wake(i, Time::ZERO);
        }
        self.events.at(Time::from_secs(1), Event::Second);
        self.issue();
        let run = Time::ZERO + self.cfg.run;
        self.until(run);
        // Heal: every node up, no cut, no loss, no forger, no new record.
        self.calm = true;
        self.cuts.clear();
        for i in 0..self.nodes.len() {
            if !self.nodes[i].up {
                self.restart(i);
            }
        }
        let settled = run + 2 * ANNOUNCE_EVERY + Duration::from_secs(1);
        self.until(settled);
        let mut healed = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            for (k, held) in n.held.iter().enumerate() {
                let version = held.as_ref().map_or(0, |h| h.0);
                if version != self.issued[k] {
                    let issued = self.issued[k];
                    healed.push(format!(
                        "after the heal node {i} holds version {version} of record {k}, not {issued}"
                    ));
                }
            }
        }
        for v in healed {
            self.violation(v);
        }
        self.sent_records = 0;
        let quiet = settled + 3 * ANNOUNCE_EVERY;
        self.until(quiet);
        if self.sent_records > 0 {
            let n = self.sent_records;
            self.violation(format!("{n} records sent after every node agreed"));
        }
        self.report.trace = self.trace.lines().to_vec();
        self.report
    }

    fn violation(&mut self, what: String) {
        let what = format!("t={}: {what}", self.now.0);
        self.trace
            .violation(self.now.0, &mut self.report.violations, what);
    }

    fn until(&mut self, end: Time) {
        while let Some((at, e)) = self.events.next(end) {
            self.now = at;
            self.handle(e);
        }
        self.now = end;
    }

    fn handle(&mut self, e: Event) {
        match e {
            Event::Deliver { to, from, bytes } => self.deliver(to, from, &bytes),
            Event::Tick(i) => self.tick(i),
            Event::Second => self.second(),
            Event::Restart(i) => self.restart(i),
        }
    }

    /// Once a second: faults, the administrator, forgers.
    fn second(&mut self) {
        let now = self.now;
        self.events.at(now + Duration::from_secs(1), Event::Second);
        self.cuts.retain(|_, until| *until > now);
        if self.calm {
            return;
        }
        let n = self.nodes.len();
        for i in 0..n {
            if self.nodes[i].up && self.rng.random_bool(self.cfg.crash_chance) {
                self.nodes[i].up = false;
                self.report.crashes += 1;
                let back = Duration::from_millis(self.rng.random_range(100..30_000));
                self.events.at(now + back, Event::Restart(i));
            }
        }
        if self.rng.random_bool(self.cfg.cut_chance) {
            let a = self.rng.random_range(0..n);
            let b = (a + self.rng.random_range(1..n)) % n;
            let until = now + Duration::from_millis(self.rng.random_range(100..30_000));
            self.cuts.insert((a.min(b), a.max(b)), until);
        }
        let every = self.cfg.issue_every.as_secs_f64();
        if self.rng.random_bool((1.0 / every).min(1.0)) {
            self.issue();
        }
        if self.rng.random_bool(self.cfg.forge_chance) {
            self.forge();
        }
    }

    /// The administrator signs a newer record of one kind and hands it to
    /// one node that is up (`shoal node revoke`, `shoal service map`).
    fn issue(&mut self) {
        let up: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].up)
            .collect();
        if up.is_empty() {
            // No node to hand it to: the administrator's command fails.
            return;
        }
        let i = up[self.rng.random_range(0..up.len())];
        let k = self.rng.random_range(0..2);
        self.issued[k] += 1;
        let version = self.issued[k];
        let bytes = Self::sign(
            k,
            version,
            self.now.0 / 1_000_000,
            &self.admin,
            self.cluster,
        );
        self.history[k].push(bytes.clone());
        self.report.issued += 1;
        self.take(i, k, &bytes);
    }

    fn sign(k: usize, version: u64, issued: u64, admin: &AdminKey, cluster: ClusterId) -> Vec<u8> {
        let signed = if k == 0 {
            let serials = (1..=version).map(|s| s * 7).collect();
            RevocationList {
                version,
                issued,
                serials,
            }
            .sign(cluster, admin)
        } else {
            ServiceMap {
                version,
                issued,
                entries: vec![ServiceEntry {
                    name: "dir".into(),
                    nodes: vec![version, version + 1],
                }],
            }
            .sign(cluster, admin)
        };
        signed.expect("a record signs")
    }

    /// A forger hands a node a record the admin did not sign for this
    /// cluster, a damaged one, or an old one.
    fn forge(&mut self) {
        let k = self.rng.random_range(0..2);
        let version = self.issued[k] + 1 + self.rng.random_range(0..3);
        let bytes = match self.rng.random_range(0..4) {
            0 => {
                let stranger = AdminKey::from_seed(self.rng.random());
                Self::sign(k, version, self.now.0 / 1_000_000, &stranger, self.cluster)
            }
            1 => {
                let elsewhere = ClusterId(self.rng.random());
                Self::sign(k, version, self.now.0 / 1_000_000, &self.admin, elsewhere)
            }
            2 => {
                let mut b = Self::sign(
                    k,
                    version,
                    self.now.0 / 1_000_000,
                    &self.admin,
                    self.cluster,
                );
                let at = self.rng.random_range(0..b.len());
                b[at] ^= 1 << self.rng.random_range(0..8);
                b
            }
            _ => match self.history[k].len() {
                0 => return,
                n => self.history[k][self.rng.random_range(0..n)].clone(),
            },
        };
        let i = self.rng.random_range(0..self.nodes.len());
        let from = (i + 1) % self.nodes.len();
        let tag = KINDS[k].1;
        self.events.at(
            self.now,
            Event::Deliver {
                to: i,
                from,
                bytes: tag.with(&bytes),
            },
        );
    }

    fn restart(&mut self, i: usize) {
        if self.nodes[i].up {
            return;
        }
        // What it took is on its disk; its announcer starts afresh.
        self.nodes[i].up = true;
        self.nodes[i].announcer = Announcer::new();
        self.wake(i, self.now);
    }

    fn linked(&self, a: usize, b: usize) -> bool {
        self.nodes[a].up && self.nodes[b].up && !self.cuts.contains_key(&(a.min(b), a.max(b)))
    }

    fn send(&mut self, from: usize, to: usize, bytes: Vec<u8>) {
        if NodeMsg::split(&bytes).is_some_and(|(t, _)| KINDS.iter().any(|k| k.1 == t)) {
            self.sent_records += 1;
            self.report.records_sent += 1;
        }
        if !self.calm && self.rng.random_bool(self.cfg.loss_chance) {
            return;
        }
        let delay = Duration::from_micros(self.rng.random_range(100..50_000));
        self.events
            .at(self.now + delay, Event::Deliver { to, from, bytes });
    }

    /// Makes node `i`'s pending tick come at `at` if that is sooner.
    fn wake(&mut self, i: usize, at: Time) {
        if self.nodes[i].tick_at.is_none_or(|t| at < t) {
            self.nodes[i].tick_at = Some(at);
            self.events.at(at, Event::Tick(i));
        }
    }

    /// A node's announcer: the versions it holds, to every peer.
    fn tick(&mut self, i: usize) {
        let now = self.now;
        if self.nodes[i].tick_at != Some(now) {
            return;
        }
        self.nodes[i].tick_at = None;
        if !self.nodes[i].up {
            return;
        }
        if self.nodes[i].announcer.poll(now) {
            for peer in 0..self.nodes.len() {
                if peer != i && self.linked(i, peer) {
                    for (k, (version_tag, _)) in KINDS.iter().enumerate() {
                        let m = version_tag.with(&self.version(i, k).to_le_bytes());
                        self.send(i, peer, m);
                    }
                }
            }
        }
        let next = self.nodes[i]
            .announcer
            .next()
            .max(now + Duration::from_millis(1));
        self.wake(i, next);
    }

    fn version(&self, i: usize, k: usize) -> u64 {
        self.nodes[i].held[k].as_ref().map_or(0, |h| h.0)
    }

    /// What the daemon's `hear` does with a node-session plaintext.
    fn deliver(&mut self, to: usize, from: usize, bytes: &[u8]) {
        if !self.linked(to, from) {
            return;
        }
        let Some((tag, body)) = NodeMsg::split(bytes) else {
            return self.violation(format!("node {from} sent node {to} a bad plaintext"));
        };
        for (k, (version_tag, record_tag)) in KINDS.iter().enumerate() {
            if tag == *version_tag {
                let Ok(theirs) = <[u8; 8]>::try_from(body) else {
                    return self.violation(format!("a version of {} bytes", body.len()));
                };
                let theirs = u64::from_le_bytes(theirs);
                let reply = {
                    let ours = self.nodes[to].held[k].as_ref().map(|(v, b)| (*v, &b[..]));
                    match answer(theirs, ours) {
                        Some(Answer::Record(b)) => Some(record_tag.with(b)),
                        Some(Answer::OurVersion) => {
                            Some(version_tag.with(&self.version(to, k).to_le_bytes()))
                        }
                        None => None,
                    }
                };
                if let Some(m) = reply {
                    self.send(to, from, m);
                }
                return;
            }
            if tag == *record_tag {
                if self.take(to, k, body) {
                    self.report.taken_from_peers += 1;
                }
                return;
            }
        }
    }

    /// Takes a record if it verifies and is newer (what `revocation::take`
    /// and `service_map::take` do); says whether it did.
    fn take(&mut self, i: usize, k: usize, bytes: &[u8]) -> bool {
        let admin = self.admin.public();
        let version = if k == 0 {
            RevocationList::verify(bytes, self.cluster, &admin).map(|l| l.version)
        } else {
            ServiceMap::verify(bytes, self.cluster, &admin).map(|m| m.version)
        };
        let Ok(version) = version else {
            self.report.forgeries_refused += 1;
            return false;
        };
        let held = self.nodes[i].held[k].as_ref().map(|h| h.0);
        if !newer(held, version) {
            return false;
        }
        if !self.history[k].iter().any(|b| b == bytes) {
            self.violation(format!("node {i} took a record the admin never issued"));
        }
        if version <= self.nodes[i].high[k] {
            let high = self.nodes[i].high[k];
            self.violation(format!(
                "node {i} went back from version {high} to {version}"
            ));
        }
        self.nodes[i].high[k] = version;
        self.nodes[i].held[k] = Some((version, bytes.to_vec()));
        self.nodes[i].announcer.soon();
        self.wake(i, self.now);
        true
    }
}
