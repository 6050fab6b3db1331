//! The attack suite (`docs/security.md`, "How each claim is tested"): what
//! the security review found, tried as an attacker would.  Each attack
//! must fail with a clear error and change nothing.  The suite runs as
//! root and makes a real unprivileged user, `shoal-attacker`, whose
//! commands run with `setpriv` (its uid, its gid, no other groups).
//!
//! This file grows with the trust work: attacks through the node's socket
//! and on the wire join it as the daemon and the library move onto
//! sessions.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

mod common;
#[path = "attack/signals.rs"]
mod signals;

use common::{TestCluster, open_path_to, shoal};
use shoal_cluster::Mode;

/// The attacker's uid and gid, making the user on first use.
fn attacker() -> (u32, u32) {
    common::local_user("shoal-attacker", false)
}

/// Runs `program ARGS` as the attacker.
fn as_attacker(program: &str, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(become_attacker())
        .arg(program)
        .args(args)
        .output()
        .unwrap()
}

/// `setpriv`'s arguments that make the rest of its command the attacker's:
/// its uid, its gid, no other groups.
fn become_attacker() -> Vec<String> {
    let (uid, gid) = attacker();
    [
        "--reuid",
        &uid.to_string(),
        "--regid",
        &gid.to_string(),
        "--clear-groups",
        "--",
    ]
    .map(str::to_string)
    .to_vec()
}

fn denied(out: &Output) -> bool {
    !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Permission denied")
}

/// Secrets on disk (review M2): the cluster key, the admin key, a node's
/// static key and state are not readable by another local user, although
/// the way to them is open and the cluster's public files are readable.
#[test]
fn a_local_user_cannot_read_the_cluster_s_secrets() {
    let t = TestCluster::up("tx", 42, 2, Mode::Netns);
    let c = t.get();
    let dir = c.dir().to_path_buf();
    open_path_to(&dir);
    let path = |p: &str| dir.join(p).display().to_string();
    // The way is open: the public description of the cluster reads.
    let public = as_attacker("cat", &[&path("cluster.toml")]);
    assert!(
        public.status.success(),
        "{}",
        String::from_utf8_lossy(&public.stderr)
    );
    for secret in [
        "cluster.key",
        "admin/admin.key",
        "n1/state/node.key",
        "n2/state/node.key",
    ] {
        let out = as_attacker("cat", &[&path(secret)]);
        assert!(denied(&out), "{secret}: {out:?}");
    }
    let out = as_attacker("ls", &[&path("n1/state")]);
    assert!(denied(&out), "{out:?}");
    // Nor can it plant anything where the cluster keeps its files.
    for planted in [
        "planted",
        "n1/planted",
        "n1/state/node.pid",
        "admin/admin.key",
    ] {
        let out = as_attacker("touch", &[&path(planted)]);
        assert!(denied(&out), "{planted}: {out:?}");
    }
    assert!(!dir.join("planted").exists() && !dir.join("n1/planted").exists());
}

/// Root's cluster directory cannot be prepared by someone else (review
/// M4): a directory another user owns, or one anybody may write to, is
/// refused with a clear error, and nothing is written into it.
#[test]
fn root_refuses_a_cluster_directory_someone_else_could_plant() {
    let (uid, gid) = attacker();
    let tmp = tempfile::tempdir().unwrap();
    open_path_to(&tmp.path().join("x"));
    let theirs = tmp.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(uid), Some(gid)).unwrap();
    let planted_key = theirs.join("cluster.key");
    let out = as_attacker("touch", &[planted_key.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    for dir in [&theirs, &open] {
        let out = Command::new(shoal())
            .args([
                "cluster", "up", "--nodes", "1", "--name", "ty", "--subnet", "43",
            ])
            .arg("--dir")
            .arg(dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains("refusing to use it"), "{err}");
        assert!(!dir.join("cluster.toml").exists());
        assert!(!dir.join("admin").exists());
    }
    assert_eq!(std::fs::metadata(&planted_key).unwrap().len(), 0);
}

/// A request captured on the wire and sent again, at once or after the
/// server forgot its caller's record, is refused as a replay and counted;
/// it never runs twice.  A changed copy does not open.  The server learns
/// the caller's node and uid from the key the request opened with.
#[test]
fn a_replayed_request_never_runs_twice_even_after_its_record_expired() {
    use shoal_rpc::link::{Link, LinkRequest, LinkResponse};
    use shoal_rpc::{Context, GetPort};
    use shoal_session::{Algorithm, Channel};
    use shoal_wire::{ClientId, Frag, Instance, Packet, Request, Seq, TxnId, encode_plain};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    let t = TestCluster::up("ua", 45, 2, Mode::Netns);
    let c = t.get();
    let ctx = c.context();
    let n2 = c.status(&ctx, "n2", Duration::from_secs(2)).unwrap().node;
    // The server, in this process, attached to n1; it forgets a caller
    // one second after its last datagram.
    let attached = Context::attach(&c.node("n1").unwrap().socket).unwrap();
    let mut config = attached.config().clone();
    config.bind_ip = std::net::IpAddr::from([0, 0, 0, 0]);
    config.record_ttl = Duration::from_secs(1);
    let get = GetPort::random();
    let server = Context::new(config).serve(get).unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    {
        let (server, runs) = (server.clone(), runs.clone());
        std::thread::spawn(move || {
            while let Ok(req) = server.getreq() {
                runs.fetch_add(1, Ordering::SeqCst);
                let who = format!("{} {}", req.caller().node, req.caller().uid);
                let _ = server.putrep(&req, who.into_bytes());
            }
        });
    }
    // The client, by hand, on n2's link: an id, a locate that hands it its
    // channel key, and one sealed request.
    let mut link = Link::connect(&c.node("n2").unwrap().socket).unwrap();
    let LinkResponse::Client { id, uid } = link.call(&LinkRequest::Client).unwrap() else {
        panic!("no client id")
    };
    let LinkResponse::Located { answers } = link
        .call(&LinkRequest::Locate {
            client: id.clone(),
            port: get.put_port().to_string(),
            instance: format!("{:016x}", 0),
            node: format!("{:016x}", 0),
            wait_ms: 3000,
            all: false,
        })
        .unwrap()
    else {
        panic!("no answer to locate")
    };
    let found = answers
        .iter()
        .flat_map(|a| &a.endpoints)
        .next()
        .expect("the server was found")
        .clone();
    let key: [u8; 32] = hex::decode(&found.grant.key).unwrap().try_into().unwrap();
    let algorithm = if found.grant.aes {
        Algorithm::Aes256Gcm
    } else {
        Algorithm::ChaCha20Poly1305
    };
    let mut channel = Channel::client(algorithm, &key);
    let client = ClientId(u64::from_str_radix(&id, 16).unwrap());
    let mut plain = Vec::new();
    encode_plain(
        &Packet::Request(Request {
            txn: TxnId {
                client,
                seq: Seq(1),
            },
            instance: Instance(u64::from_str_radix(&found.instance, 16).unwrap()),
            port: get.put_port(),
            frag: Frag { index: 0, count: 1 },
            total_len: 3,
            payload: b"run",
        }),
        &mut plain,
    );
    let mut captured = Vec::new();
    channel.seal(found.grant.index, uid, client.0, &[&plain], &mut captured);
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    socket.send_to(&captured, found.addr).unwrap();
    let mut buf = vec![0u8; 65536];
    let (n, _) = socket.recv_from(&mut buf).unwrap();
    let (_, reply) = channel.open(&mut buf[..n]).expect("the reply opens");
    let Ok(Packet::Reply(r)) = shoal_wire::decode_plain(reply) else {
        panic!("not a reply")
    };
    assert_eq!(
        String::from_utf8_lossy(r.payload),
        format!("{n2} 0"),
        "the server sees the calling node and uid"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Sent again at once, and after the record expired: refused both times.
    socket.send_to(&captured, found.addr).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    socket.send_to(&captured, found.addr).unwrap();
    // A copy given a fresh counter (bytes 20..28 of the header) does not
    // open at all.
    let mut changed = captured.clone();
    changed[20..28].copy_from_slice(&1000u64.to_le_bytes());
    socket.send_to(&changed, found.addr).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while server.stats().replays < 2 || server.stats().dropped_bad_mac < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "replays {}, bad {}",
            server.stats().replays,
            server.stats().dropped_bad_mac
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a replayed request ran again"
    );
}

/// With the node's socket opened to users (as an operator opening shoal
/// to them would): a user cannot start a program as root by claiming uid 0
/// in a user namespace (review C1), nor kill or wait for root's program;
/// both are refused with a clear error and counted, and root's program
/// runs on.
#[test]
fn a_user_starts_programs_only_as_themselves_and_touches_only_their_own() {
    use std::time::{Duration, Instant};

    let t = TestCluster::up("ub", 46, 2, Mode::Netns);
    let c = t.get();
    open_path_to(c.dir());
    open_path_to(shoal().parent().unwrap());
    let socket = c.node("n1").unwrap().socket.clone();
    // The socket is open to every user, and nothing it says to one holds
    // the cluster key.
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o666, "the node's socket is {mode:o}");
    let key = std::fs::read_to_string(&c.file().key_file).unwrap();
    let mut link = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    std::io::Write::write_all(&mut link, b"{\"op\":\"hello\"}\n").unwrap();
    let mut hello = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(&link), &mut hello).unwrap();
    assert!(hello.contains("\"uid\""), "{hello}");
    assert!(
        !hello.contains(key.trim()),
        "hello hands out the cluster key"
    );
    let as_user = |args: &[&str]| {
        c.command("n1", "setpriv")
            .unwrap()
            .args(become_attacker())
            .args(args)
            .current_dir("/tmp")
            .output()
            .unwrap()
    };
    let shoal = shoal();
    let shoal = shoal.to_str().unwrap();
    let ctx = c.context();
    let refused = |c: &shoal_cluster::Cluster| {
        c.status(&ctx, "n2", Duration::from_secs(2))
            .unwrap()
            .counters["refused_proc_requests"]
            + c.status(&ctx, "n1", Duration::from_secs(2))
                .unwrap()
                .counters["refused_proc_requests"]
    };
    let before = refused(c);

    // The user runs programs on other nodes, as themselves.
    let (uid, _) = attacker();
    let out = as_user(&[shoal, "run", "--on", "n2", "--", "id", "-u"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), uid.to_string());

    // uid 0 inside a user namespace is still the user to the kernel.
    let out = as_user(&["unshare", "-r", shoal, "run", "--on", "n2", "--", "id"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "ran: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(err.contains("may not start it"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("uid=0"));

    // Root's program: the user may neither kill it nor wait for it.
    let mark = format!("73.{}", std::process::id());
    let mut run = c
        .command("n1", shoal)
        .unwrap()
        .args(["run", "--on", "n2", "--", "sleep", &mark])
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let id = loop {
        let ps = c
            .command("n1", shoal)
            .unwrap()
            .args(["ps", "--json"])
            .output()
            .unwrap();
        let rows: serde_json::Value = serde_json::from_slice(&ps.stdout).unwrap_or_default();
        let row = rows
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["command"].as_str() == Some(&format!("sleep {mark}")));
        if let Some(id) = row.and_then(|r| r["id"].as_str()) {
            break id.to_string();
        }
        assert!(Instant::now() < until, "root's program never started");
        std::thread::sleep(Duration::from_millis(100));
    };
    // The user sees root's program, but not its arguments.
    let seen = as_user(&[shoal, "ps", "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&seen.stdout).unwrap();
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"].as_str() == Some(&id))
        .unwrap_or_else(|| panic!("root's program not shown: {rows}"));
    assert_eq!(row["command"].as_str(), Some("sleep"), "{row}");
    for args in [["kill", &id], ["wait", &id]] {
        let out = as_user(&[shoal, args[0], args[1]]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success(), "{args:?} worked");
        assert!(err.contains("may not touch it"), "{err}");
    }
    assert!(run.try_wait().unwrap().is_none(), "root's program ended");
    assert!(refused(c) >= before + 3);

    // Nor can the user serve a system service: here, a directory replica,
    // which would receive everyone's capabilities.
    let data = format!("/tmp/shoal-attacker-dir-{}", std::process::id());
    let out = as_user(&[
        "timeout",
        "20",
        shoal,
        "dir",
        "serve",
        "--replica",
        "0",
        "--data",
        &data,
    ]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "a user served the directory");
    assert!(err.contains("may serve a system service"), "{err}");
    let _ = std::fs::remove_dir_all(&data);
    let status = c.status(&ctx, "n1", Duration::from_secs(2)).unwrap();
    assert!(status.counters["refused_system_registrations"] >= 1);
    run.kill().unwrap();
    run.wait().unwrap();

    // Root's group: the user, who knows its port, can neither join it nor
    // send to it, since the node gives them another key; a group root
    // created --open admits them.
    for (open, admitted) in [(false, false), (true, true)] {
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut member = c
            .command("n1", shoal)
            .unwrap()
            .args(["group", "create", "--no-input"])
            .args(open.then_some("--open"))
            .stdout(log.reopen().unwrap())
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        let port = loop {
            let text = std::fs::read_to_string(log.path()).unwrap();
            if let Some(port) = text.split_whitespace().nth(1) {
                break port.to_string();
            }
            assert!(Instant::now() < until, "the group never started");
            std::thread::sleep(Duration::from_millis(50));
        };
        let out = as_user(&[shoal, "group", "send", &port, "from-the-user"]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.success(), admitted, "open {open}: {err}");
        if !admitted {
            assert!(err.contains("did not admit"), "{err}");
        }
        member.kill().unwrap();
        member.wait().unwrap();
        let seen = std::fs::read_to_string(log.path()).unwrap();
        assert_eq!(seen.contains("from-the-user"), admitted, "{seen}");
    }
}

/// A capture on the cluster's bridge while a program runs remotely finds
/// none of what it was given or said: not its environment, not its
/// arguments, not its input or output bytes.  (Capabilities, directory
/// secrets and file bytes travel the same sealed channels; the suite does
/// not start those services here.)
#[test]
fn a_capture_on_the_bridge_finds_nothing_secret() {
    use std::io::Write;
    use std::process::Stdio;

    let t = TestCluster::up("uc", 47, 2, Mode::Netns);
    let c = t.get();
    let bridge = c.file().bridge.clone().expect("a namespaced cluster");
    let capture = common::Capture::start(&bridge);
    let mark = |what: &str| format!("shoal-{what}-{:016x}", rand::random::<u64>());
    let (env, arg, input) = (mark("env"), mark("arg"), mark("input"));
    // A control: a datagram sent in clear across the bridge is seen.
    let control = mark("control");
    let udp = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    udp.send_to(control.as_bytes(), c.node("n2").unwrap().addr)
        .unwrap();
    let mut run = c
        .command("n1", shoal())
        .unwrap()
        .env("SHOAL_TEST_SECRET", &env)
        .args(["run", "--on", "n2", "--", "sh", "-c"])
        .arg(format!("echo \"$SHOAL_TEST_SECRET\" {arg}; cat"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    run.stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = run.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&out.stdout).to_string();
    // The program got them all, and said them back.
    for m in [&env, &arg, &input] {
        assert!(out.contains(m.as_str()), "{m} missing from {out:?}");
    }
    let frames = capture.stop();
    let (n1, n2) = (c.node("n1").unwrap().addr, c.node("n2").unwrap().addr);
    assert!(
        !common::udp_between(&frames, n1, n2).is_empty()
            && !common::udp_between(&frames, n2, n1).is_empty(),
        "the capture saw no traffic between the nodes"
    );
    let frames = frames.concat();
    let seen = |m: &str| frames.windows(m.len()).any(|w| w == m.as_bytes());
    assert!(seen(&control), "the capture saw nothing in clear at all");
    for m in [&env, &arg, &input] {
        assert!(!seen(m), "{m} crossed the bridge in clear");
    }
}

/// Start grants (`docs/security.md`, "Local authority"): an exec service
/// runs nothing without the grant its program's home sealed for it, and
/// nothing beyond it. Tried by hand, as root on n1: a start without a
/// grant, with another process's grant, and with a grant sealed for
/// another node are refused and counted; a start asking for a hard limit
/// above its process's gets its process's. And root on another node runs
/// as `nobody` where the node squashes remote root (the default).
#[test]
fn starts_run_only_with_their_home_s_grant_and_no_more() {
    use shoal_pool::exec::{ExecReply, ExecRequest, Rlimit, StartSpec};
    use std::time::{Duration, Instant};

    let t = TestCluster::up("ue", 49, 3, Mode::Netns);
    let c = t.get();
    // n3 squashes remote root, as a node configured by default does, and
    // opens its socket to one group only.
    let group = common::local_group("shoal-link");
    c.stop("n3").unwrap();
    let n3 = c.node("n3").unwrap().config.clone();
    let text = std::fs::read_to_string(&n3).unwrap();
    let text = text.replace("remote_root = \"allow\"", "remote_root = \"squash\"");
    std::fs::write(&n3, format!("{text}socket_group = \"shoal-link\"\n")).unwrap();
    c.start_node("n3").unwrap();
    c.wait_ready(Duration::from_secs(30), &mut |_| {}).unwrap();
    let run = |on: &str| {
        let out = c
            .command("n1", shoal())
            .unwrap()
            .args(["run", "--on", on, "--", "id", "-u"])
            .current_dir("/")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(run("n2"), "0", "n2 allows remote root");
    assert_eq!(run("n1"), "0", "root is root on its own node");
    let nobody = Command::new("id").args(["-u", "nobody"]).output().unwrap();
    assert_eq!(run("n3"), String::from_utf8_lossy(&nobody.stdout).trim());

    // n3's socket: the group's, 0660; a user outside it is refused by the
    // kernel, one in it let in.
    let socket = std::fs::metadata(&c.node("n3").unwrap().socket).unwrap();
    assert_eq!(socket.permissions().mode() & 0o777, 0o660);
    assert_eq!(std::os::unix::fs::MetadataExt::gid(&socket), group);
    open_path_to(c.dir());
    open_path_to(shoal().parent().unwrap());
    let (uid, gid) = attacker();
    let status = |groups: &str| {
        c.command("n3", "setpriv")
            .unwrap()
            .args(["--reuid", &uid.to_string(), "--regid", &gid.to_string()])
            .args(["--groups", groups, "--"])
            .arg(shoal())
            .arg("ps")
            .output()
            .unwrap()
    };
    let outside = status(&gid.to_string());
    assert!(
        denied(&outside),
        "a user outside the group got in: {outside:?}"
    );
    let member = status(&format!("{gid},{group}"));
    assert!(
        member.status.success(),
        "{}",
        String::from_utf8_lossy(&member.stderr)
    );

    // By hand: this process is the program, n1 its home.
    let ctx = shoal_rpc::Context::attach(&c.node("n1").unwrap().socket).unwrap();
    let mut config = ctx.config().clone();
    config.bind_ip = std::net::IpAddr::from([0, 0, 0, 0]);
    let ctx = shoal_rpc::Context::new(config);
    let mut home = ctx.home().unwrap();
    let mut client = ctx.client().unwrap();
    let cluster = ctx.config().cluster;
    let port = |node: &str| shoal_poolsvc::exec_service(&cluster, node).put_port();
    let opts = shoal_rpc::CallOptions {
        deadline: Some(Duration::from_secs(5)),
        cancel: None,
    };
    // This process's hard limit on core files, lowered: what its grants
    // carry.
    let core = libc::rlimit {
        rlim_cur: 4096,
        rlim_max: 8192,
    };
    // SAFETY: setrlimit lowers this process's own limit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_CORE, &core) }, 0);
    let spec = StartSpec {
        argv: vec![
            "awk".into(),
            "/Max core/ { print $6 }".into(),
            "/proc/self/limits".into(),
        ],
        env: vec!["PATH=/usr/bin:/bin".into()],
        cwd: "/".into(),
        uid: 0,
        gid: 0,
        groups: vec![0],
        umask: 0o022,
        rlimits: vec![Rlimit {
            resource: libc::RLIMIT_CORE,
            soft: u64::MAX,
            hard: u64::MAX,
        }],
        hostname: "n1".into(),
        tty: None,
    };
    let spawn = |home: &mut shoal_rpc::HomeLink| {
        let (id, node, grant) = home.spawn("sh", Some("n2"), 0, true).unwrap();
        assert_eq!(node, "n2");
        (id.parse::<shoal_pool::ProcId>().unwrap(), grant)
    };
    let (id, grant) = spawn(&mut home);
    let (_, other_grant) = spawn(&mut home);
    let refused = || {
        c.status(&ctx, "n2", Duration::from_secs(2))
            .unwrap()
            .counters["refused_proc_requests"]
            + c.status(&ctx, "n3", Duration::from_secs(2))
                .unwrap()
                .counters["refused_proc_requests"]
    };
    let before = refused();
    let mut start = |node: &str, id, grant: &[u8]| {
        let request = ExecRequest::Start {
            id,
            spec: spec.clone(),
            grant: grant.to_vec(),
        };
        let reply = client
            .trans_with(&port(node), request.encode(), &opts)
            .unwrap();
        ExecReply::decode(&reply).unwrap()
    };
    for (node, id, grant, why) in [
        ("n2", id, &[][..], "start grant is refused"),
        ("n2", id, &other_grant[..], "is for process"),
        ("n3", id, &grant[..], "start grant is refused"),
    ] {
        match start(node, id, grant) {
            ExecReply::Error(e) => assert!(e.contains(why), "{e}"),
            other => panic!("started: {other:?}"),
        }
    }
    assert!(refused() >= before + 3);
    assert!(matches!(start("n2", id, &grant), ExecReply::Started { .. }));
    let mut out = Vec::new();
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let read = ExecRequest::Read {
            id,
            max: 4096,
            wait_ms: 500,
        };
        let reply = client
            .trans_with(&port("n2"), read.encode(), &opts)
            .unwrap();
        match ExecReply::decode(&reply).unwrap() {
            ExecReply::Output { stdout, ended, .. } => {
                out.extend(stdout);
                if ended.is_some() {
                    break;
                }
            }
            other => panic!("{other:?}"),
        }
        assert!(Instant::now() < until, "the program never ended");
    }
    // The hard limit, in bytes.
    assert_eq!(String::from_utf8_lossy(&out).trim(), "8192");
}

/// A server of root's on n1, in this process, that answers every request
/// with the node and uid it came from, and counts what it answered by uid.
struct Witness {
    server: shoal_rpc::Server,
    uids: std::sync::Arc<parking_lot::Mutex<Vec<u32>>>,
}

impl Witness {
    fn start(c: &shoal_cluster::Cluster, node: &str) -> Witness {
        Self::serving(c, node, shoal_rpc::GetPort::random())
    }

    /// A witness serving `service` (a system service: root's programs
    /// may serve one on a local cluster's nodes).
    fn serving(
        c: &shoal_cluster::Cluster,
        node: &str,
        service: impl Into<shoal_rpc::Service>,
    ) -> Witness {
        let attached = shoal_rpc::Context::attach(&c.node(node).unwrap().socket).unwrap();
        let mut config = attached.config().clone();
        config.bind_ip = std::net::IpAddr::from([0, 0, 0, 0]);
        let server = shoal_rpc::Context::new(config).serve(service).unwrap();
        let uids = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        {
            let (server, uids) = (server.clone(), uids.clone());
            std::thread::spawn(move || {
                while let Ok(req) = server.getreq() {
                    uids.lock().push(req.caller().uid);
                    let who = format!("{} {}", req.caller().node, req.caller().uid);
                    let _ = server.putrep(&req, who.into_bytes());
                }
            });
        }
        Witness { server, uids }
    }

    /// `shoal-attack ATTACK` against this server, as the attacker on
    /// `node`'s link (and in this process's network, where the server
    /// listens).
    fn attack(&self, c: &shoal_cluster::Cluster, node: &str, attack: &[&str]) -> Output {
        let port = self.server.port().to_string();
        Command::new("setpriv")
            .args(become_attacker())
            .arg(env!("CARGO_BIN_EXE_shoal-attack"))
            .arg("--socket")
            .arg(&c.node(node).unwrap().socket)
            .args(attack)
            .args(["--port", &port])
            .current_dir("/tmp")
            .output()
            .unwrap()
    }
}

/// Review 3, C1: a user who registers the instance id of root's server
/// under a port of their own, to be handed that server's channel secret
/// and call it as root, is refused; the secret is not handed out, and the
/// server hears nothing from uid 0 that the user sent, and still serves.
#[test]
fn a_user_cannot_take_another_endpoint_s_secret_and_call_it_as_root() {
    let t = TestCluster::up("uf", 50, 2, Mode::Netns);
    let c = t.get();
    open_path_to(c.dir());
    open_path_to(std::path::Path::new(env!("CARGO_BIN_EXE_shoal-attack")));
    let witness = Witness::start(c, "n1");
    let out = witness.attack(c, "n1", &["impersonate", "--uid", "0"]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(1),
        "the attack was not refused: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("registered on this node already"), "{said}");
    assert!(said.contains("no such endpoint registered"), "{said}");
    assert!(
        !witness.uids.lock().contains(&0),
        "root's server heard uid 0 from the user"
    );
    // The server still serves, to root and as root.
    let ctx = c.context();
    let mut client = ctx.client().unwrap();
    let reply = client
        .trans(&witness.server.port(), b"hello".to_vec())
        .unwrap();
    assert!(String::from_utf8_lossy(&reply).ends_with(" 0"));
}

/// Review 3, M5: a user who opens more channels to root's server than its
/// whole table holds (one client id and one request each) uses up only
/// their own share of it: a new caller of another uid is still served.
#[test]
fn a_user_filling_a_server_s_channels_denies_nobody_else() {
    let t = TestCluster::up("ug", 51, 2, Mode::Netns);
    let c = t.get();
    open_path_to(c.dir());
    open_path_to(std::path::Path::new(env!("CARGO_BIN_EXE_shoal-attack")));
    let witness = Witness::start(c, "n1");
    let out = witness.attack(c, "n1", &["fill-channels", "--channels", "70000"]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The server heard the user (a channel's first request opened).
    let (uid, _) = attacker();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while witness.uids.lock().iter().filter(|&&u| u == uid).count() < 4096 {
        assert!(
            std::time::Instant::now() < until,
            "the server heard too little"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // A new client endpoint of root's (a new channel) is served.
    let ctx = c.context();
    let mut client = ctx.client().unwrap();
    let opts = shoal_rpc::CallOptions {
        deadline: Some(std::time::Duration::from_secs(10)),
        cancel: None,
    };
    let reply = client
        .trans_with(&witness.server.port(), b"hello".to_vec(), &opts)
        .expect("root's new channel is refused");
    assert!(String::from_utf8_lossy(&reply).ends_with(" 0"));
}

/// Review 3, M3: where the file system squashes root (the default), what
/// root makes inside a directory its mount made, and pushes later, is
/// `nobody`'s in the tree, as what it makes anywhere else is.
#[test]
fn root_squash_holds_for_what_a_mount_pushes() {
    let t = TestCluster::up("uh", 52, 3, Mode::Netns);
    let c = t.get();
    c.start_system(&mut |l| eprintln!("[uh] {l}")).unwrap();
    common::ok(c, "n1", "mkdir /shoal/pub && chmod 1777 /shoal/pub");
    // Pushed, and seen elsewhere, while root is still root in the tree.
    assert_eq!(common::ok(c, "n2", "stat -c %a /shoal/pub").trim(), "1777");
    // The metadata replicas squash root from now on: each restarted so.
    let replicas = [("n1", "fs-r0"), ("n2", "fs-r1"), ("n3", "fs-r2")];
    for (node, name) in replicas {
        let (_, starts) = common::service(c, node, name);
        let mut services = c.services(node).unwrap();
        for s in &mut services {
            s.command.retain(|a| a != "--allow-root");
        }
        c.set_services(node, services).unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while common::service(c, node, name).1 <= starts {
            assert!(std::time::Instant::now() < until, "{name} never restarted");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    let until_ok = |node: &str, script: &str| {
        let out = common::until_ok(
            script,
            || common::sh(c, node, script),
            || format!("{:?}", common::services(c)),
        );
        String::from_utf8_lossy(&out).trim().to_string()
    };
    // Made through the primary, as a request: squashed.
    until_ok("n2", "touch /shoal/pub/g");
    assert_eq!(until_ok("n3", "stat -c %u /shoal/pub/g"), "65534");
    // Made in the mount's own directory, and pushed: squashed too.
    common::ok(
        c,
        "n2",
        "mkdir /shoal/pub/t && echo x > /shoal/pub/t/f && mkdir /shoal/pub/t/d && sync /shoal/pub/t",
    );
    assert_eq!(until_ok("n3", "stat -c %u /shoal/pub/t/f"), "65534");
    assert_eq!(until_ok("n3", "stat -c %u /shoal/pub/t/d"), "65534");
    assert_eq!(until_ok("n3", "cat /shoal/pub/t/f"), "x");
}

/// Review 3, M6: a user's links, endpoints and waiting locates are each
/// bounded on their node, so the root daemon's threads and tables do not
/// grow with what one user asks; each refusal is one clear line, and the
/// node serves others meanwhile.
#[test]
fn a_user_s_links_registrations_and_locates_are_bounded() {
    let t = TestCluster::up("uj", 54, 2, Mode::Netns);
    let c = t.get();
    open_path_to(c.dir());
    open_path_to(std::path::Path::new(env!("CARGO_BIN_EXE_shoal-attack")));
    let socket = c.node("n1").unwrap().socket.clone();
    let out = Command::new("setpriv")
        .args(become_attacker())
        .arg(env!("CARGO_BIN_EXE_shoal-attack"))
        .arg("--socket")
        .arg(&socket)
        .args(["flood", "--links", "300", "--registrations", "4200"])
        .args(["--locates", "100"])
        .current_dir("/tmp")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |what: &str| {
        said.lines()
            .find(|l| l.starts_with(what))
            .unwrap_or_else(|| panic!("no {what} in {said}"))
            .to_string()
    };
    let links = line("links:");
    assert!(links.starts_with("links: 256 taken"), "{links}");
    assert!(links.contains("links to this node open already"), "{links}");
    let registrations = line("registrations:");
    assert!(
        registrations.starts_with("registrations: 4096 taken"),
        "{registrations}"
    );
    assert!(
        registrations.contains("endpoints registered on this node already"),
        "{registrations}"
    );
    let locates = line("locates:");
    assert!(
        locates.contains("locates waiting on this node"),
        "{locates}"
    );
    // The node still serves its root, and knows its peer.
    let ctx = c.context();
    let status = c
        .status(&ctx, "n1", std::time::Duration::from_secs(5))
        .unwrap();
    assert!(status.members.iter().all(|m| m.alive), "{status:?}");
}
