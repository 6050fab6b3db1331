//! A node's sessions with its peers (`docs/security.md`, "Node sessions"),
//! as a state machine without I/O: the daemon and the simulator feed it
//! datagrams, sends and timer ticks, and it returns the datagrams to send
//! and the plaintexts that opened.
//!
//! - **Starting.** A send to a peer with no usable session queues the
//!   plaintext (a few per peer) and starts a handshake; the queue leaves
//!   sealed once the session is up.  Message 1 is resent until answered,
//!   for a while; then the queue is dropped and the next send tries again.
//! - **Confirming.** The responder is sure of a session when message 3
//!   arrives, and says so with an empty sealed datagram (a keepalive); the
//!   initiator resends message 3 until anything opens in the session.
//!   The initiator seals at once, so its first datagrams may overtake
//!   message 3: the responder holds a few, and opens them when it comes.
//! - **Rekeying.** A session's initiator starts the next handshake on the
//!   first send after `rekey_after`; the responder, if that has not
//!   happened, 30 s later.  The newest session seals; older ones (three at
//!   most) still open, until `reject_after` from their making, when their
//!   keys are erased.
//! - **Liveness.** A node that gets a datagram naming a session it does
//!   not have (it restarted, or let the session expire) starts a new one
//!   with the sender at once, at most once per `retry` per address.  A
//!   sender that has heard nothing in its newest session for `stale_after`
//!   starts another too; a node that heard from a peer and sent nothing
//!   back for `keepalive` sends an empty datagram, so a working session
//!   never looks stale.
//! - **Replay.** Each session has its own [`ReplayWindow`]; a datagram is
//!   marked only after it opened.  Erased sessions open nothing at all.
//! - **Crossed handshakes** (both sides start at once) make two sessions;
//!   both open, and each side seals with the newer.
//!
//! Time is the caller's clock (`now`, a [`Time`]) for timers, and Unix
//! seconds (`wall`) for certificate validity.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use shoal_time::Time;

use crate::SessionError;
use crate::aead::Algorithm;
use crate::cert::{NodeCert, RevocationList, Trust};
use crate::channel::Root;
use crate::datagram::{Class, Header, class, open, seal};
use crate::handshake::{Established, Initiator, NodeIdentity, Responder, handshake_receiver};
use crate::window::{COUNTER_LIMIT, ReplayWindow};

/// Timers and bounds.
#[derive(Debug, Clone)]
pub struct Config {
    /// The initiator rekeys on its first send after this.
    pub rekey_after: Duration,
    /// A session opens nothing after this from its making.
    pub reject_after: Duration,
    /// Handshake messages are resent at this interval.
    pub retry: Duration,
    /// An unanswered handshake is given up after this.
    pub give_up: Duration,
    /// Plaintexts held per peer while its session is being made.
    pub max_queued: usize,
    /// Handshakes answered and not finished, over all peers.
    pub max_responding: usize,
    /// Handshakes answered and not finished, per source address: a new
    /// one from an address at this bound takes the place of its oldest.
    pub max_responding_per_addr: usize,
    /// A sender that has heard nothing in its newest session for this long
    /// starts another: the peer may have lost it (restarted).
    pub stale_after: Duration,
    /// A node that heard from a peer and sent nothing back for this long
    /// sends an empty datagram, so the peer knows the session works.
    pub keepalive: Duration,
    /// Handshakes this node started and not finished, over all peers.
    pub max_initiating: usize,
    /// Sessions started, over all addresses, for datagrams naming an
    /// unknown session, per second.
    pub max_reconnects: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            rekey_after: Duration::from_secs(120),
            reject_after: Duration::from_secs(180),
            retry: Duration::from_millis(500),
            give_up: Duration::from_secs(10),
            max_queued: 64,
            max_responding: 256,
            max_responding_per_addr: 4,
            stale_after: Duration::from_secs(15),
            keepalive: Duration::from_secs(10),
            max_initiating: 64,
            max_reconnects: 16,
        }
    }
}

/// What happened, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub handshakes: u64,
    pub handshake_failures: u64,
    pub replays: u64,
    pub bad_tags: u64,
    pub unknown_index: u64,
    pub sealed: u64,
    pub opened: u64,
    pub dropped_queued: u64,
}

/// What the shell must do, or hear of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send `datagram` to `to`.
    Send { to: SocketAddr, datagram: Vec<u8> },
    /// A session with node `name` (certificate `serial`) at `addr` is up.
    Up {
        addr: SocketAddr,
        name: String,
        serial: u64,
    },
    /// A handshake with `addr` failed, or was given up.
    Refused { addr: SocketAddr, why: String },
    /// A datagram that came before the handshake's last message opened
    /// once the session was made: deliver it as [`Sessions::handle`]'s
    /// [`Opened`] would have been.
    Deliver {
        index: u32,
        serial: u64,
        plaintext: Vec<u8>,
    },
}

/// Datagrams held per answered handshake until its last message comes.
const MAX_EARLY: usize = 8;
/// Bytes of such datagrams held over all handshakes.
const MAX_EARLY_BYTES: usize = 1 << 20;

/// A datagram that opened in a session.
#[derive(Debug)]
pub struct Opened<'a> {
    /// The session's local index.
    pub index: u32,
    /// The peer's certificate serial.
    pub serial: u64,
    /// What the peer sealed.
    pub plaintext: &'a mut [u8],
}

struct Live {
    est: Established,
    addr: SocketAddr,
    made: Time,
    counter: u64,
    window: ReplayWindow,
    /// The initiator's message 3, resent until something opens.
    finish: Option<Vec<u8>>,
    last_retry: Time,
    last_recv: Time,
    last_send: Time,
}

enum Pending {
    Initiating {
        init: Initiator,
        message: Vec<u8>,
        started: Time,
        last_sent: Time,
    },
    Responding {
        resp: Responder,
        started: Time,
        /// Node datagrams that arrived (reordered) before message 3.
        early: Vec<Vec<u8>>,
    },
}

/// Sessions kept per peer; the newest seals, all open.
const MAX_SESSIONS: usize = 4;

#[derive(Default)]
struct Peer {
    /// Live sessions, oldest first.
    sessions: Vec<u32>,
    initiating: Option<u32>,
    queue: VecDeque<Vec<u8>>,
    /// When an unknown session from this address last started one.
    reconnected: Option<Time>,
}

/// See the module documentation.
pub struct Sessions {
    cfg: Config,
    me: NodeIdentity,
    trust: Trust,
    aes: bool,
    rng: ChaCha20Rng,
    live: HashMap<u32, Live>,
    pending: HashMap<u32, (SocketAddr, Pending)>,
    peers: HashMap<SocketAddr, Peer>,
    stats: Stats,
    /// When the reconnects of the last second started.
    reconnects: VecDeque<Time>,
    /// Bytes held as early datagrams.
    early_bytes: usize,
    /// This node's sessions with itself, for endpoint channels between its
    /// own programs, oldest first: (index, endpoint root, made).
    local: Vec<(u32, [u8; 32], Time)>,
}

/// Indexes with this bit set name a node's sessions with itself; those
/// with other nodes never have it.
const LOCAL_INDEX: u32 = 1 << 31;

impl Sessions {
    /// A table for `me`, trusting `trust`; `aes` says whether this CPU has
    /// AES instructions; indexes and ephemeral keys come from `seed`.
    pub fn new(cfg: Config, me: NodeIdentity, trust: Trust, aes: bool, seed: [u8; 32]) -> Self {
        Sessions {
            cfg,
            me,
            trust,
            aes,
            rng: ChaCha20Rng::from_seed(seed),
            live: HashMap::new(),
            pending: HashMap::new(),
            peers: HashMap::new(),
            stats: Stats::default(),
            reconnects: VecDeque::new(),
            early_bytes: 0,
            local: Vec::new(),
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn trust(&self) -> &Trust {
        &self.trust
    }

    /// Seals `plaintext` for the node at `to`, starting a session first if
    /// there is none.
    pub fn send(&mut self, now: Time, to: SocketAddr, plaintext: &[u8], out: &mut Vec<Output>) {
        let peer = self.peers.entry(to).or_default();
        let initiating = peer.initiating.is_some();
        let usable = peer.sessions.last().copied().and_then(|i| {
            let l = &self.live[&i];
            let young = now.saturating_since(l.made) < self.cfg.reject_after;
            (young && l.counter < COUNTER_LIMIT).then_some(i)
        });
        let Some(index) = usable else {
            if peer.queue.len() >= self.cfg.max_queued {
                peer.queue.pop_front();
                self.stats.dropped_queued += 1;
            }
            peer.queue.push_back(plaintext.to_vec());
            if !initiating {
                self.initiate(now, to, out);
            }
            return;
        };
        let live = self.live.get_mut(&index).expect("current is live");
        let age = now.saturating_since(live.made);
        let due = if live.est.initiator {
            self.cfg.rekey_after
        } else {
            self.cfg.rekey_after + Duration::from_secs(30)
        };
        let stale = now.saturating_since(live.last_recv) >= self.cfg.stale_after;
        let datagram = seal_live(live, plaintext);
        live.last_send = now;
        self.stats.sealed += 1;
        out.push(Output::Send { to, datagram });
        if (age >= due || stale) && !initiating {
            self.initiate(now, to, out);
        }
    }

    /// Handles a datagram from `from`: a handshake message (answered
    /// through `out`), or a node datagram, opened in place.  `Ok(None)`:
    /// nothing to deliver (a handshake, a keepalive).
    pub fn handle<'a>(
        &mut self,
        now: Time,
        wall: u64,
        from: SocketAddr,
        datagram: &'a mut [u8],
        out: &mut Vec<Output>,
    ) -> Result<Option<Opened<'a>>, SessionError> {
        match class(datagram)? {
            Class::Initiation => {
                self.answer(now, from, datagram, out);
                Ok(None)
            }
            Class::Response | Class::Finish => {
                self.finish(now, wall, from, datagram, out);
                Ok(None)
            }
            Class::Node => {
                let opened = self.open_node(now, Some(from), datagram);
                if let Err(SessionError::UnknownIndex) = opened {
                    self.reconnect(now, from, out);
                }
                opened
            }
            _ => Err(SessionError::Malformed("not a node datagram")),
        }
    }

    /// Resends handshake messages, gives up on silent handshakes, and
    /// erases sessions past `reject_after`.
    pub fn poll(&mut self, now: Time, out: &mut Vec<Output>) {
        let mut given_up = Vec::new();
        for (&index, (addr, p)) in &mut self.pending {
            match p {
                Pending::Initiating {
                    message,
                    started,
                    last_sent,
                    ..
                } => {
                    if now.saturating_since(*started) >= self.cfg.give_up {
                        given_up.push((index, *addr, true));
                    } else if now.saturating_since(*last_sent) >= self.cfg.retry {
                        *last_sent = now;
                        out.push(Output::Send {
                            to: *addr,
                            datagram: message.clone(),
                        });
                    }
                }
                Pending::Responding { started, .. } => {
                    if now.saturating_since(*started) >= self.cfg.give_up {
                        given_up.push((index, *addr, false));
                    }
                }
            }
        }
        for (index, addr, initiating) in given_up {
            if let Some((_, Pending::Responding { early, .. })) = self.pending.remove(&index) {
                self.early_bytes -= early.iter().map(Vec::len).sum::<usize>();
            }
            if initiating && let Some(peer) = self.peers.get_mut(&addr) {
                peer.initiating = None;
                self.stats.dropped_queued += peer.queue.len() as u64;
                peer.queue.clear();
                self.stats.handshake_failures += 1;
                out.push(Output::Refused {
                    addr,
                    why: "no answer to the handshake".into(),
                });
            }
        }
        let mut expired = Vec::new();
        for (&index, live) in &mut self.live {
            if now.saturating_since(live.made) >= self.cfg.reject_after {
                expired.push(index);
            } else if let Some(finish) = &live.finish
                && now.saturating_since(live.last_retry) >= self.cfg.retry
            {
                live.last_retry = now;
                out.push(Output::Send {
                    to: live.addr,
                    datagram: finish.clone(),
                });
            }
        }
        for peer in self.peers.values() {
            let Some(live) = peer.sessions.last().and_then(|i| self.live.get_mut(i)) else {
                continue;
            };
            if live.last_recv > live.last_send
                && now.saturating_since(live.last_recv) >= self.cfg.keepalive
            {
                live.last_send = now;
                let datagram = seal_live(live, &[]);
                self.stats.sealed += 1;
                out.push(Output::Send {
                    to: live.addr,
                    datagram,
                });
            }
        }
        for index in expired {
            self.erase(index);
        }
        // Addresses this node has nothing with any more are forgotten.
        let give_up = self.cfg.give_up;
        self.peers.retain(|_, p| {
            !p.sessions.is_empty()
                || p.initiating.is_some()
                || !p.queue.is_empty()
                || p.reconnected
                    .is_some_and(|t| now.saturating_since(t) < give_up)
        });
    }

    /// When [`Sessions::poll`] next has work, if ever.
    pub fn next_timer(&self) -> Option<Time> {
        let pending = self.pending.values().map(|(_, p)| match p {
            Pending::Initiating {
                started, last_sent, ..
            } => (*last_sent + self.cfg.retry).min(*started + self.cfg.give_up),
            Pending::Responding { started, .. } => *started + self.cfg.give_up,
        });
        let live = self.live.values().map(|l| {
            let mut at = l.made + self.cfg.reject_after;
            if l.finish.is_some() {
                at = at.min(l.last_retry + self.cfg.retry);
            }
            if l.last_recv > l.last_send {
                at = at.min(l.last_recv + self.cfg.keepalive);
            }
            at
        });
        pending.chain(live).min()
    }

    /// Takes a newer revocation list: sessions and handshakes with the
    /// nodes it names end at once.  Whether it was newer.
    pub fn revoke(&mut self, list: RevocationList) -> bool {
        if !self.trust.update(list) {
            return false;
        }
        let revoked: Vec<u32> = self
            .live
            .iter()
            .filter(|(_, l)| self.trust.revoked.revokes(l.est.peer.serial))
            .map(|(&i, _)| i)
            .collect();
        for index in revoked {
            self.erase(index);
        }
        // Handshakes in flight are checked again when they finish.
        true
    }

    /// The peer and endpoint root of the session whose local index is
    /// `index`, if it is alive.
    pub fn session(&self, index: u32) -> Option<(&NodeCert, SocketAddr, &[u8; 32])> {
        self.live
            .get(&index)
            .map(|l| (&l.est.peer, l.addr, &l.est.endpoint_root))
    }

    /// The index the node at `addr` seals with now, and the peer's index
    /// for it (the one this side names).
    pub fn current(&self, addr: SocketAddr) -> Option<(u32, u32)> {
        let i = *self.peers.get(&addr)?.sessions.last()?;
        Some((i, self.live[&i].est.remote_index))
    }

    /// The root for endpoint channels to server endpoints on the node at
    /// `to` (`None`: on this node), through the newest session with it:
    /// `None` if there is none.
    pub fn root_to(&mut self, now: Time, to: Option<SocketAddr>) -> Option<Root> {
        let Some(addr) = to else {
            self.local
                .retain(|l| now.saturating_since(l.2) < self.cfg.reject_after);
            if self
                .local
                .last()
                .is_none_or(|l| now.saturating_since(l.2) >= self.cfg.rekey_after)
            {
                let index = LOCAL_INDEX | (self.rng.random::<u32>() & !LOCAL_INDEX);
                let secret: [u8; 32] = self.rng.random();
                self.local.push((index, secret, now));
            }
            let &(index, secret, made) = self.local.last().expect("just made");
            return Some(Root {
                index,
                secret,
                algorithm: Algorithm::choose(self.aes, self.aes),
                expires: made + self.cfg.reject_after,
            });
        };
        let i = *self.peers.get(&addr)?.sessions.last()?;
        let live = &self.live[&i];
        let expires = live.made + self.cfg.reject_after;
        (now < expires).then(|| Root {
            index: live.est.remote_index,
            secret: live.est.endpoint_root,
            algorithm: live.est.send.algorithm(),
            expires,
        })
    }

    /// The root of the session this node knows as `index`, and the peer
    /// at its other end (`None`: this node itself), while it opens.
    pub fn root_at(&self, now: Time, index: u32) -> Option<(Option<&NodeCert>, Root)> {
        if index & LOCAL_INDEX != 0 {
            let &(index, secret, made) = self.local.iter().find(|l| l.0 == index)?;
            let expires = made + self.cfg.reject_after;
            return (now < expires).then(|| {
                let algorithm = Algorithm::choose(self.aes, self.aes);
                let root = Root {
                    index,
                    secret,
                    algorithm,
                    expires,
                };
                (None, root)
            });
        }
        let live = self.live.get(&index)?;
        let expires = live.made + self.cfg.reject_after;
        (now < expires).then(|| {
            let root = Root {
                index,
                secret: live.est.endpoint_root,
                algorithm: live.est.recv.algorithm(),
                expires,
            };
            (Some(&live.est.peer), root)
        })
    }

    fn fresh_index(&mut self) -> u32 {
        loop {
            let i: u32 = self.rng.random::<u32>() & !LOCAL_INDEX;
            if i != 0 && !self.live.contains_key(&i) && !self.pending.contains_key(&i) {
                return i;
            }
        }
    }

    /// A node datagram from `from` named no session here: this node lost
    /// it (it restarted) or let it expire, while the peer still seals in
    /// it.  Starting a new session at once, rather than waiting for the
    /// peer to find its session silent, brings the peer back within a
    /// round trip.  At most once per `retry` per address, so forged
    /// datagrams buy an attacker no more than that.
    fn reconnect(&mut self, now: Time, from: SocketAddr, out: &mut Vec<Output>) {
        while self
            .reconnects
            .front()
            .is_some_and(|&t| now.saturating_since(t) >= Duration::from_secs(1))
        {
            self.reconnects.pop_front();
        }
        if self.reconnects.len() >= self.cfg.max_reconnects {
            return;
        }
        let peer = self.peers.entry(from).or_default();
        if peer.initiating.is_some()
            || peer
                .reconnected
                .is_some_and(|t| now.saturating_since(t) < self.cfg.retry)
        {
            return;
        }
        peer.reconnected = Some(now);
        self.reconnects.push_back(now);
        self.initiate(now, from, out);
    }

    fn initiate(&mut self, now: Time, to: SocketAddr, out: &mut Vec<Output>) {
        let initiating = self
            .pending
            .values()
            .filter(|(_, p)| matches!(p, Pending::Initiating { .. }))
            .count();
        if initiating >= self.cfg.max_initiating {
            self.stats.handshake_failures += 1;
            out.push(Output::Refused {
                addr: to,
                why: "too many handshakes under way".into(),
            });
            return;
        }
        let index = self.fresh_index();
        let seed: [u8; 32] = self.rng.random();
        let mut message = Vec::new();
        match Initiator::start(&self.me, &self.trust, index, seed, &mut message) {
            Ok(init) => {
                out.push(Output::Send {
                    to,
                    datagram: message.clone(),
                });
                self.pending.insert(
                    index,
                    (
                        to,
                        Pending::Initiating {
                            init,
                            message,
                            started: now,
                            last_sent: now,
                        },
                    ),
                );
                self.peers.entry(to).or_default().initiating = Some(index);
            }
            Err(e) => {
                self.stats.handshake_failures += 1;
                out.push(Output::Refused {
                    addr: to,
                    why: e.to_string(),
                });
            }
        }
    }

    /// Answers an initiation from `from`, making room for it: each address
    /// has a few slots of its own, its newest initiation taking the place
    /// of its oldest, so one address cannot hold more; and when every slot
    /// is taken, the new one takes the place of the oldest handshake from
    /// an address this node has no session with.  A genuine handshake
    /// needs its slot for one round trip: to keep one out, a flood from
    /// many addresses must send a whole table's worth in every round trip,
    /// and the peers this node has sessions with (a peer that restarted,
    /// or rekeys) are never pushed out by it.
    fn answer(&mut self, now: Time, from: SocketAddr, datagram: &[u8], out: &mut Vec<Output>) {
        // Handshakes answered: index, address and start; and those of
        // `from`.
        let all: Vec<(u32, SocketAddr, Time)> = self
            .pending
            .iter()
            .filter_map(|(&i, (a, p))| match p {
                Pending::Responding { started, .. } => Some((i, *a, *started)),
                _ => None,
            })
            .collect();
        let own: Vec<_> = all.iter().filter(|r| r.1 == from).collect();
        let known = |peers: &HashMap<SocketAddr, Peer>, a: &SocketAddr| {
            peers.get(a).is_some_and(|p| !p.sessions.is_empty())
        };
        // `Some(None)`: room; `Some(Some(i))`: in handshake i's place.
        let room = if own.len() >= self.cfg.max_responding_per_addr {
            own.iter().min_by_key(|r| r.2).map(|r| Some(r.0))
        } else if all.len() < self.cfg.max_responding {
            Some(None)
        } else {
            all.iter()
                .filter(|r| !known(&self.peers, &r.1))
                .min_by_key(|r| r.2)
                .map(|r| Some(r.0))
        };
        let Some(replaced) = room else {
            self.stats.handshake_failures += 1;
            return;
        };
        if let Some(index) = replaced {
            if let Some((_, Pending::Responding { early, .. })) = self.pending.remove(&index) {
                self.early_bytes -= early.iter().map(Vec::len).sum::<usize>();
            }
            self.stats.handshake_failures += 1;
        }
        let index = self.fresh_index();
        let seed: [u8; 32] = self.rng.random();
        let mut message = Vec::new();
        match Responder::answer(
            datagram,
            &self.me,
            &self.trust,
            index,
            seed,
            self.aes,
            &mut message,
        ) {
            Ok(resp) => {
                out.push(Output::Send {
                    to: from,
                    datagram: message,
                });
                self.pending.insert(
                    index,
                    (
                        from,
                        Pending::Responding {
                            resp,
                            started: now,
                            early: Vec::new(),
                        },
                    ),
                );
            }
            Err(e) => self.refused(from, e, out),
        }
    }

    /// Handles message 2 (for a handshake this side started) or message 3
    /// (for one it answered).
    fn finish(
        &mut self,
        now: Time,
        wall: u64,
        from: SocketAddr,
        datagram: &[u8],
        out: &mut Vec<Output>,
    ) {
        let Ok(index) = handshake_receiver(datagram) else {
            self.stats.handshake_failures += 1;
            return;
        };
        let Some((addr, pending)) = self.pending.remove(&index) else {
            // A resent message 3 of a session already made lands here.
            self.stats.unknown_index += 1;
            return;
        };
        let response = class(datagram) == Ok(Class::Response);
        let ours = addr == from
            && matches!(
                (&pending, response),
                (Pending::Initiating { .. }, true) | (Pending::Responding { .. }, false)
            );
        if !ours {
            // Not ours to finish from that address, or in that order.
            self.pending.insert(index, (addr, pending));
            self.stats.unknown_index += 1;
            return;
        }
        match pending {
            Pending::Initiating { init, .. } => {
                self.peers.entry(addr).or_default().initiating = None;
                let mut finish = Vec::new();
                match init.finish(datagram, &self.me, &self.trust, wall, self.aes, &mut finish) {
                    Ok(est) => {
                        out.push(Output::Send {
                            to: addr,
                            datagram: finish.clone(),
                        });
                        self.install(now, addr, est, Some(finish), out);
                    }
                    Err(e) => self.refused(addr, e, out),
                }
            }
            Pending::Responding { resp, early, .. } => {
                self.early_bytes -= early.iter().map(Vec::len).sum::<usize>();
                match resp.finish(datagram, &self.trust, wall) {
                    Ok(est) => {
                        self.install(now, addr, est, None, out);
                        // Confirms the session to the initiator.
                        let live = self.live.get_mut(&index).expect("just installed");
                        let datagram = seal_live(live, &[]);
                        self.stats.sealed += 1;
                        out.push(Output::Send { to: addr, datagram });
                        for mut d in early {
                            if let Ok(Some(o)) = self.open_node(now, None, &mut d) {
                                out.push(Output::Deliver {
                                    index: o.index,
                                    serial: o.serial,
                                    plaintext: o.plaintext.to_vec(),
                                });
                            }
                        }
                    }
                    Err(e) => self.refused(addr, e, out),
                }
            }
        }
    }

    fn install(
        &mut self,
        now: Time,
        addr: SocketAddr,
        est: Established,
        finish: Option<Vec<u8>>,
        out: &mut Vec<Output>,
    ) {
        let index = est.local_index;
        out.push(Output::Up {
            addr,
            name: est.peer.name.clone(),
            serial: est.peer.serial,
        });
        self.stats.handshakes += 1;
        self.live.insert(
            index,
            Live {
                est,
                addr,
                made: now,
                counter: 0,
                window: ReplayWindow::new(),
                finish,
                last_retry: now,
                last_recv: now,
                last_send: now,
            },
        );
        let peer = self.peers.entry(addr).or_default();
        peer.sessions.push(index);
        let oldest = (peer.sessions.len() > MAX_SESSIONS).then(|| peer.sessions[0]);
        let queued: Vec<Vec<u8>> = peer.queue.drain(..).collect();
        if let Some(old) = oldest {
            self.erase(old);
        }
        let live = self.live.get_mut(&index).expect("just installed");
        for plaintext in queued {
            let datagram = seal_live(live, &plaintext);
            self.stats.sealed += 1;
            out.push(Output::Send { to: addr, datagram });
        }
    }

    /// Opens a node datagram from `from` (`None`: one held early, its
    /// address checked then).
    fn open_node<'a>(
        &mut self,
        now: Time,
        from: Option<SocketAddr>,
        datagram: &'a mut [u8],
    ) -> Result<Option<Opened<'a>>, SessionError> {
        let header = Header::peek(datagram)?;
        let Header::Node { receiver, counter } = header else {
            return Err(SessionError::Malformed("not a node datagram"));
        };
        let Some(live) = self.live.get_mut(&receiver) else {
            if let Some((addr, Pending::Responding { early, .. })) = self.pending.get_mut(&receiver)
                && Some(*addr) == from
                && early.len() < MAX_EARLY
                && self.early_bytes + datagram.len() <= MAX_EARLY_BYTES
            {
                // Sent right after message 3, which has not come yet
                // (unauthenticated until then: bounded, and only from the
                // handshake's own address).
                self.early_bytes += datagram.len();
                early.push(datagram.to_vec());
                return Ok(None);
            }
            self.stats.unknown_index += 1;
            return Err(SessionError::UnknownIndex);
        };
        if now.saturating_since(live.made) >= self.cfg.reject_after {
            self.stats.unknown_index += 1;
            return Err(SessionError::UnknownIndex);
        }
        if !live.window.check(counter) {
            self.stats.replays += 1;
            return Err(SessionError::Replayed);
        }
        let plaintext = match open(&live.est.recv, datagram) {
            Ok((_, plaintext)) => plaintext,
            Err(e) => {
                self.stats.bad_tags += 1;
                return Err(e);
            }
        };
        live.window.accept(counter);
        live.finish = None;
        live.last_recv = now;
        self.stats.opened += 1;
        if plaintext.is_empty() {
            return Ok(None);
        }
        Ok(Some(Opened {
            index: receiver,
            serial: live.est.peer.serial,
            plaintext,
        }))
    }

    fn refused(&mut self, addr: SocketAddr, e: SessionError, out: &mut Vec<Output>) {
        self.stats.handshake_failures += 1;
        out.push(Output::Refused {
            addr,
            why: e.to_string(),
        });
    }

    /// Forgets session `index`: its keys are dropped with it.
    fn erase(&mut self, index: u32) {
        let Some(live) = self.live.remove(&index) else {
            return;
        };
        if let Some(peer) = self.peers.get_mut(&live.addr) {
            peer.sessions.retain(|&i| i != index);
        }
    }
}

fn seal_live(live: &mut Live, plaintext: &[u8]) -> Vec<u8> {
    let header = Header::Node {
        receiver: live.est.remote_index,
        counter: live.counter,
    };
    live.counter += 1;
    let mut datagram = Vec::with_capacity(plaintext.len() + 32);
    seal(&live.est.send, &header, &[plaintext], &mut datagram);
    datagram
}
