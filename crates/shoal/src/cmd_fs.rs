//! `shoal fs`: the shared file system.  `serve` runs one replica of a file
//! system's metadata service (`docs/fs.md`); `mount` mounts its tree on
//! this node and serves it until signalled; `umount` takes a mount away;
//! `status` shows the replica that answers.  `cap` prints the capability
//! of a file found by path (its `user.shoal.cap` attribute), and `stat`
//! and `cat` use one, on any node and as any user, without a mount;
//! `revoke` makes every capability of a file minted so far useless.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use shoal_cap::Capability;
use shoal_fssvc::{FsClient, FsConfig, MetaReplica};

use crate::Failure;
use crate::cmd_dir::{Common, ReplicaArgs, Session, attach, serve_replica, until_signalled};

#[derive(Subcommand)]
pub enum FsCommand {
    /// Run one replica of a file system's metadata service (as root, on
    /// each of n nodes; the replica that is the group's sequencer is the
    /// primary, which answers the mounts).
    Serve(ServeArgs),
    /// Mount the tree at PATH on this node (as root) and serve it until
    /// SIGTERM or SIGINT, which unmount it and write back what the node
    /// holds (a second signal abandons that).  A node daemon keeps it as
    /// a service (`shoal cluster up` mounts /shoal on every node).
    Mount {
        /// Where to mount it.
        #[arg(default_value = "/shoal")]
        path: PathBuf,
        /// The file system's name.
        #[arg(long, default_value = shoal_fssvc::DEFAULT_SERVICE)]
        service: String,
        /// How long written data may stay in this node's memory before it
        /// is written back to the file servers (a crash of the node loses
        /// at most this much that was not fsynced).
        #[arg(long, default_value_t = shoal_fuse::WRITE_BACK_SECS, value_parser = clap::value_parser!(u64).range(1..=3600))]
        write_back_secs: u64,
        /// Dirty MiB, in all files, past which a write waits for its
        /// file's write-back (default: an eighth of the node's memory).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
        dirty_mib: Option<u64>,
        /// Be served through /dev/fuse even where the kernel has FUSE over
        /// io_uring (which a mount by root otherwise turns on and uses).
        #[arg(long)]
        no_uring: bool,
        /// Keep the mount's threads at normal CPU priority.  By default
        /// they yield the CPU to programs (SCHED_IDLE), so that a program
        /// woken by an answer resumes on its own CPU, where the mount is
        /// a scheduling group of its own: alone in a session without a
        /// terminal (as a node daemon's service runs it) on a kernel that
        /// groups processes by session.
        #[arg(long)]
        no_yield: bool,
    },
    /// Unmount the tree at PATH (also one whose client died).
    Umount {
        #[arg(default_value = "/shoal")]
        path: PathBuf,
    },
    /// Print the capability of the file or directory at PATH (its
    /// user.shoal.cap attribute), with the rights your permissions give:
    /// r if you may read it, w if you may write it, a if you own it.
    Cap { path: PathBuf },
    /// Revoke every capability of the file or directory at PATH, minted
    /// by anyone (`user.shoal.cap`, removed): it gets a new secret, and
    /// only capabilities minted from now on work.  Its owner or root only.  A
    /// chmod that clears a permission bit, or a chown or chgrp, revokes
    /// them too.
    Revoke { path: PathBuf },
    /// Show the attributes of the inode a capability names (no mount
    /// needed: any program holding the capability may).  CAP may be `-`
    /// (read from standard input) or @FILE, to keep it off the command
    /// line.
    Stat {
        #[arg(value_parser = crate::cli::secret::<Capability>)]
        cap: Capability,
    },
    /// Write the bytes of the file a capability with the r right names to
    /// standard output: its latest bytes, whichever node wrote them.  CAP
    /// may be `-` (read from standard input) or @FILE.
    Cat {
        #[arg(value_parser = crate::cli::secret::<Capability>)]
        cap: Capability,
    },
    /// Show the status of the metadata replica that answers (JSON).
    Status {
        /// The file system's name.
        #[arg(long, default_value = shoal_fssvc::DEFAULT_SERVICE)]
        service: String,
    },
}

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    replica: ReplicaArgs,
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
    #[command(flatten)]
    common: Common,
}

pub fn run(cmd: FsCommand) -> Result<(), Failure> {
    match cmd {
        FsCommand::Serve(args) => serve(args),
        FsCommand::Mount {
            path,
            service,
            write_back_secs,
            dirty_mib,
            no_uring,
            no_yield,
        } => {
            let tuning = shoal_fuse::Tuning {
                write_back_after: std::time::Duration::from_secs(write_back_secs),
                dirty_max: dirty_mib.map_or_else(shoal_fuse::default_dirty_max, |m| m << 20),
                uring: !no_uring,
            };
            mount(&path, &service, tuning, !no_yield)
        }
        FsCommand::Umount { path } => umount(&path),
        FsCommand::Revoke { path } => {
            xattr::remove(&path, "user.shoal.cap").map_err(|e| {
                Failure::failed(format!(
                    "{}: {e} (only its owner or root may revoke its capabilities, in a shoal file system)",
                    path.display()
                ))
            })?;
            eprintln!("{}: every earlier capability revoked", path.display());
            Ok(())
        }
        FsCommand::Cap { path } => {
            let value = xattr::get(&path, "user.shoal.cap")
                .map_err(|e| Failure::failed(format!("{}: {e}", path.display())))?
                .ok_or_else(|| {
                    Failure::failed(format!(
                        "{}: no capability (not in a shoal file system?)",
                        path.display()
                    ))
                })?;
            println!("{}", String::from_utf8_lossy(&value));
            Ok(())
        }
        FsCommand::Stat { cap } => {
            let attr = cap_client(&cap)?.cap_stat(&cap).map_err(cap_failure)?;
            println!("inode    {}", attr.ino);
            println!("kind     {:?}", attr.kind);
            println!("mode     {:04o}", attr.perm);
            println!("links    {}", attr.nlink);
            println!("owner    {}:{}", attr.uid, attr.gid);
            println!("size     {}", attr.size);
            println!("mtime    {}.{:09}", attr.mtime.secs, attr.mtime.nanos);
            println!("ctime    {}.{:09}", attr.ctime.secs, attr.ctime.nanos);
            println!("version  {}", attr.version);
            println!("rights   {}", cap.rights());
            Ok(())
        }
        FsCommand::Cat { cap } => cat(&cap),
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

/// A caller, by capability, of the file system that made `cap`.
fn cap_client(cap: &Capability) -> Result<FsClient, Failure> {
    FsClient::for_capability(&attach()?, cap).map_err(|e| Failure::unreachable(e.to_string()))
}

/// What the file system answered, as the command's failure.
fn cap_failure(e: shoal_fs::op::Failure) -> Failure {
    match e {
        shoal_fs::op::Failure::Fs(e) => Failure::failed(e.to_string()),
        e => Failure::unreachable(e.to_string()),
    }
}

/// `shoal fs cat`: the file's bytes, 1 MiB a call, to standard output.
fn cat(cap: &Capability) -> Result<(), Failure> {
    use std::io::Write;
    let mut client = cap_client(cap)?;
    let mut out = std::io::stdout().lock();
    let mut offset = 0u64;
    loop {
        let chunk = client
            .cap_read(cap, offset, shoal_fs::op::IO_MAX as u32)
            .map_err(cap_failure)?;
        if chunk.is_empty() {
            break;
        }
        offset += chunk.len() as u64;
        out.write_all(&chunk)
            .map_err(|e| Failure::failed(format!("standard output: {e}")))?;
    }
    out.flush()
        .map_err(|e| Failure::failed(format!("standard output: {e}")))
}

/// Whether `path` is a mount whose FUSE client is gone ("transport
/// endpoint is not connected").  Asked with `statfs`, which the kernel
/// always passes to the client: a `stat` may be answered from the
/// attributes the dead client let the kernel keep.
fn is_dead_mount(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statvfs is a plain C struct, for which zero is a value.
    let mut buf: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs writes only into `buf`; `c` is a C string.
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut buf) };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOTCONN)
}

fn umount(path: &Path) -> Result<(), Failure> {
    let out = std::process::Command::new("umount")
        .arg("--lazy")
        .arg(path)
        .output()
        .map_err(|e| Failure::failed(format!("cannot run umount: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Failure::failed(format!(
            "cannot unmount {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn mount(
    path: &Path,
    service: &str,
    tuning: shoal_fuse::Tuning,
    yield_cpu: bool,
) -> Result<(), Failure> {
    if is_dead_mount(path) {
        eprintln!(
            "{} is a mount whose client died: unmounting it first",
            path.display()
        );
        umount(path)?;
    }
    if !path.is_dir() {
        return Err(Failure::failed(format!(
            "{} is not a directory: make it first (mkdir -p {})",
            path.display(),
            path.display()
        )));
    }
    // Before any thread starts: the allocator's arenas are made then.
    let kept = shoal_fuse::keep_freed_buffers();
    let ctx = attach()?;
    let node = ctx
        .config()
        .node
        .as_ref()
        .map(|n| n.1.clone())
        .unwrap_or_else(|| "?".into());
    let mount =
        shoal_fuse::Mount::start(&ctx, service, &node, path, tuning).map_err(Failure::failed)?;
    // Every thread the mount has started by now is set; those it starts
    // later inherit the policy.
    let priority = if !yield_cpu {
        "at normal CPU priority (--no-yield)".to_string()
    } else {
        match crate::yielding::may_yield().and_then(|()| crate::yielding::yield_cpu()) {
            Ok(_) => "its threads yield the CPU to programs".to_string(),
            Err(e) => format!("at normal CPU priority: {e}"),
        }
    };
    eprintln!(
        "file system {service} mounted at {} ({}; {priority}; {})",
        path.display(),
        mount.transport(),
        if kept {
            format!(
                "freed buffers kept for the next writes until {} s without dirty data",
                shoal_fuse::RETAIN.as_secs()
            )
        } else {
            "freed buffers returned at once (not a GNU C library)".to_string()
        }
    );
    until_signalled(|| true, ("serving the tree until SIGTERM", ""))?;
    eprintln!(
        "unmounting {} and writing back what this node still holds (a second SIGTERM or SIGINT abandons that)",
        path.display()
    );
    mount.stop().map_err(Failure::failed)?;
    eprintln!("unmounted {}", path.display());
    Ok(())
}

fn serve(args: ServeArgs) -> Result<(), Failure> {
    let r = &args.replica;
    r.check()?;
    if args.copies == 0 {
        return Err(Failure::failed("--copies must be at least 1"));
    }
    let mut s = Session::open(&args.common)?;
    let file_servers = if args.file_servers.is_empty() {
        shoal_bulletsvc::manager::servers(&mut s.dir, &s.root)
            .map_err(|e| Failure::failed(format!("cannot list the file servers: {e}")))?
            .into_iter()
            .map(|(_, cap)| cap)
            .collect()
    } else {
        args.file_servers
    };
    // The object manager's passes must touch the tree's contents, which
    // no directory names, before they age anything.
    let cluster = attach()?.config().cluster;
    let port = shoal_fssvc::service_port(&cluster, &args.service).put_port();
    shoal_bulletsvc::manager::register_tree(&mut s.dir, &s.root, &args.service, port).map_err(
        |e| {
            Failure::failed(format!(
                "cannot register file system {} under {}: {e}",
                args.service,
                shoal_bulletsvc::manager::TREES_DIR
            ))
        },
    )?;
    if file_servers.len() < args.copies {
        return Err(Failure::failed(format!(
            "{} file servers for {} copies: start more (`shoal file serve`) or pass --copies",
            file_servers.len(),
            args.copies
        )));
    }
    let ctx = attach()?;
    let mut cfg = FsConfig::new(&args.service, r.replica, r.replicas, r.data.clone());
    r.apply(&mut cfg.replica);
    cfg.allow_root = args.allow_root;
    cfg.file_servers = file_servers;
    cfg.copies = args.copies;
    let replica = MetaReplica::start(ctx, cfg).map_err(|e| Failure::failed(e.to_string()))?;
    let what = format!("file system {} metadata", args.service);
    serve_replica(&what, r, replica.port(), || replica.is_serving())?;
    replica.stop();
    Ok(())
}
