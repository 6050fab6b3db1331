//! shoal's directory service: the replica and the client library.
//!
//! The service maps names to capabilities (`shoal_dir` holds the state
//! machine and formats).  Replicas ([`replica`]) form a process group and
//! apply every write in the group's total order (Kaashoek et al.'s group
//! variant), on the replica shell `shoal-replicasvc` with a durable,
//! coalescing log ([`store`]).  Programs use [`DirClient`].  (The
//! paper's two-replica RPC baseline with two-phase commit is a benchmark
//! peer: `shoal_bench::dir::twopc`.)  `docs/directory.md` describes the guarantees and the
//! on-disk formats.

#![deny(unsafe_code)]

pub mod client;
pub mod replica;
pub mod workload;
pub mod writes_at;

pub use client::{ClientError, DirClient};
pub use replica::{Durability, Replica, ReplicaConfig};
pub use shoal_replicasvc::store;

/// The name of a cluster's default directory service.
pub const DEFAULT_SERVICE: &str = "dir";

/// The directory service `name` of the cluster, a system service: every
/// replica serves it (replicas run as root), so a client reaches whichever
/// answers first.
pub fn service_port(cluster: &[u8; 16], name: &str) -> shoal_rpc::Service {
    shoal_rpc::system_port(cluster, &format!("directory service {name}"))
}

/// The port on which replica `i` of service `name` answers its peers.
pub fn peer_port(cluster: &[u8; 16], name: &str, i: usize) -> shoal_rpc::Service {
    shoal_rpc::system_port(cluster, &format!("directory peer {name} {i}"))
}
