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
    assert!(
        text(&out.stderr).contains("cannot start no-such-program-here"),
        "{}",
        text(&out.stderr)
    );
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
    assert!(
        text(&out.stderr).contains("no working directory"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn signals_reach_the_program_and_its_end_comes_back() {
    let t = TestCluster::up("tq", 35, 3, Mode::Netns);
    let c = t.get();
    // A sleep nothing else on the machine runs, to look for it.
    let mark = format!("61.{}", std::process::id());
    // The program counts in its node's load report while it runs.
    let mut child = c
        .command("n1", shoal())
        .unwrap()
        .args(["run", "--on", "n2", "--", "sleep", &mark])
        .spawn()
        .unwrap();
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
    let left = Command::new("pgrep")
        .args(["-f", &format!("sleep {mark}")])
        .output()
        .unwrap();
    assert!(left.stdout.is_empty(), "the remote program is still there");

    // The home dies under a running program: the program dies too.
    let third = format!("63.{}", std::process::id());
    let child = c
        .command("n3", shoal())
        .unwrap()
        .args(["run", "--on", "n2", "--", "sleep", &third])
        .spawn()
        .unwrap();
    let running = || {
        !Command::new("pgrep")
            .args(["-f", &format!("^sleep {third}$")])
            .output()
            .unwrap()
            .stdout
            .is_empty()
    };
    let until = Instant::now() + Duration::from_secs(10);
    while !running() {
        assert!(Instant::now() < until, "the program never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    c.kill("n3").unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while running() {
        assert!(Instant::now() < until, "the program outlived its home");
        std::thread::sleep(Duration::from_millis(100));
    }
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
    assert!(
        text(&out.stderr).contains("node n3 is unreachable"),
        "{}",
        text(&out.stderr)
    );
    // The program died with its node's daemon.
    let until = Instant::now() + Duration::from_secs(5);
    while !Command::new("pgrep")
        .args(["-f", &format!("sleep {other}")])
        .output()
        .unwrap()
        .stdout
        .is_empty()
    {
        assert!(Instant::now() < until, "the program outlived its node");
        std::thread::sleep(Duration::from_millis(100));
    }
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
    assert!(
        text(&out.stderr).contains("every node's owner is active"),
        "{}",
        text(&out.stderr)
    );
    let out = run_any(&["--allow-owner-active"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "ran\n");
}
