//! The node supervisor's core (`shoal_node::supervise`, what the daemon
//! ships) over a simulated edge of crashing children, failing spawns,
//! children that ignore SIGTERM and an operator's random commands: no
//! double start or stray signal, back-off exactly as written, policies
//! kept, stops that end, and every wanted service running once crashes
//! stop.  `SHOAL_SIM_SEEDS=N` runs more seeds; `SHOAL_SIM_SEED=S` replays
//! one.

use shoal_sim::{SuperviseSim, SuperviseSimConfig, seeds};

fn run(name: &str, cfg: SuperviseSimConfig) {
    let mut failed = Vec::new();
    let (mut spawns, mut crashes, mut backoffs, mut kills, mut commands) = (0, 0, 0, 0, 0);
    let all = seeds();
    let n = all.len();
    for seed in all {
        let report = SuperviseSim::new(seed, cfg.clone()).run();
        spawns += report.spawns;
        crashes += report.crashes;
        backoffs += report.backoffs;
        kills += report.kills;
        commands += report.commands;
        if !report.violations.is_empty() {
            failed.push((seed, report.violations));
        }
    }
    eprintln!(
        "{name}: {n} seeds, {spawns} spawns, {crashes} crashes, {backoffs} back-offs, {kills} SIGKILLs, {commands} commands"
    );
    assert!(
        spawns > 0 && crashes > 0 && backoffs > 0 && kills > 0 && commands > 0,
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
fn supervisor_under_crashes_and_commands() {
    run("supervise", SuperviseSimConfig::default());
}

#[test]
fn supervisor_under_a_busy_operator() {
    run(
        "supervise_busy",
        SuperviseSimConfig {
            services: 2,
            command_every: std::time::Duration::from_secs(2),
            spawn_fail_chance: 0.3,
            ..Default::default()
        },
    );
}
