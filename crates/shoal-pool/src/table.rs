//! A home's process table: every process started from this node, where it
//! runs now, and how it ended.
//!
//! The home is the one place that always knows a process: it hands out
//! its number, records the node it runs on (and, when processes move, the
//! node it moved to), and keeps its end for a while so that `shoal wait`
//! finds it after the fact.  `shoal ps`, `shoal kill` and `shoal wait`
//! all start here.

use std::collections::{BTreeMap, VecDeque};

use shoal_time::Time;
use shoal_wire::NodeId;

use crate::ProcId;
use crate::exec::Ended;

/// Ended processes a home remembers for `shoal wait` and `shoal ps --all`.
pub const KEEP_ENDED: usize = 1024;
/// Longest command line a table keeps (the rest is cut off).
pub const MAX_COMMAND: usize = 256;

/// How a process stands, as its home knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcState {
    /// Running on its node.
    Running,
    /// It ended so, at this time.
    Ended { how: Ended, at: Time },
    /// Its home lost track of it at this time: the `shoal run` that
    /// watched it went away (the program was hung up on) or its node
    /// became unreachable.  How it ended is unknown.
    Lost { at: Time },
}

/// One process of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    pub id: ProcId,
    /// Its command line, cut to [`MAX_COMMAND`] bytes.
    pub command: String,
    /// The name of the node it runs on.
    pub node: String,
    /// Who started it: the uid its home's kernel reported.
    pub uid: u32,
    pub started: Time,
    pub state: ProcState,
}

/// The processes a home started.
#[derive(Debug)]
pub struct ProcTable {
    home: NodeId,
    next: u64,
    live: BTreeMap<u64, Proc>,
    /// The last [`KEEP_ENDED`] ended ones, oldest first.
    ended: VecDeque<Proc>,
}

impl ProcTable {
    /// The table of `home`, numbering from `first` (a random point, so
    /// that a restarted home does not reuse ids).
    pub fn new(home: NodeId, first: u64) -> ProcTable {
        ProcTable {
            home,
            next: first.max(1),
            live: BTreeMap::new(),
            ended: VecDeque::new(),
        }
    }

    /// Records a new process of user `uid` running `command` on `node`:
    /// its id.
    pub fn spawn(&mut self, now: Time, command: &str, node: &str, uid: u32) -> ProcId {
        let seq = self.next;
        self.next = self.next.wrapping_add(1).max(1);
        let id = ProcId {
            home: self.home,
            seq,
        };
        let mut command = command.to_string();
        if command.len() > MAX_COMMAND {
            let mut cut = MAX_COMMAND;
            while !command.is_char_boundary(cut) {
                cut -= 1;
            }
            command.truncate(cut);
        }
        self.live.insert(
            seq,
            Proc {
                id,
                command,
                node: node.to_string(),
                uid,
                started: now,
                state: ProcState::Running,
            },
        );
        id
    }

    /// The process now runs on `node` (it was restarted or moved there).
    /// False if it is not running.
    pub fn moved(&mut self, id: ProcId, node: &str) -> bool {
        match self.live_mut(id) {
            Some(p) => {
                p.node = node.to_string();
                true
            }
            None => false,
        }
    }

    /// The process never started: it leaves no trace.
    pub fn forget(&mut self, id: ProcId) {
        if id.home == self.home {
            self.live.remove(&id.seq);
        }
    }

    /// The process ended (`Some`) or was lost track of (`None`).  False if
    /// it was not running.
    pub fn end(&mut self, id: ProcId, now: Time, how: Option<Ended>) -> bool {
        if id.home != self.home {
            return false;
        }
        let Some(mut p) = self.live.remove(&id.seq) else {
            return false;
        };
        p.state = match how {
            Some(how) => ProcState::Ended { how, at: now },
            None => ProcState::Lost { at: now },
        };
        if self.ended.len() == KEEP_ENDED {
            self.ended.pop_front();
        }
        self.ended.push_back(p);
        true
    }

    /// The process, running or among the remembered ended ones.
    pub fn get(&self, id: ProcId) -> Option<&Proc> {
        if id.home != self.home {
            return None;
        }
        self.live
            .get(&id.seq)
            .or_else(|| self.ended.iter().rev().find(|p| p.id == id))
    }

    /// The running processes, by id.
    pub fn running(&self) -> impl Iterator<Item = &Proc> {
        self.live.values()
    }

    /// The remembered ended processes, oldest first.
    pub fn ended(&self) -> impl Iterator<Item = &Proc> {
        self.ended.iter()
    }

    fn live_mut(&mut self, id: ProcId) -> Option<&mut Proc> {
        if id.home != self.home {
            return None;
        }
        self.live.get_mut(&id.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_process_is_numbered_followed_and_remembered_after_its_end() {
        let mut t = ProcTable::new(NodeId(7), 100);
        let a = t.spawn(Time(1), "sleep 30", "n2", 1000);
        let b = t.spawn(Time(2), "true", "n3", 0);
        assert_eq!((a.home, a.seq, b.seq), (NodeId(7), 100, 101));
        assert!(t.moved(a, "n4"));
        assert_eq!(t.get(a).unwrap().node, "n4");
        assert_eq!((t.get(a).unwrap().uid, t.get(b).unwrap().uid), (1000, 0));
        assert!(t.end(b, Time(5), Some(Ended::Exited(3))));
        assert!(!t.end(b, Time(6), Some(Ended::Exited(0))), "ends once");
        assert_eq!(
            t.get(b).unwrap().state,
            ProcState::Ended {
                how: Ended::Exited(3),
                at: Time(5)
            }
        );
        assert!(t.end(a, Time(7), None));
        assert_eq!(t.get(a).unwrap().state, ProcState::Lost { at: Time(7) });
        assert_eq!(t.running().count(), 0);
        assert_eq!(t.ended().count(), 2);
        let c = t.spawn(Time(8), "x", "n1", 0);
        t.forget(c);
        assert!(
            t.get(c).is_none(),
            "a process that never started leaves no trace"
        );
        let elsewhere = ProcId {
            home: NodeId(8),
            seq: 100,
        };
        assert!(
            t.get(elsewhere).is_none(),
            "another home's ids are not ours"
        );
        assert!(!t.end(elsewhere, Time(9), None));
    }

    #[test]
    fn long_commands_are_cut_on_a_character_boundary() {
        let mut t = ProcTable::new(NodeId(1), 1);
        let id = t.spawn(Time::ZERO, &"é".repeat(200), "n1", 0);
        let c = &t.get(id).unwrap().command;
        assert!(
            c.len() <= MAX_COMMAND && c.len() >= MAX_COMMAND - 1,
            "{}",
            c.len()
        );
    }

    proptest! {
        /// Whatever happens, ids are never handed out twice, a process is
        /// running or ended but not both, and at most KEEP_ENDED ended ones
        /// are kept, the most recent.
        #[test]
        fn ids_are_unique_and_the_table_stays_bounded(
            first in any::<u64>(),
            ops in proptest::collection::vec((0u8..3, any::<u16>()), 1..3000),
        ) {
            let mut t = ProcTable::new(NodeId(1), first);
            let mut ids = Vec::new();
            let mut seen = std::collections::HashSet::new();
            let mut ended_order = Vec::new();
            for (now, (op, pick)) in ops.into_iter().enumerate() {
                match op {
                    0 => {
                        let id = t.spawn(Time(now as u64), "p", "n", 0);
                        prop_assert!(seen.insert(id), "id {} handed out twice", id);
                        ids.push(id);
                    }
                    _ if ids.is_empty() => {}
                    1 => {
                        let id = ids[pick as usize % ids.len()];
                        if t.end(id, Time(now as u64), Some(Ended::Exited(0))) {
                            ended_order.push(id);
                        }
                    }
                    _ => {
                        let id = ids[pick as usize % ids.len()];
                        prop_assert_eq!(t.moved(id, "m"), t.running().any(|p| p.id == id));
                    }
                }
            }
            let kept: Vec<ProcId> = t.ended().map(|p| p.id).collect();
            let want = &ended_order[ended_order.len().saturating_sub(KEEP_ENDED)..];
            prop_assert_eq!(&kept[..], want);
            for p in t.running() {
                prop_assert!(!kept.contains(&p.id));
            }
        }
    }
}
