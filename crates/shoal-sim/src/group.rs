//! Simulation of a process group: the real [`GroupCore`] in every member,
//! a seeded network that drops, duplicates and reorders datagrams, crashes
//! (the sequencer's first), partitions that heal, joins, leaves and an
//! application that stops reading for a while.
//!
//! Each member's application keeps a hash chain over everything delivered
//! to it; a joiner starts from the chain in its state transfer.  One
//! checker per promise ([`GroupReport::violations`] names the broken one):
//!
//! - `total_order_agreement`: every member delivers the same entry at the
//!   same sequence number, and states transferred to joiners agree too;
//! - `no_gaps`: each member delivers consecutive sequence numbers from the
//!   point it joined;
//! - `no_duplicates`: no member delivers one message twice;
//! - `no_lost_sends`: a message whose send completed is delivered, by every
//!   member that stays in the group to the end;
//! - `membership_agreement`: every member sees the same membership at the
//!   same point (joins, leaves and views agree, and match the core's list);
//! - `bounded_memory`: the sequencer's history never exceeds its limit;
//! - `liveness`: once the faults stop, within a bound, every live process
//!   is a member of one incarnation, every message sent is delivered and
//!   all members have delivered the same stream.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_cap::GetPort;
use shoal_group::{
    Event, GroupConfig, GroupCore, GroupDest, GroupSeq, MemberEntry, MemberId, MsgId, Status,
};
use shoal_proto::Time;

use crate::net::Faults;
use crate::timeline::{Timeline, Trace};

/// Shape of one group simulation.
#[derive(Debug, Clone)]
pub struct GroupSimConfig {
    /// Members at the start.
    pub members: usize,
    pub resilience: usize,
    /// PB/BB threshold.
    pub large_bytes: usize,
    pub frag_bytes: usize,
    pub history_bytes: usize,
    /// Messages each member sends.
    pub messages: usize,
    /// Bodies are 0 to this many bytes.
    pub max_body: usize,
    /// Network behaviour during the fault phase; clean afterwards.
    pub faults: Faults,
    pub fault_phase_us: u64,
    /// Members crashed during the fault phase (the sequencer first).
    pub crashes: usize,
    /// Cut one member off for a while, then heal.
    pub partition: bool,
    /// New processes join during the fault phase.
    pub joins: usize,
    /// Members leave during the fault phase.
    pub leaves: usize,
    /// One member's application stops reading for a while.
    pub stall: bool,
    /// After the faults stop, the group must settle within this long.
    pub settle_us: u64,
}

impl Default for GroupSimConfig {
    fn default() -> Self {
        Self {
            members: 3,
            resilience: 1,
            large_bytes: 2_000,
            frag_bytes: 1_200,
            history_bytes: 256 * 1024,
            messages: 20,
            max_body: 4_000,
            faults: Faults::harsh(),
            fault_phase_us: 2_000_000,
            crashes: 0,
            partition: false,
            joins: 0,
            leaves: 0,
            stall: false,
            settle_us: 6_000_000,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct GroupReport {
    /// Broken promises, each prefixed with its checker's name.
    pub violations: Vec<String>,
    /// Sends that completed.
    pub sent_ok: usize,
    /// Highest sequence number delivered.
    pub last_seq: u64,
    /// Resets that installed a new incarnation (counted at the sequencers).
    pub resets: u64,
    /// Expulsions seen by applications.
    pub expelled: usize,
    /// Datagrams (a broadcast counts once) per delivered entry.
    pub datagrams: u64,
}

#[derive(Debug)]
enum Ev {
    Deliver {
        to: usize,
        from: SocketAddr,
        bytes: Vec<u8>,
    },
    Tick {
        p: usize,
    },
    Crash,
    Partition {
        p: usize,
        on: bool,
    },
    Join,
    Leave,
    Stall {
        on: bool,
    },
    Heal,
}

/// One process: at most one group member at a time.
struct Proc {
    addr: SocketAddr,
    core: Option<GroupCore>,
    alive: bool,
    left: bool,
    cut: bool,
    stalled: bool,
    /// Delivery position within the current membership (None: joining).
    last: Option<GroupSeq>,
    chain: u64,
    seen: HashSet<(MemberId, MsgId)>,
    members: Vec<MemberEntry>,
    /// Messages still to send.
    quota: usize,
    next_body: u64,
    /// Sent, not yet confirmed: msg_id → body hash.
    pending: BTreeMap<MsgId, u64>,
    scheduled: Option<Time>,
    /// Retry joining at this time.
    rejoin_at: Option<Time>,
}

/// A seeded group simulation.
pub struct GroupSim {
    cfg: GroupSimConfig,
    rng: ChaCha8Rng,
    group: shoal_cap::PutPort,
    now: Time,
    timeline: Timeline<Ev>,
    procs: Vec<Proc>,
    faults_on: bool,
    /// seq → (signature, chain after it).
    agreed: BTreeMap<GroupSeq, (u64, u64)>,
    /// Completed sends: (member, msg_id) → body hash.
    sent_ok: BTreeMap<(MemberId, MsgId), u64>,
    report: GroupReport,
    trace: Trace,
}

fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn hash_bytes(b: &[u8]) -> u64 {
    b.chunks(8).fold(b.len() as u64, |h, c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        mix(h, u64::from_le_bytes(w))
    })
}

fn body_for(p: usize, n: u64, len: usize) -> Bytes {
    let seed = mix(p as u64, n);
    Bytes::from(
        (0..len)
            .map(|i| mix(seed, i as u64) as u8)
            .collect::<Vec<u8>>(),
    )
}

impl GroupSim {
    pub fn new(seed: u64, cfg: GroupSimConfig) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let group = GetPort::from_bytes(rng.random()).put_port();
        let mut sim = Self {
            cfg,
            rng,
            group,
            now: Time(0),
            timeline: Timeline::new(),
            procs: Vec::new(),
            faults_on: true,
            agreed: BTreeMap::new(),
            sent_ok: BTreeMap::new(),
            report: GroupReport::default(),
            trace: Trace::from_env(),
        };
        sim.setup();
        sim
    }

    fn group_config(&self) -> GroupConfig {
        GroupConfig {
            resilience: self.cfg.resilience,
            large_bytes: self.cfg.large_bytes,
            frag_bytes: self.cfg.frag_bytes,
            history_bytes: self.cfg.history_bytes,
            send_window: 4,
            send_window_bytes: 64 * 1024,
            ..GroupConfig::default()
        }
    }

    fn new_proc(&mut self) -> usize {
        let i = self.procs.len();
        let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1 + i as u8)), 7000);
        self.procs.push(Proc {
            addr,
            core: None,
            alive: true,
            left: false,
            cut: false,
            stalled: false,
            last: None,
            chain: 0,
            seen: HashSet::new(),
            members: Vec::new(),
            quota: self.cfg.messages,
            next_body: 0,
            pending: BTreeMap::new(),
            scheduled: None,
            rejoin_at: None,
        });
        i
    }

    fn member_id(&mut self) -> MemberId {
        MemberId(self.rng.random_range(1..u64::MAX))
    }

    fn setup(&mut self) {
        let cfg = self.group_config();
        let first = self.new_proc();
        let me = MemberEntry {
            id: self.member_id(),
            addr: self.procs[first].addr,
        };
        self.procs[first].core = Some(GroupCore::create(self.now, self.group, me, cfg));
        self.after(first);
        for _ in 1..self.cfg.members {
            let p = self.new_proc();
            self.start_join(p);
        }
        // Members join before the faults begin.
        let fault_start = 500_000;
        let end = fault_start + self.cfg.fault_phase_us;
        for _ in 0..self.cfg.crashes {
            let t = self.rng.random_range(fault_start..end);
            self.timeline.at(Time(t), Ev::Crash);
        }
        if self.cfg.partition {
            let p = self.rng.random_range(0..self.cfg.members);
            let t = self.rng.random_range(fault_start..end);
            self.timeline.at(Time(t), Ev::Partition { p, on: true });
            let len = self.rng.random_range(100_000..1_500_000);
            self.timeline
                .at(Time((t + len).min(end)), Ev::Partition { p, on: false });
        }
        for _ in 0..self.cfg.joins {
            let t = self.rng.random_range(fault_start..end);
            self.timeline.at(Time(t), Ev::Join);
        }
        for _ in 0..self.cfg.leaves {
            let t = self.rng.random_range(fault_start..end);
            self.timeline.at(Time(t), Ev::Leave);
        }
        if self.cfg.stall {
            let t = self.rng.random_range(fault_start..end);
            self.timeline.at(Time(t), Ev::Stall { on: true });
            let len = self.rng.random_range(100_000..2_000_000);
            self.timeline.at(Time(t + len), Ev::Stall { on: false });
        }
        self.timeline.at(Time(end), Ev::Heal);
    }

    fn start_join(&mut self, p: usize) {
        // A joiner's own parameters do not matter: it adopts the group's
        // with its state (this checks that it does).
        let cfg = GroupConfig {
            resilience: 0,
            large_bytes: 1 << 20,
            ..self.group_config()
        };
        let id = self.member_id();
        let contacts: Vec<SocketAddr> = (0..self.procs.len())
            .filter(|&q| q != p)
            .map(|q| self.procs[q].addr)
            .collect();
        let me = MemberEntry {
            id,
            addr: self.procs[p].addr,
        };
        let nonce = self.rng.random();
        let core = GroupCore::join(self.now, self.group, me, cfg, contacts, nonce);
        let proc = &mut self.procs[p];
        proc.core = Some(core);
        proc.last = None;
        proc.seen.clear();
        proc.pending.clear();
        proc.rejoin_at = None;
        self.after(p);
    }

    fn log(&mut self, line: impl FnOnce() -> String) {
        self.trace.line(self.now.0, line);
    }

    fn violation(&mut self, what: String) {
        let now = self.now.0;
        self.trace.violation(now, &mut self.report.violations, what);
    }

    /// The event trace (with `SHOAL_SIM_TRACE` set).
    pub fn trace(&self) -> &[String] {
        self.trace.lines()
    }

    /// Runs to the end and checks every promise.
    pub fn run(&mut self) -> GroupReport {
        let end = Time(500_000 + self.cfg.fault_phase_us + self.cfg.settle_us);
        while let Some((t, ev)) = self.timeline.next(end) {
            self.now = t;
            self.step(ev);
        }
        self.now = end;
        self.final_checks();
        self.report.clone()
    }

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver { to, from, bytes } => {
                let p = &mut self.procs[to];
                if !p.alive || p.cut {
                    return;
                }
                if let Some(core) = p.core.as_mut() {
                    core.handle_datagram(self.now, from, &bytes);
                }
                self.after(to);
            }
            Ev::Tick { p } => {
                if self.procs[p].scheduled != Some(self.now) {
                    return;
                }
                self.procs[p].scheduled = None;
                if !self.procs[p].alive {
                    return;
                }
                if let Some(t) = self.procs[p].rejoin_at
                    && t <= self.now
                {
                    self.start_join(p);
                    return;
                }
                if let Some(core) = self.procs[p].core.as_mut() {
                    core.handle_timeout(self.now);
                }
                self.after(p);
            }
            Ev::Crash => {
                // Crash only a group at full strength (a group of one that
                // loses its only member is simply gone); else try later.
                let full = self.procs.iter().find_map(|p| {
                    let c = p.core.as_ref().filter(|c| p.alive && c.is_sequencer())?;
                    let inc = c.incarnation();
                    let settled = c.members().iter().all(|m| {
                        self.procs.iter().any(|q| {
                            q.alive
                                && q.core.as_ref().is_some_and(|qc| {
                                    qc.id() == m.id
                                        && qc.status() == Status::Normal
                                        && qc.incarnation() == inc
                                })
                        })
                    });
                    Some(settled && c.members().len() >= self.cfg.members)
                });
                if full != Some(true) {
                    if self.faults_on {
                        self.timeline
                            .at(self.now + Duration::from_millis(100), Ev::Crash);
                    }
                    return;
                }
                // The sequencer first, then anyone still a member.
                let victim = (0..self.procs.len())
                    .find(|&i| {
                        self.procs[i].alive
                            && self.procs[i]
                                .core
                                .as_ref()
                                .is_some_and(|c| c.is_sequencer())
                    })
                    .or_else(|| (0..self.procs.len()).find(|&i| self.procs[i].alive));
                if let Some(v) = victim {
                    self.log(|| format!("crash p{v}"));
                    self.procs[v].alive = false;
                    self.procs[v].core = None;
                }
            }
            Ev::Partition { p, on } => {
                self.log(|| format!("partition p{p} {on}"));
                self.procs[p].cut = on;
            }
            Ev::Join => {
                let p = self.new_proc();
                self.log(|| format!("join p{p}"));
                self.start_join(p);
            }
            Ev::Leave => {
                let cand: Vec<usize> = (0..self.procs.len())
                    .filter(|&i| {
                        self.procs[i].alive
                            && !self.procs[i].left
                            && self.procs[i]
                                .core
                                .as_ref()
                                .is_some_and(|c| c.status() == Status::Normal)
                    })
                    .collect();
                // A leave must not leave the group without a majority once
                // the scheduled crashes happen.
                if cand.len() > 2 + self.cfg.crashes {
                    let v = cand[self.rng.random_range(0..cand.len())];
                    self.log(|| format!("leave p{v}"));
                    self.procs[v].left = true;
                    self.procs[v].quota = 0;
                    if let Some(core) = self.procs[v].core.as_mut() {
                        core.leave(self.now);
                    }
                    self.after(v);
                }
            }
            Ev::Stall { on } => {
                let v = (0..self.procs.len())
                    .find(|&i| self.procs[i].alive && !self.procs[i].left && i > 0)
                    .unwrap_or(0);
                self.log(|| format!("stall p{v} {on}"));
                self.procs[v].stalled = on;
                if !on {
                    for p in &mut self.procs {
                        p.stalled = false;
                    }
                }
                self.after(v);
            }
            Ev::Heal => {
                self.log(|| "heal".to_string());
                self.faults_on = false;
                for p in &mut self.procs {
                    p.cut = false;
                    p.stalled = false;
                }
            }
        }
    }

    /// After a process's core ran: move its datagrams, run its
    /// application, schedule its timer.
    fn after(&mut self, p: usize) {
        if !self.procs[p].alive {
            return;
        }
        if !self.procs[p].stalled {
            self.run_app(p);
        }
        let mut out = Vec::new();
        let mut members = Vec::new();
        if let Some(core) = self.procs[p].core.as_mut() {
            while let Some(t) = core.poll_transmit() {
                out.push(t);
            }
            members = core.members().iter().map(|m| m.addr).collect();
            if core.is_sequencer() && core.info().history_bytes > self.cfg.history_bytes {
                let bytes = core.info().history_bytes;
                self.violation(format!(
                    "bounded_memory: sequencer history {bytes} bytes over its {} limit",
                    self.cfg.history_bytes
                ));
            }
        }
        let from = self.procs[p].addr;
        for t in out {
            self.report.datagrams += 1;
            let targets: Vec<SocketAddr> = match t.dest {
                GroupDest::Addr(a) => vec![a],
                GroupDest::Members => members.iter().copied().filter(|a| *a != from).collect(),
            };
            for to in targets {
                self.send(from, to, t.bytes.clone());
            }
        }
        let next = self.procs[p]
            .core
            .as_ref()
            .and_then(|c| c.poll_timeout())
            .into_iter()
            .chain(self.procs[p].rejoin_at)
            .min();
        if let Some(t) = next {
            let t = t.max(self.now + Duration::from_micros(1));
            if self.procs[p]
                .scheduled
                .is_none_or(|s| s > t || s < self.now)
            {
                self.procs[p].scheduled = Some(t);
                self.timeline.at(t, Ev::Tick { p });
            }
        }
    }

    fn send(&mut self, from: SocketAddr, to: SocketAddr, bytes: Vec<u8>) {
        let Some(dst) = self.procs.iter().position(|q| q.addr == to) else {
            return;
        };
        let src = self
            .procs
            .iter()
            .position(|q| q.addr == from)
            .expect("sender exists");
        if self.procs[src].cut || self.procs[dst].cut {
            return;
        }
        let faults = if self.faults_on {
            self.cfg.faults.clone()
        } else {
            Faults::none()
        };
        for d in faults.verdict(&mut self.rng) {
            self.timeline.at(
                self.now + Duration::from_micros(d),
                Ev::Deliver {
                    to: dst,
                    from,
                    bytes: bytes.clone(),
                },
            );
        }
    }

    fn run_app(&mut self, p: usize) {
        while let Some((msg_id, _seq)) = self.procs[p].core.as_mut().and_then(|c| c.poll_sent()) {
            let id = self.procs[p]
                .core
                .as_ref()
                .map(|c| c.id())
                .unwrap_or_default();
            if let Some(h) = self.procs[p].pending.remove(&msg_id) {
                self.sent_ok.insert((id, msg_id), h);
                self.report.sent_ok += 1;
            }
        }
        loop {
            let Some(ev) = self.procs[p].core.as_mut().and_then(|c| c.poll_event()) else {
                break;
            };
            self.on_event(p, ev);
        }
        // Send while there is quota and room.
        let now = self.now;
        loop {
            let proc = &mut self.procs[p];
            if proc.quota == 0 || proc.left {
                break;
            }
            let Some(core) = proc.core.as_mut() else {
                break;
            };
            let n = proc.next_body;
            let len = (mix(p as u64 * 7919, n) % (self.cfg.max_body as u64 + 1)) as usize;
            if !core.can_send(len) {
                break;
            }
            let body = body_for(p, n, len);
            let h = hash_bytes(&body);
            match core.send(now, body) {
                Ok(id) => {
                    proc.pending.insert(id, h);
                    proc.next_body += 1;
                    proc.quota -= 1;
                }
                Err(_) => break,
            }
        }
    }

    fn deliver_entry(&mut self, p: usize, seq: GroupSeq, sig: u64, what: &str) {
        let Some(last) = self.procs[p].last else {
            self.violation(format!(
                "no_gaps: p{p} delivered {what} at {seq} before joining"
            ));
            return;
        };
        if seq != last.next() {
            self.violation(format!(
                "no_gaps: p{p} delivered {what} at {seq} after {last}"
            ));
        }
        let chain = mix(self.procs[p].chain, mix(seq.0, sig));
        self.procs[p].chain = chain;
        self.procs[p].last = Some(seq);
        self.report.last_seq = self.report.last_seq.max(seq.0);
        match self.agreed.get(&seq) {
            Some(&(s, c)) => {
                if s != sig {
                    self.violation(format!(
                        "total_order_agreement: p{p} delivered {what} at {seq}, others another entry"
                    ));
                } else if c != chain {
                    self.violation(format!(
                        "total_order_agreement: p{p}'s stream up to {seq} differs from others'"
                    ));
                }
            }
            None => {
                self.agreed.insert(seq, (sig, chain));
            }
        }
    }

    fn on_event(&mut self, p: usize, ev: Event) {
        self.log(|| format!("p{p} event {ev:?}").chars().take(200).collect());
        match ev {
            Event::Message {
                seq,
                sender,
                msg_id,
                body,
            } => {
                let h = hash_bytes(&body);
                if !self.procs[p].seen.insert((sender, msg_id)) {
                    self.violation(format!(
                        "no_duplicates: p{p} delivered message {sender}/{msg_id} twice"
                    ));
                }
                if let Some(&sent) = self.sent_ok.get(&(sender, msg_id))
                    && sent != h
                {
                    self.violation(format!(
                        "total_order_agreement: message {sender}/{msg_id} body changed"
                    ));
                }
                self.deliver_entry(p, seq, mix(mix(sender.0, msg_id.0), h), "message");
            }
            Event::Joined { seq, member } => {
                let sig = mix(
                    1,
                    mix(member.id.0, hash_bytes(member.addr.to_string().as_bytes())),
                );
                self.procs[p].members.push(member);
                self.deliver_entry(p, seq, sig, "join");
                self.check_members(p, seq);
            }
            Event::Left { seq, member } => {
                self.procs[p].members.retain(|m| m.id != member);
                self.deliver_entry(p, seq, mix(2, member.0), "leave");
                self.check_members(p, seq);
            }
            Event::View { seq, inc, members } => {
                let sig = members.iter().fold(mix(3, inc.0), |h, m| mix(h, m.id.0));
                if self.procs[p].last.is_none() {
                    // A new group's first entry.
                    self.procs[p].last = Some(seq.prev());
                }
                self.procs[p].members = members;
                self.deliver_entry(p, seq, sig, "view");
                self.check_members(p, seq);
            }
            Event::State {
                seq,
                state,
                members,
            } => {
                let Ok(bytes) = <[u8; 16]>::try_from(&state[..]) else {
                    self.violation(format!("total_order_agreement: p{p} got a malformed state"));
                    return;
                };
                let at = GroupSeq(u64::from_le_bytes(bytes[..8].try_into().expect("8")));
                let chain = u64::from_le_bytes(bytes[8..].try_into().expect("8"));
                if at != seq {
                    self.violation(format!(
                        "total_order_agreement: state for {at} delivered as {seq}"
                    ));
                }
                if let Some(&(_, c)) = self.agreed.get(&seq)
                    && c != chain
                {
                    self.violation(format!(
                        "total_order_agreement: p{p} got a state at {seq} that differs from the stream"
                    ));
                }
                let proc = &mut self.procs[p];
                proc.last = Some(seq);
                proc.chain = chain;
                proc.members = members;
                self.check_members(p, seq);
            }
            Event::StateWanted { joiner } => {
                let proc = &self.procs[p];
                let mut state = Vec::with_capacity(16);
                state.extend_from_slice(&proc.last.unwrap_or_default().0.to_le_bytes());
                state.extend_from_slice(&proc.chain.to_le_bytes());
                let now = self.now;
                if let Some(core) = self.procs[p].core.as_mut() {
                    core.provide_state(now, joiner, &state);
                }
            }
            Event::Expelled | Event::JoinFailed => {
                self.report.expelled += 1;
                let proc = &mut self.procs[p];
                // Unconfirmed messages are given up; the application sends
                // new ones after joining again.
                proc.quota += proc.pending.len();
                proc.pending.clear();
                proc.core = None;
                proc.last = None;
                if !proc.left {
                    proc.rejoin_at = Some(self.now + Duration::from_millis(50));
                }
            }
            Event::LeftGroup => {
                self.procs[p].core = None;
            }
            Event::ResetFailed { .. } => {}
        }
    }

    fn check_members(&mut self, p: usize, seq: GroupSeq) {
        let Some(core) = self.procs[p].core.as_ref() else {
            return;
        };
        // The core's list may run ahead of delivery; compare only when it
        // does not.
        if core.delivered() != seq || core.members().is_empty() {
            return;
        }
        let mut a: Vec<MemberId> = self.procs[p].members.iter().map(|m| m.id).collect();
        let mut b: Vec<MemberId> = core.members().iter().map(|m| m.id).collect();
        a.sort();
        b.sort();
        if a != b && core.held() == seq {
            self.violation(format!(
                "membership_agreement: p{p}'s events say {a:?} at {seq}, its core {b:?}"
            ));
        }
    }

    /// One line per live member: what its core says (and its members).
    fn describe(&self) -> String {
        (0..self.procs.len())
            .filter_map(|i| {
                let c = self.procs[i].core.as_ref()?;
                let info = c.info();
                Some(format!(
                    "p{i}: {:?}{} inc {} seqr {} held {} commit {} stable {} known {} history {} B, {} in flight",
                    info.status,
                    if info.is_sequencer { " (sequencer)" } else { "" },
                    info.incarnation,
                    info.sequencer,
                    info.held,
                    info.committed,
                    info.stable,
                    info.last_known,
                    info.history_bytes,
                    info.in_flight
                ))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn final_checks(&mut self) {
        let before = self.report.violations.len();
        self.settled();
        if self.report.violations.len() > before {
            let state = self.describe();
            self.report
                .violations
                .push(format!("(state at the end: {state})"));
        }
    }

    fn settled(&mut self) {
        // The group must have settled: every live process a member of one
        // incarnation, everything sent delivered, all streams equal.
        let live: Vec<usize> = (0..self.procs.len())
            .filter(|&i| self.procs[i].alive && !self.procs[i].left)
            .collect();
        let mut incs = HashSet::new();
        let mut lasts = HashSet::new();
        for &i in &live {
            let proc = &self.procs[i];
            let Some(core) = proc.core.as_ref() else {
                self.violation(format!("liveness: p{i} is not in the group at the end"));
                continue;
            };
            if core.status() != Status::Normal {
                let st = core.status();
                self.violation(format!("liveness: p{i} is {st:?} at the end"));
                continue;
            }
            incs.insert(core.incarnation());
            lasts.insert(proc.last);
            if !proc.pending.is_empty() || proc.quota > 0 {
                let (n, q) = (proc.pending.len(), proc.quota);
                let info = core.info();
                self.violation(format!(
                    "liveness: p{i} still has {n} unconfirmed and {q} unsent messages at the end \
                     (inc {} seqr {} held {} commit {} in flight {})",
                    info.incarnation, info.sequencer, info.held, info.committed, info.in_flight
                ));
            }
        }
        if incs.len() > 1 {
            self.violation(format!("liveness: members end in incarnations {incs:?}"));
        }
        if lasts.len() > 1 {
            let detail: Vec<String> = live
                .iter()
                .filter_map(|&i| {
                    let c = self.procs[i].core.as_ref()?;
                    let info = c.info();
                    Some(format!(
                        "p{i}: inc {} seqr {} held {} commit {} known {}",
                        info.incarnation,
                        info.sequencer,
                        info.held,
                        info.committed,
                        info.last_known
                    ))
                })
                .collect();
            self.violation(format!(
                "liveness: members end at different points {lasts:?} ({})",
                detail.join("; ")
            ));
        }
        // Every completed send is in the agreed stream.
        let delivered: HashSet<u64> = self.agreed.values().map(|(s, _)| *s).collect();
        let missing: Vec<_> = self
            .sent_ok
            .iter()
            .filter(|((id, msg), h)| !delivered.contains(&mix(mix(id.0, msg.0), **h)))
            .map(|(k, _)| *k)
            .collect();
        if let Some((id, msg)) = missing.first() {
            let n = missing.len();
            self.violation(format!(
                "no_lost_sends: {n} completed sends never delivered (first {id}/{msg})"
            ));
        }
        self.report.resets = self
            .procs
            .iter()
            .filter_map(|p| p.core.as_ref())
            .map(|c| c.stats().resets)
            .max()
            .unwrap_or(0);
    }
}
