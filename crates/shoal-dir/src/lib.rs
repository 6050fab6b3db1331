//! shoal's directory service core, without I/O.
//!
//! The directory service maps names to capabilities (Amoeba's SOAP
//! directory, after "Group Communication versus RPC for a Fault-Tolerant
//! Directory Service", Kaashoek et al. 1992).  This crate holds everything
//! that decides something, so the replica shell (`shoal-dirsvc`), the
//! simulator and the tests share it:
//!
//! - [`model`]: directories, rows, rights bits, limits and errors;
//! - [`op`]: requests and answers and their wire format;
//! - [`state`]: the deterministic state machine every replica applies
//!   ordered writes to, with client sessions for exactly-once retries and
//!   the snapshot format;
//! - [`log`]: the coalescing write-ahead log format and recovery;
//! - [`history`]: test histories and their sequential specification;
//! - [`replica`]: a replica's decisions (applying group messages,
//!   answering reads, durability, re-forming the group).
//!
//! The formats are documented byte by byte in `docs/directory.md`.
//!
//! **Architecture invariant:** no sockets, files, clocks or randomness;
//! decoders never panic.

#![forbid(unsafe_code)]

pub mod history;
pub mod log;
pub mod model;
pub mod op;
pub mod replica;
pub mod state;

pub use model::{DirError, Row};
pub use op::{Answer, Expect, InstallItem, Op, Request, Response};
pub use shoal_cap::codec::DecodeError;
pub use state::{Applied, DirState, Directory};
