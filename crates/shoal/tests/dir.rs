//! The directory service on real local clusters: replicas are `shoal dir
//! serve` processes in separate network namespaces; clients are `shoal
//! dir` commands and the test workload (`shoal-dir-workload`) on other
//! nodes.  Faults are real: SIGKILL, SIGSTOP/SIGCONT and iptables
//! partitions.  The workload's history (CLOCK_MONOTONIC call and return
//! times of every operation, from several processes at once) is checked
//! for linearizability with the simulator's checker.  Needs root, like
//! `cluster.rs`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{TestCluster, fails_with, shoal};
use shoal_cluster::{Cluster, Mode};
use shoal_dirsvc::workload::Record;
use shoal_sim::dir::DirModel;
use shoal_sim::linearize::{self, CheckResult, Operation};

/// One `shoal dir serve` process.
struct Replica {
    node: String,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl Replica {
    fn start(c: &Cluster, node: &str, args: Vec<String>, log: PathBuf) -> Replica {
        let mut r = Replica {
            node: node.into(),
            args,
            log,
            child: None,
        };
        r.spawn(c);
        r
    }

    fn spawn(&mut self, c: &Cluster) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = c
            .command(&self.node, shoal())
            .unwrap()
            .arg("dir")
            .arg("serve")
            .args(&self.args)
            .env("SHOAL_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: plain kill(2) of our child.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        self.kill();
    }
}

/// A directory service of three replicas on n1–n3.
struct Service {
    replicas: Vec<Replica>,
    config: PathBuf,
    dir: tempfile::TempDir,
}

impl Service {
    /// Started and its root directory made (from n4).
    fn ready(c: &Cluster, durability: &str) -> Service {
        let s = Service::start(c, durability);
        s.ok(c, "n4", &["init"]);
        s
    }

    /// Checks that `d` lists `f0` to `f19`.
    fn holds_twenty(&self, c: &Cluster) {
        let ls = self.ok(c, "n4", &["dir", "ls", "d"]);
        for i in 0..20 {
            assert!(
                ls.contains(&format!("  f{i}\n")),
                "f{i} lost: {ls}\n{}",
                self.logs()
            );
        }
    }

    /// Ready, and every replica a member of the group.
    fn joined(c: &Cluster, durability: &str) -> Service {
        let s = Service::ready(c, durability);
        s.all_members(c);
        s
    }

    fn start(c: &Cluster, durability: &str) -> Service {
        let dir = tempfile::tempdir().unwrap();
        let replicas = (0..3)
            .map(|i| {
                let data = dir.path().join(format!("r{i}"));
                Replica::start(
                    c,
                    &format!("n{}", i + 1),
                    vec![
                        "--replica".into(),
                        i.to_string(),
                        "--replicas".into(),
                        "3".into(),
                        "--durability".into(),
                        durability.into(),
                        "--flush-ms".into(),
                        "200".into(),
                        // Small, so snapshots and log rotation happen in
                        // every test, and recovery reads both.
                        "--snapshot-bytes".into(),
                        "65536".into(),
                        "--data".into(),
                        data.display().to_string(),
                    ],
                    dir.path().join(format!("r{i}.log")),
                )
            })
            .collect();
        let config = dir.path().join("config");
        std::fs::create_dir_all(&config).unwrap();
        Service {
            replicas,
            config,
            dir,
        }
    }

    /// `shoal ARGS` on `node` with this service's user configuration.
    fn cli(&self, c: &Cluster, node: &str, args: &[&str]) -> Output {
        self.cmd(c, node).args(args).output().unwrap()
    }

    fn cmd(&self, c: &Cluster, node: &str) -> Command {
        let mut cmd = c.command(node, shoal()).unwrap();
        cmd.env("SHOAL_CONFIG_DIR", &self.config);
        cmd
    }

    /// The directory test workload (`shoal-dir-workload`, a test program
    /// users are not given) on `node`.
    fn workload_cmd(&self, c: &Cluster, node: &str) -> Command {
        let mut cmd = c
            .command(node, env!("CARGO_BIN_EXE_shoal-dir-workload"))
            .unwrap();
        cmd.env("SHOAL_CONFIG_DIR", &self.config);
        cmd
    }

    /// Runs the workload with ARGS until it succeeds.
    fn ok_workload(&self, c: &Cluster, node: &str, args: &[&str]) -> String {
        let out = common::until_ok(
            &format!("shoal-dir-workload {args:?}"),
            || self.workload_cmd(c, node).args(args).output().unwrap(),
            || self.logs(),
        );
        String::from_utf8(out).unwrap()
    }

    /// Runs `shoal ARGS` until it succeeds (the service may be re-forming).
    fn ok(&self, c: &Cluster, node: &str, args: &[&str]) -> String {
        let out = common::until_ok(
            &format!("shoal {args:?}"),
            || self.cli(c, node, args),
            || self.logs(),
        );
        String::from_utf8(out).unwrap()
    }

    /// Waits until every replica is a member of the group (a replica
    /// holds the directory only from then on).
    fn all_members(&self, c: &Cluster) {
        common::until_output(
            "replicas all joining",
            || self.cli(c, "n4", &["dir", "status", "--all"]),
            |text| text.lines().skip(1).all(|l| l.contains(" member ")),
            || self.logs(),
        );
    }

    fn logs(&self) -> String {
        let mut s = String::new();
        for i in 0..3 {
            let text = std::fs::read_to_string(self.dir.path().join(format!("r{i}.log")))
                .unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            s += &format!("--- replica {i} (n{}) ---\n", i + 1);
            for l in tail.into_iter().rev() {
                s += l;
                s.push('\n');
            }
        }
        s
    }

    fn data(&self) -> &Path {
        self.dir.path()
    }
}

#[test]
fn names_from_every_node_and_every_error() {
    let tc = TestCluster::up("da", 27, 4, Mode::Netns);
    let c = tc.get();
    let s = Service::start(c, "fsync");
    let root = s.ok(c, "n4", &["init"]);
    assert!(root.starts_with("root directory cap1:"), "{root}");
    s.ok(c, "n4", &["dir", "mkdir", "a"]);
    let b = s.ok(c, "n4", &["dir", "mkdir", "a/b"]);
    let b = b.trim();
    s.ok(c, "n4", &["dir", "put", "a/b/x", b]);
    // Registered on n4, looked up on n1 (a replica's node) and n2.
    assert_eq!(s.ok(c, "n1", &["dir", "lookup", "a/b/x"]).trim(), b);
    assert!(s.ok(c, "n2", &["dir", "ls", "a/b"]).contains("  x"));
    let ls: serde_json::Value =
        serde_json::from_str(&s.ok(c, "n2", &["dir", "ls", "--json", "a/b"])).unwrap();
    assert_eq!(
        ls["columns"],
        serde_json::json!(["owner", "group", "other"]),
        "{ls}"
    );
    assert_eq!(ls["rows"][0]["name"], "x", "{ls}");
    assert_eq!(
        ls["rows"][0]["masks"].as_array().map(Vec::len),
        Some(3),
        "{ls}"
    );
    s.ok(c, "n3", &["dir", "mv", "a/b/x", "a/y"]);
    assert_eq!(s.ok(c, "n4", &["dir", "lookup", "a/y"]).trim(), b);
    fails_with(&s.cli(c, "n4", &["dir", "lookup", "a/b/x"]), "not found");
    // Masks: "other" (column 2) of a subdirectory entry reaches it with
    // column 2 only; restrict the root to that column and look through it.
    let root_cap = root.split_whitespace().nth(2).unwrap().to_string();
    let other = s.ok(c, "n4", &["cap", "restrict", &root_cap, "--rights", "0x04"]);
    let via_other = s.ok(c, "n4", &["dir", "lookup", "--root", other.trim(), "a"]);
    assert!(
        s.ok(c, "n4", &["cap", "show", via_other.trim()])
            .contains("rights  --c-----"),
        "the 'other' column grants only its own column on a directory"
    );
    // Writes need the MODIFY right.
    fails_with(
        &s.cli(c, "n4", &["dir", "put", "--root", other.trim(), "z", b]),
        "needs",
    );
    s.ok(c, "n4", &["dir", "chmod", "a/y", "0xff,0x02,0x00"]);
    let via_other = s.cli(c, "n4", &["dir", "lookup", "--root", other.trim(), "a/y"]);
    assert!(via_other.status.success());
    assert!(
        s.ok(
            c,
            "n4",
            &[
                "cap",
                "show",
                String::from_utf8_lossy(&via_other.stdout).trim()
            ]
        )
        .contains("rights  --------")
    );
    // Bad input, each with its own one-line error.
    let long = "n".repeat(256);
    fails_with(
        &s.cli(c, "n4", &["dir", "put", &format!("a/{long}"), b]),
        "the limit is 255",
    );
    {
        use std::os::unix::ffi::OsStrExt;
        let bad = std::ffi::OsStr::from_bytes(b"a/\xff\xfe");
        let out = s
            .cmd(c, "n4")
            .args(["dir", "put"])
            .arg(bad)
            .arg(b)
            .output()
            .unwrap();
        fails_with(&out, "UTF-8");
    }
    fails_with(&s.cli(c, "n4", &["dir", "put", "a/y", b]), "already exists");
    fails_with(&s.cli(c, "n4", &["dir", "rm", "-d", "a"]), "not empty");
    // A deleted directory's capability is stale.
    s.ok(c, "n4", &["dir", "rm", "-d", "a/b"]);
    fails_with(
        &s.cli(c, "n4", &["dir", "ls", "--root", b]),
        "no such directory",
    );
    fails_with(
        &s.cli(c, "n4", &["dir", "ls", "--root", "cap1:00"]),
        "capability",
    );
}

/// Runs the workload on `nodes` while `faults` runs; returns the history.
fn workload_under_faults(
    c: &Cluster,
    s: &Service,
    nodes: &[&str],
    faults: impl FnOnce(),
) -> Vec<Record> {
    let w = s.ok(c, "n4", &["dir", "mkdir", "w", "--columns", "owner"]);
    let w = w.trim().to_string();
    let procs: Vec<Child> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            s.workload_cmd(c, n)
                .args(["--dir", &w, "--clients", "3", "--ops", "100000"])
                .args(["--seconds", "9"])
                .args(["--names", "3", "--seed", &(i + 1).to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    faults();
    let mut records = Vec::new();
    for p in procs {
        let out = p.wait_with_output().unwrap();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            records.push(Record::from_json(line).expect("a history line"));
        }
    }
    // After the faults: every name once more, so every acknowledged
    // update is checked.
    let finals = s.ok_workload(
        c,
        "n4",
        &["--dir", &w, "--names", "3", "--seed", "99", "--final-reads"],
    );
    for line in finals.lines() {
        let r = Record::from_json(line).expect("a history line");
        assert!(
            r.output.is_some(),
            "final read failed: {line}\n{}",
            s.logs()
        );
        records.push(r);
    }
    records
}

fn check_linearizable(records: &[Record], s: &Service) {
    let history: Vec<Operation<_, _>> = records
        .iter()
        .map(|r| Operation {
            client: r.client,
            input: r.input.clone(),
            call: r.call,
            output: r.output.clone(),
            ret: r.ret,
        })
        .collect();
    let known = history.iter().filter(|o| o.output.is_some()).count();
    eprintln!(
        "history: {} operations, {known} answered, {} unknown",
        history.len(),
        history.len() - known
    );
    assert!(
        known * 2 > history.len(),
        "most operations must complete\n{}",
        s.logs()
    );
    match linearize::check(&DirModel { names: 3 }, &history, None) {
        CheckResult::Ok => {}
        CheckResult::Illegal { longest_prefix, .. } => panic!(
            "not linearizable: the longest legal prefix holds {} of {} operations\n{}",
            longest_prefix.len(),
            history.len(),
            s.logs()
        ),
        CheckResult::Unknown => panic!("the checker ran out of its budget"),
    }
}

#[test]
fn linearizable_through_sigkill_sigstop_and_partitions() {
    let tc = TestCluster::up("db", 28, 5, Mode::Netns);
    let c = tc.get();
    let mut s = Service::joined(c, "fsync");
    // The fault thread owns the replicas meanwhile.
    let mut replicas = std::mem::take(&mut s.replicas);
    let faults = || {
        std::thread::sleep(Duration::from_millis(400));
        // SIGKILL a replica; restart it a second later.
        replicas[0].kill();
        std::thread::sleep(Duration::from_secs(1));
        replicas[0].spawn(c);
        std::thread::sleep(Duration::from_millis(1500));
        // Pause another for longer than the failure timeout.
        replicas[1].signal(libc::SIGSTOP);
        std::thread::sleep(Duration::from_millis(1500));
        replicas[1].signal(libc::SIGCONT);
        std::thread::sleep(Duration::from_millis(1500));
        // Cut the third off the network, then heal.
        c.partition("n3").unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        c.heal("n3").unwrap();
    };
    let records = workload_under_faults(c, &s, &["n4", "n5"], faults);
    s.replicas = replicas;
    check_linearizable(&records, &s);
}

#[test]
fn acknowledged_updates_survive_losing_replicas() {
    let tc = TestCluster::up("dc", 29, 4, Mode::Netns);
    let c = tc.get();
    // fsync: every replica SIGKILLed at once loses nothing acknowledged.
    let mut s = Service::ready(c, "fsync");
    s.ok(c, "n4", &["dir", "mkdir", "d"]);
    let d = s.ok(c, "n4", &["dir", "lookup", "d"]);
    for i in 0..20 {
        s.ok(c, "n4", &["dir", "put", &format!("d/f{i}"), d.trim()]);
    }
    s.all_members(c);
    for r in &mut s.replicas {
        r.kill();
    }
    for r in &mut s.replicas {
        r.spawn(c);
    }
    s.holds_twenty(c);
    let _ = s.data();
    drop(s);

    // replicated: r = 2 of 3 SIGKILLed at once loses nothing acknowledged.
    let mut s = Service::ready(c, "replicated");
    s.ok(c, "n4", &["dir", "mkdir", "d"]);
    s.all_members(c);
    for i in 0..20 {
        s.ok(c, "n4", &["dir", "put", &format!("d/f{i}"), d.trim()]);
    }
    s.replicas[0].kill();
    s.replicas[1].kill();
    std::thread::sleep(Duration::from_millis(500));
    s.replicas[0].spawn(c);
    s.replicas[1].spawn(c);
    s.holds_twenty(c);
    // And the restarted replicas serve it too (the survivor is killed now).
    s.ok(c, "n4", &["dir", "put", "d/after", d.trim()]);
    s.all_members(c);
    s.replicas[2].kill();
    let ls = s.ok(c, "n4", &["dir", "ls", "d"]);
    assert!(
        ls.contains("  after\n") && ls.contains("  f19\n"),
        "{ls}\n{}",
        s.logs()
    );
}

/// The status of each replica that answers through its peer port (`dir
/// status --all --json`: one line each).
fn replica_statuses(s: &Service, c: &Cluster) -> Vec<serde_json::Value> {
    let out = s.cli(c, "n4", &["dir", "status", "--all", "--json"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Writes taken by the replica that says it orders them, and by all.
fn writes_at_sequencer(statuses: &[serde_json::Value]) -> (Option<usize>, u64) {
    let at = statuses
        .iter()
        .position(|r| !r["writes_at"].is_null() && r["endpoint"] == r["writes_at"]);
    let all = statuses.iter().filter_map(|r| r["writes"].as_u64()).sum();
    (at, all)
}

/// A short `shoal-dir-workload` of one client on n4, in a directory of its own.
fn workload(s: &Service, c: &Cluster, seed: &str) -> String {
    let w = s.ok(
        c,
        "n4",
        &["dir", "mkdir", &format!("w{seed}"), "--columns", "owner"],
    );
    s.ok_workload(
        c,
        "n4",
        &[
            "--dir",
            w.trim(),
            "--clients",
            "1",
            "--ops",
            "400",
            "--names",
            "3",
            "--seed",
            seed,
        ],
    )
}

#[test]
fn clients_write_at_the_sequencers_replica_and_follow_it_when_it_dies() {
    let tc = TestCluster::up("dd", 54, 4, Mode::Netns);
    let c = tc.get();
    let mut s = Service::joined(c, "replicated");
    // Every replica agrees where writes go, and a client that writes more
    // than once sends them there: the other replicas take at most its
    // first write and the question.
    let deadline = Instant::now() + Duration::from_secs(20);
    let statuses = loop {
        let st = replica_statuses(&s, c);
        let agreed = st.len() == 3
            && st
                .iter()
                .all(|r| !r["writes_at"].is_null() && r["writes_at"] == st[0]["writes_at"]);
        if agreed {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "no agreement on where writes go: {st:?}\n{}",
            s.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let (at, before) = writes_at_sequencer(&statuses);
    let at = at.expect("one replica orders the writes");
    let taken_before = statuses[at]["writes"].as_u64().unwrap();
    workload(&s, c, "1");
    let statuses = replica_statuses(&s, c);
    let (_, after) = writes_at_sequencer(&statuses);
    let taken = statuses[at]["writes"].as_u64().unwrap() - taken_before;
    let all = after - before;
    assert!(all >= 50, "the workload wrote little: {all}");
    assert!(
        taken + 5 >= all,
        "replica {at} took {taken} of {all} writes: {statuses:?}"
    );
    // The sequencer's replica dies: the group goes on under another, and
    // the clients follow it there.
    s.replicas[at].kill();
    let deadline = Instant::now() + Duration::from_secs(30);
    let (next, statuses) = loop {
        let st: Vec<_> = replica_statuses(&s, c)
            .into_iter()
            .filter(|r| r["phase"] == "member")
            .collect();
        let (next, _) = writes_at_sequencer(&st);
        if st.len() == 2
            && let Some(n) = next
        {
            break (st[n]["replica"].as_u64().unwrap(), st);
        }
        assert!(
            Instant::now() < deadline,
            "no new sequencer: {st:?}\n{}",
            s.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_ne!(next, at as u64, "{statuses:?}");
    let writes = |st: &[serde_json::Value], r: u64| {
        st.iter()
            .find(|x| x["replica"] == r)
            .and_then(|x| x["writes"].as_u64())
            .unwrap_or(0)
    };
    let other = 3 - next - at as u64;
    let (next_before, other_before) = (writes(&statuses, next), writes(&statuses, other));
    workload(&s, c, "2");
    let statuses = replica_statuses(&s, c);
    let taken = writes(&statuses, next) - next_before;
    let elsewhere = writes(&statuses, other) - other_before;
    assert!(
        taken >= 50 && elsewhere <= 5,
        "new sequencer's replica {next} took {taken}, replica {other} {elsewhere}: {statuses:?}\n{}",
        s.logs()
    );
}
