//! shoal's immutable file service core (Amoeba's Bullet server, with
//! extents shared between versions).
//!
//! Files are created, optionally filled in several steps while
//! uncommitted, then committed: from then on they never change.  An edit
//! of a committed file makes a new file that shares the unchanged extents.
//! This crate holds the store ([`store`]) over a small disk interface
//! ([`disk`]), its free-space manager ([`alloc`]), the metadata formats
//! ([`meta`]), the wire format ([`op`]) and the object manager's pass
//! ([`manage`]); the server, replication and
//! the client library are `shoal-bulletsvc`'s.  `docs/files.md` describes
//! the guarantees and draws the formats byte by byte.

#![deny(unsafe_code)]

pub mod alloc;
pub mod disk;
pub mod manage;
pub mod meta;
pub mod model;
pub mod op;
pub mod store;

pub use disk::{Disk, SimDisk};
pub use model::FileError;
pub use op::{AdminOp, Answer, Edit, Op, Stat};
pub use store::{Disks, OpenError, Store, StoreConfig};
