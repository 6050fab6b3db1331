//! Private directories (`docs/fs.md`, "Private directories") over a
//! network that delays and reorders every message: clients running the
//! real [`Private`] copy make directories at a primary running the real
//! [`Tree`], [`Tokens`] and push rule ([`check_push`]), change names in
//! them without a message, push on a timer, look at each other's
//! directories (a recall: the holder pushes, ends its privacy, then
//! answers) and crash.
//!
//! The checks:
//! - **a push makes the copy**: when a push is answered, every inode of
//!   the pusher's copy with a name is, at the primary, exactly as the copy
//!   shows it (attributes, secret, body);
//! - **no look at a private directory**: a look is answered only when no
//!   other live client holds the directory in its copy (its unpushed
//!   changes would be missing from the answer);
//! - **no refused push** from a live client;
//! - **liveness**: every look is answered.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_fs::model::{Attr, FsError, Identity, Ino, Kind, ROOT, Time};
use shoal_fs::private::{Private, check_push};
use shoal_fs::tokens::{Callback, ClientId, Decision, Level, Tokens, Want};
use shoal_fs::update::{Answer, Pushed, Update, UpdateOp};
use shoal_fs::{Applied, Tree};

/// What a run does.
#[derive(Debug, Clone)]
pub struct PrivateSimConfig {
    pub clients: usize,
    pub ticks: u64,
    pub delay_max: u64,
    pub op_chance: f64,
    pub crash_chance: f64,
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
    pub violations: Vec<String>,
}

#[derive(Debug, Clone)]
enum ToPrimary {
    Mkdir {
        name: Vec<u8>,
        ino: Ino,
        secret: [u8; 16],
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
        results: Vec<Result<Answer, FsError>>,
        made: Vec<(Ino, u64)>,
    },
    Refused(FsError),
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
    looking: bool,
    push_seq: u64,
    next_ino: Ino,
    made_dirs: u64,
}

/// One seeded run.
pub struct PrivateSim {
    rng: ChaCha8Rng,
    cfg: PrivateSimConfig,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    messages: HashMap<usize, (usize, ClientId, Result<ToPrimary, ToClient>)>,
    next_message: usize,
    tree: Tree,
    tokens: Tokens,
    /// Looks waiting for recalls: (client slot, its id, directory).
    parked: Vec<(usize, ClientId, Ino)>,
    clients: Vec<Client>,
    next_id: ClientId,
    update_seq: u64,
    report: PrivateReport,
    trace: Vec<String>,
}

const RANGE: u32 = 10_000;

impl PrivateSim {
    pub fn new(seed: u64, cfg: PrivateSimConfig) -> PrivateSim {
        let mut sim = PrivateSim {
            rng: ChaCha8Rng::seed_from_u64(seed),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            messages: HashMap::new(),
            next_message: 0,
            tree: Tree::new([0; 16], Time::new(0, 0)),
            tokens: Tokens::new(),
            parked: Vec::new(),
            clients: Vec::new(),
            next_id: 1,
            update_seq: 0,
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
            looking: false,
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
        let n = self.next_message;
        self.next_message += 1;
        self.seq += 1;
        self.messages.insert(n, (slot, id, body));
        self.queue.push(Reverse((self.now + delay, self.seq, n)));
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
        while self.now < until && (!self.queue.is_empty() || !self.parked.is_empty()) {
            self.step(false);
        }
        for slot in 0..self.clients.len() {
            if self.clients[slot].looking {
                self.violation(format!("client {slot}'s look never answered"));
            }
        }
        std::mem::take(&mut self.report)
    }

    fn step(&mut self, busy: bool) {
        self.now += 1;
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
        self.flush_callbacks();
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
            0 => {
                let c = &mut self.clients[slot];
                c.made_dirs += 1;
                let name = format!("c{}-{}", c.id, c.made_dirs).into_bytes();
                let ino = c.next_ino;
                c.next_ino += 1;
                self.send_primary(
                    slot,
                    ToPrimary::Mkdir {
                        name,
                        ino,
                        secret: [3; 16],
                    },
                );
            }
            1 if !c.looking => {
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
                self.clients[slot].looking = true;
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
        while let Some(Reverse((at, _, n))) = self.queue.peek().copied() {
            if at > self.now {
                break;
            }
            self.queue.pop();
            let (slot, id, body) = self.messages.remove(&n).expect("queued message");
            match body {
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

    fn primary(&mut self, slot: usize, id: ClientId, m: ToPrimary) {
        match m {
            ToPrimary::Mkdir { name, ino, secret } => {
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
                if let Ok(Answer::Entry { attr, .. }) = self.order(0, 0, &Identity::root(), op) {
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
                let made = match check_push(&ops, |ino| self.tokens.level(id, ino) == Level::Write)
                {
                    Ok(made) => made,
                    Err(e) => return self.send(slot, id, Err(ToClient::Refused(e))),
                };
                let results =
                    match self.order(id & !1, seq, &Identity::root(), UpdateOp::Push { ops }) {
                        Ok(Answer::Pushed(results)) => results,
                        other => {
                            let e = other.err().unwrap_or(FsError::Io);
                            return self.send(slot, id, Err(ToClient::Refused(e)));
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
            ToClient::Pushed { results, made } => {
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
            ToClient::Refused(e) => {
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
                c.looking = false;
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
