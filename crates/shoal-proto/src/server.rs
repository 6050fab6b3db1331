//! The server end of RPC: one endpoint (one socket, one put-port, one
//! instance), shared by any number of server threads.
//!
//! **At-most-once.**  The core keeps one record per caller (the node, uid
//! and client endpoint the shell authenticated: see [`Caller`]): the sequence
//! number of its latest transaction and where that transaction stands
//! (reassembling, executing, replied, done).  A fragment of a newer
//! transaction starts it and implicitly acknowledges the older one's reply;
//! a fragment of the current one is a duplicate (answered with [`Working`]
//! or the cached reply, never executed again); an older one is dropped.
//! Requests addressed to another instance of the port (the one before a
//! restart) are answered with [`NotHere`] and not executed, so a restart can
//! never turn a retransmission into a second execution.
//!
//! Records live for [`ServerConfig::record_ttl`] after their last packet
//! (two minutes: a client retransmits a request only until its deadline,
//! so deadlines longer than that weaken the guarantee), and their number is
//! bounded: a full table refuses new clients with `Busy` rather than
//! forget old ones.  A refusal is final: the client's record (or, when the
//! table is full, a bounded list) remembers it, so no late copy of a
//! refused request can run after the client was told it did not.
//!
//! **Draining.**  A server that stops on purpose first drains
//! ([`ServerCore::drain`]): it keeps finishing what it has, but refuses every
//! new transaction with a [`NotHere`] naming itself, for longer than a
//! client's first retransmission interval.  That refusal, and the node's
//! record that the instance drained, are what let a client move a request
//! to another server knowing it never ran here.
//!
//! The core never sets a retransmission timer of its own: clients drive
//! every exchange, so a server whose client vanished holds nothing but the
//! record until it expires.
//!
//! [`Working`]: shoal_wire::Working
//! [`NotHere`]: shoal_wire::NotHere

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use rustc_hash::FxHashMap;
use shoal_cap::PutPort;
use shoal_wire::{
    Ack, AckDir, Frag, Instance, NotHere, Packet, Reply, ReplyStatus, Request, Seq, TxnId,
    WireError, Working, decode_plain, encode_plain,
};

use crate::body::{Added, Incoming, Outgoing, Rope, is_whole};
use crate::stats::Stats;
use crate::transmit::{Caller, Dest, Transmit, Via};
use shoal_time::Time;

/// Refusals remembered without a record (when the table is full).
const MAX_REFUSED: usize = 4096;

/// Tuning and limits of a server endpoint.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Body bytes per reply fragment.
    pub frag_bytes: usize,
    /// Reply fragments sent ahead of acknowledgement.
    pub window: u32,
    /// Largest request accepted.
    pub max_request_bytes: u64,
    /// Most bytes of partial requests held at once.
    pub max_assembling_bytes: u64,
    /// Most client records held at once.
    pub max_records: usize,
    /// How long a client record outlives its last packet.
    pub record_ttl: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            frag_bytes: 60_000,
            window: 32,
            max_request_bytes: 1 << 30,
            max_assembling_bytes: 2 << 30,
            max_records: 100_000,
            record_ttl: Duration::from_secs(120),
        }
    }
}

/// A complete request, ready for the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    pub txn: TxnId,
    /// Who sent it, as the shell authenticated it.
    pub caller: Caller,
    pub from: SocketAddr,
    pub body: Vec<u8>,
}

#[derive(Debug)]
enum RecState {
    Assembling(Incoming),
    Executing,
    Replied(Outgoing),
    Done,
    /// Refused without running; every copy gets the same answer.
    Refused(ReplyStatus),
}

#[derive(Debug)]
struct Record {
    seq: Seq,
    /// Where the caller's latest datagram came from, and through which
    /// channel: replies go back there.
    from: SocketAddr,
    channel: u32,
    touched: Time,
    state: RecState,
}

/// One server endpoint's protocol state.
#[derive(Debug)]
pub struct ServerCore {
    port: PutPort,
    instance: Instance,
    config: ServerConfig,
    records: FxHashMap<Caller, Record>,
    assembling_bytes: u64,
    ready: VecDeque<Delivered>,
    transmits: VecDeque<Transmit>,
    next_sweep: Time,
    draining: bool,
    /// Transactions refused while the record table was full.
    refused: VecDeque<(Caller, Seq)>,
    stats: Stats,
}

impl ServerCore {
    /// A server endpoint for `port` (the put-port of the get-port the
    /// server holds), incarnation `instance`.
    pub fn new(port: PutPort, instance: Instance, config: ServerConfig) -> Self {
        Self {
            port,
            instance,
            config,
            records: FxHashMap::default(),
            assembling_bytes: 0,
            ready: VecDeque::new(),
            transmits: VecDeque::new(),
            next_sweep: Time(0),
            draining: false,
            refused: VecDeque::new(),
            stats: Stats::default(),
        }
    }

    /// The put-port served.
    pub fn port(&self) -> PutPort {
        self.port
    }

    /// This incarnation.
    pub fn instance(&self) -> Instance {
        self.instance
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Stops accepting new transactions: each is refused with a
    /// [`NotHere`] naming this instance.  Transactions already begun finish.
    pub fn drain(&mut self) {
        self.draining = true;
    }

    /// Whether the endpoint is draining.
    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Client records held.
    pub fn records(&self) -> usize {
        self.records.len()
    }

    /// Whether a request is part-way in: more of its fragments are due.
    pub fn is_assembling(&self) -> bool {
        self.assembling_bytes > 0
    }

    /// The next datagram to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next complete request for the application.
    pub fn poll_request(&mut self) -> Option<Delivered> {
        self.ready.pop_front()
    }

    /// When [`ServerCore::handle_timeout`] should run next (record expiry).
    pub fn poll_timeout(&self) -> Time {
        self.next_sweep
    }

    /// Expires old client records.
    pub fn handle_timeout(&mut self, now: Time) {
        if now < self.next_sweep {
            return;
        }
        let ttl = self.config.record_ttl;
        let mut freed = 0;
        self.records.retain(|_, r| {
            let keep =
                matches!(r.state, RecState::Executing) || now.saturating_since(r.touched) < ttl;
            if !keep && let RecState::Assembling(inc) = &r.state {
                freed += inc.total_len();
            }
            keep
        });
        self.assembling_bytes -= freed;
        self.next_sweep = now + ttl / 4;
    }

    /// A plaintext from `caller` arrived from `from` in channel
    /// `channel` (opened by the shell, which authenticated the caller).
    pub fn handle_datagram(
        &mut self,
        now: Time,
        from: SocketAddr,
        caller: Caller,
        channel: u32,
        plain: &[u8],
    ) {
        self.handle_packet(now, from, caller, channel, decode_plain(plain));
    }

    /// [`ServerCore::handle_datagram`] for a plaintext the shell decoded
    /// itself, so that opening it need not hold up whoever else uses the
    /// core.  A packet whose transaction names another client than the
    /// channel's is dropped: a caller speaks only for itself.
    pub fn handle_packet(
        &mut self,
        now: Time,
        from: SocketAddr,
        caller: Caller,
        channel: u32,
        packet: Result<Packet<'_>, WireError>,
    ) {
        self.stats.datagrams_in += 1;
        let src = Source {
            from,
            caller,
            channel,
        };
        match packet {
            Ok(Packet::Request(r)) if r.txn.client == caller.client => self.on_request(now, src, r),
            Ok(Packet::Ack(a)) if a.dir == AckDir::Reply && a.txn.client == caller.client => {
                self.on_reply_ack(now, caller, a)
            }
            Ok(_) => self.stats.dropped_stale += 1,
            Err(e) => self.stats.count_wire_error(e),
        }
    }

    /// A datagram the shell could not open (forged, replayed, or in a
    /// channel it has no key for): counted, nothing else.
    pub fn handle_unopened(&mut self, replayed: bool) {
        self.stats.count_unopened(replayed);
    }

    /// The application's reply to a request `caller` delivered.  Returns
    /// `false` (and sends nothing) if the client has moved on meanwhile.
    pub fn reply(&mut self, now: Time, caller: Caller, txn: TxnId, body: impl Into<Rope>) -> bool {
        let mut plain = crate::pool::datagram();
        match self.reply_into(now, caller, txn, body, &mut plain) {
            Replied::Encoded { to, via } => {
                self.transmits
                    .push_back(Transmit::whole(Dest::Addr(to), via, plain));
                true
            }
            replied => {
                crate::pool::give(plain);
                replied == Replied::Queued
            }
        }
    }

    /// [`ServerCore::reply`], but a reply that is one small datagram is
    /// encoded into `plain` instead of queued, for the shell to seal and
    /// send at once: most replies then cost no transmit, queue or pooled
    /// buffer of their own.
    pub fn reply_into(
        &mut self,
        now: Time,
        caller: Caller,
        txn: TxnId,
        body: impl Into<Rope>,
        plain: &mut Vec<u8>,
    ) -> Replied {
        let mut out = Outgoing::new(body, self.config.frag_bytes, self.config.window);
        let (records, mut tx) = self.split();
        let Some(rec) = records.get_mut(&caller) else {
            return Replied::Gone;
        };
        if rec.seq != txn.seq || !matches!(rec.state, RecState::Executing) {
            return Replied::Gone;
        }
        rec.touched = now;
        let to = rec.source(caller);
        let first = out.start();
        let replied = if out.count() == 1 && crate::transmit::copied(out.body().len()) {
            tx.stats.datagrams_out += 1;
            plain.clear();
            let payload = out.body().bytes(out.range(0));
            encode_plain(&reply_packet(txn, tx.instance, &out, 0, &payload), plain);
            Replied::Encoded {
                to: to.from,
                via: via(to),
            }
        } else {
            for idx in first {
                tx.reply_fragment(to, txn, &out, idx);
            }
            Replied::Queued
        };
        rec.state = RecState::Replied(out);
        replied
    }

    fn on_request(&mut self, now: Time, src: Source, r: Request<'_>) {
        if r.port != self.port || (r.instance != self.instance && r.instance != Instance(0)) {
            let actual = if r.port == self.port {
                self.instance
            } else {
                Instance(0)
            };
            self.stats.refused += 1;
            let packet = Packet::NotHere(NotHere {
                txn: r.txn,
                port: r.port,
                wanted: r.instance,
                actual,
            });
            return self.sender().send(src, &packet);
        }
        let window = self.config.window;
        let (records, mut tx) = self.split();
        let complete = match records.get_mut(&src.caller) {
            Some(rec) if r.txn.seq < rec.seq => {
                tx.stats.dropped_stale += 1;
                false
            }
            Some(rec) if r.txn.seq == rec.seq => {
                rec.touched = now;
                rec.from = src.from;
                rec.channel = src.channel;
                match &mut rec.state {
                    RecState::Assembling(inc) => {
                        let added = inc.add(r.frag, r.total_len, r.payload);
                        match added {
                            Added::Invalid => tx.stats.dropped_malformed += 1,
                            Added::Duplicate => tx.stats.duplicates += 1,
                            Added::New | Added::Refill => {}
                        }
                        if inc.is_complete() {
                            // Only the fragment that completed it gets here
                            // (later duplicates find the request executing).
                            true
                        } else {
                            if inc.wants_ack(added, r.frag.index, window) {
                                tx.request_ack(src, r.txn, inc.ack_state());
                            }
                            false
                        }
                    }
                    RecState::Executing => {
                        tx.stats.duplicates += 1;
                        tx.working(src, r.txn);
                        false
                    }
                    RecState::Replied(out) => {
                        tx.stats.duplicates += 1;
                        tx.stats.retransmits += 1;
                        let idx = out.probe();
                        tx.reply_fragment(src, r.txn, out, idx);
                        false
                    }
                    RecState::Done => {
                        tx.stats.duplicates += 1;
                        false
                    }
                    RecState::Refused(status) => {
                        tx.stats.duplicates += 1;
                        tx.refusal(src, r.txn, *status);
                        false
                    }
                }
            }
            _ => return self.start_txn(now, src, r),
        };
        if complete {
            self.complete(src.caller, r.txn);
        }
    }

    fn start_txn(&mut self, now: Time, src: Source, r: Request<'_>) {
        if self.draining {
            self.stats.refused += 1;
            let packet = Packet::NotHere(NotHere {
                txn: r.txn,
                port: r.port,
                wanted: self.instance,
                actual: self.instance,
            });
            return self.sender().send(src, &packet);
        }
        if self.refused.contains(&(src.caller, r.txn.seq)) {
            // Refused before without a record: refused for good.
            return self.refuse(src, r.txn, ReplyStatus::Busy);
        }
        // The table's size and the caller's old record matter only near
        // the limits: a small request from a caller with room to spare
        // costs no lookup here.
        let full = |core: &Self| {
            core.records.len() >= core.config.max_records && !core.records.contains_key(&src.caller)
        };
        if full(self) {
            self.next_sweep = now;
            self.handle_timeout(now);
        }
        let full = full(self);
        let no_room = r.frag.count > 1 && {
            let old_assembling = match self.records.get(&src.caller).map(|r| &r.state) {
                Some(RecState::Assembling(inc)) => inc.total_len(),
                _ => 0,
            };
            (self.assembling_bytes - old_assembling).saturating_add(r.total_len)
                > self.config.max_assembling_bytes
        };
        let refuse = if r.total_len > self.config.max_request_bytes {
            Some(ReplyStatus::TooLarge)
        } else if full || no_room {
            Some(ReplyStatus::Busy)
        } else {
            None
        };
        if let Some(status) = refuse {
            // The refusal is final for this transaction: remember it (in
            // the caller's record, replacing the older transaction's, or,
            // when the table is full, in a bounded list), so no later copy
            // or fragment of it can start it after all.
            if full {
                if self.refused.len() >= MAX_REFUSED {
                    self.refused.pop_front();
                }
                self.refused.push_back((src.caller, r.txn.seq));
            } else {
                self.set_record(src, r.txn.seq, now, RecState::Refused(status));
            }
            return self.refuse(src, r.txn, status);
        }
        if is_whole(r.frag, r.total_len, r.payload) {
            // The common case, a request in one datagram: straight to the
            // application, with no reassembly.
            self.set_record(src, r.txn.seq, now, RecState::Executing);
            self.deliver(src, r.txn, r.payload.to_vec());
            return;
        }
        let Some(mut inc) = Incoming::new(r.total_len, r.frag.count, self.config.max_request_bytes)
        else {
            self.stats.dropped_malformed += 1;
            return;
        };
        if inc.add(r.frag, r.total_len, r.payload) != Added::New {
            self.stats.dropped_malformed += 1;
            return;
        }
        let complete = inc.is_complete();
        if !complete {
            self.assembling_bytes += inc.total_len();
        }
        self.set_record(src, r.txn.seq, now, RecState::Assembling(inc));
        if complete {
            self.complete(src.caller, r.txn);
        }
    }

    /// Makes `state` the caller's record for transaction `seq`, replacing
    /// (and so implicitly acknowledging) its older transaction.
    fn set_record(&mut self, src: Source, seq: Seq, now: Time, state: RecState) {
        let old = self.records.insert(
            src.caller,
            Record {
                seq,
                from: src.from,
                channel: src.channel,
                touched: now,
                state,
            },
        );
        if let Some(Record {
            state: RecState::Assembling(inc),
            ..
        }) = old
        {
            self.assembling_bytes -= inc.total_len();
        }
    }

    fn refuse(&mut self, to: Source, txn: TxnId, status: ReplyStatus) {
        self.stats.refused += 1;
        self.sender().refusal(to, txn, status);
    }

    /// The request of `txn` from `caller` is whole: hand it to the
    /// application.
    fn complete(&mut self, caller: Caller, txn: TxnId) {
        let rec = self.records.get_mut(&caller).expect("record exists");
        let RecState::Assembling(inc) = std::mem::replace(&mut rec.state, RecState::Executing)
        else {
            unreachable!("completing a request that is not being assembled");
        };
        let src = rec.source(caller);
        if inc.count() > 1 {
            self.assembling_bytes -= inc.total_len();
            // Tell the client the whole request is here, so it stops sending.
            self.sender().working(src, txn);
        }
        self.deliver(src, txn, inc.into_body());
    }

    /// Hands the whole request `body` of `txn` to the application.
    fn deliver(&mut self, src: Source, txn: TxnId, body: Vec<u8>) {
        self.stats.transactions += 1;
        self.ready.push_back(Delivered {
            txn,
            caller: src.caller,
            from: src.from,
            body,
        });
    }

    fn on_reply_ack(&mut self, now: Time, caller: Caller, a: Ack) {
        let (records, mut tx) = self.split();
        let rec = match records.get_mut(&caller) {
            Some(rec) if rec.seq == a.txn.seq && a.instance == tx.instance => rec,
            _ => {
                tx.stats.dropped_stale += 1;
                return;
            }
        };
        rec.touched = now;
        let to = rec.source(caller);
        let RecState::Replied(out) = &mut rec.state else {
            tx.stats.dropped_stale += 1;
            return;
        };
        let (send, _) = out.on_ack(a.base, a.mask);
        for idx in send {
            tx.reply_fragment(to, a.txn, out, idx);
        }
        if out.is_acked() {
            rec.state = RecState::Done;
        }
    }

    fn sender(&mut self) -> Sender<'_> {
        self.split().1
    }

    /// The records and the output half, borrowed apart.
    fn split(&mut self) -> (&mut FxHashMap<Caller, Record>, Sender<'_>) {
        (
            &mut self.records,
            Sender {
                instance: self.instance,
                transmits: &mut self.transmits,
                stats: &mut self.stats,
            },
        )
    }
}

/// Where a datagram came from: its address, its authenticated caller and
/// the channel it came in.
#[derive(Debug, Clone, Copy)]
struct Source {
    from: SocketAddr,
    caller: Caller,
    channel: u32,
}

impl Record {
    fn source(&self, caller: Caller) -> Source {
        Source {
            from: self.from,
            caller,
            channel: self.channel,
        }
    }
}

/// The output half of the core, borrowed apart from the records so a
/// record can be updated and answered in one step.
struct Sender<'a> {
    instance: Instance,
    transmits: &'a mut VecDeque<Transmit>,
    stats: &'a mut Stats,
}

impl Sender<'_> {
    fn send(&mut self, to: Source, packet: &Packet<'_>) {
        self.stats.datagrams_out += 1;
        let mut bytes = crate::pool::datagram();
        encode_plain(packet, &mut bytes);
        self.transmits
            .push_back(Transmit::whole(Dest::Addr(to.from), via(to), bytes));
    }

    fn reply_fragment(&mut self, to: Source, txn: TxnId, out: &Outgoing, idx: u32) {
        let instance = self.instance;
        self.stats.datagrams_out += 1;
        self.transmits.push_back(crate::transmit::fragment(
            Dest::Addr(to.from),
            via(to),
            out,
            idx,
            |payload| reply_packet(txn, instance, out, idx, payload),
        ));
    }

    fn refusal(&mut self, to: Source, txn: TxnId, status: ReplyStatus) {
        let packet = Packet::Reply(Reply {
            txn,
            instance: self.instance,
            status,
            frag: Frag { index: 0, count: 1 },
            total_len: 0,
            payload: &[],
        });
        self.send(to, &packet);
    }

    fn working(&mut self, to: Source, txn: TxnId) {
        let packet = Packet::Working(Working {
            txn,
            instance: self.instance,
        });
        self.send(to, &packet);
    }

    fn request_ack(&mut self, to: Source, txn: TxnId, (base, mask): (u32, u64)) {
        let packet = Packet::Ack(Ack {
            txn,
            instance: self.instance,
            dir: AckDir::Request,
            base,
            mask,
        });
        self.send(to, &packet);
    }
}

/// What [`ServerCore::reply_into`] did with a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replied {
    /// The client has moved on: nothing to send.
    Gone,
    /// Queued as transmits, as [`ServerCore::reply`] queues them.
    Queued,
    /// Encoded into the buffer given, to be sealed for `via` and sent to
    /// `to`.
    Encoded { to: SocketAddr, via: Via },
}

/// Fragment `idx` of the reply `out` to transaction `txn`.
fn reply_packet<'a>(
    txn: TxnId,
    instance: Instance,
    out: &Outgoing,
    idx: u32,
    payload: &'a [u8],
) -> Packet<'a> {
    Packet::Reply(Reply {
        txn,
        instance,
        status: ReplyStatus::Ok,
        frag: out.frag(idx),
        total_len: out.total_len(),
        payload,
    })
}

fn via(to: Source) -> Via {
    Via::Client {
        caller: to.caller,
        channel: to.channel,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use shoal_cap::GetPort;

    const CLIENT: &str = "10.0.0.1:5000";

    fn core() -> (ServerCore, ()) {
        let key = ();
        let port = GetPort::from_bytes([1; 16]).put_port();
        let config = ServerConfig {
            max_request_bytes: 1000,
            max_records: 2,
            ..ServerConfig::default()
        };
        (ServerCore::new(port, Instance(5), config), key)
    }

    fn request(
        core: &ServerCore,
        _: &(),
        client: u64,
        seq: u64,
        instance: u64,
        body: &[u8],
    ) -> Vec<u8> {
        let mut out = Vec::new();
        encode_plain(
            &Packet::Request(Request {
                txn: TxnId {
                    client: shoal_wire::ClientId(client),
                    seq: Seq(seq),
                },
                instance: Instance(instance),
                port: core.port(),
                frag: Frag { index: 0, count: 1 },
                total_len: body.len() as u64,
                payload: body,
            }),
            &mut out,
        );
        out
    }

    /// Everything the core sent, decoded.  The bytes are leaked (a few
    /// hundred per test) so the packets can borrow them.
    fn sent(core: &mut ServerCore, _: &()) -> Vec<Packet<'static>> {
        let mut out = Vec::new();
        while let Some(t) = core.poll_transmit() {
            let bytes: &'static [u8] = Box::leak(t.into_plain().into_boxed_slice());
            out.push(decode_plain(bytes).unwrap());
        }
        out
    }

    /// The caller whose client endpoint is `client`.
    fn caller(client: u64) -> Caller {
        Caller {
            node: shoal_wire::NodeId(1),
            uid: 1000,
            client: shoal_wire::ClientId(client),
        }
    }

    /// Hands `bytes` to the core as its transaction's client sent them.
    fn feed(core: &mut ServerCore, bytes: &[u8]) {
        let client = match decode_plain(bytes) {
            Ok(p) => p.client().map_or(0, |c| c.0),
            Err(_) => 0,
        };
        core.handle_datagram(Time(1), CLIENT.parse().unwrap(), caller(client), 1, bytes);
    }

    #[test]
    fn a_request_runs_once_and_duplicates_get_working_then_the_cached_reply() {
        let (mut s, key) = core();
        let req = request(&s, &key, 1, 1, 5, b"hi");
        feed(&mut s, &req);
        let d = s.poll_request().expect("delivered");
        assert_eq!(d.body, b"hi");
        feed(&mut s, &req);
        assert!(s.poll_request().is_none(), "a duplicate must not run again");
        assert!(matches!(&sent(&mut s, &key)[..], [Packet::Working(_)]));
        assert_eq!(d.caller, caller(1));
        assert!(s.reply(Time(2), d.caller, d.txn, Bytes::from_static(b"ok")));
        assert!(matches!(&sent(&mut s, &key)[..], [Packet::Reply(r)] if r.payload == b"ok"));
        feed(&mut s, &req);
        assert!(s.poll_request().is_none());
        assert!(matches!(&sent(&mut s, &key)[..], [Packet::Reply(r)] if r.payload == b"ok"));
        // An older sequence number is dropped silently.
        let r = request(&s, &key, 1, 0, 5, b"old");
        feed(&mut s, &r);
        assert!(s.poll_request().is_none());
        assert!(sent(&mut s, &key).is_empty());
    }

    #[test]
    fn a_small_reply_is_encoded_for_the_shell_and_still_kept_for_duplicates() {
        let (mut s, key) = core();
        let req = request(&s, &key, 1, 1, 5, b"hi");
        feed(&mut s, &req);
        let d = s.poll_request().expect("delivered");
        let mut plain = Vec::new();
        let replied = s.reply_into(
            Time(2),
            d.caller,
            d.txn,
            Bytes::from_static(b"ok"),
            &mut plain,
        );
        let Replied::Encoded { to, via } = replied else {
            panic!("a small reply is encoded, not queued: {replied:?}");
        };
        assert_eq!(to, CLIENT.parse().unwrap());
        assert_eq!(
            via,
            Via::Client {
                caller: caller(1),
                channel: 1
            }
        );
        assert!(sent(&mut s, &key).is_empty(), "nothing queued besides");
        // The same packet `reply` would have queued.
        let encoded = plain.clone();
        assert!(
            matches!(decode_plain(&encoded), Ok(Packet::Reply(r)) if r.payload == b"ok" && r.txn == d.txn)
        );
        // A duplicate of the request gets the reply again from the record.
        feed(&mut s, &req);
        assert!(s.poll_request().is_none());
        let resent = s.poll_transmit().expect("resent").into_plain();
        assert_eq!(resent, encoded);
        // Answering twice sends nothing.
        assert_eq!(
            s.reply_into(
                Time(3),
                d.caller,
                d.txn,
                Bytes::from_static(b"ok"),
                &mut plain
            ),
            Replied::Gone
        );
    }

    #[test]
    fn a_reply_of_several_fragments_is_queued() {
        let (mut s, key) = core();
        let req = request(&s, &key, 1, 1, 5, b"hi");
        feed(&mut s, &req);
        let d = s.poll_request().expect("delivered");
        let big = vec![9u8; ServerConfig::default().frag_bytes * 3];
        let mut plain = Vec::new();
        assert_eq!(
            s.reply_into(Time(2), d.caller, d.txn, big, &mut plain),
            Replied::Queued
        );
        assert!(matches!(&sent(&mut s, &key)[..], [Packet::Reply(_), ..]));
    }

    #[test]
    fn another_instance_and_a_draining_one_refuse_without_running() {
        let (mut s, key) = core();
        let r = request(&s, &key, 1, 1, 99, b"x");
        feed(&mut s, &r);
        assert!(s.poll_request().is_none());
        assert!(matches!(&sent(&mut s, &key)[..],
            [Packet::NotHere(n)] if n.wanted == Instance(99) && n.actual == Instance(5)));
        s.drain();
        let r = request(&s, &key, 1, 1, 5, b"x");
        feed(&mut s, &r);
        assert!(s.poll_request().is_none());
        assert!(matches!(&sent(&mut s, &key)[..],
            [Packet::NotHere(n)] if n.wanted == Instance(5) && n.actual == Instance(5)));
    }

    #[test]
    fn too_large_and_too_many_clients_are_refused_without_running() {
        let (mut s, key) = core();
        let big = request(&s, &key, 1, 1, 5, &[0; 1001]);
        for _ in 0..2 {
            // The refusal is final: a copy gets the same answer.
            feed(&mut s, &big);
            assert!(s.poll_request().is_none());
            assert!(matches!(&sent(&mut s, &key)[..],
                [Packet::Reply(r)] if r.status == ReplyStatus::TooLarge));
        }
        for (client, seq) in [(1, 2), (2, 1)] {
            let r = request(&s, &key, client, seq, 5, b"x");
            feed(&mut s, &r);
            assert!(s.poll_request().is_some());
        }
        let r = request(&s, &key, 3, 1, 5, b"x");
        for _ in 0..2 {
            feed(&mut s, &r);
            assert!(s.poll_request().is_none());
            assert!(matches!(&sent(&mut s, &key)[..],
                [Packet::Reply(r)] if r.status == ReplyStatus::Busy));
        }
        assert_eq!(s.records(), 2);
        // A late copy of the request that preceded a refused one cannot
        // run again: the refusal replaced its record, not erased it.
        let r = request(&s, &key, 1, 1, 5, &[0; 1001]);
        feed(&mut s, &r);
        let r = request(&s, &key, 2, 0, 5, b"older");
        feed(&mut s, &r);
        assert!(s.poll_request().is_none());
    }

    #[test]
    fn forged_datagrams_are_counted_not_answered() {
        let (mut s, key) = core();
        // The shell could not open it: counted, not parsed.
        s.handle_unopened(false);
        s.handle_unopened(true);
        feed(&mut s, &[1, 2, 3]);
        // A request naming another client than its channel's.
        let req = request(&s, &key, 2, 1, 5, b"x");
        s.handle_datagram(Time(1), CLIENT.parse().unwrap(), caller(1), 1, &req);
        assert!(s.poll_request().is_none());
        assert!(sent(&mut s, &key).is_empty());
        assert_eq!(s.stats().dropped_bad_mac, 1);
        assert_eq!(s.stats().replays, 1);
        assert_eq!(s.stats().dropped_malformed, 1);
        assert_eq!(s.stats().dropped_stale, 1);
    }

    #[test]
    fn callers_with_one_client_id_on_different_nodes_or_uids_keep_apart() {
        let (s, key) = core();
        let req = request(&s, &key, 1, 1, 5, b"x");
        let from = CLIENT.parse().unwrap();
        let a = caller(1);
        let b = Caller { uid: 0, ..a };
        let c = Caller {
            node: shoal_wire::NodeId(9),
            ..a
        };
        // (The table holds two records.)
        for (x, y) in [(a, b), (a, c)] {
            let (mut s, _) = core();
            for who in [x, y] {
                s.handle_datagram(Time(1), from, who, 1, &req);
                let d = s.poll_request().expect("each caller's request runs");
                assert_eq!(d.caller, who);
            }
            assert_eq!(s.records(), 2);
        }
    }
}
