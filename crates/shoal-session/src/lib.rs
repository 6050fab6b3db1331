//! shoal's trust core (`docs/security.md`): who belongs to a cluster, how
//! two nodes agree on session keys, and how datagrams are sealed, opened
//! and checked for replay.  No sockets, no clock, no randomness: time,
//! indexes and seeds are arguments, so the daemon and the simulator run
//! the same code.
//!
//! - [`cert`]: the admin key, node certificates, revocation lists, and
//!   [`Trust`], what a node accepts.
//! - [`handshake`]: Noise XX between two nodes ([`Initiator`],
//!   [`Responder`]), ending in an [`Established`] session.
//! - [`datagram`]: the datagram header, the sealed layouts, [`seal`] and
//!   [`open`].
//! - [`table`]: a node's [`Sessions`] with its peers: handshakes,
//!   queueing, confirmation, rekeying and expiry; and the roots endpoint
//!   channels derive from, its own included.
//! - [`channel`]: one end of an endpoint [`Channel`].
//! - [`grant`]: start grants sealed from one daemon to another.
//! - [`window`]: the [`ReplayWindow`].
//! - [`kdf`]: session, endpoint channel and group member keys.
//! - [`aead`]: the AEAD choice and keys.
//!
//! **Invariants:** a decoder checks every length before it reads and never
//! panics; [`open`] checks the tag before it returns any field; a key never
//! leaves its [`Key`]; a counter is accepted at most once per key.

#![forbid(unsafe_code)]

pub mod aead;
pub mod cert;
pub mod channel;
pub mod datagram;
pub mod grant;
pub mod handshake;
pub mod kdf;
pub mod service_map;
mod signed;
pub mod table;
pub mod window;
mod x25519;

pub use aead::{Algorithm, Key, TAG_LEN};
pub use cert::{AdminKey, AdminPublic, ClusterId, NodeCert, RevocationList, Trust};
pub use channel::{Channel, Root};
pub use datagram::{Class, Header, open, seal};
pub use handshake::{Established, Initiator, NodeIdentity, Responder};
pub use service_map::{ServiceEntry, ServiceMap};
pub use table::Sessions;
pub use window::ReplayWindow;

/// Why a certificate, handshake or datagram was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("truncated")]
    Truncated,
    #[error("malformed: {0}")]
    Malformed(&'static str),
    #[error("signature does not verify under the admin key")]
    BadSignature,
    #[error("certificate or list of another cluster")]
    WrongCluster,
    #[error("certificate not valid now")]
    Expired,
    #[error("certificate serial {0} is revoked")]
    Revoked(u64),
    #[error("certificate does not name the key that was used")]
    KeyMismatch,
    #[error("handshake failed to authenticate")]
    HandshakeFailed,
    #[error("no session with that index")]
    UnknownIndex,
    #[error("datagram does not open (wrong key, or altered)")]
    BadTag,
    #[error("datagram replayed (its counter was seen, or is too old)")]
    Replayed,
    #[error("noise: {0}")]
    Noise(String),
}
