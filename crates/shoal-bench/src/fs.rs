//! `shoal bench fs`: the shared file system (`docs/fs.md`), after §4 of
//! the Amoeba–Sprite comparison (Sprite's client caching), each figure
//! beside its local twins measured in the same run: tmpfs (`/dev/shm`,
//! the floor) and the local disk (`/var/tmp`, ext4 on the project's
//! machines; its type is reported).
//!
//! Placement: a three-node local cluster (`bs`, 10.77.248.0/24) with the
//! whole system, so /shoal is mounted on every node, each in its node's
//! mount namespace; the measuring program is an agent on n1
//! (`shoal-bench agent fs worker`) that works in `/shoal/bench-PID`, and
//! in directories of the same name under the twins' mounts; a second
//! agent on n2 reads what n1 wrote, for visibility.
//!
//! Phases, on each file system in turn (shoal first, then tmpfs, then the
//! disk), the sizes divided by ten with `--quick`:
//! 1. tmp file: create, write 4 KiB, close and unlink one name, 2,000
//!    times (p50); on shoal, also the metadata service's requests per
//!    file (the primary's request count, before and after);
//! 2. 10,000 empty files made in one directory (per second), one of them
//!    stat'ed 100,000 times once cached (µs), and all unlinked (per s);
//! 3. a 512 MiB file written with 1 MiB writes and closed (MiB/s),
//!    read once, then read again sequentially with 1 MiB reads (the cached
//!    re-read, MiB/s), then 20,000 4 KiB reads at random aligned offsets
//!    (µs each);
//! 4. visibility (shoal only): 4 KiB written and closed on n1, then
//!    opened and read on n2, 50 times: the time of n2's open and read, and
//!    how often it saw anything but the new bytes (must be never).
//!
//! Not yet measured: sshfs (the FUSE file system a user would otherwise
//! mount), the build on the mount, and the bytes sent to file servers.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde_json::{Map, Value, json};
use shoal_cluster::Cluster;

use crate::agent::{Agent, ClusterGuard, arg, num, serve_commands};
use crate::stats::percentile_us;

/// Flags of `shoal bench fs`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Write the metrics as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Sizes and counts divided by ten: a smoke run, not a measurement.
    #[arg(long)]
    pub quick: bool,
    /// Use the existing cluster in this directory (nodes n1 and n2, with
    /// /shoal mounted) instead of starting a temporary one.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// The half of `shoal bench fs` that runs on a node.
#[derive(Subcommand, Debug, Clone)]
pub enum AgentCommand {
    /// Takes commands on standard input: `tmpfile DIR N`, `names DIR N
    /// STATS`, `bulk DIR MIB READS`, `put PATH SEQ`, `get PATH SEQ`,
    /// `clean DIR` (made empty) and `remove DIR`.
    Worker,
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
                other => Err(format!("unknown command {other}")),
            });
            Ok(())
        }
    }
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

/// Phase 3: a file of `mib` MiB written, read twice (the second timed),
/// then `reads` random 4 KiB reads of it.
fn bulk(dir: &Path, mib: usize, reads: usize) -> Result<Value, String> {
    let p = dir.join("big");
    let chunk: Vec<u8> = (0..1 << 20).map(|i| (i * 7 + 3) as u8).collect();
    let t = Instant::now();
    let mut f = File::create(&p).map_err(io("create", &p))?;
    for _ in 0..mib {
        f.write_all(&chunk).map_err(io("write", &p))?;
    }
    drop(f);
    let write_mib_s = mib as f64 / t.elapsed().as_secs_f64();
    let read_all = |buf: &mut Vec<u8>| -> Result<Duration, String> {
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
    let mut buf = vec![0u8; 1 << 20];
    read_all(&mut buf)?;
    let reread_mib_s = mib as f64 / read_all(&mut buf)?.as_secs_f64();
    let f = OpenOptions::new()
        .read(true)
        .open(&p)
        .map_err(io("open", &p))?;
    let blocks = (mib << 20) / 4096;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut page = vec![0u8; 4096];
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
    if page != chunk[at..at + 4096] {
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
}

/// Runs the benchmark.
pub fn run(args: BenchArgs) -> Result<(), String> {
    crate::announce_cpu();
    let shoal = crate::shoal_exe()?;
    let guard = ClusterGuard::open_or_start(args.dir.as_deref(), "fs", (3, "bs", 248), &shoal)?;
    if guard.temporary {
        guard.cluster().start_system(&mut |l| eprintln!("  {l}"))?;
    }
    let metrics = measure(guard.cluster(), args.quick);
    drop(guard);
    let metrics = metrics?;
    println!("{}", table(&metrics));
    crate::write_json(args.json.as_deref(), &metrics, args.quick)?;
    Ok(())
}

/// The primary's count of requests (`shoal fs status` on n1).
fn primary_requests(c: &Cluster) -> Result<u64, String> {
    let out = c
        .command("n1", crate::shoal_exe()?)?
        .args(["fs", "status"])
        .output()
        .map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "shoal fs status: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    v["requests"]
        .as_u64()
        .ok_or_else(|| format!("shoal fs status has no request count: {v}"))
}

fn measure(c: &Cluster, quick: bool) -> Result<Map<String, Value>, String> {
    let scale = if quick { 10 } else { 1 };
    let run = format!("shoal-bench-fs-{}", std::process::id());
    let targets = [
        Target {
            name: "fs",
            dir: Path::new("/shoal").join(&run),
        },
        Target {
            name: "tmpfs",
            dir: Path::new("/dev/shm").join(&run),
        },
        Target {
            name: "ext4",
            dir: Path::new("/var/tmp").join(&run),
        },
    ];
    let mut m = Map::new();
    m.insert("disk_type".into(), disk_type("/var/tmp").into());
    let mut a = Agent::start(c, "n1", &["fs", "worker"])?;
    let mut b = Agent::start(c, "n2", &["fs", "worker"])?;
    for t in &targets {
        let dir = t.dir.display().to_string();
        eprintln!("bench: {} in {dir}", t.name);
        a.call(&format!("clean {dir}"))?;
        let n = 2000 / scale;
        let before = (t.name == "fs").then(|| primary_requests(c)).transpose()?;
        let v = a.call(&format!("tmpfile {dir} {n}"))?;
        m.insert(format!("{}_tmpfile_us_p50", t.name), v["us_p50"].clone());
        if let Some(before) = before {
            let requests = primary_requests(c)?.saturating_sub(before);
            m.insert(
                "fs_tmpfile_requests".into(),
                json!(requests as f64 / n as f64),
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
        let v = a.call(&format!("bulk {dir} {} {}", 512 / scale, 20_000 / scale))?;
        for k in ["write_mib_s", "reread_mib_s", "randread_4k_us"] {
            m.insert(format!("{}_{k}", t.name), v[k].clone());
        }
    }
    // Visibility: written and closed on n1, opened and read on n2.
    let path = targets[0].dir.join("seen");
    let mut us = Vec::new();
    let mut stale = 0;
    for seq in 0..50 {
        a.call(&format!("put {} {seq}", path.display()))?;
        let v = b.call(&format!("get {} {seq}", path.display()))?;
        us.push(v["us"].as_f64().unwrap_or(0.0));
        if v["fresh"] != true {
            stale += 1;
        }
    }
    us.sort_by(f64::total_cmp);
    m.insert("fs_visibility_ms".into(), json!(us[us.len() / 2] / 1e3));
    m.insert("fs_visibility_stale".into(), json!(stale));
    for t in &targets {
        a.call(&format!("remove {}", t.dir.display()))?;
    }
    ratios(&mut m);
    Ok(m)
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
    let get = |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_f64);
    for (k, of) in [
        ("fs_reread_vs_tmpfs", "reread_mib_s"),
        ("fs_write_vs_tmpfs", "write_mib_s"),
    ] {
        if let (Some(a), Some(b)) = (get(m, &format!("fs_{of}")), get(m, &format!("tmpfs_{of}"))) {
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
    ];
    let mut t = String::from(
        "| metric | shoal fs | tmpfs | local disk | target |\n|---|---|---|---|---|\n",
    );
    for (what, k, target) in rows {
        t += &format!(
            "| {what} | {} | {} | {} | {target} |\n",
            f(&format!("fs_{k}")),
            f(&format!("tmpfs_{k}")),
            f(&format!("ext4_{k}")),
        );
    }
    t += &format!(
        "| metadata requests per temporary file | {} | | | 0 |\n",
        f("fs_tmpfile_requests")
    );
    t += &format!(
        "| visibility after close, n1 to n2 (ms) | {} ({} stale) | | | next open, always |\n",
        f("fs_visibility_ms"),
        f("fs_visibility_stale")
    );
    t
}
