//! The placement rule.
//!
//! Eligible nodes: those whose owner is idle (or any, if the request
//! allows an owner-active node) and that have the memory asked for.  Of
//! those, the one with the least demand per core wins, where a node's
//! demand is what it last reported ([`demand_milli`]) plus one core
//! for every program this placer sent it that the report cannot count yet
//! (sent less than [`Placer::HOLD`] before the report arrived).  That is
//! what spreads a burst: the second of two programs placed in the same
//! millisecond sees the first.  Among nodes within a tenth of a core of
//! the best, the choice is random, so that placers on different nodes,
//! each with its own view, do not all send their programs to the same
//! node either.

use std::collections::HashMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_wire::NodeId;

use shoal_time::Time;
use shoal_wire::{Load, Owner};

/// A node the placer may choose, with its last report and when that
/// report arrived (on the caller's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub node: NodeId,
    pub load: Load,
    pub reported: Time,
}

/// What a new program asks of its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Request {
    /// Memory it needs, in MiB.
    pub mem_mib: u32,
    /// Whether a node whose owner is active may be chosen.
    pub allow_owner_active: bool,
}

/// Why no node can take a program.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoNode {
    #[error("no node of the cluster is known to be up")]
    NoneUp,
    #[error("every node's owner is active ({0} nodes); allow owner-active nodes to use them")]
    OwnersActive(usize),
    #[error("no eligible node has {need} MiB free (the most is {most} MiB)")]
    Memory { need: u32, most: u32 },
}

/// Chooses nodes for new programs, remembering where it sent the last
/// ones until their nodes' reports count them.
#[derive(Debug)]
pub struct Placer {
    rng: ChaCha8Rng,
    /// Per node, when this placer sent programs there.
    sent: HashMap<NodeId, Vec<Time>>,
}

/// The demand on a node, in thousandths of a core: its run queue, or the
/// foreign programs' use plus one core per shoal process if that is more
/// (the load average lags a burst by up to a minute; the count of shoal
/// processes does not).
pub fn demand_milli(load: &Load) -> u64 {
    let queue = load.run_queue_centi as u64 * 10;
    let counted = load.foreign_cpu_milli as u64 + load.shoal_procs as u64 * 1000;
    queue.max(counted)
}

/// Demand within this much (thousandths of a core per core) of the best
/// counts as a tie.
const TIE_MILLI: u64 = 100;

impl Placer {
    /// How long a program sent to a node counts against it before the
    /// node's reports are trusted to include it: a few heartbeats.
    pub const HOLD: Duration = Duration::from_secs(1);

    /// A placer whose random choices follow `seed`.
    pub fn new(seed: u64) -> Placer {
        Placer {
            rng: ChaCha8Rng::seed_from_u64(seed),
            sent: HashMap::new(),
        }
    }

    /// Chooses a node for `request` among `candidates` at `now`, and
    /// counts the program against it.
    pub fn place(
        &mut self,
        now: Time,
        candidates: &[Candidate],
        request: &Request,
    ) -> Result<NodeId, NoNode> {
        self.forget(now, candidates);
        if candidates.is_empty() {
            return Err(NoNode::NoneUp);
        }
        let owned: Vec<&Candidate> = candidates
            .iter()
            .filter(|c| request.allow_owner_active || c.load.owner == Owner::Idle)
            .collect();
        if owned.is_empty() {
            return Err(NoNode::OwnersActive(candidates.len()));
        }
        let eligible: Vec<&Candidate> = owned
            .iter()
            .copied()
            .filter(|c| c.load.mem_free_mib >= request.mem_mib)
            .collect();
        if eligible.is_empty() {
            let most = owned.iter().map(|c| c.load.mem_free_mib).max().unwrap_or(0);
            return Err(NoNode::Memory {
                need: request.mem_mib,
                most,
            });
        }
        let scored: Vec<(u64, NodeId)> = eligible
            .iter()
            .map(|c| (self.demand_per_core(c), c.node))
            .collect();
        let best = scored
            .iter()
            .map(|s| s.0)
            .min()
            .expect("eligible is not empty");
        let ties: Vec<NodeId> = scored
            .iter()
            .filter(|s| s.0 <= best + TIE_MILLI)
            .map(|s| s.1)
            .collect();
        let node = ties[self.rng.random_range(0..ties.len())];
        self.sent.entry(node).or_default().push(now);
        Ok(node)
    }

    /// `c`'s demand in thousandths of a core per core, counting what this
    /// placer sent it that its report does not count yet.
    fn demand_per_core(&self, c: &Candidate) -> u64 {
        let pending = self.pending(c) as u64;
        (demand_milli(&c.load) + pending * 1000) / c.load.cores.max(1) as u64
    }

    /// Programs sent to `c` that its last report cannot count.
    fn pending(&self, c: &Candidate) -> usize {
        self.sent.get(&c.node).map_or(0, |times| {
            times
                .iter()
                .filter(|&&t| c.reported < t + Self::HOLD)
                .count()
        })
    }

    /// Drops what every report now counts, and nodes no longer candidates.
    fn forget(&mut self, now: Time, candidates: &[Candidate]) {
        self.sent.retain(|node, times| {
            let reported = candidates
                .iter()
                .find(|c| c.node == *node)
                .map(|c| c.reported);
            times.retain(|&t| {
                reported.is_some_and(|r| r < t + Self::HOLD) && now < t + Self::HOLD * 10
            });
            !times.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn node(i: u64, busy_centi: u32, cores: u16, mem: u32, owner: Owner) -> Candidate {
        Candidate {
            node: NodeId(i + 1),
            load: Load {
                cores,
                run_queue_centi: busy_centi,
                mem_free_mib: mem,
                owner,
                ..Load::default()
            },
            reported: Time::ZERO,
        }
    }

    fn arb_nodes() -> impl Strategy<Value = Vec<Candidate>> {
        proptest::collection::vec((0u32..800, 1u16..9, 0u32..4096, any::<bool>()), 0..12).prop_map(
            |v| {
                v.into_iter()
                    .enumerate()
                    .map(|(i, (busy, cores, mem, active))| {
                        let owner = if active { Owner::Active } else { Owner::Idle };
                        node(i as u64, busy, cores, mem, owner)
                    })
                    .collect()
            },
        )
    }

    proptest! {
        /// The chosen node is always eligible, and when no node is, the
        /// error says which condition failed.
        #[test]
        fn only_eligible_nodes_are_chosen(
            nodes in arb_nodes(),
            mem in 0u32..4096,
            allow in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let request = Request { mem_mib: mem, allow_owner_active: allow };
            let mut placer = Placer::new(seed);
            let eligible = |c: &Candidate| {
                (allow || c.load.owner == Owner::Idle) && c.load.mem_free_mib >= mem
            };
            match placer.place(Time::ZERO, &nodes, &request) {
                Ok(n) => {
                    let c = nodes.iter().find(|c| c.node == n).unwrap();
                    prop_assert!(eligible(c));
                    // Nothing eligible was clearly less loaded.
                    let per_core = |c: &Candidate| demand_milli(&c.load) / c.load.cores as u64;
                    prop_assert!(nodes.iter().filter(|c| eligible(c)).all(|o| per_core(o) + TIE_MILLI >= per_core(c)));
                }
                Err(NoNode::NoneUp) => prop_assert!(nodes.is_empty()),
                Err(NoNode::OwnersActive(_)) => {
                    prop_assert!(!allow && nodes.iter().all(|c| c.load.owner == Owner::Active));
                }
                Err(NoNode::Memory { need, .. }) => {
                    prop_assert_eq!(need, mem);
                    prop_assert!(!nodes.iter().any(eligible));
                }
            }
        }

        /// A burst on equally loaded nodes spreads evenly: no node gets
        /// more than its share, rounded up.
        #[test]
        fn a_burst_spreads(k in 1u64..10, n in 1usize..60, cores in 1u16..5, seed in any::<u64>()) {
            let nodes: Vec<Candidate> = (0..k).map(|i| node(i, 0, cores, 1024, Owner::Idle)).collect();
            let mut placer = Placer::new(seed);
            let mut got: HashMap<NodeId, usize> = HashMap::new();
            for i in 0..n {
                let chosen = placer.place(Time(i as u64), &nodes, &Request::default()).unwrap();
                *got.entry(chosen).or_default() += 1;
            }
            let share = n.div_ceil(k as usize);
            prop_assert!(got.values().all(|&c| c <= share), "{got:?} share {share}");
        }

        /// The same seed makes the same choices.
        #[test]
        fn choices_replay(nodes in arb_nodes(), seed in any::<u64>()) {
            let run = || {
                let mut p = Placer::new(seed);
                (0..20).map(|i| p.place(Time(i), &nodes, &Request::default()).ok()).collect::<Vec<_>>()
            };
            prop_assert_eq!(run(), run());
        }
    }

    #[test]
    fn a_report_made_after_the_hold_counts_the_program_itself() {
        let mut nodes = vec![
            node(0, 0, 1, 1024, Owner::Idle),
            node(1, 0, 1, 1024, Owner::Idle),
        ];
        let mut placer = Placer::new(7);
        let first = placer
            .place(Time::ZERO, &nodes, &Request::default())
            .unwrap();
        // Until its node reports, the first program steers the second away.
        let second = placer.place(Time(10), &nodes, &Request::default()).unwrap();
        assert_ne!(first, second);
        // Both nodes report later, each counting its program: the
        // reservations are dropped, so they do not count twice.
        for c in &mut nodes {
            c.reported = Time::ZERO + Placer::HOLD + Duration::from_micros(20);
            c.load.shoal_procs = 1;
        }
        placer
            .place(
                Time::ZERO + Placer::HOLD + Duration::from_micros(30),
                &nodes,
                &Request::default(),
            )
            .unwrap();
        assert_eq!(placer.sent.values().map(Vec::len).sum::<usize>(), 1);
    }

    #[test]
    fn demand_is_the_larger_of_queue_and_processes() {
        let mut l = Load {
            cores: 2,
            run_queue_centi: 150,
            ..Load::default()
        };
        assert_eq!(demand_milli(&l), 1500);
        l.shoal_procs = 2;
        l.foreign_cpu_milli = 300;
        assert_eq!(demand_milli(&l), 2300);
    }

    #[test]
    fn an_owner_active_node_is_used_only_when_allowed() {
        let nodes = vec![
            node(0, 0, 8, 1024, Owner::Active),
            node(1, 700, 1, 1024, Owner::Idle),
        ];
        let mut placer = Placer::new(1);
        let busy_idle = placer
            .place(Time::ZERO, &nodes, &Request::default())
            .unwrap();
        assert_eq!(busy_idle, NodeId(2));
        let allowed = Request {
            allow_owner_active: true,
            ..Request::default()
        };
        assert_eq!(placer.place(Time(1), &nodes, &allowed).unwrap(), NodeId(1));
        let e = Placer::new(1)
            .place(Time::ZERO, &nodes[..1], &Request::default())
            .unwrap_err();
        assert_eq!(e, NoNode::OwnersActive(1));
    }
}
