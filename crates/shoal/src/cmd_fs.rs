//! `shoal fs`: the shared file system.  `serve` runs one replica of a file
//! system's metadata service (`docs/fs.md`); `status` shows the replica
//! that answers.  Mounting comes with the file system's client.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use shoal_cap::Capability;
use shoal_fssvc::{FsClient, FsConfig, MetaReplica};
use shoal_replicasvc::Durability;

use crate::Failure;
use crate::cmd_dir::{Common, Session, attach, until_signalled};

#[derive(Subcommand)]
pub enum FsCommand {
    /// Run one replica of a file system's metadata service (as root, on
    /// each of n nodes; the replica that is the group's sequencer is the
    /// primary, which answers the mounts).
    Serve(ServeArgs),
    /// Show the status of the metadata replica that answers (JSON).
    Status {
        /// The file system's name.
        #[arg(long, default_value = shoal_fssvc::DEFAULT_SERVICE)]
        service: String,
    },
}

#[derive(Args)]
pub struct ServeArgs {
    /// This replica's number (0-based).
    #[arg(long)]
    replica: usize,
    /// Number of replicas of the service.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Resilience degree (default: replicas − 1).
    #[arg(long, short = 'r')]
    resilience: Option<usize>,
    /// fsync (each replica syncs its log before answering) or replicated
    /// (answer once r + 1 replicas hold the update; flush in the
    /// background).
    #[arg(long, default_value = "fsync")]
    durability: Durability,
    /// Data directory (snapshot and logs).
    #[arg(long)]
    data: PathBuf,
    /// The file system's name (a cluster can run several).
    #[arg(long, default_value = shoal_fssvc::DEFAULT_SERVICE)]
    service: String,
    /// A file server to keep file contents on (its capability, as `shoal
    /// file servers` shows it); repeat for more.  Default: the servers
    /// registered in the directory under your root.
    #[arg(long = "file-server")]
    file_servers: Vec<Capability>,
    /// On how many file servers each version of a file is kept.
    #[arg(long, default_value_t = 2)]
    copies: usize,
    /// Let root on a client node act as root in the tree (otherwise root
    /// is squashed to nobody, as NFS's root_squash).
    #[arg(long)]
    allow_root: bool,
    /// Log flush interval of the replicated mode, in milliseconds.
    #[arg(long, default_value_t = 500)]
    flush_ms: u64,
    /// Log size (bytes) that triggers a snapshot.
    #[arg(long, default_value_t = 8 << 20)]
    snapshot_bytes: u64,
    /// RPC server threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[command(flatten)]
    common: Common,
}

pub fn run(cmd: FsCommand) -> Result<(), Failure> {
    match cmd {
        FsCommand::Serve(args) => serve(args),
        FsCommand::Status { service } => {
            let ctx = attach()?;
            let mut client =
                FsClient::new(&ctx, &service).map_err(|e| Failure::unreachable(e.to_string()))?;
            let status = client
                .status()
                .map_err(|e| Failure::unreachable(e.to_string()))?;
            println!(
                "{}",
                serde_json::to_string_pretty(&status).unwrap_or_default()
            );
            Ok(())
        }
    }
}

fn serve(args: ServeArgs) -> Result<(), Failure> {
    if args.replica >= args.replicas {
        return Err(Failure::failed(format!(
            "--replica {} is out of range: replicas are numbered 0 to {}",
            args.replica,
            args.replicas.saturating_sub(1)
        )));
    }
    if args.copies == 0 {
        return Err(Failure::failed("--copies must be at least 1"));
    }
    let file_servers = if args.file_servers.is_empty() {
        let mut s = Session::open(&args.common)?;
        shoal_filesvc::manager::servers(&mut s.dir, &s.root)
            .map_err(|e| Failure::failed(format!("cannot list the file servers: {e}")))?
            .into_iter()
            .map(|(_, cap)| cap)
            .collect()
    } else {
        args.file_servers
    };
    if file_servers.len() < args.copies {
        return Err(Failure::failed(format!(
            "{} file servers for {} copies: start more (`shoal file serve`) or pass --copies",
            file_servers.len(),
            args.copies
        )));
    }
    let ctx = attach()?;
    let mut cfg = FsConfig::new(&args.service, args.replica, args.replicas, args.data);
    cfg.replica.resilience = args.resilience;
    cfg.replica.durability = args.durability;
    cfg.replica.flush_interval = Duration::from_millis(args.flush_ms.max(1));
    cfg.replica.snapshot_bytes = args.snapshot_bytes;
    cfg.replica.threads = args.threads;
    cfg.allow_root = args.allow_root;
    cfg.file_servers = file_servers;
    cfg.copies = args.copies;
    let replica = MetaReplica::start(ctx, cfg).map_err(|e| Failure::failed(e.to_string()))?;
    eprintln!(
        "file system {} metadata replica {} of {} serving {} ({} durability)",
        args.service,
        args.replica,
        args.replicas,
        replica.port(),
        args.durability
    );
    until_signalled(
        || replica.is_serving(),
        (
            "in the replica group: serving",
            "out of the replica group: not serving",
        ),
    )?;
    replica.stop();
    Ok(())
}
