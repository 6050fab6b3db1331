//! `shoal bench fs`: the shared file system (`docs/fs.md`), after §4 of
//! the Amoeba–Sprite comparison (Sprite's client caching), each figure
//! beside its twins measured in the same run: tmpfs (`/dev/shm`, the
//! floor), the local disk (`/var/tmp`, ext4 on the project's machines;
//! its type is reported), and sshfs (the FUSE file system a user would
//! otherwise mount to share a tree: Debian's `sshfs` with its defaults,
//! from OpenSSH's server on n2, started by the bench with a key made for
//! the run); and two null FUSE file systems on n1 (`fusenull`): one with
//! the shoal mount's own FUSE settings, the floor of any FUSE file system
//! here, and one stripped of permission checks and `FLUSH`.
//!
//! Placement: a three-node local cluster (`bs`, 10.77.248.0/24) with the
//! whole system, so /shoal is mounted on every node, each in its node's
//! mount namespace; the measuring program is an agent on n1
//! (`shoal-bench agent fs worker`) that works in `/shoal/bench-PID`, and
//! in directories of the same name under the twins' mounts; a second
//! agent on n2 reads what n1 wrote, for visibility.  sshfs is mounted on
//! n1 and on n2, both of the same directory on n2's disk.
//!
//! Phases, on each file system in turn (shoal first, then the null ones
//! (phases 1 and 2 only), tmpfs, the disk and sshfs), the sizes divided by
//! ten with `--quick`:
//! 1. tmp file: create, write 4 KiB, close and unlink one name, 2,000
//!    times (p50); on shoal, also the metadata service's requests per
//!    file (the primary's request count, before and after) and what the
//!    file servers received meanwhile (requests and bytes);
//! 2. 10,000 empty files made in one directory (per second), one of them
//!    stat'ed 100,000 times once cached (µs), and all unlinked (per s);
//! 3. a 512 MiB file written with 1 MiB writes and closed (MiB/s),
//!    read once, then read again sequentially with 1 MiB reads (the cached
//!    re-read, MiB/s), then 20,000 4 KiB reads at random aligned offsets
//!    (µs each);
//! 4. visibility (shoal and sshfs): 4 KiB written and closed on n1, then
//!    opened and read on n2, 50 times: the time of n2's open and read, and
//!    how often it saw anything but the new bytes (never, for shoal);
//! 5. the build: Lua 5.4's 32 C files unpacked (copied from the
//!    `lua-src` crate) and built with `make -jC` (C: this machine's cores)
//!    on n1, in a warm-up round and three timed ones, the ways rotated;
//!    on shoal also with `shoal make -jN` (N: the cluster's cores), whose
//!    recipes run on every node, all writing to the shared tree (Sprite's
//!    pmake setting).
//! 6. the workloads (`workload`): `dbench` with 1 and 4 clients, untar of
//!    a 5,000-file tree, `git status`, `git log -p`, `find` and `rm -rf` on
//!    shoal, bindfs, the disk, tmpfs and sshfs, and on shoal from two
//!    nodes at once.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Subcommand;
use serde_json::{Map, Value, json};
use shoal_cluster::Cluster;

use crate::agent::{Agent, arg, num, serve_commands};
use crate::dir::DataDir;
use crate::sshd::{Sshd, SshfsMount};
use crate::stats::percentile_us;

mod workload;

/// Flags of `shoal bench fs`.
pub use crate::RunArgs as BenchArgs;

/// The half of `shoal bench fs` that runs on a node.
#[derive(Subcommand, Debug, Clone)]
pub enum AgentCommand {
    /// Takes commands on standard input: `tmpfile DIR N`, `names DIR N
    /// STATS`, `bulk DIR MIB READS`, `put PATH SEQ`, `get PATH SEQ`,
    /// `build SOURCES TREE PROGRAM ARGS...` (the sources unpacked into
    /// TREE and built there: seconds), `clean DIR` (made empty) and
    /// `remove DIR`.
    Worker,
    /// Mounts the null FUSE file system at AT (the floor under any FUSE
    /// file system: `fusenull`) until standard input closes; answers
    /// `how` with how the kernel serves it.
    Null {
        at: PathBuf,
        /// Without the kernel's permission checks (`default_permissions`).
        #[arg(long)]
        no_permissions: bool,
        /// Answer `FLUSH` "not implemented" (the kernel stops sending it).
        #[arg(long)]
        no_flush: bool,
        /// At each `fsync`, do the least disk work a shoal `fsync` does
        /// here, in logs in this directory (`fusenull::ShoalDisk`).
        #[arg(long)]
        shoal_disk: Option<PathBuf>,
    },
}

/// The bytes a visibility round writes: its number, then filler.
fn payload(seq: usize) -> Vec<u8> {
    let mut b = format!("{seq:020}").into_bytes();
    b.resize(4096, b'.');
    b
}

fn io(what: &str, p: &Path) -> impl Fn(std::io::Error) -> String {
    let p = p.display().to_string();
    let what = what.to_string();
    move |e| format!("{what} {p}: {e}")
}

pub fn agent(command: AgentCommand) -> Result<(), String> {
    match command {
        AgentCommand::Worker => {
            serve_commands(|w| match w[0] {
                "tmpfile" => tmpfile(Path::new(arg(w, 1)?), num(w, 2)?),
                "names" => names(Path::new(arg(w, 1)?), num(w, 2)?, num(w, 3)?),
                "bulk" => bulk(Path::new(arg(w, 1)?), num(w, 2)?, num(w, 3)?),
                "put" => {
                    let p = Path::new(arg(w, 1)?);
                    let mut f = File::create(p).map_err(io("create", p))?;
                    f.write_all(&payload(num(w, 2)?)).map_err(io("write", p))?;
                    drop(f);
                    Ok(json!({}))
                }
                "get" => {
                    let p = Path::new(arg(w, 1)?);
                    let t = Instant::now();
                    let mut got = Vec::new();
                    File::open(p)
                        .and_then(|mut f| f.read_to_end(&mut got))
                        .map_err(io("read", p))?;
                    let us = t.elapsed().as_secs_f64() * 1e6;
                    Ok(json!({ "us": us, "fresh": got == payload(num(w, 2)?) }))
                }
                "build" => build(Path::new(arg(w, 1)?), Path::new(arg(w, 2)?), &w[3..]),
                "remove" => {
                    let p = Path::new(arg(w, 1)?);
                    fs::remove_dir_all(p).map_err(io("remove", p))?;
                    Ok(json!({}))
                }
                "clean" => {
                    let p = Path::new(arg(w, 1)?);
                    let _ = fs::remove_dir_all(p);
                    fs::create_dir_all(p).map_err(io("make", p))?;
                    Ok(json!({}))
                }
                other => {
                    workload::command(w).unwrap_or_else(|| Err(format!("unknown command {other}")))
                }
            });
            Ok(())
        }
        AgentCommand::Null {
            at,
            no_permissions,
            no_flush,
            shoal_disk,
        } => crate::fusenull::serve(
            &at,
            crate::fusenull::Bare {
                no_permissions,
                no_flush,
            },
            shoal_disk.as_deref(),
        ),
    }
}

/// Phase 5: `sources` unpacked into `tree` (made afresh) and built there
/// with `argv`: the seconds of both.
fn build(sources: &Path, tree: &Path, argv: &[&str]) -> Result<Value, String> {
    let _ = fs::remove_dir_all(tree);
    let t = Instant::now();
    crate::exec::prepare_build(sources, tree)?;
    crate::exec::run_build(tree, argv)?;
    let s = t.elapsed().as_secs_f64();
    if !tree.join("liblua.a").exists() {
        return Err(format!("{} built no liblua.a", tree.display()));
    }
    Ok(json!({ "s": s }))
}

/// Phase 1: `n` temporary files in `dir`: p50 of one cycle.
fn tmpfile(dir: &Path, n: usize) -> Result<Value, String> {
    let block = vec![7u8; 4096];
    let p = dir.join("tmp");
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let mut f = File::create(&p).map_err(io("create", &p))?;
        f.write_all(&block).map_err(io("write", &p))?;
        drop(f);
        fs::remove_file(&p).map_err(io("unlink", &p))?;
        samples.push(t.elapsed());
    }
    Ok(json!({ "us_p50": percentile_us(&mut samples, 50) }))
}

/// Phase 2: `n` empty files made in a fresh directory under `dir`, one
/// stat'ed `stats` times, then all unlinked.
fn names(dir: &Path, n: usize, stats: usize) -> Result<Value, String> {
    let d = dir.join("names");
    fs::create_dir(&d).map_err(io("make", &d))?;
    let paths: Vec<PathBuf> = (0..n).map(|i| d.join(format!("f{i}"))).collect();
    let t = Instant::now();
    for p in &paths {
        File::create(p).map_err(io("create", p))?;
    }
    let create_per_s = n as f64 / t.elapsed().as_secs_f64();
    let one = &paths[n / 2];
    fs::metadata(one).map_err(io("stat", one))?;
    let t = Instant::now();
    for _ in 0..stats {
        std::hint::black_box(fs::metadata(one).map_err(io("stat", one))?);
    }
    let stat_us = t.elapsed().as_secs_f64() * 1e6 / stats as f64;
    let t = Instant::now();
    for p in &paths {
        fs::remove_file(p).map_err(io("unlink", p))?;
    }
    let unlink_per_s = n as f64 / t.elapsed().as_secs_f64();
    fs::remove_dir(&d).map_err(io("remove", &d))?;
    Ok(json!({
        "create_per_s": create_per_s,
        "stat_cached_us": stat_us,
        "unlink_per_s": unlink_per_s,
    }))
}

/// Timed cached passes over the big file.
const REREADS: usize = 5;

/// Phase 3: a file of `mib` MiB written, read once untimed and
/// [`REREADS`] times timed, then `reads` random 4 KiB reads of it.
fn bulk(dir: &Path, mib: usize, reads: usize) -> Result<Value, String> {
    let p = dir.join("big");
    let chunk: Vec<u8> = (0..1 << 20).map(|i| (i * 7 + 3) as u8).collect();
    let write = || -> Result<f64, String> {
        let t = Instant::now();
        let mut f = File::create(&p).map_err(io("create", &p))?;
        for _ in 0..mib {
            f.write_all(&chunk).map_err(io("write", &p))?;
        }
        drop(f);
        Ok(mib as f64 / t.elapsed().as_secs_f64())
    };
    // An untimed pass first: on a VM, memory the guest has never touched
    // costs the host a page fault per page at its first touch, which
    // would fall on whichever target runs first (the same write ran at a
    // fifth of its speed then).  Each target is timed on its second pass.
    write()?;
    fs::remove_file(&p).map_err(io("unlink", &p))?;
    let write_mib_s = write()?;
    let read_all = |buf: &mut [u8]| -> Result<Duration, String> {
        let mut f = File::open(&p).map_err(io("open", &p))?;
        let t = Instant::now();
        let mut total = 0usize;
        loop {
            match f.read(buf).map_err(io("read", &p))? {
                0 => break,
                k => total += k,
            }
        }
        let took = t.elapsed();
        if total != mib << 20 {
            return Err(format!("{}: read {total} bytes of {mib} MiB", p.display()));
        }
        Ok(took)
    };
    let mut buf = crate::PageBuf::new(1 << 20);
    read_all(&mut buf)?;
    // One cached pass takes a few tens of milliseconds, which a shared
    // VM's hiccups can stretch by a third: the median of five.
    let mut rates = Vec::with_capacity(REREADS);
    for _ in 0..REREADS {
        rates.push(mib as f64 / read_all(&mut buf)?.as_secs_f64());
    }
    let reread_mib_s = crate::stats::median(&mut rates);
    let f = OpenOptions::new()
        .read(true)
        .open(&p)
        .map_err(io("open", &p))?;
    let blocks = (mib << 20) / 4096;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut page = crate::PageBuf::new(4096);
    let mut off = 0;
    let t = Instant::now();
    for _ in 0..reads {
        // xorshift: no allocation or lock in the timed loop.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        off = (x as usize % blocks) * 4096;
        f.read_exact_at(&mut page, off as u64)
            .map_err(io("read", &p))?;
    }
    let randread_us = t.elapsed().as_secs_f64() * 1e6 / reads as f64;
    let at = off % (1 << 20);
    if *page != chunk[at..at + 4096] {
        return Err(format!(
            "{}: the page at {off} is not what was written",
            p.display()
        ));
    }
    drop(f);
    fs::remove_file(&p).map_err(io("unlink", &p))?;
    Ok(json!({
        "write_mib_s": write_mib_s,
        "reread_mib_s": reread_mib_s,
        "randread_4k_us": randread_us,
    }))
}

/// What one file system is called in the metrics, and where its
/// directory is (the same on n1 and, for shoal, n2).
struct Target {
    name: &'static str,
    dir: PathBuf,
    /// The same directory as n2 sees it, for visibility (shared trees).
    seen_by_n2: Option<PathBuf>,
    /// Only the phases of names (temporary files, creates, stats and
    /// unlinks): the null FUSE file system keeps no bytes.
    names_only: bool,
}

/// Runs the benchmark.
pub fn run(args: BenchArgs) -> Result<(), String> {
    crate::on_cluster(
        &args,
        ("fs", (3, "bs", 248)),
        |guard, _| {
            if guard.temporary {
                guard.cluster().start_system(&mut |l| eprintln!("  {l}"))?;
            }
            measure(guard.cluster(), args.quick)
        },
        table,
    )
}

/// What `shoal fs status` on n1 says (n1's metadata replica).
fn fs_status(c: &Cluster) -> Result<Value, String> {
    let out = c
        .command("n1", crate::shoal_exe()?)?
        .args(["fs", "status"])
        .output()
        .map_err(|e| e.to_string())?;
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "shoal fs status: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The primary's count of requests (`shoal fs status` on n1).
fn primary_requests(c: &Cluster) -> Result<u64, String> {
    let v = fs_status(c)?;
    v["requests"]
        .as_u64()
        .ok_or_else(|| format!("shoal fs status has no request count: {v}"))
}

/// What the file servers have received, summed over them: requests other
/// than administration and their bytes (`shoal file servers` on n1).
fn file_server_traffic(c: &Cluster) -> Result<(u64, u64), String> {
    let out = c
        .command("n1", crate::shoal_exe()?)?
        .args(["file", "servers"])
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let figure = |line: &str, name: &str| -> Option<u64> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
    };
    let (mut requests, mut bytes, mut servers) = (0, 0, 0);
    for line in text.lines() {
        let (Some(r), Some(b)) = (figure(line, "requests"), figure(line, "request_bytes")) else {
            return Err(format!(
                "shoal file servers: a server without figures: {line}"
            ));
        };
        requests += r;
        bytes += b;
        servers += 1;
    }
    if servers == 0 {
        return Err(format!(
            "shoal file servers listed none: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok((requests, bytes))
}

fn measure(c: &Cluster, quick: bool) -> Result<Map<String, Value>, String> {
    crate::peers::ensure(
        &[
            ("sshfs", "sshfs"),
            ("fusermount3", "fuse3"),
            ("ssh-keygen", "openssh-client"),
            ("sshd", "openssh-server"),
            ("make", "make"),
            ("cc", "gcc"),
            ("ar", "binutils"),
        ],
        "the fs benchmark compares shoal with sshfs and builds C code on each",
    )?;
    let sshd_exe = crate::peers::find("sshd").ok_or("sshd not found")?;
    let sources = crate::exec::find_lua_sources()?;
    let scale = if quick { 10 } else { 1 };
    let run = format!("shoal-bench-fs-{}", std::process::id());
    // sshd's keys and sshfs's directory (on n2's disk) and mount points.
    let work = DataDir(Path::new("/var/tmp").join(format!("{run}-sshfs")));
    let _ = fs::remove_dir_all(&work.0);
    let served = work.0.join("served");
    fs::create_dir_all(&served).map_err(io("make", &served))?;
    eprintln!(
        "bench: sshd on n2, sshfs of n2's {} on n1 and n2",
        served.display()
    );
    let sshd = Sshd::start(c, "n2", &sshd_exe, &work.0)?;
    let sshfs = [
        SshfsMount::start(c, "n1", &sshd, &served, &work.0.join("n1"))?,
        SshfsMount::start(c, "n2", &sshd, &served, &work.0.join("n2"))?,
    ];
    // The null FUSE file system on n1, mounted as n1's shoal mount is,
    // stripped of what the shoal mount cannot give up, and (for dbench
    // only) doing at each fsync the disk work a shoal fsync does.
    let null_at = work.0.join("null");
    let bare_at = work.0.join("bare");
    let null_disk_at = work.0.join("null-disk");
    let logs = work.0.join("null-disk-logs").display().to_string();
    let mut nulls = Vec::new();
    for (at, flags) in [
        (&null_at, &[][..]),
        (&bare_at, &["--no-permissions", "--no-flush"][..]),
        (&null_disk_at, &["--shoal-disk", &logs][..]),
    ] {
        fs::create_dir_all(at).map_err(io("make", at))?;
        let path = at.display().to_string();
        let mut args = vec!["fs", "null", &path];
        args.extend(flags);
        let mut agent = Agent::start(c, "n1", &args)?;
        let how = agent.call("how")?;
        eprintln!(
            "bench: a null FUSE file system on n1 at {path} {flags:?} (io_uring: {}, yielding: {})",
            how["uring"], how["yielding"]
        );
        nulls.push((agent, how));
    }
    let targets = [
        Target {
            name: "fs",
            dir: Path::new("/shoal").join(&run),
            seen_by_n2: Some(Path::new("/shoal").join(&run)),
            names_only: false,
        },
        Target {
            name: "null",
            dir: null_at.join(&run),
            seen_by_n2: None,
            names_only: true,
        },
        Target {
            name: "bare",
            dir: bare_at.join(&run),
            seen_by_n2: None,
            names_only: true,
        },
        Target {
            name: "tmpfs",
            dir: Path::new("/dev/shm").join(&run),
            seen_by_n2: None,
            names_only: false,
        },
        Target {
            name: "ext4",
            dir: Path::new("/var/tmp").join(&run),
            seen_by_n2: None,
            names_only: false,
        },
        Target {
            name: "sshfs",
            dir: sshfs[0].path.join(&run),
            seen_by_n2: Some(sshfs[1].path.join(&run)),
            names_only: false,
        },
    ];
    let mut m = Map::new();
    m.insert("disk_type".into(), disk_type("/var/tmp").into());
    m.insert("null_uring".into(), nulls[0].1["uring"].clone());
    let mut a = Agent::start(c, "n1", &["fs", "worker"])?;
    let mut b = Agent::start(c, "n2", &["fs", "worker"])?;
    for t in &targets {
        let dir = t.dir.display().to_string();
        eprintln!("bench: {} in {dir}", t.name);
        a.call(&format!("clean {dir}"))?;
        let n = 2000 / scale;
        let before = (t.name == "fs").then(|| primary_requests(c)).transpose()?;
        let sent = (t.name == "fs")
            .then(|| file_server_traffic(c))
            .transpose()?;
        let v = a.call(&format!("tmpfile {dir} {n}"))?;
        m.insert(format!("{}_tmpfile_us_p50", t.name), v["us_p50"].clone());
        if let Some(before) = before {
            let requests = primary_requests(c)?.saturating_sub(before);
            m.insert(
                "fs_tmpfile_requests".into(),
                json!(requests as f64 / n as f64),
            );
        }
        if let Some((requests, bytes)) = sent {
            let (r, b) = file_server_traffic(c)?;
            m.insert(
                "fs_tmpfile_server_requests".into(),
                json!(r.saturating_sub(requests)),
            );
            m.insert(
                "fs_tmpfile_server_bytes".into(),
                json!(b.saturating_sub(bytes)),
            );
        }
        let v = a.call(&format!(
            "names {dir} {} {}",
            10_000 / scale,
            100_000 / scale
        ))?;
        for k in ["create_per_s", "stat_cached_us", "unlink_per_s"] {
            m.insert(format!("{}_{k}", t.name), v[k].clone());
        }
        if t.names_only {
            continue;
        }
        let v = a.call(&format!("bulk {dir} {} {}", 512 / scale, 20_000 / scale))?;
        for k in ["write_mib_s", "reread_mib_s", "randread_4k_us"] {
            m.insert(format!("{}_{k}", t.name), v[k].clone());
        }
    }
    // Visibility: written and closed on n1, opened and read on n2.
    for t in &targets {
        let Some(there) = &t.seen_by_n2 else {
            continue;
        };
        eprintln!("bench: visibility on {}, n1 to n2", t.name);
        let (here, there) = (t.dir.join("seen"), there.join("seen"));
        let mut us = Vec::new();
        let mut stale = 0;
        for seq in 0..50 {
            a.call(&format!("put {} {seq}", here.display()))?;
            let v = b.call(&format!("get {} {seq}", there.display()))?;
            us.push(v["us"].as_f64().unwrap_or(0.0));
            if v["fresh"] != true {
                stale += 1;
            }
        }
        us.sort_by(f64::total_cmp);
        m.insert(
            format!("{}_visibility_ms", t.name),
            json!(us[us.len() / 2] / 1e3),
        );
        m.insert(format!("{}_visibility_stale", t.name), json!(stale));
    }
    builds(c, &mut a, &sources, &targets, quick, &mut m)?;
    for t in &targets {
        a.call(&format!("remove {}", t.dir.display()))?;
    }
    // The workloads: every file system that keeps bytes, and the null
    // ones for `dbench` (whose figures they need no bytes for).
    let mut places: Vec<workload::Place> = targets
        .iter()
        .filter(|t| !t.names_only || t.name == "null")
        .map(|t| workload::Place {
            name: t.name,
            dir: t.dir.clone(),
        })
        .collect();
    places.push(workload::Place {
        name: "null_disk",
        dir: null_disk_at.join(&run),
    });
    let dirs = workload::Dirs {
        work: &work.0,
        shared: &targets[0].dir,
    };
    workload::measure(c, (&mut a, &mut b), dirs, places, quick, &mut m)?;
    drop(sshfs);
    drop(nulls);
    ratios(&mut m);
    Ok(m)
}

/// Phase 5: the build on each file system, and with `shoal make` over the
/// cluster on the shared tree; medians of the timed rounds.
fn builds(
    c: &Cluster,
    a: &mut Agent,
    sources: &Path,
    targets: &[Target],
    quick: bool,
    m: &mut Map<String, Value>,
) -> Result<(), String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let nodes = c.file().nodes.len();
    let shoal = crate::shoal_exe()?;
    let mut ways: Vec<(String, PathBuf, String)> = targets
        .iter()
        .filter(|t| !t.names_only)
        .map(|t| {
            (
                format!("{}_build_s", t.name),
                t.dir.join("lua"),
                format!("make -j{cores}"),
            )
        })
        .collect();
    ways.push((
        "fs_pmake_s".into(),
        targets[0].dir.join("lua-pmake"),
        format!("{} make -j{}", shoal.display(), cores * nodes),
    ));
    let rounds = if quick { 1 } else { 3 };
    eprintln!(
        "bench: the build (Lua, unpacked and built): make -j{cores} on each file system, shoal make -j{} on shoal; {rounds} rounds after a warm-up",
        cores * nodes
    );
    let mut secs: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
    for round in 0..=rounds {
        for k in 0..ways.len() {
            let k = (k + round) % ways.len();
            let (_, tree, cmd) = &ways[k];
            let v = a.call(&format!(
                "build {} {} {cmd}",
                sources.display(),
                tree.display()
            ))?;
            if round > 0 {
                secs[k].push(v["s"].as_f64().ok_or("build: no seconds")?);
            }
        }
    }
    for ((name, _, _), mut s) in ways.into_iter().zip(secs) {
        m.insert(name, json!(crate::stats::median(&mut s)));
    }
    Ok(())
}

/// The type of the file system holding `path`, as /proc/mounts says.
fn disk_type(path: &str) -> String {
    let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && path.starts_with(f[1])).then(|| (f[1].len(), f[2].to_string()))
        })
        .max()
        .map_or_else(|| "unknown".into(), |(_, t)| t)
}

/// The ratios the targets are stated in.
fn ratios(m: &mut Map<String, Value>) {
    workload::ratios(m);
    let get = |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_f64);
    // Against tmpfs, and against the floor of FUSE here (the null file
    // system).
    for (k, of, twin) in [
        ("fs_reread_vs_tmpfs", "reread_mib_s", "tmpfs"),
        ("fs_write_vs_tmpfs", "write_mib_s", "tmpfs"),
        ("fs_build_vs_tmpfs", "build_s", "tmpfs"),
        ("fs_tmpfile_vs_null", "tmpfile_us_p50", "null"),
        ("fs_create_vs_null", "create_per_s", "null"),
        ("fs_unlink_vs_null", "unlink_per_s", "null"),
    ] {
        if let (Some(a), Some(b)) = (get(m, &format!("fs_{of}")), get(m, &format!("{twin}_{of}"))) {
            m.insert(k.into(), json!(a / b));
        }
    }
}

/// The metrics beside their targets (issue 18).
fn table(m: &Map<String, Value>) -> String {
    let f = |k: &str| {
        m.get(k)
            .and_then(Value::as_f64)
            .map_or("-".into(), |v| format!("{v:.1}"))
    };
    let rows = [
        (
            "temporary file (µs, p50)",
            "tmpfile_us_p50",
            "≤ 30, no server message",
        ),
        ("creates per s", "create_per_s", "≥ 50,000"),
        ("unlinks per s", "unlink_per_s", "≥ 50,000"),
        ("cached stat (µs)", "stat_cached_us", "≤ 2"),
        ("cached re-read (MiB/s)", "reread_mib_s", "≥ 80 % of tmpfs"),
        ("cached 4 KiB random read (µs)", "randread_4k_us", "≤ 1.5"),
        ("buffered write (MiB/s)", "write_mib_s", "≥ 60 % of tmpfs"),
        (
            "build: unpack and make Lua (s)",
            "build_s",
            "≤ 1.10 × tmpfs",
        ),
    ];
    let mut t = String::from(
        "| metric | shoal fs | null FUSE | null FUSE, bare | tmpfs | local disk | sshfs | target |\n|---|---|---|---|---|---|---|---|\n",
    );
    for (what, k, target) in rows {
        t += &format!(
            "| {what} | {} | {} | {} | {} | {} | {} | {target} |\n",
            f(&format!("fs_{k}")),
            f(&format!("null_{k}")),
            f(&format!("bare_{k}")),
            f(&format!("tmpfs_{k}")),
            f(&format!("ext4_{k}")),
            f(&format!("sshfs_{k}")),
        );
    }
    t += &format!(
        "| build with shoal make over the cluster (s) | {} | | | | | | |\n",
        f("fs_pmake_s")
    );
    t += &format!(
        "| metadata requests per temporary file | {} | | | | | | 0 |\n",
        f("fs_tmpfile_requests")
    );
    t += &format!(
        "| file-server requests and bytes during the temporary files | {} · {} | | | | | | 0 · 0 |\n",
        f("fs_tmpfile_server_requests"),
        f("fs_tmpfile_server_bytes")
    );
    t += &format!(
        "| visibility after close, n1 to n2 (ms) | {} ({} stale) | | | | | {} ({} stale) | next open, always |\n",
        f("fs_visibility_ms"),
        f("fs_visibility_stale"),
        f("sshfs_visibility_ms"),
        f("sshfs_visibility_stale"),
    );
    t + &workload::table(m)
}
