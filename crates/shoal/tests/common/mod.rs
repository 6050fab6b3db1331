//! What the real-cluster test binaries share: the `shoal` binary under
//! test and a local cluster torn down when dropped.

#![allow(dead_code)] // each test binary uses its own part

use std::path::PathBuf;
use std::process::Command;

use shoal_cluster::{Cluster, Mode, Spec};

pub fn shoal() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_shoal"))
}

pub struct TestCluster {
    cluster: Option<Cluster>,
    _dir: tempfile::TempDir,
}

impl TestCluster {
    /// A cluster of `nodes`; each test uses its own `name` and `subnet`.
    pub fn up(name: &str, subnet: u8, nodes: usize, mode: Mode) -> TestCluster {
        if mode == Mode::Netns {
            assert!(
                shoal_cluster::is_root(),
                "namespaced cluster tests need root"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let spec = Spec {
            dir: dir.path().join("cluster"),
            nodes,
            name: name.into(),
            subnet,
            mode,
            shoal: shoal(),
        };
        let cluster = Cluster::up(&spec, &mut |l| eprintln!("[{name}] {l}")).unwrap();
        TestCluster {
            cluster: Some(cluster),
            _dir: dir,
        }
    }

    pub fn get(&self) -> &Cluster {
        self.cluster.as_ref().unwrap()
    }

    /// Runs `shoal ARGS` with this cluster's directory.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(shoal())
            .args(args)
            .arg("--dir")
            .arg(self.get().dir())
            .output()
            .unwrap()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if let Some(c) = self.cluster.take() {
            let _ = c.down(&mut |_| {});
        }
    }
}

/// A long-running `shoal ...` process on a node (a service), logging to a
/// file; killed when dropped.
pub struct Daemon {
    pub node: String,
    args: Vec<String>,
    pub log: PathBuf,
    envs: Vec<(String, PathBuf)>,
    child: Option<std::process::Child>,
}

impl Daemon {
    pub fn start(
        c: &Cluster,
        node: &str,
        args: &[&str],
        log: PathBuf,
        envs: &[(&str, &std::path::Path)],
    ) -> Daemon {
        let mut d = Daemon {
            node: node.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            log,
            envs: envs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_path_buf()))
                .collect(),
            child: None,
        };
        d.spawn(c);
        d
    }

    /// Starts the process again (after `kill`).
    pub fn spawn(&mut self, c: &Cluster) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = c.command(&self.node, shoal()).unwrap();
        cmd.args(&self.args)
            .env("SHOAL_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(log);
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().unwrap());
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The last lines of the log.
    pub fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `run` until its command succeeds (a service may still be starting
/// or re-forming) and returns its standard output; after 40 s, fails with
/// the last error and `logs()`.
pub fn until_ok(
    what: &str,
    run: impl FnMut() -> std::process::Output,
    logs: impl Fn() -> String,
) -> Vec<u8> {
    until_output(what, run, |_| true, logs)
}

/// Runs `run` until its command succeeds and its output satisfies `done`
/// (read as text: every replica joined, every server registered), and
/// returns that output; after 40 s, fails with the last output and
/// `logs()`.
pub fn until_output(
    what: &str,
    mut run: impl FnMut() -> std::process::Output,
    done: impl Fn(&str) -> bool,
    logs: impl Fn() -> String,
) -> Vec<u8> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    loop {
        let out = run();
        let text = String::from_utf8_lossy(&out.stdout);
        if out.status.success() && done(&text) {
            return out.stdout;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not yet after 40 s: {text}{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            logs()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// The uid and gid of the local user `name`, made on first use (a system
/// user without a home, or with `home` an ordinary one with its home
/// directory).
pub fn local_user(name: &str, home: bool) -> (u32, u32) {
    let id = |flag: &str| {
        Command::new("id")
            .args([flag, name])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
    };
    if id("-u").is_none() {
        let mut add = Command::new("useradd");
        if home {
            add.args(["--create-home", "--shell", "/bin/sh"]);
        } else {
            add.args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
            ]);
        }
        let made = add.arg(name).status().unwrap();
        // Another test binary may have made it meanwhile.
        assert!(
            made.success() || id("-u").is_some(),
            "useradd {name} failed"
        );
    }
    (id("-u").unwrap(), id("-g").unwrap())
}

/// Opens the way to `dir` for everyone (the test's temporary directory is
/// root's alone), so that only the cluster's own modes protect it.
pub fn open_path_to(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut p = dir;
    while let Some(parent) = p.parent() {
        if parent == std::path::Path::new("/") || parent == std::path::Path::new("/tmp") {
            break;
        }
        p = parent;
        let mode = std::fs::metadata(p).unwrap().permissions().mode();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode | 0o011)).unwrap();
    }
}

/// Frames crossing a local cluster's bridge, caught by a raw packet
/// socket on every port of the bridge and the bridge itself (the bridge
/// device alone sees only what is for this host, not what it forwards
/// between nodes).
pub struct Capture {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Vec<u8>>>,
}

impl Capture {
    pub fn start(bridge: &str) -> Capture {
        use std::sync::atomic::Ordering;
        let index = |name: &str| {
            let name = std::ffi::CString::new(name).unwrap();
            // SAFETY: if_nametoindex reads a NUL-terminated name.
            unsafe { libc::if_nametoindex(name.as_ptr()) as i32 }
        };
        let mut interfaces = vec![index(bridge)];
        for port in std::fs::read_dir(format!("/sys/class/net/{bridge}/brif")).unwrap() {
            interfaces.push(index(&port.unwrap().file_name().to_string_lossy()));
        }
        // SAFETY: plain system calls on a socket this function owns.
        let fd = unsafe {
            let proto = (libc::ETH_P_ALL as u16).to_be();
            let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto as i32);
            assert!(
                fd >= 0,
                "packet socket: {}",
                std::io::Error::last_os_error()
            );
            let tv = libc::timeval {
                tv_sec: 0,
                tv_usec: 100_000,
            };
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            );
            fd
        };
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut frames = Vec::new();
            let mut buf = vec![0u8; 65536];
            while !flag.load(Ordering::Acquire) {
                // SAFETY: an all-zero sockaddr_ll is a valid value to fill.
                let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
                let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
                // SAFETY: reads into a buffer of its length, and the sender's
                // address into `from`.
                let n = unsafe {
                    libc::recvfrom(
                        fd,
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        0,
                        (&mut from as *mut libc::sockaddr_ll).cast(),
                        &mut len,
                    )
                };
                if n > 0 && interfaces.contains(&from.sll_ifindex) {
                    frames.push(buf[..n as usize].to_vec());
                }
            }
            // SAFETY: the socket is this thread's.
            unsafe { libc::close(fd) };
            frames
        });
        Capture { stop, thread }
    }

    /// Every frame caught, once in-flight ones had time to arrive.
    pub fn stop(self) -> Vec<Vec<u8>> {
        std::thread::sleep(std::time::Duration::from_millis(300));
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.thread.join().unwrap()
    }
}

/// The payloads of the UDP datagrams from `from` to `to` among Ethernet
/// `frames` (IPv4, unfragmented), each once, in order.
pub fn udp_between(
    frames: &[Vec<u8>],
    from: std::net::SocketAddr,
    to: std::net::SocketAddr,
) -> Vec<Vec<u8>> {
    let ip = |a: std::net::SocketAddr| match a.ip() {
        std::net::IpAddr::V4(v4) => v4.octets(),
        std::net::IpAddr::V6(_) => [0; 4],
    };
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for f in frames {
        if f.len() < 42 || f[12..14] != [0x08, 0x00] || f[14] >> 4 != 4 || f[23] != 17 {
            continue;
        }
        let ihl = usize::from(f[14] & 0x0f) * 4;
        let udp = 14 + ihl;
        if f.len() < udp + 8 || f[26..30] != ip(from) || f[30..34] != ip(to) {
            continue;
        }
        let port = |at: usize| u16::from_be_bytes([f[at], f[at + 1]]);
        let len = usize::from(port(udp + 4));
        if port(udp) != from.port() || port(udp + 2) != to.port() || len < 8 || f.len() < udp + len
        {
            continue;
        }
        let payload = f[udp + 8..udp + len].to_vec();
        if seen.insert(payload.clone()) {
            out.push(payload);
        }
    }
    out
}

/// The gid of local group `name`, made on first use.
pub fn local_group(name: &str) -> u32 {
    let gid = || {
        Command::new("getent")
            .args(["group", name])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split(':')
                    .nth(2)
                    .and_then(|g| g.trim().parse().ok())
            })
    };
    if gid().is_none() {
        let made = Command::new("groupadd")
            .args(["--system", name])
            .status()
            .unwrap();
        assert!(made.success() || gid().is_some(), "groupadd {name} failed");
    }
    gid().unwrap()
}

/// File server `fs{i}` on node `n{i}`, its store and log in `dir`, run as
/// the administrator whose configuration is `config`; `extra` flags after
/// the usual ones.
pub fn file_server(
    c: &Cluster,
    i: usize,
    dir: &std::path::Path,
    config: &std::path::Path,
    extra: &[&str],
) -> Daemon {
    let (name, node) = (format!("fs{i}"), format!("n{i}"));
    let data = dir.join(&name);
    let mut args = vec!["file", "serve", "--name", &name, "--data"];
    args.push(data.to_str().unwrap());
    args.extend_from_slice(extra);
    let log = dir.join(format!("{name}.log"));
    Daemon::start(c, &node, &args, log, &[("SHOAL_CONFIG_DIR", config)])
}

/// A directory service of three replicas on n1, n2 and n3, each keeping
/// its data in `dir/dI` and logging to `dir/dI.log`.
pub fn dir_replicas(c: &Cluster, dir: &std::path::Path) -> Vec<Daemon> {
    (0..3)
        .map(|i| {
            let data = dir.join(format!("d{i}"));
            Daemon::start(
                c,
                &format!("n{}", i + 1),
                &[
                    "dir",
                    "serve",
                    "--replica",
                    &i.to_string(),
                    "--replicas",
                    "3",
                    "--data",
                    data.to_str().unwrap(),
                ],
                dir.join(format!("d{i}.log")),
                &[],
            )
        })
        .collect()
}

/// A node's metrics page (Prometheus text, with the HTTP head).
pub fn fetch_metrics(addr: std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    text
}

/// `sh -c SCRIPT` on `node`, in its namespaces (its /shoal).
pub fn sh(c: &Cluster, node: &str, script: &str) -> std::process::Output {
    c.command(node, "sh")
        .unwrap()
        .args(["-c", script])
        .env("SHOAL", shoal())
        .output()
        .unwrap()
}

/// `shoal ARGS` on `node`, which must succeed: its output.
pub fn shoal_ok(c: &Cluster, node: &str, args: &[&str]) -> std::process::Output {
    let out = c
        .command(node, shoal())
        .unwrap()
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "shoal {} on {node}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// [`sh`], which must succeed: its standard output.
pub fn ok(c: &Cluster, node: &str, script: &str) -> String {
    ok_with(c, node, script, &[])
}

/// [`ok`] with more of the environment set.
pub fn ok_with(c: &Cluster, node: &str, script: &str, env: &[(&str, &std::ffi::OsStr)]) -> String {
    let out = c
        .command(node, "sh")
        .unwrap()
        .args(["-c", script])
        .env("SHOAL", shoal())
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} on {node}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every service of the cluster (`shoal service ls --all --json`).
pub fn services(c: &Cluster) -> Vec<serde_json::Value> {
    serde_json::from_str(&ok(c, "n1", "$SHOAL service ls --all --json")).unwrap()
}

/// The pid and start count of service `name` on `node`.
pub fn service(c: &Cluster, node: &str, name: &str) -> (i64, u64) {
    let s = services(c)
        .into_iter()
        .find(|s| s["node"] == node && s["name"] == name)
        .unwrap_or_else(|| panic!("no service {name} on {node}"));
    (
        s["pid"].as_i64().unwrap_or(0),
        s["starts"].as_u64().unwrap(),
    )
}

/// Kills a service with SIGKILL and waits for its daemon to restart it.
pub fn kill_and_wait(c: &Cluster, node: &str, name: &str) {
    let (pid, starts) = service(c, node, name);
    assert!(pid > 0, "{name} on {node} is not running");
    // SAFETY: kill has no memory effects.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (p, s) = service(c, node, name);
        if s > starts && p > 0 {
            return;
        }
        if std::time::Instant::now() > until {
            let logs = sh(
                c,
                "n1",
                &format!("$SHOAL service ls --all; $SHOAL service logs {name} --node {node}"),
            );
            panic!(
                "{name} on {node} not restarted:\n{}",
                String::from_utf8_lossy(&logs.stdout)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Checks that a command failed with one line of error that says `needle`.
pub fn fails_with(out: &std::process::Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected a failure, got success");
    assert!(
        err.contains(needle),
        "expected {needle:?} in the error, got {err:?}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one-line error: {err:?}");
}
