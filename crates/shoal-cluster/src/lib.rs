//! Local clusters: N shoal nodes on this machine.
//!
//! Run as root, every node gets its own network namespace with one veth
//! interface on a bridge, so nodes talk over a real (virtual) Ethernet:
//! broadcast works, and a node can be cut off or made lossy with iptables
//! inside its namespace, or killed.  Without root, nodes share loopback on
//! different ports (locate then asks every node instead of broadcasting).
//!
//! A cluster lives in a directory:
//!
//! ```text
//! DIR/cluster.toml      what `up` built: mode, subnet, nodes, addresses
//! DIR/cluster.key       the cluster key
//! DIR/admin/            the cluster's admin key and id (0700), which
//!                       admitted every node
//! DIR/n1/node.toml      node n1's configuration
//! DIR/n1/node.log       its log
//! DIR/n1/node.sock      its link socket
//! DIR/n1/state/         its identity (static key, certificate) and pid
//!                       file (0700); with the whole system, its services'
//!                       logs, the directory replica's data (dir/) and
//!                       the file server's store (files/)
//! DIR/root/root         with the whole system (`Cluster::start_system`),
//!                       the cluster's root directory, which programs run
//!                       on its nodes use unless they set SHOAL_CONFIG_DIR
//! ```
//!
//! The directory is checked to be the user's and writable by nobody else
//! (root's default, `/run/shoal/cluster`, cannot be planted), and the key
//! is written 0600.
//!
//! Programs run "on" a node through [`Cluster::command`]: inside its
//! namespace, with `SHOAL_NODE` pointing at its link socket.

mod netns;
mod system;

pub use system::SystemOptions;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shoal_nodesvc::{NodeConfigFile, NodeRequest, NodeStatus};
use shoal_rpc::{Context, ContextConfig};
use shoal_wire::ClusterKey;

/// How nodes are separated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// One network namespace per node, on a bridge (needs root).
    Netns,
    /// All nodes on 127.0.0.1, different ports.
    Loopback,
}

/// What to build.
#[derive(Debug, Clone)]
pub struct Spec {
    pub dir: PathBuf,
    pub nodes: usize,
    /// Short name (1 to 4 characters) used in namespace and interface names.
    pub name: String,
    /// Third octet of the 10.77.X.0/24 subnet (netns) or port block
    /// (loopback), so several clusters can coexist.
    pub subnet: u8,
    pub mode: Mode,
    /// The `shoal` binary the nodes run.
    pub shoal: PathBuf,
}

/// One node as the cluster file records it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeEntry {
    pub name: String,
    pub addr: SocketAddr,
    pub netns: Option<String>,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub log: PathBuf,
    pub metrics: SocketAddr,
}

/// The cluster file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterFile {
    pub name: String,
    pub mode: Mode,
    pub subnet: u8,
    pub key_file: PathBuf,
    pub shoal: PathBuf,
    pub bridge: Option<String>,
    pub nodes: Vec<NodeEntry>,
}

/// A local cluster.
#[derive(Debug, Clone)]
pub struct Cluster {
    dir: PathBuf,
    file: ClusterFile,
    key: ClusterKey,
}

/// The default cluster directory: `$SHOAL_CLUSTER`; else root's is
/// `/run/shoal/cluster`, where only root can make files, and another
/// user's `/tmp/shoal-cluster-UID`, which must be theirs.
pub fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SHOAL_CLUSTER") {
        return PathBuf::from(d);
    }
    if is_root() {
        PathBuf::from("/run/shoal/cluster")
    } else {
        // SAFETY: geteuid has no preconditions.
        PathBuf::from(format!("/tmp/shoal-cluster-{}", unsafe { libc::geteuid() }))
    }
}

/// Makes `dir` (0755) if missing, and checks that it is this user's and
/// that nobody else can make or replace files in it: a cluster's
/// configuration, key and pid files must not be plantable.
fn owned_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    match std::fs::DirBuilder::new().mode(0o755).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is not a directory of this user's that only they can write to \
             (owner uid {}, mode {:o}); refusing to use it for a cluster",
            dir.display(),
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Whether this process may build namespaces.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

impl Cluster {
    /// Builds the cluster and starts every node; `progress` hears each step.
    pub fn up(spec: &Spec, progress: &mut dyn FnMut(&str)) -> Result<Cluster, String> {
        if spec.nodes == 0 || spec.nodes > 200 {
            return Err("--nodes must be between 1 and 200".into());
        }
        if spec.name.is_empty()
            || spec.name.len() > 4
            || !spec.name.chars().all(|c| c.is_ascii_alphanumeric())
        {
            return Err("cluster name must be 1 to 4 letters or digits".into());
        }
        if spec.dir.join("cluster.toml").exists() {
            return Err(format!(
                "a cluster already exists in {} (run `shoal cluster down` first)",
                spec.dir.display()
            ));
        }
        if spec.mode == Mode::Netns && !is_root() {
            return Err("namespaced clusters need root; use --loopback".into());
        }
        owned_dir(&spec.dir)?;
        let dir = std::fs::canonicalize(&spec.dir).map_err(|e| e.to_string())?;
        let key = ClusterKey::random();
        let key_file = dir.join("cluster.key");
        shoal_rpc::secrets::write(&key_file, format!("{}\n", key.to_hex()).as_bytes())?;
        // The cluster's own admin key admits every node.
        let admin = shoal_nodesvc::identity::Admin::create(&dir.join("admin"))?;
        let bridge = (spec.mode == Mode::Netns).then(|| format!("shb-{}", spec.name));
        if let Some(bridge) = &bridge {
            progress(&format!(
                "creating bridge {bridge} on 10.77.{}.0/24",
                spec.subnet
            ));
            netns::create_bridge(bridge, spec.subnet)?;
        }
        let mut nodes = Vec::new();
        for i in 1..=spec.nodes {
            let name = format!("n{i}");
            let node_dir = dir.join(&name);
            let state_dir = node_dir.join("state");
            owned_dir(&node_dir)?;
            shoal_rpc::secrets::dir(&state_dir, false)?;
            let public = shoal_nodesvc::identity::static_public_key(&state_dir)?;
            let cert = admin.admit(&name, public, shoal_nodesvc::identity::CERT_DAYS)?;
            shoal_rpc::secrets::write(
                &state_dir.join(shoal_nodesvc::identity::NODE_CERT),
                format!("{}\n", hex::encode(cert)).as_bytes(),
            )?;
            let (addr, bind, broadcast, netns, metrics) = match spec.mode {
                Mode::Netns => {
                    let ip = Ipv4Addr::new(10, 77, spec.subnet, 10 + i as u8);
                    let ns = format!("sh-{}-{name}", spec.name);
                    progress(&format!("creating namespace {ns} with {ip}"));
                    netns::create_node(bridge.as_deref().expect("netns mode"), &ns, spec, i, ip)?;
                    (
                        SocketAddr::new(IpAddr::V4(ip), 7700),
                        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 7700),
                        Some(SocketAddr::new(
                            IpAddr::V4(Ipv4Addr::new(10, 77, spec.subnet, 255)),
                            7700,
                        )),
                        Some(ns),
                        SocketAddr::new(IpAddr::V4(ip), 9100),
                    )
                }
                Mode::Loopback => {
                    let port = 20_000 + spec.subnet as u16 * 100 + i as u16 * 2;
                    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
                    let metrics = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port + 1);
                    (addr, addr, None, None, metrics)
                }
            };
            let entry = NodeEntry {
                config: node_dir.join("node.toml"),
                socket: node_dir.join("node.sock"),
                log: node_dir.join("node.log"),
                state_dir,
                name,
                addr,
                netns,
                metrics,
            };
            let seeds = vec![nodes.first().map_or(addr, |n: &NodeEntry| n.addr)];
            let config = NodeConfigFile {
                name: Some(entry.name.clone()),
                state_dir: Some(entry.state_dir.clone()),
                addr: Some(addr),
                bind: Some(bind),
                broadcast,
                seeds: Some(seeds),
                key_file: Some(key_file.clone()),
                cluster_id: Some(admin.cluster().to_hex()),
                admin_key: Some(admin.public().to_hex()),
                cert_file: None,
                metrics: Some(metrics),
                frag_bytes: None,
                socket: Some(entry.socket.clone()),
                // The nodes share this machine's console and load.
                owner_detect: Some(false),
                // Root on one node is root on all: they are one machine.
                remote_root: Some(shoal_nodesvc::RemoteRoot::Allow),
                socket_group: None,
                // Tests and benchmarks start servers by hand, as root.
                system_ports: Some(shoal_nodesvc::SystemPorts::Root),
                services: None,
            };
            let text = toml::to_string(&config).map_err(|e| e.to_string())?;
            std::fs::write(&entry.config, text).map_err(|e| e.to_string())?;
            nodes.push(entry);
        }
        let file = ClusterFile {
            name: spec.name.clone(),
            mode: spec.mode,
            subnet: spec.subnet,
            key_file,
            shoal: spec.shoal.clone(),
            bridge,
            nodes,
        };
        let text = toml::to_string(&file).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("cluster.toml"), text).map_err(|e| e.to_string())?;
        let cluster = Cluster { dir, file, key };
        for node in &cluster.file.nodes {
            progress(&format!("starting {} at {}", node.name, node.addr));
            cluster.start_node(&node.name)?;
        }
        cluster.wait_ready(Duration::from_secs(30), progress)?;
        Ok(cluster)
    }

    /// Opens the cluster in `dir`.
    pub fn open(dir: &Path) -> Result<Cluster, String> {
        let path = dir.join("cluster.toml");
        if dir.exists() {
            owned_dir(dir)?;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "no cluster in {} ({e}); start one with `shoal cluster up`",
                dir.display()
            )
        })?;
        let file: ClusterFile =
            toml::from_str(&text).map_err(|e| format!("{}: {}", path.display(), e.message()))?;
        let key_bytes = shoal_rpc::secrets::read(&file.key_file)?;
        let key = String::from_utf8_lossy(&key_bytes)
            .parse()
            .map_err(|e: String| format!("{}: {e}", file.key_file.display()))?;
        Ok(Cluster {
            // Absolute: programs on the nodes are given paths inside it.
            dir: std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()),
            file,
            key,
        })
    }

    /// Stops every node and removes namespaces, bridge and directory.
    pub fn down(self, progress: &mut dyn FnMut(&str)) -> Result<(), String> {
        for node in &self.file.nodes {
            if let Some(pid) = self.pid(&node.name) {
                progress(&format!("stopping {} (pid {pid})", node.name));
                stop_pid(pid, NODE_STOP_GRACE);
            }
            if let Some(ns) = &node.netns {
                netns::delete_node(ns);
            }
        }
        if let Some(bridge) = &self.file.bridge {
            netns::delete_bridge(bridge);
        }
        std::fs::remove_dir_all(&self.dir)
            .map_err(|e| format!("cannot remove {}: {e}", self.dir.display()))?;
        progress("cluster down");
        Ok(())
    }

    /// The cluster file.
    pub fn file(&self) -> &ClusterFile {
        &self.file
    }

    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cluster key.
    pub fn key(&self) -> &ClusterKey {
        &self.key
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Result<&NodeEntry, String> {
        self.file
            .nodes
            .iter()
            .find(|n| n.name == name)
            .ok_or_else(|| {
                let names: Vec<_> = self.file.nodes.iter().map(|n| n.name.as_str()).collect();
                format!(
                    "no node {name} in this cluster (nodes: {})",
                    names.join(", ")
                )
            })
    }

    /// The pid of node `name`'s daemon, if it runs.  The pid file may be
    /// stale (a killed daemon leaves it) and its number reused, so the
    /// process must also be running this node's configuration.
    pub fn pid(&self, name: &str) -> Option<i32> {
        let node = self.node(name).ok()?;
        let text = std::fs::read_to_string(node.state_dir.join("node.pid")).ok()?;
        let pid: i32 = text.trim().parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let config = node.config.to_string_lossy();
        let ours = cmdline
            .split(|b| *b == 0)
            .any(|arg| arg == config.as_bytes());
        (ours && pid_alive(pid)).then_some(pid)
    }

    /// A context for talking to the cluster from outside any node (from
    /// the machine itself): attached to the first node whose socket
    /// answers, which locates for it and gives it its keys, with its
    /// endpoints bound on this machine.  If no node answers, calls fail
    /// with that node's error.
    pub fn context(&self) -> Context {
        for node in &self.file.nodes {
            if let Ok(ctx) = Context::attach(&node.socket) {
                let mut config = ctx.config().clone();
                config.bind_ip = std::net::IpAddr::from([0, 0, 0, 0]);
                config.deadline = Duration::from_secs(2);
                return Context::new(config);
            }
        }
        let locate = self.file.nodes.iter().map(|n| n.addr).collect();
        let mut config = ContextConfig::new(locate);
        config.deadline = Duration::from_secs(2);
        Context::new(config)
    }

    /// A command that runs `program` on node `name`: inside its namespace,
    /// attached to its link socket.
    pub fn command(
        &self,
        name: &str,
        program: impl AsRef<std::ffi::OsStr>,
    ) -> Result<Command, String> {
        let node = self.node(name)?;
        let mut cmd = match (&node.netns, self.pid(name)) {
            // Into the running daemon's network and mount namespaces, so
            // the command sees the node's mounts (its /shoal) as the
            // daemon's programs do; in the working directory it was given.
            (Some(_), Some(pid)) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--target={pid}"))
                    .args(["--net", "--mount", "--wd=.", "--"])
                    .arg(program);
                c
            }
            // `ip netns exec` gives the program (the daemon, when it
            // starts) a mount namespace of its own.
            (Some(ns), None) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(program);
                c
            }
            (None, _) => Command::new(program),
        };
        cmd.env("SHOAL_NODE", &node.socket);
        // The cluster's root, for its administrator, unless they chose.
        let config = self.admin_config();
        if std::env::var_os("SHOAL_CONFIG_DIR").is_none() && config.join("root").exists() {
            cmd.env("SHOAL_CONFIG_DIR", config);
        }
        Ok(cmd)
    }

    /// Starts (or restarts) node `name`'s daemon in the background.
    pub fn start_node(&self, name: &str) -> Result<(), String> {
        if let Some(pid) = self.pid(name) {
            return Err(format!("{name} is already running (pid {pid})"));
        }
        let node = self.node(name)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .map_err(|e| format!("cannot open {}: {e}", node.log.display()))?;
        let _ = std::fs::remove_file(node.state_dir.join("node.pid"));
        let mut cmd = self.command(name, &self.file.shoal)?;
        cmd.args(["node", "--config"])
            .arg(&node.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .env_remove("SHOAL_NODE");
        detach(&mut cmd);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.file.shoal.display()))?;
        let _ = child.wait();
        // The daemon writes its pid file once it is up.
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.pid(name).is_none() {
            if Instant::now() > deadline {
                return Err(format!("{name} did not start; see {}", node.log.display()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Kills node `name`'s daemon with SIGKILL.
    pub fn kill(&self, name: &str) -> Result<(), String> {
        let pid = self.pid(name).ok_or(format!("{name} is not running"))?;
        // SAFETY: plain kill(2).
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while pid_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Stops node `name`'s daemon with SIGTERM.
    pub fn stop(&self, name: &str) -> Result<(), String> {
        let pid = self.pid(name).ok_or(format!("{name} is not running"))?;
        stop_pid(pid, NODE_STOP_GRACE);
        Ok(())
    }

    fn netns_of(&self, name: &str) -> Result<&str, String> {
        self.node(name)?.netns.as_deref().ok_or_else(|| {
            "partitions and loss need a namespaced cluster (run `shoal cluster up` as root)".into()
        })
    }

    /// Cuts node `name` off from the cluster network.
    pub fn partition(&self, name: &str) -> Result<(), String> {
        netns::partition(self.netns_of(name)?)
    }

    /// Drops `percent` of node `name`'s packets, each way, at random.
    pub fn loss(&self, name: &str, percent: f64) -> Result<(), String> {
        if !(0.0..=100.0).contains(&percent) {
            return Err("loss must be a percentage between 0 and 100".into());
        }
        netns::loss(self.netns_of(name)?, percent / 100.0)
    }

    /// Removes every partition and loss rule of node `name`.
    pub fn heal(&self, name: &str) -> Result<(), String> {
        netns::heal(self.netns_of(name)?)
    }

    /// Asks node `name` for its status.
    pub fn status(
        &self,
        ctx: &Context,
        name: &str,
        deadline: Duration,
    ) -> Result<NodeStatus, String> {
        shoal_nodesvc::ask(ctx, name, &NodeRequest::Status, deadline)
    }

    /// Waits until every node answers and sees every other alive.
    pub fn wait_ready(
        &self,
        timeout: Duration,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(), String> {
        let mut ctx = self.context();
        let want = self.file.nodes.len();
        let deadline = Instant::now() + timeout;
        for node in &self.file.nodes {
            loop {
                if ctx.config().link.is_none() {
                    ctx = self.context();
                }
                let err = match self.status(&ctx, &node.name, Duration::from_millis(500)) {
                    Ok(s) if s.members.iter().filter(|m| m.alive).count() == want => break,
                    Ok(s) => format!(
                        "sees {} of {want} nodes",
                        s.members.iter().filter(|m| m.alive).count()
                    ),
                    Err(e) => e,
                };
                if Instant::now() > deadline {
                    return Err(format!(
                        "{} not ready after {timeout:?}: {err}; see {}",
                        node.name,
                        node.log.display()
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            progress(&format!("{} ready", node.name));
        }
        Ok(())
    }
}

/// Makes a spawned daemon independent of this process: its own session,
/// and not our child (a second fork), so it is reaped by init, never left a
/// zombie of ours.
fn detach(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe calls (setsid, fork, _exit) between
    // fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            match libc::fork() {
                -1 => Err(std::io::Error::last_os_error()),
                0 => Ok(()),
                _ => libc::_exit(0),
            }
        });
    }
}

/// Whether `pid` is a live process (not a zombie).
pub fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// How long a node's daemon has to end after SIGTERM before SIGKILL: it
/// stops its services first, each within its stop timeout (10 s by
/// default).
const NODE_STOP_GRACE: Duration = Duration::from_secs(12);

fn stop_pid(pid: i32, grace: Duration) {
    // SAFETY: plain kill(2).
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while pid_alive(pid) {
        if Instant::now() > deadline {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The program `name` in the directory of the running program (shoal's
/// programs are installed side by side), else the first on `PATH`.
pub fn program_beside(name: &str) -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|p| Some(p.parent()?.join(name)));
    let path = std::env::var_os("PATH").unwrap_or_default();
    beside
        .into_iter()
        .chain(std::env::split_paths(&path).map(|d| d.join(name)))
        .find(|p| p.is_file())
}
