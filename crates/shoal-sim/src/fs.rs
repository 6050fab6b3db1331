//! The shared file system's consistency protocol (`docs/fs.md`): a
//! primary running the real [`Tree`] and [`Tokens`], and mounts running
//! the cache and table of opens the FUSE mount ships
//! ([`shoal_fs::cache`], driven as the mount drives them: `fs/mount.rs`),
//! exchanging requests, answers and callbacks through a network that
//! delays (and so reorders) every message; contents live on a file store
//! as the file servers keep them.  Programs open, read, write, append,
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
//! not crash; its soft state is the shell's copy, as `fs_private.rs`'s.

mod mount;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_cap::{Capability, GetPort, ObjectId, ObjectSecret, Rights};
use shoal_fs::model::{Attr, Identity, Ino, Kind, ROOT, Time};
use shoal_fs::op::Grant;
use shoal_fs::tokens::{ClientId, Decision, Level, OpenId, Tokens, Want};
use shoal_fs::tree::{Body, overlaid};
use shoal_fs::update::{Answer, Update, UpdateOp};
use shoal_fs::{Applied, Tree};
use shoal_proto::Time as Tick;

use crate::timeline::Timeline;
use mount::{Mount, ToMount};

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
    /// Ticks dirty bytes wait before they are written back.
    pub write_back_after: u64,
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
    pub records_checked: usize,
    pub violations: Vec<String>,
}

#[derive(Debug, Clone)]
enum ToPrimary {
    Open {
        ino: Ino,
        want: Want,
        have: Vec<(OpenId, bool)>,
        id: OpenId,
        append: bool,
    },
    Close {
        ino: Ino,
        id: OpenId,
    },
    Read {
        ino: Ino,
    },
    Write {
        ino: Ino,
        offset: Option<u64>,
        data: Vec<u8>,
        n: u64,
    },
    Commit {
        ino: Ino,
        base: u64,
        content: Vec<Capability>,
        size: u64,
        mtime: Time,
    },
    Return {
        ino: Ino,
        grant: u64,
        kept: Level,
        opens: Vec<(OpenId, bool)>,
    },
}

#[derive(Debug, Clone)]
enum Msg {
    ToPrimary(ToPrimary),
    ToMount(ToMount),
}

/// The file servers: contents by object number (every version a file
/// ever had is kept: a write-back's base is read after its commit).
#[derive(Default)]
struct Store {
    objects: HashMap<u64, Vec<u8>>,
    next: u64,
}

impl Store {
    fn put(&mut self, bytes: Vec<u8>) -> Capability {
        self.next += 1;
        self.objects.insert(self.next, bytes);
        Capability::mint(
            GetPort::from_bytes([1; 16]).put_port(),
            ObjectId::new(self.next),
            Rights::ALL,
            &ObjectSecret::from_bytes([2; 32]),
        )
    }

    fn read(&self, content: &[Capability]) -> Vec<u8> {
        content
            .first()
            .and_then(|c| self.objects.get(&c.object().get()))
            .cloned()
            .unwrap_or_default()
    }
}

/// One seeded run.
pub struct FsSim {
    rng: ChaCha8Rng,
    cfg: FsSimConfig,
    now: u64,
    /// Messages in flight: (mount slot, the mount's session then, body).
    wire: Timeline<(usize, ClientId, Msg)>,
    tree: Tree,
    tokens: Tokens,
    store: Store,
    files: Vec<Ino>,
    logs: BTreeSet<Ino>,
    parked: Vec<(usize, ClientId, ToPrimary)>,
    mounts: Vec<Mount>,
    next_id: ClientId,
    /// Records appended by sessions that crashed: how many each had
    /// acknowledged.
    crashed: BTreeMap<ClientId, u64>,
    /// Each file's bytes as the programs were told they wrote them, in the
    /// order they were told (a crashed mount's unwritten changes go).
    model: HashMap<Ino, Vec<u8>>,
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
            store: Store::default(),
            files: Vec::new(),
            logs: BTreeSet::new(),
            parked: Vec::new(),
            mounts: Vec::new(),
            next_id: 1,
            crashed: BTreeMap::new(),
            model: HashMap::new(),
            synced: HashMap::new(),
            update_seq: 0,
            report: FsReport::default(),
            trace: Vec::new(),
            cfg,
        };
        let Ok(Answer::Range { first, .. }) = sim.next_update(UpdateOp::Range { count: 64 }) else {
            unreachable!("a fresh tree hands out numbers")
        };
        for i in 0..sim.cfg.files + sim.cfg.logs {
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
            if i >= sim.cfg.files {
                sim.logs.insert(ino);
            }
        }
        for _ in 0..sim.cfg.clients {
            let id = sim.fresh_id();
            sim.tokens.hello(0, id);
            sim.mounts.push(Mount::new(id));
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

    fn send(&mut self, slot: usize, id: ClientId, body: Msg) {
        let delay = self.rng.random_range(1..=self.cfg.delay_max);
        self.wire.at(Tick(self.now + delay), (slot, id, body));
    }

    fn send_primary(&mut self, slot: usize, m: ToPrimary) {
        let id = self.mounts[slot].id;
        self.send(slot, id, Msg::ToPrimary(m));
    }

    fn send_mount(&mut self, slot: usize, id: ClientId, m: ToMount) {
        self.send(slot, id, Msg::ToMount(m));
    }

    /// The file's bytes at the primary: its content version's with the
    /// overlay made.
    fn contents(&self, ino: Ino) -> Vec<u8> {
        let i = self.tree.get(ino).expect("a file");
        match &i.body {
            Body::File { content, overlay } => {
                overlaid(self.store.read(content), overlay, i.attr.size)
            }
            _ => unreachable!("only files"),
        }
    }

    /// The file as its `Write` holder reads it (its dirty changes made),
    /// else as the primary has it.
    fn holder_view(&self, ino: Ino) -> Vec<u8> {
        for m in &self.mounts {
            if self.tokens.level(m.id, ino) == Level::Write
                && let Some(c) = m.cache.content(ino)
                && let Some(b) = m.cache.finish_read(
                    ino,
                    c.version,
                    0,
                    mount::READ_MAX,
                    &self.store.read(&c.content),
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

    /// Nothing in flight, parked, or waiting to be written back.
    fn settled(&self) -> bool {
        self.wire.is_empty()
            && self.parked.is_empty()
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
                    .and_then(|(s, n)| Some((s.parse().ok()?, n.parse().ok()?)));
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
        while let Some((slot, id, body)) = self.wire.due(Tick(self.now)) {
            match body {
                Msg::ToPrimary(m) => {
                    if self.tokens.knows(id) {
                        self.primary(slot, id, m);
                    }
                }
                Msg::ToMount(m) => {
                    if self.mounts[slot].id == id {
                        self.mount(slot, m);
                    }
                }
            }
        }
    }

    fn crash(&mut self, slot: usize) {
        self.report.crashes += 1;
        let old = self.mounts[slot].id;
        self.log(format!("mount {slot} (session {old}) crashes"));
        self.crashed.insert(old, self.mounts[slot].appended);
        // Its changes not written back are gone with it.
        let lost = self.mounts[slot].cache.all_dirty();
        // Its node restarts it: the old session ends at once.
        self.tokens.expire(self.now, Some(old));
        let id = self.fresh_id();
        self.tokens.hello(self.now, id);
        self.mounts[slot] = Mount::new(id);
        self.flush_callbacks();
        self.retry_parked();
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

    fn next_update(&mut self, op: UpdateOp) -> Result<Answer, shoal_fs::FsError> {
        self.update_seq += 1;
        let u = Update {
            session: 1,
            seq: self.update_seq,
            who: Identity::root(),
            now: Time::new(self.update_seq as i64, 0),
            op,
        };
        match self.tree.apply(&u) {
            Applied::New(r) | Applied::Duplicate(r) => r,
        }
    }

    fn attr(&self, ino: Ino) -> Attr {
        self.tree.get(ino).expect("a file").attr
    }

    /// The primary's handling of a request, as `shoal-fssvc`'s: a request
    /// that must wait for recalls is parked and tried again after each
    /// answer to one.
    fn primary(&mut self, slot: usize, id: ClientId, m: ToPrimary) {
        match m {
            ToPrimary::Open {
                ino,
                want,
                have,
                id: open,
                append,
            } => match self.tokens.request(id, ino, want, &have, Some(open)) {
                Decision::Wait { recalled } => {
                    self.log(format!(
                        "mount {slot}'s open of {ino} ({want:?}) waits for {recalled:?}"
                    ));
                    let m = ToPrimary::Open {
                        ino,
                        want,
                        have,
                        id: open,
                        append,
                    };
                    self.parked.push((slot, id, m));
                }
                Decision::NoSession => {}
                Decision::Grant {
                    level,
                    uncached,
                    grant,
                } => {
                    if uncached {
                        self.report.uncached_opens += 1;
                    } else if level != Level::None {
                        self.flush_overlay(ino);
                    }
                    let i = self.tree.get(ino).expect("a file");
                    let content = match &i.body {
                        Body::File { content, .. } if !uncached => content.clone(),
                        _ => Vec::new(),
                    };
                    let attr = i.attr;
                    self.log(format!(
                        "mount {slot} opens {ino} ({want:?}): {level:?} uncached={uncached} grant {grant} at version {}",
                        attr.version
                    ));
                    let grant = Grant {
                        level,
                        grant,
                        uncached,
                    };
                    let write = want == Want::OpenWrite;
                    let msg = ToMount::Opened {
                        ino,
                        id: open,
                        write,
                        append,
                        have,
                        attr,
                        grant,
                        content,
                    };
                    self.send_mount(slot, id, msg);
                }
            },
            ToPrimary::Close { ino, id: open } => {
                self.tokens.close(id, ino, open);
                self.send_mount(slot, id, ToMount::Done);
                self.retry_parked();
            }
            ToPrimary::Read { ino } => {
                let bytes = self.contents(ino);
                self.check_read(slot, ino, &bytes, "the primary");
                self.send_mount(slot, id, ToMount::Data);
            }
            ToPrimary::Write {
                ino,
                offset,
                data,
                n,
            } => match self.tokens.write_through(id, ino) {
                Decision::Wait { .. } => {
                    let m = ToPrimary::Write {
                        ino,
                        offset,
                        data,
                        n,
                    };
                    self.parked.push((slot, id, m));
                }
                Decision::NoSession => {}
                Decision::Grant { .. } => {
                    let r = self.next_update(UpdateOp::Overlay {
                        ino,
                        offset,
                        data: data.clone(),
                    });
                    if let Ok(Answer::Written { offset, .. }) = r {
                        self.made(ino, offset, &data);
                    }
                    self.log(format!(
                        "mount {slot} writes {ino} through the primary at {offset:?}: {r:?}"
                    ));
                    if r.is_err() {
                        self.violation(format!("a write through to {ino} was refused: {r:?}"));
                    }
                    self.synced.remove(&ino);
                    self.send_mount(slot, id, ToMount::Written { ino, n });
                }
            },
            ToPrimary::Commit {
                ino,
                base,
                content,
                size,
                mtime,
            } => {
                // The holder of `Write` has nobody to recall; anyone
                // else's commit waits for the others' tokens.
                if self.tokens.level(id, ino) != Level::Write
                    && let Decision::Wait { .. } = self.tokens.exclusive(id, ino)
                {
                    let m = ToPrimary::Commit {
                        ino,
                        base,
                        content,
                        size,
                        mtime,
                    };
                    self.parked.push((slot, id, m));
                    self.flush_callbacks();
                    return;
                }
                let r = self.next_update(UpdateOp::Commit {
                    ino,
                    base,
                    content,
                    size,
                    // The simulator's contents are whole: all data.
                    held: size,
                    mtime,
                    flush: false,
                });
                self.log(format!(
                    "mount {slot} commits {ino} over version {base}: {r:?}"
                ));
                let msg = match r {
                    Ok(Answer::Committed { attr, .. }) => ToMount::Committed { attr },
                    _ => ToMount::Refused {
                        attr: Some(self.attr(ino)),
                    },
                };
                self.synced.remove(&ino);
                self.send_mount(slot, id, msg);
            }
            ToPrimary::Return {
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

    /// Before a file is cached again, the primary stores the overlay of
    /// its write-shared time as a new content version.
    fn flush_overlay(&mut self, ino: Ino) {
        let i = self.tree.get(ino).expect("a file");
        if !matches!(&i.body, Body::File { overlay, .. } if !overlay.is_empty()) {
            return;
        }
        let attr = i.attr;
        let content = vec![self.store.put(self.contents(ino))];
        let r = self.next_update(UpdateOp::Commit {
            ino,
            base: attr.version,
            content,
            size: attr.size,
            held: attr.size,
            mtime: attr.mtime,
            flush: true,
        });
        if r.is_err() {
            self.violation(format!("the overlay of {ino} could not be flushed: {r:?}"));
        }
    }

    fn retry_parked(&mut self) {
        let parked = std::mem::take(&mut self.parked);
        for (slot, id, m) in parked {
            if self.tokens.knows(id) && self.mounts[slot].id == id {
                self.primary(slot, id, m);
            }
        }
    }

    fn flush_callbacks(&mut self) {
        while let Some((to, cb)) = self.tokens.poll_callback() {
            if let Some(slot) = self.mounts.iter().position(|c| c.id == to) {
                self.log(format!("callback to mount {slot}: {cb:?}"));
                self.send_mount(slot, to, ToMount::Callback(cb));
            }
        }
    }
}
