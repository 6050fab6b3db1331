//! Services kept by the node daemon (`docs/services.md`), on a real
//! namespaced cluster: services named in a node's configuration start when
//! it is read again (SIGHUP), a killed one is restarted, one that crashes
//! at once backs off, `shoal service stop|start|restart` do what they say
//! and a stopped service stays stopped, logs keep what services print, an
//! ordinary user may list services but not control them or read another
//! user's logs, a service runs as its configured user, a service removed
//! from the configuration stops, and the daemon's shutdown ends them all.

use std::process::Output;
use std::time::{Duration, Instant};

mod common;

use common::{TestCluster, fetch_metrics, shoal};
use serde_json::Value;
use shoal_cluster::{Cluster, Mode};

const SERVICES: &str = r#"
[[service]]
name = "sleeper"
command = ["sh", "-c", "echo hello from $SHOAL_SERVICE as $(id -u); echo to stderr >&2; exec sleep 1000"]

[[service]]
name = "crasher"
command = ["sh", "-c", "echo crashing; exit 3"]
restart = "on-failure"

[[service]]
name = "nob"
command = ["sh", "-c", "echo I am $(id -u); exec sleep 1000"]
user = "nobody"
"#;

/// `shoal ARGS` on `node`, as root or (`as_nobody`) as `nobody`.
fn shoal_on(c: &Cluster, node: &str, as_nobody: bool, args: &[&str]) -> Output {
    let mut cmd = if as_nobody {
        let mut cmd = c.command(node, "setpriv").unwrap();
        cmd.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(shoal());
        cmd
    } else {
        c.command(node, shoal()).unwrap()
    };
    cmd.args(args).output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// n1's services, by name.
fn ls(c: &Cluster) -> Vec<Value> {
    let out = shoal_on(c, "n1", false, &["service", "ls", "--json"]);
    assert!(out.status.success(), "service ls: {}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn service(c: &Cluster, name: &str) -> Option<Value> {
    ls(c).into_iter().find(|s| s["name"] == name)
}

/// Waits until service `name` on n1 satisfies `ok`; its record.
fn until(c: &Cluster, name: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = service(c, name);
        if let Some(s) = s.as_ref().filter(|s| ok(s)) {
            return s.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{name} never {what}: {s:?}\n{}",
            logs(c, name)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn logs(c: &Cluster, name: &str) -> String {
    text(&shoal_on(
        c,
        "n1",
        false,
        &["service", "logs", name, "-n", "100"],
    ))
}

fn reload(c: &Cluster, config: &str) {
    std::fs::write(&c.node("n1").unwrap().config, config).unwrap();
    let pid = c.pid("n1").expect("n1 runs");
    // SAFETY: kill has no memory effects.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
}

#[test]
fn services_are_kept_restarted_controlled_and_logged() {
    let tc = TestCluster::up("sv", 56, 2, Mode::Netns);
    let c = tc.get();
    let base = std::fs::read_to_string(&c.node("n1").unwrap().config).unwrap();
    reload(c, &format!("{base}\n{SERVICES}"));

    // Started, as their users, their output logged with its stream.
    let first = until(c, "sleeper", "ran", |s| s["state"] == "running");
    until(c, "nob", "ran", |s| {
        s["state"] == "running" && s["user"] == "nobody"
    });
    let log = logs(c, "sleeper");
    assert!(log.contains("out hello from sleeper as 0"), "{log}");
    assert!(log.contains("err to stderr"), "{log}");
    let nob_log = logs(c, "nob");
    assert!(nob_log.contains("out I am 65534"), "{nob_log}");

    // Killed: started again, by its daemon.
    let pid = first["pid"].as_i64().unwrap() as i32;
    // SAFETY: kill has no memory effects.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let again = until(c, "sleeper", "restarted", |s| {
        s["state"] == "running" && s["starts"] == 2
    });
    assert_ne!(again["pid"], first["pid"]);
    assert_eq!(again["last_exit"], "killed by signal 9");

    // Crashing at once: it backs off, the wait doubling.
    let crashed = until(c, "crasher", "backed off twice", |s| {
        s["starts"].as_u64().unwrap() >= 2 && s["state"] == "backoff"
    });
    assert_eq!(crashed["last_exit"], "exit status 3");
    let crash_log = logs(c, "crasher");
    assert!(crash_log.contains("starting again in 1 s"), "{crash_log}");
    until(c, "crasher", "waited 2 s", |_| {
        logs(c, "crasher").contains("starting again in 2 s")
    });

    // Stopped, it stays stopped; started, it runs; restarted, a new pid.
    let out = shoal_on(c, "n1", false, &["service", "stop", "sleeper"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(service(c, "sleeper").unwrap()["state"], "stopped");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(service(c, "sleeper").unwrap()["state"], "stopped");
    let out = shoal_on(c, "n1", false, &["service", "start", "sleeper"]);
    assert!(out.status.success(), "{}", text(&out));
    until(c, "sleeper", "started", |s| s["state"] == "running");
    let before = service(c, "nob").unwrap();
    // From another node (the local cluster's roots trust each other).
    let out = shoal_on(
        c,
        "n2",
        false,
        &["service", "restart", "nob", "--node", "n1"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let after = until(c, "nob", "restarted", |s| s["state"] == "running");
    assert_ne!(after["pid"], before["pid"]);
    let out = shoal_on(c, "n1", false, &["service", "stop", "nosuch"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("no service named \"nosuch\""),
        "{}",
        text(&out)
    );

    // An ordinary user: lists, but neither controls nor reads root's logs;
    // reads the logs of a service running as themselves.
    let out = shoal_on(c, "n1", true, &["service", "ls"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("sleeper"), "{}", text(&out));
    for args in [
        &["service", "stop", "sleeper"][..],
        &["service", "logs", "sleeper"][..],
    ] {
        let out = shoal_on(c, "n1", true, args);
        assert!(!out.status.success(), "{args:?} allowed");
        assert!(text(&out).contains("only root"), "{}", text(&out));
    }
    assert_eq!(service(c, "sleeper").unwrap()["state"], "running");
    let out = shoal_on(c, "n1", true, &["service", "logs", "nob"]);
    assert!(text(&out).contains("I am 65534"), "{}", text(&out));

    // `shoal status` lists them.
    let out = shoal_on(c, "n1", false, &["status", "--json"]);
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["services"].as_array().unwrap().len(), 3);
    // And the metrics: sleeper started thrice (at first, after the kill,
    // by the operator), killed twice (SIGKILL, then stop's SIGTERM).
    let metrics = fetch_metrics(c.node("n1").unwrap().metrics);
    for line in [
        "shoal_service_up{node=\"n1\",service=\"sleeper\"} 1",
        "shoal_service_starts_total{node=\"n1\",service=\"sleeper\"} 3",
        "shoal_service_exits_total{node=\"n1\",service=\"sleeper\",how=\"killed\"} 2",
        "shoal_service_exits_total{node=\"n1\",service=\"crasher\",how=\"failed\"}",
    ] {
        assert!(metrics.contains(line), "no {line} in:\n{metrics}");
    }

    // Read again without crasher, and nob changed: crasher goes, nob
    // restarts, sleeper is left alone.
    let sleeper = service(c, "sleeper").unwrap();
    let nob = service(c, "nob").unwrap();
    let fewer = SERVICES
        .split("[[service]]")
        .filter(|t| !t.contains("crasher"))
        .collect::<Vec<_>>()
        .join("[[service]]")
        .replace("I am", "now I am");
    reload(c, &format!("{base}\n{fewer}"));
    until(c, "nob", "restarted with its new command", |s| {
        s["state"] == "running" && s["pid"] != nob["pid"]
    });
    assert!(service(c, "crasher").is_none());
    assert_eq!(service(c, "sleeper").unwrap()["pid"], sleeper["pid"]);
    assert!(logs(c, "nob").contains("out now I am 65534"));

    // A bad configuration is refused and the services are kept.
    reload(
        c,
        &format!("{base}\n[[service]]\nname = \"Bad Name\"\ncommand = []\n"),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(service(c, "sleeper").unwrap()["pid"], sleeper["pid"]);

    // The node's shutdown ends its services.
    let pids: Vec<i32> = ls(c)
        .iter()
        .filter_map(|s| s["pid"].as_i64())
        .map(|p| p as i32)
        .collect();
    assert_eq!(pids.len(), 2);
    drop(tc);
    for pid in pids {
        assert!(
            !shoal_cluster::pid_alive(pid),
            "service pid {pid} outlived its node"
        );
    }
}

/// `shoal cluster up`'s whole system: a directory of three replicas, a
/// file server on every node and the cluster's root, the shared file
/// system's metadata replicas and a mount on every node, all services; a
/// file stored and read back; a directory replica and a file server
/// killed and restarted by their daemons, nothing lost.
#[test]
fn the_whole_system_comes_up_as_services_and_survives_their_crashes() {
    let tc = TestCluster::up("sw", 57, 4, Mode::Netns);
    let c = tc.get();
    c.start_system(&mut |l| eprintln!("[sw] {l}")).unwrap();
    let on = |node: &str, args: &[&str]| {
        let out = shoal_on(c, node, false, args);
        assert!(
            out.status.success(),
            "shoal {args:?} on {node}: {}",
            text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let all = || -> Vec<Value> {
        serde_json::from_str(&on("n4", &["service", "ls", "--all", "--json"])).unwrap()
    };
    let names: Vec<String> = all()
        .iter()
        .map(|s| {
            format!(
                "{} {}",
                s["node"].as_str().unwrap(),
                s["name"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            "n1 dir-r0",
            "n1 file",
            "n1 file-manager",
            "n1 fs-mount",
            "n1 fs-r0",
            "n2 dir-r1",
            "n2 file",
            "n2 file-manager",
            "n2 fs-mount",
            "n2 fs-r1",
            "n3 dir-r2",
            "n3 file",
            "n3 file-manager",
            "n3 fs-mount",
            "n3 fs-r2",
            "n4 file",
            "n4 file-manager",
            "n4 fs-mount"
        ]
    );
    let servers = on("n4", &["file", "servers"]);
    assert_eq!(servers.matches("files=").count(), 4, "{servers}");
    on("n4", &["dir", "mkdir", "projects"]);
    let source = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(source.path(), b"kept by its daemons\n".repeat(1000)).unwrap();
    on(
        "n4",
        &[
            "file",
            "put",
            "-q",
            "projects/notes",
            source.path().to_str().unwrap(),
        ],
    );

    // Kill the replica on n1 and the file server on n2 (SIGKILL).
    let pid_of = |node: &str, name: &str| -> (i64, u64) {
        let s = all()
            .into_iter()
            .find(|s| s["node"] == node && s["name"] == name)
            .unwrap();
        (
            s["pid"].as_i64().unwrap_or(0),
            s["starts"].as_u64().unwrap(),
        )
    };
    for (node, name) in [("n1", "dir-r0"), ("n2", "file")] {
        let (pid, starts) = pid_of(node, name);
        assert_eq!(starts, 1);
        // SAFETY: kill has no memory effects.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while [("n1", "dir-r0"), ("n2", "file")]
        .iter()
        .any(|(n, s)| pid_of(n, s).1 < 2 || pid_of(n, s).0 == 0)
    {
        assert!(Instant::now() < deadline, "not restarted: {:?}", all());
        std::thread::sleep(Duration::from_millis(200));
    }
    // Nothing lost: the name and the file, read on the node whose server
    // was killed.
    assert!(on("n1", &["dir", "ls"]).contains("projects"));
    let copy = tempfile::NamedTempFile::new().unwrap();
    common::until_ok(
        "reading the file back",
        || {
            shoal_on(
                c,
                "n2",
                false,
                &[
                    "file",
                    "get",
                    "-q",
                    "projects/notes",
                    copy.path().to_str().unwrap(),
                ],
            )
        },
        String::new,
    );
    assert_eq!(
        std::fs::read(copy.path()).unwrap(),
        std::fs::read(source.path()).unwrap()
    );
}

/// Where the configuration says `system_ports = "services"` (installed
/// nodes' default), a service configured `system = true` may serve a
/// system port whatever its user; one not so configured may not, nor may
/// a server root starts by hand.  Under `remote_root = "squash"` (also
/// the default), root on another node may list the services but not
/// control them.
#[test]
fn only_services_configured_system_serve_system_ports() {
    use std::os::unix::fs::PermissionsExt;
    let tc = TestCluster::up("sx", 59, 2, Mode::Netns);
    let c = tc.get();
    let data = tempfile::tempdir().unwrap();
    let dir = |i: u32| {
        let d = data.path().join(format!("r{i}"));
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
        d.to_str().unwrap().to_string()
    };
    std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    common::open_path_to(data.path());
    let shoal = shoal();
    let replica = |i: u32, system: bool| {
        let mut s = shoal_nodesvc::ServiceConfig::new(
            &format!("dir-r{i}"),
            &[
                shoal.to_str().unwrap(),
                "dir",
                "serve",
                "--replica",
                &i.to_string(),
                "--replicas",
                "2",
                "--data",
                &dir(i),
            ],
        );
        s.user = Some("nobody".into());
        s.system = system;
        s.restart = shoal_node::supervise::Restart::Never;
        s
    };
    let node = c.node("n1").unwrap();
    let mut config = shoal_nodesvc::NodeConfigFile::load(&node.config).unwrap();
    config.system_ports = None;
    config.remote_root = None;
    config.services = Some(vec![replica(0, true), replica(1, false)]);
    config.save(&node.config).unwrap();
    c.stop("n1").unwrap();
    c.start_node("n1").unwrap();
    until(c, "dir-r0", "served", |_| {
        logs(c, "dir-r0").contains("serving")
    });
    until(c, "dir-r1", "was refused", |s| s["state"] == "stopped");
    let refused = logs(c, "dir-r1");
    assert!(refused.contains("may serve a system service"), "{refused}");
    assert!(!logs(c, "dir-r0").contains("may serve a system service"));
    let by_hand = c
        .command("n1", &shoal)
        .unwrap()
        .args([
            "dir",
            "serve",
            "--replica",
            "1",
            "--replicas",
            "2",
            "--data",
        ])
        .arg(data.path().join("by-hand"))
        .output()
        .unwrap();
    assert!(!by_hand.status.success());
    assert!(
        text(&by_hand).contains("run it as a [[service]] with system = true"),
        "{}",
        text(&by_hand)
    );
    let listed = shoal_on(c, "n2", false, &["service", "ls", "--node", "n1"]);
    assert!(text(&listed).contains("dir-r0"), "{}", text(&listed));
    let remote = shoal_on(
        c,
        "n2",
        false,
        &["service", "stop", "dir-r0", "--node", "n1"],
    );
    assert!(!remote.status.success());
    assert!(
        text(&remote).contains("root on another node may not control"),
        "{}",
        text(&remote)
    );
    assert_eq!(service(c, "dir-r0").unwrap()["state"], "running");
}
