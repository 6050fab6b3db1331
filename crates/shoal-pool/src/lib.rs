//! The processor pool's core: what every node needs to know to run a
//! program anywhere in the cluster, and to decide where, without I/O.
//!
//! - [`ProcId`]: a process's cluster-wide id.  Like Sprite's and V's, it
//!   names the process's **home node** (the node it was started from,
//!   which keeps it transparent: its id, its signals, its exit status go
//!   through the home wherever it runs) and a number the home gives it.
//! - [`Load`] (defined with the wire formats): what a node reports about
//!   itself in every heartbeat, so
//!   that every node holds every other node's recent load (placement is
//!   derived from state every node has: it survives the loss of any node
//!   and costs no round trip).
//! - [`Placer`]: the placement rule (`docs/pool.md`): a node whose owner
//!   is active is never chosen unless the caller allows it; a node without
//!   the memory asked for is never chosen; of the others, the one with the
//!   least load per core, counting programs this placer sent there since
//!   the node last reported, so that a burst spreads instead of landing on
//!   one momentarily idle node; ties are broken at random, so that placers
//!   on different nodes do not all pick the same one.
//!
//! - [`exec`]: the remote execution protocol between a home and the exec
//!   service of the node a program runs on.
//! - [`ProcTable`]: a home's table of the processes started from it: their
//!   numbers, the node each runs on, and how they ended.
//!
//! **Architecture invariant:** no I/O, no clocks, no global randomness:
//! time comes in as arguments and randomness from a seeded generator, so
//! the simulator replays every decision.

pub mod exec;
mod id;
mod place;
mod table;

pub use id::{ParseProcIdError, ProcId};
pub use place::{Candidate, NoNode, Placer, Request, demand_milli};
pub use shoal_wire::{Load, Owner};
pub use table::{KEEP_ENDED, MAX_COMMAND, Proc, ProcState, ProcTable};
