//! shoal's packet formats.
//!
//! A packet is a kind byte and a fixed little-endian body per kind
//! ([`Packet`]).  Every packet crosses the network as a *plaintext*
//! ([`encode_plain`], [`decode_plain`]) sealed by an AEAD that
//! authenticates it before it is parsed: RPC, locate and heartbeats in
//! endpoint channels and node sessions (`shoal-session`; inside a node
//! session a [`NodeMsg`] tag says what each plaintext is), group
//! datagrams under their sender's epoch key (`shoal_group::seal`).
//! Variable parts (payloads, lists) are bounded, so a decoder never
//! allocates more than the datagram it was given.
//!
//! Before sessions, nodes spoke a 20-byte header form with a MAC under
//! one key shared by the whole cluster ([`ClusterKey`], [`encode`],
//! [`decode`]):
//!
//! ```text
//!  0      2     3     4                              20
//!  +------+-----+-----+------------------------------+---------------
//!  | "SH" | ver | kind| MAC (16 bytes)               | body ...
//!  +------+-----+-----+------------------------------+---------------
//! ```
//!
//! Nothing is sent in it any more; a node that still has its cluster's old
//! key counts datagrams in it (forged or replayed) and drops them, and the
//! tests forge them.
//!
//! **Architecture invariant:** this crate does no I/O and keeps no state; it
//! turns bytes into [`Packet`]s and back.

mod codec;
pub mod group;
mod ids;
mod key;
mod load;
mod node;
mod packet;

pub use codec::{decode, decode_plain, encode, encode_plain, plain, plain_head_len};
pub use ids::{
    ClientId, GroupSeq, Incarnation, Instance, MemberId, MsgId, NodeId, Nonce, Seq, TxnId,
};
pub use key::ClusterKey;
pub use load::{DecodeLoadError, LOAD_LEN, Load, Owner};
pub use node::NodeMsg;
pub use packet::{
    Ack, AckDir, Endpoint, Fate, Frag, Heartbeat, Here, Locate, MAX_HERE_ENDPOINTS, MAX_MEMBERS,
    MAX_NAME_BYTES, Member, NotHere, Packet, Reply, ReplyStatus, Request, Working,
};

/// Bytes of the common header (magic, version, kind, MAC).
pub const HEADER_LEN: usize = 20;
/// The magic bytes every shoal datagram starts with.
pub const MAGIC: [u8; 2] = *b"SH";
/// The wire version this build speaks.
pub const VERSION: u8 = 1;
/// The largest UDP payload shoal ever sends or accepts.
pub const MAX_DATAGRAM: usize = 65_507;

/// Why a datagram was not accepted.  Every case is counted by the node that
/// dropped it; none of them is fatal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("datagram too short for its kind")]
    Truncated,
    #[error("datagram longer than its kind allows")]
    Oversized,
    #[error("not a shoal datagram (bad magic)")]
    BadMagic,
    #[error("unsupported wire version {0}")]
    BadVersion(u8),
    #[error("unknown packet kind {0}")]
    BadKind(u8),
    #[error("MAC does not match the cluster key: dropped")]
    BadMac,
    #[error("malformed field: {0}")]
    Malformed(&'static str),
}
