//! Private directories over many seeds: a push brings the primary to the
//! pusher's copy as it was when the push started (changes go on while it
//! is on its way), no look is answered while another client still holds
//! the directory in its copy, no push by a live client is refused, and
//! every look is answered, with clients and the primary crashing (a new
//! primary's grace period, in which clients reclaim).  `SHOAL_SIM_SEEDS=N` runs more seeds;
//! `SHOAL_SIM_SEED=S SHOAL_SIM_TRACE=1` replays one with a trace.

use shoal_sim::{PrivateSim, PrivateSimConfig, seeds};

#[test]
fn fs_private() {
    let mut failed = Vec::new();
    let (mut pushes, mut looks, mut recalls, mut changes, mut crashes) = (0, 0, 0, 0, 0);
    let (mut primary_crashes, mut reclaims, mut while_pushing) = (0, 0, 0);
    for seed in seeds() {
        let mut sim = PrivateSim::new(seed, PrivateSimConfig::default());
        let report = sim.run();
        pushes += report.pushes_checked;
        looks += report.looks;
        recalls += report.recalls;
        changes += report.local_changes;
        crashes += report.crashes;
        primary_crashes += report.primary_crashes;
        reclaims += report.reclaims;
        while_pushing += report.changes_while_pushing;
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
        "fs_private: {changes} changes in private directories ({while_pushing} while a push was on its way), {pushes} pushes checked, {looks} looks, {recalls} recalls, {crashes} client crashes, {primary_crashes} primary crashes, {reclaims} reclaims"
    );
    assert!(
        pushes > 0
            && looks > 0
            && recalls > 0
            && changes > 0
            && while_pushing > 0
            && primary_crashes > 0
            && reclaims > 0,
        "fs_private: the run exercised too little"
    );
    assert!(
        failed.is_empty(),
        "fs_private: {} seeds failed; first: seed {} {:?} (replay: SHOAL_SIM_SEED={} SHOAL_SIM_TRACE=1)",
        failed.len(),
        failed[0].0,
        failed[0].1,
        failed[0].0
    );
}
