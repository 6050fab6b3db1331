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
//! ```
//!
//! The directory comes first; once it serves, the root is made, and the
//! file servers, which register in it, follow.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use shoal_node::{NodeConfigFile, ServiceConfig};

use crate::Cluster;

/// How long the directory and the file servers have to come up.
const SYSTEM_WAIT: Duration = Duration::from_secs(90);

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
        let shoal = self.file.shoal.to_string_lossy().into_owned();
        let nodes: Vec<String> = self.file.nodes.iter().map(|n| n.name.clone()).collect();
        // A process group needs two members: one node runs two replicas.
        let replicas = nodes.len().clamp(2, 3);
        let mut homes = Vec::new();
        for i in 0..replicas {
            let name = &nodes[i % nodes.len()];
            homes.push(name.as_str());
            let data = self.node(name)?.state_dir.join(format!("dir-r{i}"));
            let mut dir = ServiceConfig::new(
                &format!("dir-r{i}"),
                &[
                    &shoal,
                    "dir",
                    "serve",
                    "--replica",
                    &i.to_string(),
                    "--replicas",
                    &replicas.to_string(),
                    "--durability",
                    "replicated",
                    "--data",
                    &data.to_string_lossy(),
                ],
            );
            dir.system = true;
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
            shoal_rpc::private::dir(&config, false)?;
            self.until_ok(&nodes[0], &["init"], started, "the directory to serve")?;
        }
        progress(&format!(
            "root directory made (saved in {})",
            config.display()
        ));
        for (k, name) in nodes.iter().enumerate() {
            let data = self.node(name)?.state_dir.join("files");
            let mut file = ServiceConfig::new(
                "file",
                &[
                    &shoal,
                    "file",
                    "serve",
                    "--name",
                    &format!("fs{}", k + 1),
                    "--data",
                    &data.to_string_lossy(),
                ],
            );
            file.env.insert(
                "SHOAL_CONFIG_DIR".into(),
                config.to_string_lossy().into_owned(),
            );
            self.put_service(name, file)?;
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
            "file servers {} on {}",
            span("fs", nodes.len()),
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
