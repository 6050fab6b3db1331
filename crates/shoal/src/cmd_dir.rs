//! `shoal dir ...` and `shoal init`: the directory service from the shell.
//!
//! Paths are names separated by `/`, looked up from the user's root
//! directory (`shoal init` creates it and keeps its capability in
//! `$SHOAL_CONFIG_DIR/root`, by default `~/.config/shoal/root`), or from
//! `--root CAP`.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use shoal_cap::{Capability, Rights};
use shoal_dir::DirError;
use shoal_dirsvc::{ClientError, DirClient, Durability, Replica};
use shoal_rpc::Context;

use crate::Failure;

#[derive(Subcommand)]
pub enum DirCommand {
    /// Run one replica of a directory service (until SIGTERM or SIGINT).
    Serve(ServeArgs),
    /// Show the status of the replica that answers, or with --all a table
    /// of every replica (as each sees itself).
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Ask every replica (through its peer port).
        #[arg(long)]
        all: bool,
        /// How many replicas the service has (with --all).
        #[arg(long, default_value_t = 3)]
        replicas: usize,
        /// Service name.
        #[arg(long, default_value = shoal_dirsvc::DEFAULT_SERVICE)]
        service: String,
    },
    /// Create a directory and enter it under PATH.
    Mkdir {
        path: OsString,
        /// Column names of the new directory.
        #[arg(long, value_delimiter = ',', default_value = "owner,group,other")]
        columns: Vec<String>,
        #[command(flatten)]
        common: Common,
    },
    /// List a directory: names and their column masks.
    Ls {
        /// The directory (default: the root).
        path: Option<OsString>,
        /// Print JSON: `{"columns": [...], "rows": [{"name", "masks"}]}`,
        /// each mask as `ls` shows it.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Print the capabilities stored under PATH (one per line), restricted
    /// to what your columns allow.
    Lookup {
        path: OsString,
        #[command(flatten)]
        common: Common,
    },
    /// Enter capabilities under PATH (the name must be new).
    Put {
        path: OsString,
        /// The capabilities (cap1:...), one per replica of the object.
        #[arg(required = true)]
        caps: Vec<Capability>,
        /// Column masks, comma-separated ("rwcdax67" letters or 0xNN);
        /// default: all for the first column, read for the others.
        #[arg(long, value_delimiter = ',')]
        masks: Option<Vec<Rights>>,
        #[command(flatten)]
        common: Common,
    },
    /// Remove the name PATH (with --dir, also delete the empty directory it
    /// names).
    Rm {
        path: OsString,
        /// Also delete the directory the name refers to (must be empty).
        #[arg(long, short = 'd')]
        dir: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Set the column masks of PATH.
    Chmod {
        path: OsString,
        /// Masks, comma-separated, one per column.
        #[arg(value_delimiter = ',', required = true)]
        masks: Vec<Rights>,
        #[command(flatten)]
        common: Common,
    },
    /// Move FROM to TO atomically (both paths from the root).
    Mv {
        from: OsString,
        to: OsString,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Args, Default, Clone)]
pub struct Common {
    /// Start paths at this directory capability instead of your root
    /// (or `-`, read from standard input, or @FILE, to keep it off the
    /// command line).
    #[arg(long, global = true, value_parser = crate::cli::secret::<Capability>)]
    pub root: Option<Capability>,
    /// Read from whichever replica answers without first ordering a
    /// read marker through the group: faster, but a read may miss a write
    /// another process made in the last moments.  (By default every read
    /// is linearizable: it sees every write completed before it began, by
    /// anyone.)
    #[arg(long, global = true)]
    pub any_replica: bool,
}

#[derive(Args)]
pub struct ServeArgs {
    /// Service name (a cluster can run several directory services).
    #[arg(long, default_value = shoal_dirsvc::DEFAULT_SERVICE)]
    service: String,
    #[command(flatten)]
    replica: ReplicaArgs,
}

/// The settings of one replica of a replicated service (the directory's,
/// a file system's metadata), shared by their `serve` commands.
#[derive(Args)]
pub struct ReplicaArgs {
    /// This replica's number (0-based).
    #[arg(long)]
    pub replica: usize,
    /// Number of replicas of the service.
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// Resilience degree (default: replicas − 1).
    #[arg(long, short = 'r')]
    resilience: Option<usize>,
    /// fsync (each replica syncs its log before answering) or replicated
    /// (answer once r + 1 replicas hold the update; flush in the
    /// background).
    #[arg(long, default_value = "fsync")]
    pub durability: Durability,
    /// Data directory (snapshot and logs).
    #[arg(long)]
    pub data: PathBuf,
    /// Log flush interval of the replicated mode, in milliseconds.
    #[arg(long, default_value_t = 500)]
    flush_ms: u64,
    /// Log size (bytes) that triggers a snapshot.
    #[arg(long, default_value_t = 8 << 20)]
    snapshot_bytes: u64,
    /// RPC server threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

impl ReplicaArgs {
    /// Fails unless `--replica` names one of the replicas.
    pub fn check(&self) -> Result<(), Failure> {
        if self.replica >= self.replicas {
            return Err(Failure::failed(format!(
                "--replica {} is out of range: replicas are numbered 0 to {}",
                self.replica,
                self.replicas.saturating_sub(1)
            )));
        }
        Ok(())
    }

    /// Sets the replica shell's settings that the flags give.
    pub fn apply(&self, cfg: &mut shoal_replicasvc::Config) {
        cfg.resilience = self.resilience;
        cfg.durability = self.durability;
        cfg.flush_interval = Duration::from_millis(self.flush_ms.max(1));
        cfg.snapshot_bytes = self.snapshot_bytes;
        cfg.threads = self.threads;
    }
}

pub fn attach() -> Result<Context, Failure> {
    Context::from_env().map_err(|e| Failure::unreachable(e.to_string()))
}

pub fn client_failure(e: ClientError) -> Failure {
    match e {
        ClientError::Unreachable(_) => Failure::unreachable(e.to_string()),
        e => Failure::failed(e.to_string()),
    }
}

/// The user's configuration directory.
pub fn config_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SHOAL_CONFIG_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CONFIG_HOME") {
        return PathBuf::from(d).join("shoal");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".config/shoal")
}

pub fn root_file() -> PathBuf {
    config_dir().join("root")
}

pub fn load_root(common: &Common) -> Result<Capability, Failure> {
    if let Some(c) = common.root {
        return Ok(c);
    }
    let path = root_file();
    if !path.exists() {
        return Err(Failure::failed(format!(
            "no root directory ({} does not exist); run `shoal init` first, or pass --root",
            path.display()
        )));
    }
    // An all-rights capability: only its owner may read it.
    let bytes = shoal_rpc::secrets::read(&path).map_err(Failure::failed)?;
    String::from_utf8_lossy(&bytes)
        .trim()
        .parse()
        .map_err(|e| Failure::failed(format!("{}: {e}", path.display())))
}

/// `shoal dir status --all`: each replica's own status, through its peer
/// port.  Exits 3 if one does not answer.
fn status_all(ctx: &Context, service: &str, replicas: usize, json: bool) -> Result<(), Failure> {
    let mut client = ctx
        .client()
        .map_err(|e| Failure::unreachable(e.to_string()))?;
    let opts = shoal_rpc::CallOptions {
        deadline: Some(Duration::from_secs(1)),
        cancel: None,
    };
    if !json {
        println!(
            "{:<8} {:<8} {:>10} {:>10} {:>10} {:>6} {:>8} {:>8}",
            "REPLICA", "PHASE", "GENERATION", "INDEX", "DURABLE", "DIRS", "ROWS", "WRITES"
        );
    }
    let mut missing = 0;
    for i in 0..replicas {
        let port = shoal_dirsvc::peer_port(&ctx.config().cluster, service, i).put_port();
        let answer = client
            .trans_with(&port, Vec::new(), &opts)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
        match (answer, json) {
            (Some(s), true) => println!("{s}"),
            (Some(s), false) => {
                let n = |k: &str| s[k].to_string();
                println!(
                    "{:<8} {:<8} {:>10} {:>10} {:>10} {:>6} {:>8} {:>8}",
                    i,
                    s["phase"].as_str().unwrap_or("?"),
                    n("generation"),
                    n("index"),
                    n("durable_index"),
                    n("directories"),
                    n("rows"),
                    n("writes")
                )
            }
            (None, _) => {
                missing += 1;
                if !json {
                    println!("{i:<8} {:<8} (no answer)", "-");
                }
            }
        }
    }
    if missing > 0 {
        return Err(Failure::unreachable(format!(
            "{missing} of {replicas} replicas did not answer"
        )));
    }
    Ok(())
}

/// Splits `a/b/c` into (`a/b`, `c`).
fn split(path: &[u8]) -> (&[u8], &[u8]) {
    let trimmed = path.strip_suffix(b"/").unwrap_or(path);
    match trimmed.iter().rposition(|&b| b == b'/') {
        Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
        None => (&[], trimmed),
    }
}

pub struct Session {
    pub dir: DirClient,
    pub root: Capability,
}

impl Session {
    pub fn open(common: &Common) -> Result<Session, Failure> {
        let root = load_root(common)?;
        let ctx = attach()?;
        let mut dir = DirClient::with_port(&ctx, root.port()).map_err(client_failure)?;
        dir.linearizable(!common.any_replica);
        Ok(Session { dir, root })
    }

    /// The directory capability at `path` (the root if empty).
    pub fn resolve_dir(&mut self, path: &[u8]) -> Result<Capability, Failure> {
        if path.iter().all(|&b| b == b'/') {
            return Ok(self.root);
        }
        let caps = self
            .dir
            .call(shoal_dir::Op::PathLookup {
                dir: self.root,
                path: path.to_vec(),
            })
            .map_err(client_failure)?;
        let shoal_dir::Answer::Caps(caps) = caps else {
            return Err(Failure::failed("unexpected answer"));
        };
        caps.into_iter()
            .find(|c| c.port() == self.root.port())
            .ok_or_else(|| {
                Failure::failed(format!(
                    "{} is not a directory of this service",
                    String::from_utf8_lossy(path)
                ))
            })
    }

    /// (directory, name) of the last component of `path`.
    pub fn parent(&mut self, path: &[u8]) -> Result<(Capability, Vec<u8>), Failure> {
        let (dir, name) = split(path);
        if name.is_empty() {
            return Err(Failure::failed("the path names no entry"));
        }
        Ok((self.resolve_dir(dir)?, name.to_vec()))
    }
}

fn show_masks(masks: &[Rights]) -> String {
    masks
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn run(command: DirCommand) -> Result<(), Failure> {
    match command {
        DirCommand::Serve(args) => serve(args),
        DirCommand::Status {
            json,
            all,
            replicas,
            service,
        } => {
            let ctx = attach()?;
            if all {
                return status_all(&ctx, &service, replicas, json);
            }
            let port = shoal_dirsvc::service_port(&ctx.config().cluster, &service).put_port();
            let mut dir = DirClient::with_port(&ctx, port).map_err(client_failure)?;
            dir.retry_for(Duration::from_secs(3));
            let s = dir.status().map_err(client_failure)?;
            if json {
                println!("{s}");
            } else {
                for (k, v) in s.as_object().into_iter().flatten() {
                    println!("{k:16} {v}");
                }
            }
            Ok(())
        }
        DirCommand::Mkdir {
            path,
            columns,
            common,
        } => {
            let mut s = Session::open(&common)?;
            let (parent, name) = s.parent(path.as_bytes())?;
            let cols: Vec<&str> = columns.iter().map(String::as_str).collect();
            let new = s.dir.create_dir(&cols).map_err(client_failure)?;
            let masks = shoal_dir::model::directory_masks(
                s.dir.list(&parent).map_err(client_failure)?.columns.len(),
            );
            if let Err(e) = s.dir.append_bytes(&parent, &name, &[new], Some(&masks)) {
                // Do not leave an unnamed directory behind.
                let _ = s.dir.delete_dir(&new);
                return Err(client_failure(e));
            }
            println!("{new}");
            Ok(())
        }
        DirCommand::Ls { path, json, common } => {
            let mut s = Session::open(&common)?;
            let dir = s.resolve_dir(path.as_ref().map(|p| p.as_bytes()).unwrap_or(b""))?;
            let listing = s.dir.list(&dir).map_err(client_failure)?;
            if json {
                let rows: Vec<serde_json::Value> = listing
                    .rows
                    .iter()
                    .map(|(name, masks)| {
                        let masks: Vec<String> = masks.iter().map(ToString::to_string).collect();
                        serde_json::json!({ "name": name, "masks": masks })
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({ "columns": listing.columns, "rows": rows })
                );
                return Ok(());
            }
            println!("# {}", listing.columns.join(" "));
            for (name, masks) in listing.rows {
                println!("{}  {name}", show_masks(&masks));
            }
            Ok(())
        }
        DirCommand::Lookup { path, common } => {
            let mut s = Session::open(&common)?;
            let (dir, name) = s.parent(path.as_bytes())?;
            for cap in s.dir.lookup_bytes(&dir, &name).map_err(client_failure)? {
                println!("{cap}");
            }
            Ok(())
        }
        DirCommand::Put {
            path,
            caps,
            masks,
            common,
        } => {
            let mut s = Session::open(&common)?;
            let (dir, name) = s.parent(path.as_bytes())?;
            s.dir
                .append_bytes(&dir, &name, &caps, masks.as_deref())
                .map_err(client_failure)
        }
        DirCommand::Rm { path, dir, common } => {
            let mut s = Session::open(&common)?;
            let (parent, name) = s.parent(path.as_bytes())?;
            if dir {
                let target = s.resolve_dir(path.as_bytes())?;
                s.dir.delete_dir(&target).map_err(client_failure)?;
            }
            s.dir.delete(&parent, name).map_err(client_failure)
        }
        DirCommand::Chmod {
            path,
            masks,
            common,
        } => {
            let mut s = Session::open(&common)?;
            let (dir, name) = s.parent(path.as_bytes())?;
            s.dir.chmod(&dir, name, &masks).map_err(client_failure)
        }
        DirCommand::Mv { from, to, common } => {
            let mut s = Session::open(&common)?;
            let (fdir, fname) = s.parent(from.as_bytes())?;
            let (tdir, tname) = s.parent(to.as_bytes())?;
            s.dir
                .rename(&fdir, fname, &tdir, tname)
                .map_err(|e| match e {
                    ClientError::Dir(DirError::Conflict(n)) => Failure::failed(format!(
                        "{n:?} changed while it was being moved, or your columns do not show its full capabilities; nothing was moved"
                    )),
                    e => client_failure(e),
                })
        }
    }
}

fn serve(args: ServeArgs) -> Result<(), Failure> {
    let r = &args.replica;
    if r.replicas < 2 {
        return Err(Failure::failed(
            "a directory service needs at least 2 replicas",
        ));
    }
    r.check()?;
    let ctx = attach()?;
    let mut cfg = shoal_dirsvc::replica::config(r.replica, r.replicas, r.data.clone());
    cfg.service = args.service.clone();
    r.apply(&mut cfg);
    let replica = Replica::start(ctx, cfg).map_err(|e| Failure::failed(e.to_string()))?;
    serve_replica("directory", r, replica.port(), || replica.is_serving())?;
    replica.stop();
    Ok(())
}

/// Says that replica `r` of `what` serves `port`, then waits for SIGTERM
/// or SIGINT, saying when it joins or leaves its replica group.
pub fn serve_replica(
    what: &str,
    r: &ReplicaArgs,
    port: impl std::fmt::Display,
    serving: impl Fn() -> bool,
) -> Result<(), Failure> {
    eprintln!(
        "{what} replica {} of {} serving {port} ({} durability)",
        r.replica, r.replicas, r.durability
    );
    until_signalled(
        serving,
        (
            "in the replica group: serving",
            "out of the replica group: not serving",
        ),
    )
}

/// Waits for SIGTERM or SIGINT, saying when `serving` changes; a second
/// one, during the stop the caller makes then, ends the process at once.
pub fn until_signalled(serving: impl Fn() -> bool, (on, off): (&str, &str)) -> Result<(), Failure> {
    let term = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        // A second signal ends the process at once (exit status 1),
        // abandoning the orderly stop the first one began; registered
        // first, so that the first signal only sets the flag.
        signal_hook::flag::register_conditional_shutdown(sig, 1, term.clone())
            .map_err(|e| Failure::failed(e.to_string()))?;
        signal_hook::flag::register(sig, term.clone())
            .map_err(|e| Failure::failed(e.to_string()))?;
    }
    let mut was = false;
    while !term.load(std::sync::atomic::Ordering::Relaxed) {
        let now = serving();
        if now != was {
            eprintln!("{}", if now { on } else { off });
            was = now;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
