//! `shoal bench dir`: the directory service, after Figure 2 of the
//! group-vs-RPC directory paper (Kaashoek et al. 1992), in one run: the
//! RPC variant with two-phase commit against the group variant (with the
//! log fsynced before each answer, and with the log flushed in the
//! background — the paper's NVRAM variant), beside a three-member etcd.
//!
//! Placement, on a four-node local cluster (`bd`, 10.77.253.0/24): the
//! group replicas of two services on n1, n2 and n3 (`bdf`: fsync
//! durability, `bdr`: replicated durability), the two rpc2pc replicas
//! (`bd2`) on n1 and n2, their data directories on the real disk
//! (`/var/tmp/shoal-bench-dir-PID`, removed afterwards); etcd members on
//! n1, n2 and n3 (data on tmpfs, leader moved to n1); the measuring client
//! on n4, which holds no replica, located at replica 1 of each service
//! (not the group's sequencer, replica 0, which created the group; for
//! rpc2pc, the initiator is replica 1), then, for the group services,
//! aimed where the service says it orders writes (the sequencer's
//! replica), as a `DirClient` is.  The replicas are `shoal dir serve`
//! processes; the client is an agent (`shoal-bench agent dir client`) the
//! driver commands line by line (see `client_agent`).
//!
//! Phases:
//! 1. latency, in interleaved rounds (round 0 the warm-up): append a name
//!    and delete it (the paper's "append-delete") on each service; an etcd
//!    put and delete of a key over gRPC (and, for information, through
//!    etcd's JSON gateway, as runs before 2026-11-29 measured it); a
//!    lookup on `bdr`.  Each kind's turn starts
//!    after a 50 ms pause (the previous turn's post-reply fsyncs and the
//!    file system's journal commits would otherwise land on it) with 10
//!    untimed operations.  The replicas' disk counters are read before and
//!    after (syncs per write);
//! 2. temporary names on `bdr`: after its logs have been flushed, a burst
//!    of append-delete pairs, then two flush intervals; every replica's
//!    `disk.writes` and `cancelled_pairs` (status on its peer port) are
//!    read before and after.  If a flush fell inside a pair at some replica
//!    (it cancelled fewer pairs than were made), the pairs were not all
//!    within one flush interval and the burst is repeated (at most 3 times);
//! 3. lookups per second: client threads, each locating the service until
//!    it reaches replica 1 (checked with a status request), look one name
//!    up as fast as they can;
//! 4. updates per second: client threads, each with its own `DirClient`
//!    (located wherever it lands), append and delete names on `bdr`.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use shoal_cap::{Capability, PutPort};
use shoal_cluster::Cluster;
use shoal_dir::{Answer, Op, Request, Response};
use shoal_dirsvc::DirClient;
use shoal_rpc::Context;

use crate::agent::Agent;
use crate::etcd::{Etcd, Http, Kv, base64, find_etcd};
use crate::report::{self, at_least, at_most, none, target};
use crate::stats::percentile_us;

/// Flags of `shoal bench dir`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Write the metrics as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Fewer samples, shorter phases: a smoke run, not a measurement.
    #[arg(long)]
    pub quick: bool,
}

/// The half of `shoal bench dir` that runs on a node.
#[derive(Subcommand, Debug, Clone)]
pub enum AgentCommand {
    /// A directory client driven by commands on standard input, one JSON
    /// answer line each on standard output; exits when standard input
    /// closes.
    Client,
    /// A replica of the two-phase-commit baseline ([`twopc`]), serving
    /// until SIGTERM or SIGINT.
    Twopc {
        /// This replica's number: 0 or 1.
        #[arg(long)]
        replica: usize,
        /// Service name.
        #[arg(long)]
        service: String,
        /// Data directory (snapshot, log and intention).
        #[arg(long)]
        data: PathBuf,
    },
}

/// The services: (label, service name, variant, durability, replicas).
const SERVICES: [(&str, &str, &str, &str, usize); 3] = [
    ("rpc2pc", "bd2", "rpc2pc", "fsync", 2),
    ("group_fsync", "bdf", "group", "fsync", 3),
    ("group_replicated", "bdr", "group", "replicated", 3),
];
/// Log flush interval of the replicated service.
const FLUSH_MS: u64 = 500;
/// Client threads of the lookup and update phases.
const LOOKUP_THREADS: usize = 4;
const UPDATE_THREADS: usize = 4;
/// Temporary names made in one burst of the disk-write test.
const TMP_PAIRS: usize = 50;

pub(crate) mod agent;
pub mod twopc;
pub use agent::agent;

// ----- the driver ------------------------------------------------------------

/// A `shoal dir serve` process (or another server the benches start), stopped
/// (SIGTERM, then SIGKILL) when dropped.
pub(crate) struct ReplicaProc {
    /// `SERVICE/rI on NODE`.
    pub(crate) name: String,
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
}

impl ReplicaProc {
    /// The name and the last lines of the log.
    pub(crate) fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "{} ({}):\n      {}",
            self.name,
            self.log.display(),
            lines[lines.len().saturating_sub(5)..].join("\n      ")
        )
    }
}

impl Drop for ReplicaProc {
    fn drop(&mut self) {
        // SAFETY: kill(2) of our own child (ip netns exec execs shoal).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return;
                }
            }
        }
    }
}

/// The replicas' data directories, removed when dropped (after the
/// replicas, which are dropped first).
pub(crate) struct DataDir(pub(crate) PathBuf);

impl DataDir {
    /// An empty `/var/tmp/shoal-bench-WHAT-PID` (on the local disk, as
    /// the services' data would be).
    pub(crate) fn fresh(what: &str) -> Result<DataDir, String> {
        let data = DataDir(PathBuf::from(format!(
            "/var/tmp/shoal-bench-{what}-{}",
            std::process::id()
        )));
        let _ = std::fs::remove_dir_all(&data.0);
        std::fs::create_dir_all(&data.0).map_err(|e| format!("{}: {e}", data.0.display()))?;
        Ok(data)
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start_replicas(
    cluster: &Cluster,
    shoal: &Path,
    data: &Path,
) -> Result<Vec<ReplicaProc>, String> {
    let mut procs = Vec::new();
    for (_, service, variant, durability, n) in SERVICES {
        let flush = FLUSH_MS.to_string();
        procs.extend(start_dir_service(
            cluster,
            shoal,
            data,
            (service, variant, durability, n),
            &["--flush-ms", &flush],
        )?);
    }
    Ok(procs)
}

/// Starts the `n` replicas of directory service `service` on n1, n2, ...
/// (data in `data/SERVICE/rI`, logs in `data/SERVICE-rI.log`), with
/// `extra` arguments; the benches that need a directory service share it.
pub(crate) fn start_dir_service(
    cluster: &Cluster,
    shoal: &Path,
    data: &Path,
    (service, variant, durability, n): (&str, &str, &str, usize),
    extra: &[&str],
) -> Result<Vec<ReplicaProc>, String> {
    let mut procs = Vec::new();
    for i in 0..n {
        let node = format!("n{}", i + 1);
        let dir = data.join(service).join(format!("r{i}"));
        let log = data.join(format!("{service}-r{i}.log"));
        let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut command = if variant == "rpc2pc" {
            // The baseline is a benchmark peer: shoal-bench's agent runs it.
            let mut c = cluster.command(&node, &crate::bench_exe()?)?;
            c.args(["agent", "dir", "twopc", "--replica", &i.to_string()])
                .args(["--service", service]);
            c
        } else {
            let mut c = cluster.command(&node, shoal)?;
            c.args(["dir", "serve", "--durability", durability])
                .args(["--replica", &i.to_string(), "--replicas", &n.to_string()])
                .args(["--service", service])
                .args(extra);
            c
        };
        let child = command
            .arg("--data")
            .arg(&dir)
            .env("SHOAL_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| format!("cannot start a replica of {service} on {node}: {e}"))?;
        procs.push(ReplicaProc {
            name: format!("{service}/r{i} on {node}"),
            child,
            log,
        });
    }
    Ok(procs)
}

/// Waits until every replica of every service serves.
fn wait_serving(client: &mut Agent, procs: &mut [ReplicaProc]) -> Result<(), String> {
    let until = Instant::now() + Duration::from_secs(60);
    for (_, service, variant, _, n) in SERVICES {
        let want = if variant == "rpc2pc" {
            "paired"
        } else {
            "member"
        };
        wait_dir_service(client, procs, (service, want, n), until)?;
    }
    Ok(())
}

/// Waits until the `n` replicas of `service` (as the agent's `status`
/// command reports them) are all in phase `want`; fails at `until`, or
/// at once if one of `procs` exited, with the logs' last lines.
pub(crate) fn wait_dir_service(
    client: &mut Agent,
    procs: &mut [ReplicaProc],
    (service, want, n): (&str, &str, usize),
    until: Instant,
) -> Result<(), String> {
    loop {
        let v = client.call(&format!("status {service} {n}"))?;
        let phases: Vec<Value> = v["replicas"]
            .as_array()
            .map(|l| l.iter().map(|s| s["phase"].clone()).collect())
            .unwrap_or_default();
        if phases.len() == n && phases.iter().all(|p| p == want) {
            return Ok(());
        }
        for p in procs.iter_mut() {
            if let Ok(Some(status)) = p.child.try_wait() {
                return Err(format!("a replica exited ({status}):\n    {}", p.tail()));
            }
        }
        if Instant::now() > until {
            let tails: Vec<String> = procs.iter().map(ReplicaProc::tail).collect();
            return Err(format!(
                "{service}: replicas not serving within 60 s (phases {phases:?}):\n    {}",
                tails.join("\n    ")
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn field(v: &Value, path: &[&str]) -> f64 {
    path.iter()
        .fold(v, |v, k| &v[*k])
        .as_f64()
        .unwrap_or(f64::NAN)
}

/// Sum over the replicas of a status field, after minus before.
fn delta(before: &Value, after: &Value, path: &[&str]) -> f64 {
    let sum = |v: &Value| -> f64 {
        v["replicas"]
            .as_array()
            .map(|l| l.iter().map(|s| field(s, path)).sum())
            .unwrap_or(f64::NAN)
    };
    sum(after) - sum(before)
}

/// Runs the benchmark.
pub fn run(args: BenchArgs) -> Result<(), String> {
    let etcd = find_etcd()?;
    // Always a cluster of its own: it starts the replicas it measures.
    let run = crate::RunArgs {
        json: args.json,
        quick: args.quick,
        dir: None,
    };
    crate::on_cluster(
        &run,
        ("dir", (4, "bd", 253)),
        |guard, shoal| measure(guard.cluster(), shoal, &etcd, run.quick),
        table,
    )
}

fn measure(
    cluster: &Cluster,
    shoal: &Path,
    etcd_bin: &Path,
    quick: bool,
) -> Result<BTreeMap<String, f64>, String> {
    let (n, warmup) = if quick { (50, 10) } else { (1000, 100) };
    let phase_ms: u64 = if quick { 500 } else { 3000 };
    let mut metrics = BTreeMap::new();

    let data = DataDir::fresh("dir")?;
    eprintln!(
        "bench: starting replicas (data in {}): group bdf (fsync) and bdr (replicated, flush every {FLUSH_MS} ms) on n1-n3, rpc2pc bd2 on n1-n2",
        data.0.display()
    );
    let mut procs = start_replicas(cluster, shoal, &data.0)?;
    let mut client = Agent::start(cluster, "n4", &["dir", "client"])?;
    wait_serving(&mut client, &mut procs)?;
    for (label, service, ..) in SERVICES {
        client.call(&format!("open {label} {service}"))?;
    }

    let etcd = Etcd::start_led_from(cluster, etcd_bin, (&["n1", "n2", "n3"], 0), &mut metrics)?;

    // Phase 1: latency, with the disk counters around it.
    let statuses = |client: &mut Agent| -> Result<Vec<Value>, String> {
        SERVICES
            .iter()
            .map(|(_, service, _, _, n)| client.call(&format!("status {service} {n}")))
            .collect()
    };
    let before = statuses(&mut client)?;
    eprintln!(
        "bench: latency: {n} append-delete pairs on each service, lookups, etcd put-delete, in interleaved rounds (client on n4)"
    );
    let labels: Vec<&str> = SERVICES.iter().map(|s| s.0).collect();
    let lat = client.call(&format!(
        "latency {n} {warmup} {} group_replicated {}",
        labels.join(","),
        etcd.clients[0]
    ))?;
    for (k, v) in lat.as_object().ok_or("latency: not an object")? {
        metrics.insert(k.clone(), v.as_f64().unwrap_or(f64::NAN));
    }
    drop(etcd);
    let after = statuses(&mut client)?;
    for ((label, ..), (b, a)) in SERVICES.iter().zip(before.iter().zip(&after)) {
        // Writes applied: the index of replica 0.
        let writes = field(&a["replicas"][0], &["index"]) - field(&b["replicas"][0], &["index"]);
        let syncs = delta(b, a, &["disk", "syncs"]);
        if syncs.is_nan() || writes.is_nan() {
            eprintln!("bench: a replica of {label} did not answer a status request");
        }
        let disk_writes = delta(b, a, &["disk", "writes"]);
        metrics.insert(format!("dir_disk_syncs_per_write_{label}"), syncs / writes);
        // Where the writes were taken: the share of the replica that says
        // it orders them (none for rpc2pc).
        let replicas = a["replicas"].as_array().map_or(&[][..], Vec::as_slice);
        let taken = |r: usize| {
            field(&a["replicas"][r], &["writes"]) - field(&b["replicas"][r], &["writes"])
        };
        if let Some(at) = replicas
            .iter()
            .position(|r| !r["writes_at"].is_null() && r["endpoint"] == r["writes_at"])
        {
            let all: f64 = (0..replicas.len()).map(taken).sum();
            metrics.insert(
                format!("dir_writes_at_sequencer_share_{label}"),
                taken(at) / all,
            );
        }
        metrics.insert(
            format!("dir_disk_writes_per_write_{label}"),
            disk_writes / writes,
        );
    }

    // Phase 2: temporary names cost no disk write (replicated mode).
    let wait = Duration::from_millis(2 * FLUSH_MS + 200);
    let (mut writes, mut cancelled, mut attempts) = (f64::NAN, 0.0, 0);
    for attempt in 1..=3 {
        attempts = attempt;
        eprintln!(
            "bench: temporary names: {TMP_PAIRS} append-delete pairs on bdr between two log flushes (attempt {attempt})"
        );
        std::thread::sleep(wait);
        let b = client.call("status bdr 3")?;
        let burst = client.call(&format!("tmp group_replicated {TMP_PAIRS}"))?;
        std::thread::sleep(wait);
        let a = client.call("status bdr 3")?;
        writes = delta(&b, &a, &["disk", "writes"]);
        cancelled = (0..3)
            .map(|i| {
                field(&a["replicas"][i], &["cancelled_pairs"])
                    - field(&b["replicas"][i], &["cancelled_pairs"])
            })
            .fold(f64::INFINITY, f64::min);
        eprintln!(
            "bench:   {:.1} ms for the burst; {writes} disk writes; every replica cancelled at least {cancelled} pairs",
            field(&burst, &["ms"])
        );
        if cancelled >= TMP_PAIRS as f64 {
            break;
        }
        eprintln!("bench:   a flush fell inside a pair at some replica: again");
    }
    metrics.insert("dir_tmp_name_disk_writes".into(), writes);
    metrics.insert("dir_tmp_name_pairs".into(), TMP_PAIRS as f64);
    metrics.insert("dir_tmp_name_cancelled_pairs".into(), cancelled);
    metrics.insert("dir_tmp_name_attempts".into(), attempts as f64);

    // Phase 3: lookups on one replica.
    eprintln!(
        "bench: lookups: {LOOKUP_THREADS} client threads on n4 aimed at one replica of bdr, {phase_ms} ms"
    );
    client.call(&format!(
        "lookups group_replicated {LOOKUP_THREADS} {}",
        phase_ms / 5
    ))?;
    let l = client.call(&format!(
        "lookups group_replicated {LOOKUP_THREADS} {phase_ms}"
    ))?;
    metrics.insert("dir_lookups_per_s".into(), field(&l, &["per_s"]));
    metrics.insert("dir_lookup_us_p50_loaded".into(), field(&l, &["p50_us"]));
    metrics.insert("dir_lookup_threads".into(), field(&l, &["threads"]));
    metrics.insert("dir_lookup_replica".into(), field(&l, &["replica"]));

    // Phase 4: updates.
    eprintln!(
        "bench: updates: {UPDATE_THREADS} client threads on n4 append and delete names on bdr, {phase_ms} ms"
    );
    let u = client.call(&format!(
        "updates group_replicated {UPDATE_THREADS} {phase_ms}"
    ))?;
    metrics.insert("dir_updates_per_s".into(), field(&u, &["per_s"]));
    metrics.insert("dir_update_threads".into(), UPDATE_THREADS as f64);

    drop(client);
    drop(procs);
    drop(data);
    Ok(metrics)
}

/// The markdown report: Figure 2's ratios beside shoal's, then the
/// targets.
fn table(m: &BTreeMap<String, f64>) -> String {
    let g = |k: &str| m.get(k).copied().unwrap_or(f64::NAN);
    let rpc = g("dir_append_delete_us_rpc2pc");
    let fsync = g("dir_append_delete_us_group_fsync");
    let repl = g("dir_append_delete_us_group_replicated");
    let etcd = g("etcd_put_delete_us");
    let mut t = String::new();
    t.push_str("## Directory service (group-vs-RPC directory paper, 1992, Figure 2)\n\n");
    t.push_str("Append a name and delete it again; client on n4, which holds no replica;\n");
    t.push_str("all kinds sampled in interleaved rounds in the same run.\n\n");
    t.push_str("| append-delete | p50 (µs) | p99 (µs) | disk syncs per write (all replicas) |\n");
    t.push_str("|---|---:|---:|---:|\n");
    for (name, key, label) in [
        (
            "RPC + two-phase commit (2 replicas, intentions on disk)",
            "dir_append_delete_us_rpc2pc",
            "rpc2pc",
        ),
        (
            "group, fsync (3 replicas, r = 2, log synced before the answer)",
            "dir_append_delete_us_group_fsync",
            "group_fsync",
        ),
        (
            "group, replicated (3 replicas, r = 2, log flushed every 500 ms: the NVRAM analogue)",
            "dir_append_delete_us_group_replicated",
            "group_replicated",
        ),
    ] {
        t.push_str(&format!(
            "| {name} | {:.1} | {:.1} | {:.2} |\n",
            g(key),
            g(&format!("{key}_p99")),
            g(&format!("dir_disk_syncs_per_write_{label}"))
        ));
    }
    t.push_str(&format!(
        "| etcd put + delete (3 members, data on tmpfs; gRPC) | {etcd:.1} | {:.1} | |\n",
        g("etcd_put_delete_us_p99")
    ));
    t.push_str(&format!(
        "| for information: the same through etcd's JSON gateway | {:.1} | {:.1} | |\n",
        g("etcd_gateway_put_delete_us"),
        g("etcd_gateway_put_delete_us_p99")
    ));
    t.push_str("\n| speed-up | paper, append-delete | paper, tmp file | shoal, append-delete |\n");
    t.push_str("|---|---:|---:|---:|\n");
    for (name, paper_ad, paper_tmp, value) in [
        ("group over RPC", "1.7", "1.6", rpc / fsync),
        (
            "NVRAM (shoal: replicated) over pure group (shoal: fsync)",
            "5.6",
            "3",
            fsync / repl,
        ),
        (
            "NVRAM (shoal: replicated) over RPC",
            "9.8",
            "4.7",
            rpc / repl,
        ),
        ("group replicated over etcd", "", "", etcd / repl),
    ] {
        t.push_str(&format!(
            "| {name} | {paper_ad} | {paper_tmp} | {value:.1}× |\n"
        ));
    }
    t.push_str(
        "\nThe \"tmp file\" test also writes and reads a file: it waits for the file service.\n\n",
    );
    t.push_str("| other figures | shoal |\n|---|---:|\n");
    t.push_str(&format!(
        "| lookups/s on one replica ({} client threads on n4, each located at replica {} of bdr) | {:.0} |\n",
        g("dir_lookup_threads"),
        g("dir_lookup_replica"),
        g("dir_lookups_per_s")
    ));
    t.push_str(&format!(
        "| lookup p50, one client (µs); under that load | {:.1}; {:.1} |\n",
        g("dir_lookup_us_p50"),
        g("dir_lookup_us_p50_loaded")
    ));
    t.push_str(&format!(
        "| updates/s, group replicated ({} client threads on n4) | {:.0} |\n",
        g("dir_update_threads"),
        g("dir_updates_per_s")
    ));
    t.push_str(&format!(
        "| disk writes for {} temporary names (append + delete between two flushes; {} cancelled at every replica) | {} |\n",
        g("dir_tmp_name_pairs"),
        g("dir_tmp_name_cancelled_pairs"),
        g("dir_tmp_name_disk_writes")
    ));
    let lps = g("dir_lookups_per_s");
    report::targets(
        &mut t,
        &[
            at_most(
                "group/fsync append-delete ÷ rpc2pc append-delete",
                fsync / rpc,
                0.6,
            ),
            at_least(
                "etcd put-delete ÷ group/replicated append-delete",
                etcd / repl,
                10.0,
            ),
            none(
                "disk writes for temporary names",
                g("dir_tmp_name_disk_writes"),
            ),
            target(
                "lookups/s on one replica",
                format!("{lps:.0}"),
                "≥ 50,000",
                lps >= 50_000.0,
            ),
        ],
    );
    t
}
