//! A group's keys (`shoal_group::keys` and `shoal_group::seal`, what the
//! group shell ships) while members join, leave and have their nodes
//! revoked, calls are lost or arrive after their caller gave up, and a
//! stranger asks for keys and forges rekeys: no stranger or forgery gets
//! in, no member goes back, every member is current once the network
//! heals, and nobody out of the group reads it.  `SHOAL_SIM_SEEDS=N` runs
//! more seeds; `SHOAL_SIM_SEED=S` replays one.

use shoal_sim::{KeysSim, KeysSimConfig, SeedRun, check_seeds, seeds};

fn run(name: &str, cfg: KeysSimConfig) {
    check_seeds(name, seeds(), |seed| {
        let mut sim = KeysSim::new(seed, cfg.clone());
        let r = sim.run();
        SeedRun {
            counts: vec![
                ("keys drawn", r.draws),
                ("rekeys taken", r.rekeys_taken),
                ("joins", r.joins),
                ("leaves", r.leaves),
                ("revocations", r.revocations),
                ("catch-ups", r.catch_ups),
                ("datagrams opened", r.opened),
                ("requests refused", r.refused),
                ("late calls", r.late_calls),
                ("pushes dropped", r.pushes_dropped),
            ],
            violations: r.violations,
            trace: sim.trace().to_vec(),
            ..SeedRun::default()
        }
    });
}

#[test]
fn group_keys_of_an_owned_group_under_churn_loss_and_a_stranger() {
    run("group_keys", KeysSimConfig::default());
}

#[test]
fn group_keys_of_an_open_group_in_a_flakier_network() {
    run(
        "group_keys_open",
        KeysSimConfig {
            procs: 7,
            open: true,
            loss_chance: 0.3,
            late_chance: 0.1,
            churn_every: std::time::Duration::from_secs(3),
            ..Default::default()
        },
    );
}
