//! Private directories (`docs/fs.md`, "Private directories") over a
//! network that delays and reorders every message: clients running the
//! real [`Private`] copy make directories at a primary running the real
//! [`Tree`], [`Tokens`] and push rule ([`check_push`]), change names in
//! them without a message, push on a timer, look at each other's
//! directories (a recall: the holder pushes, ends its privacy, then
//! answers) and crash.  The primary crashes too: its tree (the replicas'
//! state) stays, its tokens go, and what was in flight to or from it is
//! lost; the new primary is in its grace period until every client has
//! reclaimed `Write` on the inodes of its copy the primary knows (as a
//! mount does), and the clients then send again what was unanswered.
//!
//! The checks:
//! - **a push makes the copy**: when a push is answered, every inode of
//!   the pusher's copy with a name is, at the primary, exactly as the copy
//!   shows it (attributes, secret, body);
//! - **no look at a private directory**: a look is answered only when no
//!   other live client holds the directory in its copy (its unpushed
//!   changes would be missing from the answer);
//! - **no refused push** from a live client, and **no refused reclaim**;
//! - **liveness**: every look is answered.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_fs::model::{Attr, FsError, Identity, Ino, Kind, ROOT, Time};
use shoal_fs::private::{Private, check_push};
use shoal_fs::tokens::{Callback, ClientId, Decision, Level, Tokens, Want};
use shoal_fs::update::{Answer, Pushed, Update, UpdateOp};
use shoal_fs::{Applied, Tree};
use shoal_proto::Time as Tick;

use crate::timeline::Timeline;

/// What a run does.
#[derive(Debug, Clone)]
pub struct PrivateSimConfig {
    pub clients: usize,
    pub ticks: u64,
    pub delay_max: u64,
    pub op_chance: f64,
    pub crash_chance: f64,
    /// Chance, each tick, that the primary crashes.
    pub primary_crash_chance: f64,
    /// Ticks a pending change waits before it is pushed.
    pub push_after: u64,
}

impl Default for PrivateSimConfig {
    fn default() -> Self {
        PrivateSimConfig {
            clients: 3,
            ticks: 500,
            delay_max: 6,
            op_chance: 0.4,
            crash_chance: 0.003,
            primary_crash_chance: 0.002,
            push_after: 40,
        }
    }
}

/// What a run found.
#[derive(Debug, Default)]
pub struct PrivateReport {
    pub pushes_checked: usize,
    pub looks: usize,
    pub recalls: usize,
    pub local_changes: usize,
    pub crashes: usize,
    pub primary_crashes: usize,
    pub reclaims: usize,
    pub violations: Vec<String>,
}

#[derive(Debug, Clone)]
enum ToPrimary {
    Mkdir {
        seq: u64,
        name: Vec<u8>,
        ino: Ino,
        secret: [u8; 16],
    },
    /// After a primary change: a hello, and `Write` on these inodes.
    Reclaim {
        inos: Vec<Ino>,
    },
    Push {
        seq: u64,
        ops: Vec<Pushed>,
    },
    Look {
        dir: Ino,
    },
    Returned {
        ino: Ino,
        grant: u64,
        kept: Level,
    },
}

#[derive(Debug, Clone)]
enum ToClient {
    Made {
        attr: Attr,
        secret: [u8; 16],
        grant: Option<u64>,
    },
    Pushed {
        seq: u64,
        results: Vec<Result<Answer, FsError>>,
        made: Vec<(Ino, u64)>,
    },
    /// The primary changed: reclaim.
    NewPrimary,
    Reclaimed {
        grants: Vec<(Ino, u64)>,
    },
    /// A push refused (its request number).
    Refused(u64, FsError),
    /// A look answered, granting `grant` on `dir` (the client must know
    /// it as seen: a recall of it may follow).
    Looked {
        dir: Ino,
        grant: u64,
    },
    Callback(Callback),
}

struct Client {
    id: ClientId,
    core: Private,
    /// The highest grant seen, by inode (a recall of a later one waits).
    seen: HashMap<Ino, u64>,
    /// Recalls waiting: for their grant, or for the push under way.
    recalls: Vec<(Ino, Level, u64)>,
    pushing: Option<u64>,
    /// The highest grant whose recall was answered, by inode.
    answered: HashMap<Ino, u64>,
    /// The directory a look is out for.
    looking: Option<Ino>,
    /// Directories being made: (request number, name, inode).
    making: Vec<(u64, Vec<u8>, Ino)>,
    push_seq: u64,
    next_ino: Ino,
    made_dirs: u64,
}

/// One seeded run.
pub struct PrivateSim {
    rng: ChaCha8Rng,
    cfg: PrivateSimConfig,
    now: u64,
    /// Messages in flight: (client slot, the client's id then, body).
    wire: Timeline<(usize, ClientId, Result<ToPrimary, ToClient>)>,
    tree: Tree,
    tokens: Tokens,
    /// Looks waiting for recalls: (client slot, its id, directory).
    parked: Vec<(usize, ClientId, Ino)>,
    clients: Vec<Client>,
    next_id: ClientId,
    update_seq: u64,
    /// The primary's incarnation.
    epoch: u32,
    /// During a grace period: when it ends at the latest, the clients
    /// that reclaimed, and the requests held until it ends.
    grace_until: Option<u64>,
    reclaimed: Vec<ClientId>,
    held: Vec<(usize, ClientId, ToPrimary)>,
    report: PrivateReport,
    trace: Vec<String>,
}

const RANGE: u32 = 10_000;

impl PrivateSim {
    pub fn new(seed: u64, cfg: PrivateSimConfig) -> PrivateSim {
        let mut sim = PrivateSim {
            rng: ChaCha8Rng::seed_from_u64(seed),
            now: 0,
            wire: Timeline::new(),
            tree: Tree::new([0; 16], Time::new(0, 0)),
            tokens: Tokens::new(),
            parked: Vec::new(),
            clients: Vec::new(),
            next_id: 1,
            update_seq: 0,
            epoch: 0,
            grace_until: None,
            reclaimed: Vec::new(),
            held: Vec::new(),
            report: PrivateReport::default(),
            trace: Vec::new(),
            cfg,
        };
        for _ in 0..sim.cfg.clients {
            let c = sim.new_client();
            sim.clients.push(c);
        }
        sim
    }

    fn new_client(&mut self) -> Client {
        // Odd session numbers, as a mount's are.
        self.next_id += 2;
        let id = self.next_id;
        self.tokens.hello(self.now, id);
        let first = match self.order(0, 0, &Identity::root(), UpdateOp::Range { count: RANGE }) {
            Ok(Answer::Range { first, .. }) => first,
            other => unreachable!("a range: {other:?}"),
        };
        Client {
            id,
            core: Private::new(),
            seen: HashMap::new(),
            recalls: Vec::new(),
            pushing: None,
            answered: HashMap::new(),
            looking: None,
            making: Vec::new(),
            push_seq: 0,
            next_ino: first,
            made_dirs: 0,
        }
    }

    /// The run's trace (with `SHOAL_SIM_TRACE` set, the tests print it).
    pub fn trace(&self) -> &[String] {
        &self.trace
    }

    fn log(&mut self, line: String) {
        if self.trace.len() < 100_000 {
            self.trace.push(format!("{:5} {line}", self.now));
        }
    }

    fn violation(&mut self, v: String) {
        self.log(format!("VIOLATION {v}"));
        if self.report.violations.len() < 10 {
            self.report.violations.push(v);
        }
    }

    fn clock(&self) -> Time {
        Time::new(self.now as i64, 0)
    }

    /// An update the replicas order, in exactly-once session `session`.
    fn order(
        &mut self,
        session: u64,
        seq: u64,
        who: &Identity,
        op: UpdateOp,
    ) -> Result<Answer, FsError> {
        let (session, seq) = if session == 0 {
            self.update_seq += 1;
            (0, self.update_seq)
        } else {
            (session, seq)
        };
        let u = Update {
            session,
            seq,
            who: who.clone(),
            now: self.clock(),
            op,
        };
        match self.tree.apply(&u) {
            Applied::New(r) | Applied::Duplicate(r) => r,
        }
    }

    fn send(&mut self, slot: usize, id: ClientId, body: Result<ToPrimary, ToClient>) {
        let delay = self.rng.random_range(1..=self.cfg.delay_max);
        self.wire.at(Tick(self.now + delay), (slot, id, body));
    }

    fn send_primary(&mut self, slot: usize, m: ToPrimary) {
        let id = self.clients[slot].id;
        self.send(slot, id, Ok(m));
    }

    pub fn run(&mut self) -> PrivateReport {
        while self.now < self.cfg.ticks {
            self.step(true);
        }
        let until = self.now + 3000;
        while self.now < until
            && (!self.wire.is_empty() || !self.parked.is_empty() || self.grace_until.is_some())
        {
            self.step(false);
        }
        for slot in 0..self.clients.len() {
            if self.clients[slot].looking.is_some() {
                self.violation(format!("client {slot}'s look never answered"));
            }
        }
        std::mem::take(&mut self.report)
    }

    fn step(&mut self, busy: bool) {
        self.now += 1;
        if busy && self.rng.random_bool(self.cfg.primary_crash_chance) {
            self.primary_crash();
        }
        if self.grace_until.is_some_and(|t| t <= self.now) {
            self.end_grace();
        }
        self.deliver_due();
        for slot in 0..self.clients.len() {
            if busy && self.rng.random_bool(self.cfg.crash_chance) {
                self.crash(slot);
                continue;
            }
            let c = &self.clients[slot];
            if c.pushing.is_none() && c.core.due(self.now, self.cfg.push_after) {
                self.push(slot);
            }
            if busy && self.rng.random_bool(self.cfg.op_chance) {
                self.start_op(slot);
            }
        }
    }

    fn crash(&mut self, slot: usize) {
        self.report.crashes += 1;
        let old = self.clients[slot].id;
        self.log(format!("client {slot} (session {old}) crashes"));
        self.tokens.expire(self.now, Some(old));
        self.clients[slot] = self.new_client();
        // A new session has nothing to reclaim.
        self.reclaimed.push(self.clients[slot].id);
        self.flush_callbacks();
        self.retry_parked();
    }

    /// The primary crashes and another replica takes over: the tree stays,
    /// the tokens go, every message to or from the old one is lost, and
    /// the clients are told (as a mount learns it from its session).
    fn primary_crash(&mut self) {
        self.report.primary_crashes += 1;
        self.epoch += 1;
        self.log(format!("the primary crashes (epoch {})", self.epoch));
        self.tokens = Tokens::after_change(self.epoch);
        self.wire.clear();
        self.parked.clear();
        self.held.clear();
        self.reclaimed.clear();
        self.grace_until = Some(self.now + 4 * self.cfg.delay_max + 10);
        for slot in 0..self.clients.len() {
            let id = self.clients[slot].id;
            self.send(slot, id, Err(ToClient::NewPrimary));
        }
    }

    /// The grace period ends (every client reclaimed, or its time is up):
    /// the requests held meanwhile are decided.
    fn end_grace(&mut self) {
        if self.grace_until.take().is_none() {
            return;
        }
        self.log("the grace period ends".into());
        self.tokens.end_grace();
        for (slot, id, m) in std::mem::take(&mut self.held) {
            if self.tokens.knows(id) {
                self.primary(slot, id, m);
            }
        }
        self.retry_parked();
    }

    fn start_op(&mut self, slot: usize) {
        let pick = self.rng.random_range(0..10u8);
        let c = &self.clients[slot];
        let dirs: Vec<Ino> = c
            .core
            .inodes()
            .filter(|i| i.attr.kind == Kind::Dir && i.attr.nlink > 0)
            .map(|i| i.attr.ino)
            .collect();
        match pick {
            // One request at a time in the session, as a mount's calls.
            0 if c.making.is_empty() => {
                let c = &mut self.clients[slot];
                c.made_dirs += 1;
                let name = format!("c{}-{}", c.id, c.made_dirs).into_bytes();
                let ino = c.next_ino;
                c.next_ino += 1;
                let seq = c.made_dirs;
                c.making.push((seq, name.clone(), ino));
                self.send_primary(
                    slot,
                    ToPrimary::Mkdir {
                        seq,
                        name,
                        ino,
                        secret: [3; 16],
                    },
                );
            }
            1 if c.looking.is_none() => {
                // Any directory at the primary, another client's private
                // ones included.
                let all: Vec<Ino> = self
                    .tree
                    .inodes()
                    .filter(|i| i.attr.kind == Kind::Dir && i.attr.ino != ROOT && i.attr.nlink > 0)
                    .map(|i| i.attr.ino)
                    .collect();
                if all.is_empty() {
                    return;
                }
                let dir = all[self.rng.random_range(0..all.len())];
                self.clients[slot].looking = Some(dir);
                self.report.looks += 1;
                self.log(format!("client {slot} looks at {dir}"));
                self.send_primary(slot, ToPrimary::Look { dir });
            }
            _ if !dirs.is_empty() && c.pushing.is_none() => {
                let dir = dirs[self.rng.random_range(0..dirs.len())];
                let name = format!("n{}", self.rng.random_range(0..4)).into_bytes();
                let to = dirs[self.rng.random_range(0..dirs.len())];
                let to_name = format!("n{}", self.rng.random_range(0..4)).into_bytes();
                let (now, clock) = (self.clock(), self.now);
                let c = &mut self.clients[slot];
                let op = match pick {
                    2..=4 => {
                        c.next_ino += 1;
                        UpdateOp::Create {
                            parent: dir,
                            name,
                            kind: if pick == 4 { Kind::Dir } else { Kind::File },
                            perm: 0o755,
                            rdev: 0,
                            ino: c.next_ino - 1,
                            secret: [7; 16],
                            target: Vec::new(),
                            excl: true,
                        }
                    }
                    5 | 6 => UpdateOp::Unlink {
                        parent: dir,
                        dir: c.core.lookup(dir, &name).is_ok_and(|a| a.kind == Kind::Dir),
                        name,
                        open: false,
                    },
                    _ => UpdateOp::Rename {
                        from: dir,
                        from_name: name,
                        to,
                        to_name,
                        noreplace: false,
                        open_victim: false,
                    },
                };
                if c.core.change(&Identity::root(), now, op, clock).is_ok() {
                    self.report.local_changes += 1;
                }
            }
            _ => {}
        }
    }

    /// Sends the pending changes (again after a crash of the primary
    /// would use the same number).
    fn push(&mut self, slot: usize) {
        let c = &mut self.clients[slot];
        let ops = c.core.to_push();
        if ops.is_empty() {
            return;
        }
        c.push_seq += 1;
        let seq = c.push_seq;
        c.pushing = Some(seq);
        self.log(format!("client {slot} pushes {} changes", ops.len()));
        self.send_primary(slot, ToPrimary::Push { seq, ops });
    }

    fn deliver_due(&mut self) {
        while let Some((slot, id, body)) = self.wire.due(Tick(self.now)) {
            match body {
                // A crashed client's reclaim would hold its tokens until
                // its lease ran out; leases do not run out in this model,
                // so the reclaim is lost with the client.
                Ok(ToPrimary::Reclaim { inos }) => {
                    if self.clients[slot].id == id {
                        self.reclaim(slot, id, inos);
                    }
                }
                Ok(m) if self.tokens.in_grace() => {
                    if self.tokens.knows(id) {
                        self.held.push((slot, id, m));
                    }
                }
                Ok(m) => {
                    if self.tokens.knows(id) {
                        self.primary(slot, id, m);
                    }
                }
                Err(m) => {
                    if self.clients[slot].id == id {
                        self.client(slot, m);
                    }
                }
            }
        }
    }

    /// A client's hello and reclaims at a new primary.
    fn reclaim(&mut self, slot: usize, id: ClientId, inos: Vec<Ino>) {
        self.tokens.hello(self.now, id);
        let mut grants = Vec::new();
        for ino in inos {
            // Made since the last push, which did not reach the old
            // primary: nothing to reclaim (the push makes it).
            if self.tree.get(ino).is_none() {
                continue;
            }
            self.report.reclaims += 1;
            match self
                .tokens
                .reclaim(self.now, id, ino, Level::Write, true, &[])
            {
                Ok(g) => grants.push((ino, g)),
                Err(e) => {
                    self.violation(format!("client {slot}'s reclaim of {ino} refused: {e:?}"))
                }
            }
        }
        if !self.reclaimed.contains(&id) {
            self.reclaimed.push(id);
        }
        self.send(slot, id, Err(ToClient::Reclaimed { grants }));
        if self.grace_until.is_some() && self.clients.iter().all(|c| self.reclaimed.contains(&c.id))
        {
            self.end_grace();
        }
    }

    fn primary(&mut self, slot: usize, id: ClientId, m: ToPrimary) {
        match m {
            ToPrimary::Reclaim { inos } => self.reclaim(slot, id, inos),
            ToPrimary::Mkdir {
                seq,
                name,
                ino,
                secret,
            } => {
                let op = UpdateOp::Create {
                    parent: ROOT,
                    name,
                    kind: Kind::Dir,
                    perm: 0o755,
                    rdev: 0,
                    ino,
                    secret,
                    target: Vec::new(),
                    excl: true,
                };
                // Exactly once in the client's session: sent again at a new
                // primary, it is answered as it was.
                if let Ok(Answer::Entry { attr, .. }) = self.order(id, seq, &Identity::root(), op) {
                    let grant = match self.tokens.request(id, ino, Want::Change, &[], None) {
                        Decision::Grant {
                            level: Level::Write,
                            grant,
                            ..
                        } => Some(grant),
                        _ => None,
                    };
                    self.send(
                        slot,
                        id,
                        Err(ToClient::Made {
                            attr,
                            secret,
                            grant,
                        }),
                    );
                }
            }
            ToPrimary::Push { seq, ops } => {
                // Applied already (its answer lost with the old primary):
                // answered again as it was.
                let applied = self.tree.recorded(id & !1, seq).is_some();
                let made = match check_push(&ops, |ino| {
                    applied || self.tokens.level(id, ino) == Level::Write
                }) {
                    Ok(made) => made,
                    Err(e) => return self.send(slot, id, Err(ToClient::Refused(seq, e))),
                };
                let results =
                    match self.order(id & !1, seq, &Identity::root(), UpdateOp::Push { ops }) {
                        Ok(Answer::Pushed(results)) => results,
                        other => {
                            let e = other.err().unwrap_or(FsError::Io);
                            return self.send(slot, id, Err(ToClient::Refused(seq, e)));
                        }
                    };
                for r in &results {
                    if let Ok(Answer::Removed {
                        gone: Some(ino), ..
                    }) = r
                    {
                        self.tokens.forget(*ino);
                    }
                }
                let grants = made
                    .iter()
                    .filter(|ino| self.tree.get(**ino).is_some())
                    .filter_map(|ino| {
                        // Answered again, a push gives the grants it gave.
                        if applied && self.tokens.level(id, *ino) == Level::Write {
                            return Some((*ino, self.tokens.grant_of(id, *ino)));
                        }
                        match self.tokens.request(id, *ino, Want::Change, &[], None) {
                            Decision::Grant { grant, .. } => Some((*ino, grant)),
                            _ => None,
                        }
                    })
                    .collect();
                self.send(
                    slot,
                    id,
                    Err(ToClient::Pushed {
                        seq,
                        results,
                        made: grants,
                    }),
                );
            }
            ToPrimary::Look { dir } => match self.tokens.request(id, dir, Want::Look, &[], None) {
                Decision::Wait { recalled } => {
                    self.log(format!(
                        "client {slot}'s look at {dir} waits for {recalled:?}"
                    ));
                    self.parked.push((slot, id, dir));
                    self.flush_callbacks();
                }
                Decision::NoSession => {}
                Decision::Grant { grant, .. } => self.looked(slot, id, dir, grant),
            },
            ToPrimary::Returned { ino, grant, kept } => {
                self.tokens.returned(id, ino, grant, kept, &[]);
                self.retry_parked();
            }
        }
    }

    /// A look answered: nobody else may still hold the directory in its
    /// copy.
    fn looked(&mut self, slot: usize, id: ClientId, dir: Ino, grant: u64) {
        for (other, c) in self.clients.iter().enumerate() {
            if other != slot && c.core.holds(dir) {
                let v = format!(
                    "client {slot}'s look at {dir} answered while client {other} holds it in its copy"
                );
                self.violation(v);
                break;
            }
        }
        self.send(slot, id, Err(ToClient::Looked { dir, grant }));
    }

    fn retry_parked(&mut self) {
        for (slot, id, dir) in std::mem::take(&mut self.parked) {
            if !self.tokens.knows(id) {
                continue;
            }
            match self.tokens.request(id, dir, Want::Look, &[], None) {
                Decision::Wait { .. } => self.parked.push((slot, id, dir)),
                Decision::NoSession => {}
                Decision::Grant { grant, .. } => self.looked(slot, id, dir, grant),
            }
        }
        self.flush_callbacks();
    }

    fn flush_callbacks(&mut self) {
        while let Some((to, cb)) = self.tokens.poll_callback() {
            if let Some(slot) = self.clients.iter().position(|c| c.id == to) {
                self.log(format!("callback to client {slot}: {cb:?}"));
                self.send(slot, to, Err(ToClient::Callback(cb)));
            }
        }
    }

    fn client(&mut self, slot: usize, m: ToClient) {
        match m {
            ToClient::Made {
                attr,
                secret,
                grant,
            } => {
                self.log(format!(
                    "client {slot}'s directory {} made, grant {grant:?}",
                    attr.ino
                ));
                let c = &mut self.clients[slot];
                let Some(at) = c.making.iter().position(|m| m.2 == attr.ino) else {
                    // Answered already (sent again at a new primary, and
                    // the first went through too): the later grant is
                    // the token's now, and a recall may name it.
                    if let Some(g) = grant {
                        let s = c.seen.entry(attr.ino).or_default();
                        *s = (*s).max(g);
                        self.carry_out(slot);
                    }
                    return;
                };
                c.making.remove(at);
                if let Some(g) = grant {
                    let c = &mut self.clients[slot];
                    let s = c.seen.entry(attr.ino).or_default();
                    *s = (*s).max(g);
                    // Private only if the token is still held: a look at
                    // the new directory by this client may have answered
                    // first, and a recall of that later grant with it.
                    if c.answered.get(&attr.ino).is_none_or(|a| *a < g) {
                        c.core.adopt_dir(attr, secret, ROOT);
                    } else {
                        self.log(format!("client {slot}'s directory {} was recalled before its making was answered", attr.ino));
                    }
                }
                self.carry_out(slot);
            }
            // Answered already (sent again at a new primary, and the first
            // went through too): its grants are the ones seen.
            ToClient::Pushed { seq, .. } if self.clients[slot].pushing != Some(seq) => {}
            ToClient::Pushed { results, made, .. } => {
                self.report.pushes_checked += 1;
                if results.iter().any(|r| r.is_err()) {
                    self.violation(format!(
                        "client {slot}'s push: a change was refused: {results:?}"
                    ));
                }
                self.agree(slot);
                let c = &mut self.clients[slot];
                c.core.pushed();
                c.pushing = None;
                for (ino, g) in made {
                    let s = c.seen.entry(ino).or_default();
                    *s = (*s).max(g);
                }
                self.carry_out(slot);
            }
            // The answer to a push sent again after a later one went
            // through (a mount's calls never cross so).
            ToClient::Refused(seq, _) if self.clients[slot].pushing != Some(seq) => {}
            ToClient::Refused(_, e) => {
                self.violation(format!("client {slot}'s push refused: {e}"));
                let c = &mut self.clients[slot];
                c.pushing = None;
                c.core.dissolve();
                self.carry_out(slot);
            }
            ToClient::Looked { dir, grant } => {
                self.log(format!(
                    "client {slot}'s look at {dir} answered, grant {grant}"
                ));
                let c = &mut self.clients[slot];
                c.looking = None;
                let s = c.seen.entry(dir).or_default();
                *s = (*s).max(grant);
                self.carry_out(slot);
            }
            ToClient::Callback(Callback::Recall { ino, to, grant }) => {
                self.report.recalls += 1;
                self.clients[slot].recalls.push((ino, to, grant));
                self.carry_out(slot);
            }
            ToClient::Callback(_) => {}
            ToClient::NewPrimary => {
                // As a mount does: `Write` on every inode of the copy the
                // primary knows (those made since the last push come with
                // it); recalls of the old primary's grants are void.
                let c = &mut self.clients[slot];
                c.recalls.clear();
                let inos: Vec<Ino> = c.core.known().into_iter().map(|(ino, _)| ino).collect();
                self.log(format!("client {slot} reclaims {inos:?}"));
                self.send_primary(slot, ToPrimary::Reclaim { inos });
            }
            ToClient::Reclaimed { grants } => {
                // Everything unanswered goes again.
                let c = &mut self.clients[slot];
                for (ino, g) in grants {
                    let s = c.seen.entry(ino).or_default();
                    *s = (*s).max(g);
                }
                let again: Vec<ToPrimary> = c
                    .making
                    .iter()
                    .map(|(seq, name, ino)| ToPrimary::Mkdir {
                        seq: *seq,
                        name: name.clone(),
                        ino: *ino,
                        secret: [3; 16],
                    })
                    .chain(c.looking.map(|dir| ToPrimary::Look { dir }))
                    .chain(c.pushing.map(|seq| ToPrimary::Push {
                        seq,
                        ops: c.core.to_push(),
                    }))
                    .collect();
                for m in again {
                    self.send_primary(slot, m);
                }
            }
        }
    }

    /// Carries out the recalls whose grants were seen: a private inode's
    /// pushes the pending changes first and ends the privacy.
    fn carry_out(&mut self, slot: usize) {
        let c = &self.clients[slot];
        if c.pushing.is_some() {
            return;
        }
        let ready: Vec<(Ino, Level, u64)> = c
            .recalls
            .iter()
            .filter(|(ino, _, g)| c.seen.get(ino).is_some_and(|s| s >= g))
            .copied()
            .collect();
        if ready.is_empty() {
            return;
        }
        if ready
            .iter()
            .any(|(ino, _, _)| self.clients[slot].core.mentions(*ino))
        {
            if self.clients[slot].core.pending_len() > 0 {
                return self.push(slot);
            }
            self.log(format!("client {slot} ends its privacy"));
            self.clients[slot].core.dissolve();
        }
        let c = &mut self.clients[slot];
        c.recalls.retain(|r| !ready.contains(r));
        for (ino, _, grant) in &ready {
            let a = c.answered.entry(*ino).or_default();
            *a = (*a).max(*grant);
        }
        for (ino, to, grant) in ready {
            self.log(format!(
                "client {slot} answers the recall of {ino} (grant {grant})"
            ));
            self.send_primary(
                slot,
                ToPrimary::Returned {
                    ino,
                    grant,
                    kept: to,
                },
            );
        }
    }

    /// Every inode with a name in the client's copy is, at the primary,
    /// as the copy shows it.
    fn agree(&mut self, slot: usize) {
        let mut wrong = None;
        for i in self.clients[slot].core.inodes() {
            if i.attr.nlink == 0 {
                continue;
            }
            if self.tree.get(i.attr.ino) != Some(i) {
                wrong = Some(i.attr.ino);
                break;
            }
        }
        if let Some(ino) = wrong {
            self.violation(format!(
                "after client {slot}'s push, inode {ino} differs: copy {:?}, primary {:?}",
                self.clients[slot].core.get(ino).map(|i| i.attr),
                self.tree.get(ino).map(|i| i.attr)
            ));
        }
    }
}
