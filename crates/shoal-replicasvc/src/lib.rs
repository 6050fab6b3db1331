//! The shell of shoal's replicated services: one replica's threads, its
//! process group, its log files and snapshots, over a deterministic state
//! machine (`shoal_replica::Machine`).
//!
//! The directory service (`shoal-dirsvc`) and the file system's metadata
//! service (`shoal-fssvc`) are replicated with it: each gives a
//! [`Machine`](shoal_replica::Machine) and a [`Handler`] for its clients'
//! requests.  [`replica`] forms, joins and re-forms the group and applies
//! its messages; [`store`] keeps the snapshot and logs; [`writes_at`] says
//! which replica takes writes best; [`serving`] starts and drains the
//! client-facing server; [`client`] is the clients' half, a request sent
//! again until its answer is final.

#![deny(unsafe_code)]

pub mod client;
pub mod replica;
pub mod serving;
pub mod store;
pub mod writes_at;

pub use replica::{Config, Handler, Ports, Replica, Replicated, Unavailable};
pub use shoal_replica::{Durability, Machine};
