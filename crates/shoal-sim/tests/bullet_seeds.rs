//! The file store under power loss and process kills, over many seeds:
//! committed-with-safety files survive byte for byte, nothing else ever
//! reads back wrong, uncommitted files vanish, fsck stays clean; with bit
//! rot, reads fail with a corruption error instead of returning wrong
//! bytes.  `SHOAL_SIM_SEEDS=N` runs more seeds; `SHOAL_SIM_SEED=S
//! SHOAL_SIM_TRACE=1` replays one with a trace.

use shoal_sim::{BulletSim, BulletSimConfig, SeedRun, check_seeds, seeds};

fn run(name: &str, cfg: BulletSimConfig) {
    // Each run stores megabytes: a tenth of the seeds of the protocol
    // scenarios keeps this scenario's time in line with theirs.
    let all = seeds();
    let n = if all.len() > 1 {
        (all.len() / 10).max(1)
    } else {
        1
    };
    check_seeds(name, all.into_iter().take(n).collect(), |seed| {
        let mut sim = BulletSim::new(seed, cfg.clone());
        let r = sim.run();
        SeedRun {
            counts: vec![
                ("power losses", r.crashes as u64),
                ("files read back", r.files_checked as u64),
            ],
            trace: sim.trace().to_vec(),
            violations: r.violations,
            ..SeedRun::default()
        }
    });
}

#[test]
fn power_loss() {
    run("bullet_power_loss", BulletSimConfig::default());
}

#[test]
fn power_loss_small_files() {
    run(
        "bullet_power_loss_small_files",
        BulletSimConfig {
            ops: 200,
            crash_chance: 0.03,
            max_data: 8 << 10,
            ..Default::default()
        },
    );
}

#[test]
fn bit_rot() {
    run(
        "bullet_bit_rot",
        BulletSimConfig {
            rot_chance: 0.05,
            ..Default::default()
        },
    );
}
