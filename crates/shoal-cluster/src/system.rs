//! The whole system on a local cluster (`docs/services.md`, "A whole
//! cluster in one command"): services the node daemons keep, written
//! into the nodes' configurations and taken with SIGHUP.
//!
//! ```text
//! dir-rI   on n1 … n3 (two nodes: two replicas; one:  the directory service
//!          two replicas on it)
//! file     on every node (server fsK on nK)           the file service
//! DIR/root/root                                       the cluster's root
//!                                                     directory (root's)
//! fs-rI    on n1 … n3 (as the directory's replicas)   the shared file
//!                                                     system's metadata
//! fs-mount on every node                              its tree at /shoal
//! ```
//!
//! The directory comes first; once it serves, the root is made, and the
//! file servers, which register in it, follow; then the file system's
//! metadata service, which keeps file contents on them, and a mount on
//! every node.  Only a cluster of network namespaces mounts the tree:
//! each node's daemon has a mount namespace of its own, so every node has
//! its own /shoal, as separate machines do.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use shoal_nodesvc::{NodeConfigFile, ServiceConfig};

use crate::Cluster;

/// Where a local cluster mounts the shared file system on every node.
pub const MOUNT: &str = "/shoal";

/// How long the directory and the file servers have to come up.
const SYSTEM_WAIT: Duration = Duration::from_secs(90);

/// How [`Cluster::start_system_with`] starts the system.
#[derive(Debug, Clone, Default)]
pub struct SystemOptions {
    /// More arguments for every `shoal file serve` (a test's short
    /// time-to-live, say).
    pub file_server_args: Vec<String>,
    /// More arguments for every `shoal file manage` (a test's short
    /// round).
    pub manager_args: Vec<String>,
}

impl Cluster {
    /// The administrator's configuration directory of this cluster (its
    /// root capability): what programs run on its nodes use unless they
    /// set `SHOAL_CONFIG_DIR`.
    pub fn admin_config(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// Replaces node `name`'s services in its configuration and, if it
    /// runs, has it read them (SIGHUP).
    pub fn set_services(&self, name: &str, services: Vec<ServiceConfig>) -> Result<(), String> {
        let node = self.node(name)?;
        let mut config = NodeConfigFile::load(&node.config)?;
        config.services = (!services.is_empty()).then_some(services);
        config.save(&node.config)?;
        if let Some(pid) = self.pid(name) {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(pid, libc::SIGHUP) };
        }
        Ok(())
    }

    /// Node `name`'s services, from its configuration.
    pub fn services(&self, name: &str) -> Result<Vec<ServiceConfig>, String> {
        let node = self.node(name)?;
        Ok(NodeConfigFile::load(&node.config)?
            .services
            .unwrap_or_default())
    }

    /// Adds `service` to node `name`'s services (replacing one of its
    /// name) and has the node read them.
    fn put_service(&self, name: &str, service: ServiceConfig) -> Result<(), String> {
        let mut services = self.services(name)?;
        services.retain(|s| s.name != service.name);
        services.push(service);
        self.set_services(name, services)
    }

    /// Starts the directory service, makes the cluster's root, and starts
    /// a file server on every node; returns once each serves.
    pub fn start_system(&self, progress: &mut dyn FnMut(&str)) -> Result<(), String> {
        self.start_system_with(&SystemOptions::default(), progress)
    }

    /// [`Cluster::start_system`], with `opts`.
    pub fn start_system_with(
        &self,
        opts: &SystemOptions,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(), String> {
        let shoal = self.file.shoal.to_string_lossy().into_owned();
        let nodes: Vec<String> = self.file.nodes.iter().map(|n| n.name.clone()).collect();
        // A process group needs two members: one node runs two replicas.
        let replicas = nodes.len().clamp(2, 3);
        self.hand_service_map(&nodes, replicas, progress)?;
        let mut homes = Vec::new();
        for i in 0..replicas {
            let name = &nodes[i % nodes.len()];
            homes.push(name.as_str());
            let dir = self.replica_service("dir", i, replicas, name, &[])?;
            self.put_service(name, dir)?;
        }
        homes.dedup();
        progress(&format!(
            "directory service: {replicas} replicas on {}",
            homes.join(", ")
        ));
        let config = self.admin_config();
        let started = Instant::now();
        if !config.join("root").exists() {
            shoal_rpc::secrets::dir(&config, false)?;
            self.until_ok(&nodes[0], &["init"], started, "the directory to serve")?;
        }
        progress(&format!(
            "root directory made (saved in {})",
            config.display()
        ));
        for (k, name) in nodes.iter().enumerate() {
            let data = self.node(name)?.state_dir.join("files");
            let (server, data) = (format!("fs{}", k + 1), data.to_string_lossy());
            let mut args = vec![
                shoal.as_str(),
                "file",
                "serve",
                "--name",
                &server,
                "--data",
                &data,
            ];
            args.extend(opts.file_server_args.iter().map(String::as_str));
            let mut file = ServiceConfig::new("file", &args);
            file.env.insert(
                "SHOAL_CONFIG_DIR".into(),
                config.to_string_lossy().into_owned(),
            );
            self.put_service(name, file)?;
            // The object manager beside every file server: whichever
            // comes first makes each round's pass.
            let mut args = vec![shoal.as_str(), "file", "manage"];
            args.extend(opts.manager_args.iter().map(String::as_str));
            let mut manager = ServiceConfig::new("file-manager", &args);
            manager.env.insert(
                "SHOAL_CONFIG_DIR".into(),
                config.to_string_lossy().into_owned(),
            );
            self.put_service(name, manager)?;
        }
        loop {
            let listed = self.until_ok(
                &nodes[0],
                &["file", "servers"],
                started,
                "the file servers to register",
            )?;
            let serving = listed.lines().filter(|l| l.contains("files=")).count();
            if serving == nodes.len() {
                break;
            }
            if started.elapsed() > SYSTEM_WAIT {
                return Err(format!(
                    "only {serving} of {} file servers registered; see `shoal service logs file --node NODE`",
                    nodes.len()
                ));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        progress(&format!(
            "file servers {} and their object managers on {}",
            span("fs", nodes.len()),
            span("n", nodes.len())
        ));
        if self.node(&nodes[0])?.netns.is_some() {
            self.start_fs(&nodes, replicas, started, progress)?;
        }
        Ok(())
    }

    /// Signs the service map of the system this starts (the directory's
    /// and the file system's replicas on the nodes they go to), hands it
    /// to the first node, and waits until every node holds it: from then
    /// on no other node's answer for those ports is taken.
    fn hand_service_map(
        &self,
        nodes: &[String],
        replicas: usize,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(), String> {
        let on = |i: usize| nodes[i % nodes.len()].clone();
        let mut homes: Vec<String> = (0..replicas).map(on).collect();
        homes.sort();
        homes.dedup();
        let mut map = Vec::new();
        for (service, peer) in [
            ("directory service dir", "directory peer dir"),
            ("file system metadata fs", "file system metadata peer fs"),
        ] {
            map.push((service.to_string(), homes.clone()));
            for i in 0..replicas {
                map.push((format!("{peer} {i}"), vec![on(i)]));
            }
        }
        let admin = shoal_nodesvc::identity::Admin::open(&self.dir.join("admin"))?;
        let bytes = hex::encode(admin.services(&map)?);
        let version = shoal_session::ServiceMap::verify(
            &hex::decode(&bytes).expect("hex"),
            admin.cluster(),
            &admin.public(),
        )
        .map_err(|e| e.to_string())?
        .version;
        let started = Instant::now();
        self.until_ok(
            &nodes[0],
            &["node", "services", &bytes],
            started,
            "the service map",
        )?;
        let ctx = self.context();
        for name in nodes {
            loop {
                let held = self
                    .status(&ctx, name, Duration::from_secs(1))
                    .map_or(0, |s| s.service_map);
                if held >= version {
                    break;
                }
                if started.elapsed() > SYSTEM_WAIT {
                    return Err(format!("{name} never took service map version {version}"));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        progress(&format!(
            "service map version {version}: the system services on {} only",
            homes.join(", ")
        ));
        Ok(())
    }

    /// Replica `i` of `replicas` of the `kind` service (`dir` or `fs`) on
    /// node `name`, a system service: `shoal KIND serve` with its own data
    /// directory, `replicated` durability, and `extra` arguments.
    fn replica_service(
        &self,
        kind: &str,
        i: usize,
        replicas: usize,
        name: &str,
        extra: &[&str],
    ) -> Result<ServiceConfig, String> {
        let shoal = self.file.shoal.to_string_lossy().into_owned();
        let data = self.node(name)?.state_dir.join(format!("{kind}-r{i}"));
        let (i, replicas) = (i.to_string(), replicas.to_string());
        let data = data.to_string_lossy();
        let mut args = vec![
            shoal.as_str(),
            kind,
            "serve",
            "--replica",
            &i,
            "--replicas",
            &replicas,
            "--durability",
            "replicated",
            "--data",
            &data,
        ];
        args.extend_from_slice(extra);
        let mut s = ServiceConfig::new(&format!("{kind}-r{}", i), &args);
        s.system = true;
        Ok(s)
    }

    /// The shared file system: its metadata replicas beside the
    /// directory's, and its tree mounted at [`MOUNT`] on every node.
    fn start_fs(
        &self,
        nodes: &[String],
        replicas: usize,
        started: Instant,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(), String> {
        let shoal = self.file.shoal.to_string_lossy().into_owned();
        let config = self.admin_config();
        let copies = nodes.len().min(2).to_string();
        for i in 0..replicas {
            let name = &nodes[i % nodes.len()];
            // A local cluster's nodes are one administrator's: root on
            // each acts as root in the tree.
            let extra = ["--copies", &copies, "--allow-root"];
            let mut fs = self.replica_service("fs", i, replicas, name, &extra)?;
            fs.env.insert(
                "SHOAL_CONFIG_DIR".into(),
                config.to_string_lossy().into_owned(),
            );
            self.put_service(name, fs)?;
        }
        // The mount point, in the file system all nodes share; each node
        // mounts over it in its own mount namespace.
        std::fs::create_dir_all(MOUNT)
            .map_err(|e| format!("cannot make the mount point {MOUNT}: {e}"))?;
        for name in nodes {
            let mount = ServiceConfig::new("fs-mount", &[&shoal, "fs", "mount", MOUNT]);
            self.put_service(name, mount)?;
        }
        for name in nodes {
            self.until_ok(
                name,
                &["fs", "status"],
                started,
                "the file system's primary",
            )?;
            loop {
                let mounted = self
                    .command(name, "mountpoint")?
                    .args(["-q", MOUNT])
                    .status()
                    .is_ok_and(|s| s.success());
                if mounted {
                    break;
                }
                if started.elapsed() > SYSTEM_WAIT {
                    return Err(format!(
                        "{MOUNT} is not mounted on {name}; see `shoal service logs fs-mount --node {name}`"
                    ));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        progress(&format!(
            "shared file system: {replicas} metadata replicas, mounted at {MOUNT} on {}",
            span("n", nodes.len())
        ));
        Ok(())
    }

    /// Runs `shoal ARGS` on `node` until it succeeds; its output.
    fn until_ok(
        &self,
        node: &str,
        args: &[&str],
        started: Instant,
        what: &str,
    ) -> Result<String, String> {
        loop {
            let out = self
                .command(node, &self.file.shoal)?
                .env("SHOAL_CONFIG_DIR", self.admin_config())
                .args(args)
                .output()
                .map_err(|e| format!("cannot run {}: {e}", self.file.shoal.display()))?;
            if out.status.success() {
                return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
            }
            if started.elapsed() > SYSTEM_WAIT {
                return Err(format!(
                    "waited {} s for {what}: shoal {}: {}",
                    SYSTEM_WAIT.as_secs(),
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// `fs1`, `fs1 and fs2`, `fs1 … fs4`.
fn span(prefix: &str, n: usize) -> String {
    match n {
        1 => format!("{prefix}1"),
        2 => format!("{prefix}1 and {prefix}2"),
        _ => format!("{prefix}1 … {prefix}{n}"),
    }
}
