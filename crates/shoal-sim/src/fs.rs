//! The shared file system's consistency protocol (`docs/fs.md`): a
//! primary running the real [`Tree`] and [`Tokens`], and clients running
//! the real [`ClientCache`], exchanging requests, answers and callbacks
//! through a network that delays (and so reorders) every message; clients
//! open, read, write, close and `fsync` files at random and crash.
//!
//! The checks are the file system's promises:
//! - **no stale read**: every read, from a client's cache or from the
//!   primary, returns the file's current bytes: those of the client
//!   holding the file's `Write` token, if it has written, else the
//!   primary's (so a close on one node is seen by the next open on
//!   another, and write-shared files read each write once made);
//! - **no lost fsync**: after a client crash, a file `fsync`ed and not
//!   written since still holds the bytes it was synced with;
//! - **no refused write-back**: a write-back made under a `Write` token is
//!   never refused as stale;
//! - **liveness**: every request is answered.
//!
//! This first scenario covers files that exist from the start (no names
//! change) and one primary that does not crash; reclaim after a primary
//! change and name changes come next.

use std::collections::{BTreeSet, HashMap};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_fs::client::{ClientCache, RecallAnswer, Step, WriteBack};
use shoal_fs::model::{Identity, Ino, Kind, ROOT, Time};
use shoal_fs::tokens::{Callback, ClientId, Decision, Level, OpenId, Tokens, Want};
use shoal_fs::update::{Answer, Update, UpdateOp};
use shoal_fs::{Applied, Tree};
use shoal_proto::Time as Tick;

use crate::timeline::Timeline;

/// What a run does.
#[derive(Debug, Clone)]
pub struct FsSimConfig {
    pub clients: usize,
    pub files: usize,
    /// Ticks in the run (the network's delays are 1 to `delay_max`).
    pub ticks: u64,
    pub delay_max: u64,
    /// Chance per tick that an idle client starts an operation.
    pub op_chance: f64,
    /// Chance per tick that a client crashes.
    pub crash_chance: f64,
    /// Ticks dirty bytes wait before they are written back.
    pub write_back_after: u64,
}

impl Default for FsSimConfig {
    fn default() -> Self {
        FsSimConfig {
            clients: 3,
            files: 2,
            ticks: 600,
            delay_max: 6,
            op_chance: 0.3,
            crash_chance: 0.004,
            write_back_after: 40,
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
    pub violations: Vec<String>,
}

#[derive(Debug, Clone)]
enum ToPrimary {
    Open {
        ino: Ino,
        write: bool,
        have: Vec<(OpenId, bool)>,
        open: OpenId,
        cached: Option<u64>,
    },
    Close {
        ino: Ino,
        open: OpenId,
    },
    Read {
        ino: Ino,
    },
    Write {
        ino: Ino,
        offset: usize,
        data: Vec<u8>,
    },
    Commit {
        wb: WriteBack,
    },
    Returned {
        ino: Ino,
        grant: u64,
        kept: Level,
        opens: Vec<(OpenId, bool)>,
    },
}

#[derive(Debug, Clone)]
enum ToClient {
    Opened {
        ino: Ino,
        open: OpenId,
        write: bool,
        decision: Decision,
        version: u64,
        bytes: Option<Vec<u8>>,
    },
    Read,
    Done,
    /// A write through the primary was made: the writer caches nothing of
    /// the file until it is granted a token again.
    Written {
        ino: Ino,
        grant: u64,
    },
    Committed {
        wb: WriteBack,
        version: u64,
    },
    Callback(Callback),
}

#[derive(Debug, Clone)]
enum Body {
    ToPrimary(ToPrimary),
    ToClient(ToClient),
}

/// What a client waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Busy {
    Open,
    Read,
    Write,
    Close,
    Fsync,
}

struct SimClient {
    id: ClientId,
    cache: ClientCache,
    busy: Option<Busy>,
    /// Open files: (inode, for writing).
    open: Vec<(Ino, OpenId, bool)>,
    writing_back: BTreeSet<Ino>,
    /// The file an `fsync` under way is for.
    fsyncing: Option<Ino>,
}

/// One seeded run.
pub struct FsSim {
    rng: ChaCha8Rng,
    cfg: FsSimConfig,
    now: u64,
    /// Messages in flight: (client slot, the client's id then, body).
    wire: Timeline<(usize, ClientId, Body)>,
    tree: Tree,
    tokens: Tokens,
    /// The primary's bytes of each file (contents and overlay).
    bytes: HashMap<Ino, Vec<u8>>,
    files: Vec<Ino>,
    parked: Vec<(usize, ClientId, ToPrimary)>,
    clients: Vec<SimClient>,
    next_id: ClientId,
    /// Files `fsync`ed and not written since: their bytes then.
    synced: HashMap<Ino, Vec<u8>>,
    update_seq: u64,
    report: FsReport,
    trace: Vec<String>,
}

impl FsSim {
    pub fn new(seed: u64, cfg: FsSimConfig) -> FsSim {
        let mut sim = FsSim {
            rng: ChaCha8Rng::seed_from_u64(seed),
            now: 0,
            wire: Timeline::new(),
            tree: Tree::new([0; 16], Time::new(0, 0)),
            tokens: Tokens::new(),
            bytes: HashMap::new(),
            files: Vec::new(),
            parked: Vec::new(),
            clients: Vec::new(),
            next_id: 1,
            synced: HashMap::new(),
            update_seq: 0,
            report: FsReport::default(),
            trace: Vec::new(),
            cfg,
        };
        let Ok(Answer::Range { first, .. }) = sim.next_update(UpdateOp::Range { count: 64 }) else {
            unreachable!("a fresh tree hands out numbers")
        };
        for i in 0..sim.cfg.files {
            let ino = first + i as u64;
            sim.next_update(UpdateOp::Create {
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
            sim.bytes.insert(ino, Vec::new());
        }
        for _ in 0..sim.cfg.clients {
            let id = sim.fresh_id();
            sim.tokens.hello(0, id);
            sim.clients
                .push(SimClient::new(id, sim.cfg.write_back_after));
        }
        sim
    }

    /// The run's trace (with `SHOAL_SIM_TRACE` set, the tests print it).
    pub fn trace(&self) -> &[String] {
        &self.trace
    }

    fn fresh_id(&mut self) -> ClientId {
        self.next_id += 1;
        self.next_id
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

    fn send(&mut self, slot: usize, id: ClientId, body: Body) {
        let delay = self.rng.random_range(1..=self.cfg.delay_max);
        self.wire.at(Tick(self.now + delay), (slot, id, body));
    }

    fn send_primary(&mut self, slot: usize, m: ToPrimary) {
        let id = self.clients[slot].id;
        self.send(slot, id, Body::ToPrimary(m));
    }

    fn send_client(&mut self, slot: usize, id: ClientId, m: ToClient) {
        self.send(slot, id, Body::ToClient(m));
    }

    /// The file's current bytes: its `Write` holder's, if it wrote, else
    /// the primary's.
    fn truth(&self, ino: Ino) -> Vec<u8> {
        for c in &self.clients {
            if self.tokens.level(c.id, ino) == Level::Write
                && let Some(d) = c.cache.file(ino).and_then(|f| f.dirty.clone())
            {
                return d;
            }
        }
        self.bytes[&ino].clone()
    }

    pub fn run(&mut self) -> FsReport {
        while self.now < self.cfg.ticks {
            self.now += 1;
            self.deliver_due();
            for slot in 0..self.clients.len() {
                if self.rng.random_bool(self.cfg.crash_chance) {
                    self.crash(slot);
                    continue;
                }
                self.write_backs_due(slot);
                if self.clients[slot].busy.is_none() && self.rng.random_bool(self.cfg.op_chance) {
                    self.start_op(slot);
                }
            }
        }
        // Quiet: no new operations; everything under way must finish.
        let until = self.now + 2000;
        while self.now < until && (!self.wire.is_empty() || !self.parked.is_empty()) {
            self.now += 1;
            self.deliver_due();
            for slot in 0..self.clients.len() {
                self.write_backs_due(slot);
            }
        }
        for slot in 0..self.clients.len() {
            if let Some(b) = self.clients[slot].busy.clone() {
                self.violation(format!("client {slot}'s {b:?} never answered"));
            }
        }
        std::mem::take(&mut self.report)
    }

    fn deliver_due(&mut self) {
        while let Some((slot, id, body)) = self.wire.due(Tick(self.now)) {
            match body {
                Body::ToPrimary(m) => {
                    if self.tokens.knows(id) {
                        self.primary(slot, id, m);
                    }
                }
                Body::ToClient(m) => {
                    if self.clients[slot].id == id {
                        self.client(slot, m);
                    }
                }
            }
        }
    }

    fn crash(&mut self, slot: usize) {
        self.report.crashes += 1;
        let old = self.clients[slot].id;
        self.log(format!("client {slot} (session {old}) crashes"));
        // Its node restarts it: the old session ends at once.
        self.tokens.expire(self.now, Some(old));
        let id = self.fresh_id();
        self.tokens.hello(self.now, id);
        self.clients[slot] = SimClient::new(id, self.cfg.write_back_after);
        self.flush_callbacks();
        self.retry_parked();
        let synced: Vec<(Ino, Vec<u8>)> =
            self.synced.iter().map(|(i, b)| (*i, b.clone())).collect();
        for (ino, b) in synced {
            self.report.fsyncs_checked += 1;
            if self.truth(ino) != b {
                self.violation(format!("file {ino} lost bytes it was fsynced with"));
            }
        }
    }

    fn start_op(&mut self, slot: usize) {
        let c = &self.clients[slot];
        let pick = self.rng.random_range(0..5u8);
        if c.open.is_empty() || (pick == 0 && c.open.len() < 2) {
            let ino = self.files[self.rng.random_range(0..self.files.len())];
            let write = self.rng.random_bool(0.5);
            self.open(slot, ino, write);
            return;
        }
        let (ino, open, write) = c.open[self.rng.random_range(0..c.open.len())];
        match pick {
            1 => self.read(slot, ino),
            2 if write => {
                let offset = self.rng.random_range(0..8);
                let data = vec![self.rng.random_range(b'a'..=b'z'); self.rng.random_range(1..4)];
                self.write(slot, ino, offset, data);
            }
            3 if write => self.fsync(slot, ino),
            _ => self.close(slot, ino, open),
        }
    }

    fn open(&mut self, slot: usize, ino: Ino, write: bool) {
        let c = &mut self.clients[slot];
        match c.cache.open(ino, write) {
            Step::Local(open) => {
                c.open.push((ino, open, write));
                self.log(format!(
                    "client {slot} opens {ino} write={write} in its cache"
                ));
            }
            Step::Primary => {
                let (_, have, open) = c.cache.open_request(ino, write);
                let cached = c.cache.cached_version(ino);
                c.busy = Some(Busy::Open);
                self.send_primary(
                    slot,
                    ToPrimary::Open {
                        ino,
                        write,
                        have,
                        open,
                        cached,
                    },
                );
            }
        }
    }

    fn read(&mut self, slot: usize, ino: Ino) {
        match self.clients[slot].cache.read(ino) {
            Step::Local(bytes) => self.check_read(slot, ino, &bytes, "its cache"),
            Step::Primary => {
                self.log(format!("client {slot} reads {ino} through the primary"));
                self.clients[slot].busy = Some(Busy::Read);
                self.send_primary(slot, ToPrimary::Read { ino });
            }
        }
    }

    fn check_read(&mut self, slot: usize, ino: Ino, bytes: &[u8], from: &str) {
        self.report.reads_checked += 1;
        let truth = self.truth(ino);
        if bytes != truth {
            self.violation(format!(
                "client {slot} read file {ino} from {from}: {:?}, but it holds {:?}",
                String::from_utf8_lossy(bytes),
                String::from_utf8_lossy(&truth)
            ));
        }
    }

    fn write(&mut self, slot: usize, ino: Ino, offset: usize, data: Vec<u8>) {
        self.synced.remove(&ino);
        let now = self.now;
        match self.clients[slot].cache.write(ino, offset, &data, now) {
            Step::Local(()) => {}
            Step::Primary => {
                self.clients[slot].busy = Some(Busy::Write);
                self.send_primary(slot, ToPrimary::Write { ino, offset, data });
            }
        }
    }

    fn fsync(&mut self, slot: usize, ino: Ino) {
        let c = &mut self.clients[slot];
        c.busy = Some(Busy::Fsync);
        c.fsyncing = Some(ino);
        self.continue_fsync(slot);
    }

    /// An `fsync` goes on: it waits for a write-back under way, writes
    /// back what is dirty, and returns once nothing is.
    fn continue_fsync(&mut self, slot: usize) {
        let c = &mut self.clients[slot];
        let Some(ino) = c.fsyncing else {
            return;
        };
        if c.writing_back.contains(&ino) {
            return;
        }
        if let Some(wb) = c.cache.write_back(ino) {
            c.writing_back.insert(ino);
            self.send_primary(slot, ToPrimary::Commit { wb });
            return;
        }
        c.fsyncing = None;
        c.busy = None;
        // Nothing dirty: the primary's bytes are the file's.
        let b = self.bytes[&ino].clone();
        self.synced.insert(ino, b);
    }

    fn close(&mut self, slot: usize, ino: Ino, open: OpenId) {
        let c = &mut self.clients[slot];
        let at = c
            .open
            .iter()
            .position(|o| (o.0, o.1) == (ino, open))
            .expect("open");
        c.open.swap_remove(at);
        let tracked = c.cache.close(ino, open);
        self.log(format!(
            "client {slot} closes {ino} open {open} (reported: {tracked})"
        ));
        let c = &mut self.clients[slot];
        if tracked {
            c.busy = Some(Busy::Close);
            self.send_primary(slot, ToPrimary::Close { ino, open });
        }
    }

    fn write_backs_due(&mut self, slot: usize) {
        let due = self.clients[slot].cache.due(self.now);
        for ino in due {
            self.start_write_back(slot, ino);
        }
    }

    fn start_write_back(&mut self, slot: usize, ino: Ino) {
        let c = &mut self.clients[slot];
        if c.writing_back.contains(&ino) {
            return;
        }
        if let Some(wb) = c.cache.write_back(ino) {
            c.writing_back.insert(ino);
            self.send_primary(slot, ToPrimary::Commit { wb });
        }
    }

    /// Answers the recall of `ino` pending at the client, once its grant
    /// arrived and nothing is left to write back.
    fn try_answer_recall(&mut self, slot: usize, ino: Ino) {
        if self.clients[slot].cache.pending_recall(ino).is_none() {
            return;
        }
        if self.clients[slot].cache.write_back(ino).is_some() {
            self.start_write_back(slot, ino);
            return;
        }
        if self.clients[slot].writing_back.contains(&ino) {
            return;
        }
        let Some(RecallAnswer { grant, kept, opens }) = self.clients[slot].cache.recalled(ino)
        else {
            // The grant's answer is still on its way.
            return;
        };
        self.log(format!(
            "client {slot} answers the recall of {ino}: keeps {kept:?}, opens {opens:?}"
        ));
        self.send_primary(
            slot,
            ToPrimary::Returned {
                ino,
                grant,
                kept,
                opens,
            },
        );
    }

    fn client(&mut self, slot: usize, m: ToClient) {
        match m {
            ToClient::Opened {
                ino,
                open,
                write,
                decision,
                version,
                bytes,
            } => {
                let c = &mut self.clients[slot];
                c.cache.opened(ino, open, write, &decision, version, bytes);
                c.open.push((ino, open, write));
                c.busy = None;
                self.try_answer_recall(slot, ino);
            }
            ToClient::Read | ToClient::Done => self.clients[slot].busy = None,
            ToClient::Written { ino, grant } => {
                let c = &mut self.clients[slot];
                c.busy = None;
                c.cache.stop_caching(ino, grant);
            }
            ToClient::Committed { wb, version } => {
                let c = &mut self.clients[slot];
                c.writing_back.remove(&wb.ino);
                c.cache.written_back(&wb, version);
                self.continue_fsync(slot);
                self.try_answer_recall(slot, wb.ino);
            }
            ToClient::Callback(Callback::Recall { ino, to, grant }) => {
                self.report.recalls += 1;
                self.clients[slot].cache.recall(ino, to, grant);
                self.try_answer_recall(slot, ino);
            }
            ToClient::Callback(Callback::StopCaching { ino, grant }) => {
                let dirty = self.clients[slot].cache.write_back(ino).is_some();
                if self.clients[slot].cache.stop_caching(ino, grant) && dirty {
                    self.violation(format!(
                        "client {slot} told to stop caching {ino} with dirty bytes"
                    ));
                }
            }
            ToClient::Callback(
                Callback::Notice { .. } | Callback::Orphan { .. } | Callback::Unlocked { .. },
            ) => {}
        }
    }

    fn next_update(&mut self, op: UpdateOp) -> Result<Answer, shoal_fs::FsError> {
        self.update_seq += 1;
        let seq = self.update_seq;
        apply_result(&mut self.tree, seq, op)
    }

    fn primary(&mut self, slot: usize, id: ClientId, m: ToPrimary) {
        match m {
            ToPrimary::Open {
                ino,
                write,
                have,
                open,
                cached,
            } => {
                let want = if write {
                    Want::OpenWrite
                } else {
                    Want::OpenRead
                };
                match self.tokens.request(id, ino, want, &have, Some(open)) {
                    Decision::Wait { recalled } => {
                        self.log(format!(
                            "client {slot}'s open of {ino} (write={write}) waits for {recalled:?}"
                        ));
                        self.parked.push((
                            slot,
                            id,
                            ToPrimary::Open {
                                ino,
                                write,
                                have,
                                open,
                                cached,
                            },
                        ));
                    }
                    Decision::NoSession => {}
                    decision @ Decision::Grant { uncached, .. } => {
                        if uncached {
                            self.report.uncached_opens += 1;
                        } else {
                            self.flush_overlay(ino);
                        }
                        let version = self.tree.get(ino).expect("file").attr.version;
                        let bytes = (!uncached && cached != Some(version))
                            .then(|| self.bytes[&ino].clone());
                        self.log(format!("client {slot} opens {ino} write={write}: {decision:?} at version {version}"));
                        self.send_client(
                            slot,
                            id,
                            ToClient::Opened {
                                ino,
                                open,
                                write,
                                decision,
                                version,
                                bytes,
                            },
                        );
                    }
                }
            }
            ToPrimary::Close { ino, open } => {
                self.log(format!("client {slot} closes {ino} open {open}"));
                self.tokens.close(id, ino, open);
                self.send_client(slot, id, ToClient::Done);
            }
            ToPrimary::Read { ino } => {
                let bytes = self.bytes[&ino].clone();
                self.check_read(slot, ino, &bytes, "the primary");
                self.send_client(slot, id, ToClient::Read);
            }
            ToPrimary::Write { ino, offset, data } => {
                let grant = match self.tokens.write_through(id, ino) {
                    Decision::Wait { .. } => {
                        self.parked
                            .push((slot, id, ToPrimary::Write { ino, offset, data }));
                        self.flush_callbacks();
                        return;
                    }
                    Decision::NoSession => return,
                    Decision::Grant { grant, .. } => grant,
                };
                let r = self.next_update(UpdateOp::Overlay {
                    ino,
                    offset: Some(offset as u64),
                    data: data.clone(),
                });
                self.log(format!("client {slot} writes {ino} uncached at {offset}"));
                if r.is_ok() {
                    self.synced.remove(&ino);
                    let b = self.bytes.get_mut(&ino).expect("file");
                    if b.len() < offset + data.len() {
                        b.resize(offset + data.len(), 0);
                    }
                    b[offset..offset + data.len()].copy_from_slice(&data);
                } else {
                    self.violation(format!("an uncached write to {ino} refused: {r:?}"));
                }
                self.send_client(slot, id, ToClient::Written { ino, grant });
            }
            ToPrimary::Commit { wb } => {
                let r = self.next_update(UpdateOp::Commit {
                    ino: wb.ino,
                    base: wb.base,
                    content: Vec::new(),
                    size: wb.data.len() as u64,
                    mtime: Time::new(self.now as i64, 0),
                    flush: false,
                });
                match r {
                    Ok(Answer::Committed { attr, .. }) => {
                        self.bytes.insert(wb.ino, wb.data.clone());
                        self.log(format!(
                            "client {slot} wrote {} back: version {}",
                            wb.ino, attr.version
                        ));
                        self.send_client(
                            slot,
                            id,
                            ToClient::Committed {
                                wb,
                                version: attr.version,
                            },
                        );
                    }
                    other => self.violation(format!(
                        "client {slot}'s write-back of {} refused: {other:?}",
                        wb.ino
                    )),
                }
            }
            ToPrimary::Returned {
                ino,
                grant,
                kept,
                opens,
            } => {
                self.tokens.returned(id, ino, grant, kept, &opens);
                self.retry_parked();
            }
        }
        self.flush_callbacks();
    }

    /// Before a file is cached again, the primary writes the overlay of
    /// its write-shared time into its contents.
    fn flush_overlay(&mut self, ino: Ino) {
        let attr = self.tree.get(ino).expect("file").attr;
        let pending = matches!(&self.tree.get(ino).expect("file").body,
            shoal_fs::tree::Body::File { overlay, .. } if !overlay.is_empty());
        if pending {
            let r = self.next_update(UpdateOp::Commit {
                ino,
                base: attr.version,
                content: Vec::new(),
                size: attr.size,
                mtime: attr.mtime,
                flush: true,
            });
            if r.is_err() {
                self.violation(format!("the overlay of {ino} could not be flushed: {r:?}"));
            }
        }
    }

    fn retry_parked(&mut self) {
        let parked = std::mem::take(&mut self.parked);
        for (slot, id, m) in parked {
            if self.tokens.knows(id) && self.clients[slot].id == id {
                self.primary(slot, id, m);
            }
        }
    }

    fn flush_callbacks(&mut self) {
        while let Some((to, cb)) = self.tokens.poll_callback() {
            if let Some(slot) = self.clients.iter().position(|c| c.id == to) {
                self.log(format!("callback to client {slot}: {cb:?}"));
                self.send_client(slot, to, ToClient::Callback(cb));
            }
        }
    }
}

impl SimClient {
    fn new(id: ClientId, delay: u64) -> SimClient {
        SimClient {
            id,
            cache: ClientCache::new(delay),
            busy: None,
            open: Vec::new(),
            writing_back: BTreeSet::new(),
            fsyncing: None,
        }
    }
}

fn apply_result(tree: &mut Tree, seq: u64, op: UpdateOp) -> Result<Answer, shoal_fs::FsError> {
    let u = Update {
        session: 1,
        seq,
        who: Identity::root(),
        now: Time::new(seq as i64, 0),
        op,
    };
    match tree.apply(&u) {
        Applied::New(r) | Applied::Duplicate(r) => r,
    }
}
