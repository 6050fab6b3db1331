//! Private directories over many seeds: a push brings the primary to the
//! pusher's copy as it was when the push started (changes go on while it
//! is on its way), no look is answered while another client still holds
//! the directory in its copy, no push by a live client is refused, and
//! every look is answered, with clients and the primary crashing (a new
//! primary's grace period, in which clients reclaim).  `SHOAL_SIM_SEEDS=N` runs more seeds;
//! `SHOAL_SIM_SEED=S SHOAL_SIM_TRACE=1` replays one with a trace.

use shoal_sim::{PrivateSim, PrivateSimConfig, SeedRun, check_seeds, seeds};

#[test]
fn fs_private() {
    check_seeds("fs_private", seeds(), |seed| {
        let mut sim = PrivateSim::new(seed, PrivateSimConfig::default());
        let r = sim.run();
        SeedRun {
            counts: vec![
                ("changes in private directories", r.local_changes as u64),
                (
                    "changes while a push was on its way",
                    r.changes_while_pushing as u64,
                ),
                ("pushes checked", r.pushes_checked as u64),
                ("looks", r.looks as u64),
                ("recalls", r.recalls as u64),
                ("primary crashes", r.primary_crashes as u64),
                ("reclaims", r.reclaims as u64),
            ],
            also: vec![("client crashes", r.crashes as u64)],
            trace: sim.trace().to_vec(),
            violations: r.violations,
        }
    });
}
