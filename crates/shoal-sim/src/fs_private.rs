//! Private directories (`docs/fs.md`, "Private directories") over a
//! network that delays and reorders every message: clients running the
//! real [`Private`] copy make directories at a primary running the soft
//! state and decisions the metadata service ships
//! ([`shoal_fs::primary`], over the real [`shoal_fs::Tree`]), with the
//! real requests and replies: they change names in their directories
//! without a message, push on a timer (and go on changing them while a
//! push is on its way, as a mount does), look at each other's directories
//! (a recall, carried on the answer to the client's parked `Events`: the
//! holder pushes, ends its privacy, then answers) and crash.  The primary
//! crashes too: its tree (the replicas' state) stays, its soft state
//! goes, and what was in flight to or from it is lost; the new primary is
//! in its grace period for a lease, in which every client says hello
//! again and reclaims `Write` on the inodes of its copy the primary knows
//! (as a mount does), and sends again what was unanswered.  A tick is
//! 100 ms of the lease clock: a lease and a grace period are 100 ticks.
//!
//! The checks:
//! - **a push makes the copy**: when a push is answered, every inode of
//!   the pusher's copy with a name is, at the primary, exactly as the copy
//!   showed it when the push started (attributes, secret, body);
//! - **no look at a private directory**: a look is answered only when no
//!   other live client holds the directory in its copy (its unpushed
//!   changes would be missing from the answer);
//! - **no refused push** from a live client, and **no refused reclaim**;
//! - **liveness**: every look is answered.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_cap::PutPort;
use shoal_fs::model::{Attr, FsError, Identity, Ino, Kind, ROOT, Timestamp};
use shoal_fs::op::{self, Failure, Op, Reply};
use shoal_fs::primary::{Config, GRACE, Soft};
use shoal_fs::private::Private;
use shoal_fs::tokens::{Callback, ClientId, Level};
use shoal_fs::update::{Answer, Pushed, UpdateOp};
use shoal_proto::Time;

use crate::fs::{World, lease_clock, ticks};
use crate::timeline::{Timeline, Trace};

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
    /// How long a pending change waits before it is pushed.
    pub push_after: Duration,
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
            push_after: ticks(40),
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
    /// Of those, the changes made while a push was on its way.
    pub changes_while_pushing: usize,
    pub crashes: usize,
    pub primary_crashes: usize,
    pub reclaims: usize,
    pub violations: Vec<String>,
}

/// What a client asked, to make sense of the answer.
#[derive(Debug, Clone)]
enum Asked {
    Hello,
    Events,
    Mkdir,
    Reclaim { ino: Ino },
    Push { seq: u64 },
    Look { dir: Ino },
    Return,
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
    /// The primary changed: say hello and reclaim.
    NewPrimary,
    Reclaimed {
        ino: Ino,
        grant: u64,
    },
    /// A push refused (its request number).
    Refused(u64, FsError),
    /// A look answered, granting `grant` on `dir` (the client must know
    /// it as seen: a recall of it may follow).
    Looked {
        dir: Ino,
        grant: u64,
    },
    Events(Vec<Callback>),
}

/// Whom an answer of the primary goes to: the client's slot, its session
/// then, and what it asked.
type To = (usize, ClientId, Asked);

/// A message: a request to the primary (and what it asked), or one to a
/// client.
type Msg = Result<(Asked, op::Request), ToClient>;

struct Client {
    id: ClientId,
    core: Private,
    /// The highest grant seen, by inode (a recall of a later one waits).
    seen: BTreeMap<Ino, u64>,
    /// Recalls waiting: for their grant, or for the push under way.
    recalls: Vec<(Ino, Level, u64)>,
    /// The push on its way, and the copy as it was when the push started
    /// (changes go on being made meanwhile, as a mount's do).
    pushing: Option<u64>,
    pushed_from: Option<Box<Private>>,
    /// Pushes made for recalls since the last end of the privacy: the
    /// second is made with the private state held, as a mount makes it,
    /// so no change comes while it is on its way.
    ending: u8,
    /// The highest grant whose recall was answered, by inode.
    answered: BTreeMap<Ino, u64>,
    /// The directory a look is out for.
    looking: Option<Ino>,
    /// Directories being made: (request number, name, inode).
    making: Vec<(u64, Vec<u8>, Ino)>,
    push_seq: u64,
    next_ino: Ino,
    made_dirs: u64,
    /// Notices carried out, to confirm with the next `Events` request.
    confirm: Vec<u64>,
}

/// One seeded run.
pub struct PrivateSim {
    rng: ChaCha8Rng,
    cfg: PrivateSimConfig,
    now: u64,
    /// Messages in flight: (client slot, the client's id then, body).
    wire: Timeline<(usize, ClientId, Msg)>,
    /// Messages in flight other than `Events` and their answers.
    in_flight: usize,
    /// The replicas' tree.
    world: World,
    /// The primary's soft state, as the metadata service runs it.
    soft: Soft<To>,
    clients: Vec<Client>,
    next_id: ClientId,
    /// The primary's incarnation.
    epoch: u32,
    report: PrivateReport,
    trace: Trace,
}

const RANGE: u32 = 10_000;

impl PrivateSim {
    pub fn new(seed: u64, cfg: PrivateSimConfig) -> PrivateSim {
        let mut sim = PrivateSim {
            rng: ChaCha8Rng::seed_from_u64(seed),
            now: 0,
            wire: Timeline::new(),
            in_flight: 0,
            world: World::new(),
            soft: Soft::new(Config {
                port: PutPort::from_bytes([3; 16]),
                servers: Vec::new(),
                copies: 1,
                allow_root: true,
                // The first primary has nobody to wait for.
                grace: Duration::ZERO,
            }),
            clients: Vec::new(),
            next_id: ClientId(1),
            epoch: 1,
            report: PrivateReport::default(),
            trace: Trace::from_env(),
            cfg,
        };
        sim.soft.start(1, 1, Time::ZERO);
        sim.primary_tick();
        for slot in 0..sim.cfg.clients {
            let c = sim.new_client();
            sim.clients.push(c);
            sim.hello(slot);
        }
        sim
    }

    fn new_client(&mut self) -> Client {
        // Odd session numbers, as a mount's are.
        self.next_id = ClientId(self.next_id.0 + 2);
        let id = self.next_id;
        let first = match self.world.set_up(UpdateOp::Range { count: RANGE }) {
            Ok(Answer::Range { first, .. }) => first,
            other => unreachable!("a range: {other:?}"),
        };
        Client {
            id,
            core: Private::new(),
            seen: BTreeMap::new(),
            recalls: Vec::new(),
            pushing: None,
            pushed_from: None,
            ending: 0,
            answered: BTreeMap::new(),
            looking: None,
            making: Vec::new(),
            push_seq: 0,
            next_ino: first,
            made_dirs: 0,
            confirm: Vec::new(),
        }
    }

    /// The run's trace (with `SHOAL_SIM_TRACE` set, the tests print it).
    pub fn trace(&self) -> &[String] {
        self.trace.lines()
    }

    fn log(&mut self, line: String) {
        self.trace.line(self.now, || line);
    }

    fn violation(&mut self, v: String) {
        let now = self.now;
        self.trace.violation(now, &mut self.report.violations, v);
    }

    /// A file time now.
    fn file_time(&self) -> Timestamp {
        Timestamp::new(self.now as i64, 0)
    }

    /// The lease clock now.
    fn clock(&self) -> Time {
        lease_clock(self.now)
    }

    fn send(&mut self, slot: usize, id: ClientId, body: Msg) {
        if !matches!(body, Ok((Asked::Events, _)) | Err(ToClient::Events(_))) {
            self.in_flight += 1;
        }
        let delay = self.rng.random_range(1..=self.cfg.delay_max);
        self.wire
            .at(lease_clock(self.now + delay), (slot, id, body));
    }

    /// A request of client `slot`, numbered `seq` in its session (the
    /// changes' exactly-once numbers; 0 for the rest).
    fn send_primary(&mut self, slot: usize, asked: Asked, seq: u64, op: Op) {
        let id = self.clients[slot].id;
        let req = op::Request {
            session: id,
            seq,
            who: Identity::root(),
            op,
        };
        self.send(slot, id, Ok((asked, req)));
    }

    /// Client `slot` parks its next `Events` request, confirming the
    /// notices it carried out.
    fn events(&mut self, slot: usize) {
        let confirm = std::mem::take(&mut self.clients[slot].confirm);
        self.send_primary(slot, Asked::Events, 0, Op::Events { confirm });
    }

    /// Client `slot` (new, restarted, or told of a new primary) says
    /// hello at once, and parks its `Events` request.
    fn hello(&mut self, slot: usize) {
        let id = self.clients[slot].id;
        let hello = op::Request {
            session: id,
            seq: 0,
            who: Identity::root(),
            op: Op::Hello {
                instance: [0; 16],
                node: format!("node{slot}").into_bytes(),
            },
        };
        let now = self.clock();
        self.soft
            .request(&mut self.world, now, (slot, id, Asked::Hello), hello);
        self.answer();
        self.events(slot);
    }

    fn primary_tick(&mut self) {
        let now = self.clock();
        self.soft.tick(&mut self.world, now);
        self.answer();
    }

    pub fn run(&mut self) -> PrivateReport {
        while self.now < self.cfg.ticks {
            self.step(true);
        }
        let until = self.now + 3000;
        while self.now < until
            && (self.in_flight > 0 || self.soft.is_waiting() || self.soft.in_grace())
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
        self.primary_tick();
        self.deliver_due();
        for slot in 0..self.clients.len() {
            if busy && self.rng.random_bool(self.cfg.crash_chance) {
                self.crash(slot);
                continue;
            }
            let c = &self.clients[slot];
            if c.pushing.is_none() && c.core.due(self.clock(), self.cfg.push_after) {
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
        // Its node restarts it with a new session; the old one's tokens
        // stay until its lease runs out.
        self.clients[slot] = self.new_client();
        self.hello(slot);
    }

    /// The primary crashes and another replica takes over: the tree stays,
    /// the soft state goes, every message to or from the old one is lost,
    /// and the clients are told (as a mount learns it from its session).
    fn primary_crash(&mut self) {
        self.report.primary_crashes += 1;
        self.epoch += 1;
        self.log(format!("the primary crashes (epoch {})", self.epoch));
        self.soft.stop();
        let _lost = self.soft.answers();
        self.wire.clear();
        self.in_flight = 0;
        self.soft = Soft::new(Config {
            port: PutPort::from_bytes([3; 16]),
            servers: Vec::new(),
            copies: 1,
            allow_root: true,
            grace: GRACE,
        });
        self.soft.start(self.epoch as u64, self.epoch, self.clock());
        for slot in 0..self.clients.len() {
            let id = self.clients[slot].id;
            self.send(slot, id, Err(ToClient::NewPrimary));
        }
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
                let ino = c.next_ino.take();
                let seq = c.made_dirs;
                c.making.push((seq, name.clone(), ino));
                self.mkdir(slot, seq, name, ino);
            }
            1 if c.looking.is_none() => {
                // Any directory at the primary, another client's private
                // ones included.
                let all: Vec<Ino> = self
                    .world
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
                self.send_primary(slot, Asked::Look { dir }, 0, Op::ReadDir { ino: dir });
            }
            _ if !dirs.is_empty() && c.ending < 2 => {
                let dir = dirs[self.rng.random_range(0..dirs.len())];
                let name = format!("n{}", self.rng.random_range(0..4)).into_bytes();
                let to = dirs[self.rng.random_range(0..dirs.len())];
                let to_name = format!("n{}", self.rng.random_range(0..4)).into_bytes();
                let (now, clock) = (self.file_time(), self.clock());
                let c = &mut self.clients[slot];
                let op = match pick {
                    2..=4 => UpdateOp::Create {
                        parent: dir,
                        name,
                        kind: if pick == 4 { Kind::Dir } else { Kind::File },
                        perm: 0o755,
                        rdev: 0,
                        ino: c.next_ino.take(),
                        secret: [7; 16],
                        target: Vec::new(),
                        excl: true,
                    },
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
                    self.report.changes_while_pushing += usize::from(c.pushing.is_some());
                }
            }
            _ => {}
        }
    }

    /// Sends the pending changes (again after a crash of the primary
    /// would use the same number).
    fn push(&mut self, slot: usize) {
        let c = &mut self.clients[slot];
        let ops = c.core.start_push();
        if ops.is_empty() {
            c.core.push_failed();
            return;
        }
        c.push_seq += 1;
        let seq = c.push_seq;
        c.pushing = Some(seq);
        c.pushed_from = Some(Box::new(c.core.clone()));
        self.log(format!("client {slot} pushes {} changes", ops.len()));
        self.send_primary(slot, Asked::Push { seq }, seq, push(ops));
    }

    /// A directory made at the primary, as request `seq` of the
    /// session (sent again at a new primary, it is answered as it was).
    fn mkdir(&mut self, slot: usize, seq: u64, name: Vec<u8>, ino: Ino) {
        let op = UpdateOp::Create {
            parent: ROOT,
            name,
            kind: Kind::Dir,
            perm: 0o755,
            rdev: 0,
            ino,
            // The primary draws the secret.
            secret: [3; 16],
            target: Vec::new(),
            excl: true,
        };
        self.send_primary(slot, Asked::Mkdir, seq, Op::Change { op, durable: false });
    }

    fn deliver_due(&mut self) {
        while let Some((slot, id, body)) = self.wire.due(self.clock()) {
            if !matches!(body, Ok((Asked::Events, _)) | Err(ToClient::Events(_))) {
                self.in_flight -= 1;
            }
            // A crashed client's requests under way die with it, and its
            // answers find nobody.
            if self.clients[slot].id != id {
                continue;
            }
            match body {
                Ok((asked, req)) => {
                    let now = self.clock();
                    self.soft
                        .request(&mut self.world, now, (slot, id, asked), req);
                    self.answer();
                }
                Err(m) => self.client(slot, m),
            }
        }
    }

    /// Sends the primary's answers on to the clients, checking looks as
    /// they are answered.
    fn answer(&mut self) {
        for ((slot, id, asked), reply) in self.soft.answers() {
            if self.clients[slot].id != id {
                continue;
            }
            let msg = match (asked, reply) {
                (Asked::Hello | Asked::Return, Ok(_)) => continue,
                // Sent to a new primary before the client said hello to
                // it: sent again once it has (`NewPrimary`).
                (_, Err(Failure::NoSession)) => continue,
                (Asked::Events, Ok(Reply::Events(list))) => ToClient::Events(list),
                (
                    Asked::Mkdir,
                    Ok(Reply::Changed {
                        result: Ok(Answer::Entry { attr, .. }),
                        opened,
                        secret,
                        ..
                    }),
                ) => ToClient::Made {
                    attr,
                    secret: secret.unwrap_or_default(),
                    grant: opened
                        .filter(|g| g.level == Level::Write && secret.is_some())
                        .map(|g| g.grant),
                },
                (Asked::Push { seq }, Ok(Reply::Pushed { results, made })) => ToClient::Pushed {
                    seq,
                    results,
                    made: made.into_iter().map(|(a, g)| (a.ino, g.grant)).collect(),
                },
                (Asked::Push { seq }, Err(Failure::Fs(e))) => ToClient::Refused(seq, e),
                (Asked::Reclaim { ino }, Ok(Reply::Entry { grant, .. })) => {
                    if grant.level != Level::Write {
                        self.violation(format!("client {slot}'s reclaim of {ino} refused"));
                    }
                    ToClient::Reclaimed {
                        ino,
                        grant: grant.grant,
                    }
                }
                // Made since the last push, which did not reach the old
                // primary: nothing to reclaim (the push makes it).
                (Asked::Reclaim { .. }, Err(Failure::Fs(FsError::NotFound))) => continue,
                (Asked::Look { dir }, Ok(Reply::Entries { grant, .. })) => {
                    self.looked(slot, dir);
                    ToClient::Looked {
                        dir,
                        grant: grant.grant,
                    }
                }
                // Removed while the look waited for its holder's push.
                (Asked::Look { dir }, Err(Failure::Fs(FsError::NotFound))) => {
                    ToClient::Looked { dir, grant: 0 }
                }
                (asked, reply) => {
                    self.violation(format!("client {slot}'s {asked:?} was answered {reply:?}"));
                    continue;
                }
            };
            self.send(slot, id, Err(msg));
        }
    }

    /// A look answered: nobody else may still hold the directory in its
    /// copy.
    fn looked(&mut self, slot: usize, dir: Ino) {
        for (other, c) in self.clients.iter().enumerate() {
            if other != slot && c.core.holds(dir) {
                let v = format!(
                    "client {slot}'s look at {dir} answered while client {other} holds it in its copy"
                );
                self.violation(v);
                break;
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
                c.pushed_from = None;
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
                c.pushed_from = None;
                c.ending = 0;
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
            ToClient::Events(list) => {
                for cb in list {
                    self.log(format!("callback to client {slot}: {cb:?}"));
                    match cb {
                        Callback::Recall { ino, to, grant } => {
                            self.report.recalls += 1;
                            self.clients[slot].recalls.push((ino, to, grant));
                        }
                        // The client caches no names of others: a notice
                        // is carried out at once.
                        Callback::Notice { id, .. } => self.clients[slot].confirm.push(id),
                        _ => {}
                    }
                }
                self.carry_out(slot);
                self.events(slot);
            }
            ToClient::NewPrimary => {
                // As a mount does: hello, and `Write` on every inode of
                // the copy the primary knows (those made since the last
                // push come with it); recalls of the old primary's grants
                // are void.  Everything unanswered goes again, to wait
                // out the grace period.
                self.clients[slot].recalls.clear();
                self.hello(slot);
                let known = self.clients[slot].core.known();
                self.log(format!("client {slot} reclaims {known:?}"));
                for (ino, version) in known {
                    self.report.reclaims += 1;
                    let op = Op::Reclaim {
                        ino,
                        level: Level::Write,
                        version: Some(version),
                        opens: Vec::new(),
                    };
                    self.send_primary(slot, Asked::Reclaim { ino }, 0, op);
                }
                let c = &self.clients[slot];
                let making = c.making.clone();
                let looking = c.looking;
                let pushing = c.pushing.map(|seq| (seq, c.core.on_its_way()));
                for (seq, name, ino) in making {
                    self.mkdir(slot, seq, name, ino);
                }
                if let Some(dir) = looking {
                    self.send_primary(slot, Asked::Look { dir }, 0, Op::ReadDir { ino: dir });
                }
                if let Some((seq, ops)) = pushing {
                    self.send_primary(slot, Asked::Push { seq }, seq, push(ops));
                }
            }
            ToClient::Reclaimed { ino, grant } => {
                let s = self.clients[slot].seen.entry(ino).or_default();
                *s = (*s).max(grant);
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
                self.clients[slot].ending += 1;
                return self.push(slot);
            }
            self.log(format!("client {slot} ends its privacy"));
            self.clients[slot].ending = 0;
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
            let op = Op::Return {
                ino,
                grant,
                kept: to,
                opens: Vec::new(),
            };
            self.send_primary(slot, Asked::Return, 0, op);
        }
    }

    /// Every inode with a name in the client's copy is, at the primary,
    /// as the copy shows it.
    fn agree(&mut self, slot: usize) {
        let mut wrong = None;
        let c = &self.clients[slot];
        let copy = c.pushed_from.as_deref().unwrap_or(&c.core);
        for i in copy.inodes() {
            if i.attr.nlink == 0 {
                continue;
            }
            if self.world.tree.get(i.attr.ino) != Some(i) {
                wrong = Some(i.attr.ino);
                break;
            }
        }
        if let Some(ino) = wrong {
            let c = &self.clients[slot];
            let copy = c.pushed_from.as_deref().unwrap_or(&c.core);
            self.violation(format!(
                "after client {slot}'s push, inode {ino} differs: copy {:?}, primary {:?}",
                copy.get(ino).map(|i| i.attr),
                self.world.tree.get(ino).map(|i| i.attr)
            ));
        }
    }
}

/// A push of `ops`.
fn push(ops: Vec<Pushed>) -> Op {
    Op::Change {
        op: UpdateOp::Push { ops },
        durable: false,
    }
}
