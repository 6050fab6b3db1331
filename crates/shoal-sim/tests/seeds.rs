//! The simulator over many seeds.  `SHOAL_SIM_SEEDS=N` runs N seeds per
//! scenario (default 64); `SHOAL_SIM_SEED=S` replays seed S alone, and
//! `SHOAL_SIM_TRACE=1` prints its event trace on failure.

use shoal_sim::{Faults, Sim, SimConfig};

use shoal_sim::seeds;

fn run(seed: u64, config: SimConfig) -> shoal_sim::Report {
    run_checked(seed, config, |_| Ok(()))
}

/// Runs one seed; on a broken promise or a failed `extra` check, prints the
/// trace (when recorded) and how to replay.
fn run_checked(
    seed: u64,
    config: SimConfig,
    extra: impl FnOnce(&shoal_sim::Report) -> Result<(), String>,
) -> shoal_sim::Report {
    let mut sim = Sim::new(seed, config);
    match sim.run().and_then(|r| extra(&r).map(|()| r)) {
        Ok(report) => report,
        Err(e) => {
            for line in sim.trace() {
                eprintln!("{line}");
            }
            panic!(
                "seed {seed}: {e}\nreplay: SHOAL_SIM_SEED={seed} SHOAL_SIM_TRACE=1 cargo test -p shoal-sim"
            );
        }
    }
}

fn no_errors(r: &shoal_sim::Report) -> Result<(), String> {
    if r.errors.is_empty() {
        Ok(())
    } else {
        Err(format!("errors {:?}", r.errors))
    }
}

/// Loss, duplication, reordering, server crashes and moves, node crashes
/// and partitions: at-most-once, integrity, deadlines and honest errors
/// hold throughout, and everything succeeds once the faults heal.
#[test]
fn promises_hold_under_faults() {
    let mut total_ok = 0;
    let mut total_err = 0;
    for seed in seeds() {
        let r = run(seed, SimConfig::default());
        total_ok += r.ok;
        total_err += r.errors.values().sum::<usize>();
    }
    // The scenario must exercise both paths, or it checks nothing.
    assert!(total_ok > 0, "no transaction succeeded in any seed");
    assert!(
        total_err > 0,
        "no fault ever caused an error: faults are not injected"
    );
}

/// Servers that refuse (too many clients, bodies too large) and windows
/// that differ between the ends: refusals are honest (never followed by a
/// late execution) and final, and nothing runs twice.
#[test]
fn refusals_are_final_and_windows_need_not_agree() {
    let mut refused = 0;
    for seed in seeds() {
        let config = SimConfig {
            clients: 5,
            window: 4,
            server_window: 16,
            server_max_records: 3,
            server_max_request: 4_000,
            max_body: 6_000,
            ..SimConfig::default()
        };
        // After healing, some calls are still refused by design, so only
        // the safety promises are checked here.
        let mut sim = Sim::new(seed, config);
        let _ = sim.run_until(|_| false);
        let r = sim.check_safety().unwrap_or_else(|e| panic!("{e}"));
        refused += r.errors.get("busy").copied().unwrap_or(0)
            + r.errors.get("too-large").copied().unwrap_or(0);
    }
    assert!(
        refused > 0,
        "no request was ever refused: the scenario checks nothing"
    );
}

/// With a clean network and no faults, every transaction succeeds.
#[test]
fn clean_network_every_transaction_succeeds() {
    for seed in seeds().into_iter().take(16) {
        let config = SimConfig {
            faults: Faults::none(),
            crash_servers: false,
            crash_nodes: false,
            partitions: false,
            fault_phase_us: 0,
            max_body: 20_000,
            ..SimConfig::default()
        };
        let r = run_checked(seed, config, no_errors);
        assert_eq!(r.ok, 4 * 25);
    }
}

/// Loss and reordering alone (no crashes): every transaction still
/// succeeds, through retransmission, and none runs twice.
#[test]
fn loss_alone_never_fails_a_transaction() {
    for seed in seeds().into_iter().take(32) {
        let config = SimConfig {
            faults: Faults {
                drop: 0.05,
                duplicate: 0.05,
                delay_min_us: 50,
                delay_max_us: 3_000,
            },
            crash_servers: false,
            crash_nodes: false,
            partitions: false,
            deadline_us: 20_000_000,
            ..SimConfig::default()
        };
        run_checked(seed, config, no_errors);
    }
}

/// A server stopped and started on another node between two calls is
/// found again by its clients without any error reaching them.
#[test]
fn clients_relocate_a_moved_server() {
    for seed in seeds().into_iter().take(32) {
        let config = SimConfig {
            nodes: 4,
            servers: 1,
            clients: 1,
            txns_per_client: 10,
            faults: Faults::none(),
            crash_servers: false,
            crash_nodes: false,
            partitions: false,
            fault_phase_us: 0,
            think_us: (50_000, 50_000),
            ..SimConfig::default()
        };
        let mut sim = Sim::new(seed, config);
        for (round, node) in [1usize, 2, 3, 0].into_iter().enumerate() {
            let done = round * 2 + 2;
            assert!(sim.run_until(|s| s.outcomes().len() >= done && !s.client_busy(0)));
            sim.move_server(0, node);
        }
        let report = sim.run().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(report.ok, 10, "seed {seed}: {:?}", report.errors);
    }
}

/// The network captures datagrams between endpoints and sends them again
/// after the servers forgot their callers' records: the channels' replay
/// windows refuse every one (counted), and at-most-once holds.
#[test]
fn replays_after_the_records_expired_never_run() {
    let mut refused = 0;
    for seed in seeds() {
        let config = SimConfig {
            replay: 0.05,
            ..SimConfig::default()
        };
        let r = run(seed, config);
        refused += r.replays_refused;
    }
    assert!(
        refused > 0,
        "no replay ever reached an endpoint: the scenario checks nothing"
    );
}
