//! [`GroupCore`]: one member of one group.  This file holds the state, the
//! dispatch of datagrams, the sending side and in-order delivery; the
//! sequencer's duties are in `sequencer.rs`, recovery in `recovery.rs`,
//! joining, leaving and state transfer in `join.rs`.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;

use bytes::Bytes;
use rustc_hash::{FxHashMap, FxHashSet};
use shoal_cap::PutPort;
use shoal_proto::Time;
use shoal_wire::group::{
    Data, EntryKind, GAck, GroupBody, GroupHeader, GroupPacket, MemberEntry, Nack, Order,
    ORDER_ACCEPT, ORDER_FETCHED, ORDER_RETRANSMIT, ORDER_TENTATIVE, decode_member,
    decode_view,
};
use shoal_wire::{ClusterKey, Frag, MemberId, Packet, encode};

use crate::assembly::{Assembly, frag_count, frag_range};
use crate::config::GroupConfig;
use crate::event::{Event, SendError};
use crate::join::Joining;
use crate::recovery::Coordinator;
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
    pub inc: u64,
    pub sender: MemberId,
    pub msg_id: u64,
    pub kind: EntryKind,
    pub body: Bytes,
}

/// A message this member sent that is not yet ordered.
#[derive(Debug)]
pub(crate) struct Pending {
    pub msg_id: u64,
    pub body: Bytes,
    pub last_sent: Time,
    pub tries: u32,
}

/// One member of one group: the whole protocol, without I/O.
pub struct GroupCore {
    pub(crate) cfg: GroupConfig,
    pub(crate) key: ClusterKey,
    pub(crate) group: PutPort,
    pub(crate) me: MemberEntry,
    pub(crate) status: Status,

    /// Current incarnation (changes at each reset).
    pub(crate) inc: u64,
    /// Last incarnation in which this member was a normal member.
    pub(crate) last_normal: (u64, MemberId),
    pub(crate) sequencer: MemberId,
    /// Membership after entry `members_seq`.
    pub(crate) members: Vec<MemberEntry>,
    pub(crate) members_seq: u64,
    /// Membership before the last membership change (a reset needs a
    /// quorum of both, since that change may not be committed).
    pub(crate) prev_members: Vec<MemberEntry>,
    /// Membership after each recent change: (seq, members), oldest first.
    pub(crate) snapshots: Vec<(u64, Vec<MemberEntry>)>,
    /// Highest ballot promised: (incarnation, coordinator).
    pub(crate) promised: (u64, MemberId),

    /// Entries held, by sequence number (beyond `held` too, out of order).
    pub(crate) log: BTreeMap<u64, Entry>,
    pub(crate) log_bytes: usize,
    /// Every entry up to here is held (or covered by the joined state).
    pub(crate) held: u64,
    /// Every entry up to here is committed.
    pub(crate) commit: u64,
    /// Every entry up to here is held by every member.
    pub(crate) stable: u64,
    /// Every entry up to here was turned into an event.
    pub(crate) delivered: u64,
    /// Sequence number of the last event the application polled.
    pub(crate) app_seq: u64,
    /// Highest sequence number known to exist.
    pub(crate) last_known: u64,
    /// Last message number sequenced per sender, as of `held`.
    pub(crate) senders: FxHashMap<MemberId, u64>,
    /// Entry fragments being reassembled, by sequence number.
    pub(crate) partial: FxHashMap<u64, (Order<'static>, Assembly)>,
    /// Accepted BB entries whose body has not arrived: seq → header.
    pub(crate) accepted: BTreeMap<u64, Entry>,
    /// BB bodies received from their senders, by (sender, msg_id).
    pub(crate) bb: FxHashMap<(MemberId, u64), Assembly>,
    pub(crate) bb_done: FxHashMap<(MemberId, u64), Bytes>,

    pub(crate) next_msg: u64,
    pub(crate) outgoing: VecDeque<Pending>,
    pub(crate) outgoing_bytes: usize,

    pub(crate) seq: Option<Sequencer>,
    /// The sequencer is in the middle of ordering an entry.
    pub(crate) ordering: bool,
    pub(crate) coord: Option<Coordinator>,
    /// When this member voted in a recovery it does not coordinate.
    pub(crate) voted_at: Option<Time>,
    /// When recovery last failed (to retry later).
    pub(crate) recovery_failed_at: Option<Time>,
    pub(crate) joining: Option<Joining>,
    pub(crate) leaving: Option<Time>,
    /// Our own leave was delivered here (a sequencer lingers after it).
    pub(crate) left_at: Option<(u64, Time)>,
    pub(crate) state_out: crate::join::StateOut,

    /// Last datagram from the sequencer (or, as sequencer, last broadcast).
    pub(crate) heard_seq: Time,
    pub(crate) last_nack: Option<Time>,
    pub(crate) last_ack: Time,
    pub(crate) next_tick: Time,
    pub(crate) now: Time,
    /// Source of the datagram being handled.
    pub(crate) src: SocketAddr,

    pub(crate) transmits: VecDeque<GroupTransmit>,
    pub(crate) events: VecDeque<Event>,
    /// Own messages ordered: (msg_id, seq), apart from the event stream so
    /// a sender learns of them without reading every delivery first.
    pub(crate) sent: VecDeque<(u64, u64)>,
    pub(crate) stats: GroupStats,
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
    pub stats: GroupStats,
}

impl GroupCore {
    pub(crate) fn blank(
        now: Time,
        key: ClusterKey,
        group: PutPort,
        me: MemberEntry,
        cfg: GroupConfig,
    ) -> Self {
        Self {
            cfg,
            key,
            group,
            me,
            status: Status::Joining,
            inc: 0,
            last_normal: (0, MemberId(0)),
            sequencer: MemberId(0),
            members: Vec::new(),
            members_seq: 0,
            prev_members: Vec::new(),
            snapshots: Vec::new(),
            promised: (0, MemberId(0)),
            log: BTreeMap::new(),
            log_bytes: 0,
            held: 0,
            commit: 0,
            stable: 0,
            delivered: 0,
            app_seq: 0,
            last_known: 0,
            senders: FxHashMap::default(),
            partial: FxHashMap::default(),
            accepted: BTreeMap::new(),
            bb: FxHashMap::default(),
            bb_done: FxHashMap::default(),
            next_msg: 1,
            outgoing: VecDeque::new(),
            outgoing_bytes: 0,
            seq: None,
            ordering: false,
            coord: None,
            voted_at: None,
            recovery_failed_at: None,
            joining: None,
            leaving: None,
            left_at: None,
            state_out: Default::default(),
            heard_seq: now,
            last_nack: None,
            last_ack: Time(0),
            next_tick: now,
            now,
            src: me.addr,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            sent: VecDeque::new(),
            stats: GroupStats::default(),
        }
    }

    /// Creates a new group with this member as its only member and
    /// sequencer.  The first event is the group's first [`Event::View`].
    pub fn create(
        now: Time,
        key: ClusterKey,
        group: PutPort,
        me: MemberEntry,
        cfg: GroupConfig,
    ) -> Self {
        let mut core = Self::blank(now, key, group, me, cfg);
        core.promised = (1, me.id);
        core.install(now, 1, vec![me], (0, MemberId(0)));
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
    pub fn incarnation(&self) -> u64 {
        self.inc
    }
    pub fn sequencer(&self) -> MemberId {
        self.sequencer
    }
    pub fn is_sequencer(&self) -> bool {
        self.seq.is_some()
    }
    /// Current members (as of the last held membership change).
    pub fn members(&self) -> &[MemberEntry] {
        &self.members
    }
    pub fn config(&self) -> &GroupConfig {
        &self.cfg
    }
    pub fn stats(&self) -> &GroupStats {
        &self.stats
    }
    /// Messages sent and not yet ordered.
    pub fn in_flight(&self) -> usize {
        self.outgoing.len()
    }
    /// Highest sequence number delivered.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    pub fn info(&self) -> GroupInfo {
        GroupInfo {
            member: self.me.id.to_string(),
            status: self.status,
            incarnation: self.inc,
            sequencer: self.sequencer.to_string(),
            is_sequencer: self.is_sequencer(),
            members: self
                .members
                .iter()
                .map(|m| format!("{}@{}", m.id, m.addr))
                .collect(),
            resilience: self.cfg.resilience,
            large_bytes: self.cfg.large_bytes,
            held: self.held,
            committed: self.commit,
            stable: self.stable,
            delivered: self.delivered,
            last_known: self.last_known,
            history_entries: self.log.len(),
            history_bytes: self.log_bytes,
            history_limit_bytes: self.cfg.history_bytes,
            in_flight: self.outgoing.len(),
            stats: self.stats.clone(),
        }
    }

    // ----- poll interface --------------------------------------------------

    pub fn poll_transmit(&mut self) -> Option<GroupTransmit> {
        self.transmits.pop_front()
    }

    /// The next of this member's messages known to be ordered and
    /// committed: (message number, sequence number).  It will be delivered
    /// everywhere, even if r members crash.
    pub fn poll_sent(&mut self) -> Option<(u64, u64)> {
        self.sent.pop_front()
    }

    /// The next event for the application, in stream order.
    pub fn poll_event(&mut self) -> Option<Event> {
        let ev = self.events.pop_front()?;
        match &ev {
            Event::Message { seq, .. }
            | Event::Joined { seq, .. }
            | Event::Left { seq, .. }
            | Event::View { seq, .. }
            | Event::State { seq, .. } => {
                self.app_seq = *seq;
                self.purge();
            }
            _ => {}
        }
        Some(ev)
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        match self.status {
            Status::Out | Status::Left => None,
            _ => Some(self.next_tick),
        }
    }

    // ----- application calls -----------------------------------------------

    /// Sends `body` to the group; returns its message number.  The message
    /// is ordered when [`Event::Sent`] names it.
    pub fn send(&mut self, now: Time, body: Bytes) -> Result<u64, SendError> {
        self.now = now;
        if self.status == Status::Out
            || self.status == Status::Left
            || self.status == Status::Joining
            || self.leaving.is_some()
        {
            return Err(SendError::NotMember);
        }
        if body.len() > self.cfg.history_bytes / 2 {
            return Err(SendError::TooLarge {
                limit: self.cfg.history_bytes / 2,
            });
        }
        if self.outgoing.len() >= self.cfg.send_window
            || (!self.outgoing.is_empty()
                && self.outgoing_bytes + body.len() > self.cfg.send_window_bytes)
        {
            return Err(SendError::WindowFull);
        }
        let msg_id = self.next_msg;
        self.next_msg += 1;
        self.outgoing_bytes += body.len();
        self.outgoing.push_back(Pending {
            msg_id,
            body,
            last_sent: now,
            tries: 0,
        });
        if self.status == Status::Normal {
            let idx = self.outgoing.len() - 1;
            self.transmit_pending(now, idx, true);
        }
        Ok(msg_id)
    }

    /// True if [`GroupCore::send`] would accept a message of `len` bytes now.
    pub fn can_send(&self, len: usize) -> bool {
        self.status == Status::Normal
            && self.leaving.is_none()
            && self.outgoing.len() < self.cfg.send_window
            && (self.outgoing.is_empty()
                || self.outgoing_bytes + len <= self.cfg.send_window_bytes)
    }

    // ----- encoding helpers ------------------------------------------------

    pub(crate) fn hdr(&self) -> GroupHeader {
        GroupHeader {
            group: self.group,
            inc: self.inc,
            seqr: self.sequencer,
            from: self.me.id,
        }
    }

    pub(crate) fn emit(&mut self, dest: GroupDest, hdr: GroupHeader, body: GroupBody<'_>) {
        let bytes = encode(&Packet::Group(GroupPacket { hdr, body }), &self.key);
        self.stats.datagrams_sent += 1;
        if dest == GroupDest::Members {
            self.stats.broadcasts_sent += 1;
        }
        self.transmits.push_back(GroupTransmit { dest, bytes });
    }

    pub(crate) fn send_to(&mut self, member: MemberId, body: GroupBody<'_>) {
        if let Some(addr) = self.addr_of(member) {
            let hdr = self.hdr();
            self.emit(GroupDest::Addr(addr), hdr, body);
        }
    }

    pub(crate) fn broadcast(&mut self, body: GroupBody<'_>) {
        if self.members.len() > 1 {
            let hdr = self.hdr();
            self.emit(GroupDest::Members, hdr, body);
        }
    }

    pub(crate) fn addr_of(&self, member: MemberId) -> Option<SocketAddr> {
        self.members
            .iter()
            .chain(self.prev_members.iter())
            .find(|m| m.id == member)
            .map(|m| m.addr)
            .or_else(|| {
                self.coord
                    .as_ref()
                    .and_then(|c| c.addrs.get(&member).copied())
            })
    }

    pub(crate) fn is_member(&self, id: MemberId) -> bool {
        self.members.iter().any(|m| m.id == id)
    }

    /// Sends fragments of one entry.
    pub(crate) fn emit_entry(
        &mut self,
        dest: GroupDest,
        seq: u64,
        entry: &Entry,
        flags: u8,
        hdr_inc: (u64, MemberId),
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
                commit: self.commit,
                stable: self.stable,
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
            let p = &mut self.outgoing[idx];
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
            self.bb_done.insert((self.me.id, msg_id), body.clone());
        }
        // A BB message goes to everyone the first time; retries go to the
        // sequencer only (members that miss it ask the sequencer).
        let dest = if bb && first {
            GroupDest::Members
        } else {
            match self.addr_of(self.sequencer) {
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
                held: self.held,
                bb,
                frag: Frag { index: i, count },
                total_len: total as u64,
                payload: &body[frag_range(total, count, i)],
            };
            let hdr = self.hdr();
            self.emit(dest, hdr, GroupBody::Data(data));
        }
        self.last_ack = now;
    }

    // ----- input -----------------------------------------------------------

    /// Handles one datagram.  Datagrams that are not group datagrams, name
    /// another group, or fail the MAC are ignored.
    pub fn handle_datagram(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        let Ok(Packet::Group(p)) = shoal_wire::decode(datagram, &self.key) else {
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
        let from_seq = p.hdr.from == self.sequencer && p.hdr.inc == self.inc;
        if from_seq {
            self.heard_seq = now;
        }
        if matches!(p.body, GroupBody::Order(_) | GroupBody::Sync(_))
            && p.hdr.from == p.hdr.seqr
            && (p.hdr.inc, p.hdr.from) < (self.inc, self.sequencer)
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
            GroupBody::Ack(a) => self.seq_on_held(now, p.hdr, a.held),
            GroupBody::Nack(n) => self.on_nack(now, p.hdr, n),
            GroupBody::Sync(s) => {
                if from_seq && self.status == Status::Normal {
                    self.learn(s.commit, s.stable, s.last);
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

    fn on_data(&mut self, now: Time, hdr: GroupHeader, d: &Data<'_>) {
        if d.bb && self.seq.is_none() {
            // A BB body: keep it until the sequencer's accept arrives.
            self.store_bb(hdr.from, d);
            return;
        }
        self.seq_on_data(now, hdr, d);
    }

    pub(crate) fn store_bb(&mut self, sender: MemberId, d: &Data<'_>) -> Option<Bytes> {
        let key = (sender, d.msg_id);
        if self.senders.get(&sender).is_some_and(|&last| d.msg_id <= last) {
            return None;
        }
        if let Some(done) = self.bb_done.get(&key) {
            return Some(done.clone());
        }
        let bb_bytes: usize = self.bb.values().map(|a| a.total()).sum::<usize>()
            + self.bb_done.values().map(|b| b.len()).sum::<usize>();
        if !self.bb.contains_key(&key) && bb_bytes + d.total_len as usize > self.cfg.history_bytes
        {
            // Bodies whose accept never came (their sender's message was
            // lost in a reset) make room; the sequencer has the others.
            self.bb.clear();
            self.bb_done.clear();
            if d.total_len as usize > self.cfg.history_bytes {
                return None;
            }
        }
        let asm = match self.bb.entry(key) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(Assembly::new(d.total_len, d.frag.count)?)
            }
        };
        if !asm.add(d.total_len, d.frag.count, d.frag.index, d.payload) {
            return None;
        }
        if asm.is_complete() {
            let body = self.bb.remove(&key).expect("present").finish();
            self.bb_done.insert(key, body.clone());
            // A body whose accept came first completes that entry now.
            let waiting = self
                .accepted
                .iter()
                .find(|(_, e)| e.sender == sender && e.msg_id == d.msg_id)
                .map(|(s, _)| *s);
            if let Some(seq) = waiting {
                let mut e = self.accepted.remove(&seq).expect("present");
                e.body = body.clone();
                self.bb_done.remove(&key);
                self.place(seq, e);
                self.after_hold(self.now);
            }
            return Some(body);
        }
        None
    }

    fn on_order(&mut self, now: Time, hdr: GroupHeader, o: &Order<'_>) {
        if o.flags & ORDER_FETCHED != 0 {
            self.coord_on_fetched(now, hdr, o);
            return;
        }
        if o.kind == EntryKind::View
            && o.entry_inc == hdr.inc
            && (hdr.inc, hdr.from) > (self.inc, self.sequencer)
        {
            self.on_install(now, hdr, o);
            return;
        }
        if hdr.inc != self.inc || hdr.from != self.sequencer || self.status != Status::Normal {
            return;
        }
        self.learn(o.commit, o.stable, o.seq);
        if o.seq > self.held {
            let entry = Entry {
                inc: o.entry_inc,
                sender: o.sender,
                msg_id: o.msg_id,
                kind: o.kind,
                body: Bytes::new(),
            };
            if o.flags & ORDER_ACCEPT != 0 {
                let key = (o.sender, o.msg_id);
                if let Some(body) = self.bb_done.remove(&key) {
                    if body.len() as u64 == o.total_len {
                        self.place(o.seq, Entry { body, ..entry });
                    }
                } else if !self.log.contains_key(&o.seq) {
                    self.accepted.insert(o.seq, entry);
                }
            } else if !self.log.contains_key(&o.seq) {
                if o.frag.count == 1 {
                    if o.total_len == o.payload.len() as u64 {
                        let body = Bytes::copy_from_slice(o.payload);
                        self.place(o.seq, Entry { body, ..entry });
                    }
                } else {
                    self.add_fragment(o);
                }
            }
        }
        let retransmit = o.flags & ORDER_RETRANSMIT != 0;
        self.after_hold(now);
        if retransmit || (o.flags & ORDER_TENTATIVE != 0 && self.is_acker()) {
            self.send_ack(now);
        }
        self.check_gap(now, false);
        self.deliver();
    }

    pub(crate) fn add_fragment(&mut self, o: &Order<'_>) {
        if self.log_bytes + o.total_len as usize > 2 * self.cfg.history_bytes
            && o.seq > self.held + 1
        {
            return;
        }
        let slot = match self.partial.entry(o.seq) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let Some(asm) = Assembly::new(o.total_len, o.frag.count) else {
                    return;
                };
                let head = Order {
                    payload: &[],
                    ..o.clone()
                };
                v.insert((head, asm))
            }
        };
        slot.1.add(o.total_len, o.frag.count, o.frag.index, o.payload);
        if slot.1.is_complete() {
            let (head, asm) = self.partial.remove(&o.seq).expect("present");
            let entry = Entry {
                inc: head.entry_inc,
                sender: head.sender,
                msg_id: head.msg_id,
                kind: head.kind,
                body: asm.finish(),
            };
            self.place(o.seq, entry);
        }
    }

    /// Stores a complete entry.
    pub(crate) fn place(&mut self, seq: u64, entry: Entry) {
        if seq <= self.held || self.log.contains_key(&seq) {
            return;
        }
        if self.log_bytes + entry.body.len() > 2 * self.cfg.history_bytes && seq > self.held + 1 {
            return;
        }
        self.accepted.remove(&seq);
        self.partial.remove(&seq);
        self.log_bytes += entry.body.len();
        self.log.insert(seq, entry);
    }

    /// Advances `held` over contiguous entries, applying membership changes
    /// and sender numbers as it goes.
    pub(crate) fn after_hold(&mut self, now: Time) {
        let before = self.held;
        while let Some(e) = self.log.get(&(self.held + 1)) {
            let seq = self.held + 1;
            let (sender, msg_id, kind) = (e.sender, e.msg_id, e.kind);
            let body = e.body.clone();
            self.held = seq;
            if kind == EntryKind::App {
                let last = self.senders.entry(sender).or_insert(0);
                *last = (*last).max(msg_id);
                self.bb_done.remove(&(sender, msg_id));
                self.bb.remove(&(sender, msg_id));
                if let Some(s) = self.seq.as_mut() {
                    s.bb.remove(&(sender, msg_id));
                }
            }
            if seq > self.members_seq {
                self.apply_membership(seq, kind, &body);
            }
        }
        if self.held > before {
            self.last_known = self.last_known.max(self.held);
            if let Some(s) = self.seq.as_mut() {
                s.next = s.next.max(self.held + 1);
            }
            self.seq_after_hold(now);
        }
    }

    fn apply_membership(&mut self, seq: u64, kind: EntryKind, body: &[u8]) {
        match kind {
            EntryKind::App => return,
            EntryKind::Join => {
                let Ok(m) = decode_member(body) else { return };
                if self.is_member(m.id) {
                    return;
                }
                self.prev_members = self.members.clone();
                self.members.push(m);
            }
            EntryKind::Leave => {
                let Ok(bytes) = <[u8; 8]>::try_from(body) else {
                    return;
                };
                let id = MemberId(u64::from_le_bytes(bytes));
                if !self.is_member(id) {
                    return;
                }
                self.prev_members = self.members.clone();
                self.members.retain(|m| m.id != id);
            }
            EntryKind::View => {
                let Ok(view) = decode_view(body) else {
                    return;
                };
                let list = view.members;
                self.prev_members = list.clone();
                self.members = list;
            }
        }
        self.members_seq = seq;
        self.snapshots.push((seq, self.members.clone()));
        // Keep the changes a truncation could undo, and two before them.
        let keep_from = self
            .snapshots
            .iter()
            .rposition(|(s, _)| *s <= self.commit.min(self.delivered))
            .unwrap_or(0)
            .saturating_sub(1);
        self.snapshots.drain(..keep_from);
    }

    /// Membership as of entry `keep`, after a truncation.
    pub(crate) fn restore_membership(&mut self, keep: u64) {
        if self.members_seq <= keep {
            return;
        }
        while self.snapshots.last().is_some_and(|(s, _)| *s > keep) {
            self.snapshots.pop();
        }
        let n = self.snapshots.len();
        if n == 0 {
            return;
        }
        self.members = self.snapshots[n - 1].1.clone();
        self.members_seq = self.snapshots[n - 1].0;
        self.prev_members = if n >= 2 {
            self.snapshots[n - 2].1.clone()
        } else {
            self.members.clone()
        };
    }

    /// Membership as of entry `seq` (for a state transfer).
    pub(crate) fn members_at(&self, seq: u64) -> Vec<MemberEntry> {
        self.snapshots
            .iter()
            .rev()
            .find(|(s, _)| *s <= seq)
            .map(|(_, m)| m.clone())
            .unwrap_or_else(|| self.members.clone())
    }

    /// Takes in the sequencer's commit and stable points and the highest
    /// sequence number it has assigned.
    pub(crate) fn learn(&mut self, commit: u64, stable: u64, last: u64) {
        if self.seq.is_some() {
            return;
        }
        self.commit = self.commit.max(commit);
        self.stable = self.stable.max(stable);
        self.last_known = self.last_known.max(last).max(commit);
    }

    /// Is this member one of the r members that acknowledge tentative
    /// entries at once?  They are the r members after the sequencer in
    /// membership order.
    pub(crate) fn is_acker(&self) -> bool {
        let need = self.cfg.acks_needed(self.members.len());
        if need == 0 {
            return false;
        }
        let n = self.members.len();
        let Some(s) = self.members.iter().position(|m| m.id == self.sequencer) else {
            return true;
        };
        (1..=need).any(|k| self.members[(s + k) % n].id == self.me.id)
    }

    pub(crate) fn send_ack(&mut self, now: Time) {
        if self.seq.is_some() {
            return;
        }
        self.last_ack = now;
        let body = GroupBody::Ack(GAck { held: self.held });
        self.send_to(self.sequencer, body);
    }

    /// Asks for missing entries if there is a gap.
    pub(crate) fn check_gap(&mut self, now: Time, timer: bool) {
        if self.seq.is_some() || self.status != Status::Normal {
            return;
        }
        let missing = self.last_known > self.held || !self.accepted.is_empty();
        if !missing {
            return;
        }
        // Ask at once when the gap first shows, then once per interval.
        let interval = if timer {
            self.cfg.retransmit
        } else {
            self.cfg.retransmit / 4
        };
        let due = self
            .last_nack
            .is_none_or(|t| now.saturating_since(t) >= interval);
        if !due {
            return;
        }
        self.last_nack = Some(now);
        self.stats.nacks_sent += 1;
        let body = GroupBody::Nack(Nack {
            held: self.held,
            from: self.held + 1,
            to: self.last_known.max(self.held + 1),
        });
        self.send_to(self.sequencer, body);
    }

    fn on_nack(&mut self, now: Time, hdr: GroupHeader, n: &Nack) {
        if self.seq.is_none() {
            if self.status == Status::Normal && !self.is_member(hdr.from) {
                self.tell_not_member();
            }
            return;
        }
        if !self.is_member(hdr.from) {
            self.tell_not_member();
            return;
        }
        if hdr.inc != self.inc || hdr.seqr != self.me.id {
            // A member that missed the new incarnation: send its start.
            self.seq_resend_view(hdr.from);
            return;
        }
        self.seq_on_held(now, hdr, n.held);
        self.seq_retransmit(hdr.from, n.from, n.to);
    }

    /// Tells the sender of the datagram being handled that it is not a
    /// member of this incarnation.
    pub(crate) fn tell_not_member(&mut self) {
        self.tell_not_member_at(self.src);
    }

    pub(crate) fn tell_not_member_at(&mut self, addr: SocketAddr) {
        let hdr = self.hdr();
        self.emit(
            GroupDest::Addr(addr),
            hdr,
            GroupBody::NotMember(shoal_wire::group::NotMember {
                sequencer: self.sequencer,
            }),
        );
    }

    fn on_not_member(&mut self, _now: Time, hdr: GroupHeader) {
        // Only a later incarnation can expel us.
        if (hdr.inc, hdr.seqr) > (self.inc, self.sequencer)
            || (hdr.inc == self.inc && hdr.from == self.sequencer)
        {
            self.expelled();
        }
    }

    /// This member is out: fail what it had in flight and tell the
    /// application.
    pub(crate) fn expelled(&mut self) {
        if matches!(self.status, Status::Out | Status::Left) {
            return;
        }
        self.status = Status::Out;
        self.seq = None;
        self.coord = None;
        self.outgoing.clear();
        self.outgoing_bytes = 0;
        self.events.push_back(Event::Expelled);
    }

    /// Turns committed, held entries into events.
    pub(crate) fn deliver(&mut self) {
        let upto = self.commit.min(self.held);
        while self.delivered < upto {
            let seq = self.delivered + 1;
            self.delivered = seq;
            let Some(e) = self.log.get(&seq) else {
                // Covered by a state transfer.
                continue;
            };
            let e = e.clone();
            self.stats.delivered += 1;
            match e.kind {
                EntryKind::App => {
                    if e.sender == self.me.id {
                        self.complete_own(e.msg_id, seq);
                    }
                    self.events.push_back(Event::Message {
                        seq,
                        sender: e.sender,
                        msg_id: e.msg_id,
                        body: e.body,
                    });
                }
                EntryKind::Join => {
                    if let Ok(m) = decode_member(&e.body) {
                        self.events.push_back(Event::Joined { seq, member: m });
                        if self.seq.is_some() {
                            self.events
                                .push_back(Event::StateWanted { joiner: m.id });
                        }
                    }
                }
                EntryKind::Leave => {
                    if let Ok(bytes) = <[u8; 8]>::try_from(&e.body[..]) {
                        let id = MemberId(u64::from_le_bytes(bytes));
                        self.events.push_back(Event::Left { seq, member: id });
                        if id == self.me.id {
                            if self.leaving.is_none() {
                                // Expelled (silent, or holding the
                                // history back).
                                self.expelled();
                                return;
                            }
                            // A leaver stays until every member holds its
                            // leave (or a while): a reset may need its vote
                            // to learn that the leave is committed.
                            self.left_at = Some((seq, self.now));
                        }
                        if id == self.sequencer {
                            // The sequencer left: the first remaining
                            // member takes over at once.
                            if self.members.first().map(|m| m.id) == Some(self.me.id) {
                                self.start_recovery(self.now, FxHashSet::default(), None);
                            }
                        }
                    }
                }
                EntryKind::View => {
                    if let Ok(view) = decode_view(&e.body) {
                        self.events.push_back(Event::View {
                            seq,
                            inc: e.inc,
                            members: view.members,
                        });
                    }
                }
            }
        }
    }

    fn finish_leave(&mut self) {
        if self.status == Status::Left {
            return;
        }
        self.status = Status::Left;
        self.seq = None;
        self.coord = None;
        self.events.push_back(Event::LeftGroup);
    }

    /// This member's message `msg_id` was delivered: it and every earlier
    /// one of ours are ordered.
    fn complete_own(&mut self, msg_id: u64, seq: u64) {
        while let Some(p) = self.outgoing.front() {
            if p.msg_id > msg_id {
                break;
            }
            let p = self.outgoing.pop_front().expect("present");
            self.outgoing_bytes -= p.body.len();
            self.sent.push_back((p.msg_id, seq));
        }
    }

    /// Forgets entries every member holds and the application has seen.
    pub(crate) fn purge(&mut self) {
        let upto = self.stable.min(self.app_seq).min(self.delivered);
        while let Some((&seq, _)) = self.log.first_key_value() {
            if seq > upto {
                break;
            }
            let e = self.log.remove(&seq).expect("present");
            self.log_bytes -= e.body.len();
        }
    }

    /// Oldest sequence number still in the log (entries before it are gone).
    pub(crate) fn log_start(&self) -> u64 {
        self.log.first_key_value().map(|(s, _)| *s).unwrap_or(self.held + 1)
    }

    // ----- timers ----------------------------------------------------------

    pub fn handle_timeout(&mut self, now: Time) {
        self.now = now;
        if now < self.next_tick {
            return;
        }
        self.next_tick = now + self.cfg.tick;
        if let Some((seq, at)) = self.left_at
            && (self.stable >= seq || now.saturating_since(at) >= self.cfg.dead_after)
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
        let due: Vec<u64> = self
            .outgoing
            .iter()
            .filter(|p| all || now.saturating_since(p.last_sent) >= self.cfg.retransmit)
            .map(|p| p.msg_id)
            .collect();
        let mut exhausted = false;
        for msg_id in due {
            // Ordering one message may complete others: look it up again.
            let Some(i) = self.outgoing.iter().position(|p| p.msg_id == msg_id) else {
                continue;
            };
            if self.seq.is_none() && self.outgoing[i].tries >= self.cfg.send_retries {
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
        if let Some(since) = self.leaving
            && now.saturating_since(since) >= self.cfg.retransmit
        {
            self.leaving = Some(now);
            self.send_to(self.sequencer, GroupBody::Leave);
        }
        self.check_gap(now, true);
        if self.is_acker() && self.held > 0 && now.saturating_since(self.last_ack) >= self.cfg.heartbeat
            && self.commit < self.held
        {
            self.send_ack(now);
        }
        // A silent sequencer, or one that never orders our messages, is
        // suspected; members further down the list wait a little longer so
        // that one of them usually coordinates alone.
        let rank = self
            .members
            .iter()
            .position(|m| m.id == self.me.id)
            .unwrap_or(0) as u32;
        let patience = self.cfg.suspect_after + self.cfg.tick * (2 * rank);
        // Retries run out only against a silent sequencer: one that is
        // heard but does not order (its history is full) is waiting for a
        // laggard to be expelled.
        let exhausted =
            exhausted && now.saturating_since(self.heard_seq) >= self.cfg.retransmit * 2;
        if self.left_at.is_some() {
            return;
        }
        if exhausted || now.saturating_since(self.heard_seq) >= patience {
            let exclude = if self.is_member(self.sequencer) {
                [self.sequencer].into_iter().collect()
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
