//! What a core asks its shell to send.
//!
//! A core speaks in plaintexts ([`shoal_wire::encode_plain`]: a kind byte
//! and a body) and never holds a key: the shell seals each one for the
//! channel [`Transmit::via`] names (`docs/security.md`, "Endpoint
//! channels"), and opens what arrives before the core sees it.

use std::net::SocketAddr;

use bytes::Bytes;
use shoal_wire::{ClientId, Instance, NodeId, Packet, encode_plain};

use crate::body::Outgoing;

/// Where a datagram goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// One address.
    Addr(SocketAddr),
    /// Every node of the cluster (a locate question: the shell asks its
    /// own node, which asks the others).
    Nodes,
    /// One node, by id (a question about an instance it had).
    Node(NodeId),
}

/// Who sent a request, as the shell authenticated it: the node it came
/// from, the uid that node vouches for, and the client endpoint.  A
/// server keeps its at-most-once records per caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Caller {
    pub node: NodeId,
    pub uid: u32,
    pub client: ClientId,
}

/// Which channel a datagram travels in, for the shell to seal it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// No endpoint channel: a question for the node (locate).
    Node,
    /// A client's datagram to server endpoint `instance`.
    Server(Instance),
    /// A server's datagram to `caller`, whose request came in the node
    /// session `channel` names (its index on the server's node).
    Client { caller: Caller, channel: u32 },
}

/// One datagram to send: the plaintext `bytes` followed by the pieces of
/// `tail`.  A large fragment's payload travels as `tail`, slices of the
/// body it belongs to, so it is not copied behind its header: the shell
/// seals head and pieces together, and encrypting them is the one copy
/// they make.  `tail` is empty otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub dest: Dest,
    pub via: Via,
    pub bytes: Vec<u8>,
    pub tail: Vec<Bytes>,
}

impl Transmit {
    /// A plaintext in one piece.
    pub fn whole(dest: Dest, via: Via, bytes: Vec<u8>) -> Transmit {
        Transmit {
            dest,
            via,
            bytes,
            tail: Vec::new(),
        }
    }

    /// The plaintext as one buffer (`bytes` with `tail` appended), for
    /// callers that cannot use pieces.
    pub fn into_plain(mut self) -> Vec<u8> {
        for piece in &self.tail {
            self.bytes.extend_from_slice(piece);
        }
        self.bytes
    }
}

/// Payloads at least this big go as a transmit's `tail`: below it, copying
/// them behind the header costs less than a second piece.
const GATHER_MIN: usize = 4096;

/// Whether a fragment payload of `len` bytes is copied behind its header
/// (else it goes as the transmit's tail).
pub(crate) fn copied(len: usize) -> bool {
    len < GATHER_MIN
}

/// Encodes fragment `index` of `body` as the packet `packet` makes of its
/// payload, into a pooled buffer; a large payload becomes the tail instead
/// of being copied.
pub(crate) fn fragment(
    dest: Dest,
    via: Via,
    body: &Outgoing,
    index: u32,
    packet: impl for<'a> Fn(&'a [u8]) -> Packet<'a>,
) -> Transmit {
    let range = body.range(index);
    let mut bytes = crate::pool::datagram();
    if copied(range.len()) {
        encode_plain(&packet(&body.body().bytes(range)), &mut bytes);
        Transmit::whole(dest, via, bytes)
    } else {
        encode_plain(&packet(&[]), &mut bytes);
        Transmit {
            dest,
            via,
            bytes,
            tail: body.body().pieces(range),
        }
    }
}
