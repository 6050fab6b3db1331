//! Revocation and service-map gossip (`shoal_node::gossip`, what the
//! daemon ships, with the real signature checks) between nodes over a
//! lossy, partitioned network while nodes crash, the administrator hands
//! out new records and forgers deliver bad ones: only the admin's records
//! are held, no node goes back, and every node learns the newest once the
//! network heals.  `SHOAL_SIM_SEEDS=N` runs more seeds;
//! `SHOAL_SIM_SEED=S` replays one.

use shoal_sim::{GossipSim, GossipSimConfig, SeedRun, check_seeds, seeds};

fn run(name: &str, cfg: GossipSimConfig) {
    check_seeds(name, seeds(), |seed| {
        let r = GossipSim::new(seed, cfg.clone()).run();
        SeedRun {
            counts: vec![
                ("records issued", r.issued),
                ("taken from peers", r.taken_from_peers),
                ("forgeries refused", r.forgeries_refused),
                ("crashes", r.crashes),
            ],
            violations: r.violations,
            trace: r.trace,
            ..SeedRun::default()
        }
    });
}

#[test]
fn gossip_under_loss_crashes_and_forgers() {
    run("gossip", GossipSimConfig::default());
}

#[test]
fn gossip_in_a_larger_flakier_cluster() {
    run(
        "gossip_flaky",
        GossipSimConfig {
            nodes: 9,
            loss_chance: 0.5,
            crash_chance: 0.03,
            cut_chance: 0.1,
            issue_every: std::time::Duration::from_secs(10),
            ..Default::default()
        },
    );
}
