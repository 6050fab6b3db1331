//! What a core asks its shell to send.

use std::net::SocketAddr;

use bytes::Bytes;
use shoal_wire::{ClusterKey, Packet, encode_into, encode_unsealed};

use crate::body::Outgoing;

/// Where a datagram goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// One address.
    Addr(SocketAddr),
    /// Every node of the cluster: a broadcast on the cluster network, or,
    /// where there is none (loopback clusters), each known node in turn.
    Nodes,
}

/// One datagram to send: `bytes` followed by the pieces of `tail`.  A large
/// fragment's payload travels as `tail`, slices of the body it belongs to,
/// so the shell sends it with a gathering send instead of copying it behind
/// the header; `tail` is empty otherwise.  Such a datagram also leaves the
/// core without its MAC (`sealed` false): the shell computes it with
/// [`Transmit::seal`] just before sending, outside any lock it holds on
/// the core.  Every other datagram is sealed already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub dest: Dest,
    pub bytes: Vec<u8>,
    pub tail: Vec<Bytes>,
    pub sealed: bool,
}

impl Transmit {
    /// A sealed datagram in one piece.
    pub fn whole(dest: Dest, bytes: Vec<u8>) -> Transmit {
        Transmit {
            dest,
            bytes,
            tail: Vec::new(),
            sealed: true,
        }
    }

    /// Computes the MAC, if the core left it to the shell.
    pub fn seal(&mut self, key: &ClusterKey) {
        if !self.sealed {
            shoal_wire::seal(&mut self.bytes, &self.tail, key);
            self.sealed = true;
        }
    }

    /// The sealed datagram as one buffer (`bytes` with `tail` appended),
    /// for callers that cannot send pieces.
    pub fn into_datagram(mut self, key: &ClusterKey) -> Vec<u8> {
        self.seal(key);
        for piece in &self.tail {
            self.bytes.extend_from_slice(piece);
        }
        self.bytes
    }
}

/// Payloads at least this big go as a transmit's `tail`: below it, copying
/// them behind the header costs less than a second piece in the send.
const GATHER_MIN: usize = 4096;

/// Encodes fragment `index` of `body` as the packet `packet` makes of its
/// payload, into a pooled buffer; a large payload becomes the tail instead
/// of being copied, and its datagram is left for the shell to seal.
pub(crate) fn fragment(
    key: &ClusterKey,
    dest: Dest,
    body: &Outgoing,
    index: u32,
    packet: impl for<'a> Fn(&'a [u8]) -> Packet<'a>,
) -> Transmit {
    let range = body.range(index);
    let mut bytes = crate::pool::datagram();
    if range.len() >= GATHER_MIN {
        encode_unsealed(&packet(&[]), &mut bytes);
        Transmit {
            dest,
            bytes,
            tail: body.body().pieces(range),
            sealed: false,
        }
    } else {
        encode_into(&packet(&body.body().bytes(range)), key, &mut bytes);
        Transmit::whole(dest, bytes)
    }
}
