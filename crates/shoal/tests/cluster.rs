//! Integration tests on real local clusters: real daemons, real sockets,
//! network namespaces on a bridge, iptables partitions and loss, SIGKILL.
//! They need root (CI and the development machines run as root).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;

use common::{TestCluster, fetch_metrics, shoal, shoal_ok};
use shoal_cluster::{Cluster, Mode};
use shoal_rpc::{CallOptions, Error, GetPort, TransError};

/// An echo server on `node`, logging executions; returns once registered.
struct Echo {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Echo {
    fn start(c: &Cluster, node: &str, get: GetPort) -> Echo {
        let mut child = c
            .command(node, shoal())
            .unwrap()
            .args(["rpc", "serve-echo", "--log", "--get-port", &get.to_hex()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let out = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let first = lines
            .recv_timeout(Duration::from_secs(10))
            .expect("echo server started");
        assert!(first.starts_with("serving"), "{first}");
        Echo { child, lines }
    }

    /// Stops the server on purpose (SIGTERM: drain, then exit).
    fn stop(mut self) -> Vec<String> {
        // SAFETY: plain kill(2) of our child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "echo server exited with {status}");
        self.lines.iter().collect()
    }
}

fn call(
    client: &mut shoal_rpc::Client,
    port: &shoal_rpc::PutPort,
    data: &str,
) -> Result<Vec<u8>, Error> {
    let options = CallOptions {
        deadline: Some(Duration::from_secs(3)),
        cancel: None,
    };
    client.trans_with(port, data.as_bytes().to_vec(), &options)
}

#[test]
fn clients_follow_a_server_that_moves() {
    let t = TestCluster::up("ta", 11, 4, Mode::Netns);
    let c = t.get();
    let get = GetPort::random();
    let port = get.put_port();
    let ctx = c.context();
    let mut client = ctx.client().unwrap();
    let echo = Echo::start(c, "n2", get);
    assert_eq!(call(&mut client, &port, "one").unwrap(), b"one");
    let executed = |lines: Vec<String>| lines.iter().filter(|l| l.starts_with("executed")).count();
    assert_eq!(executed(echo.stop()), 1);
    // Same client, no action of its own: it finds the server again.
    let echo = Echo::start(c, "n3", get);
    assert_eq!(call(&mut client, &port, "two").unwrap(), b"two");
    assert_eq!(call(&mut client, &port, "three").unwrap(), b"three");
    assert_eq!(executed(echo.stop()), 2);
    let echo = Echo::start(c, "n4", get);
    assert_eq!(call(&mut client, &port, "four").unwrap(), b"four");
    assert_eq!(executed(echo.stop()), 1);
}

#[test]
fn a_killed_node_is_reported_unreachable_within_the_deadline() {
    let t = TestCluster::up("tb", 12, 4, Mode::Netns);
    let c = t.get();
    c.kill("n3").unwrap();
    let ctx = c.context();
    let deadline = Duration::from_millis(800);
    let started = Instant::now();
    let err = c.status(&ctx, "n3", deadline).unwrap_err();
    let waited = started.elapsed();
    assert!(err.contains("no server for port"), "{err}");
    assert!(
        waited < deadline + Duration::from_secs(2),
        "took {waited:?}"
    );
    // The CLI says so too, with exit code 3, and the others are up.
    let out = t.cli(&["cluster", "status", "--deadline-ms", "800"]);
    assert_eq!(out.status.code(), Some(3));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("n3") && l.contains("unreachable")),
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.contains(" up ")).count(),
        3,
        "{text}"
    );
    // The survivors' membership notices the death.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let s = c.status(&ctx, "n1", Duration::from_secs(1)).unwrap();
        let n3 = s.members.iter().find(|m| m.name == "n3").unwrap();
        if !n3.alive {
            break;
        }
        assert!(Instant::now() < until, "n1 still thinks n3 is alive");
        std::thread::sleep(Duration::from_millis(100));
    }
    // And it comes back.
    c.start_node("n3").unwrap();
    c.wait_ready(Duration::from_secs(10), &mut |_| {}).unwrap();
    // SIGTERM, unlike SIGKILL, is a clean stop: the node removes its link
    // socket and pid file and logs its end.
    let n2 = c.node("n2").unwrap().clone();
    c.stop("n2").unwrap();
    assert!(!n2.socket.exists(), "link socket left behind");
    assert!(
        !n2.state_dir.join("node.pid").exists(),
        "pid file left behind"
    );
    let log = std::fs::read_to_string(&n2.log).unwrap();
    assert!(log.contains("node down"), "{log}");
}

#[test]
fn a_partitioned_node_gets_a_clear_error_not_a_hang() {
    let t = TestCluster::up("tc", 13, 4, Mode::Netns);
    let c = t.get();
    let get = GetPort::random();
    let put = get.put_port().to_string();
    let echo = Echo::start(c, "n1", get);
    let from_n4 = |deadline_ms: &str| {
        c.command("n4", shoal())
            .unwrap()
            .args([
                "rpc",
                "call",
                &put,
                "--data",
                "ping",
                "--deadline-ms",
                deadline_ms,
            ])
            .output()
            .unwrap()
    };
    let out = from_n4("3000");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.partition("n4").unwrap();
    let started = Instant::now();
    let out = from_n4("1500");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not-found") && err.contains("cut off"),
        "{err}"
    );
    c.heal("n4").unwrap();
    let out = from_n4("3000");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    echo.stop();
}

#[test]
fn requests_run_at_most_once_over_a_lossy_network() {
    let t = TestCluster::up("td", 14, 2, Mode::Netns);
    let c = t.get();
    let get = GetPort::random();
    let port = get.put_port();
    let echo = Echo::start(c, "n2", get);
    c.loss("n2", 25.0).unwrap();
    let ctx = c.context();
    let mut client = ctx.client().unwrap();
    let mut ok = 0;
    for i in 0..150 {
        let body = format!("request {i}");
        match call(&mut client, &port, &body) {
            Ok(reply) => {
                assert_eq!(reply, body.as_bytes());
                ok += 1;
            }
            Err(Error::Trans(
                TransError::ServerUnreachable { .. } | TransError::DeadlineExceeded { .. },
            )) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    c.heal("n2").unwrap();
    let lines = echo.stop();
    let mut runs: HashMap<&str, u32> = HashMap::new();
    for l in &lines {
        if let Some(txn) = l.strip_prefix("executed ") {
            *runs.entry(txn).or_default() += 1;
        }
    }
    assert!(ok >= 100, "only {ok} of 150 calls succeeded at 25% loss");
    assert!(
        runs.len() >= ok,
        "{} executions for {ok} successes",
        runs.len()
    );
    for (txn, n) in runs {
        assert_eq!(n, 1, "{txn} executed {n} times");
    }
    assert!(
        client.stats().retransmits > 0,
        "loss caused no retransmission"
    );
}

#[test]
fn loopback_clusters_locate_by_asking_every_node() {
    let t = TestCluster::up("te", 15, 3, Mode::Loopback);
    let c = t.get();
    let get = GetPort::random();
    let echo = Echo::start(c, "n3", get);
    let out = shoal_ok(
        c,
        "n1",
        &["rpc", "call", &get.put_port().to_string(), "--data", "hi"],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hi");
    echo.stop();
}

#[test]
fn large_bodies_cross_in_fragments() {
    let t = TestCluster::up("tf", 16, 2, Mode::Netns);
    let c = t.get();
    let get = GetPort::random();
    let echo = Echo::start(c, "n2", get);
    let ctx = c.context();
    let mut client = ctx.client().unwrap();
    for size in [0usize, 1, 59_999, 60_000, 60_001, 1 << 20, 9 << 20] {
        let body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let reply = client
            .trans(&get.put_port(), body.clone())
            .unwrap_or_else(|e| panic!("{size} bytes: {e}"));
        assert_eq!(reply.len(), size);
        assert!(reply == body, "{size} bytes came back different");
    }
    echo.stop();
}

#[test]
fn bad_cli_input_gets_one_line_errors() {
    let out = Command::new(shoal())
        .args(["rpc", "call", "nothex"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("nothex") && err.contains("--help"), "{err}");
    let out = Command::new(shoal())
        .args(["cluster", "up", "--nodez", "3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim().lines().count(),
        1
    );
    let out = Command::new(shoal())
        .args(["cluster", "up", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--nodes"));
    // Completion scripts name the commands.
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(shoal())
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            script.contains("shoal") && script.contains("mkdir"),
            "{shell}"
        );
    }
    // Without shoal-bench beside it or on PATH, `shoal bench` says how to
    // get it.
    let alone = tempfile::tempdir().unwrap();
    let copy = alone.path().join("shoal");
    std::fs::copy(shoal(), &copy).unwrap();
    let out = Command::new(&copy)
        .args(["bench", "rpc"])
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cargo build --profile product -p shoal-bench"),
        "{err}"
    );
    let out = Command::new(shoal())
        .args(["status", "--dir", "/nonexistent/shoal"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("no cluster"), "{err}");
    let out = Command::new(shoal())
        .args(["cluster", "up", "--nodes", "0", "--dir", "/tmp/shoal-never"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn a_call_can_be_cancelled_from_another_thread() {
    let t = TestCluster::up("tg", 17, 2, Mode::Netns);
    let ctx = t.get().context();
    let mut client = ctx.client().unwrap();
    let cancel = shoal_rpc::CancelToken::new();
    let options = CallOptions {
        deadline: Some(Duration::from_secs(30)),
        cancel: Some(cancel.clone()),
    };
    // Nobody serves this port: without cancellation the call would wait
    // out its 30 s deadline.
    let port = GetPort::random().put_port();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        cancel.cancel();
    });
    let started = Instant::now();
    let err = client
        .trans_with(&port, b"x".to_vec(), &options)
        .unwrap_err();
    canceller.join().unwrap();
    assert!(matches!(err, Error::Trans(TransError::Cancelled)), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn datagrams_without_the_cluster_key_are_dropped_and_counted() {
    let t = TestCluster::up("th", 18, 2, Mode::Netns);
    let c = t.get();
    let ctx = c.context();
    let before = c.status(&ctx, "n1", Duration::from_secs(2)).unwrap();
    let target = c.node("n1").unwrap().addr;
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    // A datagram that looks like shoal's but carries a MAC made with
    // another key, and plain garbage of several sizes.
    let other = shoal_wire::ClusterKey::random();
    let forged = shoal_wire::encode(
        &shoal_wire::Packet::Locate(shoal_wire::Locate {
            nonce: shoal_wire::Nonce(1),
            port: GetPort::random().put_port(),
            instance: shoal_wire::Instance(0),
            node: shoal_wire::NodeId(0),
        }),
        &other,
    );
    for _ in 0..10 {
        socket.send_to(&forged, target).unwrap();
    }
    for len in [0usize, 1, 19, 20, 100, 5000] {
        socket.send_to(&vec![0x53; len], target).unwrap();
    }
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let after = c.status(&ctx, "n1", Duration::from_secs(2)).unwrap();
        let bad_mac = after.counters["dropped_bad_mac"] - before.counters["dropped_bad_mac"];
        let malformed = after.counters["dropped_malformed"] - before.counters["dropped_malformed"];
        if bad_mac >= 10 && malformed >= 6 {
            break;
        }
        assert!(
            Instant::now() < until,
            "bad MAC {bad_mac}, malformed {malformed}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Prometheus sees the same counters, even with idle clients connected
    // first: they are still waiting for their answers when it gets its own.
    let addr = c.node("n1").unwrap().metrics;
    let idle: Vec<_> = (0..3)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    let metrics = fetch_metrics(addr);
    for s in &idle {
        s.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        let r = std::io::Read::read(&mut &*s, &mut byte);
        assert!(
            matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "an idle client was answered before the scrape: {r:?}"
        );
    }
    let line = metrics
        .lines()
        .find(|l| l.starts_with("shoal_node_dropped_bad_mac_total"))
        .unwrap_or_else(|| panic!("no bad-MAC counter in:\n{metrics}"));
    let value: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(value >= 10, "{line}");
    assert!(
        metrics.contains("shoal_node_members_alive{node=\"n1\"} 2"),
        "{metrics}"
    );
    // The node is unharmed.
    c.wait_ready(Duration::from_secs(5), &mut |_| {}).unwrap();
}

/// Heartbeats count only inside node sessions: one sent in the clear by a
/// holder of the cluster key (for a node that does not exist, or naming a
/// real one) is refused and counted, and the membership does not change.
#[test]
fn heartbeats_outside_node_sessions_are_refused_and_counted() {
    let t = TestCluster::up("tv", 40, 2, Mode::Netns);
    let c = t.get();
    let ctx = c.context();
    let before = c.status(&ctx, "n1", Duration::from_secs(2)).unwrap();
    assert!(before.counters["session_handshakes"] >= 1, "{before:?}");
    assert_ne!(before.cert_serial, 0);
    let target = c.node("n1").unwrap().addr;
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    for (node, name) in [(0x5eed_u64, "n9"), (1, "n2")] {
        let heartbeat = shoal_wire::encode(
            &shoal_wire::Packet::Heartbeat(shoal_wire::Heartbeat {
                node: shoal_wire::NodeId(node),
                incarnation: 1,
                name: name.into(),
                addr: socket.local_addr().unwrap(),
                members: vec![],
                load: None,
            }),
            c.key(),
        );
        for _ in 0..5 {
            socket.send_to(&heartbeat, target).unwrap();
        }
    }
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let after = c.status(&ctx, "n1", Duration::from_secs(2)).unwrap();
        if after.counters["forged_heartbeats"] - before.counters["forged_heartbeats"] >= 10 {
            assert!(
                after.members.iter().all(|m| m.name != "n9"),
                "{:?}",
                after.members
            );
            assert_eq!(after.members.len(), 2);
            break;
        }
        assert!(Instant::now() < until, "{:?}", after.counters);
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn any_server_of_a_replicated_port_answers() {
    let t = TestCluster::up("ti", 19, 3, Mode::Netns);
    let c = t.get();
    let get = GetPort::random();
    let port = get.put_port();
    let a = Echo::start(c, "n2", get);
    let b = Echo::start(c, "n3", get);
    let ctx = c.context();
    let mut client = ctx.client().unwrap();
    for i in 0..5 {
        let body = format!("a{i}");
        assert_eq!(call(&mut client, &port, &body).unwrap(), body.as_bytes());
    }
    // Stop one of them (the one in use, or not): every call still succeeds.
    let first = a.stop();
    for i in 0..5 {
        let body = format!("b{i}");
        assert_eq!(call(&mut client, &port, &body).unwrap(), body.as_bytes());
    }
    let second = b.stop();
    let executed = |lines: &[String]| lines.iter().filter(|l| l.starts_with("executed")).count();
    // Each call ran exactly once, on one server or the other.
    assert_eq!(executed(&first) + executed(&second), 10);
}

#[test]
fn many_server_threads_share_one_endpoint() {
    // On a loopback cluster, this test process can attach to a node and
    // serve from its own threads.
    let t = TestCluster::up("tj", 20, 2, Mode::Loopback);
    let c = t.get();
    let ctx = shoal_rpc::Context::attach(&c.node("n2").unwrap().socket).unwrap();
    let server = ctx.serve(GetPort::random()).unwrap();
    let port = server.port();
    let served: Vec<_> = (0..4)
        .map(|_| {
            let server = server.clone();
            std::thread::spawn(move || {
                let mut n = 0u32;
                while let Ok(req) = server.getreq() {
                    // Work long enough that requests overlap.
                    std::thread::sleep(Duration::from_millis(2));
                    let mut reply = req.body().to_vec();
                    reply.reverse();
                    server.putrep(&req, reply).unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let callers: Vec<_> = (0..4)
        .map(|k| {
            let ctx = c.context();
            std::thread::spawn(move || {
                let mut client = ctx.client().unwrap();
                for i in 0..50 {
                    let body = format!("caller {k} call {i}");
                    let reply = client.trans(&port, body.clone().into_bytes()).unwrap();
                    let mut expect = body.into_bytes();
                    expect.reverse();
                    assert_eq!(reply, expect);
                }
            })
        })
        .collect();
    for c in callers {
        c.join().unwrap();
    }
    server.shutdown().unwrap();
    let counts: Vec<u32> = served.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(counts.iter().sum::<u32>(), 200, "{counts:?}");
    assert!(
        counts.iter().filter(|&&n| n > 0).count() >= 2,
        "only one server thread did any work: {counts:?}"
    );
}

#[test]
fn servers_register_again_when_their_node_restarts() {
    let t = TestCluster::up("tk", 21, 3, Mode::Netns);
    let c = t.get();
    let get = GetPort::random();
    let port = get.put_port();
    let echo = Echo::start(c, "n2", get);
    let ctx = c.context();
    assert_eq!(
        call(&mut ctx.client().unwrap(), &port, "before").unwrap(),
        b"before"
    );
    c.kill("n2").unwrap();
    c.start_node("n2").unwrap();
    c.wait_ready(Duration::from_secs(10), &mut |_| {}).unwrap();
    // A new client (nothing cached) finds the server through the new
    // daemon once the server has noticed the restart.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match call(&mut ctx.client().unwrap(), &port, "after") {
            Ok(reply) => {
                assert_eq!(reply, b"after");
                break;
            }
            Err(Error::Trans(TransError::NotFound { .. })) if Instant::now() < until => {}
            Err(e) => panic!("server not found again after its node restarted: {e}"),
        }
    }
    echo.stop();
}

/// Every node's heartbeats carry its load and its owner's state: `shoal
/// node owner active` on n2 shows in n1's view within a few heartbeats,
/// survives n2's restart, and `idle` undoes it.
#[test]
fn load_and_owner_state_travel_in_heartbeats() {
    let t = TestCluster::up("tn", 33, 3, Mode::Netns);
    let c = t.get();
    let ctx = c.context();
    let owner_of = |node: &str| -> Option<bool> {
        let s = c.status(&ctx, "n1", Duration::from_secs(2)).ok()?;
        let m = s.members.iter().find(|m| m.name == node)?;
        let load = m.load.as_ref()?;
        assert!(load.cores >= 1 && load.mem_free_mib > 0, "{load:?}");
        Some(load.owner_active)
    };
    let wait_for = |node: &str, active: bool| {
        let until = Instant::now() + Duration::from_secs(10);
        while owner_of(node) != Some(active) {
            assert!(
                Instant::now() < until,
                "n1 never saw {node}'s owner {}",
                if active { "active" } else { "idle" }
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_for("n2", false);
    let owner = |state: &str| {
        c.command("n2", shoal())
            .unwrap()
            .args(["node", "owner", state])
            .output()
            .unwrap()
    };
    let out = owner("active");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for("n2", true);
    assert_eq!(owner_of("n3"), Some(false));
    // Kept across a restart of n2's daemon: the new daemon reports it
    // itself.
    c.kill("n2").unwrap();
    c.start_node("n2").unwrap();
    c.wait_ready(Duration::from_secs(10), &mut |_| {}).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let own = c
            .status(&ctx, "n2", Duration::from_secs(2))
            .ok()
            .and_then(|s| s.members[0].load.clone());
        if let Some(load) = own {
            assert!(load.owner_active, "n2 forgot its owner's state: {load:?}");
            break;
        }
        assert!(Instant::now() < until, "n2 reports no load of its own");
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_for("n2", true);
    assert!(owner("idle").status.success());
    wait_for("n2", false);
    // A state that is neither is refused with one line.
    let out = owner("away");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid value 'away'") && err.lines().count() == 1,
        "{err}"
    );
}

/// Revoking one node needs no other node re-keyed: the list, handed to
/// one node, spreads to the others inside their sessions, each ends its
/// sessions with the revoked node, and the rest carry on.
#[test]
fn a_revoked_node_is_cut_off_and_the_list_spreads() {
    let t = TestCluster::up("tz", 44, 3, Mode::Netns);
    let c = t.get();
    let ctx = c.context();
    c.wait_ready(Duration::from_secs(10), &mut |_| {}).unwrap();
    let admin = shoal_nodesvc::identity::Admin::open(&c.dir().join("admin")).unwrap();
    let list = hex::encode(admin.revoke("n3").unwrap());
    let revoke = |node: &str| {
        c.command(node, common::shoal())
            .unwrap()
            .args(["node", "revoke", &list])
            .output()
            .unwrap()
    };
    let out = revoke("n1");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The same list again is not newer.
    let again = revoke("n1");
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("version 1 already"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let n2 = c.status(&ctx, "n2", Duration::from_secs(2)).unwrap();
        let n1 = c.status(&ctx, "n1", Duration::from_secs(2)).unwrap();
        let sees_n3 =
            |s: &shoal_nodesvc::NodeStatus| s.members.iter().any(|m| m.name == "n3" && m.alive);
        let sees_each_other = n1.members.iter().any(|m| m.name == "n2" && m.alive)
            && n2.members.iter().any(|m| m.name == "n1" && m.alive);
        if n2.revocations == 1 && !sees_n3(&n1) && !sees_n3(&n2) && sees_each_other {
            assert!(
                n1.counters["session_handshake_failures"] > 0
                    || n2.counters["session_handshake_failures"] > 0
            );
            break;
        }
        assert!(Instant::now() < until, "n1: {n1:?}\nn2: {n2:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
