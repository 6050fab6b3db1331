//! The object manager's pass (the core `shoal file manage` runs) over real
//! file stores while clients make, name, move and unname files and servers
//! come and go: nothing named is ever destroyed, every entry ends with k
//! replicas once faults heal, and what nothing names is reclaimed.
//! `SHOAL_SIM_SEEDS=N` runs more seeds; `SHOAL_SIM_SEED=S` replays one.

use shoal_sim::{ManageSim, ManageSimConfig, SeedRun, check_seeds, seeds};

fn run(name: &str, cfg: ManageSimConfig) {
    check_seeds(name, seeds(), |seed| {
        let r = ManageSim::new(seed, cfg.clone()).run();
        SeedRun {
            counts: vec![
                ("files made", r.made),
                ("ageings", r.ages),
                ("files reclaimed", r.destroyed_by_age),
                ("replicas made again", r.recreated),
            ],
            violations: r.violations,
            ..SeedRun::default()
        }
    });
}

#[test]
fn manager_passes_under_faults() {
    run("manage", ManageSimConfig::default());
}

#[test]
fn manager_passes_verifying() {
    run(
        "manage_verify",
        ManageSimConfig {
            verify: true,
            ..Default::default()
        },
    );
}

#[test]
fn manager_passes_under_churn() {
    run(
        "manage_churn",
        ManageSimConfig {
            servers: 5,
            k: 3,
            unname_chance: 0.08,
            move_chance: 0.04,
            server_flip_chance: 0.03,
            lose_chance: 0.03,
            list_fail_chance: 0.05,
            ..Default::default()
        },
    );
}
