//! The keys of a program's endpoint channels (`docs/security.md`,
//! "Endpoint channels"), as the node hands them out over the link.
//!
//! - [`ClientKeys`]: a client endpoint's channel to each server endpoint
//!   it located, by instance, with the session index to name and when the
//!   key must be replaced.
//! - [`ServerKeys`]: a server endpoint's secret `T(i)` per node session
//!   (asked of the node once per session), and a channel per caller
//!   (session, uid, client) derived from it, each with its replay window.
//!   A channel lives as long as its session, so a datagram replayed at any
//!   time either fails its window or no longer opens at all.

use std::time::Duration;

use rustc_hash::FxHashMap as HashMap;

use shoal_proto::{Caller, Time};
use shoal_session::kdf::channel_key;
use shoal_session::{Algorithm, Channel, Header, SessionError};
use shoal_wire::{ClientId, Instance, NodeId};

use crate::clock;
use crate::error::Error;
use crate::link::Grant;

/// Calls `f` with a plaintext's pieces: `head`, then those of `tail`
/// (without allocating for the common case of no tail).
pub(crate) fn with_pieces<R>(
    head: &[u8],
    tail: &[bytes::Bytes],
    f: impl FnOnce(&[&[u8]]) -> R,
) -> R {
    if tail.is_empty() {
        return f(&[head]);
    }
    let mut pieces: Vec<&[u8]> = Vec::with_capacity(1 + tail.len());
    pieces.push(head);
    pieces.extend(tail.iter().map(|b| &b[..]));
    f(&pieces)
}

/// Whether a grant is for AES-GCM.
fn algorithm(aes: bool) -> Algorithm {
    if aes {
        Algorithm::Aes256Gcm
    } else {
        Algorithm::ChaCha20Poly1305
    }
}

fn hex32(text: &str) -> Result<[u8; 32], Error> {
    hex::decode(text)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| Error::Node("a key from the node is not 32 bytes of hex".into()))
}

/// One client channel.
#[derive(Debug)]
struct ClientKey {
    channel: Channel,
    /// The channel's key: a grant of the same key (a locate again, or a
    /// refresh within one session) keeps the channel and its counter.
    key: [u8; 32],
    node: NodeId,
    index: u32,
    /// On the protocol clock, which the client's calls read anyway.
    expires: Time,
}

/// A client endpoint's channels, by server instance.
#[derive(Debug, Default)]
pub(crate) struct ClientKeys {
    keys: HashMap<Instance, ClientKey>,
}

/// What [`ClientKeys::seal`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sealed {
    Done,
    /// The key expired: ask the node of the instance for a fresh one.
    Stale(NodeId),
    /// No key for the instance at all.
    NoKey,
}

/// Most channels a client keeps; the oldest go first.
const MAX_CLIENT_KEYS: usize = 256;

impl ClientKeys {
    /// Keeps the channel `grant` gives to `instance` on `node`.  A grant of
    /// the channel already kept only moves its expiry: a channel started
    /// again would count its datagrams from 0, and the server's replay
    /// window, which has seen those counters, would refuse them all.
    pub fn insert(&mut self, instance: Instance, node: NodeId, grant: &Grant) -> Result<(), Error> {
        let key = hex32(&grant.key)?;
        let expires = clock::now() + Duration::from_millis(grant.valid_ms);
        if let Some(k) = self.keys.get_mut(&instance)
            && k.key == key
            && k.index == grant.index
            && k.node == node
        {
            k.expires = expires;
            return Ok(());
        }
        if self.keys.len() >= MAX_CLIENT_KEYS && !self.keys.contains_key(&instance) {
            let oldest = self
                .keys
                .iter()
                .min_by_key(|(_, k)| k.expires)
                .map(|(i, _)| *i);
            if let Some(i) = oldest {
                self.keys.remove(&i);
            }
        }
        self.keys.insert(
            instance,
            ClientKey {
                channel: Channel::client(algorithm(grant.aes), &key),
                key,
                node,
                index: grant.index,
                expires,
            },
        );
        Ok(())
    }

    /// Seals the plaintext `pieces` for `instance` into `out`, unless its
    /// key has expired by `now` (`None`: use it even so) or there is none:
    /// then nothing is sealed.
    pub fn seal(
        &mut self,
        instance: Instance,
        now: Option<Time>,
        uid: u32,
        client: ClientId,
        pieces: &[&[u8]],
        out: &mut Vec<u8>,
    ) -> Sealed {
        let Some(k) = self.keys.get_mut(&instance) else {
            return Sealed::NoKey;
        };
        if now.is_some_and(|now| now >= k.expires) {
            return Sealed::Stale(k.node);
        }
        k.channel.seal(k.index, uid, client.0, pieces, out);
        Sealed::Done
    }

    /// Opens a server's datagram in place: the server endpoint whose key
    /// opened it, and the plaintext's range in `datagram`; or why not (a
    /// replay, or anything else).
    pub fn open(
        &mut self,
        datagram: &mut [u8],
    ) -> Result<(Instance, std::ops::Range<usize>), SessionError> {
        let header = Header::peek(datagram)?;
        let Header::Endpoint {
            to_client: true,
            sender,
            ..
        } = header
        else {
            return Err(SessionError::Malformed("not for a client"));
        };
        let k = self
            .keys
            .get_mut(&Instance(sender))
            .ok_or(SessionError::UnknownIndex)?;
        let (header, plain) = k.channel.open_peeked(header, datagram)?;
        let start = header.len();
        Ok((Instance(sender), start..start + plain.len()))
    }
}

/// One node session as a server endpoint knows it.
#[derive(Debug)]
struct ServerRoot {
    secret: [u8; 32],
    /// The node at the session's other end.
    node: NodeId,
    algorithm: Algorithm,
    expires: Time,
}

/// A server endpoint's roots and channels.
#[derive(Debug, Default)]
pub(crate) struct ServerKeys {
    roots: HashMap<u32, ServerRoot>,
    channels: HashMap<(u32, u32, u64), Channel>,
    /// Indexes the node did not know, and until when not to ask again.
    unknown: HashMap<u32, Time>,
    /// When the node was asked about an index, over the last second.
    asked: std::collections::VecDeque<Time>,
    swept: Option<Time>,
}

/// Most questions about unknown indexes per second: datagrams naming
/// made-up sessions cost the node no more than this.
const MAX_ASKS: usize = 64;

/// Channels a server keeps at once: a new caller beyond them is dropped
/// (never an old caller's window, which would let its datagrams replay).
const MAX_CHANNELS: usize = 1 << 16;
/// Indexes remembered as unknown.
const MAX_UNKNOWN: usize = 1024;
/// How long an unknown index is not asked about again.
const UNKNOWN_FOR: Duration = Duration::from_secs(1);

/// Why a datagram did not open at a server.
#[derive(Debug)]
pub(crate) enum Refused {
    /// Ask the node for the secret of this session index, then try again.
    NeedRoot(u32),
    /// Replayed: counted apart.
    Replayed,
    /// Anything else: forged, malformed, unknown, or too many callers.
    Bad,
}

impl ServerKeys {
    /// Keeps the secret of session `index` the node gave.
    pub fn insert_root(
        &mut self,
        index: u32,
        secret: &str,
        node: &str,
        aes: bool,
        valid_ms: u64,
    ) -> Result<(), Error> {
        let node = u64::from_str_radix(node, 16)
            .map_err(|_| Error::Node("a node id from the node is not hex".into()))?;
        self.roots.insert(
            index,
            ServerRoot {
                secret: hex32(secret)?,
                node: NodeId(node),
                algorithm: algorithm(aes),
                expires: clock::now() + Duration::from_millis(valid_ms),
            },
        );
        Ok(())
    }

    /// Remembers that the node does not know `index`.
    pub fn unknown(&mut self, index: u32) {
        if self.unknown.len() >= MAX_UNKNOWN {
            self.unknown.clear();
        }
        self.unknown.insert(index, clock::now() + UNKNOWN_FOR);
    }

    /// Opens a client's datagram in place: who sent it, through which
    /// session, and the plaintext's range in `datagram`.  `now` is the
    /// caller's latest clock read.
    pub fn open(
        &mut self,
        datagram: &mut [u8],
        now: Time,
    ) -> Result<(Caller, u32, std::ops::Range<usize>), Refused> {
        self.sweep(now);
        let Ok(header) = Header::peek(datagram) else {
            return Err(Refused::Bad);
        };
        let Header::Endpoint {
            to_client: false,
            receiver,
            uid,
            sender,
            ..
        } = header
        else {
            return Err(Refused::Bad);
        };
        let Some(root) = self.roots.get(&receiver) else {
            if self
                .unknown
                .get(&receiver)
                .is_some_and(|&until| now < until)
            {
                return Err(Refused::Bad);
            }
            while self
                .asked
                .front()
                .is_some_and(|&t| now.saturating_since(t) >= Duration::from_secs(1))
            {
                self.asked.pop_front();
            }
            if self.asked.len() >= MAX_ASKS {
                return Err(Refused::Bad);
            }
            self.asked.push_back(now);
            return Err(Refused::NeedRoot(receiver));
        };
        let node = root.node;
        let id = (receiver, uid, sender);
        let opened = match self.channels.get_mut(&id) {
            Some(channel) => channel
                .open_peeked(header, datagram)
                .map(|(h, p)| (h.len(), p.len())),
            None => {
                // A channel is kept only once something opened in it, so
                // forged headers cannot fill the table.
                if self.channels.len() >= MAX_CHANNELS {
                    return Err(Refused::Bad);
                }
                let key = channel_key(&root.secret, node.0, uid, sender);
                let mut channel = Channel::server(root.algorithm, &key);
                let opened = channel
                    .open_peeked(header, datagram)
                    .map(|(h, p)| (h.len(), p.len()));
                if opened.is_ok() {
                    self.channels.insert(id, channel);
                }
                opened
            }
        };
        match opened {
            Ok((start, len)) => {
                let caller = Caller {
                    node,
                    uid,
                    client: ClientId(sender),
                };
                Ok((caller, receiver, start..start + len))
            }
            Err(SessionError::Replayed) => Err(Refused::Replayed),
            Err(_) => Err(Refused::Bad),
        }
    }

    /// Seals a reply's `pieces` for `caller` in session `channel` into
    /// `out`; `false` if that channel is gone (its session expired).
    pub fn seal(
        &mut self,
        channel: u32,
        caller: Caller,
        uid: u32,
        instance: Instance,
        pieces: &[&[u8]],
        out: &mut Vec<u8>,
    ) -> bool {
        match self
            .channels
            .get_mut(&(channel, caller.uid, caller.client.0))
        {
            Some(c) => {
                c.seal(channel, uid, instance.0, pieces, out);
                true
            }
            None => false,
        }
    }

    /// Forgets sessions past their expiry, and their channels.
    fn sweep(&mut self, now: Time) {
        if self.swept.is_some_and(|t| now < t + Duration::from_secs(1)) {
            return;
        }
        self.swept = Some(now);
        self.roots.retain(|_, r| now < r.expires);
        let roots = &self.roots;
        self.channels
            .retain(|(index, _, _), _| roots.contains_key(index));
        self.unknown.retain(|_, until| now < *until);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client channel and the server's end of it, for session `index`.
    fn ends(index: u32) -> (ClientKeys, ServerKeys, Grant, Instance) {
        let secret = [7u8; 32];
        let (node, uid, client) = (NodeId(0x11), 1000, ClientId(0x22));
        let key = channel_key(&secret, node.0, uid, client.0);
        let grant = Grant {
            key: hex::encode(key),
            index,
            aes: true,
            valid_ms: 60_000,
        };
        let instance = Instance(0x33);
        let mut c = ClientKeys::default();
        c.insert(instance, node, &grant).unwrap();
        let mut s = ServerKeys::default();
        s.insert_root(index, &hex::encode(secret), "11", true, 60_000)
            .unwrap();
        (c, s, grant, instance)
    }

    fn send(c: &mut ClientKeys, s: &mut ServerKeys, instance: Instance) -> Result<(), ()> {
        let mut out = Vec::new();
        let now = clock::now();
        let sealed = c.seal(
            instance,
            Some(now),
            1000,
            ClientId(0x22),
            &[b"ping"],
            &mut out,
        );
        assert_eq!(sealed, Sealed::Done);
        s.open(&mut out, clock::now()).map(|_| ()).map_err(|_| ())
    }

    #[test]
    fn the_same_grant_again_keeps_the_channel_so_the_server_still_opens_it() {
        let (mut c, mut s, grant, instance) = ends(5);
        for _ in 0..200 {
            send(&mut c, &mut s, instance).unwrap();
        }
        // A locate again after the server stopped answering hands the
        // client the same key: its datagrams must still open.
        c.insert(instance, NodeId(0x11), &grant).unwrap();
        send(&mut c, &mut s, instance).expect("a datagram after the same grant again");
    }

    #[test]
    fn a_grant_of_another_session_replaces_the_channel() {
        let (mut c, _, _, instance) = ends(5);
        let (_, mut s6, grant6, _) = ends(6);
        c.insert(instance, NodeId(0x11), &grant6).unwrap();
        send(&mut c, &mut s6, instance).expect("a datagram in the new session");
    }
}
