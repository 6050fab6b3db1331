//! Random operations in the style of fsx on a real namespaced cluster
//! (`docs/fs.md`, "Tests"): five programs (`shoal-fs-worker`), two on n1
//! and one on each other node, each in its node's namespaces and so
//! through its node's own mount of /shoal, do seeded random operations
//! one at a time, each checked against a model: writes at random offsets
//! (beyond the end too), appends, truncations, replacements by rename,
//! `fsync`s and reads, through descriptors held across steps or fresh
//! ones; names made, removed, renamed (over others too), listed and read.
//! Between them come the faults the tree promises to survive:
//!
//! - the primary metadata replica is SIGKILLed (its daemon restarts it):
//!   nothing changes for the programs;
//! - n3's mount is SIGKILLed (its daemon mounts the tree again): n3's
//!   programs lose their descriptors, and of the files' contents only
//!   what n3 had not written back may be lost: such a file then reads as
//!   one of the states it went through since it was last written back
//!   (an `fsync`, or another node's use), byte by byte (pages are written
//!   back in any order), and never as anything else;
//! - n4 is cut off for 3 s, less than a lease: nothing changes;
//! - n4 is cut off for longer than a lease: the others go on (what n4
//!   cached is taken from it when its lease ends), leaving alone only the
//!   files n4 has changes to; after the heal, n4's programs go on with the
//!   descriptors they held and see the others' changes, and n4's changes
//!   are written back, since no one else changed those files, but one:
//!   n4's change to a file another node changed after n4's lease ended is
//!   refused (its `fsync` fails with `EIO`) and kept in `/shoal/.lost`;
//! - n2's file server is SIGKILLed (every version is on two): nothing
//!   changes.
//!
//! Seeded like the two-mount test (`crates/shoal-fuse/tests/fsx.rs`):
//! seed 1 by default, `SHOAL_FSX_SEED=N|random`, `SHOAL_FSX_OPS=N` (600).
//! Needs root.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};
use shoal_cluster::{Cluster, Mode};
use shoal_testnodes::fsx::differ;

mod common;

use common::{TestCluster, kill_and_wait, ok, sh};

const NODES: [&str; 4] = ["n1", "n2", "n3", "n4"];
/// The node of each worker: two programs share n1's mount.
const WORKERS: [usize; 5] = [0, 0, 1, 2, 3];
/// The node whose mount is killed.
const CRASHED: usize = 2;
/// The node cut off (it runs no metadata replica).
const CUT: usize = 3;
const ROOT: &str = "/shoal/fsx";
const FILES: usize = 3;
/// The largest offset written to, and the largest size truncated to.
const MAX: u64 = 128 << 10;
const WRITE_MAX: usize = 16 << 10;
const NAMES: usize = 6;
/// The longest one step may take (a lease, a grace period, retries).
const STEP: Duration = Duration::from_secs(120);
/// How long n4 is cut off the second time: more than a lease (10 s).
const LONG_CUT: Duration = Duration::from_secs(14);
/// Steps taken while n4 is cut off the second time: half before the
/// lease could end, half after.
const CUT_STEPS: usize = 40;

/// A `shoal-fs-worker` on a node.
struct Worker {
    node: usize,
    stdin: ChildStdin,
    answers: mpsc::Receiver<String>,
    child: Child,
    /// The paths it keeps a descriptor of.
    held: BTreeSet<String>,
}

impl Worker {
    fn start(c: &Cluster, node: usize) -> Worker {
        let mut child = c
            .command(NODES[node], env!("CARGO_BIN_EXE_shoal-fs-worker"))
            .unwrap()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, answers) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Worker {
            node,
            stdin,
            answers,
            child,
            held: BTreeSet::new(),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A file of the model.
#[derive(Clone)]
struct Obj {
    /// What every program must read now.
    now: Vec<u8>,
    /// The node whose mount may hold changes to it not yet written back.
    dirty: Option<usize>,
    /// Every state since it was last written back, that one first: what
    /// a crash of `dirty`'s mount may leave.
    since: Vec<Vec<u8>>,
}

impl Obj {
    fn new(now: Vec<u8>) -> Obj {
        Obj {
            since: vec![now.clone()],
            now,
            dirty: None,
        }
    }

    /// `node` is about to use it: another node's changes are written back
    /// first (the primary recalls that node's token).
    fn used(&mut self, node: usize) {
        if self.dirty != Some(node) {
            self.synced();
        }
    }

    /// `node` changed it to `now`.
    fn changed(&mut self, node: usize) {
        self.dirty = Some(node);
        self.since.push(self.now.clone());
    }

    fn synced(&mut self) {
        self.dirty = None;
        self.since = vec![self.now.clone()];
    }

    /// Whether `got` may be what a crash of `dirty`'s mount left: as long
    /// as one of the states since the last write-back, and each byte as
    /// it was in one of them.
    fn may_be(&self, got: &[u8]) -> bool {
        self.since.iter().any(|s| s.len() == got.len())
            && got.iter().enumerate().all(|(i, b)| {
                self.since
                    .iter()
                    .any(|s| s.get(i).copied().unwrap_or(0) == *b)
            })
    }
}

struct Run<'c> {
    c: &'c Cluster,
    rng: ChaCha8Rng,
    workers: Vec<Worker>,
    files: Vec<Obj>,
    /// The names in directory `d` and their files.
    names: BTreeMap<String, Obj>,
    /// The node cut off for longer than a lease: its programs wait, and
    /// the others leave alone what it has changes to.
    cut: Option<usize>,
    log: Vec<String>,
    started: Instant,
}

fn file(f: usize) -> String {
    format!("{ROOT}/f{f}")
}

fn name(n: &str) -> String {
    format!("{ROOT}/d/{n}")
}

fn bytes(v: &Value) -> Vec<u8> {
    hex::decode(v.as_str().unwrap()).unwrap()
}

impl Run<'_> {
    /// A step, or an event, for the log shown with a failure.
    fn note(&mut self, what: String) {
        let at = self.started.elapsed().as_secs_f64();
        self.log.push(format!("{at:7.2} {what}"));
    }

    fn fail(&self, what: &str) -> ! {
        let mut logs = String::new();
        let services = NODES
            .iter()
            .map(|n| ("fs-mount".to_owned(), n))
            .chain((0..3).map(|i| (format!("fs-r{i}"), &NODES[i])));
        for (service, node) in services {
            let out = sh(
                self.c,
                "n1",
                &format!("$SHOAL service logs {service} --node {node} -n 30"),
            );
            logs += &format!(
                "--- {service} on {node}:\n{}{}\n",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        panic!(
            "{what}\nsteps:\n{}\n(replay with SHOAL_FSX_SEED and the same SHOAL_FSX_OPS)\n{logs}",
            self.log.join("\n")
        )
    }

    fn check(&self, ok: bool, what: &str) {
        if !ok {
            self.fail(what)
        }
    }

    /// Request `r` of worker `w`: its answer, or the errno.
    fn ask(&mut self, w: usize, r: Value) -> Result<Value, i64> {
        if r["held"] == true {
            let path = r["path"].as_str().unwrap().to_owned();
            self.workers[w].held.insert(path);
        }
        let worker = &mut self.workers[w];
        let node = NODES[worker.node];
        if writeln!(worker.stdin, "{r}").is_err() {
            self.fail(&format!("the worker {w} on {node} is gone"));
        }
        let line = match worker.answers.recv_timeout(STEP) {
            Ok(line) => line,
            Err(e) => self.fail(&format!(
                "{}: no answer from worker {w} on {node} ({e})",
                shown(&r)
            )),
        };
        let v: Value = serde_json::from_str(&line).unwrap();
        match v.get("err") {
            Some(e) => Err(e.as_i64().unwrap_or(-1)),
            None => Ok(v["ok"].clone()),
        }
    }

    /// Request `r` of worker `w`, which must succeed.
    fn must(&mut self, w: usize, r: Value) -> Value {
        match self.ask(w, r.clone()) {
            Ok(v) => v,
            Err(e) => self.fail(&format!("{} on worker {w}: errno {e}", shown(&r))),
        }
    }

    fn data(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.rng.random()).collect()
    }

    /// Whether a step may touch `obj` now.
    fn free(&self, obj: &Obj) -> bool {
        self.cut.is_none() || obj.dirty != self.cut
    }

    fn step(&mut self) {
        let w = loop {
            let w = self.rng.random_range(0..WORKERS.len());
            if self.cut != Some(WORKERS[w]) {
                break w;
            }
        };
        let m = WORKERS[w];
        if self.rng.random_bool(0.3) {
            return self.name_step(w);
        }
        let f = self.rng.random_range(0..FILES);
        let held = self.rng.random_bool(0.4);
        if !self.free(&self.files[f]) {
            return;
        }
        let path = file(f);
        let len = self.files[f].now.len() as u64;
        self.files[f].used(m);
        match self.rng.random_range(0..9) {
            0 | 1 => {
                let off = self.rng.random_range(0..=(len + 4096).min(MAX));
                let n = self.rng.random_range(1..=WRITE_MAX);
                let data = self.data(n);
                self.note(format!("w{w} f{f} write {n} at {off} (held {held})"));
                self.must(
                    w,
                    json!({"op": "write", "path": path, "held": held, "off": off, "data": hex::encode(&data)}),
                );
                let obj = &mut self.files[f];
                let end = off as usize + n;
                if obj.now.len() < end {
                    obj.now.resize(end, 0);
                }
                obj.now[off as usize..end].copy_from_slice(&data);
                obj.changed(m);
            }
            2 => {
                let n = self.rng.random_range(1..=4096);
                let data = self.data(n);
                self.note(format!("w{w} f{f} append {n}"));
                self.must(
                    w,
                    json!({"op": "append", "path": path, "data": hex::encode(&data)}),
                );
                self.files[f].now.extend_from_slice(&data);
                self.files[f].changed(m);
            }
            3 | 4 => {
                let off = self.rng.random_range(0..=len);
                let n = self.rng.random_range(1..=(32usize << 10));
                self.note(format!("w{w} f{f} read {n} at {off} (held {held})"));
                let got = self.must(
                    w,
                    json!({"op": "read", "path": path, "held": held, "off": off, "len": n}),
                );
                let got = bytes(&got);
                let now = &self.files[f].now;
                let want = &now[off as usize..(off as usize + n).min(now.len())];
                self.check(
                    got == want,
                    &format!("read of f{f} by w{w}: {}", differ(&got, want)),
                );
            }
            5 => {
                let size = self.rng.random_range(0..=MAX);
                self.note(format!("w{w} f{f} truncate to {size} (held {held})"));
                self.must(
                    w,
                    json!({"op": "truncate", "path": path, "held": held, "size": size}),
                );
                self.files[f].now.resize(size as usize, 0);
                self.files[f].changed(m);
            }
            6 => {
                self.note(format!("w{w} f{f} stat and fsync"));
                let size = self.must(w, json!({"op": "size", "path": path}));
                self.check(
                    size.as_u64() == Some(len),
                    &format!("size of f{f} by w{w}: {size}"),
                );
                self.must(w, json!({"op": "fsync", "path": path, "held": held}));
                self.files[f].synced();
            }
            7 if self.cut.is_none() => {
                // Replaced whole by a rename: descriptors of the old
                // inode are closed first (they would read the old bytes).
                let n = self.rng.random_range(0..=(64usize << 10));
                let data = self.data(n);
                self.note(format!("w{w} f{f} replaced with {n} by rename"));
                for o in 0..self.workers.len() {
                    if self.workers[o].held.remove(&path) {
                        self.must(o, json!({"op": "close", "path": path}));
                    }
                }
                let tmp = format!("{ROOT}/new");
                self.must(
                    w,
                    json!({"op": "put", "path": tmp, "data": hex::encode(&data)}),
                );
                self.must(w, json!({"op": "rename", "from": tmp, "to": path}));
                let mut obj = Obj::new(Vec::new());
                obj.now = data;
                obj.changed(m);
                self.files[f] = obj;
            }
            _ => {
                self.note(format!("w{w} f{f} close held, read whole"));
                self.workers[w].held.remove(&path);
                self.must(w, json!({"op": "close", "path": path}));
                let got = bytes(&self.must(w, json!({"op": "cat", "path": path})));
                let want = &self.files[f].now;
                self.check(
                    &got == want,
                    &format!("f{f} read whole by w{w}: {}", differ(&got, want)),
                );
            }
        }
    }

    /// A step on the names of directory `d`, by worker `w`.
    fn name_step(&mut self, w: usize) {
        let m = WORKERS[w];
        let pick = |rng: &mut ChaCha8Rng| format!("n{}", rng.random_range(0..NAMES));
        let n = pick(&mut self.rng);
        let kind = self.rng.random_range(0..5);
        let to = pick(&mut self.rng);
        for touched in [&n, &to] {
            if self.names.get(touched).is_some_and(|o| !self.free(o)) {
                return;
            }
        }
        match kind {
            0 => {
                let len = self.rng.random_range(0..64);
                let data = self.data(len);
                self.note(format!("w{w} d/{n} written ({len})"));
                self.must(
                    w,
                    json!({"op": "put", "path": name(&n), "data": hex::encode(&data)}),
                );
                let obj = self.names.entry(n).or_insert_with(|| Obj::new(Vec::new()));
                obj.used(m);
                // Truncated by the open, then written.
                obj.now = Vec::new();
                obj.changed(m);
                obj.now = data;
                obj.changed(m);
            }
            1 => {
                self.note(format!("w{w} d/{n} removed"));
                let removed = self.ask(w, json!({"op": "remove", "path": name(&n)}));
                let had = self.names.remove(&n).is_some();
                self.check(
                    removed.is_ok() == had,
                    &format!("unlink of d/{n} by w{w}: {removed:?}"),
                );
            }
            2 => {
                self.note(format!("w{w} d/{n} renamed to d/{to}"));
                let moved = self.ask(
                    w,
                    json!({"op": "rename", "from": name(&n), "to": name(&to)}),
                );
                self.check(
                    moved.is_ok() == self.names.contains_key(&n),
                    &format!("rename of d/{n} by w{w}: {moved:?}"),
                );
                if let Some(obj) = self.names.remove(&n) {
                    self.names.insert(to, obj);
                }
            }
            3 => {
                self.note(format!("w{w} d listed"));
                let got = self.must(w, json!({"op": "list", "path": format!("{ROOT}/d")}));
                let want: Vec<&String> = self.names.keys().collect();
                self.check(got == json!(want), &format!("listing of d by w{w}: {got}"));
            }
            _ => {
                self.note(format!("w{w} d/{n} read"));
                let got = self.ask(w, json!({"op": "cat", "path": name(&n)}));
                if let Some(obj) = self.names.get_mut(&n) {
                    obj.used(m);
                }
                let got = got.ok().map(|v| bytes(&v));
                let want = self.names.get(&n).map(|o| &o.now);
                self.check(
                    got.as_ref() == want,
                    &format!("d/{n} by w{w}: {:?} bytes", got.map(|g| g.len())),
                );
            }
        }
    }
}

impl Run<'_> {
    /// Every path of the model and its file.
    fn paths(&self) -> Vec<String> {
        let files = (0..FILES).map(file);
        files.chain(self.names.keys().map(|n| name(n))).collect()
    }

    fn obj(&mut self, path: &str) -> &mut Obj {
        match path.strip_prefix(&format!("{ROOT}/d/")) {
            Some(n) => self.names.get_mut(n).unwrap(),
            None => {
                let f: usize = path[ROOT.len() + 2..].parse().unwrap();
                &mut self.files[f]
            }
        }
    }

    /// Asks worker `w` until it answers `r` (its mount may be coming
    /// back), for up to a minute.
    fn until(&mut self, w: usize, r: Value) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.ask(w, r.clone()) {
                Ok(v) => return v,
                Err(e) if Instant::now() > deadline => self.fail(&format!(
                    "{}: worker {w} kept failing (errno {e})",
                    shown(&r)
                )),
                Err(_) => std::thread::sleep(Duration::from_millis(300)),
            }
        }
    }

    /// The first worker on `node`.
    fn first_on(&self, node: usize) -> usize {
        WORKERS.iter().position(|n| *n == node).unwrap()
    }

    /// The primary metadata replica is SIGKILLed; its daemon restarts it.
    fn kill_primary(&mut self) {
        let status: Value = serde_json::from_str(&ok(self.c, "n1", "$SHOAL fs status")).unwrap();
        let i = status["replica"].as_u64().unwrap() as usize;
        self.note(format!(
            "the primary (fs-r{i} on {}) is killed",
            NODES[i % 3]
        ));
        kill_and_wait(self.c, NODES[i % 3], &format!("fs-r{i}"));
    }

    /// n2's file server is SIGKILLed; its daemon restarts it.  Every
    /// version is on two servers: reads go to the other, write-backs
    /// meanwhile to others, and nothing changes for the programs.
    fn kill_file_server(&mut self) {
        self.note("n2's file server is killed".into());
        kill_and_wait(self.c, "n2", "file");
    }

    /// n3's mount is SIGKILLed; its daemon mounts the tree again.  What
    /// it had not written back may be lost: each such file is read on
    /// another node and must be one of the states it may be in.
    fn kill_mount(&mut self) {
        self.note(format!("{}'s mount is killed", NODES[CRASHED]));
        kill_and_wait(self.c, NODES[CRASHED], "fs-mount");
        let mine: Vec<usize> = (0..WORKERS.len())
            .filter(|w| WORKERS[*w] == CRASHED)
            .collect();
        for w in &mine {
            // Its descriptors went with the mount.
            let _ = self.ask(*w, json!({"op": "close_all"}));
            self.workers[*w].held.clear();
            self.until(*w, json!({"op": "size", "path": file(0)}));
        }
        let other = (0..WORKERS.len()).find(|w| WORKERS[*w] != CRASHED).unwrap();
        for path in self.paths() {
            if self.obj(&path).dirty != Some(CRASHED) {
                continue;
            }
            let got = bytes(&self.must(other, json!({"op": "cat", "path": path})));
            let obj = self.obj(&path);
            let fits = obj.may_be(&got);
            let states = obj.since.len();
            obj.now = got;
            obj.synced();
            self.check(
                fits,
                &format!("{path} after the crash of {}'s mount is none of its {states} states since its last write-back", NODES[CRASHED]),
            );
            self.note(format!("{path} read after the crash: as allowed"));
        }
    }

    /// n4 is cut off for `long` or 3 s; steps go on meanwhile.
    fn cut_off(&mut self, steps: usize, long: bool) {
        let node = NODES[CUT];
        self.note(format!(
            "{node} is cut off ({})",
            if long { "longer than a lease" } else { "3 s" }
        ));
        // A change of n4's to f0, not written back when n4 is cut off: no
        // other program has f0 open, so n4 caches it (it would write
        // through the primary otherwise).
        let lost = if long {
            for o in 0..self.workers.len() {
                if self.workers[o].held.remove(&file(0)) {
                    self.must(o, json!({"op": "close", "path": file(0)}));
                }
            }
            // Emptied first, so the change is the whole file whether or
            // not the version it was made over is still kept when n4
            // finds it cannot write it back.
            let w = self.first_on(CUT);
            let data = self.data(8192);
            self.note(format!("w{w} f0 truncated to 0, write 8192 at 0"));
            self.files[0].used(CUT);
            self.must(
                w,
                json!({"op": "truncate", "path": file(0), "held": false, "size": 0}),
            );
            self.files[0].now.clear();
            self.files[0].changed(CUT);
            self.must(
                w,
                json!({"op": "write", "path": file(0), "held": false, "off": 0, "data": hex::encode(&data)}),
            );
            let obj = &mut self.files[0];
            obj.now = data;
            obj.changed(CUT);
            obj.now.clone()
        } else {
            Vec::new()
        };
        self.c.partition(node).unwrap();
        let started = Instant::now();
        if !long {
            // Healed from aside: the steps (n4's too) wait for it.
            let c_dir = self.c.dir().to_path_buf();
            let healer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(3));
                let c = Cluster::open(&c_dir).unwrap();
                c.heal(NODES[CUT]).unwrap();
            });
            for _ in 0..steps {
                self.step();
            }
            healer.join().unwrap();
            self.note(format!("{node} healed"));
            return;
        }
        self.cut = Some(CUT);
        for i in 0..steps {
            if i == steps / 2 {
                std::thread::sleep(LONG_CUT.saturating_sub(started.elapsed()));
                // n4's lease is over: another node changes the file n4
                // changed last, which n4 cannot write back any more.  The
                // file is as n4 last wrote it back (or not), then changed.
                let w = self.first_on(1);
                let path = file(0);
                let got = bytes(&self.must(w, json!({"op": "cat", "path": path})));
                self.note(format!("w{w} f0 read whole, after n4's lease"));
                let fits = self.files[0].may_be(&got);
                self.check(fits, "f0 after n4's lease is none of n4's states");
                let data = self.data(1000);
                self.note(format!("w{w} f0 write 1000 at 0"));
                self.must(
                    w,
                    json!({"op": "write", "path": path, "held": false, "off": 0, "data": hex::encode(&data)}),
                );
                let obj = &mut self.files[0];
                obj.now = got;
                obj.synced();
                obj.now.resize(obj.now.len().max(1000), 0);
                obj.now[..1000].copy_from_slice(&data);
                obj.changed(WORKERS[w]);
            }
            self.step();
        }
        std::thread::sleep(LONG_CUT.saturating_sub(started.elapsed()));
        self.c.heal(node).unwrap();
        self.note(format!("{node} healed"));
        // Its programs go on once its mount reaches the primary again, and
        // its changes are written back: no one else changed those files.
        let mine: Vec<usize> = (0..WORKERS.len()).filter(|w| WORKERS[*w] == CUT).collect();
        for w in &mine {
            self.until(*w, json!({"op": "size", "path": file(0)}));
        }
        for path in self.paths() {
            if self.obj(&path).dirty == Some(CUT) {
                self.note(format!("{path} fsynced on {node}"));
                self.must(mine[0], json!({"op": "fsync", "path": path, "held": false}));
                self.obj(&path).synced();
            }
        }
        // n4's change to f0 could not be written back: n4's next fsync
        // of it says so, and its bytes are kept in /shoal/.lost.
        self.note(format!("f0 fsynced on {node}: refused"));
        let refused = self.ask(
            mine[0],
            json!({"op": "fsync", "path": file(0), "held": false}),
        );
        self.check(
            refused == Err(libc::EIO as i64),
            &format!("the fsync of f0 on {node}, whose change to it is lost: {refused:?}"),
        );
        // (Kept by a thread of n4's mount: it may take a moment.)
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let listed = self.ask(0, json!({"op": "list", "path": "/shoal/.lost"}));
            let kept: Vec<String> = match &listed {
                Ok(v) => serde_json::from_value(v.clone()).unwrap(),
                Err(_) => Vec::new(),
            };
            let got = match kept.as_slice() {
                [one] if one.starts_with("n4-") => {
                    let path = format!("/shoal/.lost/{one}");
                    self.ask(0, json!({"op": "cat", "path": path}))
                        .map(|v| bytes(&v))
                }
                _ => Err(0),
            };
            if got.as_ref() == Ok(&lost) {
                self.note(format!("/shoal/.lost/{} holds n4's change", kept[0]));
                break;
            }
            if Instant::now() > deadline {
                let seen = got.map(|g| differ(&g, &lost));
                self.fail(&format!(
                    "/shoal/.lost: {listed:?}; n4's lost change: {seen:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        self.cut = None;
    }
}

#[test]
fn random_operations_on_four_nodes_through_crashes_and_partitions_match_a_model() {
    let (seed, ops) = shoal_testnodes::fsx::seed_and_steps(600);
    let tc = TestCluster::up("fx", 61, 4, Mode::Netns);
    let c = tc.get();
    c.start_system(&mut |l| eprintln!("[fx] {l}")).unwrap();
    let mut setup = format!("mkdir -p {ROOT}/d");
    for f in 0..FILES {
        setup += &format!(" && : > {}", file(f));
    }
    ok(c, "n1", &setup);
    let mut run = Run {
        c,
        rng: ChaCha8Rng::seed_from_u64(seed),
        workers: WORKERS.iter().map(|n| Worker::start(c, *n)).collect(),
        files: vec![Obj::new(Vec::new()); FILES],
        names: BTreeMap::new(),
        cut: None,
        log: Vec::new(),
        started: Instant::now(),
    };
    let part = ops / 6;
    for i in 0..ops {
        match i {
            _ if i == part => run.kill_primary(),
            _ if i == 2 * part => run.kill_mount(),
            _ if i == 3 * part => run.cut_off(part / 2, false),
            _ if i == 4 * part => run.cut_off(CUT_STEPS, true),
            _ if i == 5 * part => run.kill_file_server(),
            _ => {}
        }
        run.step();
    }
    // At the end, every file as the model says, on every node.
    for w in 0..WORKERS.len() {
        run.must(w, json!({"op": "close_all"}));
    }
    for path in run.paths() {
        for w in 0..WORKERS.len() {
            let got = bytes(&run.must(w, json!({"op": "cat", "path": path})));
            let want = run.obj(&path).now.clone();
            run.check(
                got == want,
                &format!("{path} at the end by w{w}: {}", differ(&got, &want)),
            );
        }
    }
    eprintln!(
        "fsx: {ops} steps in {:.1} s",
        run.started.elapsed().as_secs_f64()
    );
}

/// A request as a failure shows it: its data by length.
fn shown(r: &Value) -> String {
    let mut r = r.clone();
    if let Some(d) = r.get("data").and_then(|d| d.as_str()) {
        r["data"] = json!(format!("({} bytes)", d.len() / 2));
    }
    r.to_string()
}
