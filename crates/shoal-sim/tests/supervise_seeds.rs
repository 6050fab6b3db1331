//! The node supervisor's core (`shoal_node::supervise`, what the daemon
//! ships) over a simulated edge of crashing children, failing spawns,
//! children that ignore SIGTERM and an operator's random commands: no
//! double start or stray signal, back-off exactly as written, policies
//! kept, stops that end, and every wanted service running once crashes
//! stop.  `SHOAL_SIM_SEEDS=N` runs more seeds; `SHOAL_SIM_SEED=S` replays
//! one.

use shoal_sim::{SeedRun, SuperviseSim, SuperviseSimConfig, check_seeds, seeds};

fn run(name: &str, cfg: SuperviseSimConfig) {
    check_seeds(name, seeds(), |seed| {
        let r = SuperviseSim::new(seed, cfg.clone()).run();
        SeedRun {
            counts: vec![
                ("spawns", r.spawns),
                ("crashes", r.crashes),
                ("back-offs", r.backoffs),
                ("SIGKILLs", r.kills),
                ("commands", r.commands),
            ],
            violations: r.violations,
            trace: r.trace,
            ..SeedRun::default()
        }
    });
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
