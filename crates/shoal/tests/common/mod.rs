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
    mut run: impl FnMut() -> std::process::Output,
    logs: impl Fn() -> String,
) -> Vec<u8> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    loop {
        let out = run();
        if out.status.success() {
            return out.stdout;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what} kept failing: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            logs()
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
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
