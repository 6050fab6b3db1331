//! The node daemon's rules, without I/O: the parts of what `shoal node`
//! does that decide something, as state machines the daemon
//! (`shoal-nodesvc`) drives with real processes and the simulator
//! (`shoal-sim`) with simulated ones.
//!
//! - [`supervise`]: when to start a node's services, when to signal them,
//!   and how long to wait after a crash;
//! - [`gossip`]: what nodes tell each other of the signed records they
//!   hold (the revocation list, the service map), and when.
//!
//! **Architecture invariant:** no processes, files, sockets or clocks:
//! time comes in as arguments.

#![forbid(unsafe_code)]

pub mod gossip;
pub mod supervise;
