//! The processor pool on a real local cluster: `shoal run` from one node
//! to another, with output, input, exit statuses, signals and failures.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{TestCluster, shoal};
use shoal_cluster::{Cluster, Mode};

/// `shoal run --on ON -- ARGS` from node `from`, in `dir`, with `input`.
fn run_from(c: &Cluster, from: &str, on: &str, dir: &str, args: &[&str], input: &[u8]) -> Output {
    let mut cmd = c.command(from, shoal()).unwrap();
    cmd.current_dir(dir)
        .env("SHOAL_TEST_MARK", "home-env")
        .args(["run", "--on", on, "--"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `shoal run --on n2 -- sleep MARK`, started from `from`.
fn sleep_on_n2(c: &Cluster, from: &str, mark: &str) -> std::process::Child {
    c.command(from, shoal())
        .unwrap()
        .args(["run", "--on", "n2", "--", "sleep", mark])
        .spawn()
        .unwrap()
}

/// Checks that `stderr` says `what`, printing all it said if not.
fn assert_says(stderr: &[u8], what: &str) {
    let said = text(stderr);
    assert!(said.contains(what), "{said}");
}

/// Whether a process whose command line matches `pattern` runs.
fn running(pattern: &str) -> bool {
    !Command::new("pgrep")
        .args(["-f", pattern])
        .output()
        .unwrap()
        .stdout
        .is_empty()
}

/// Waits up to `secs` for a process matching `pattern` to be there
/// (`there`) or gone, failing with `why` if not.
fn await_process(pattern: &str, there: bool, secs: u64, why: &str) {
    let until = Instant::now() + Duration::from_secs(secs);
    while running(pattern) != there {
        assert!(Instant::now() < until, "{why}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_program_runs_elsewhere_as_if_it_ran_here() {
    let t = TestCluster::up("tp", 34, 3, Mode::Netns);
    let c = t.get();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();

    // Output on both streams, the exit status, the working directory and
    // the environment of the home.
    let script = "echo out; echo err >&2; pwd; echo $SHOAL_TEST_MARK; umask; exit 3";
    let out = run_from(c, "n1", "n2", d, &["sh", "-c", script], b"");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let mask = format!("{:04o}", unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m
    });
    assert_eq!(text(&out.stdout), format!("out\n{d}\nhome-env\n{mask}\n"));
    assert_eq!(text(&out.stderr), "err\n");

    // Its resource limits are the home's; it has a PID namespace of its
    // own (pid 2, under the watcher) and the home's host name.
    let mut cmd = c.command("n1", shoal()).unwrap();
    cmd.current_dir(d).args([
        "run",
        "--on",
        "n2",
        "--",
        "sh",
        "-c",
        "ulimit -n; echo $$; hostname",
    ]);
    // SAFETY: setrlimit between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            let l = libc::rlimit {
                rlim_cur: 321,
                rlim_max: 4096,
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(text(&out.stdout), format!("321\n2\n{}\n", host.trim()));

    // A node the cluster does not have: refused at once.
    let out = run_from(c, "n1", "n9", d, &["true"], b"");
    assert_eq!(out.status.code(), Some(125));
    assert_says(&out.stderr, "no node named n9");

    // Input, at volume, byte for byte.
    let data: Vec<u8> = (0..24u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let out = run_from(c, "n1", "n3", d, &["cat"], &data);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        out.stdout == data,
        "cat returned {} bytes, not the input",
        out.stdout.len()
    );

    // A program that cannot start, or a directory the node lacks: 125
    // and one line saying why.
    let out = run_from(c, "n1", "n2", d, &["no-such-program-here"], b"");
    assert_eq!(out.status.code(), Some(125));
    assert_says(&out.stderr, "cannot start no-such-program-here");
    // A home whose own working directory is gone says so.
    let gone = dir.path().join("gone");
    std::fs::create_dir(&gone).unwrap();
    let mut cmd = c.command("n1", shoal()).unwrap();
    let child = cmd
        .current_dir(&gone)
        .args(["run", "--on", "n2", "--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::fs::remove_dir(&gone).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    assert_says(&out.stderr, "no working directory");
}

#[test]
fn signals_reach_the_program_and_its_end_comes_back() {
    let t = TestCluster::up("tq", 35, 3, Mode::Netns);
    let c = t.get();
    // A sleep nothing else on the machine runs, to look for it.
    let mark = format!("61.{}", std::process::id());
    // The program counts in its node's load report while it runs.
    let mut child = sleep_on_n2(c, "n1", &mark);
    let ctx = c.context();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let s = c.status(&ctx, "n1", Duration::from_secs(2)).unwrap();
        let n2 = s.members.iter().find(|m| m.name == "n2").unwrap();
        if n2.load.as_ref().is_some_and(|l| l.shoal_procs == 1) {
            break;
        }
        assert!(
            Instant::now() < until,
            "n2 never reported its shoal process"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: kill(2) of our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");
    assert!(
        !running(&format!("sleep {mark}")),
        "the remote program is still there"
    );

    // The home dies under a running program: the program dies too.
    let third = format!("63.{}", std::process::id());
    let child = sleep_on_n2(c, "n3", &third);
    let pattern = format!("^sleep {third}$");
    await_process(&pattern, true, 10, "the program never started");
    c.kill("n3").unwrap();
    await_process(&pattern, false, 10, "the program outlived its home");
    drop(child);
    c.start_node("n3").unwrap();
    c.wait_ready(Duration::from_secs(10), &mut |_| {}).unwrap();

    // The node dies under a running program: 255, and a message.
    let other = format!("62.{}", std::process::id());
    let child = c
        .command("n1", shoal())
        .unwrap()
        .args(["run", "--on", "n3", "--", "sleep", &other])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    c.kill("n3").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(255));
    assert_says(&out.stderr, "node n3 is unreachable");
    // The program died with its node's daemon.
    await_process(
        &format!("sleep {other}"),
        false,
        5,
        "the program outlived its node",
    );
}

/// `--any` lets the pool choose: never a node whose owner is active
/// unless allowed, a burst spread over the others, and a clear refusal
/// when no node is eligible.
#[test]
fn placement_avoids_owner_active_nodes_and_spreads_a_burst() {
    let t = TestCluster::up("tr", 36, 3, Mode::Netns);
    let c = t.get();
    let ctx = c.context();
    let owner = |node: &str, state: &str| {
        let out = c
            .command(node, shoal())
            .unwrap()
            .args(["node", "owner", state])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    };
    // n1's view of each node: (owner active, shoal processes).
    let view = || -> Vec<(String, bool, u32)> {
        let s = c.status(&ctx, "n1", Duration::from_secs(2)).unwrap();
        s.members
            .iter()
            .filter_map(|m| {
                let l = m.load.as_ref()?;
                Some((m.name.clone(), l.owner_active, l.shoal_procs))
            })
            .collect()
    };
    owner("n2", "active");
    let until = Instant::now() + Duration::from_secs(10);
    while !view().iter().any(|(n, active, _)| n == "n2" && *active) || view().len() < 3 {
        assert!(
            Instant::now() < until,
            "n1 never saw n2's owner active: {:?}",
            view()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mark = format!("3.{}", std::process::id());
    let runs: Vec<_> = (0..4)
        .map(|_| {
            c.command("n1", shoal())
                .unwrap()
                .args(["run", "--any", "--", "sleep", &mark])
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let v = view();
        let on = |name: &str| v.iter().find(|(n, ..)| n == name).map_or(0, |x| x.2);
        assert_eq!(
            on("n2"),
            0,
            "a program went to the owner-active node: {v:?}"
        );
        if on("n1") + on("n3") == 4 {
            break;
        }
        assert!(Instant::now() < until, "the burst never showed: {v:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    for r in runs {
        let out = r.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    // Every owner active: refused, unless allowed.
    owner("n1", "active");
    owner("n3", "active");
    let until = Instant::now() + Duration::from_secs(10);
    while !view().iter().all(|(_, active, _)| *active) {
        assert!(
            Instant::now() < until,
            "owners not all active: {:?}",
            view()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let run_any = |extra: &[&str]| {
        c.command("n1", shoal())
            .unwrap()
            .args(["run", "--any"])
            .args(extra)
            .args(["--", "echo", "ran"])
            .output()
            .unwrap()
    };
    let out = run_any(&[]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert_says(&out.stderr, "every node's owner is active");
    let out = run_any(&["--allow-owner-active"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "ran\n");
}

/// The id of the one process `shoal ps` (from `from`) lists whose command
/// is `command`, and that row.
fn ps_row(c: &Cluster, from: &str, all: bool, command: &str) -> Option<serde_json::Value> {
    let mut cmd = c.command(from, shoal()).unwrap();
    cmd.args(["ps", "--json"]);
    if all {
        cmd.arg("--all");
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    rows.into_iter().find(|r| r["command"] == command)
}

/// Waits for `shoal ps` to list `command` in `state`: its row.
fn await_row(c: &Cluster, from: &str, command: &str, state: &str) -> serde_json::Value {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(r) = ps_row(c, from, true, command)
            && r["state"] == state
        {
            return r;
        }
        assert!(
            Instant::now() < until,
            "{command} never showed as {state}: {:?}",
            ps_row(c, from, true, command)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for `shoal ps` to list `command` as running on its node (the
/// home lists it from the start; its node, once it runs there): its row.
fn await_started(c: &Cluster, from: &str, command: &str) -> serde_json::Value {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let row = await_row(c, from, command, "running");
        if !row["rss_kib"].is_null() {
            return row;
        }
        assert!(Instant::now() < until, "its node never listed it: {row}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `shoal ARGS` on node `from`, to its end.
fn shoal_on(c: &Cluster, from: &str, args: &[&str]) -> Output {
    c.command(from, shoal())
        .unwrap()
        .args(args)
        .output()
        .unwrap()
}

/// The home's process table answers for its processes from any node:
/// `shoal ps` shows where they run, `shoal kill` and `shoal wait` go
/// through the home, a `shoal run` that dies takes its program with it,
/// `--retry` starts an idempotent program again after its node's loss, and
/// `--wait` queues a program until a node is eligible.
#[test]
fn the_home_answers_for_its_processes() {
    let t = TestCluster::up("ts", 37, 3, Mode::Netns);
    let c = t.get();
    use std::os::unix::process::ExitStatusExt;

    // ps from a third node: home n1, running on n2, with its memory.
    let mark = format!("71.{}", std::process::id());
    let command = format!("sleep {mark}");
    let run = sleep_on_n2(c, "n1", &mark);
    let row = await_started(c, "n3", &command);
    assert_eq!((&row["home"], &row["node"]), (&"n1".into(), &"n2".into()));
    assert!(row["rss_kib"].as_u64().unwrap() > 0, "{row}");
    let id = row["id"].as_str().unwrap().to_string();
    // Readable: the home's name and a small number.
    let (home, seq) = id.split_once('.').unwrap();
    assert_eq!(home, "n1", "{id}");
    assert!(seq.parse::<u64>().unwrap() < 1000, "{id}");
    let by_name = id.clone();

    // wait from n3 and kill from n2, both through the home n1.
    let waiter = c
        .command("n3", shoal())
        .unwrap()
        .args(["wait", &by_name])
        .spawn()
        .unwrap();
    let out = shoal_on(c, "n2", &["kill", "-USR1", &by_name]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let run = run.wait_with_output().unwrap();
    assert_eq!(run.status.signal(), Some(libc::SIGUSR1), "{:?}", run.status);
    let waited = waiter.wait_with_output().unwrap();
    assert_eq!(waited.status.code(), Some(128 + libc::SIGUSR1));
    await_row(c, "n2", &command, "killed by SIGUSR1");
    let out = shoal_on(c, "n3", &["kill", &id]);
    assert_eq!(out.status.code(), Some(1));
    // The home's error names the process as ps does.
    assert_says(&out.stderr, &format!("process {id} has ended"));
    let out = shoal_on(c, "n3", &["wait", "n1.999999"]);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
    assert_says(&out.stderr, "n1.999999");
    let out = shoal_on(c, "n3", &["kill", "-NOSUCH", &id]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));

    // A shoal run killed outright: its home hangs up on the program, and
    // its fate is unknown to wait.
    let mark = format!("72.{}", std::process::id());
    let command = format!("sleep {mark}");
    let mut run = sleep_on_n2(c, "n1", &mark);
    let row = await_started(c, "n3", &command);
    run.kill().unwrap();
    run.wait().unwrap();
    await_row(c, "n3", &command, "lost");
    let out = shoal_on(c, "n3", &["wait", row["id"].as_str().unwrap()]);
    assert_eq!(out.status.code(), Some(255), "{}", text(&out.stderr));
    await_process(
        &format!("^{command}$"),
        false,
        5,
        "the program outlived its shoal run",
    );

    // --retry: the node dies, the program runs again elsewhere and its
    // status is the second run's.
    let script = format!("sleep 1.{}; echo done", std::process::id());
    let run = c
        .command("n3", shoal())
        .unwrap()
        .args([
            "run", "--on", "n2", "--retry", "1", "--", "sh", "-c", &script,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    await_row(c, "n1", &format!("sh -c {script}"), "running");
    c.kill("n2").unwrap();
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "done\n");
    assert!(
        text(&out.stderr).contains("node n2 is unreachable")
            && (text(&out.stderr).contains("starting sh again on n1")
                || text(&out.stderr).contains("starting sh again on n3")),
        "{}",
        text(&out.stderr)
    );

    // --wait: no node is eligible (n2 is down, the others' owners are
    // active), so the program waits until one is.
    let ctx = c.context();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let s = c.status(&ctx, "n1", Duration::from_secs(2)).unwrap();
        if s.members.iter().any(|m| m.name == "n2" && !m.alive) {
            break;
        }
        assert!(Instant::now() < until, "n1 never saw n2 down");
        std::thread::sleep(Duration::from_millis(100));
    }
    for n in ["n1", "n3"] {
        let out = shoal_on(c, n, &["node", "owner", "active"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let out = shoal_on(c, "n1", &["run", "--any", "--", "true"]);
        if out.status.code() == Some(125) {
            break;
        }
        assert!(
            Instant::now() < until,
            "owners never active everywhere: {:?} {}",
            out.status,
            text(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut queued = c
        .command("n1", shoal())
        .unwrap()
        .args(["run", "--any", "--wait", "--", "echo", "queued"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert!(queued.try_wait().unwrap().is_none(), "it did not wait");
    let out = shoal_on(c, "n3", &["node", "owner", "idle"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = queued.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "queued\n");
    assert_says(&out.stderr, "waiting for a node");
}

/// A `shoal run -t` under a terminal of its own (made by script(1)), with
/// `script` fed keystrokes and its screen collected.
struct Terminal {
    child: std::process::Child,
    screen: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Terminal {
    /// Runs `shell` (a command line) under script(1), on node `from`.
    fn start(c: &Cluster, from: &str, shell: &str) -> Terminal {
        let cmd = c.command(from, shoal()).unwrap();
        let mut line: Vec<String> = cmd
            .get_envs()
            .map(|(k, v)| format!("{}={}", k.to_str().unwrap(), v.unwrap().to_str().unwrap()))
            .collect();
        line.insert(0, "env".into());
        line.push(cmd.get_program().to_str().unwrap().into());
        line.extend(cmd.get_args().map(|a| a.to_str().unwrap().to_string()));
        let shoal = line.join(" ");
        let mut child = Command::new("script")
            .args(["-qfec", &shell.replace("SHOAL", &shoal), "/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let screen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut out = child.stdout.take().unwrap();
        let s = screen.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    break;
                }
                s.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Terminal { child, screen }
    }

    fn type_keys(&mut self, keys: &[u8]) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(keys).unwrap();
        stdin.flush().unwrap();
    }

    fn screen(&self) -> String {
        text(&self.screen.lock().unwrap())
    }

    fn await_text(&self, want: &str) {
        let until = Instant::now() + Duration::from_secs(10);
        while !self.screen().contains(want) {
            assert!(
                Instant::now() < until,
                "{want:?} never showed: {:?}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait(mut self) -> (Option<i32>, String) {
        drop(self.child.stdin.take());
        let status = self.child.wait().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        (status.code(), self.screen())
    }
}

/// `shoal run -t`: the program gets a real pty of the home terminal's
/// size, follows its resizes, and Ctrl-C and Ctrl-Z typed at home act on
/// it as on a local program.
#[test]
fn a_program_on_a_pty_behaves_as_on_the_home_terminal() {
    let t = TestCluster::up("tt", 38, 2, Mode::Netns);
    let c = t.get();

    // The size, then a resize while it runs.
    let mut term = Terminal::start(
        c,
        "n1",
        "stty rows 33 cols 99; (sleep 1; stty rows 44 cols 111 </dev/tty) & \
         SHOAL run -t --on n2 -- sh -c 'tty; stty size; read x; stty size'",
    );
    term.await_text("33 99");
    std::thread::sleep(Duration::from_millis(1500));
    term.type_keys(b"go\r");
    let (code, screen) = term.wait();
    assert_eq!(code, Some(0), "{screen:?}");
    assert!(screen.contains("/dev/pts/"), "{screen:?}");
    assert!(screen.contains("44 111"), "{screen:?}");

    // Ctrl-C reaches the program through its terminal.
    let mut term = Terminal::start(
        c,
        "n1",
        "SHOAL run -t --on n2 -- sh -c 'trap \"echo interrupted; exit 5\" INT; echo ready; sleep 30 & wait'",
    );
    term.await_text("ready");
    term.type_keys(&[0x03]);
    let (code, screen) = term.wait();
    assert_eq!(code, Some(5), "{screen:?}");
    assert!(screen.contains("interrupted"), "{screen:?}");

    // Ctrl-Z stops the program there and shoal run here; continuing
    // shoal run continues the program.
    let mark = format!("81.{}", std::process::id());
    let mut term = Terminal::start(
        c,
        "n1",
        &format!("SHOAL run -t --on n2 -- sh -c 'echo ready; read x; echo finished $x' {mark}"),
    );
    term.await_text("ready");
    term.type_keys(&[0x1a]);
    await_row(
        c,
        "n2",
        &format!("sh -c echo ready; read x; echo finished $x {mark}"),
        "stopped",
    );
    let pid = || {
        let out = Command::new("pgrep")
            .args([
                "-f",
                &format!("run -t --on n2 -- sh -c echo ready; read x; echo finished .x {mark}"),
            ])
            .output()
            .unwrap();
        text(&out.stdout).trim().parse::<i32>().unwrap()
    };
    let until = Instant::now() + Duration::from_secs(10);
    let stopped = || {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid())).unwrap();
        stat.rsplit_once(')')
            .unwrap()
            .1
            .trim_start()
            .starts_with('T')
    };
    while !stopped() {
        assert!(
            Instant::now() < until,
            "shoal run did not stop with its program"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // script(1) stops with its child; `fg` would continue both.
    // SAFETY: kill(2) of processes of this test.
    unsafe {
        libc::kill(term.child.id() as i32, libc::SIGCONT);
        libc::kill(pid(), libc::SIGCONT);
    }
    term.type_keys(b"go\r");
    let (code, screen) = term.wait();
    assert_eq!(code, Some(0), "{screen:?}");
    assert!(screen.contains("finished go"), "{screen:?}");
}

/// `shoal make`: every recipe runs on a node of the cluster (they spread:
/// each records its network namespace, one per node here), with make's
/// semantics intact: exit statuses, `-k`, `.ONESHELL`, a recursive make
/// with the jobserver, and each job's output kept together.
#[test]
fn shoal_make_spreads_recipes_and_keeps_make_s_semantics() {
    let t = TestCluster::up("tu", 39, 3, Mode::Netns);
    let c = t.get();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("sub")).unwrap();
    std::fs::write(
        d.join("Makefile"),
        "OBJS = $(patsubst %,t%.out,1 2 3 4 5 6 7 8 9)\n\
         all: $(OBJS) sub.done one\n\
         t%.out:\n\
         \t@sleep 0.3; readlink /proc/self/ns/net > $@; echo first $@; echo second $@\n\
         sub.done:\n\
         \t$(MAKE) -C sub\n\
         \ttouch $@\n\
         .ONESHELL:\n\
         one:\n\
         \t@x=kept\n\
         \techo \"one shell $$x\" > $@\n\
         fail:\n\
         \t@exit 3\n\
         other: slow\n\
         \t@echo other ran\n\
         slow:\n\
         \t@sleep 1\n\
         input:\n\
         \t@tr a-z A-Z\n\
         long:\n\
         \tsleep $(MARK)\n",
    )
    .unwrap();
    std::fs::write(
        d.join("sub/Makefile"),
        "all: s1.out s2.out s3.out\n\
         s%.out:\n\
         \t@readlink /proc/self/ns/net > $@\n",
    )
    .unwrap();
    let make = |args: &[&str]| {
        c.command("n1", shoal())
            .unwrap()
            .current_dir(d)
            .arg("make")
            .args(args)
            .output()
            .unwrap()
    };
    let out = make(&[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The default: every node's cores.
    let cores = std::thread::available_parallelism().unwrap().get() * 3;
    assert_says(&out.stderr, &format!("{cores} jobs at once"));
    // Each job's lines together.
    let stdout = text(&out.stdout);
    for i in 1..=9 {
        assert!(
            stdout.contains(&format!("first t{i}.out\nsecond t{i}.out\n")),
            "{stdout}"
        );
    }
    let mut places = std::collections::HashSet::new();
    for f in (1..=9)
        .map(|i| format!("t{i}.out"))
        .chain((1..=3).map(|i| format!("sub/s{i}.out")))
    {
        let ns = std::fs::read_to_string(d.join(&f)).unwrap();
        assert!(ns.starts_with("net:["), "{f}: {ns}");
        places.insert(ns);
    }
    let here = std::fs::read_link("/proc/self/ns/net").unwrap();
    assert!(
        !places.contains(&format!("{}\n", here.display())),
        "a recipe ran outside the cluster"
    );
    assert!(
        places.len() >= 2,
        "every recipe ran on one node: {places:?}"
    );
    assert_eq!(
        std::fs::read_to_string(d.join("one")).unwrap(),
        "one shell kept\n"
    );

    // A failing recipe fails make (status 2) and says which, and make
    // starts nothing more; -k goes on with what does not depend on it.
    let out = make(&["fail", "other"]);
    assert_eq!(out.status.code(), Some(2));
    assert_says(&out.stderr, "fail] Error 3");
    assert!(!text(&out.stdout).contains("other ran"));
    let out = make(&["-k", "fail", "other"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stdout).contains("other ran"),
        "{}",
        text(&out.stdout)
    );

    // make's input reaches the recipe that reads it.
    let mut child = c
        .command("n1", shoal())
        .unwrap()
        .current_dir(d)
        .args(["make", "input"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"typed at make\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "TYPED AT MAKE\n");

    // `shoal make long` in the background, its recipe `sleep MARK`.
    let make_long = |mark: &str| {
        c.command("n1", shoal())
            .unwrap()
            .current_dir(d)
            .args(["make", "long", &format!("MARK={mark}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };

    // A recipe is a process of the cluster like any other: `shoal ps`
    // lists it, and a signal to make reaches it (make passes SIGTERM on
    // to its shells, which pass it on to their lines).
    let mark = format!("73.{}", std::process::id());
    let command = format!("sleep {mark}");
    let child = make_long(&mark);
    let row = await_started(c, "n2", &command);
    assert_eq!(row["home"], "n1", "{row}");
    // SAFETY: kill(2) of our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "{}", text(&out.stderr));
    await_row(c, "n1", &command, "killed by SIGTERM");

    // A make shell that dies takes its line's program with it, as a
    // `shoal run` that dies does.
    let mark = format!("74.{}", std::process::id());
    let command = format!("sleep {mark}");
    let child = make_long(&mark);
    await_started(c, "n1", &command);
    let shell = format!("shoal-make-shell -c sleep {mark}");
    let out = Command::new("pkill")
        .args(["-KILL", "-f", &shell])
        .output()
        .unwrap();
    assert!(out.status.success(), "no make shell running {command}");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    await_process(
        &format!("^sleep {mark}"),
        false,
        10,
        "the line's program outlived its shell",
    );
    // Killed by shoal make, or hung up by the home if shoal make ended
    // first.
    let row = ps_row(c, "n1", true, &command).unwrap();
    assert!(
        row["state"] == "killed by SIGKILL" || row["state"] == "lost",
        "{row}"
    );
    // Its owner is who ran shoal make, as the home's kernel said.
    assert_eq!(row["user"], "root", "{row}");

    // A line waiting for a node ends when make is told to stop.
    for n in ["n1", "n2", "n3"] {
        let out = shoal_on(c, n, &["node", "owner", "active"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let until = Instant::now() + Duration::from_secs(10);
    while shoal_on(c, "n1", &["run", "--any", "--", "true"])
        .status
        .code()
        != Some(125)
    {
        assert!(Instant::now() < until, "owners never active everywhere");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mark = format!("75.{}", std::process::id());
    let mut child = make_long(&mark);
    let shell = format!("shoal-make-shell -c sleep {mark}");
    await_process(&shell, true, 10, "make never started the line's shell");
    // SAFETY: kill(2) of our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let until = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < until, "shoal make went on waiting");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "{status:?}");
    await_process(&shell, false, 10, "the line's shell outlived make");
    for n in ["n1", "n2", "n3"] {
        let out = shoal_on(c, n, &["node", "owner", "idle"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
}

/// Programs fed more input than a pipe holds and never reading it, on one
/// node, hold none of its exec service's threads: another program still
/// starts there and ends, with its output.
#[test]
fn programs_that_never_read_do_not_starve_a_node() {
    let t = TestCluster::up("tw", 41, 2, Mode::Netns);
    let c = t.get();
    let mut stuck = Vec::new();
    for _ in 0..6 {
        let mut cmd = c.command("n1", shoal()).unwrap();
        cmd.args(["run", "--on", "n2", "--", "sleep", "600"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&vec![0u8; 8 << 20]);
        });
        stuck.push(child);
    }
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let n = Command::new("pgrep")
            .args(["-fc", "^sleep 600$"])
            .output()
            .unwrap();
        if text(&n.stdout).trim().parse::<usize>().unwrap_or(0) >= 6 {
            break;
        }
        assert!(Instant::now() < until, "the six programs did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Their input is on its way to the full pipes.
    std::thread::sleep(Duration::from_secs(1));
    let out = run_from(c, "n1", "n2", "/", &["echo", "served"], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "served\n");
    for mut child in stuck {
        let _ = child.kill();
        let _ = child.wait();
    }
}
