//! The shared file system's consistency protocol, with the mount's own
//! cache, over many seeds: no read returns stale bytes, no write is lost
//! (no write-back refused, every appended record once and in order), no
//! fsync is lost to a mount crash, and every request is answered.
//! `SHOAL_SIM_SEEDS=N` runs more seeds; `SHOAL_SIM_SEED=S
//! SHOAL_SIM_TRACE=1` replays one with a trace.

use shoal_sim::{FsSim, FsSimConfig, SeedRun, check_seeds, seeds_and};

/// Runs `cfg` over the seeds and `regressions`, seeds that once failed.
fn run(name: &str, cfg: FsSimConfig, regressions: &[u64]) {
    check_seeds(name, seeds_and(regressions), |seed| {
        let mut sim = FsSim::new(seed, cfg.clone());
        let r = sim.run();
        SeedRun {
            counts: vec![
                ("reads checked", r.reads_checked as u64),
                ("uncached opens", r.uncached_opens as u64),
                ("recalls", r.recalls as u64),
            ],
            also: vec![
                ("mount crashes", r.crashes as u64),
                ("fsyncs checked after crashes", r.fsyncs_checked as u64),
                ("appended records checked", r.records_checked as u64),
            ],
            trace: sim.trace().to_vec(),
            violations: r.violations,
        }
    });
}

#[test]
fn fs_sharing() {
    // 535: a commit's answer overtaken by an older open's, which took the
    // cache back to the version before the commit (a stale read).
    run("fs_sharing", FsSimConfig::default(), &[535]);
}

#[test]
fn fs_sharing_with_crashes() {
    run(
        "fs_sharing_with_crashes",
        FsSimConfig {
            crash_chance: 0.02,
            ..FsSimConfig::default()
        },
        &[832],
    );
}

/// Programs on every mount appending records to shared logs (`O_APPEND`)
/// while others write and read them: every record once, in order.
#[test]
fn fs_appends_from_many_mounts() {
    run(
        "fs_appends_from_many_mounts",
        FsSimConfig {
            files: 0,
            logs: 1,
            ..FsSimConfig::default()
        },
        // 1316: three write-backs for a recall overtaken by new appends,
        // the recall answered with one left, its commit then refused.
        &[1316],
    );
}

#[test]
fn fs_appends_and_writes_with_crashes() {
    run(
        "fs_appends_and_writes_with_crashes",
        FsSimConfig {
            files: 1,
            logs: 2,
            crash_chance: 0.01,
            ..FsSimConfig::default()
        },
        &[105],
    );
}

/// Writers crashing while they write back for a recall: the next holder
/// reads what was committed, nothing the crash took is kept, and no
/// request waits for ever.
#[test]
fn fs_writers_crash_mid_recall() {
    run(
        "fs_writers_crash_mid_recall",
        FsSimConfig {
            files: 1,
            logs: 1,
            crash_mid_recall: 0.2,
            ..FsSimConfig::default()
        },
        &[],
    );
}

#[test]
fn fs_one_file_many_clients() {
    run(
        "fs_one_file_many_clients",
        FsSimConfig {
            clients: 5,
            files: 1,
            ..FsSimConfig::default()
        },
        &[],
    );
}
