//! The client end of RPC: one endpoint, one transaction at a time (a
//! program that wants several in flight opens several endpoints, as an
//! Amoeba thread does one `trans` at a time).
//!
//! A transaction runs through five states:
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
    Ack, AckDir, ClientId, Endpoint, Fate, Here, Instance, Locate, NodeId, Nonce, NotHere, Packet,
    Reply, ReplyStatus, Request, Seq, TxnId, WireError, decode_plain, encode_plain,
};

use crate::body::{Added, Incoming, Outgoing, is_whole};
use crate::error::TransError;
use crate::stats::Stats;
use crate::transmit::{Dest, Transmit, Via};
use shoal_time::Time;

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

    /// A packet arrived from `from`: each kind to its handler, which says
    /// whether the packet belonged to the transaction under way.
    fn on_packet(&mut self, now: Time, from: SocketAddr, packet: Packet<'_>) {
        let Some(txn) = self.txn.as_ref() else {
            self.stats.dropped_stale += 1;
            return;
        };
        let this = TxnId {
            client: self.id,
            seq: txn.seq,
        };
        // Only the target may answer for the transaction, and only the
        // instance of it the request went to.
        let target = txn
            .target
            .filter(|t| t.endpoint.addr == from)
            .map(|t| t.endpoint.instance);
        let ours = |txn_id: TxnId, instance: Instance| txn_id == this && target == Some(instance);
        let taken = match packet {
            Packet::Here(h) => self.on_here(now, h),
            Packet::Working(w) => ours(w.txn, w.instance) && self.on_working(now),
            Packet::Ack(a) => {
                ours(a.txn, a.instance) && a.dir == AckDir::Request && self.on_ack(now, a)
            }
            Packet::Reply(r) => ours(r.txn, r.instance) && self.on_reply(now, r),
            Packet::NotHere(n) => ours(n.txn, n.wanted) && self.on_not_here(now, n),
            _ => false,
        };
        if !taken {
            self.stats.dropped_stale += 1;
        }
    }

    /// A node's answer to a locate: where the port is served (while
    /// locating), or whether the target's instance still runs (while
    /// verifying).
    fn on_here(&mut self, now: Time, h: Here) -> bool {
        let Some(txn) = self.txn.as_ref() else {
            return false;
        };
        if h.nonce != txn.nonce || h.port != txn.port {
            return false;
        }
        match txn.state {
            State::Locating if !h.endpoints.is_empty() => {
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
            State::Locating if self.aims.get(&h.port).is_some_and(|a| a.0 == h.node) => {
                // The advised node serves the port no more: ask them all.
                self.aims.remove(&h.port);
                self.begin_locate(now, State::Locating);
            }
            State::Verifying if txn.target.is_some_and(|t| t.node == h.node) => {
                if h.fate == Fate::Drained {
                    self.choose_target(now);
                } else {
                    let port = txn.port;
                    self.finish(Err(TransError::ServerRestarted { port }));
                }
            }
            _ => return false,
        }
        true
    }

    /// The target is alive and at work on the request.
    fn on_working(&mut self, now: Time) -> bool {
        let Some(txn) = self.txn.as_mut() else {
            return false;
        };
        txn.heard = Some(now);
        if txn.state == State::Sending {
            txn.state = State::Waiting;
        }
        // The next probe waits the interval as it has grown (up to
        // `rto_max`), so a long call costs a few datagrams a second, not
        // one every `rto_initial`.
        txn.timer = now + txn.rto;
        true
    }

    /// The target acknowledged fragments of the request.
    fn on_ack(&mut self, now: Time, a: Ack) -> bool {
        let Some(txn) = self.txn.as_mut() else {
            return false;
        };
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
        true
    }

    /// A fragment of the reply (or a refusal in its status).
    fn on_reply(&mut self, now: Time, r: Reply<'_>) -> bool {
        let Some(txn) = self.txn.as_mut() else {
            return false;
        };
        txn.heard = Some(now);
        match r.status {
            ReplyStatus::Ok => {}
            ReplyStatus::Busy => {
                let port = txn.port;
                self.finish(Err(TransError::Busy { port }));
                return true;
            }
            ReplyStatus::TooLarge => {
                let (port, bytes) = (txn.port, txn.body.len() as u64);
                self.finish(Err(TransError::TooLarge { port, bytes }));
                return true;
            }
        }
        if txn.reply.is_none()
            && is_whole(r.frag, r.total_len, r.payload)
            && r.total_len <= self.config.max_reply_bytes
        {
            // The common case, a reply in one datagram: no reassembly.
            self.finish(Ok(r.payload.to_vec()));
            return true;
        }
        if txn.reply.is_none() {
            match Incoming::new(r.total_len, r.frag.count, self.config.max_reply_bytes) {
                Some(inc) => txn.reply = Some(inc),
                None => {
                    let (port, bytes) = (txn.port, r.total_len);
                    self.finish(Err(TransError::ReplyTooLarge { port, bytes }));
                    return true;
                }
            }
        }
        txn.state = State::Receiving;
        let reply = txn.reply.as_mut().expect("set above");
        let added = reply.add(r.frag, r.total_len, r.payload);
        match added {
            Added::Invalid => {
                self.stats.dropped_malformed += 1;
                return true;
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
            self.finish(Ok(body));
            return true;
        }
        if reply.wants_ack(added, r.frag.index, self.config.window) {
            self.send_reply_ack();
        }
        true
    }

    /// The target's node says the instance the request went to is not
    /// (or no longer) there.
    fn on_not_here(&mut self, now: Time, n: NotHere) -> bool {
        let Some(txn) = self.txn.as_ref() else {
            return false;
        };
        if matches!(txn.state, State::Locating | State::Verifying) {
            return false;
        }
        if n.actual == n.wanted {
            // The instance itself refused: it is draining and never ran
            // this request.
            self.drop_target();
            self.choose_target(now);
        } else {
            self.target_gone(now);
        }
        true
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
mod tests;
