//! `shoal bench file`: the immutable file service, after §3.3 and Table 2
//! of the Amoeba–Sprite comparison (Douglis et al. 1991) and the "tmp
//! file" experiment of the group-vs-RPC directory paper (Kaashoek et al.
//! 1992), each beside a local-disk twin measured in the same run.
//!
//! Placement, on a four-node local cluster (`bf`, 10.77.250.0/24): a
//! directory service (`bfd`, group variant, fsync durability) with
//! replicas on n1, n2 and n3; two file servers on n2 (`shoal file serve`,
//! registered under `fileservers/` of a root directory the bench makes):
//! `bf-n2` with the default extent cache (256 MiB) and `bf-n2-small` with a
//! 16 MiB one, so that a 100 MiB read from it comes from the store and is
//! checksum-verified; the measuring client is an agent on n1 (`shoal-bench
//! agent file client`) that the driver commands line by line.  All
//! data — the replicas' logs, the stores, the local baseline's files and
//! the client cache — is in one directory on the real disk
//! (`/var/tmp/shoal-bench-file-PID`, removed afterwards).  etcd, for the
//! tmp-file baseline, runs as in `shoal bench dir`: one member on each of
//! n1–n3 (data on tmpfs), leader moved to n1.
//!
//! Phases:
//! 1. cycles: create a file (commit and safety flags: on the server's disk
//!    when the call returns), read it back, destroy it; 0 B, 10 KiB,
//!    100 KiB, 1 MiB and 100 MiB; the local twin writes a file, fsyncs it,
//!    reads it and unlinks it.  Interleaved rounds (round 0 the warm-up),
//!    each size's turn after a 50 ms pause, shoal first in even rounds and
//!    local first in odd ones; the client cache is off;
//! 2. reads of 100 MiB: through the client cache (after one read that
//!    filled it), a local page-cache read with a 1 MiB buffer, a remote
//!    read with the server's extent cache warm, and an uncached one (the
//!    small-cache server), in interleaved rounds.  Every chunk is compared
//!    with what was written; the comparison's time is taken out of the
//!    timing on both sides;
//! 3. append: 4 KiB written at the end of the committed 100 MiB file
//!    (commit and safety flags), always to the original; each new version
//!    is checked (its last 8 KiB) and destroyed outside the timing;
//! 4. tmp file: create a 4-byte file (safety), enter it in a directory,
//!    look the name up (a linearizable read), read the file, delete the
//!    name, destroy the file; against a local file (write + fsync, read,
//!    unlink) named by an etcd key (put, get, delete).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Subcommand;
use serde_json::{Value, json};
use shoal_bullet::op::{AdminOp, Answer, Edit};
use shoal_bulletsvc::{Cache, FileClient, manager};
use shoal_cap::Capability;
use shoal_cluster::Cluster;
use shoal_dirsvc::DirClient;
use shoal_rpc::Context;

use crate::agent::Agent;
use crate::dir::agent::replica_status;
use crate::dir::{DataDir, ReplicaProc};
use crate::etcd::{Etcd, Kv, find_etcd};
use crate::report::{self, at_least, at_most, none, target};
use crate::stats::percentile_us;

/// Flags of `shoal bench file`.
pub use crate::RunArgs as BenchArgs;

/// The half of `shoal bench file` that runs on a node.
#[derive(Subcommand, Debug, Clone)]
pub enum AgentCommand {
    /// A file and directory client driven by commands on standard input,
    /// one JSON answer line each on standard output; exits when standard
    /// input closes.
    Client,
}

/// The cycle sizes: bytes, and the metrics' suffix (its unit first).
const SIZES: [(usize, &str); 5] = [
    (0, "us_0b"),
    (10 << 10, "us_10kib"),
    (100 << 10, "us_100kib"),
    (1 << 20, "ms_1mib"),
    (100 << 20, "ms_100mib"),
];
/// The large file: reads, append, the largest cycle.
const BIG: usize = 100 << 20;
/// Bytes appended.
const APPEND: usize = 4 << 10;
/// Random bytes beyond `BIG` in the agent's pattern (appended data comes
/// from windows of it).
const PAD: usize = 1 << 20;
/// The directory service's name.
const SERVICE: &str = "bfd";
/// The file servers on n2: (name, extent cache in MiB).
const MAIN: (&str, u64) = ("bf-n2", 256);
const SMALL: (&str, u64) = ("bf-n2-small", 16);
/// The client cache's size (a file is kept if it is at most half).
const CLIENT_CACHE: u64 = 1 << 30;
/// Pause before each kind's turn: the previous turn's after-work (the
/// file system's journal commits, the server's housekeeping) settles.
const SETTLE: Duration = Duration::from_millis(50);

mod agent;
pub use agent::agent;

// ----- the driver ------------------------------------------------------------

/// Runs the benchmark.
pub fn run(args: BenchArgs) -> Result<(), String> {
    let etcd = find_etcd()?;
    crate::on_cluster(
        &args,
        ("file", (4, "bf", 250)),
        |guard, shoal| measure(guard.cluster(), shoal, &etcd, args.quick),
        table,
    )
}

/// Whether `path` is on tmpfs (where an fsync costs nothing).
fn on_tmpfs(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs(2) with a valid C string and a zeroed out-struct.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statfs(c.as_ptr(), &mut s) } == 0) && s.f_type as i64 == 0x0102_1994
}

/// Starts `shoal file serve` on n2 and waits for the capability it prints
/// once registered.
fn start_file_server(
    cluster: &Cluster,
    shoal: &Path,
    data: &Path,
    config: &Path,
    (name, cache_mib): (&str, u64),
) -> Result<(ReplicaProc, String), String> {
    let log = data.join(format!("{name}.log"));
    let err = File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let mut child = cluster
        .command("n2", shoal)?
        .args(["file", "serve", "--name", name])
        .args(["--cache-mib", &cache_mib.to_string(), "--data"])
        .arg(data.join(name))
        .env("SHOAL_CONFIG_DIR", config)
        .env("SHOAL_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(err))
        .spawn()
        .map_err(|e| format!("cannot start file server {name} on n2: {e}"))?;
    let rx = crate::agent::lines_of(child.stdout.take().expect("piped"));
    let mut proc = ReplicaProc {
        name: format!("file server {name} on n2"),
        child,
        log,
    };
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) if !line.trim().is_empty() => return Ok((proc, line.trim().to_string())),
            Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = proc.child.wait();
                return Err(format!("the file server exited:\n    {}", proc.tail()));
            }
        }
        if Instant::now() > until {
            return Err(format!(
                "the file server printed no capability within 60 s:\n    {}",
                proc.tail()
            ));
        }
    }
}

fn num(v: &Value, key: &str) -> Result<f64, String> {
    v[key]
        .as_f64()
        .ok_or_else(|| format!("agent answer without {key}: {v}"))
}

fn measure(
    cluster: &Cluster,
    shoal: &Path,
    etcd_bin: &Path,
    quick: bool,
) -> Result<BTreeMap<String, f64>, String> {
    // Rounds of the cycles (after a warm-up round) and cycles per round
    // of each size; 100 MiB reads; appends; tmp files.
    let (rounds, counts, read_rounds, appends, tmps) = if quick {
        (3, "3,3,3,1,1", 3, 50, 50)
    } else {
        (10, "20,20,20,5,1", 7, 500, 300)
    };
    let mut metrics = BTreeMap::new();

    let data = DataDir::fresh("file")?;
    if on_tmpfs(&data.0) {
        eprintln!(
            "bench: warning: {} is on tmpfs: the fsyncs cost nothing",
            data.0.display()
        );
    }
    eprintln!(
        "bench: starting directory service {SERVICE} (group, fsync) on n1-n3, data in {}",
        data.0.display()
    );
    let mut procs = crate::dir::start_dir_service(
        cluster,
        shoal,
        &data.0,
        (SERVICE, "group", "fsync", 3),
        &[],
    )?;
    let mut client = Agent::start(cluster, "n1", &["file", "client"])?;
    let until = Instant::now() + Duration::from_secs(60);
    crate::dir::wait_dir_service(&mut client, &mut procs, (SERVICE, "member", 3), until)?;
    let root = client.call(&format!("root {SERVICE}"))?["root"]
        .as_str()
        .ok_or("root: no capability")?
        .to_string();
    // The root capability is a secret: written as the user's own is.
    let config = data.0.join("config");
    shoal_rpc::secrets::dir(&config, true)?;
    shoal_rpc::secrets::write(&config.join("root"), format!("{root}\n").as_bytes())?;
    eprintln!(
        "bench: starting file servers {} (extent cache {} MiB) and {} ({} MiB) on n2",
        MAIN.0, MAIN.1, SMALL.0, SMALL.1
    );
    let mut caps = Vec::new();
    for server in [MAIN, SMALL] {
        let (p, cap) = start_file_server(cluster, shoal, &data.0, &config, server)?;
        procs.push(p);
        caps.push(cap);
    }
    client.call(&format!(
        "open {root} {} {} {} {} {}",
        data.0.display(),
        MAIN.0,
        caps[0],
        SMALL.0,
        caps[1]
    ))?;
    let mut mismatches = 0.0;

    // Phase 1: cycles.
    eprintln!(
        "bench: create-read-destroy cycles (0 B to 100 MiB, safety on) against write-fsync-read-unlink, {rounds} interleaved rounds of {counts} (client on n1, server on n2)"
    );
    let c = client.call(&format!("cycles {rounds} {counts}"))?;
    mismatches += num(&c, "mismatches")?;
    let sizes = c["sizes"].as_array().ok_or("cycles: no sizes")?;
    for ((size, suffix), s) in SIZES.iter().zip(sizes) {
        if num(s, "size")? as usize != *size {
            return Err(format!("cycles: size {size} answered out of order"));
        }
        let scale = if suffix.starts_with("ms") { 1e3 } else { 1.0 };
        let step = |side: &str, i: usize| -> Result<f64, String> {
            s[side][i]
                .as_f64()
                .map(|v| v / scale)
                .ok_or_else(|| format!("cycles: no {side}[{i}]: {s}"))
        };
        metrics.insert(format!("file_cycle_{suffix}"), step("shoal_us", 0)?);
        metrics.insert(format!("local_cycle_{suffix}"), step("local_us", 0)?);
        metrics.insert(format!("cycle_samples_{}", &suffix[3..]), num(s, "n")?);
        // Where the time goes, at the two ends of the scale.
        if *size == 0 || *size == BIG {
            for (i, name) in ["create", "read", "destroy"].iter().enumerate() {
                metrics.insert(
                    format!("file_cycle_{suffix}_{name}"),
                    step("shoal_us", i + 1)?,
                );
            }
            for (i, name) in ["write_fsync", "read", "unlink"].iter().enumerate() {
                metrics.insert(
                    format!("local_cycle_{suffix}_{name}"),
                    step("local_us", i + 1)?,
                );
            }
        }
    }

    // Phase 2: reads.
    eprintln!(
        "bench: 100 MiB reads: client cache, local page cache, remote, uncached; {read_rounds} interleaved rounds"
    );
    let r = client.call(&format!("reads {read_rounds}"))?;
    mismatches += num(&r, "mismatches")?;
    for (key, name) in [
        ("cached_mib_s", "file_read_cached_mib_s"),
        ("local_mib_s", "local_read_cached_mib_s"),
        ("remote_mib_s", "file_read_remote_mib_s"),
        ("uncached_mib_s", "file_read_uncached_mib_s"),
        (
            "remote_extent_hits_per_read",
            "file_read_remote_extent_hits",
        ),
        (
            "uncached_extent_misses_per_read",
            "file_read_uncached_extent_misses",
        ),
        ("rounds", "file_read_rounds"),
    ] {
        metrics.insert(name.into(), num(&r, key)?);
    }

    // Phase 3: append.
    eprintln!("bench: {appends} appends of 4 KiB to the 100 MiB file (commit + safety)");
    let a = client.call(&format!("append {appends} {}", appends / 10))?;
    mismatches += num(&a, "mismatches")?;
    metrics.insert("file_append_4kib_to_100mib_us".into(), num(&a, "us")?);
    metrics.insert(
        "file_append_4kib_to_100mib_us_p99".into(),
        num(&a, "us_p99")?,
    );
    metrics.insert("file_append_samples".into(), num(&a, "n")?);

    // Phase 4: tmp files, beside etcd.
    let etcd = Etcd::start_led_from(cluster, etcd_bin, (&["n1", "n2", "n3"], 0), &mut metrics)?;
    eprintln!(
        "bench: tmp files: {tmps} on shoal (file + directory) and on the local disk + etcd, interleaved"
    );
    let t = client.call(&format!("tmpfile {tmps} {} {}", tmps / 10, etcd.clients[0]))?;
    drop(etcd);
    mismatches += num(&t, "mismatches")?;
    metrics.insert("tmpfile_us".into(), num(&t, "shoal_us")?);
    metrics.insert("tmpfile_us_p99".into(), num(&t, "shoal_us_p99")?);
    metrics.insert("tmpfile_local_etcd_us".into(), num(&t, "local_etcd_us")?);
    metrics.insert(
        "tmpfile_local_etcd_us_p99".into(),
        num(&t, "local_etcd_us_p99")?,
    );
    metrics.insert("tmpfile_samples".into(), num(&t, "n")?);
    metrics.insert("file_mismatches".into(), mismatches);

    drop(client);
    drop(procs);
    drop(data);
    Ok(metrics)
}

/// Table 2 of the Amoeba–Sprite paper (ms): create-delete with no data,
/// 10 Kbytes and 100 Kbytes: Amoeba BULLET, BULLET/DIR, Sprite CACHE,
/// NOCACHE.
const PAPER_CREATE_DELETE: [(&str, f64, f64, f64, f64); 3] = [
    ("no data", 33.0, 288.0, 50.9, 50.9),
    ("10 Kbytes", 86.0, 312.0, 67.1, 84.9),
    ("100 Kbytes", 367.0, 617.0, 101.4, 411.1),
];

/// The markdown report: the paper's Table 2 beside shoal's figures, then
/// the targets.
fn table(m: &BTreeMap<String, f64>) -> String {
    let g = |k: &str| m.get(k).copied().unwrap_or(f64::NAN);
    let mut t = String::new();
    t.push_str("## File service (Amoeba–Sprite comparison, 1991, §3.3 and Table 2)\n\n");
    t.push_str(
        "Create a file (commit + safety: on the server's disk), read it back, destroy it;\n",
    );
    t.push_str(
        "client on n1, file server on n2, client cache off. Local: write + fsync, read, unlink\n",
    );
    t.push_str(
        "on the same disk. Medians, shoal and local in interleaved rounds of the same run.\n\n",
    );
    t.push_str("| size | Amoeba BULLET (ms) | Amoeba BULLET/DIR (ms) | Sprite CACHE / NOCACHE (ms) | shoal | local | shoal / local |\n");
    t.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
    for (i, (size, suffix)) in SIZES.iter().enumerate() {
        let unit = &suffix[..2];
        let unit = if unit == "us" { "µs" } else { "ms" };
        let label = match size {
            0 => "0 B".to_string(),
            s if *s < 1 << 20 => format!("{} KiB", s >> 10),
            s => format!("{} MiB", s >> 20),
        };
        let paper = match i {
            0..=2 => {
                let p = PAPER_CREATE_DELETE[i];
                format!("{:.1} | {:.1} | {:.1} / {:.1}", p.1, p.2, p.3, p.4)
            }
            _ => " | | ".into(),
        };
        let (shoal, local) = (
            g(&format!("file_cycle_{suffix}")),
            g(&format!("local_cycle_{suffix}")),
        );
        t.push_str(&format!(
            "| {label} | {paper} | {shoal:.1} {unit} | {local:.1} {unit} | {:.2} |\n",
            shoal / local
        ));
    }
    t.push_str("\nThe paper's sizes are 0, 10 and 100 Kbytes; its create-delete also writes\n");
    t.push_str("the file through to disk.\n\n");
    t.push_str("| steps, medians | shoal: create / read / destroy | local: write + fsync / read / unlink |\n");
    t.push_str("|---|---:|---:|\n");
    for (label, suffix, unit) in [("0 B", "us_0b", "µs"), ("100 MiB", "ms_100mib", "ms")] {
        let steps = |side: &str, names: [&str; 3]| {
            names
                .iter()
                .map(|n| format!("{:.1}", g(&format!("{side}_cycle_{suffix}_{n}"))))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        t.push_str(&format!(
            "| {label} ({unit}) | {} | {} |\n",
            steps("file", ["create", "read", "destroy"]),
            steps("local", ["write_fsync", "read", "unlink"])
        ));
    }
    t.push('\n');

    // The paper's 100 Kbyte reads, as MiB/s.
    let paper = |ms: f64| 100.0 * 1024.0 / (1 << 20) as f64 / (ms / 1e3);
    t.push_str("| read of 100 MiB (MiB/s) | shoal | local page cache | paper, read of 100 Kbytes (MiB/s) |\n");
    t.push_str("|---|---:|---:|---:|\n");
    t.push_str(&format!(
        "| client cache (after one read that filled it) | {:.0} | {:.0} | Sprite CACHE {:.1} |\n",
        g("file_read_cached_mib_s"),
        g("local_read_cached_mib_s"),
        paper(21.7)
    ));
    t.push_str(&format!(
        "| remote, server's extent cache warm ({:.0} hits per read) | {:.0} | | Amoeba {:.2}; Sprite NOCACHE {:.2} |\n",
        g("file_read_remote_extent_hits"),
        g("file_read_remote_mib_s"),
        paper(123.0),
        paper(167.4)
    ));
    t.push_str(&format!(
        "| remote, from the store, checksums verified ({:.0} extent-cache misses per read) | {:.0} | | |\n",
        g("file_read_uncached_extent_misses"),
        g("file_read_uncached_mib_s"),
    ));
    t.push_str("\n| other figures | p50 | p99 |\n|---|---:|---:|\n");
    report::p50_p99(
        &mut t,
        g,
        "append 4 KiB to a committed 100 MiB file (a new file; commit + safety) (µs)",
        "file_append_4kib_to_100mib_us",
    );
    report::p50_p99(
        &mut t,
        g,
        "tmp file, shoal: create 4 B (safety), enter, look up, read, delete, destroy (µs)",
        "tmpfile_us",
    );
    report::p50_p99(
        &mut t,
        g,
        "tmp file, local + etcd: write 4 B + fsync, put, get, read, delete, unlink (µs)",
        "tmpfile_local_etcd_us",
    );
    t.push_str(&format!(
        "\ntmp file, shoal ÷ local + etcd: {:.2} (Amoeba 1991, create-delete of an empty\nfile with its directory entry, BULLET/DIR: 288.0 ms; Sprite: 50.9 ms).\n",
        g("tmpfile_us") / g("tmpfile_local_etcd_us")
    ));

    let append = g("file_append_4kib_to_100mib_us");
    report::targets(
        &mut t,
        &[
            at_least(
                "cached read ÷ local page-cache read (100 MiB)",
                g("file_read_cached_mib_s") / g("local_read_cached_mib_s"),
                0.5,
            ),
            at_most(
                "100 MiB create-read-destroy ÷ local write-fsync-read-unlink",
                g("file_cycle_ms_100mib") / g("local_cycle_ms_100mib"),
                1.5,
            ),
            target(
                "append 4 KiB to a 100 MiB file",
                format!("{append:.0} µs"),
                "≤ 1000 µs",
                append <= 1000.0,
            ),
            none(
                "bytes read that differ from those written (reads)",
                g("file_mismatches"),
            ),
        ],
    );
    t
}
