//! `shoal-dir-workload`: the test workload of `shoal_dirsvc::workload`,
//! printing one JSON line per operation, for the real-cluster
//! linearizability tests (`crates/shoal/tests/dir.rs`).  A program of its
//! own, which the packages do not install: what users run carries no test
//! machinery.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use shoal_cap::Capability;
use shoal_dirsvc::workload::{self, Workload};
use shoal_rpc::Context;

/// The directory test workload: JSON lines of operations and their times.
#[derive(Parser)]
#[command(version)]
struct WorkloadArgs {
    /// The directory to work in (one column).
    #[arg(long)]
    dir: Capability,
    /// Concurrent clients.
    #[arg(long, default_value_t = 3)]
    clients: usize,
    /// Operations per client.
    #[arg(long, default_value_t = 50)]
    ops: usize,
    /// Stop after this many seconds (if sooner than --ops).
    #[arg(long)]
    seconds: Option<f64>,
    /// Names in play.
    #[arg(long, default_value_t = 3)]
    names: u8,
    /// Distinguishes this process's clients and values from others'.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How long a call retries before its outcome counts as unknown (s).
    #[arg(long, default_value_t = 20)]
    retry_s: u64,
    /// Only look every name up once.
    #[arg(long)]
    final_reads: bool,
}

fn main() -> ExitCode {
    let args = WorkloadArgs::parse();
    if args.names < 2 {
        eprintln!("shoal-dir-workload: --names must be at least 2");
        return ExitCode::from(2);
    }
    let ctx = match Context::from_env() {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("shoal-dir-workload: {e}");
            return ExitCode::from(3);
        }
    };
    let records = if args.final_reads {
        workload::final_reads(&ctx, args.dir, args.names, args.seed)
    } else {
        let w = Workload {
            clients: args.clients,
            ops: args.ops,
            duration: args.seconds.map(Duration::from_secs_f64),
            names: args.names,
            seed: args.seed,
            retry_for: Duration::from_secs(args.retry_s),
        };
        workload::run(&ctx, args.dir, &w)
    };
    for r in records {
        println!("{}", r.to_json());
    }
    ExitCode::SUCCESS
}
