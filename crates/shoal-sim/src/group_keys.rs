//! A group's keys (`shoal_group::keys`, the decisions the group shell
//! ships, and `shoal_group::seal`, the real sealing and opening of every
//! datagram) among processes that join, leave and have their nodes
//! revoked, over a network that loses calls and datagrams and delivers
//! some calls after their caller gave up.  A stranger of another uid asks
//! for the keys and forges rekeys.
//!
//! The membership is the group core's view at the sequencer, modelled: a
//! joiner counts once a member admitted it, a leaver at once, a member on
//! a revoked node once it has been silent a while (the core expels it);
//! when the sequencer goes, the lowest remaining member takes over after
//! a recovery.  Each member's key thread is the shell's: every
//! [`KEY_POLL`] it rekeys if the core says so (handing the next epoch to
//! each member in turn, each call ending at its answer or its
//! [`PUSH_DEADLINE`]) or, if a datagram came in an epoch it does not hold,
//! asks the sequencer, then the others, for the keys.
//!
//! Checks:
//! - **strangers get nothing**: in a group owned by one uid, the stranger
//!   is never admitted and never opens a datagram;
//! - **no forged or late key**: no member takes a rekey not made under
//!   the group's master, and none goes back to an epoch it has left;
//! - **every datagram is what was sealed**, and opens only for a process
//!   that obtained its epoch's key;
//! - **leavers are shut out**: once the membership changes, the sequencer
//!   draws a key for the new one at its first poll with no call in
//!   flight; once the network heals, a process that left or was expelled
//!   (or the stranger) opens nothing from anyone;
//! - **everyone current** once the network heals: every member holds the
//!   sequencer's epoch, made for exactly the members, and sends in it;
//!   the sequencer draws a new one every [`REKEY_EVERY`], and a member
//!   whose push is lost (one is, after the heal) hears the group again
//!   within a catch-up.

use std::collections::BTreeSet;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_cap::PutPort;
use shoal_group::keys::{
    CATCH_UP_EVERY, Catch, KEY_POLL, KeyCore, KeyReply, KeyRequest, Keys, Membership,
    PUSH_DEADLINE, REKEY_EVERY, decode_reply, encode_reply, encode_request, rekey_mac,
};
use shoal_group::seal::GroupSeal;
use shoal_proto::Time;
use shoal_wire::{GroupSeq, Incarnation, MemberId};

use crate::timeline::{Timeline, Trace};

/// A scenario's shape.
#[derive(Debug, Clone)]
pub struct KeysSimConfig {
    /// Processes of the group's uid that may join (one creates it).
    pub procs: usize,
    /// An open group admits anyone who knows its port.
    pub open: bool,
    /// Simulated time with faults and churn; then the network heals.
    pub run: Duration,
    pub loss_chance: f64,
    /// Chance that a call arrives after its caller gave up on it.
    pub late_chance: f64,
    /// Mean time between membership changes.
    pub churn_every: Duration,
    /// Chance that a change revokes a member's node.
    pub revoke_chance: f64,
    /// Mean time between a member's datagrams.
    pub send_every: Duration,
}

impl Default for KeysSimConfig {
    fn default() -> Self {
        KeysSimConfig {
            procs: 5,
            open: false,
            run: Duration::from_secs(60),
            loss_chance: 0.15,
            late_chance: 0.05,
            churn_every: Duration::from_secs(6),
            revoke_chance: 0.2,
            send_every: Duration::from_millis(400),
        }
    }
}

/// What a run saw.
#[derive(Debug, Default, Clone)]
pub struct KeysReport {
    pub draws: u64,
    pub rekeys_taken: u64,
    pub joins: u64,
    pub leaves: u64,
    pub revocations: u64,
    pub catch_ups: u64,
    pub opened: u64,
    pub refused: u64,
    pub late_calls: u64,
    pub pushes_dropped: u64,
    pub violations: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Out,
    Joining,
    Member,
    /// Left or expelled: its key service stopped, but it still hears the
    /// group's datagrams with the keys it had.
    Gone,
}

struct Proc {
    uid: u32,
    role: Role,
    id: MemberId,
    core: Option<KeyCore>,
    seal: Option<GroupSeal>,
    /// Its node was revoked: no call reaches it or leaves it.
    revoked: bool,
    /// Epochs whose keys it obtained, and those it moved on from.
    obtained: BTreeSet<u32>,
    left_behind: BTreeSet<u32>,
    /// Its key thread's call chain, and the call it waits on.
    pending: Option<(Chain, u64)>,
    sent: u64,
}

/// What a key thread (or a joiner) is doing: the processes still to ask,
/// the current one first.
enum Chain {
    Join(Vec<usize>),
    Push(Keys, Membership, Vec<usize>),
    CatchUp {
        want: u32,
        sequencer: Option<usize>,
        ask: Vec<usize>,
        located: bool,
    },
    Stranger,
}

enum Ev {
    Poll(usize),
    Send(usize),
    Request {
        from: usize,
        to: usize,
        call: u64,
        bytes: Vec<u8>,
    },
    Reply {
        to: usize,
        call: u64,
        bytes: Vec<u8>,
    },
    Datagram {
        to: usize,
        from: usize,
        bytes: Vec<u8>,
        plain: Vec<u8>,
        epoch: u32,
    },
    Deadline(usize, u64),
    Churn,
    Expel(usize),
    Recover,
    Stranger,
}

/// One seeded run.
pub struct KeysSim {
    cfg: KeysSimConfig,
    rng: ChaCha8Rng,
    now: Time,
    group: PutPort,
    procs: Vec<Proc>,
    /// The stranger's index (another uid).
    stranger: usize,
    /// The membership as the sequencer's core sees it, and the sequencer.
    members: BTreeSet<usize>,
    membership: Membership,
    sequencer: Option<usize>,
    events: Timeline<Ev>,
    next_call: u64,
    calm: bool,
    /// Epochs of forged rekeys.
    forged: BTreeSet<u32>,
    /// When each draw was made (the healed phase's), by the sequencer.
    draws: Vec<Time>,
    /// From when an outsider may open nothing at all.
    sealed_off: Option<Time>,
    /// After the heal, the next rekey to a member is lost (once), and when
    /// each member began to miss the sequencer's datagrams.
    drop_push: bool,
    deaf_since: Vec<Option<Time>>,
    /// When the membership changed, until the sequencer draws a key for
    /// the new one.
    changed_at: Option<Time>,
    report: KeysReport,
    trace: Trace,
}

fn at(d: Duration) -> Time {
    Time(d.as_micros() as u64)
}

impl KeysSim {
    pub fn new(seed: u64, cfg: KeysSimConfig) -> KeysSim {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut port: [u8; 16] = rng.random();
        port[0] = (port[0] & !1) | cfg.open as u8;
        let procs = (0..=cfg.procs)
            .map(|i| Proc {
                uid: if i == cfg.procs { 2000 } else { 1000 },
                role: Role::Out,
                id: MemberId(0),
                core: None,
                seal: None,
                revoked: false,
                obtained: BTreeSet::new(),
                left_behind: BTreeSet::new(),
                pending: None,
                sent: 0,
            })
            .collect();
        KeysSim {
            stranger: cfg.procs,
            rng,
            now: Time(0),
            group: PutPort::from_bytes(port),
            procs,
            members: BTreeSet::new(),
            membership: Membership {
                incarnation: Incarnation(1),
                entry: GroupSeq(0),
            },
            sequencer: None,
            events: Timeline::new(),
            next_call: 0,
            calm: false,
            forged: BTreeSet::new(),
            draws: Vec::new(),
            sealed_off: None,
            drop_push: false,
            deaf_since: vec![None; cfg.procs + 1],
            changed_at: None,
            report: KeysReport::default(),
            trace: Trace::from_env(),
            cfg,
        }
    }

    pub fn run(&mut self) -> KeysReport {
        // Process 0 creates the group.
        let keys = Keys {
            master: self.rng.random(),
            epoch: self.rng.random_range(1..u32::MAX),
            key: self.rng.random(),
            members: Vec::new(),
        };
        self.admitted(0, keys);
        self.sequencer = Some(0);
        self.schedule(Duration::from_secs(1), Ev::Churn);
        self.schedule(Duration::from_millis(500), Ev::Stranger);
        let run = at(self.cfg.run);
        self.until(run);
        // Heal: no loss, no late calls, no churn.  Revoked members are
        // expelled within 3 s, then a rekey shuts every outsider out.
        self.calm = true;
        let settled = run + REKEY_EVERY + Duration::from_secs(6);
        self.until(settled);
        self.sealed_off = Some(settled);
        self.drop_push = true;
        self.draws.clear();
        let mut end = settled + 2 * REKEY_EVERY + Duration::from_secs(1);
        self.until(end);
        // Checked between rekeys: none in flight, the last a second old.
        for _ in 0..150 {
            let busy = self
                .sequencer
                .is_some_and(|s| self.procs[s].pending.is_some());
            let recent = self
                .draws
                .last()
                .is_some_and(|t| end - *t < Duration::from_secs(1));
            if !busy && !recent {
                break;
            }
            end += Duration::from_millis(100);
            self.until(end);
        }
        self.final_checks();
        self.report.clone()
    }

    fn schedule(&mut self, after: Duration, ev: Ev) {
        self.events.at(self.now + after, ev);
    }

    fn until(&mut self, end: Time) {
        while let Some((t, ev)) = self.events.next(end) {
            self.now = t;
            self.handle(ev);
        }
        self.now = end;
    }

    fn note(&mut self, what: impl FnOnce() -> String) {
        self.trace.line(self.now.0, what);
    }

    fn violation(&mut self, what: String) {
        let t = Duration::from_micros(self.now.0);
        let what = format!("t={t:?}: {what}");
        self.trace
            .violation(self.now.0, &mut self.report.violations, what);
    }

    /// The run's trace (with `SHOAL_SIM_TRACE` set).
    pub fn trace(&self) -> &[String] {
        self.trace.lines()
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Poll(p) => self.poll(p),
            Ev::Send(p) => self.send(p),
            Ev::Request {
                from,
                to,
                call,
                bytes,
            } => self.serve(from, to, call, &bytes),
            Ev::Reply { to, call, bytes } => self.answered(to, call, Some(&bytes)),
            Ev::Datagram {
                to,
                from,
                mut bytes,
                plain,
                epoch,
            } => self.hear(to, from, &mut bytes, &plain, epoch),
            Ev::Deadline(p, call) => self.answered(p, call, None),
            Ev::Churn => self.churn(),
            Ev::Expel(p) => self.expel(p),
            Ev::Recover => self.recover(),
            Ev::Stranger => self.stranger(),
        }
    }

    /// Whether a message between `a` and `b` is lost: always if either's
    /// node was revoked (no session carries it), else by chance.
    fn lost(&mut self, a: usize, b: usize) -> bool {
        if self.procs[a].revoked || self.procs[b].revoked {
            return true;
        }
        !self.calm && self.rng.random_bool(self.cfg.loss_chance)
    }

    fn delay(&mut self) -> Duration {
        Duration::from_micros(self.rng.random_range(200..20_000))
    }

    /// `from` calls `to` with `request`; the chain waits for the answer
    /// until the deadline.
    fn call(&mut self, from: usize, to: usize, chain: Chain, request: &KeyRequest) {
        self.next_call += 1;
        let call = self.next_call;
        self.procs[from].pending = Some((chain, call));
        self.schedule(PUSH_DEADLINE, Ev::Deadline(from, call));
        if self.lost(from, to) {
            return;
        }
        if self.drop_push && matches!(request, KeyRequest::Rekey { .. }) {
            self.drop_push = false;
            self.report.pushes_dropped += 1;
            return;
        }
        let mut delay = self.delay();
        if !self.calm && self.rng.random_bool(self.cfg.late_chance) {
            delay = PUSH_DEADLINE + Duration::from_millis(self.rng.random_range(1..2_000));
            self.report.late_calls += 1;
        }
        let bytes = encode_request(request);
        self.schedule(
            delay,
            Ev::Request {
                from,
                to,
                call,
                bytes,
            },
        );
    }

    /// A member's key service answers a call (a process that is not a
    /// member serves none).
    fn serve(&mut self, from: usize, to: usize, call: u64, bytes: &[u8]) {
        if self.procs[from].revoked || self.procs[to].revoked || self.procs[to].role != Role::Member
        {
            return;
        }
        let (my_uid, caller_uid) = (self.procs[to].uid, self.procs[from].uid);
        let group = self.group;
        let now = self.now;
        let proc = &mut self.procs[to];
        let core = proc.core.as_mut().expect("a member has keys");
        let (refused, before) = (core.refused, core.keys().epoch);
        let (reply, take) = core.answer(&group, my_uid, caller_uid, bytes);
        self.report.refused += core.refused - refused;
        if let Some((epoch, key)) = take {
            let id = proc.id;
            self.note(|| format!("{to} ({id}) takes epoch {epoch} from {from}"));
            let proc = &mut self.procs[to];
            proc.seal
                .as_mut()
                .expect("a member seals")
                .add(now, epoch, key, false);
            self.report.rekeys_taken += 1;
            self.moved(to, before, epoch);
        }
        if self.lost(to, from) {
            return;
        }
        let delay = self.delay();
        self.schedule(
            delay,
            Ev::Reply {
                to: from,
                call,
                bytes: encode_reply(&reply),
            },
        );
    }

    /// Process `p` obtained epoch `epoch`'s key: checks that it is no
    /// forgery, and that a stranger of an owned group never gets one.
    fn obtain(&mut self, p: usize, epoch: u32) {
        if self.forged.contains(&epoch) {
            self.violation(format!("process {p} took the forged epoch {epoch}"));
        }
        if p == self.stranger && !self.cfg.open {
            self.violation(format!(
                "the stranger obtained epoch {epoch} of an owned group"
            ));
        }
        self.procs[p].obtained.insert(epoch);
    }

    /// Member `p`'s own epoch moved from `from` to `to`: never back to one
    /// it left.
    fn moved(&mut self, p: usize, from: u32, to: u32) {
        self.obtain(p, to);
        if self.procs[p].left_behind.contains(&to) {
            self.violation(format!("process {p} went back to epoch {to}"));
        }
        self.procs[p].left_behind.insert(from);
    }

    /// The answer to `p`'s call `call` came (`None`: its deadline passed).
    fn answered(&mut self, p: usize, call: u64, reply: Option<&[u8]>) {
        let Some((chain, waiting)) = self.procs[p].pending.take() else {
            return;
        };
        if waiting != call {
            self.procs[p].pending = Some((chain, waiting));
            return;
        }
        let reply = reply.and_then(|r| decode_reply(r).ok());
        match chain {
            Chain::Join(mut ask) => match reply {
                Some(KeyReply::Admitted(keys)) => self.admitted(p, keys),
                _ => {
                    ask.remove(0);
                    self.join_next(p, ask);
                }
            },
            Chain::Push(next, membership, mut to) => {
                to.remove(0);
                self.push_next(p, next, membership, to);
            }
            Chain::CatchUp {
                want,
                sequencer,
                mut ask,
                located,
            } => {
                if let Some(KeyReply::Admitted(keys)) = reply
                    && self.procs[p].role == Role::Member
                    && self.caught(p, want, ask[0], sequencer, &keys)
                {
                    return;
                }
                ask.remove(0);
                self.catch_up_next(p, want, sequencer, ask, located);
            }
            Chain::Stranger => {
                if let Some(KeyReply::Admitted(keys)) = reply {
                    if !self.cfg.open {
                        self.violation("the stranger was admitted to an owned group".into());
                    } else {
                        let seal = GroupSeal::new(keys.epoch, keys.key, &self.group, MemberId(1));
                        self.procs[p].seal = Some(seal);
                        self.obtain(p, keys.epoch);
                    }
                }
            }
        }
    }

    /// Joiner (or creator) `p` holds `keys`: it becomes a member.
    fn admitted(&mut self, p: usize, keys: Keys) {
        let id = MemberId(self.rng.random());
        let seal = GroupSeal::new(keys.epoch, keys.key, &self.group, id);
        let epoch = keys.epoch;
        let proc = &mut self.procs[p];
        proc.id = id;
        proc.role = Role::Member;
        proc.core = Some(KeyCore::new(keys));
        proc.seal = Some(seal);
        proc.obtained.clear();
        proc.left_behind.clear();
        self.obtain(p, epoch);
        self.members.insert(p);
        self.changed();
        self.report.joins += 1;
        let (poll, send) = (self.jitter(KEY_POLL), self.jitter(self.cfg.send_every));
        self.schedule(poll, Ev::Poll(p));
        self.schedule(send, Ev::Send(p));
    }

    fn jitter(&mut self, mean: Duration) -> Duration {
        let us = mean.as_micros() as u64;
        Duration::from_micros(self.rng.random_range(us / 2..=us * 3 / 2))
    }

    fn join_next(&mut self, p: usize, ask: Vec<usize>) {
        match ask.first() {
            Some(&to) => self.call(p, to, Chain::Join(ask), &KeyRequest::Admit),
            None => self.procs[p].role = Role::Out,
        }
    }

    /// A member's key thread looks whether to rekey or catch up.
    fn poll(&mut self, p: usize) {
        if self.procs[p].role != Role::Member {
            return;
        }
        let next = self.jitter(KEY_POLL);
        self.schedule(next, Ev::Poll(p));
        if self.procs[p].pending.is_some() {
            return;
        }
        let now = self.now;
        if self.sequencer == Some(p) {
            let ids = self.member_ids();
            let membership = self.membership;
            let due = self.procs[p]
                .core
                .as_ref()
                .expect("keys")
                .rekey_due(now, membership);
            if let Some(t) = self.changed_at.filter(|_| !due) {
                let ago = now - t;
                self.violation(format!(
                    "the membership changed {ago:?} ago and its idle sequencer {p} does not rekey"
                ));
            }
            if due {
                let core = self.procs[p].core.as_ref().expect("a member has keys");
                let key = self.rng.random();
                let rng = &mut self.rng;
                let next = core.next(ids, || rng.random(), key);
                let to = self.members.iter().copied().filter(|m| *m != p).collect();
                self.report.draws += 1;
                let (e, m) = (next.epoch, next.members.clone());
                self.note(|| format!("{p} draws epoch {e} for {m:?}"));
                self.push_next(p, next, membership, to);
                return;
            }
        }
        let proc = &mut self.procs[p];
        let Some(want) = proc.seal.as_ref().and_then(|s| s.behind()) else {
            return;
        };
        if !proc.core.as_mut().expect("keys").catch_up_due(now) {
            return;
        }
        self.report.catch_ups += 1;
        self.note(|| format!("{p} is behind, wants epoch {want}"));
        let sequencer = self.sequencer.filter(|s| *s != p);
        let mut ask: Vec<usize> = sequencer.into_iter().collect();
        ask.extend(
            self.members
                .iter()
                .copied()
                .filter(|m| *m != p && Some(*m) != sequencer),
        );
        self.catch_up_next(p, want, sequencer, ask, false);
    }

    /// The membership's ids, ascending, as the sequencer's core has them.
    fn member_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.members.iter().map(|m| self.procs[*m].id.0).collect();
        ids.sort_unstable();
        ids
    }

    fn push_next(&mut self, p: usize, next: Keys, membership: Membership, to: Vec<usize>) {
        match to.first() {
            Some(&m) => {
                let request = KeyRequest::rekey(&next);
                self.call(p, m, Chain::Push(next, membership, to), &request);
            }
            None => {
                let now = self.now;
                let current = membership == self.membership;
                let proc = &mut self.procs[p];
                if proc.role != Role::Member {
                    return;
                }
                let (epoch, key) = (next.epoch, next.key);
                let core = proc.core.as_mut().expect("keys");
                let before = core.keys().epoch;
                core.drawn(now, membership, next);
                proc.seal
                    .as_mut()
                    .expect("a seal")
                    .add(now, epoch, key, true);
                self.moved(p, before, epoch);
                if self.sequencer == Some(p) {
                    self.draws.push(now);
                    if current {
                        self.changed_at = None;
                    }
                }
            }
        }
    }

    fn catch_up_next(
        &mut self,
        p: usize,
        want: u32,
        sequencer: Option<usize>,
        mut ask: Vec<usize>,
        located: bool,
    ) {
        if ask.is_empty() && !located {
            // Whoever else serves the group, as a locate finds them.
            ask = (0..self.procs.len())
                .filter(|m| *m != p && self.procs[*m].role == Role::Member)
                .collect();
            return self.catch_up_next(p, want, sequencer, ask, true);
        }
        if let Some(&m) = ask.first() {
            let chain = Chain::CatchUp {
                want,
                sequencer,
                ask,
                located,
            };
            self.call(p, m, chain, &KeyRequest::Admit);
        }
    }

    /// `p`, behind, got `keys` from `from`: what the core makes of them.
    fn caught(
        &mut self,
        p: usize,
        want: u32,
        from: usize,
        sequencer: Option<usize>,
        keys: &Keys,
    ) -> bool {
        let now = self.now;
        let proc = &mut self.procs[p];
        let core = proc.core.as_mut().expect("keys");
        let seal = proc.seal.as_mut().expect("a seal");
        let before = core.keys().epoch;
        match core.caught(want, Some(from) == sequencer, keys) {
            Some(Catch::Own(epoch, key)) => {
                // The sequencer's own epoch: current, even if this member
                // held it before (a new sequencer may still be in it).
                seal.add(now, epoch, key, false);
                self.obtain(p, epoch);
                if epoch != before {
                    self.procs[p].left_behind.insert(before);
                    self.procs[p].left_behind.remove(&epoch);
                }
            }
            Some(Catch::Extra(epoch, key)) => {
                seal.add_extra(now, epoch, key);
                self.obtain(p, epoch);
            }
            None => return false,
        }
        true
    }

    /// A member seals a datagram to every other process that can hear.
    fn send(&mut self, p: usize) {
        if self.procs[p].role != Role::Member {
            return;
        }
        let next = self.jitter(self.cfg.send_every);
        self.schedule(next, Ev::Send(p));
        let proc = &mut self.procs[p];
        proc.sent += 1;
        let plain = format!("{p}:{}:{}", proc.id.0, proc.sent).into_bytes();
        let seal = proc.seal.as_mut().expect("a seal");
        let epoch = seal.sending();
        let mut bytes = Vec::new();
        seal.seal(&plain, &mut bytes);
        for to in 0..self.procs.len() {
            if to == p || self.procs[to].seal.is_none() {
                continue;
            }
            // Datagrams travel outside node sessions: a revoked node still
            // hears them.
            if !self.calm && self.rng.random_bool(self.cfg.loss_chance) {
                continue;
            }
            let delay = self.delay();
            self.schedule(
                delay,
                Ev::Datagram {
                    to,
                    from: p,
                    bytes: bytes.clone(),
                    plain: plain.clone(),
                    epoch,
                },
            );
        }
    }

    fn hear(&mut self, to: usize, from: usize, bytes: &mut [u8], plain: &[u8], epoch: u32) {
        let now = self.now;
        let Some(seal) = self.procs[to].seal.as_mut() else {
            return;
        };
        let opened = seal.open(now, bytes);
        self.deafness(to, from, opened.is_some());
        let Some(range) = opened else {
            return;
        };
        self.report.opened += 1;
        if &bytes[range] != plain {
            self.violation(format!(
                "process {to} opened another plaintext than {from} sealed"
            ));
        }
        if !self.procs[to].obtained.contains(&epoch) {
            self.violation(format!(
                "process {to} opened epoch {epoch} it never obtained"
            ));
        }
        let outsider = self.procs[to].role != Role::Member;
        if outsider && to == self.stranger && !self.cfg.open {
            self.violation("the stranger opened a datagram of an owned group".into());
        }
        if outsider
            && self
                .sealed_off
                .is_some_and(|t| now > t + Duration::from_millis(20))
        {
            self.violation(format!(
                "process {to}, out of the group, opened a datagram of {from} after the heal"
            ));
        }
    }

    /// After the heal, a member that missed a push hears the sequencer
    /// again within a catch-up.
    fn deafness(&mut self, to: usize, from: usize, opened: bool) {
        let after_heal = self.sealed_off.is_some_and(|t| self.now > t);
        if !after_heal || self.procs[to].role != Role::Member || Some(from) != self.sequencer {
            return;
        }
        if opened {
            self.deaf_since[to] = None;
            return;
        }
        let since = *self.deaf_since[to].get_or_insert(self.now);
        if self.now - since > CATCH_UP_EVERY + Duration::from_secs(1) {
            let deaf = self.now - since;
            self.violation(format!(
                "member {to} has not heard the sequencer for {deaf:?}"
            ));
            self.deaf_since[to] = None;
        }
    }

    /// Someone joins, leaves, or has its node revoked.
    fn churn(&mut self) {
        if self.calm {
            return;
        }
        let next = self.jitter(self.cfg.churn_every);
        self.schedule(next, Ev::Churn);
        let out: Vec<usize> = (0..self.cfg.procs)
            .filter(|p| {
                let q = &self.procs[*p];
                !q.revoked && matches!(q.role, Role::Out | Role::Gone) && q.pending.is_none()
            })
            .collect();
        let live: Vec<usize> = self
            .members
            .iter()
            .copied()
            .filter(|m| !self.procs[*m].revoked)
            .collect();
        if live.len() > 1 && (out.is_empty() || self.rng.random_bool(0.5)) {
            let p = live[self.rng.random_range(0..live.len())];
            if self.rng.random_bool(self.cfg.revoke_chance) {
                self.procs[p].revoked = true;
                self.report.revocations += 1;
                let after = Duration::from_millis(self.rng.random_range(500..3_000));
                self.schedule(after, Ev::Expel(p));
            } else {
                self.report.leaves += 1;
                self.expel(p);
            }
        } else if !out.is_empty() && !live.is_empty() {
            let p = out[self.rng.random_range(0..out.len())];
            let mut ask = live;
            let i = self.rng.random_range(0..ask.len());
            ask.rotate_left(i);
            self.procs[p].role = Role::Joining;
            self.join_next(p, ask);
        }
    }

    /// `p` is out of the membership (left, or expelled).
    fn expel(&mut self, p: usize) {
        if !self.members.remove(&p) {
            return;
        }
        self.changed();
        let proc = &mut self.procs[p];
        proc.role = Role::Gone;
        proc.pending = None;
        if self.sequencer == Some(p) {
            self.sequencer = None;
            let after = Duration::from_millis(self.rng.random_range(300..1_500));
            self.schedule(after, Ev::Recover);
        }
    }

    /// The membership changed: a join or leave entry of the stream.
    fn changed(&mut self) {
        let members = self.members.clone();
        self.note(|| format!("members now {members:?}"));
        self.membership.entry = self.membership.entry.next();
        self.changed_at.get_or_insert(self.now);
    }

    /// The lowest remaining member becomes the sequencer, of a new
    /// incarnation.
    fn recover(&mut self) {
        if self.sequencer.is_none() {
            self.membership.incarnation = self.membership.incarnation.next();
            self.changed_at.get_or_insert(self.now);
            self.sequencer = self
                .members
                .iter()
                .copied()
                .find(|m| !self.procs[*m].revoked);
            if self.sequencer.is_none() {
                self.sequencer = self.members.first().copied();
            }
        }
    }

    /// The stranger asks a member for the keys, or hands it a forged
    /// rekey.
    fn stranger(&mut self) {
        let next = self.jitter(Duration::from_secs(2));
        self.schedule(next, Ev::Stranger);
        let s = self.stranger;
        if self.calm || self.members.is_empty() || self.procs[s].pending.is_some() {
            return;
        }
        let list: Vec<usize> = self.members.iter().copied().collect();
        let to = list[self.rng.random_range(0..list.len())];
        let request = if self.rng.random_bool(0.5) {
            KeyRequest::Admit
        } else {
            let (master, key): ([u8; 32], [u8; 32]) = (self.rng.random(), self.rng.random());
            let epoch = self.rng.random_range(1..u32::MAX);
            self.forged.insert(epoch);
            let members = self.member_ids();
            let mac = rekey_mac(&master, epoch, &key, &members);
            KeyRequest::Rekey {
                epoch,
                key,
                members,
                mac,
            }
        };
        self.call(s, to, Chain::Stranger, &request);
    }

    fn final_checks(&mut self) {
        let Some(seq) = self.sequencer else {
            self.violation("no sequencer after the heal".into());
            return;
        };
        let ids = self.member_ids();
        let keys = self.procs[seq].core.as_ref().expect("keys").keys().clone();
        if keys.members != ids {
            self.violation(format!(
                "the sequencer's epoch is for members {:?}, the group has {ids:?}",
                keys.members
            ));
        }
        for m in self.members.clone() {
            let proc = &self.procs[m];
            let seal = proc.seal.as_ref().expect("a seal");
            let epoch = proc.core.as_ref().expect("keys").keys().epoch;
            if (epoch, seal.newest().0, seal.sending()) != (keys.epoch, keys.epoch, keys.epoch) {
                let what = format!(
                    "after the heal member {m} holds epoch {epoch}, opens {} and sends in {}, \
                     the sequencer's is {}",
                    seal.newest().0,
                    seal.sending(),
                    keys.epoch
                );
                self.violation(what);
            }
        }
        // A draw counts once handed out: a push to a member that does
        // not answer lasts until its deadline.
        let most = REKEY_EVERY + PUSH_DEADLINE + Duration::from_millis(500);
        let mut last = self.sealed_off.expect("sealed off");
        for t in self.draws.clone() {
            if t - last > most {
                self.violation(format!("no rekey for {:?} after the heal", t - last));
            }
            last = t;
        }
        if self.now - last > most {
            self.violation(format!("no rekey in the last {:?}", self.now - last));
        }
    }
}
