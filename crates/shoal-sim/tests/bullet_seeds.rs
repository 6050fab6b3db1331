//! The file store under power loss and process kills, over many seeds:
//! committed-with-safety files survive byte for byte, nothing else ever
//! reads back wrong, uncommitted files vanish, fsck stays clean; with bit
//! rot, reads fail with a corruption error instead of returning wrong
//! bytes.  `SHOAL_SIM_SEEDS=N` runs more seeds; `SHOAL_SIM_SEED=S
//! SHOAL_SIM_TRACE=1` replays one with a trace.

use shoal_sim::{BulletSim, BulletSimConfig, seeds};

fn run(name: &str, cfg: BulletSimConfig) {
    let mut failed = Vec::new();
    let (mut crashes, mut checked) = (0, 0);
    // Each run stores megabytes: a tenth of the seeds of the protocol
    // scenarios keeps this scenario's time in line with theirs.
    let all = seeds();
    let n = if all.len() > 1 {
        (all.len() / 10).max(1)
    } else {
        1
    };
    for seed in all.into_iter().take(n) {
        let mut sim = BulletSim::new(seed, cfg.clone());
        let report = sim.run();
        crashes += report.crashes;
        checked += report.files_checked;
        if !report.violations.is_empty() {
            if std::env::var_os("SHOAL_SIM_TRACE").is_some() {
                for l in sim.trace() {
                    eprintln!("{l}");
                }
            }
            failed.push((seed, report.violations));
        }
    }
    eprintln!("{name}: {n} seeds, {crashes} power losses, {checked} files read back");
    assert!(
        crashes > 0 && checked > 0,
        "{name}: the run checked nothing"
    );
    assert!(
        failed.is_empty(),
        "{name}: {} seeds failed; first: seed {} {:?} (replay: SHOAL_SIM_SEED={} SHOAL_SIM_TRACE=1)",
        failed.len(),
        failed[0].0,
        failed[0].1,
        failed[0].0
    );
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
