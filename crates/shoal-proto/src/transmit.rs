//! What a core asks its shell to send.

use std::net::SocketAddr;

/// Where a datagram goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// One address.
    Addr(SocketAddr),
    /// Every node of the cluster: a broadcast on the cluster network, or,
    /// where there is none (loopback clusters), each known node in turn.
    Nodes,
}

/// One datagram to send, already encoded and authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub dest: Dest,
    pub bytes: Vec<u8>,
}
