//! shoal's shared file system core, without I/O (`docs/fs.md`).
//!
//! The file system's metadata service is a replicated state machine: every
//! replica applies the same ordered updates to a [`Tree`] and so holds the
//! same names, inodes, attributes and versions.  This crate holds what
//! decides something, so the replica shell, the simulator and the tests
//! share it:
//!
//! - [`model`]: inodes, attributes, identities, limits and errors (with
//!   their errno);
//! - [`access`]: POSIX permission checks;
//! - [`update`]: the replicated updates and their byte layout;
//! - [`op`]: a client's requests to the primary and its replies;
//! - [`tree`]: the deterministic state machine, with client sessions for
//!   exactly-once retries;
//! - [`replica`]: the tree as a `shoal_replica::Machine`: its log and
//!   recovery;
//! - [`private`]: a client's copy of its private directories, and the
//!   changes it has not pushed yet (made again by the replicas);
//! - [`tokens`]: the primary's soft state: who may cache what, the opens it
//!   knows, write-shared files, recalls, change notices and leases;
//! - [`primary`]: the primary's decisions over that state: each request
//!   answered at once or held until its recalls are answered, parked
//!   `Events`, the grace period, over a shell for the tree's order and
//!   the file servers (the metadata service and the simulator each have
//!   one);
//! - [`locks`]: advisory locks (`fcntl` and `flock`), cluster-wide: the
//!   table the primary keeps and who waits on it;
//! - [`cache`]: a mount's cache: the tokens it holds, what the kernel may
//!   keep, dirty changes and their write-back, answers to recalls;
//! - [`xattr`]: extended attributes as the service reads them, and the
//!   capabilities it gives out for inodes;
//! - [`edits`]: a write-back as the fewest cuts and writes over the
//!   content version, for the file service's `edit`.
//!
//! **Architecture invariant:** no sockets, files, clocks or randomness
//! (times and secrets travel in the updates, or come from the shell);
//! decoders never panic.

#![forbid(unsafe_code)]

pub mod access;
pub mod cache;
pub mod edits;
pub mod locks;
pub mod model;
pub mod op;
pub mod primary;
pub mod private;
pub mod replica;
pub mod tokens;
pub mod tree;
pub mod update;
pub mod xattr;

#[cfg(test)]
mod testing;

pub use model::{Attr, FsError, Identity, Ino, Kind};
pub use tree::{Applied, Tree};
pub use update::{Update, UpdateOp};
