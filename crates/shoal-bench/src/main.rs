//! `shoal-bench`: shoal's benchmark suite, a program of its own so that
//! the `shoal` every user runs links none of the peers it is measured
//! against (gRPC, TLS, an etcd client, Lua's sources).  `shoal bench ...`
//! runs it when it is installed beside `shoal` or on `PATH`.
//!
//! Exit codes: 0 success; 1 the benchmark failed; 2 bad usage.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "shoal bench",
    bin_name = "shoal bench",
    version,
    about = "shoal's benchmarks, each beside its baselines in one run: JSON (--json) and a table next to the paper's"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// RPC latency and throughput against raw UDP, raw TCP and gRPC
    /// (nodes n1 and n2).
    Rpc(shoal_bench::rpc::BenchArgs),
    /// Group communication (r = 0, 1, 2), throughput, datagrams per
    /// message and fail-over, beside a null RPC and an etcd cluster
    /// (nodes n1 to n3).
    Group(shoal_bench::group::BenchArgs),
    /// The directory service after the paper's Figure 2: append-delete on
    /// the RPC variant with two-phase commit and the group variant (fsync
    /// and replicated), lookups and updates per second, disk writes for
    /// temporary names, beside an etcd cluster.
    Dir(shoal_bench::dir::BenchArgs),
    /// The file service after the Amoeba–Sprite paper's Table 2:
    /// create-read-destroy cycles (0 B to 100 MiB), 100 MiB reads (client
    /// cache, remote, uncached), a 4 KiB append to a 100 MiB file and the
    /// tmp-file experiment, beside the local disk and an etcd cluster
    /// (nodes n1 to n3).
    File(shoal_bench::file::BenchArgs),
    /// The processor pool after the Amoeba–Sprite paper's Table 4 and the
    /// Sprite migration paper's Table 5: a null program started locally,
    /// on a named node and on a chosen node against fork+exec and ssh;
    /// 1 GiB through a remote program's stdout; a C build with make,
    /// shoal make and distcc (nodes n1 to n4).
    Exec(shoal_bench::exec::BenchArgs),
    /// The shared file system (/shoal): temporary files, creates, unlinks,
    /// cached stats, re-reads, random reads and writes, beside tmpfs, the
    /// local disk, sshfs and a null FUSE file system (FUSE's floor here);
    /// visibility after a close on another node (nodes n1 and n2, with
    /// /shoal mounted).
    Fs(shoal_bench::fs::BenchArgs),
    /// Internal: the halves of a benchmark that run on cluster nodes.
    #[command(hide = true, subcommand)]
    Agent(AgentCommand),
}

/// The agents of every benchmark: `rpc`'s (`serve`, `client`), `group
/// member`, `dir client`, `file client`, `exec timer` and `fs worker`.
#[derive(Subcommand)]
enum AgentCommand {
    #[command(flatten)]
    Rpc(shoal_bench::rpc::AgentCommand),
    /// `shoal bench group`'s agents.
    #[command(subcommand)]
    Group(shoal_bench::group::AgentCommand),
    /// `shoal bench dir`'s agents.
    #[command(subcommand)]
    Dir(shoal_bench::dir::AgentCommand),
    /// `shoal bench file`'s agents.
    #[command(subcommand)]
    File(shoal_bench::file::AgentCommand),
    /// `shoal bench exec`'s agents.
    #[command(subcommand)]
    Exec(shoal_bench::exec::AgentCommand),
    /// `shoal bench fs`'s agents.
    #[command(subcommand)]
    Fs(shoal_bench::fs::AgentCommand),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let result = match cli.command {
        Command::Rpc(args) => shoal_bench::rpc::run(args),
        Command::Group(args) => shoal_bench::group::run(args),
        Command::Dir(args) => shoal_bench::dir::run(args),
        Command::File(args) => shoal_bench::file::run(args),
        Command::Exec(args) => shoal_bench::exec::run(args),
        Command::Fs(args) => shoal_bench::fs::run(args),
        Command::Agent(AgentCommand::Rpc(c)) => shoal_bench::rpc::agent(c),
        Command::Agent(AgentCommand::Group(c)) => shoal_bench::group::agent(c),
        Command::Agent(AgentCommand::Dir(c)) => shoal_bench::dir::agent(c),
        Command::Agent(AgentCommand::File(c)) => shoal_bench::file::agent(c),
        Command::Agent(AgentCommand::Exec(c)) => shoal_bench::exec::agent(c),
        Command::Agent(AgentCommand::Fs(c)) => shoal_bench::fs::agent(c),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shoal bench: {e}");
            ExitCode::FAILURE
        }
    }
}
