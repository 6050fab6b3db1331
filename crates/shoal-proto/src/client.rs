//! The client end of RPC: one endpoint, one transaction at a time (a
//! program that wants several in flight opens several endpoints, as an
//! Amoeba thread does one `trans` at a time).
//!
//! A transaction runs through four states:
//!
//! ```text
//!   Locating ──Here──▶ Sending ──Working──▶ Waiting
//!      ▲                 │  ╲                    │
//!      │     refused or  │   ╲── Reply fragment ─┴──▶ Receiving ──▶ done
//!      │     replaced    ▼
//!      └─ Drained ── Verifying ── anything else ──▶ ServerRestarted
//! ```
//!
//! **At-most-once.**  Every request names the server instance that locate
//! returned.  The client only moves a request to another server when it is
//! sure the first never executed it:
//!
//! - the instance itself refused it while draining ([`NotHere`] naming
//!   itself), or
//! - the instance's address refused the request (or another instance
//!   answered there) before the first retransmission, nothing had been
//!   heard from it, *and* its node confirms the instance left by draining
//!   ([`Fate::Drained`]).  A drained instance refused everything new for
//!   longer than one retransmission interval before it closed, so no copy
//!   of this request, however duplicated, can have run there.
//!
//! In every other failure the request may have run, and the client reports
//! that ([`TransError::ServerRestarted`], [`TransError::ServerUnreachable`])
//! instead of sending it again elsewhere.  Retransmissions to the *same*
//! instance are always safe: the server filters duplicates.
//!
//! **Locate.**  Answers are cached per put-port.  A cached endpoint that turns
//! out dead or replaced is dropped, and the next one (several servers may
//! serve one port) or a fresh locate takes its place, without the caller
//! noticing.
//!
//! **Probing.**  While it waits for the reply, the client sends the
//! request's last fragment again whenever its retransmission timer runs
//! out, the interval doubling from `rto_initial` to `rto_max`.  A server
//! at work answers [`Working`], which proves it alive without shortening
//! the interval: a call that runs for seconds (a long poll) costs a few
//! datagrams a second.
//!
//! [`Working`]: shoal_wire::Working
//! [`NotHere`]: shoal_wire::NotHere
//! [`Fate::Drained`]: shoal_wire::Fate::Drained

use std::collections::VecDeque;

// The maps hold only ports this client called: Fx hashing, no need for
// SipHash's resistance to chosen keys.
use rustc_hash::FxHashMap as HashMap;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use shoal_cap::PutPort;
use shoal_wire::{
    Ack, AckDir, ClientId, Endpoint, Fate, Instance, Locate, NodeId, Nonce, Packet, ReplyStatus,
    Request, Seq, TxnId, WireError, decode_plain, encode_plain,
};

use crate::body::{Added, Incoming, Outgoing, is_whole};
use crate::error::TransError;
use crate::stats::Stats;
use crate::time::Time;
use crate::transmit::{Dest, Transmit, Via};

/// Tuning of a client endpoint.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Body bytes per fragment.
    pub frag_bytes: usize,
    /// Fragments sent ahead of acknowledgement.
    pub window: u32,
    /// First retransmission timeout; doubles while nothing is heard.
    pub rto_initial: Duration,
    /// Longest retransmission timeout.
    pub rto_max: Duration,
    /// First locate retry interval; doubles while nobody answers.
    pub locate_initial: Duration,
    /// Largest reply this client accepts.
    pub max_reply_bytes: u64,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            frag_bytes: 60_000,
            window: 32,
            rto_initial: Duration::from_millis(20),
            rto_max: Duration::from_millis(500),
            locate_initial: Duration::from_millis(20),
            max_reply_bytes: 1 << 30,
        }
    }
}

/// What the client endpoint is doing, so the shell knows what to listen to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No transaction.
    Idle,
    /// Waiting for locate answers from the node daemons.
    Locating,
    /// Talking to the server endpoint at this address.
    Talking(SocketAddr),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Locating,
    /// Asking the node of a refused instance whether it drained.
    Verifying,
    Sending,
    Waiting,
    Receiving,
}

#[derive(Debug)]
struct Txn {
    seq: Seq,
    port: PutPort,
    body: Bytes,
    started: Time,
    deadline: Time,
    state: State,
    request: Outgoing,
    reply: Option<Incoming>,
    target: Option<Located>,
    nonce: Nonce,
    /// Transmission rounds to the current target: 1 while only the first
    /// burst went out.
    rounds: u32,
    /// When the current target last said anything.
    heard: Option<Time>,
    timer: Time,
    rto: Duration,
}

/// A server endpoint and the node it is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Located {
    endpoint: Endpoint,
    node: NodeId,
}

/// At most this many ports with an advised endpoint at a time.
const MAX_AIMS: usize = 64;

/// Moves endpoint `instance` to the front of `located` (the one calls go
/// to); false if it is not there.
fn put_first(located: &mut Vec<Located>, instance: Instance) -> bool {
    match located.iter().position(|l| l.endpoint.instance == instance) {
        Some(i) => {
            let l = located.remove(i);
            located.insert(0, l);
            true
        }
        None => false,
    }
}

/// One client endpoint's protocol state.
#[derive(Debug)]
pub struct ClientCore {
    id: ClientId,
    config: ClientConfig,
    next_seq: u64,
    next_nonce: u64,
    cache: HashMap<PutPort, Vec<Located>>,
    /// Endpoints a server named as the better one for a port
    /// ([`ClientCore::aim`]), to be located at their nodes.
    aims: HashMap<PutPort, (NodeId, Instance)>,
    txn: Option<Txn>,
    transmits: VecDeque<Transmit>,
    outcome: Option<Result<Vec<u8>, TransError>>,
    stats: Stats,
}

impl ClientCore {
    /// A client endpoint with identity `id` (fresh for each endpoint).
    pub fn new(id: ClientId, config: ClientConfig) -> Self {
        Self {
            id,
            config,
            next_seq: 1,
            next_nonce: id.0.rotate_left(32),
            cache: HashMap::default(),
            aims: HashMap::default(),
            txn: None,
            transmits: VecDeque::new(),
            outcome: None,
            stats: Stats::default(),
        }
    }

    /// This endpoint's identity.
    pub fn id(&self) -> ClientId {
        self.id
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Where the transaction stands.
    pub fn phase(&self) -> Phase {
        match &self.txn {
            None => Phase::Idle,
            Some(t) => match (t.state, t.target) {
                (State::Locating | State::Verifying, _) | (_, None) => Phase::Locating,
                (_, Some(e)) => Phase::Talking(e.endpoint.addr),
            },
        }
    }

    /// The endpoints cached for `port`.
    pub fn cached(&self, port: &PutPort) -> Vec<Endpoint> {
        self.cache
            .get(port)
            .map(|l| l.iter().map(|l| l.endpoint).collect())
            .unwrap_or_default()
    }

    /// Forgets where `port` is served, so the next call locates it afresh.
    pub fn forget(&mut self, port: &PutPort) {
        self.cache.remove(port);
        self.aims.remove(port);
    }

    /// Makes endpoint `instance` on `node` the one the next calls to
    /// `port` go to, as a server of the port advised (a replicated
    /// service naming the replica that orders writes).  The endpoint is
    /// taken only as its node confirms it: unless it is cached already,
    /// the next call locates the port at that node alone, and uses what
    /// the node has if the instance is gone; if the node does not
    /// answer, the call locates as usual.
    pub fn aim(&mut self, port: PutPort, node: NodeId, instance: Instance) {
        if self
            .cache
            .get_mut(&port)
            .is_some_and(|eps| put_first(eps, instance))
        {
            return;
        }
        if self.aims.len() >= MAX_AIMS && !self.aims.contains_key(&port) {
            self.aims.clear();
        }
        self.aims.insert(port, (node, instance));
        self.cache.remove(&port);
    }

    /// Starts a transaction: send `body` to a server of `port`, give up at
    /// `deadline`.  The previous transaction must be finished.  Returns the
    /// transaction's id.
    pub fn start(&mut self, now: Time, port: PutPort, body: Bytes, deadline: Time) -> TxnId {
        assert!(self.txn.is_none(), "one transaction at a time per client");
        self.outcome = None;
        let seq = Seq(self.next_seq);
        self.next_seq += 1;
        let request = Outgoing::new(body.clone(), self.config.frag_bytes, self.config.window);
        self.txn = Some(Txn {
            seq,
            port,
            body,
            started: now,
            deadline,
            state: State::Locating,
            request,
            reply: None,
            target: None,
            nonce: Nonce(0),
            rounds: 0,
            heard: None,
            timer: now,
            rto: self.config.rto_initial,
        });
        self.choose_target(now);
        TxnId {
            client: self.id,
            seq,
        }
    }

    /// Abandons the transaction in progress.
    pub fn cancel(&mut self) {
        if self.txn.is_some() {
            self.finish(Err(TransError::Cancelled));
        }
    }

    /// The next datagram to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// When [`ClientCore::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.txn.as_ref().map(|t| t.timer.min(t.deadline))
    }

    /// The result of the finished transaction, once.
    pub fn poll_outcome(&mut self) -> Option<Result<Vec<u8>, TransError>> {
        self.outcome.take()
    }

    /// A plaintext arrived from `from` (opened by the shell, which
    /// checked it came from the server it names, or from this node).
    pub fn handle_datagram(&mut self, now: Time, from: SocketAddr, plain: &[u8]) {
        self.handle_packet(now, from, decode_plain(plain));
    }

    /// A plaintext that opened with the channel key of server endpoint
    /// `sender` (so it comes from that endpoint, whatever its address).  A
    /// reply, acknowledgement or progress report counts only as `sender`'s
    /// own: a server this client has a channel with cannot speak for
    /// another one (by sending from that one's address, say).
    pub fn handle_sealed(&mut self, now: Time, from: SocketAddr, sender: Instance, plain: &[u8]) {
        let packet = decode_plain(plain);
        let speaks_for = match &packet {
            Ok(Packet::Reply(r)) => Some(r.instance),
            Ok(Packet::Ack(a)) => Some(a.instance),
            Ok(Packet::Working(w)) => Some(w.instance),
            _ => None,
        };
        if speaks_for.is_some_and(|i| i != sender) {
            self.stats.datagrams_in += 1;
            self.stats.dropped_malformed += 1;
            return;
        }
        self.handle_packet(now, from, packet);
    }

    /// [`ClientCore::handle_datagram`] for a plaintext the shell decoded.
    pub fn handle_packet(
        &mut self,
        now: Time,
        from: SocketAddr,
        packet: Result<Packet<'_>, WireError>,
    ) {
        self.stats.datagrams_in += 1;
        match packet {
            Ok(p) => self.on_packet(now, from, p),
            Err(e) => self.stats.count_wire_error(e),
        }
    }

    /// A datagram the shell could not open (forged, replayed, or for a
    /// channel it has no key for): counted, nothing else.
    pub fn handle_unopened(&mut self, replayed: bool) {
        self.stats.count_unopened(replayed);
    }

    /// A packet arrived from `from`.
    fn on_packet(&mut self, now: Time, from: SocketAddr, packet: Packet<'_>) {
        let Some(txn) = self.txn.as_mut() else {
            self.stats.dropped_stale += 1;
            return;
        };
        let this = TxnId {
            client: self.id,
            seq: txn.seq,
        };
        let from_target = txn.target.is_some_and(|t| t.endpoint.addr == from);
        let instance = txn.target.map(|t| t.endpoint.instance);
        match packet {
            Packet::Here(h)
                if txn.state == State::Locating
                    && h.nonce == txn.nonce
                    && h.port == txn.port
                    && !h.endpoints.is_empty() =>
            {
                let mut located: Vec<Located> = h
                    .endpoints
                    .iter()
                    .map(|&endpoint| Located {
                        endpoint,
                        node: h.node,
                    })
                    .collect();
                if let Some((_, instance)) = self.aims.remove(&h.port) {
                    put_first(&mut located, instance);
                }
                self.cache.insert(h.port, located);
                self.choose_target(now);
            }
            Packet::Here(h)
                if txn.state == State::Locating
                    && h.nonce == txn.nonce
                    && h.port == txn.port
                    && self.aims.get(&h.port).is_some_and(|a| a.0 == h.node) =>
            {
                // The advised node serves the port no more: ask them all.
                self.aims.remove(&h.port);
                self.begin_locate(now, State::Locating);
            }
            Packet::Here(h)
                if txn.state == State::Verifying
                    && h.nonce == txn.nonce
                    && h.port == txn.port
                    && txn.target.is_some_and(|t| t.node == h.node) =>
            {
                if h.fate == Fate::Drained {
                    self.choose_target(now);
                } else {
                    let port = txn.port;
                    self.finish(Err(TransError::ServerRestarted { port }));
                }
            }
            Packet::Working(w) if from_target && w.txn == this && Some(w.instance) == instance => {
                txn.heard = Some(now);
                if txn.state == State::Sending {
                    txn.state = State::Waiting;
                }
                // The server is alive and at work: the next probe waits the
                // interval as it has grown (up to `rto_max`), so a long call
                // costs a few datagrams a second, not one every
                // `rto_initial`.
                txn.timer = now + txn.rto;
            }
            Packet::Ack(a)
                if from_target
                    && a.txn == this
                    && a.dir == AckDir::Request
                    && Some(a.instance) == instance =>
            {
                txn.heard = Some(now);
                if txn.state == State::Sending {
                    let (send, progress) = txn.request.on_ack(a.base, a.mask);
                    if progress {
                        txn.rto = self.config.rto_initial;
                    }
                    txn.timer = now + txn.rto;
                    for idx in send {
                        self.send_fragment(idx);
                    }
                }
            }
            Packet::Reply(r) if from_target && r.txn == this && Some(r.instance) == instance => {
                txn.heard = Some(now);
                match r.status {
                    ReplyStatus::Ok => {}
                    ReplyStatus::Busy => {
                        let port = txn.port;
                        return self.finish(Err(TransError::Busy { port }));
                    }
                    ReplyStatus::TooLarge => {
                        let (port, bytes) = (txn.port, txn.body.len() as u64);
                        return self.finish(Err(TransError::TooLarge { port, bytes }));
                    }
                }
                if txn.reply.is_none()
                    && is_whole(r.frag, r.total_len, r.payload)
                    && r.total_len <= self.config.max_reply_bytes
                {
                    // The common case, a reply in one datagram: no
                    // reassembly.
                    return self.finish(Ok(r.payload.to_vec()));
                }
                if txn.reply.is_none() {
                    match Incoming::new(r.total_len, r.frag.count, self.config.max_reply_bytes) {
                        Some(inc) => txn.reply = Some(inc),
                        None => {
                            let (port, bytes) = (txn.port, r.total_len);
                            return self.finish(Err(TransError::ReplyTooLarge { port, bytes }));
                        }
                    }
                }
                txn.state = State::Receiving;
                let reply = txn.reply.as_mut().expect("set above");
                let added = reply.add(r.frag, r.total_len, r.payload);
                match added {
                    Added::Invalid => {
                        self.stats.dropped_malformed += 1;
                        return;
                    }
                    Added::Duplicate => self.stats.duplicates += 1,
                    Added::New | Added::Refill => txn.rto = self.config.rto_initial,
                }
                txn.timer = now + txn.rto;
                if reply.is_complete() {
                    if reply.count() > 1 {
                        // Final acknowledgement: the server may free the reply.
                        self.send_reply_ack();
                    }
                    let txn = self.txn.as_mut().expect("in a transaction");
                    let body = txn.reply.take().expect("complete").into_body();
                    return self.finish(Ok(body));
                }
                if reply.wants_ack(added, r.frag.index, self.config.window) {
                    self.send_reply_ack();
                }
            }
            Packet::NotHere(n)
                if from_target
                    && n.txn == this
                    && Some(n.wanted) == instance
                    && !matches!(txn.state, State::Locating | State::Verifying) =>
            {
                if n.actual == n.wanted {
                    // The instance itself refused: it is draining and never
                    // ran this request.
                    self.drop_target();
                    self.choose_target(now);
                } else {
                    self.target_gone(now);
                }
            }
            _ => self.stats.dropped_stale += 1,
        }
    }

    /// The network reported `addr` unreachable (ICMP port unreachable: no
    /// socket is bound there now).
    pub fn handle_unreachable(&mut self, now: Time, addr: SocketAddr) {
        if let Some(txn) = &self.txn
            && !matches!(txn.state, State::Locating | State::Verifying)
            && txn.target.is_some_and(|t| t.endpoint.addr == addr)
        {
            self.target_gone(now);
        }
    }

    /// A timer set by [`ClientCore::poll_timeout`] expired.
    pub fn handle_timeout(&mut self, now: Time) {
        let Some(txn) = self.txn.as_mut() else { return };
        if now >= txn.deadline {
            let port = txn.port;
            // Probes go out at most `rto_max` apart: a server heard within
            // a few of them (one answer lost, say) is still at work.
            let recently_heard = txn
                .heard
                .is_some_and(|h| now.saturating_since(h) < self.config.rto_max * 4);
            let err = match txn.state {
                State::Locating => TransError::NotFound {
                    port,
                    waited: now.saturating_since(txn.started),
                },
                State::Verifying => TransError::ServerRestarted { port },
                _ if recently_heard => TransError::DeadlineExceeded { port },
                _ => {
                    self.cache.remove(&port);
                    TransError::ServerUnreachable { port }
                }
            };
            return self.finish(Err(err));
        }
        if now < txn.timer {
            return;
        }
        self.stats.retransmits += 1;
        match txn.state {
            State::Locating | State::Verifying => {
                txn.rto = (txn.rto * 2).min(self.config.rto_max);
                txn.timer = now + txn.rto;
                // An advised node that does not answer is asked no more.
                if txn.state == State::Locating {
                    let port = txn.port;
                    self.aims.remove(&port);
                }
                self.send_locate();
            }
            State::Sending | State::Waiting => {
                txn.rounds += 1;
                txn.rto = (txn.rto * 2).min(self.config.rto_max);
                txn.timer = now + txn.rto;
                let idx = if txn.state == State::Sending {
                    txn.request.probe()
                } else {
                    txn.request.count() - 1
                };
                self.send_fragment(idx);
            }
            State::Receiving => {
                txn.rto = (txn.rto * 2).min(self.config.rto_max);
                txn.timer = now + txn.rto;
                self.send_reply_ack();
            }
        }
    }

    /// Removes the current target from the cache.
    fn drop_target(&mut self) {
        let txn = self.txn.as_mut().expect("in a transaction");
        let target = txn.target.expect("talking to a target");
        if let Some(eps) = self.cache.get_mut(&txn.port) {
            eps.retain(|e| *e != target);
            if eps.is_empty() {
                self.cache.remove(&txn.port);
            }
        }
    }

    /// The current target's address refused the request, or another
    /// instance answers there.  If the refusal came before any
    /// retransmission and nothing was heard from the target, ask its node
    /// whether it drained (then the request provably never ran there);
    /// otherwise it may have run, and the caller must be told.
    fn target_gone(&mut self, now: Time) {
        self.drop_target();
        let txn = self.txn.as_mut().expect("in a transaction");
        if txn.rounds <= 1 && txn.heard.is_none() {
            self.begin_locate(now, State::Verifying);
        } else {
            let port = txn.port;
            self.finish(Err(TransError::ServerRestarted { port }));
        }
    }

    /// Picks a cached endpoint and sends the first burst, or locates.
    fn choose_target(&mut self, now: Time) {
        let txn = self.txn.as_mut().expect("in a transaction");
        txn.rounds = 0;
        txn.heard = None;
        txn.rto = self.config.rto_initial;
        txn.timer = now + txn.rto;
        match self.cache.get(&txn.port).and_then(|eps| eps.first()) {
            Some(&located) => {
                txn.target = Some(located);
                txn.state = State::Sending;
                txn.rounds = 1;
                if !txn.request.is_fresh() {
                    txn.request =
                        Outgoing::new(txn.body.clone(), self.config.frag_bytes, self.config.window);
                }
                for idx in txn.request.start() {
                    self.send_fragment(idx);
                }
            }
            None => {
                txn.target = None;
                self.begin_locate(now, State::Locating);
            }
        }
    }

    /// Starts a round of locate questions (`Locating` or `Verifying`) with
    /// a fresh nonce, so answers to earlier rounds are told apart.
    fn begin_locate(&mut self, now: Time, state: State) {
        let txn = self.txn.as_mut().expect("in a transaction");
        txn.state = state;
        txn.rto = self.config.locate_initial;
        txn.timer = now + txn.rto;
        txn.nonce = Nonce(self.next_nonce);
        self.next_nonce = self.next_nonce.wrapping_add(1);
        self.send_locate();
    }

    /// Sends the locate of the current state: a broadcast while locating,
    /// a question to the target's node while verifying.
    fn send_locate(&mut self) {
        let txn = self.txn.as_ref().expect("in a transaction");
        let (dest, instance, node) = match (txn.state, txn.target) {
            (State::Verifying, Some(t)) => (Dest::Node(t.node), t.endpoint.instance, t.node),
            _ => match self.aims.get(&txn.port) {
                Some(&(node, instance)) => (Dest::Node(node), instance, node),
                None => (Dest::Nodes, Instance(0), NodeId(0)),
            },
        };
        let packet = Packet::Locate(Locate {
            nonce: txn.nonce,
            port: txn.port,
            instance,
            node,
        });
        self.stats.locates += 1;
        self.push(dest, Via::Node, &packet);
    }

    fn send_fragment(&mut self, idx: u32) {
        let txn = self.txn.as_ref().expect("in a transaction");
        let target = txn.target.expect("talking to a target").endpoint;
        let out = &txn.request;
        let txn_id = TxnId {
            client: self.id,
            seq: txn.seq,
        };
        self.stats.datagrams_out += 1;
        self.transmits.push_back(crate::transmit::fragment(
            Dest::Addr(target.addr),
            Via::Server(target.instance),
            out,
            idx,
            |payload| {
                Packet::Request(Request {
                    txn: txn_id,
                    instance: target.instance,
                    port: txn.port,
                    frag: out.frag(idx),
                    total_len: out.total_len(),
                    payload,
                })
            },
        ));
    }

    fn send_reply_ack(&mut self) {
        let txn = self.txn.as_ref().expect("in a transaction");
        let target = txn.target.expect("talking to a target").endpoint;
        let (base, mask) = txn.reply.as_ref().map_or((0, 0), Incoming::ack_state);
        let packet = Packet::Ack(Ack {
            txn: TxnId {
                client: self.id,
                seq: txn.seq,
            },
            instance: target.instance,
            dir: AckDir::Reply,
            base,
            mask,
        });
        self.push(
            Dest::Addr(target.addr),
            Via::Server(target.instance),
            &packet,
        );
    }

    /// Encodes `packet` into a pooled buffer and queues it for `dest`.
    fn push(&mut self, dest: Dest, via: Via, packet: &Packet<'_>) {
        let mut bytes = crate::pool::datagram();
        encode_plain(packet, &mut bytes);
        self.stats.datagrams_out += 1;
        self.transmits.push_back(Transmit::whole(dest, via, bytes));
    }

    fn finish(&mut self, result: Result<Vec<u8>, TransError>) {
        self.txn = None;
        match &result {
            Ok(_) => self.stats.transactions += 1,
            Err(_) => self.stats.failures += 1,
        }
        self.outcome = Some(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Caller, Registry, ServerConfig, ServerCore};
    use shoal_cap::GetPort;

    /// A reply in fragments, with the server's datagrams delivered out of
    /// order and some twice: the body still comes out whole.
    #[test]
    fn reordered_and_repeated_fragments_make_the_same_reply() {
        proptest::proptest!(|(len in 0usize..2000, frag in 1usize..300, order in proptest::collection::vec(0usize..8, 0..64))| {
            let body: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
            proptest::prop_assert_eq!(exchange(&body, frag, &order), body);
        });
    }

    /// A port served on two nodes: a call goes where the first locate
    /// answer points; after `aim`, to the advised endpoint, located at its
    /// node alone; an advised node that no longer serves the port, or does
    /// not answer, sends the client back to locating everywhere.
    #[test]
    fn aim_moves_calls_to_the_advised_endpoint_as_its_node_confirms() {
        let port = GetPort::from_bytes([4; 16]).put_port();
        let endpoint = |i: u64| Endpoint {
            addr: SocketAddr::from(([10, 0, 0, i as u8], 9000)),
            instance: Instance(i),
            uid: 0,
            system: false,
        };
        let mut nodes: Vec<(NodeId, Registry, bool)> = (1..=3u64)
            .map(|n| (NodeId(n), Registry::new(NodeId(n)), true))
            .collect();
        nodes[0].1.register(port, endpoint(1)).unwrap();
        nodes[1].1.register(port, endpoint(2)).unwrap();
        let mut servers: Vec<ServerCore> = (1..=2u64)
            .map(|i| ServerCore::new(port, Instance(i), ServerConfig::default()))
            .collect();
        let mut client = ClientCore::new(ClientId(5), ClientConfig::default());
        let mut now = Time(0);
        let mut call = |client: &mut ClientCore, nodes: &[(NodeId, Registry, bool)]| {
            client.start(now, port, Bytes::new(), now + Duration::from_secs(60));
            let mut asked = Vec::new();
            loop {
                now = now + Duration::from_millis(1);
                while let Some(t) = client.poll_transmit() {
                    let dest = t.dest;
                    let bytes = t.into_plain();
                    match (dest, decode_plain(&bytes)) {
                        (Dest::Nodes | Dest::Node(_), Ok(Packet::Locate(l))) => {
                            asked.push(dest);
                            for (id, reg, answers) in nodes {
                                let wanted = dest == Dest::Nodes || dest == Dest::Node(*id);
                                if let (true, true, Some(here)) =
                                    (wanted, *answers, reg.handle_locate(&l))
                                {
                                    let mut plain = Vec::new();
                                    encode_plain(&Packet::Here(here), &mut plain);
                                    client.handle_datagram(
                                        now,
                                        SocketAddr::from(([10, 9, 9, id.0 as u8], 7700)),
                                        &plain,
                                    );
                                }
                            }
                        }
                        (Dest::Addr(a), _) => {
                            // Endpoint i listens at 10.0.0.i.
                            let who = u64::from(a.ip().to_string().ends_with(".2")) + 1;
                            let s = &mut servers[who as usize - 1];
                            let caller = Caller {
                                node: NodeId(9),
                                uid: 0,
                                client: ClientId(5),
                            };
                            s.handle_datagram(
                                now,
                                "10.0.0.9:9000".parse().unwrap(),
                                caller,
                                1,
                                &bytes,
                            );
                            while let Some(req) = s.poll_request() {
                                s.reply(now, req.caller, req.txn, who.to_le_bytes().to_vec());
                            }
                            let out: Vec<Vec<u8>> = std::iter::from_fn(|| s.poll_transmit())
                                .map(Transmit::into_plain)
                                .collect();
                            for d in out {
                                client.handle_datagram(now, a, &d);
                            }
                        }
                        _ => {}
                    }
                }
                if let Some(r) = client.poll_outcome() {
                    let body = r.unwrap();
                    return (u64::from_le_bytes(body[..8].try_into().unwrap()), asked);
                }
                if client.poll_timeout().is_some_and(|t| t <= now) {
                    client.handle_timeout(now);
                }
            }
        };
        let (first, asked) = call(&mut client, &nodes);
        assert_eq!(
            (first, asked),
            (1, vec![Dest::Nodes]),
            "the first answer (node 1's)"
        );
        client.aim(port, NodeId(2), Instance(2));
        let (second, asked) = call(&mut client, &nodes);
        assert_eq!(
            (second, asked),
            (2, vec![Dest::Node(NodeId(2))]),
            "located at node 2 alone"
        );
        assert_eq!(call(&mut client, &nodes), (2, vec![]), "and cached there");
        // Advised to node 3, which serves nothing of the port.
        client.aim(port, NodeId(3), Instance(3));
        let (third, asked) = call(&mut client, &nodes);
        assert_eq!(
            (third, asked),
            (1, vec![Dest::Node(NodeId(3)), Dest::Nodes])
        );
        // Advised to node 2, which does not answer.
        nodes[1].2 = false;
        client.aim(port, NodeId(2), Instance(2));
        let (fourth, asked) = call(&mut client, &nodes);
        assert_eq!(
            (fourth, asked),
            (1, vec![Dest::Node(NodeId(2)), Dest::Nodes])
        );
        // Node 2 answers again.
        nodes[1].2 = true;
        client.aim(port, NodeId(2), Instance(2));
        assert_eq!(call(&mut client, &nodes), (2, vec![Dest::Node(NodeId(2))]));
        // Advised to the endpoint in use: nothing changes.
        client.aim(port, NodeId(2), Instance(2));
        assert_eq!(call(&mut client, &nodes), (2, vec![]));
        // Node 2's answer cached its endpoints alone: advised to node 1's,
        // the client asks node 1.
        client.aim(port, NodeId(1), Instance(1));
        assert_eq!(call(&mut client, &nodes), (1, vec![Dest::Node(NodeId(1))]));
    }

    /// A reply opened with one server's key but naming another server is
    /// dropped: a server this client has a channel with cannot answer in
    /// the name of the one the call went to.  The real server's reply is
    /// still taken.
    #[test]
    fn a_server_cannot_answer_for_another() {
        let port = GetPort::from_bytes([8; 16]).put_port();
        let server_addr: SocketAddr = "10.0.0.2:9000".parse().unwrap();
        let node_addr: SocketAddr = "10.0.0.2:7700".parse().unwrap();
        let mut registry = Registry::new(NodeId(1));
        let (target, other) = (Instance(77), Instance(78));
        let endpoint = Endpoint {
            addr: server_addr,
            instance: target,
            uid: 1000,
            system: false,
        };
        registry.register(port, endpoint).unwrap();
        let mut client = ClientCore::new(ClientId(5), ClientConfig::default());
        let now = Time(0);
        let txn = client.start(now, port, Bytes::new(), now + Duration::from_secs(60));
        while let Some(t) = client.poll_transmit() {
            if let Ok(Packet::Locate(l)) = decode_plain(&t.into_plain())
                && let Some(here) = registry.handle_locate(&l)
            {
                let mut plain = Vec::new();
                encode_plain(&Packet::Here(here), &mut plain);
                client.handle_datagram(now, node_addr, &plain);
            }
        }
        let mut reply = Vec::new();
        encode_plain(
            &Packet::Reply(shoal_wire::Reply {
                txn,
                instance: target,
                status: ReplyStatus::Ok,
                frag: shoal_wire::Frag { index: 0, count: 1 },
                total_len: 2,
                payload: b"ok",
            }),
            &mut reply,
        );
        client.handle_sealed(now, server_addr, other, &reply);
        assert!(client.poll_outcome().is_none(), "taken from another server");
        assert_eq!(client.stats().dropped_malformed, 1);
        client.handle_sealed(now, server_addr, target, &reply);
        assert_eq!(client.poll_outcome(), Some(Ok(b"ok".to_vec())));
    }

    /// One call carrying `reply` back in fragments of `frag` bytes; `order`
    /// shuffles (and duplicates) the server's datagrams.
    fn exchange(reply: &[u8], frag: usize, order: &[usize]) -> Vec<u8> {
        let port = GetPort::from_bytes([9; 16]).put_port();
        let server_addr: SocketAddr = "10.0.0.2:9000".parse().unwrap();
        let client_addr: SocketAddr = "10.0.0.1:9000".parse().unwrap();
        let node_addr: SocketAddr = "10.0.0.2:7700".parse().unwrap();
        let mut registry = Registry::new(NodeId(1));
        let instance = Instance(77);
        registry
            .register(
                port,
                Endpoint {
                    addr: server_addr,
                    instance,
                    uid: 1000,
                    system: false,
                },
            )
            .unwrap();
        let config = ServerConfig {
            frag_bytes: frag,
            window: 8,
            ..ServerConfig::default()
        };
        let mut server = ServerCore::new(port, instance, config);
        let config = ClientConfig {
            frag_bytes: frag,
            window: 8,
            ..ClientConfig::default()
        };
        let mut client = ClientCore::new(ClientId(5), config);
        let caller = Caller {
            node: NodeId(2),
            uid: 1000,
            client: ClientId(5),
        };
        let mut now = Time(0);
        client.start(
            now,
            port,
            Bytes::from_static(b"ask"),
            now + Duration::from_secs(60),
        );
        let mut turn = 0;
        loop {
            now = now + Duration::from_millis(1);
            while let Some(t) = client.poll_transmit() {
                let dest = t.dest;
                let bytes = t.into_plain();
                match dest {
                    Dest::Nodes | Dest::Node(_) => {
                        if let Ok(Packet::Locate(l)) = decode_plain(&bytes)
                            && let Some(here) = registry.handle_locate(&l)
                        {
                            let mut plain = Vec::new();
                            encode_plain(&Packet::Here(here), &mut plain);
                            client.handle_datagram(now, node_addr, &plain);
                        }
                    }
                    Dest::Addr(_) => server.handle_datagram(now, client_addr, caller, 1, &bytes),
                }
            }
            while let Some(req) = server.poll_request() {
                server.reply(now, req.caller, req.txn, reply.to_vec());
            }
            let mut out: Vec<Vec<u8>> = std::iter::from_fn(|| server.poll_transmit())
                .map(Transmit::into_plain)
                .collect();
            // Reorder: each datagram moves back by up to `order[turn]`
            // places, and one in three turns repeats the first.
            for i in 0..out.len() {
                let back = order.get(turn + i).copied().unwrap_or(0).min(i);
                out[i - back..=i].rotate_right(1);
            }
            if turn % 3 == 1
                && let Some(first) = out.first().cloned()
            {
                out.push(first);
            }
            turn += 1;
            for d in out {
                client.handle_datagram(now, server_addr, &d);
            }
            if let Some(r) = client.poll_outcome() {
                return r.unwrap();
            }
            if client.poll_timeout().is_some_and(|t| t <= now) {
                client.handle_timeout(now);
            }
            if server.poll_timeout() <= now {
                server.handle_timeout(now);
            }
            assert!(turn < 10_000, "the call did not finish");
        }
    }
}
