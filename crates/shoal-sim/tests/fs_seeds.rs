//! The shared file system's consistency protocol, with the mount's own
//! cache, over many seeds: no read returns stale bytes, no write is lost
//! (no write-back refused, every appended record once and in order), no
//! fsync is lost to a mount crash, and every request is answered.
//! `SHOAL_SIM_SEEDS=N` runs more seeds; `SHOAL_SIM_SEED=S
//! SHOAL_SIM_TRACE=1` replays one with a trace.

use shoal_sim::{FsSim, FsSimConfig, seeds_and};

/// Runs `cfg` over the seeds and `regressions`, seeds that once failed.
fn run(name: &str, cfg: FsSimConfig, regressions: &[u64]) {
    let mut failed = Vec::new();
    let (mut reads, mut uncached, mut recalls, mut crashes, mut fsyncs) = (0, 0, 0, 0, 0);
    let mut records = 0;
    for seed in seeds_and(regressions) {
        let mut sim = FsSim::new(seed, cfg.clone());
        let report = sim.run();
        reads += report.reads_checked;
        uncached += report.uncached_opens;
        recalls += report.recalls;
        crashes += report.crashes;
        fsyncs += report.fsyncs_checked;
        records += report.records_checked;
        if !report.violations.is_empty() {
            if std::env::var_os("SHOAL_SIM_TRACE").is_some() {
                for l in sim.trace() {
                    eprintln!("{l}");
                }
            }
            failed.push((seed, report.violations));
        }
    }
    eprintln!(
        "{name}: {reads} reads checked, {uncached} uncached opens, {recalls} recalls, {crashes} mount crashes, {fsyncs} fsyncs checked after crashes, {records} appended records checked"
    );
    assert!(
        reads > 0 && uncached > 0 && recalls > 0,
        "{name}: the run exercised too little"
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
