//! Sealed datagrams (`docs/security.md`, "Sealed datagrams"): the 4-byte
//! header every datagram opens with, and the three sealed layouts.
//!
//! A sealed datagram is a clear header, the ciphertext, and a 16-byte tag;
//! the header is the associated data, and the nonce is made from its
//! counter.  [`open`] checks the tag before it returns a field, so nothing
//! of a forged datagram is ever parsed.  Replay is the caller's to check,
//! with the opened header's counter (see [`crate::ReplayWindow`]).

use crate::SessionError;
use crate::aead::{Key, TAG_LEN};
use crate::cert::reader;

/// First two bytes of every shoal datagram.
pub const MAGIC: [u8; 2] = *b"SH";
/// This format's version.
pub const VERSION: u8 = 2;

/// What a datagram is, from its fourth byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Class {
    /// Noise XX message 1.
    Initiation = 1,
    /// Noise XX message 2.
    Response = 2,
    /// Noise XX message 3.
    Finish = 3,
    /// Daemon to daemon, sealed in their node session.
    Node = 4,
    /// Client endpoint to server endpoint.
    ToServer = 5,
    /// Server endpoint to client endpoint.
    ToClient = 6,
    /// Group member to members.
    Group = 7,
}

/// The class of `datagram`, after checking magic and version.
pub fn class(datagram: &[u8]) -> Result<Class, SessionError> {
    if datagram.len() < 4 {
        return Err(SessionError::Truncated);
    }
    if datagram[..2] != MAGIC {
        return Err(SessionError::Malformed("magic"));
    }
    if datagram[2] != VERSION {
        return Err(SessionError::Malformed("version"));
    }
    Ok(match datagram[3] {
        1 => Class::Initiation,
        2 => Class::Response,
        3 => Class::Finish,
        4 => Class::Node,
        5 => Class::ToServer,
        6 => Class::ToClient,
        7 => Class::Group,
        _ => return Err(SessionError::Malformed("class")),
    })
}

/// The clear header of a sealed datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// Class 4: the receiver's session index and the counter.
    Node { receiver: u32, counter: u64 },
    /// Class 5 or 6: the receiver node's session index, the sender's uid,
    /// the sending endpoint (client id, or server instance) and the counter.
    Endpoint {
        to_client: bool,
        receiver: u32,
        uid: u32,
        sender: u64,
        counter: u64,
    },
    /// Class 7: which group (the put-port's first 8 bytes), the key epoch
    /// its sender sealed under, the sending member and the counter.
    Group {
        group: [u8; 8],
        epoch: u32,
        member: u64,
        counter: u64,
    },
}

/// Bytes of a node datagram's header.
pub const NODE_HEAD: usize = 16;
/// Bytes of an endpoint datagram's header.
pub const ENDPOINT_HEAD: usize = 28;
/// Bytes of a group datagram's header.
pub const GROUP_HEAD: usize = 32;
/// What sealing adds to the longest header.
pub const MAX_OVERHEAD: usize = GROUP_HEAD + TAG_LEN;

impl Header {
    pub fn class(&self) -> Class {
        match self {
            Header::Node { .. } => Class::Node,
            Header::Endpoint {
                to_client: false, ..
            } => Class::ToServer,
            Header::Endpoint {
                to_client: true, ..
            } => Class::ToClient,
            Header::Group { .. } => Class::Group,
        }
    }

    pub fn counter(&self) -> u64 {
        match *self {
            Header::Node { counter, .. }
            | Header::Endpoint { counter, .. }
            | Header::Group { counter, .. } => counter,
        }
    }

    /// Bytes of this header on the wire.
    pub fn len(&self) -> usize {
        match self {
            Header::Node { .. } => NODE_HEAD,
            Header::Endpoint { .. } => ENDPOINT_HEAD,
            Header::Group { .. } => GROUP_HEAD,
        }
    }

    /// Never empty; here for clippy's sake.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The AEAD nonce: a direction byte, three zero bytes, the counter.
    pub fn nonce(&self) -> [u8; 12] {
        let mut nonce = [0u8; 12];
        if let Header::Endpoint {
            to_client: true, ..
        } = self
        {
            nonce[0] = 1;
        }
        nonce[4..].copy_from_slice(&self.counter().to_le_bytes());
        nonce
    }

    /// Appends the header's bytes to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(self.class() as u8);
        match *self {
            Header::Node { receiver, counter } => {
                out.extend_from_slice(&receiver.to_le_bytes());
                out.extend_from_slice(&counter.to_le_bytes());
            }
            Header::Endpoint {
                receiver,
                uid,
                sender,
                counter,
                ..
            } => {
                out.extend_from_slice(&receiver.to_le_bytes());
                out.extend_from_slice(&uid.to_le_bytes());
                out.extend_from_slice(&sender.to_le_bytes());
                out.extend_from_slice(&counter.to_le_bytes());
            }
            Header::Group {
                group,
                epoch,
                member,
                counter,
            } => {
                out.extend_from_slice(&group);
                out.extend_from_slice(&epoch.to_le_bytes());
                out.extend_from_slice(&member.to_le_bytes());
                out.extend_from_slice(&counter.to_le_bytes());
            }
        }
    }

    /// Reads the clear header of a sealed datagram.  Nothing it returns is
    /// authentic until [`open`] succeeds: use it only to find the key.
    pub fn peek(datagram: &[u8]) -> Result<Header, SessionError> {
        let class = class(datagram)?;
        let mut r = reader(&datagram[4..]);
        let header = match class {
            Class::Node => Header::Node {
                receiver: r.u32()?,
                counter: r.u64()?,
            },
            Class::ToServer | Class::ToClient => Header::Endpoint {
                to_client: class == Class::ToClient,
                receiver: r.u32()?,
                uid: r.u32()?,
                sender: r.u64()?,
                counter: r.u64()?,
            },
            Class::Group => Header::Group {
                group: r.array()?,
                epoch: r.u32()?,
                member: r.u64()?,
                counter: r.u64()?,
            },
            _ => return Err(SessionError::Malformed("not a sealed datagram")),
        };
        if r.remaining() < TAG_LEN {
            return Err(SessionError::Truncated);
        }
        Ok(header)
    }
}

/// Seals the plaintext made of `pieces` joined under `header` with `key`
/// into `out` (cleared first): header, ciphertext, tag.  Encrypting is the
/// one copy the pieces make.
pub fn seal(key: &Key, header: &Header, pieces: &[&[u8]], out: &mut Vec<u8>) {
    out.clear();
    header.write(out);
    let head = out.len();
    for p in pieces {
        out.extend_from_slice(p);
    }
    let (aad, body) = out.split_at_mut(head);
    let tag = key.seal(header.nonce(), aad, body);
    out.extend_from_slice(&tag);
}

/// Checks `datagram`'s tag with `key` and decrypts it in place: its header
/// and the plaintext (a slice of `datagram`).
pub fn open<'a>(key: &Key, datagram: &'a mut [u8]) -> Result<(Header, &'a mut [u8]), SessionError> {
    let header = Header::peek(datagram)?;
    let plain = open_peeked(key, &header, datagram)?;
    Ok((header, plain))
}

/// [`open`] of a datagram whose header was read already: `header` must be
/// what [`Header::peek`] returned for `datagram`.
pub fn open_peeked<'a>(
    key: &Key,
    header: &Header,
    datagram: &'a mut [u8],
) -> Result<&'a mut [u8], SessionError> {
    let (aad, body) = datagram.split_at_mut(header.len());
    key.open(header.nonce(), aad, body)
}
