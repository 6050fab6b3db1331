//! `shoal file ...`: the immutable file service from the shell.
//!
//! Files are named by paths of the directory service (as `shoal dir`
//! does, from your root or `--root`); an entry holds one capability per
//! replica.  `put` stores a file on k file servers (default 2) and names
//! it; `get`/`cat` read it from whichever replica answers; `rm` removes
//! the name and destroys the replicas.  The admin commands run on every
//! registered server, or on the one `--server` names.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use shoal_bullet::op::AdminOp;
use shoal_bullet::{Answer, StoreConfig};
use shoal_bulletsvc::manager::{self, PassOptions};
use shoal_bulletsvc::{Cache, ClientError, FileClient, FileServer, ServerConfig};
use shoal_cap::Capability;

use crate::Failure;
use crate::cmd_dir::{Common, Session, attach, client_failure, until_signalled};

mod manage;

#[derive(Subcommand)]
pub enum FileCommand {
    /// Run a file server on a data directory (until SIGTERM or SIGINT),
    /// registered as fileservers/NAME in the root directory.
    Serve(ServeArgs),
    /// Store a file (from SOURCE, or standard input) on k servers and name
    /// it PATH.
    Put {
        path: OsString,
        /// The file to store; `-` or nothing: standard input.
        source: Option<PathBuf>,
        /// Replicas, each on a different server.
        #[arg(long, short = 'k', default_value_t = manager::DEFAULT_REPLICAS)]
        replicas: usize,
        /// Use these servers (by name) instead of the emptiest ones.
        #[arg(long, value_delimiter = ',')]
        servers: Option<Vec<String>>,
        /// Return before the data is on the servers' disks (it is within
        /// a fraction of a second).
        #[arg(long)]
        no_safety: bool,
        /// No progress output.
        #[arg(long, short)]
        quiet: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Copy the file PATH to DEST (default: its name, in the current
    /// directory; `-`: standard output).
    Get {
        path: OsString,
        dest: Option<PathBuf>,
        /// No progress output.
        #[arg(long, short)]
        quiet: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Write the file PATH to standard output.
    Cat {
        path: OsString,
        #[command(flatten)]
        common: Common,
    },
    /// Size, state and replicas of the file PATH.
    Stat {
        path: OsString,
        /// Print JSON: the fields `stat` shows, and each replica's server,
        /// state (`ok` or the error) and capability.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Remove the name PATH and destroy the file's replicas.
    Rm {
        path: OsString,
        #[command(flatten)]
        common: Common,
    },
    /// List the registered file servers and their figures.
    Servers {
        #[command(flatten)]
        common: Common,
    },
    /// Verify every extent's checksum and the metadata of the servers.
    Fsck(AdminArgs),
    /// Move extents to the front of each store and shrink it.
    Compact(AdminArgs),
    /// One object-manager pass: touch every file the directory graph
    /// names, bring each back to k replicas, then age every server (files
    /// nothing names are destroyed once their time-to-live runs out).
    Gc {
        /// Replicas each file should have.
        #[arg(long, short = 'k', default_value_t = manager::DEFAULT_REPLICAS)]
        replicas: usize,
        /// Also read every replica in full; replace those that fail their
        /// checksums.
        #[arg(long)]
        verify: bool,
        /// Do not ask the servers to age their files.
        #[arg(long)]
        no_age: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Run the object manager (until SIGTERM or SIGINT): a pass, ageing,
    /// every `--every` seconds, unless a server aged less than that ago
    /// (another manager's pass). Every node with a file server runs one;
    /// whichever comes first makes the round's pass.
    Manage {
        /// Seconds between passes.
        #[arg(long, default_value_t = 3600)]
        every: u64,
        /// Replicas each file should have.
        #[arg(long, short = 'k', default_value_t = manager::DEFAULT_REPLICAS)]
        replicas: usize,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Args)]
pub struct AdminArgs {
    /// Only this server (by name).
    #[arg(long)]
    server: Option<String>,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
pub struct ServeArgs {
    /// Data directory of the store (formatted if empty).
    #[arg(long)]
    data: PathBuf,
    /// The server's name in fileservers/.
    #[arg(long)]
    name: String,
    /// RPC server threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Memory cache of verified extents, in MiB.
    #[arg(long, default_value_t = 256)]
    cache_mib: u64,
    /// Time-to-live of files, in ageing passes.
    #[arg(long, default_value_t = shoal_bullet::model::DEFAULT_TTL)]
    ttl: u8,
    /// Least seconds between two ageing passes, which object manager
    /// passes ask for once they touched everything named (0: every pass
    /// that asks ages); the server never ages on its own.
    #[arg(long, default_value_t = shoal_bullet::model::DEFAULT_AGE_GAP_SECS)]
    age_secs: u64,
    /// Seconds an uncommitted file lives untouched.
    #[arg(long, default_value_t = shoal_bullet::model::DEFAULT_UNCOMMITTED_SECS)]
    uncommitted_secs: u64,
    /// Do not register in the directory.
    #[arg(long)]
    no_register: bool,
    #[command(flatten)]
    common: Common,
}

/// A file client with the user's cache, `~/.cache/shoal/files` (or under
/// `$XDG_CACHE_HOME`), a directory only they can enter;
/// `$SHOAL_FILE_CACHE` names another, and `off` disables it.
fn file_client(ctx: &shoal_rpc::Context) -> Result<FileClient, Failure> {
    let dir = match std::env::var_os("SHOAL_FILE_CACHE") {
        Some(d) if d == "off" => None,
        Some(d) => Some(PathBuf::from(d)),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("shoal/files")),
    };
    let dir = match dir {
        Some(d) => match shoal_rpc::secrets::dir(&d, true) {
            Ok(()) => Some(d),
            Err(e) => {
                eprintln!("shoal: not caching files: {e}");
                None
            }
        },
        None => None,
    };
    Ok(FileClient::new(ctx)
        .map_err(file_failure)?
        .with_cache(dir.map(|d| Cache::new(&d, 1 << 30))))
}

fn file_failure(e: ClientError) -> Failure {
    match e {
        ClientError::Unreachable(_) => Failure::unreachable(e.to_string()),
        e => Failure::failed(e.to_string()),
    }
}

/// Progress on standard error: a line redrawn on a terminal, else a line
/// per quarter of files of 64 MiB or more.
struct Progress {
    what: &'static str,
    total: Option<u64>,
    start: Instant,
    last: Instant,
    tty: bool,
    quarter: u64,
    quiet: bool,
}

impl Progress {
    fn new(what: &'static str, total: Option<u64>, quiet: bool) -> Progress {
        Progress {
            what,
            total,
            start: Instant::now(),
            last: Instant::now(),
            tty: std::io::stderr().is_terminal(),
            quarter: 0,
            quiet,
        }
    }

    fn line(&self, done: u64) -> String {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        let rate = mib(done) / self.start.elapsed().as_secs_f64().max(1e-6);
        match self.total {
            Some(t) if t > 0 => format!(
                "{} {:.1}/{:.1} MiB {:>3}% {:.0} MiB/s",
                self.what,
                mib(done),
                mib(t),
                done * 100 / t,
                rate
            ),
            _ => format!("{} {:.1} MiB {:.0} MiB/s", self.what, mib(done), rate),
        }
    }

    fn update(&mut self, done: u64) {
        if self.quiet {
            return;
        }
        if self.tty {
            if self.last.elapsed() > Duration::from_millis(100) {
                self.last = Instant::now();
                eprint!("\r{}   ", self.line(done));
            }
        } else if let Some(t) = self.total.filter(|&t| t >= 64 << 20) {
            let q = done * 4 / t;
            if q > self.quarter {
                self.quarter = q;
                eprintln!("{}", self.line(done));
            }
        }
    }

    fn finish(&self, done: u64) {
        if !self.quiet && self.tty && self.start.elapsed() > Duration::from_millis(100) {
            eprintln!("\r{}   ", self.line(done));
        }
    }
}

fn show(figures: &[(String, u64)]) -> String {
    figures
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The session, the registered servers, and a file client.
fn open_all(common: &Common) -> Result<(Session, FileClient), Failure> {
    let s = Session::open(common)?;
    let ctx = attach()?;
    Ok((s, file_client(&ctx)?))
}

fn lookup(
    s: &mut Session,
    path: &OsString,
) -> Result<(Capability, Vec<u8>, Vec<Capability>), Failure> {
    let (dir, name) = s.parent(path.as_bytes())?;
    let caps = s.dir.lookup_bytes(&dir, &name).map_err(client_failure)?;
    if caps.iter().any(|c| c.port() == s.root.port()) {
        return Err(Failure::failed(format!(
            "{} is a directory, not a file",
            path.to_string_lossy()
        )));
    }
    Ok((dir, name, caps))
}

fn chosen_servers(
    s: &mut Session,
    files: &mut FileClient,
    names: Option<&[String]>,
    k: usize,
) -> Result<Vec<(String, Capability)>, Failure> {
    let all = manager::servers(&mut s.dir, &s.root)?;
    match names {
        Some(names) => names
            .iter()
            .map(|n| {
                all.iter().find(|(m, _)| m == n).cloned().ok_or_else(|| {
                    Failure::failed(format!("no file server named {n:?} is registered"))
                })
            })
            .collect(),
        None => {
            if k == 0 {
                return Err(Failure::failed("--replicas must be at least 1"));
            }
            Ok(manager::choose_servers(files, &all, k)?)
        }
    }
}

fn admin_targets(
    s: &mut Session,
    only: Option<&str>,
) -> Result<Vec<(String, Capability)>, Failure> {
    let all = manager::servers(&mut s.dir, &s.root)?;
    match only {
        Some(n) => Ok(vec![all.into_iter().find(|(m, _)| m == n).ok_or_else(
            || Failure::failed(format!("no file server named {n:?} is registered")),
        )?]),
        None => Ok(all),
    }
}

pub fn run(command: FileCommand) -> Result<(), Failure> {
    match command {
        FileCommand::Serve(args) => serve(args),
        FileCommand::Manage {
            every,
            replicas,
            common,
        } => manage::run(Duration::from_secs(every.max(1)), replicas, common),
        FileCommand::Put {
            path,
            source,
            replicas,
            servers,
            no_safety,
            quiet,
            common,
        } => {
            let (mut s, mut files) = open_all(&common)?;
            let (dir, name) = s.parent(path.as_bytes())?;
            let targets = chosen_servers(&mut s, &mut files, servers.as_deref(), replicas)?;
            let to: Vec<Capability> = targets.iter().map(|t| t.1).collect();
            let stdin = source.as_ref().is_none_or(|p| p.as_os_str() == "-");
            let (input, total): (Box<dyn std::io::Read + Send>, Option<u64>) = if stdin {
                (Box::new(std::io::stdin()), None)
            } else {
                let p = source.as_ref().unwrap();
                let f = std::fs::File::open(p)
                    .map_err(|e| Failure::failed(format!("{}: {e}", p.display())))?;
                let len = f.metadata().ok().map(|m| m.len());
                (Box::new(f), len)
            };
            let mut progress = Progress::new("put", total, quiet);
            let caps = files
                .create_from(&to, input, !no_safety, |n| progress.update(n))
                .map_err(file_failure)?;
            let size = files.stat(&caps).map(|(st, _)| st.size).unwrap_or(0);
            progress.finish(size);
            if let Err(e) = s.dir.append_bytes(&dir, &name, &caps, None) {
                // Do not leave unnamed replicas behind.
                for c in &caps {
                    let _ = files.destroy(c);
                }
                return Err(client_failure(e));
            }
            for c in &caps {
                println!("{c}");
            }
            Ok(())
        }
        FileCommand::Get {
            path,
            dest,
            quiet,
            common,
        } => {
            let (mut s, mut files) = open_all(&common)?;
            let (_, name, caps) = lookup(&mut s, &path)?;
            let dest = dest.unwrap_or_else(|| PathBuf::from(std::ffi::OsStr::from_bytes(&name)));
            if dest.as_os_str() == "-" {
                return cat(&mut files, &caps);
            }
            let (st, _) = files.stat(&caps).map_err(file_failure)?;
            // Write beside the destination, rename when complete: a failed
            // copy leaves nothing half-written under the name.
            let tmp = dest.with_file_name(format!(
                ".{}.shoal-part",
                dest.file_name().unwrap_or_default().to_string_lossy()
            ));
            let f = std::fs::File::create(&tmp)
                .map_err(|e| Failure::failed(format!("{}: {e}", tmp.display())))?;
            let mut progress = Progress::new("get", Some(st.size), quiet);
            let r = files.read_to(&caps, std::io::BufWriter::with_capacity(1 << 20, f), |n| {
                progress.update(n)
            });
            match r {
                Ok(n) => {
                    progress.finish(n);
                    std::fs::rename(&tmp, &dest)
                        .map_err(|e| Failure::failed(format!("{}: {e}", dest.display())))
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    Err(file_failure(e))
                }
            }
        }
        FileCommand::Cat { path, common } => {
            let (mut s, mut files) = open_all(&common)?;
            let (_, _, caps) = lookup(&mut s, &path)?;
            cat(&mut files, &caps)
        }
        FileCommand::Stat { path, json, common } => {
            let (mut s, mut files) = open_all(&common)?;
            let (_, _, caps) = lookup(&mut s, &path)?;
            let servers = manager::servers(&mut s.dir, &s.root).unwrap_or_default();
            let (st, _) = files.stat(&caps).map_err(file_failure)?;
            let replicas: Vec<(String, String, Capability)> = caps
                .iter()
                .map(|c| {
                    let server = servers
                        .iter()
                        .find(|(_, s)| s.port() == c.port())
                        .map_or("(unregistered server)", |(n, _)| n.as_str());
                    let state = match files.stat(&[*c]) {
                        Ok(_) => "ok".to_string(),
                        Err(e) => e.to_string(),
                    };
                    (server.to_string(), state, *c)
                })
                .collect();
            if json {
                let replicas: Vec<serde_json::Value> = replicas
                    .iter()
                    .map(|(server, state, c)| {
                        serde_json::json!({ "server": server, "state": state, "cap": c.to_string() })
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({
                        "size": st.size,
                        "committed": st.committed,
                        "pieces": st.pieces,
                        "ttl": st.ttl,
                        "digest": hex(&st.hash),
                        "replicas": replicas,
                    })
                );
                return Ok(());
            }
            println!("size       {}", st.size);
            println!("committed  {}", st.committed);
            println!("pieces     {}", st.pieces);
            println!("ttl        {}", st.ttl);
            println!("digest     {}", hex(&st.hash));
            println!("replicas   {}", replicas.len());
            for (server, state, c) in &replicas {
                println!("  {server:<12} {state:<10} {c}");
            }
            Ok(())
        }
        FileCommand::Rm { path, common } => {
            let (mut s, mut files) = open_all(&common)?;
            let (dir, name, caps) = lookup(&mut s, &path)?;
            s.dir.delete(&dir, &name).map_err(client_failure)?;
            let mut left = 0;
            for c in &caps {
                if files.destroy(c).is_err() {
                    left += 1;
                }
            }
            if left > 0 {
                eprintln!(
                    "shoal: {left} replica(s) could not be destroyed now; nothing names them, so they are garbage-collected when their time-to-live runs out"
                );
            }
            Ok(())
        }
        FileCommand::Servers { common } => {
            let (mut s, mut files) = open_all(&common)?;
            for (name, cap) in manager::servers(&mut s.dir, &s.root)? {
                match files.admin(&cap, AdminOp::Stats) {
                    Ok(Answer::Report { figures, .. }) => println!("{name:<12} {}", show(&figures)),
                    Ok(_) => println!("{name:<12} (bad answer)"),
                    Err(e) => println!("{name:<12} {e}"),
                }
            }
            Ok(())
        }
        FileCommand::Fsck(a) => admin_all(a, AdminOp::Fsck),
        FileCommand::Compact(a) => admin_all(a, AdminOp::Compact),
        FileCommand::Gc {
            replicas,
            verify,
            no_age,
            common,
        } => {
            let opts = PassOptions {
                k: replicas,
                verify,
                age: !no_age,
            };
            let (mut s, mut files) = open_all(&common)?;
            let ctx = attach()?;
            let started = Instant::now();
            let r = manage::pass(&ctx, &mut s, &mut files, &opts)?;
            println!("{} in {:.1?}", manage::show(&r), started.elapsed());
            for p in &r.problems {
                eprintln!("problem: {p}");
            }
            if r.problems.is_empty() {
                Ok(())
            } else {
                Err(Failure::failed(format!(
                    "the pass found {} problems (above)",
                    r.problems.len()
                )))
            }
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn cat(files: &mut FileClient, caps: &[Capability]) -> Result<(), Failure> {
    let out = std::io::stdout().lock();
    match files.read_to(caps, out, |_| {}) {
        Ok(_) => Ok(()),
        // A closed pipe (`| head`) is not an error of ours.
        Err(ClientError::Local(e)) if e.contains("Broken pipe") => Ok(()),
        Err(e) => Err(file_failure(e)),
    }
}

fn admin_all(a: AdminArgs, what: AdminOp) -> Result<(), Failure> {
    let (mut s, mut files) = open_all(&a.common)?;
    let mut bad = 0;
    for (name, cap) in admin_targets(&mut s, a.server.as_deref())? {
        let started = Instant::now();
        match files.admin(&cap, what) {
            Ok(Answer::Report { figures, problems }) => {
                println!("{name:<12} {} in {:.1?}", show(&figures), started.elapsed());
                for p in &problems {
                    println!("{name:<12} PROBLEM {p}");
                }
                bad += problems.len();
            }
            Ok(_) => println!("{name:<12} done"),
            Err(e) => {
                println!("{name:<12} {e}");
                bad += 1;
            }
        }
    }
    std::io::stdout().flush().ok();
    if bad > 0 {
        return Err(Failure::failed(format!("{bad} problems found")));
    }
    Ok(())
}

fn serve(args: ServeArgs) -> Result<(), Failure> {
    let ctx = attach()?;
    let cfg = ServerConfig {
        store: StoreConfig {
            cache_bytes: args.cache_mib << 20,
            ttl: args.ttl.max(1),
            uncommitted_life: Duration::from_secs(args.uncommitted_secs),
            age_gap: Duration::from_secs(args.age_secs),
            ..StoreConfig::default()
        },
        threads: args.threads,
        ..ServerConfig::default()
    };
    let server = FileServer::start(&ctx, &args.data, cfg).map_err(Failure::failed)?;
    let cap = server.cap();
    if !args.no_register {
        let mut s = Session::open(&args.common)?;
        let root = s.root;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match manager::register(&mut s.dir, &root, &args.name, &cap) {
                Ok(()) => break,
                Err(e) if Instant::now() < deadline => {
                    tracing::warn!("registering in the directory: {e}; retrying");
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => {
                    return Err(Failure::failed(format!(
                        "registering in the directory: {e}"
                    )));
                }
            }
        }
    }
    eprintln!(
        "file server {} serving {} from {}",
        args.name,
        cap.port(),
        args.data.display()
    );
    println!("{cap}");
    until_signalled(|| true, ("serving", "not serving"))?;
    server.stop().map_err(|e| Failure::failed(e.to_string()))
}
