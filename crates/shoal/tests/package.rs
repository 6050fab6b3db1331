//! The Debian package, as an operator uses it on three hosts
//! (`docs/operations.md`): built from the binaries under test
//! (`shoal-dist`, what `cargo xtask dist` runs), installed with dpkg into
//! each namespaced node of a local cluster (one install root per node,
//! standing for each host's file system), joined with
//! `shoal cluster admit` and the `shoal node join` command it prints, and
//! started as the installed systemd unit says; the three daemons form a
//! cluster that runs programs and keeps the services their
//! configurations name.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{TestCluster, shoal};
use shoal_cluster::{Cluster, Mode};
use shoal_nodesvc::NodeConfigFile;

/// One installed host: its install root, its daemon.
struct Host {
    name: String,
    root: PathBuf,
    daemon: Option<Child>,
}

impl Host {
    /// A path of the host's file system.
    fn path(&self, absolute: &str) -> PathBuf {
        self.root.join(absolute.trim_start_matches('/'))
    }

    fn shoal(&self) -> PathBuf {
        self.path("/usr/bin/shoal")
    }

    /// The installed `shoal ARGS`, run on this host.
    fn run(&self, c: &Cluster, args: &[&str]) -> Output {
        c.command(&self.name, self.shoal())
            .unwrap()
            .env("SHOAL_NODE", self.path("/run/shoal/node.sock"))
            .current_dir("/")
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            // SAFETY: kill has no memory effects.
            unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
            let _ = d.wait();
        }
    }
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn build_package(out: &Path) -> PathBuf {
    let shoal = shoal();
    let inputs = shoal_dist::Inputs {
        make_shell: shoal.with_file_name("shoal-make-shell"),
        shoal,
        bench: None,
        docs: Vec::new(),
        version: "0.1.0".into(),
        arch: shoal_dist::host_arch().unwrap(),
        out: out.to_path_buf(),
    };
    let debs = shoal_dist::build(&inputs).unwrap();
    assert_eq!(debs.len(), 1);
    debs[0].clone()
}

/// Installs `deb` into `root` with its own dpkg database (the host's
/// libc6 is this machine's, which that database does not list).
fn install(deb: &Path, root: &Path) {
    let admin = root.join("var/lib/dpkg");
    std::fs::create_dir_all(admin.join("updates")).unwrap();
    std::fs::create_dir_all(admin.join("info")).unwrap();
    std::fs::write(admin.join("status"), "").unwrap();
    let out = Command::new("dpkg")
        .arg(format!("--instdir={}", root.display()))
        .arg(format!("--admindir={}", admin.display()))
        .args(["--force-depends", "-i"])
        .arg(deb)
        .output()
        .unwrap();
    ok(&out, "dpkg -i");
}

/// The unit's `ExecStart` and `Environment`, with the host's paths.
fn unit_command(host: &Host) -> Command {
    let unit =
        std::fs::read_to_string(host.path("/lib/systemd/system/shoal-node.service")).unwrap();
    let line = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in the unit"))
            .to_string()
    };
    let exec = line("ExecStart=");
    let args: Vec<PathBuf> = exec
        .split_whitespace()
        .map(|a| {
            if a.starts_with('/') {
                host.path(a)
            } else {
                PathBuf::from(a)
            }
        })
        .collect();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &format!("sh-pk-{}", host.name)])
        .args(&args);
    let env = line("Environment=");
    let (k, v) = env.split_once('=').unwrap();
    cmd.env(k, v);
    cmd
}

#[test]
fn the_package_installs_on_three_hosts_that_form_a_cluster() {
    let tmp = tempfile::tempdir().unwrap();
    let deb = build_package(&tmp.path().join("dist"));
    // The namespaces and their network; their own daemons stopped, the
    // installed ones take their place.
    let tc = TestCluster::up("pk", 58, 3, Mode::Netns);
    let c = tc.get();
    for n in ["n1", "n2", "n3"] {
        c.stop(n).unwrap();
    }
    let mut hosts: Vec<Host> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| Host {
            name: n.to_string(),
            root: tmp.path().join(n),
            daemon: None,
        })
        .collect();
    for h in &hosts {
        install(&deb, &h.root);
        // What users install is what users run: no benchmark peer.
        let binary = std::fs::read(h.shoal()).unwrap();
        for peer in ["tonic::", "shoal_bench::"] {
            assert!(
                !binary.windows(peer.len()).any(|w| w == peer.as_bytes()),
                "the installed shoal links {peer}"
            );
        }
        let config_path = h.path("/etc/shoal/node.toml");
        let mut config = NodeConfigFile::load(&config_path).unwrap();
        assert_eq!(
            config.socket.as_deref(),
            Some(Path::new(shoal_rpc::DEFAULT_NODE_SOCKET))
        );
        // Each host's own file system: the configuration's absolute paths
        // under its install root (systemd would make these directories).
        config.state_dir = Some(h.path(config.state_dir.unwrap().to_str().unwrap()));
        config.socket = Some(h.path(config.socket.unwrap().to_str().unwrap()));
        config.save(&config_path).unwrap();
        std::fs::create_dir_all(h.path("/run/shoal")).unwrap();
    }

    // The administrator, on n1: the cluster's admin key, then each host
    // admitted by the key it prints and joined by the command printed back.
    let admin = tmp.path().join("admin");
    let admin_arg = admin.to_str().unwrap();
    ok(
        &hosts[0].run(c, &["cluster", "init", "--admin-dir", admin_arg]),
        "cluster init",
    );
    let seed = c.node("n1").unwrap().addr.to_string();
    for h in &hosts {
        let config = h.path("/etc/shoal/node.toml");
        let key = ok(
            &h.run(c, &["node", "key", "--config", config.to_str().unwrap()]),
            "node key",
        );
        let addr = c.node(&h.name).unwrap().addr.to_string();
        let join = ok(
            &hosts[0].run(
                c,
                &[
                    "cluster",
                    "admit",
                    &h.name,
                    key.trim(),
                    "--addr",
                    &addr,
                    "--seed",
                    &seed,
                    "--admin-dir",
                    admin_arg,
                ],
            ),
            "cluster admit",
        );
        let words: Vec<&str> = join.split_whitespace().collect();
        assert_eq!(&words[..3], ["shoal", "node", "join"], "{join}");
        let mut args = words[1..].to_vec();
        args.extend(["--config", config.to_str().unwrap()]);
        ok(&h.run(c, &args), "node join");
    }
    // A configuration others could change is refused.
    {
        use std::os::unix::fs::PermissionsExt;
        let config = hosts[2].path("/etc/shoal/node.toml");
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o666)).unwrap();
        let out = unit_command(&hosts[2]).output().unwrap();
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("refusing to use it"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    // Started as the unit starts them.
    for h in &mut hosts {
        let log = std::fs::File::create(h.root.join("node.log")).unwrap();
        h.daemon = Some(
            unit_command(h)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
    }
    let logs = || {
        hosts
            .iter()
            .map(|h| {
                format!(
                    "--- {} ---\n{}",
                    h.name,
                    std::fs::read_to_string(h.root.join("node.log")).unwrap_or_default()
                )
            })
            .collect::<String>()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = hosts[2].run(c, &["status", "--json"]);
        let alive = serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|s| {
                s["members"]
                    .as_array()
                    .map(|m| m.iter().filter(|m| m["alive"] == true).count())
            });
        if alive == Some(3) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never 3 members: {out:?}\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // A working cluster: n1 runs a program on n3.
    let said = common::until_ok(
        "shoal run --on n3",
        || hosts[0].run(c, &["run", "--on", "n3", "--", "echo", "installed"]),
        logs,
    );
    assert_eq!(String::from_utf8_lossy(&said).trim(), "installed");

    // A service added to n2's configuration, taken on reload (the unit's
    // ExecReload: SIGHUP), seen from n1.
    let config = hosts[1].path("/etc/shoal/node.toml");
    let mut file = NodeConfigFile::load(&config).unwrap();
    file.services = Some(vec![shoal_nodesvc::ServiceConfig::new(
        "sleeper",
        &["sleep", "1000"],
    )]);
    file.save(&config).unwrap();
    let pid = hosts[1].daemon.as_ref().unwrap().id() as i32;
    // The unit's daemon is `ip netns exec`'s child... which execs it.
    // SAFETY: kill has no memory effects.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    common::until_ok(
        "the service to run",
        || {
            let out = hosts[0].run(c, &["service", "ls", "--node", "n2", "--json"]);
            let running = serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .ok()
                .is_some_and(|l| l[0]["name"] == "sleeper" && l[0]["state"] == "running");
            if running {
                out
            } else {
                Output {
                    status: Command::new("false").status().unwrap(),
                    ..out
                }
            }
        },
        logs,
    );
    drop(hosts);
    drop(tc);
}
