//! The packet kinds and their fields.
//!
//! RPC (client ⇄ server endpoint):
//! - [`Request`]: one fragment of a request body, addressed to a put-port
//!   and to the server instance the client located.
//! - [`Reply`]: one fragment of a reply body.
//! - [`Ack`]: which fragments of a multi-fragment body arrived (blast/window
//!   flow control); an ack that covers every reply fragment is the final
//!   acknowledgement that lets the server free the reply.
//! - [`Working`]: "your request is here and running": the answer to a
//!   retransmission while the server works, so a slow server is not taken
//!   for a dead one.
//! - [`NotHere`]: "this endpoint did not and will not execute your
//!   request": wrong port, or a different (restarted) instance.
//!
//! Locate (client ⇄ node daemons): [`Locate`] asks who serves a put-port;
//! [`Here`] answers with the endpoints registered on one node.
//!
//! Membership (node ⇄ node): [`Heartbeat`].

use std::net::SocketAddr;

use shoal_cap::PutPort;

use crate::ids::{ClientId, Instance, NodeId, Nonce, TxnId};

/// Most endpoints one [`Here`] lists.
pub const MAX_HERE_ENDPOINTS: usize = 32;
/// Most members one [`Heartbeat`] lists.
pub const MAX_MEMBERS: usize = 256;
/// Longest node name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;

/// Position of one fragment within a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frag {
    /// Zero-based index of this fragment.
    pub index: u32,
    /// Fragments in the whole body (at least 1, even for an empty body).
    pub count: u32,
}

/// One fragment of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    pub txn: TxnId,
    /// The server instance the client located; [`Instance`]`(0)` if any will do.
    pub instance: Instance,
    pub port: PutPort,
    pub frag: Frag,
    /// Length of the whole body.
    pub total_len: u64,
    pub payload: &'a [u8],
}

/// Outcome carried by a reply, besides its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ReplyStatus {
    /// The server executed the request; the body is its reply.
    Ok = 0,
    /// The server refused the request without executing it: it cannot take
    /// more clients right now.
    Busy = 1,
    /// The server refused the request without executing it: the body is
    /// larger than it accepts.
    TooLarge = 2,
}

impl ReplyStatus {
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Ok),
            1 => Some(Self::Busy),
            2 => Some(Self::TooLarge),
            _ => None,
        }
    }
}

/// One fragment of a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply<'a> {
    pub txn: TxnId,
    /// The instance that executed the request.
    pub instance: Instance,
    pub status: ReplyStatus,
    pub frag: Frag,
    pub total_len: u64,
    pub payload: &'a [u8],
}

/// Which body an [`Ack`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum AckDir {
    /// Sent by the server about request fragments.
    Request = 0,
    /// Sent by the client about reply fragments.
    Reply = 1,
}

/// Selective acknowledgement of body fragments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    pub txn: TxnId,
    pub instance: Instance,
    pub dir: AckDir,
    /// Every fragment below `base` arrived; `base` itself did not (or
    /// `base == count`: the body is complete).
    pub base: u32,
    /// Bit `i` set: fragment `base + 1 + i` arrived.
    pub mask: u64,
}

/// "Your request arrived and is being executed."
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Working {
    pub txn: TxnId,
    pub instance: Instance,
}

/// "This endpoint did not execute your request and never will."
///
/// `actual == wanted` is the addressed instance itself refusing a new
/// request while it drains before stopping: proof the request never ran
/// there.  Otherwise another instance (or none) listens at the address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotHere {
    pub txn: TxnId,
    pub port: PutPort,
    /// The instance the request addressed.
    pub wanted: Instance,
    /// The instance that is listening here now, or 0 if the port is not
    /// served by this endpoint at all.
    pub actual: Instance,
}

/// "Who serves this put-port?"  Asked of every node to find a port; of
/// one node, with `instance` set, to ask what became of that server
/// instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Locate {
    pub nonce: Nonce,
    pub port: PutPort,
    /// An instance whose [`Fate`] the asker wants to know, or 0.
    pub instance: Instance,
    /// The node to ask, or 0: every node.
    pub node: NodeId,
}

/// What a node knows of one server instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fate {
    /// Never registered here, or forgotten.
    Unknown = 0,
    /// Registered and serving.
    Serving = 1,
    /// Stopped after draining: it refused every new request for the drain
    /// period before closing, so a request refused at its address in the
    /// first retransmission interval never ran there.
    Drained = 2,
    /// Gone without draining (crashed, killed, or still draining).
    Vanished = 3,
}

impl Fate {
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Unknown),
            1 => Some(Self::Serving),
            2 => Some(Self::Drained),
            3 => Some(Self::Vanished),
            _ => None,
        }
    }
}

/// A server endpoint: where it listens, which incarnation it is, and who
/// runs it, as its node says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub instance: Instance,
    /// The uid that registered it (from the kernel, on its node).
    pub uid: u32,
    /// A system service: registered by its node daemon itself.
    pub system: bool,
}

/// A node's answer to [`Locate`]: the endpoints registered there, and the
/// fate of the instance asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Here {
    pub nonce: Nonce,
    pub port: PutPort,
    pub node: NodeId,
    /// Fate of [`Locate::instance`] ([`Fate::Unknown`] if none was asked).
    pub fate: Fate,
    pub endpoints: Vec<Endpoint>,
}

/// One cluster member as another node knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub node: NodeId,
    pub addr: SocketAddr,
}

/// Periodic liveness and membership gossip between node daemons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub node: NodeId,
    /// Changes each time the daemon starts.
    pub incarnation: u64,
    pub name: String,
    /// The daemon's node-protocol address.
    pub addr: SocketAddr,
    /// Members the sender knows of, so a node that joined through one seed
    /// learns about all the others.
    pub members: Vec<Member>,
    /// The sender's load, if it measures it.
    pub load: Option<crate::Load>,
}

/// Every kind of datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet<'a> {
    Request(Request<'a>),
    Reply(Reply<'a>),
    Ack(Ack),
    Working(Working),
    NotHere(NotHere),
    Locate(Locate),
    Here(Here),
    Heartbeat(Heartbeat),
    /// Group communication (kinds 16–31, see [`crate::group`]).
    Group(crate::group::GroupPacket<'a>),
}

impl Packet<'_> {
    /// The kind byte on the wire.
    pub fn kind(&self) -> u8 {
        match self {
            Packet::Request(_) => 1,
            Packet::Reply(_) => 2,
            Packet::Ack(_) => 3,
            Packet::Working(_) => 4,
            Packet::NotHere(_) => 5,
            Packet::Locate(_) => 6,
            Packet::Here(_) => 7,
            Packet::Heartbeat(_) => 8,
            Packet::Group(g) => g.body.kind(),
        }
    }

    /// The client id the packet concerns, for RPC kinds.
    pub fn client(&self) -> Option<ClientId> {
        match self {
            Packet::Request(p) => Some(p.txn.client),
            Packet::Reply(p) => Some(p.txn.client),
            Packet::Ack(p) => Some(p.txn.client),
            Packet::Working(p) => Some(p.txn.client),
            Packet::NotHere(p) => Some(p.txn.client),
            _ => None,
        }
    }
}
