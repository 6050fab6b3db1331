//! Deterministic simulation of shoal's protocol cores.
//!
//! One thread, one seeded random generator, one virtual clock: the
//! simulator hosts node daemons (locate [`Registry`], [`Membership`]),
//! server endpoints ([`ServerCore`] with an echo application that records
//! every execution) and client endpoints ([`ClientCore`] running a script of
//! transactions), and moves their datagrams through a network that drops,
//! duplicates, delays (and so reorders) packets, partitions nodes, and
//! answers datagrams to closed ports with "unreachable" as a kernel would.
//! Scripted faults crash and restart servers and whole nodes, and move
//! servers between nodes.
//!
//! Every datagram between a client and a server is sealed and opened by the
//! real session code (`seal.rs`: `shoal_session::Channel`), and a scenario
//! can have the network replay captured datagrams after the servers forgot
//! them ([`SimConfig::replay`]).
//!
//! Everything that happens is a function of the seed: a failing run replays
//! exactly with the same seed (see `docs/testing.md`).  The checks
//! ([`Sim::check`]) are the protocol's promises:
//!
//! - **at-most-once**: no (client, sequence) is ever executed twice, by any
//!   instance of any server;
//! - **integrity**: every successful reply is the reply to that request;
//! - **no hang**: every transaction ends by its deadline;
//! - **honest errors**: a request reported as never executed was not;
//! - **sealing**: every datagram between endpoints opens, except replays,
//!   which the windows refuse (counted in [`Report::replays_refused`]);
//! - **liveness** (after the faults heal): every transaction succeeds.
//!
//! [`Registry`]: shoal_proto::Registry
//! [`Membership`]: shoal_proto::Membership
//! [`ServerCore`]: shoal_proto::ServerCore
//! [`ClientCore`]: shoal_proto::ClientCore

pub mod bullet;
pub mod dir;
pub mod fs;
pub mod fs_private;
pub mod gossip;
mod group;
pub mod group_keys;
pub mod linearize;
pub mod manage;
mod net;
mod seal;
mod sim;
pub mod supervise;
mod timeline;

pub use bullet::{BulletReport, BulletSim, BulletSimConfig};
pub use dir::{DirReport, DirSim, DirSimConfig};
pub use fs::{FsReport, FsSim, FsSimConfig};
pub use fs_private::{PrivateReport, PrivateSim, PrivateSimConfig};
pub use gossip::{GossipReport, GossipSim, GossipSimConfig};
pub use group::{GroupReport, GroupSim, GroupSimConfig};
pub use group_keys::{KeysReport, KeysSim, KeysSimConfig};
pub use manage::{ManageReport, ManageSim, ManageSimConfig};
pub use net::Faults;
pub use sim::{Outcome, Report, Sim, SimConfig};
pub use supervise::{SuperviseReport, SuperviseSim, SuperviseSimConfig};

/// The seeds a test runs: `SHOAL_SIM_SEED=S` alone, else `0..N` with
/// `N` from `SHOAL_SIM_SEEDS` (default 64).
pub fn seeds() -> Vec<u64> {
    if let Some(s) = std::env::var("SHOAL_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![s];
    }
    let n = std::env::var("SHOAL_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    (0..n).collect()
}

/// [`seeds`], and then `regressions`: seeds that once failed, which a
/// scenario runs every time (not when `SHOAL_SIM_SEED` picks one).
pub fn seeds_and(regressions: &[u64]) -> Vec<u64> {
    let mut all = seeds();
    if std::env::var_os("SHOAL_SIM_SEED").is_none() {
        all.extend(
            regressions
                .iter()
                .filter(|s| !all.contains(s))
                .collect::<Vec<_>>(),
        );
    }
    all
}

/// What one seed's run gives [`check_seeds`]: counters to add up over the
/// seeds, the promises it saw broken, and its trace (if the scenario
/// keeps one: with `SHOAL_SIM_TRACE` set, printed when the seed failed).
#[derive(Default)]
pub struct SeedRun {
    /// Counters that must not stay at zero over all the seeds.
    pub counts: Vec<(&'static str, u64)>,
    /// Counters that are only shown.
    pub also: Vec<(&'static str, u64)>,
    pub violations: Vec<String>,
    pub trace: Vec<String>,
}

/// Runs `run` for every seed, prints the counters' sums, and fails if a
/// seed broke a promise, naming the first such seed and how to replay it,
/// or if any of the counts that must move stayed at zero over all the
/// seeds (the scenario checked nothing).
pub fn check_seeds(name: &str, seeds: Vec<u64>, mut run: impl FnMut(u64) -> SeedRun) {
    let n = seeds.len();
    let mut totals: Vec<(&'static str, u64, bool)> = Vec::new();
    let mut failed = Vec::new();
    for seed in seeds {
        let r = run(seed);
        let counts = r.counts.into_iter().map(|(w, c)| (w, c, true));
        for (what, count, needed) in counts.chain(r.also.into_iter().map(|(w, c)| (w, c, false))) {
            match totals.iter_mut().find(|t| t.0 == what) {
                Some(t) => t.1 += count,
                None => totals.push((what, count, needed)),
            }
        }
        if !r.violations.is_empty() {
            if std::env::var_os("SHOAL_SIM_TRACE").is_some() {
                for line in &r.trace {
                    eprintln!("{line}");
                }
            }
            failed.push((seed, r.violations));
        }
    }
    let sums: Vec<String> = totals.iter().map(|(w, c, _)| format!("{c} {w}")).collect();
    let sums = sums.join(", ");
    eprintln!("{name}: {n} seeds, {sums}");
    assert!(
        failed.is_empty(),
        "{name}: {} seeds failed; first: seed {} {:?} (replay: SHOAL_SIM_SEED={} SHOAL_SIM_TRACE=1)",
        failed.len(),
        failed[0].0,
        failed[0].1,
        failed[0].0
    );
    assert!(
        totals.iter().all(|t| t.1 > 0 || !t.2),
        "{name}: the run checked nothing ({sums})"
    );
}
