//! The object manager's pass (the core `shoal file manage` runs) over real
//! file stores while clients make, name, move and unname files and servers
//! come and go: nothing named is ever destroyed, every entry ends with k
//! replicas once faults heal, and what nothing names is reclaimed.
//! `SHOAL_SIM_SEEDS=N` runs more seeds; `SHOAL_SIM_SEED=S` replays one.

use shoal_sim::{ManageSim, ManageSimConfig, seeds};

fn run(name: &str, cfg: ManageSimConfig) {
    let mut failed = Vec::new();
    let (mut ages, mut destroyed, mut recreated, mut made) = (0, 0, 0, 0);
    let all = seeds();
    let n = all.len();
    for seed in all {
        let report = ManageSim::new(seed, cfg.clone()).run();
        ages += report.ages;
        destroyed += report.destroyed_by_age;
        recreated += report.recreated;
        made += report.made;
        if !report.violations.is_empty() {
            failed.push((seed, report.violations));
        }
    }
    eprintln!(
        "{name}: {n} seeds, {made} files made, {ages} ageings, {destroyed} files reclaimed, {recreated} replicas made again"
    );
    assert!(
        ages > 0 && destroyed > 0 && recreated > 0,
        "{name}: the run checked nothing"
    );
    assert!(
        failed.is_empty(),
        "{name}: {} seeds failed; first: seed {} {:?} (replay: SHOAL_SIM_SEED={})",
        failed.len(),
        failed[0].0,
        failed[0].1,
        failed[0].0
    );
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
