//! shoal's benchmark suite.
//!
//! Every benchmark measures shoal and its baseline in the same run, on the
//! same nodes and with the same placement, because on a shared, noisy
//! machine only ratios mean anything.  Results are JSON
//! (`{"metrics": {name: number}}`) plus a markdown table set beside the
//! figures of the paper the benchmark comes from.
//!
//! - [`rpc`]: `shoal bench rpc`, Table 1 of the Amoeba–Sprite comparison:
//!   null, 16 KiB and 30,000-byte RPCs and a 64 MiB transfer, against raw
//!   UDP, raw TCP, a TLS 1.3 stream and gRPC (in the clear and over TLS);
//!   the node session handshake and the AEAD's in-memory rate.
//! - [`group`]: `shoal bench group`, group communication after the
//!   group-vs-RPC directory paper: send latency at resilience 0, 1 and 2,
//!   throughput, datagrams per message and fail-over, beside a null RPC
//!   and a three-member etcd cluster.
//! - [`dir`]: `shoal bench dir`, the directory service after the same
//!   paper's Figure 2: append-delete on the group variant (fsync and
//!   replicated durability) and the RPC variant with two-phase commit,
//!   lookups and updates per second, disk writes for temporary names,
//!   beside a three-member etcd cluster.
//! - [`file`]: `shoal bench file`, the file service after the Amoeba–Sprite
//!   comparison's Table 2: create-read-destroy cycles from 0 B to 100 MiB,
//!   100 MiB reads (client cache, remote, uncached), a 4 KiB append to a
//!   100 MiB file and the directory paper's tmp-file experiment, each
//!   beside its local-disk twin (and etcd for the tmp file's name).
//! - [`exec`]: `shoal bench exec`, the processor pool after the
//!   Amoeba–Sprite comparison's Table 4 (a null program started locally,
//!   on a named node, on a chosen node, against fork+exec and ssh), 1 GiB
//!   through a remote program's stdout, and the Sprite migration paper's
//!   Table 5 (a C build with make, shoal make and distcc).
//! - [`fs`]: `shoal bench fs`, the shared file system: temporary files,
//!   creates, unlinks, cached stats, re-reads, random reads and writes on
//!   /shoal beside tmpfs and the local disk, and visibility after a close
//!   on another node.
//! - [`grpc`]: the gRPC echo peer (in the clear and over TLS); [`tls`]:
//!   the TLS 1.3 stream peer; [`etcd`]: the etcd baseline;
//!   [`agent`]: the driver's side of the agents that run on nodes.

pub mod agent;
mod crypto;
pub mod dir;
pub mod etcd;
pub mod exec;
pub mod file;
pub mod fs;
mod fusenull;
pub mod group;
pub mod grpc;
mod peers;
mod report;
pub mod rpc;
mod sshd;
mod stats;
pub mod tls;

/// This machine's CPU model, as `/proc/cpuinfo` names it: ratios that
/// hold on one vendor's cores need not hold on another's.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Sets the CPUs thread `tid` may run on (0: the calling thread); threads
/// it starts later inherit them.
pub(crate) fn set_affinity(tid: i32, cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays in bounds for
    // CPU numbers below 1024, which the machine's CPUs are.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        // SAFETY: as above.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size given.
    if unsafe { libc::sched_setaffinity(tid, size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Says which CPU a benchmark runs on, first thing.
pub(crate) fn announce_cpu() {
    eprintln!(
        "bench: CPU {} ({} cores)",
        cpu_model(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
}

/// The flags every benchmark that runs on a cluster takes.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Write the metrics as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Fewer samples and smaller sizes: a smoke run, not a measurement.
    #[arg(long)]
    pub quick: bool,
    /// Use the existing cluster in this directory (with the nodes the
    /// benchmark names) instead of starting a temporary one.
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
}

/// A benchmark's whole run: on the cluster in `args.dir`, or a temporary
/// one of `shape` (nodes, their name, subnet) for `bench`, `measure` runs
/// (given the cluster and the `shoal` program); with the cluster gone,
/// the report `table` makes is printed and the metrics written as JSON.
pub(crate) fn on_cluster<M: serde::Serialize>(
    args: &RunArgs,
    (bench, shape): (&str, (usize, &str, u8)),
    measure: impl FnOnce(&agent::ClusterGuard, &std::path::Path) -> Result<M, String>,
    table: impl FnOnce(&M) -> String,
) -> Result<(), String> {
    announce_cpu();
    let shoal = shoal_exe()?;
    let guard = agent::ClusterGuard::open_or_start(args.dir.as_deref(), bench, shape, &shoal)?;
    let metrics = measure(&guard, &shoal);
    drop(guard);
    let metrics = metrics?;
    println!("{}", table(&metrics));
    write_json(args.json.as_deref(), &metrics, args.quick)
}

/// Writes a benchmark's metrics as `{"metrics": ..., "quick": ...}` to
/// `path`, if one was given, with the CPU model among the metrics.
pub(crate) fn write_json(
    path: Option<&std::path::Path>,
    metrics: &impl serde::Serialize,
    quick: bool,
) -> Result<(), String> {
    let Some(path) = path else { return Ok(()) };
    let mut metrics = serde_json::to_value(metrics).expect("metrics serialize");
    if let Some(m) = metrics.as_object_mut() {
        m.insert("cpu_model".into(), cpu_model().into());
    }
    let json = serde_json::json!({ "metrics": metrics, "quick": quick });
    std::fs::write(
        path,
        serde_json::to_string_pretty(&json).expect("serializes"),
    )
    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    eprintln!("bench: wrote {}", path.display());
    Ok(())
}

/// The `shoal` program the benchmarks run (the cluster, its servers, the
/// commands they time): the one installed beside this program, else the
/// first on `PATH`.
pub fn shoal_exe() -> Result<std::path::PathBuf, String> {
    shoal_cluster::program_beside("shoal")
        .ok_or_else(|| "shoal-bench runs shoal, which is neither beside it nor on PATH".to_string())
}

/// This program: its `agent` subcommands are the halves of a benchmark
/// that run on the cluster's nodes.
pub(crate) fn bench_exe() -> Result<std::path::PathBuf, String> {
    std::env::current_exe().map_err(|e| format!("cannot find shoal-bench itself: {e}"))
}

/// A zeroed buffer of `len` bytes starting on a page boundary, for
/// timed reads.  A copy into a destination 16 bytes past a cache line
/// runs at a quarter of the speed on some AMD cores, and a 1 MiB `Vec`
/// from glibc's `mmap` starts just there: the figure would then time
/// where the allocator put the buffer, not the file system (`dd` and
/// `cp` read into page-aligned buffers too).
pub(crate) struct PageBuf {
    raw: Vec<u8>,
    at: usize,
    len: usize,
}

impl PageBuf {
    pub(crate) fn new(len: usize) -> PageBuf {
        let raw = vec![0u8; len + 4096];
        let at = raw.as_ptr().align_offset(4096);
        PageBuf { raw, at, len }
    }
}

impl std::ops::Deref for PageBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.raw[self.at..self.at + self.len]
    }
}

impl std::ops::DerefMut for PageBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.at..self.at + self.len]
    }
}
