//! [`GroupCore`]: one member of one group.  This file holds the state, the
//! dispatch of datagrams and the sending side; receiving and in-order
//! delivery are in `stream.rs`, the sequencer's duties in `sequencer.rs`,
//! recovery in `recovery.rs`, joining, leaving and state transfer in
//! `join.rs`.
//!
//! A member's states ([`Status`]):
//!
//! ```text
//!             join()                       state transfer complete
//!   ┌────────────────────▶ Joining ─────────────────────────────┐
//!   │                         │ timeout                         ▼
//! create() ───────────────────┼─────────────────────────────▶ Normal ◀──────┐
//!                             ▼                (member, or     │  ▲         │ install of a
//!                            Out ◀── expelled ─ sequencer) ────┤  │ install │ later incarnation
//!                             ▲                                ▼  │         │
//!                             └──────── not in the new view ─ Recovering ───┘
//!                                                     (coordinating, or voted)
//!   leave() ──▶ (leave ordered, lingers until every member holds it) ──▶ Left
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;

use crate::parts::{Lifecycle, Outbox, Outputs, Pacing, Recovery, Stream, View};
use bytes::Bytes;
use rustc_hash::{FxHashMap, FxHashSet};
use shoal_cap::PutPort;
use shoal_proto::Time;
use shoal_wire::group::{
    Data, EntryKind, GroupBody, GroupHeader, GroupPacket, MemberEntry, ORDER_ACCEPT, Order,
};
use shoal_wire::{Frag, GroupSeq, Incarnation, MemberId, MsgId, Packet, plain};

use crate::assembly::{frag_count, frag_range};
use crate::config::GroupConfig;
use crate::event::{Event, SendError};
use crate::sequencer::Sequencer;

/// Where a datagram goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupDest {
    /// One address.
    Addr(SocketAddr),
    /// Every current member but this one ([`GroupCore::members`]): IP
    /// multicast where the network has it, else one datagram each.
    Members,
}

/// One datagram to send, encoded and authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupTransmit {
    pub dest: GroupDest,
    pub bytes: Vec<u8>,
}

/// A member's part in the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Asked to join; waiting for the join to be ordered and for state.
    Joining,
    /// A member in a working incarnation.
    Normal,
    /// A reset is under way (this member coordinates or has voted).
    Recovering,
    /// No longer a member: expelled, or joining failed.
    Out,
    /// Left the group on request.
    Left,
}

/// A sequenced entry as a member keeps it.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub inc: Incarnation,
    pub sender: MemberId,
    pub msg_id: MsgId,
    pub kind: EntryKind,
    pub body: Bytes,
}

/// A message this member sent that is not yet ordered.
#[derive(Debug)]
pub(crate) struct Pending {
    pub msg_id: MsgId,
    pub body: Bytes,
    pub last_sent: Time,
    pub tries: u32,
}

/// One member of one group: the whole protocol, without I/O.  Its
/// state in parts (`parts.rs`), as quinn-proto's `Connection` keeps its
/// spaces, streams and timers.
pub struct GroupCore {
    pub(crate) cfg: GroupConfig,
    pub(crate) group: PutPort,
    pub(crate) me: MemberEntry,
    pub(crate) status: Status,

    pub(crate) view: View,
    pub(crate) stream: Stream,
    pub(crate) outbox: Outbox,

    pub(crate) seq: Option<Sequencer>,
    /// The sequencer is in the middle of ordering an entry.
    pub(crate) ordering: bool,

    pub(crate) recovery: Recovery,
    pub(crate) lifecycle: Lifecycle,
    pub(crate) pacing: Pacing,

    pub(crate) now: Time,
    /// Source of the datagram being handled.
    pub(crate) src: SocketAddr,

    pub(crate) out: Outputs,

    pub(crate) stats: GroupStats,
    /// The key epoch the shell seals in, reported by `info` only.
    pub(crate) key_epoch: u32,
}

/// Counters for inspection and benchmarks.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GroupStats {
    pub datagrams_sent: u64,
    pub datagrams_received: u64,
    pub broadcasts_sent: u64,
    pub retransmissions: u64,
    pub nacks_sent: u64,
    pub resets: u64,
    pub delivered: u64,
}

/// What `shoal group info` shows.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GroupInfo {
    pub member: String,
    pub status: Status,
    pub incarnation: u64,
    pub sequencer: String,
    pub is_sequencer: bool,
    pub members: Vec<String>,
    pub resilience: usize,
    pub large_bytes: usize,
    pub held: u64,
    pub committed: u64,
    pub stable: u64,
    pub delivered: u64,
    pub last_known: u64,
    pub history_entries: usize,
    pub history_bytes: usize,
    pub history_limit_bytes: usize,
    pub in_flight: usize,
    /// The key epoch the member's shell sends in (`docs/security.md`).
    pub key_epoch: u32,
    pub stats: GroupStats,
}

impl GroupCore {
    pub(crate) fn blank(now: Time, group: PutPort, me: MemberEntry, cfg: GroupConfig) -> Self {
        Self {
            cfg,
            group,
            me,
            status: Status::Joining,
            view: View {
                inc: Incarnation(0),
                last_normal: (Incarnation(0), MemberId(0)),
                sequencer: MemberId(0),
                members: Vec::new(),
                members_seq: GroupSeq(0),
                prev_members: Vec::new(),
                snapshots: Vec::new(),
                promised: (Incarnation(0), MemberId(0)),
            },
            stream: Stream {
                log: BTreeMap::new(),
                log_bytes: 0,
                held: GroupSeq(0),
                commit: GroupSeq(0),
                stable: GroupSeq(0),
                delivered: GroupSeq(0),
                app_seq: GroupSeq(0),
                last_known: GroupSeq(0),
                senders: FxHashMap::default(),
                partial: FxHashMap::default(),
                accepted: BTreeMap::new(),
                bb: FxHashMap::default(),
                bb_done: FxHashMap::default(),
                peer_held: FxHashMap::default(),
            },
            outbox: Outbox {
                next_msg: MsgId(1),
                outgoing: VecDeque::new(),
                outgoing_bytes: 0,
                sent: VecDeque::new(),
            },
            seq: None,
            ordering: false,
            recovery: Recovery {
                coord: None,
                voted_at: None,
                recovery_failed_at: None,
            },
            lifecycle: Lifecycle {
                joining: None,
                state_out: Default::default(),
                leaving: None,
                left_at: None,
            },
            pacing: Pacing {
                heard_seq: now,
                last_nack: None,
                last_ack: Time(0),
                acked_held: GroupSeq(0),
                bytes_since_ack: 0,
                next_tick: now,
            },
            now,
            src: me.addr,
            out: Outputs {
                transmits: VecDeque::new(),
                events: VecDeque::new(),
            },
            stats: GroupStats::default(),
            key_epoch: 0,
        }
    }

    /// Creates a new group with this member as its only member and
    /// sequencer.  The first event is the group's first [`Event::View`].
    pub fn create(now: Time, group: PutPort, me: MemberEntry, cfg: GroupConfig) -> Self {
        let mut core = Self::blank(now, group, me, cfg);
        core.view.promised = (Incarnation(1), me.id);
        core.install(now, Incarnation(1), vec![me], (Incarnation(0), MemberId(0)));
        core
    }

    // ----- accessors -------------------------------------------------------

    pub fn id(&self) -> MemberId {
        self.me.id
    }
    pub fn group(&self) -> PutPort {
        self.group
    }
    pub fn status(&self) -> Status {
        self.status
    }
    pub fn incarnation(&self) -> Incarnation {
        self.view.inc
    }
    /// Which membership this member holds: its incarnation and the entry
    /// that last changed the members (a join and a leave between two
    /// looks change it, though the list is the same again).
    pub fn membership(&self) -> crate::keys::Membership {
        crate::keys::Membership {
            incarnation: self.view.inc,
            entry: self.view.members_seq,
        }
    }
    pub fn sequencer(&self) -> MemberId {
        self.view.sequencer
    }
    pub fn is_sequencer(&self) -> bool {
        self.seq.is_some()
    }
    /// Current members (as of the last held membership change).
    pub fn members(&self) -> &[MemberEntry] {
        &self.view.members
    }
    pub fn config(&self) -> &GroupConfig {
        &self.cfg
    }
    pub fn stats(&self) -> &GroupStats {
        &self.stats
    }
    /// Whether others wait on this member's answers: the sequencer, and
    /// with resilience r the members that acknowledge tentative entries.
    /// A shell polls busily only for these (a member that only receives
    /// has nobody waiting on it).
    pub fn answers_on_the_critical_path(&self) -> bool {
        self.status == Status::Normal && (self.seq.is_some() || self.is_acker())
    }

    /// Whether [`GroupCore::poll_event`] has something.
    pub fn has_events(&self) -> bool {
        !self.out.events.is_empty()
    }

    /// Messages sent and not yet ordered.
    pub fn in_flight(&self) -> usize {
        self.outbox.outgoing.len()
    }
    /// Highest sequence number delivered.
    pub fn delivered(&self) -> GroupSeq {
        self.stream.delivered
    }
    /// Highest sequence number held, with everything before it.
    pub fn held(&self) -> GroupSeq {
        self.stream.held
    }
    /// Highest sequence number known committed.
    pub fn committed(&self) -> GroupSeq {
        self.stream.commit
    }

    /// Records the key epoch the shell sends in, for [`GroupCore::info`].
    pub fn set_key_epoch(&mut self, epoch: u32) {
        self.key_epoch = epoch;
    }

    /// The key epoch last recorded.
    pub fn info_key_epoch(&self) -> u32 {
        self.key_epoch
    }

    pub fn info(&self) -> GroupInfo {
        GroupInfo {
            member: self.me.id.to_string(),
            status: self.status,
            incarnation: self.view.inc.0,
            sequencer: self.view.sequencer.to_string(),
            is_sequencer: self.is_sequencer(),
            members: self
                .view
                .members
                .iter()
                .map(|m| format!("{}@{}", m.id, m.addr))
                .collect(),
            resilience: self.cfg.resilience,
            large_bytes: self.cfg.large_bytes,
            held: self.stream.held.0,
            committed: self.stream.commit.0,
            stable: self.stream.stable.0,
            delivered: self.stream.delivered.0,
            last_known: self.stream.last_known.0,
            history_entries: self.stream.log.len(),
            history_bytes: self.stream.log_bytes,
            history_limit_bytes: self.cfg.history_bytes,
            in_flight: self.outbox.outgoing.len(),
            key_epoch: self.key_epoch,
            stats: self.stats.clone(),
        }
    }

    // ----- poll interface --------------------------------------------------

    pub fn poll_transmit(&mut self) -> Option<GroupTransmit> {
        self.out.transmits.pop_front()
    }

    /// The next of this member's messages known to be ordered and
    /// committed: (message number, sequence number).  It will be delivered
    /// everywhere, even if r members crash.
    pub fn poll_sent(&mut self) -> Option<(MsgId, GroupSeq)> {
        self.outbox.sent.pop_front()
    }

    /// The next event for the application, in stream order.
    pub fn poll_event(&mut self) -> Option<Event> {
        let ev = self.out.events.pop_front()?;
        match &ev {
            Event::Message { seq, .. }
            | Event::Joined { seq, .. }
            | Event::Left { seq, .. }
            | Event::View { seq, .. }
            | Event::State { seq, .. } => {
                self.stream.app_seq = *seq;
                self.purge();
            }
            _ => {}
        }
        Some(ev)
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        match self.status {
            Status::Out | Status::Left => None,
            _ => Some(
                self.held_accept_due()
                    .map_or(self.pacing.next_tick, |due| due.min(self.pacing.next_tick)),
            ),
        }
    }

    // ----- application calls -----------------------------------------------

    /// Sends `body` to the group; returns its message number.  The message
    /// is ordered when [`Event::Sent`] names it.
    pub fn send(&mut self, now: Time, body: Bytes) -> Result<MsgId, SendError> {
        self.now = now;
        if self.status == Status::Out
            || self.status == Status::Left
            || self.status == Status::Joining
            || self.lifecycle.leaving.is_some()
        {
            return Err(SendError::NotMember);
        }
        if body.len() > self.cfg.history_bytes / 2 {
            return Err(SendError::TooLarge {
                limit: self.cfg.history_bytes / 2,
            });
        }
        if self.outbox.outgoing.len() >= self.cfg.send_window
            || (!self.outbox.outgoing.is_empty()
                && self.outbox.outgoing_bytes + body.len() > self.cfg.send_window_bytes)
        {
            return Err(SendError::WindowFull);
        }
        let msg_id = self.outbox.next_msg;
        self.outbox.next_msg = msg_id.next();
        self.outbox.outgoing_bytes += body.len();
        self.outbox.outgoing.push_back(Pending {
            msg_id,
            body,
            last_sent: now,
            tries: 0,
        });
        if self.status == Status::Normal {
            let idx = self.outbox.outgoing.len() - 1;
            self.transmit_pending(now, idx, true);
        }
        Ok(msg_id)
    }

    /// True if [`GroupCore::send`] would accept a message of `len` bytes now.
    pub fn can_send(&self, len: usize) -> bool {
        self.status == Status::Normal
            && self.lifecycle.leaving.is_none()
            && self.outbox.outgoing.len() < self.cfg.send_window
            && (self.outbox.outgoing.is_empty()
                || self.outbox.outgoing_bytes + len <= self.cfg.send_window_bytes)
    }

    // ----- encoding helpers ------------------------------------------------

    pub(crate) fn hdr(&self) -> GroupHeader {
        GroupHeader {
            group: self.group,
            inc: self.view.inc,
            seqr: self.view.sequencer,
            from: self.me.id,
        }
    }

    pub(crate) fn emit(&mut self, dest: GroupDest, hdr: GroupHeader, body: GroupBody<'_>) {
        if dest == GroupDest::Members
            && matches!(body, GroupBody::Order(_) | GroupBody::Sync(_))
            && let Some(s) = self.seq.as_mut()
        {
            // It carries the commit point: a held-back accept is sent.
            s.accept_due = None;
        }
        let bytes = plain(&Packet::Group(GroupPacket { hdr, body }));
        self.stats.datagrams_sent += 1;
        if dest == GroupDest::Members {
            self.stats.broadcasts_sent += 1;
        }
        self.out.transmits.push_back(GroupTransmit { dest, bytes });
    }

    pub(crate) fn send_to(&mut self, member: MemberId, body: GroupBody<'_>) {
        if let Some(addr) = self.addr_of(member) {
            let hdr = self.hdr();
            self.emit(GroupDest::Addr(addr), hdr, body);
        }
    }

    pub(crate) fn broadcast(&mut self, body: GroupBody<'_>) {
        if self.view.members.len() > 1 {
            let hdr = self.hdr();
            self.emit(GroupDest::Members, hdr, body);
        }
    }

    pub(crate) fn addr_of(&self, member: MemberId) -> Option<SocketAddr> {
        self.view
            .members
            .iter()
            .chain(self.view.prev_members.iter())
            .find(|m| m.id == member)
            .map(|m| m.addr)
            .or_else(|| {
                self.recovery
                    .coord
                    .as_ref()
                    .and_then(|c| c.addrs.get(&member).copied())
            })
    }

    pub(crate) fn is_member(&self, id: MemberId) -> bool {
        self.view.members.iter().any(|m| m.id == id)
    }

    /// Sends fragments of one entry.
    pub(crate) fn emit_entry(
        &mut self,
        dest: GroupDest,
        seq: GroupSeq,
        entry: &Entry,
        flags: u8,
        hdr_inc: (Incarnation, MemberId),
    ) {
        let body = if flags & ORDER_ACCEPT != 0 {
            Bytes::new()
        } else {
            entry.body.clone()
        };
        let total = entry.body.len();
        let count = if flags & ORDER_ACCEPT != 0 {
            1
        } else {
            frag_count(total, self.cfg.frag_bytes)
        };
        for i in 0..count {
            let payload = if flags & ORDER_ACCEPT != 0 {
                &body[..0]
            } else {
                &body[frag_range(total, count, i)]
            };
            let hdr = GroupHeader {
                inc: hdr_inc.0,
                seqr: hdr_inc.1,
                ..self.hdr()
            };
            let order = Order {
                seq,
                entry_inc: entry.inc,
                sender: entry.sender,
                msg_id: entry.msg_id,
                kind: entry.kind,
                flags,
                commit: self.stream.commit,
                stable: self.stream.stable,
                frag: Frag { index: i, count },
                total_len: total as u64,
                payload,
            };
            self.emit(dest, hdr, GroupBody::Order(order));
        }
    }

    /// Sends (or re-sends) one of this member's pending messages.
    pub(crate) fn transmit_pending(&mut self, now: Time, idx: usize, first: bool) {
        let (msg_id, body) = {
            let p = &mut self.outbox.outgoing[idx];
            p.last_sent = now;
            if !first {
                p.tries += 1;
            }
            (p.msg_id, p.body.clone())
        };
        if self.seq.is_some() {
            // The sequencer orders its own messages directly.
            self.seq_accept_data(now, self.me.id, msg_id, body, false);
            return;
        }
        let bb = body.len() >= self.cfg.large_bytes;
        if bb && first {
            // Our own body, for when the accept comes back.
            self.stream
                .bb_done
                .insert((self.me.id, msg_id), body.clone());
        }
        // A BB message goes to everyone the first time; retries go to the
        // sequencer only (members that miss it ask the sequencer).
        let dest = if bb && first {
            GroupDest::Members
        } else {
            match self.addr_of(self.view.sequencer) {
                Some(a) => GroupDest::Addr(a),
                None => return,
            }
        };
        if !first {
            self.stats.retransmissions += 1;
        }
        let total = body.len();
        let count = frag_count(total, self.cfg.frag_bytes);
        for i in 0..count {
            let data = Data {
                msg_id,
                held: self.stream.held,
                bb,
                frag: Frag { index: i, count },
                total_len: total as u64,
                payload: &body[frag_range(total, count, i)],
            };
            let hdr = self.hdr();
            self.emit(dest, hdr, GroupBody::Data(data));
        }
        self.pacing.last_ack = now;
        self.pacing.acked_held = self.stream.held;
        self.pacing.bytes_since_ack = 0;
    }

    // ----- input -----------------------------------------------------------

    /// Handles one datagram's plaintext (the shell opened it: who sent it
    /// is the seal's business).  Plaintexts that are not group datagrams,
    /// or name another group, are ignored.
    pub fn handle_datagram(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        let Ok(Packet::Group(p)) = shoal_wire::decode_plain(datagram) else {
            return;
        };
        self.handle_packet(now, from, &p, datagram);
    }

    /// Handles one decoded group datagram (`raw` is its encoding, used to
    /// forward join requests unchanged).
    pub fn handle_packet(&mut self, now: Time, from: SocketAddr, p: &GroupPacket<'_>, raw: &[u8]) {
        self.now = now;
        self.src = from;
        if p.hdr.group != self.group || p.hdr.from == self.me.id {
            return;
        }
        self.stats.datagrams_received += 1;
        if matches!(self.status, Status::Left) {
            return;
        }
        if let GroupBody::InfoReq(req) = &p.body {
            let json = serde_json::to_vec(&self.info()).expect("info serializes");
            let hdr = self.hdr();
            self.emit(
                GroupDest::Addr(from),
                hdr,
                GroupBody::Info(shoal_wire::group::Info {
                    nonce: req.nonce,
                    json: &json,
                }),
            );
            return;
        }
        if self.status == Status::Out {
            return;
        }
        if self.status == Status::Joining {
            self.joining_packet(now, from, p);
            return;
        }
        let from_seq = p.hdr.from == self.view.sequencer && p.hdr.inc == self.view.inc;
        if from_seq {
            self.pacing.heard_seq = now;
        }
        if matches!(p.body, GroupBody::Order(_) | GroupBody::Sync(_))
            && p.hdr.from == p.hdr.seqr
            && (p.hdr.inc, p.hdr.from) < (self.view.inc, self.view.sequencer)
            && !self.is_member(p.hdr.from)
            && self.status == Status::Normal
        {
            // A sequencer of an incarnation the group left behind: tell it.
            self.tell_not_member();
            return;
        }
        match &p.body {
            GroupBody::Data(d) => self.on_data(now, p.hdr, d),
            GroupBody::Order(o) => self.on_order(now, p.hdr, o),
            GroupBody::Ack(a) if self.seq.is_some() => self.seq_on_held(now, p.hdr, a.held),
            GroupBody::Ack(a) => self.member_on_held(p.hdr, a.held),
            GroupBody::Nack(n) => self.on_nack(now, p.hdr, n),
            GroupBody::Sync(s) => {
                if from_seq && self.status == Status::Normal {
                    self.learn(s.commit, s.stable, s.last);
                    self.heard_held(p.hdr, s.last);
                    self.member_commit();
                    if s.want_status {
                        self.send_ack(now);
                    }
                    self.check_gap(now, false);
                    self.deliver();
                }
            }
            GroupBody::Join(j) => self.on_join(now, p.hdr, j, raw),
            GroupBody::StateReq(r) => self.on_state_req(now, p.hdr, r),
            GroupBody::State(_) => {}
            GroupBody::Invite(i) => self.on_invite(now, p.hdr, i.ballot, from),
            GroupBody::Vote(v) => self.on_vote(now, p.hdr, v, from),
            GroupBody::Fetch(f) => self.on_fetch(now, p.hdr, f, from),
            GroupBody::Reject(r) => self.on_reject(now, p.hdr, r, from),
            GroupBody::NotMember(_) => self.on_not_member(now, p.hdr),
            GroupBody::Leave => self.seq_on_leave(now, p.hdr),
            GroupBody::InfoReq(_) | GroupBody::Info(_) => {}
        }
    }

    // ----- timers ----------------------------------------------------------

    pub fn handle_timeout(&mut self, now: Time) {
        self.now = now;
        self.seq_accept_due(now);
        if now < self.pacing.next_tick {
            return;
        }
        self.pacing.next_tick = now + self.cfg.tick;
        if let Some((seq, at)) = self.lifecycle.left_at
            && (self.stream.stable >= seq || now.saturating_since(at) >= self.cfg.dead_after)
        {
            self.finish_leave();
            return;
        }
        match self.status {
            Status::Out | Status::Left => {}
            Status::Joining => self.joining_tick(now),
            Status::Recovering => self.recovery_tick(now),
            Status::Normal => {
                if self.seq.is_some() {
                    self.seq_tick(now);
                } else {
                    self.member_tick(now);
                }
            }
        }
    }

    /// Sends again this member's unordered messages that are due (or all
    /// of them); true if one has run out of retries.
    pub(crate) fn retransmit_due(&mut self, now: Time, all: bool) -> bool {
        let due: Vec<MsgId> = self
            .outbox
            .outgoing
            .iter()
            .filter(|p| all || now.saturating_since(p.last_sent) >= self.cfg.retransmit)
            .map(|p| p.msg_id)
            .collect();
        let mut exhausted = false;
        for msg_id in due {
            // Ordering one message may complete others: look it up again.
            let Some(i) = self.outbox.outgoing.iter().position(|p| p.msg_id == msg_id) else {
                continue;
            };
            if self.seq.is_none() && self.outbox.outgoing[i].tries >= self.cfg.send_retries {
                // Out of retries: suspicion if the sequencer is silent
                // (see `member_tick`); keep trying while it is not.
                exhausted = true;
            }
            self.transmit_pending(now, i, false);
        }
        exhausted
    }

    fn member_tick(&mut self, now: Time) {
        let exhausted = self.retransmit_due(now, false);
        if let Some(since) = self.lifecycle.leaving
            && now.saturating_since(since) >= self.cfg.retransmit
        {
            self.lifecycle.leaving = Some(now);
            self.send_to(self.view.sequencer, GroupBody::Leave);
        }
        self.check_gap(now, true);
        // A member that only receives still tells the sequencer how far it
        // holds, once per heartbeat while it makes progress: the sequencer
        // purges its history by it, and a member never heard from is
        // expelled.
        if (self.stream.held > self.pacing.acked_held
            || (self.is_acker() && self.stream.commit < self.stream.held))
            && now.saturating_since(self.pacing.last_ack) >= self.cfg.heartbeat
        {
            self.send_ack(now);
        }
        // A silent sequencer, or one that never orders our messages, is
        // suspected; members further down the list wait a little longer so
        // that one of them usually coordinates alone.
        let rank = self
            .view
            .members
            .iter()
            .position(|m| m.id == self.me.id)
            .unwrap_or(0) as u32;
        let patience = self.cfg.suspect_after + self.cfg.tick * (2 * rank);
        // Retries run out only against a silent sequencer: one that is
        // heard but does not order (its history is full) is waiting for a
        // laggard to be expelled.
        let exhausted =
            exhausted && now.saturating_since(self.pacing.heard_seq) >= self.cfg.retransmit * 2;
        if self.lifecycle.left_at.is_some() {
            return;
        }
        if exhausted || now.saturating_since(self.pacing.heard_seq) >= patience {
            let exclude = if self.is_member(self.view.sequencer) {
                [self.view.sequencer].into_iter().collect()
            } else {
                FxHashSet::default()
            };
            self.start_recovery(now, exclude, None);
        }
    }
}

/// Re-exported for `join.rs` and `recovery.rs`.
pub(crate) fn entry_from_order(o: &Order<'_>, body: Bytes) -> Entry {
    Entry {
        inc: o.entry_inc,
        sender: o.sender,
        msg_id: o.msg_id,
        kind: o.kind,
        body,
    }
}
