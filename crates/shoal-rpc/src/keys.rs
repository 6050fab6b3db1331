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
//!   time either fails its window or no longer opens at all.  Each caller
//!   (node, uid) has a share of the table: past it, that caller's channel
//!   least recently used is dropped, and remembered as dropped so that
//!   nothing sent in it opens again; no caller's share is touched by
//!   another's.

use std::time::Duration;

use rustc_hash::FxHashMap as HashMap;

use shoal_cap::PutPort;
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
    /// The port the server endpoint was located for (its key is bound to
    /// it).
    port: PutPort,
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
    /// The key expired: ask the node of the instance for a fresh one, for
    /// this port.
    Stale(NodeId, PutPort),
    /// No key for the instance at all.
    NoKey,
}

/// Most channels a client keeps; the oldest go first.
const MAX_CLIENT_KEYS: usize = 256;
/// Counters one client channel may take before the next channel made in
/// this process starts above them (its session is rekeyed long before).
const COUNTERS_PER_CHANNEL: u64 = 1 << 32;
/// Where the next client channel made in this process starts counting.
/// A channel forgotten (the oldest of [`MAX_CLIENT_KEYS`]) and made again
/// with the same key starts above everything the first one sent, so no
/// nonce is ever sealed twice under one key.
static NEXT_COUNTERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl ClientKeys {
    /// Keeps the channel `grant` gives to `instance` of `port` on `node`.  A grant of
    /// the channel already kept only moves its expiry: a channel started
    /// again would count its datagrams from 0, and the server's replay
    /// window, which has seen those counters, would refuse them all.
    pub fn insert(
        &mut self,
        instance: Instance,
        node: NodeId,
        port: PutPort,
        grant: &Grant,
    ) -> Result<(), Error> {
        let key = hex32(&grant.key)?;
        let expires = clock::now() + Duration::from_millis(grant.valid_ms);
        if let Some(k) = self.keys.get_mut(&instance)
            && k.key == key
            && k.index == grant.index
            && k.node == node
            && k.port == port
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
                channel: Channel::client_from(
                    algorithm(grant.aes),
                    &key,
                    NEXT_COUNTERS
                        .fetch_add(COUNTERS_PER_CHANNEL, std::sync::atomic::Ordering::Relaxed),
                ),
                key,
                node,
                port,
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
            return Sealed::Stale(k.node, k.port);
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

/// A caller's channel at a server.
#[derive(Debug)]
struct Kept {
    channel: Channel,
    /// Opened something since it was made or the share's clock hand last
    /// passed it.
    used: bool,
}

/// One caller's (node, uid) channels at a server, oldest first, and the
/// channels it lost to its quota, by (session, client).
#[derive(Debug, Default)]
struct Share {
    order: std::collections::VecDeque<(u32, u64)>,
    dropped: rustc_hash::FxHashSet<(u32, u64)>,
}

/// A server endpoint's roots and channels.
#[derive(Debug, Default)]
pub(crate) struct ServerKeys {
    roots: HashMap<u32, ServerRoot>,
    channels: HashMap<(u32, u32, u64), Kept>,
    shares: HashMap<(NodeId, u32), Share>,
    /// Indexes the node did not know, and until when not to ask again.
    unknown: HashMap<u32, Time>,
    /// Sessions this endpoint swept, and until when it refuses them: its
    /// windows of them are gone, so it must never take their secret again
    /// (the node may still hand it out for a moment), or every datagram
    /// ever sent in them would open once more.
    retired: HashMap<u32, Time>,
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
/// Channels one caller (node, uid) keeps at a server: a new one beyond
/// them takes the place of that caller's least recently used.
pub(crate) const MAX_CHANNELS_PER_CALLER: usize = 4096;
/// Channels one caller may have lost to its quota in the sessions that
/// live; beyond them its new channels are refused until a session ends.
const MAX_DROPPED_PER_CALLER: usize = 4 * MAX_CHANNELS_PER_CALLER;
/// Indexes remembered as unknown.
const MAX_UNKNOWN: usize = 1024;
/// How long an unknown index is not asked about again.
const UNKNOWN_FOR: Duration = Duration::from_secs(1);
/// How long a swept session is refused: longer than any session opens
/// (180 s), so the node has forgotten it first.
const RETIRED_FOR: Duration = Duration::from_secs(200);
/// Swept sessions remembered (they come only from the node, a handful
/// per peer every 120 s).
const MAX_RETIRED: usize = 4096;

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
        if self.retired.contains_key(&index) {
            return Err(Error::Node(format!(
                "session {index:08x} was swept here: its windows are gone"
            )));
        }
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
                || self.retired.contains_key(&receiver)
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
            Some(kept) => {
                kept.used = true;
                kept.channel
                    .open_peeked(header, datagram)
                    .map(|(h, p)| (h.len(), p.len()))
            }
            None => {
                // A channel is kept only once something opened in it, so
                // forged headers cannot fill the table.
                // Nor do forged headers make shares: one is looked at now
                // and made only once the datagram opened.
                let refused = self.shares.get(&(node, uid)).is_some_and(|share| {
                    share.dropped.contains(&(receiver, sender))
                        || (share.order.len() >= MAX_CHANNELS_PER_CALLER
                            && share.dropped.len() >= MAX_DROPPED_PER_CALLER)
                });
                if refused || self.channels.len() >= MAX_CHANNELS {
                    return Err(Refused::Bad);
                }
                let key = channel_key(&root.secret, node.0, uid, sender);
                let mut channel = Channel::server(root.algorithm, &key);
                let opened = channel
                    .open_peeked(header, datagram)
                    .map(|(h, p)| (h.len(), p.len()));
                if opened.is_ok() {
                    let share = self.shares.entry((node, uid)).or_default();
                    if share.order.len() >= MAX_CHANNELS_PER_CALLER {
                        drop_one(&mut self.channels, share, uid);
                    }
                    share.order.push_back((receiver, sender));
                    // Unused until something opens in it again: a caller's
                    // one-off channels go before those it keeps using.
                    self.channels.insert(
                        id,
                        Kept {
                            channel,
                            used: false,
                        },
                    );
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
            Some(kept) => {
                kept.channel.seal(channel, uid, instance.0, pieces, out);
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
        self.retired.retain(|_, until| now < *until);
        let retired = &mut self.retired;
        self.roots.retain(|&index, r| {
            let live = now < r.expires;
            if !live {
                if retired.len() >= MAX_RETIRED
                    && let Some(oldest) = retired.iter().min_by_key(|e| *e.1).map(|e| *e.0)
                {
                    retired.remove(&oldest);
                }
                retired.insert(index, now + RETIRED_FOR);
            }
            live
        });
        let roots = &self.roots;
        self.channels
            .retain(|(index, _, _), _| roots.contains_key(index));
        self.shares.retain(|_, share| {
            share.order.retain(|(index, _)| roots.contains_key(index));
            share.dropped.retain(|(index, _)| roots.contains_key(index));
            !(share.order.is_empty() && share.dropped.is_empty())
        });
        self.unknown.retain(|_, until| now < *until);
    }
}

/// Drops the least recently used channel of `share` (whose uid is `uid`),
/// by the clock: the hand passes channels used since it last did, and
/// takes the first that was not.  It is remembered as dropped, so nothing
/// sent in it, before or after, opens again.
fn drop_one(channels: &mut HashMap<(u32, u32, u64), Kept>, share: &mut Share, uid: u32) {
    while let Some((index, client)) = share.order.pop_front() {
        match channels.get_mut(&(index, uid, client)) {
            Some(kept) if kept.used => {
                kept.used = false;
                share.order.push_back((index, client));
            }
            Some(_) => {
                channels.remove(&(index, uid, client));
                share.dropped.insert((index, client));
                return;
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PORT: PutPort = PutPort::from_bytes([4; 16]);

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
        c.insert(instance, node, PORT, &grant).unwrap();
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
        c.insert(instance, NodeId(0x11), PORT, &grant).unwrap();
        send(&mut c, &mut s, instance).expect("a datagram after the same grant again");
    }

    /// Review 3, M2: a server that swept a session a moment before its
    /// node stopped handing the session's secret out must not take the
    /// secret again, or its windows would start afresh and every datagram
    /// of the session would open once more.
    #[test]
    fn a_swept_session_is_never_taken_again() {
        let (mut c, mut s, _, instance) = ends(5);
        // Read before the secret comes, so the first open is within its
        // millisecond.
        let before = clock::now();
        s.insert_root(5, &hex::encode([7u8; 32]), "11", true, 1)
            .unwrap();
        let mut captured = Vec::new();
        let sealed = c.seal(
            instance,
            None,
            1000,
            ClientId(0x22),
            &[b"ping"],
            &mut captured,
        );
        assert_eq!(sealed, Sealed::Done);
        assert!(s.open(&mut captured.clone(), before).is_ok());
        // The sweep: the session's secret and windows are gone.
        let later = before + Duration::from_secs(2);
        assert!(matches!(
            s.open(&mut captured.clone(), later),
            Err(Refused::Bad)
        ));
        // The node still answers for it: the secret is refused, and the
        // capture does not open.
        assert!(
            s.insert_root(5, &hex::encode([7u8; 32]), "11", true, 60_000)
                .is_err()
        );
        assert!(matches!(
            s.open(&mut captured.clone(), later),
            Err(Refused::Bad)
        ));
        // Another session is taken as before.
        s.insert_root(6, &hex::encode([7u8; 32]), "11", true, 60_000)
            .unwrap();
    }

    /// Review 3, M5: one caller filling a server's table loses its own
    /// least recently used channels, never another caller's, and nothing
    /// sent in a dropped channel opens again.
    #[test]
    fn a_caller_over_its_share_loses_its_own_oldest_channel_only() {
        let secret = [7u8; 32];
        let mut s = ServerKeys::default();
        s.insert_root(5, &hex::encode(secret), "11", true, 60_000)
            .unwrap();
        let datagram = |uid: u32, client: u64, channel: &mut Channel| {
            let mut out = Vec::new();
            channel.seal(5, uid, client, &[b"ping"], &mut out);
            out
        };
        let client = |uid: u32, client: u64| {
            let key = channel_key(&secret, 0x11, uid, client);
            Channel::client(Algorithm::Aes256Gcm, &key)
        };
        let now = clock::now();
        // Another user's channel, and the attacker's first, kept busy.
        let mut theirs = client(1001, 1);
        assert!(s.open(&mut datagram(1001, 1, &mut theirs), now).is_ok());
        let mut first = client(1000, 0);
        let captured = datagram(1000, 0, &mut first);
        assert!(s.open(&mut captured.clone(), now).is_ok());
        let mut second = client(1000, 1);
        let second_captured = datagram(1000, 1, &mut second);
        assert!(s.open(&mut second_captured.clone(), now).is_ok());
        for c in 2..MAX_CHANNELS_PER_CALLER as u64 + 8 {
            assert!(
                s.open(&mut datagram(1000, c, &mut client(1000, c)), now)
                    .is_ok()
            );
            if c % 512 == 0 {
                assert!(s.open(&mut datagram(1000, 0, &mut first), now).is_ok());
            }
        }
        let share = &s.shares[&(NodeId(0x11), 1000)];
        assert_eq!(share.order.len(), MAX_CHANNELS_PER_CALLER);
        // The used one was kept; an idle one went, and its capture (a
        // fresh window would take it) does not open.
        assert!(s.open(&mut datagram(1000, 0, &mut first), now).is_ok());
        assert!(share_dropped(&s, 1000, 1));
        assert!(matches!(
            s.open(&mut second_captured.clone(), now),
            Err(Refused::Bad)
        ));
        // The other user's channel is untouched.
        assert!(s.open(&mut datagram(1001, 1, &mut theirs), now).is_ok());
        assert_eq!(s.shares[&(NodeId(0x11), 1001)].order.len(), 1);
    }

    fn share_dropped(s: &ServerKeys, uid: u32, client: u64) -> bool {
        s.shares[&(NodeId(0x11), uid)]
            .dropped
            .contains(&(5, client))
    }

    /// Review 3, L1: a channel forgotten for room and made again with the
    /// same key counts on above what it sent before: no nonce twice.
    #[test]
    fn a_channel_made_again_never_reuses_a_counter() {
        let (mut c, _, grant, instance) = ends(5);
        let counter = |c: &mut ClientKeys, instance: Instance| {
            let mut out = Vec::new();
            let sealed = c.seal(instance, None, 1000, ClientId(0x22), &[b"x"], &mut out);
            assert_eq!(sealed, Sealed::Done);
            u64::from_le_bytes(out[20..28].try_into().unwrap())
        };
        let first = counter(&mut c, instance);
        let second = counter(&mut c, instance);
        assert_eq!(second, first + 1);
        // Enough other servers that the first is forgotten.
        for i in 0..MAX_CLIENT_KEYS as u64 {
            c.insert(Instance(0x1000 + i), NodeId(0x11), PORT, &grant)
                .unwrap();
        }
        assert!(!c.keys.contains_key(&instance));
        c.insert(instance, NodeId(0x11), PORT, &grant).unwrap();
        assert!(counter(&mut c, instance) > second);
    }

    #[test]
    fn a_grant_of_another_session_replaces_the_channel() {
        let (mut c, _, _, instance) = ends(5);
        let (_, mut s6, grant6, _) = ends(6);
        c.insert(instance, NodeId(0x11), PORT, &grant6).unwrap();
        send(&mut c, &mut s6, instance).expect("a datagram in the new session");
    }
}
