//! shoal's shared file system metadata service (`docs/fs.md`).
//!
//! Replicas of the tree (`shoal_fs::replica::FsReplica`) run on the
//! replica shell (`shoal_replicasvc`): n replicas in a process group with
//! resilience r, each with its log and snapshots.  The replica whose group
//! member is the sequencer is the **primary**: it alone answers the
//! clients (the mounts), because it alone holds the soft state of opens,
//! tokens and leases ([`primary`]); the others answer "not the primary"
//! and take over when its machine fails.  [`client::FsClient`] is what a
//! mount uses to call it.

#![deny(unsafe_code)]

pub mod client;
pub mod primary;
pub mod store;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use shoal_cap::{Capability, PutPort};
use shoal_fs::replica::FsReplica;
use shoal_replicasvc::{Ports, Replica};
use shoal_rpc::Context;

pub use client::FsClient;

/// What a file service error means to the tree's clients: contents no
/// file server holds any more (every replica missing or corrupt) are an
/// input/output error, said in the log, at once; anything else (a server
/// that does not answer) may pass, and is tried again.
pub fn files_failure(e: shoal_bulletsvc::ClientError) -> shoal_fs::op::Failure {
    use shoal_fs::op::Failure;
    if e.is_gone() {
        tracing::error!("a file's contents are on no file server: {e}");
        Failure::Fs(shoal_fs::FsError::Io)
    } else {
        Failure::Unavailable(format!("file servers: {e}"))
    }
}

/// The name of a cluster's default file system.
pub const DEFAULT_SERVICE: &str = "fs";

/// The metadata service of file system `name`, a system port: every
/// replica serves it (replicas run as root) and a non-primary one sends
/// the client on.
pub fn service_port(cluster: &[u8; 16], name: &str) -> shoal_rpc::Service {
    shoal_rpc::system_port(cluster, &format!("file system metadata {name}"))
}

/// The port on which replica `i` of file system `name` answers its peers.
pub fn peer_port(cluster: &[u8; 16], name: &str, i: usize) -> shoal_rpc::Service {
    shoal_rpc::system_port(cluster, &format!("file system metadata peer {name} {i}"))
}

/// How a metadata replica runs.
#[derive(Debug, Clone)]
pub struct FsConfig {
    /// The replica shell's settings (`service` is the file system's name).
    pub replica: shoal_replicasvc::Config,
    /// Whether root on a client node acts as root in the tree (local
    /// clusters); otherwise root is squashed to `nobody`, as NFS does.
    pub allow_root: bool,
    /// The file servers that keep file contents (the primary writes a
    /// write-shared file's bytes there before it is cached again).
    pub file_servers: Vec<Capability>,
    /// On how many of them each version is kept.
    pub copies: usize,
}

impl FsConfig {
    /// Defaults for replica `replica` of `replicas` of file system `name`.
    pub fn new(name: &str, replica: usize, replicas: usize, data: std::path::PathBuf) -> FsConfig {
        FsConfig {
            replica: shoal_replicasvc::Config::new(name, replica, replicas, data),
            allow_root: false,
            file_servers: Vec::new(),
            copies: 2,
        }
    }
}

/// A running metadata replica.
pub struct MetaReplica {
    replica: Replica<FsReplica>,
    primary: Arc<primary::Primary>,
    timer: Option<JoinHandle<()>>,
}

impl MetaReplica {
    /// Recovers from the data directory and starts the replica.
    pub fn start(ctx: Context, cfg: FsConfig) -> std::io::Result<MetaReplica> {
        let cluster = ctx.config().cluster;
        let name = cfg.replica.service.clone();
        let ports = Ports {
            service: service_port(&cluster, &name),
            peers: (0..cfg.replica.replicas)
                .map(|i| peer_port(&cluster, &name, i))
                .collect(),
        };
        let primary = Arc::new(primary::Primary::new(&ctx, &cfg, ports.service.put_port()));
        let replica = Replica::start(ctx, cfg.replica, ports, primary.clone())?;
        let timer = {
            let (p, shared) = (primary.clone(), replica.shared().clone());
            std::thread::Builder::new()
                .name(format!("{name}-leases"))
                .spawn(move || {
                    while !shared.is_stopping() && !p.is_stopped() {
                        p.tick(&shared);
                        std::thread::sleep(Duration::from_millis(100));
                    }
                })?
        };
        Ok(MetaReplica {
            replica,
            primary,
            timer: Some(timer),
        })
    }

    /// The service's port.
    pub fn port(&self) -> PutPort {
        self.replica.port()
    }

    /// The replica's status as JSON.
    pub fn status(&self) -> serde_json::Value {
        self.primary.status(self.replica.shared(), true)
    }

    /// Whether the replica is in its group and serving.
    pub fn is_serving(&self) -> bool {
        self.replica.is_serving()
    }

    /// Flushes the log, leaves the group and stops.
    pub fn stop(mut self) {
        self.primary.stop();
        if let Some(t) = self.timer.take() {
            let _ = t.join();
        }
        self.replica.stop();
    }
}
