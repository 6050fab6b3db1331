//! The group protocol in the simulator over many seeds.  `SHOAL_SIM_SEEDS=N`
//! runs N seeds per scenario (default 64); `SHOAL_SIM_SEED=S` replays seed
//! S alone, and `SHOAL_SIM_TRACE=1` prints its event trace on failure.
//! Every scenario runs every checker (see `shoal_sim::GroupSim`).

use shoal_sim::{Faults, GroupReport, GroupSim, GroupSimConfig};

use shoal_sim::{seeds, seeds_and};

fn run(name: &str, seed: u64, cfg: GroupSimConfig) -> GroupReport {
    let mut sim = GroupSim::new(seed, cfg);
    let report = sim.run();
    if !report.violations.is_empty() {
        for line in sim.trace() {
            eprintln!("{line}");
        }
        panic!(
            "{name}, seed {seed}: {:?}\nreplay: SHOAL_SIM_SEED={seed} SHOAL_SIM_TRACE=1 cargo test -p shoal-sim --test group_seeds {name}",
            report.violations
        );
    }
    report
}

/// A clean network: every message is delivered everywhere, in one order.
#[test]
fn group_clean_network() {
    for seed in seeds() {
        let r = (seed % 3) as usize;
        let report = run(
            "group_clean_network",
            seed,
            GroupSimConfig {
                resilience: r,
                faults: Faults::none(),
                ..GroupSimConfig::default()
            },
        );
        assert_eq!(report.sent_ok, 3 * 20, "seed {seed}");
    }
}

/// Loss, duplicates and reordering, r = 0, 1, 2, 3 or 5 members.
#[test]
fn group_loss_and_reordering() {
    for seed in seeds() {
        run(
            "group_loss_and_reordering",
            seed,
            GroupSimConfig {
                members: if seed % 2 == 0 { 3 } else { 5 },
                resilience: (seed % 3) as usize,
                ..GroupSimConfig::default()
            },
        );
    }
}

/// The sequencer crashes (and, with r = 2 and 5 members, one more member):
/// no completed send is lost, the survivors agree and carry on.
#[test]
fn group_sequencer_crash() {
    for seed in seeds() {
        let five = seed % 2 == 1;
        let r = if five { 2 } else { 1 };
        run(
            "group_sequencer_crash",
            seed,
            GroupSimConfig {
                members: if five { 5 } else { 3 },
                resilience: r,
                crashes: r,
                ..GroupSimConfig::default()
            },
        );
    }
}

/// One member is cut off, then the partition heals: it is expelled or
/// carries on, and ends up a member again with the same stream.
#[test]
fn group_partition_heals() {
    for seed in seeds() {
        run(
            "group_partition_heals",
            seed,
            GroupSimConfig {
                resilience: (seed % 3) as usize,
                partition: true,
                ..GroupSimConfig::default()
            },
        );
    }
}

/// Processes join and leave while messages flow.
#[test]
fn group_joins_and_leaves() {
    for seed in seeds() {
        run(
            "group_joins_and_leaves",
            seed,
            GroupSimConfig {
                resilience: (seed % 2) as usize,
                joins: 2,
                leaves: 1,
                ..GroupSimConfig::default()
            },
        );
    }
}

/// An application stops reading: memory stays bounded, and the member is
/// expelled and joins again, or catches up.
#[test]
fn group_stalled_member() {
    for seed in seeds() {
        run(
            "group_stalled_member",
            seed,
            GroupSimConfig {
                resilience: (seed % 2) as usize,
                history_bytes: 64 * 1024,
                messages: 40,
                stall: true,
                ..GroupSimConfig::default()
            },
        );
    }
}

/// Everything at once, shapes drawn from the seed.
#[test]
fn group_everything() {
    // 13260: the sequencer admitted a joiner again after expelling it, and
    // sent it the state of its first admission.
    for seed in seeds_and(&[13260]) {
        let members = 3 + (seed % 3) as usize;
        let r = (seed / 3 % 3) as usize;
        let crashes = if r == 0 { 0 } else { (seed / 9 % 2) as usize };
        run(
            "group_everything",
            seed,
            GroupSimConfig {
                members,
                resilience: r,
                crashes,
                partition: seed % 4 == 0,
                joins: (seed % 2) as usize,
                leaves: (seed / 2 % 2) as usize,
                stall: seed % 5 == 0,
                ..GroupSimConfig::default()
            },
        );
    }
}
