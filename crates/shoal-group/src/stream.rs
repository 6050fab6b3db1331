//! Receiving the stream: BB bodies, entry fragments, holding entries
//! without gaps (and the membership changes they make), asking for what is
//! missing, delivering what is committed, and purging what every member
//! holds.

use std::net::SocketAddr;

use bytes::Bytes;
use rustc_hash::FxHashSet;
use shoal_proto::Time;
use shoal_wire::group::{
    Data, EntryKind, GAck, GroupBody, GroupHeader, MemberEntry, Nack, ORDER_ACCEPT, ORDER_FETCHED,
    ORDER_RETRANSMIT, ORDER_TENTATIVE, Order, decode_member, decode_view,
};
use shoal_wire::{GroupSeq, MemberId, MsgId};

use crate::assembly::Assembly;
use crate::core::{Entry, GroupCore, GroupDest, Status};
use crate::event::Event;

impl GroupCore {
    pub(crate) fn on_data(&mut self, now: Time, hdr: GroupHeader, d: &Data<'_>) {
        if d.bb && self.seq.is_none() {
            // A BB body: keep it until the sequencer's accept arrives.
            self.store_bb(hdr.from, d);
            return;
        }
        self.seq_on_data(now, hdr, d);
    }

    pub(crate) fn store_bb(&mut self, sender: MemberId, d: &Data<'_>) -> Option<Bytes> {
        let key = (sender, d.msg_id);
        if self
            .stream
            .senders
            .get(&sender)
            .is_some_and(|&last| d.msg_id <= last)
        {
            return None;
        }
        if let Some(done) = self.stream.bb_done.get(&key) {
            return Some(done.clone());
        }
        let bb_bytes: usize = self.stream.bb.values().map(|a| a.total()).sum::<usize>()
            + self.stream.bb_done.values().map(|b| b.len()).sum::<usize>();
        if !self.stream.bb.contains_key(&key)
            && bb_bytes.saturating_add(d.total_len as usize) > self.cfg.history_bytes
        {
            // Bodies whose accept never came (their sender's message was
            // lost in a reset) make room; the sequencer has the others.
            self.stream.bb.clear();
            self.stream.bb_done.clear();
            if d.total_len as usize > self.cfg.history_bytes {
                return None;
            }
        }
        let asm = match self.stream.bb.entry(key) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(Assembly::new(
                d.total_len,
                d.frag.count,
                self.cfg.history_bytes,
            )?),
        };
        if !asm.add(d.total_len, d.frag.count, d.frag.index, d.payload) {
            return None;
        }
        if asm.is_complete() {
            let body = self.stream.bb.remove(&key).expect("present").finish();
            self.stream.bb_done.insert(key, body.clone());
            // A body whose accept came first completes that entry now.
            let waiting = self
                .stream
                .accepted
                .iter()
                .find(|(_, e)| e.sender == sender && e.msg_id == d.msg_id)
                .map(|(s, _)| *s);
            if let Some(seq) = waiting {
                let mut e = self.stream.accepted.remove(&seq).expect("present");
                e.body = body.clone();
                self.stream.bb_done.remove(&key);
                self.place(seq, e);
                self.after_hold(self.now);
            }
            return Some(body);
        }
        None
    }

    pub(crate) fn on_order(&mut self, now: Time, hdr: GroupHeader, o: &Order<'_>) {
        if o.flags & ORDER_FETCHED != 0 {
            self.coord_on_fetched(now, hdr, o);
            return;
        }
        if o.kind == EntryKind::View
            && o.entry_inc == hdr.inc
            && (hdr.inc, hdr.from) > (self.view.inc, self.view.sequencer)
        {
            self.on_install(now, hdr, o);
            return;
        }
        if hdr.inc != self.view.inc
            || hdr.from != self.view.sequencer
            || self.status != Status::Normal
        {
            return;
        }
        self.learn(o.commit, o.stable, o.seq);
        self.heard_held(hdr, o.seq);
        if o.seq > self.stream.held {
            let entry = Entry {
                inc: o.entry_inc,
                sender: o.sender,
                msg_id: o.msg_id,
                kind: o.kind,
                body: Bytes::new(),
            };
            if o.flags & ORDER_ACCEPT != 0 {
                let key = (o.sender, o.msg_id);
                if let Some(body) = self.stream.bb_done.remove(&key) {
                    if body.len() as u64 == o.total_len {
                        self.place(o.seq, Entry { body, ..entry });
                    }
                } else if !self.stream.log.contains_key(&o.seq) {
                    self.stream.accepted.insert(o.seq, entry);
                }
            } else {
                self.take_entry(o);
            }
        }
        let retransmit = o.flags & ORDER_RETRANSMIT != 0;
        self.after_hold(now);
        if retransmit {
            self.send_ack(now);
        } else if o.flags & ORDER_TENTATIVE != 0 && self.is_acker() {
            self.ack_tentative(now, o.sender);
        }
        self.check_gap(now, false);
        self.member_commit();
        self.deliver();
    }

    /// Takes in an entry carried whole (one fragment) or one fragment of it.
    pub(crate) fn take_entry(&mut self, o: &Order<'_>) {
        if o.seq <= self.stream.held || self.stream.log.contains_key(&o.seq) {
            return;
        }
        if o.frag.count > 1 {
            self.add_fragment(o);
        } else if o.total_len == o.payload.len() as u64 {
            let e = crate::core::entry_from_order(o, Bytes::copy_from_slice(o.payload));
            self.place(o.seq, e);
        }
    }

    fn add_fragment(&mut self, o: &Order<'_>) {
        if self.stream.log_bytes.saturating_add(o.total_len as usize) > 2 * self.cfg.history_bytes
            && o.seq > self.stream.held.next()
        {
            return;
        }
        let slot = match self.stream.partial.entry(o.seq) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let Some(asm) = Assembly::new(o.total_len, o.frag.count, self.cfg.history_bytes)
                else {
                    return;
                };
                let head = Order {
                    payload: &[],
                    ..o.clone()
                };
                v.insert((head, asm))
            }
        };
        slot.1
            .add(o.total_len, o.frag.count, o.frag.index, o.payload);
        if slot.1.is_complete() {
            let (head, asm) = self.stream.partial.remove(&o.seq).expect("present");
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
    pub(crate) fn place(&mut self, seq: GroupSeq, entry: Entry) {
        if seq <= self.stream.held || self.stream.log.contains_key(&seq) {
            return;
        }
        if self.stream.log_bytes + entry.body.len() > 2 * self.cfg.history_bytes
            && seq > self.stream.held.next()
        {
            return;
        }
        self.stream.accepted.remove(&seq);
        self.stream.partial.remove(&seq);
        self.stream.log_bytes += entry.body.len();
        self.stream.log.insert(seq, entry);
    }

    /// Advances `held` over contiguous entries, applying membership changes
    /// and sender numbers as it goes.
    pub(crate) fn after_hold(&mut self, now: Time) {
        let before = self.stream.held;
        while let Some(e) = self.stream.log.get(&(self.stream.held.next())) {
            let seq = self.stream.held.next();
            let (sender, msg_id, kind) = (e.sender, e.msg_id, e.kind);
            let body = e.body.clone();
            self.stream.held = seq;
            self.pacing.bytes_since_ack += body.len();
            if kind == EntryKind::App {
                let last = self.stream.senders.entry(sender).or_insert(MsgId(0));
                *last = (*last).max(msg_id);
                self.stream.bb_done.remove(&(sender, msg_id));
                self.stream.bb.remove(&(sender, msg_id));
                if let Some(s) = self.seq.as_mut() {
                    s.bb.remove(&(sender, msg_id));
                }
            }
            if seq > self.view.members_seq {
                self.apply_membership(seq, kind, &body);
            }
        }
        if self.stream.held > before {
            // Many bytes held since we last said so: say it now, so the
            // sequencer's history does not fill up waiting for us.
            if self.seq.is_none()
                && self.status == Status::Normal
                && self.pacing.bytes_since_ack >= self.cfg.history_bytes / 8
            {
                self.send_ack(now);
            }
            self.stream.last_known = self.stream.last_known.max(self.stream.held);
            if let Some(s) = self.seq.as_mut() {
                s.next = s.next.max(self.stream.held.next());
            }
            self.seq_after_hold(now);
        }
    }

    pub(crate) fn apply_membership(&mut self, seq: GroupSeq, kind: EntryKind, body: &[u8]) {
        match kind {
            EntryKind::App => return,
            EntryKind::Join => {
                let Ok(m) = decode_member(body) else { return };
                if self.is_member(m.id) {
                    return;
                }
                self.view.prev_members = self.view.members.clone();
                self.view.members.push(m);
            }
            EntryKind::Leave => {
                let Ok(bytes) = <[u8; 8]>::try_from(body) else {
                    return;
                };
                let id = MemberId(u64::from_le_bytes(bytes));
                if !self.is_member(id) {
                    return;
                }
                self.view.prev_members = self.view.members.clone();
                self.view.members.retain(|m| m.id != id);
            }
            EntryKind::View => {
                let Ok(view) = decode_view(body) else {
                    return;
                };
                let list = view.members;
                self.view.prev_members = list.clone();
                self.view.members = list;
            }
        }
        self.view.members_seq = seq;
        let members = &self.view.members;
        self.stream
            .peer_held
            .retain(|id, _| members.iter().any(|m| m.id == *id));
        self.view.snapshots.push((seq, self.view.members.clone()));
        // Keep the changes a truncation could undo, and two before them.
        let keep_from = self
            .view
            .snapshots
            .iter()
            .rposition(|(s, _)| *s <= self.stream.commit.min(self.stream.delivered))
            .unwrap_or(0)
            .saturating_sub(1);
        self.view.snapshots.drain(..keep_from);
    }

    /// Membership as of entry `keep`, after a truncation.
    pub(crate) fn restore_membership(&mut self, keep: GroupSeq) {
        if self.view.members_seq <= keep {
            return;
        }
        while self.view.snapshots.last().is_some_and(|(s, _)| *s > keep) {
            self.view.snapshots.pop();
        }
        let n = self.view.snapshots.len();
        if n == 0 {
            return;
        }
        self.view.members = self.view.snapshots[n - 1].1.clone();
        self.view.members_seq = self.view.snapshots[n - 1].0;
        self.view.prev_members = if n >= 2 {
            self.view.snapshots[n - 2].1.clone()
        } else {
            self.view.members.clone()
        };
    }

    /// Membership as of entry `seq` (for a state transfer).
    pub(crate) fn members_at(&self, seq: GroupSeq) -> Vec<MemberEntry> {
        self.view
            .snapshots
            .iter()
            .rev()
            .find(|(s, _)| *s <= seq)
            .map(|(_, m)| m.clone())
            .unwrap_or_else(|| self.view.members.clone())
    }

    /// Takes in the sequencer's commit and stable points and the highest
    /// sequence number it has assigned.
    pub(crate) fn learn(&mut self, commit: GroupSeq, stable: GroupSeq, last: GroupSeq) {
        if self.seq.is_some() {
            return;
        }
        self.stream.commit = self.stream.commit.max(commit);
        self.stream.stable = self.stream.stable.max(stable);
        self.stream.last_known = self.stream.last_known.max(last).max(commit);
    }

    /// Is this member one of the r members that acknowledge tentative
    /// entries at once?  They are the r members after the sequencer in
    /// membership order.
    pub(crate) fn is_acker(&self) -> bool {
        let need = self.cfg.acks_needed(self.view.members.len());
        if need == 0 {
            return false;
        }
        let n = self.view.members.len();
        let Some(s) = self
            .view
            .members
            .iter()
            .position(|m| m.id == self.view.sequencer)
        else {
            return true;
        };
        (1..=need).any(|k| self.view.members[(s + k) % n].id == self.me.id)
    }

    /// Tells the sequencer how far this member holds the stream.
    pub(crate) fn send_ack(&mut self, now: Time) {
        self.ack(now, false);
    }

    /// Sends how far this member holds the stream: to the sequencer, or to
    /// every member.
    fn ack(&mut self, now: Time, everyone: bool) {
        if self.seq.is_some() {
            return;
        }
        self.pacing.last_ack = now;
        self.pacing.acked_held = self.stream.held;
        self.pacing.bytes_since_ack = 0;
        let body = GroupBody::Ack(GAck {
            held: self.stream.held,
        });
        if everyone {
            self.broadcast(body);
        } else {
            self.send_to(self.view.sequencer, body);
        }
    }

    /// An acknowledger's answer to a tentative entry from `sender`.  If
    /// another member sent it, the ack goes to every member, so that the
    /// sender (waiting for its message to commit) and the others count who
    /// holds it and know the commit point without waiting for the
    /// sequencer's accept.  The sequencer's own messages need no more than
    /// the sequencer hearing the ack.
    fn ack_tentative(&mut self, now: Time, sender: MemberId) {
        self.ack(now, sender != self.view.sequencer && sender != self.me.id);
    }

    /// Records that `hdr.from` holds the stream up to `held`, if it said
    /// so as a member of this member's incarnation.
    pub(crate) fn heard_held(&mut self, hdr: GroupHeader, held: GroupSeq) {
        if hdr.inc != self.view.inc || hdr.seqr != self.view.sequencer {
            return;
        }
        let slot =
            self.stream
                .peer_held
                .entry(hdr.from)
                .or_insert((hdr.inc, hdr.seqr, GroupSeq(0)));
        if (slot.0, slot.1) != (hdr.inc, hdr.seqr) {
            *slot = (hdr.inc, hdr.seqr, GroupSeq(0));
        }
        slot.2 = slot.2.max(held);
    }

    /// Another member's ack, multicast by an acknowledger.
    pub(crate) fn member_on_held(&mut self, hdr: GroupHeader, held: GroupSeq) {
        if self.status != Status::Normal
            || hdr.from == self.view.sequencer
            || !self.is_member(hdr.from)
        {
            return;
        }
        self.heard_held(hdr, held);
        self.member_commit();
        self.deliver();
    }

    /// Moves the commit point as the sequencer would: an entry is
    /// committed once r + 1 members hold it, counting this member, the
    /// sequencer (which holds what it ordered) and the members whose acks
    /// were heard in this incarnation.  Only while no membership change
    /// waits for its commit: then the sequencer counts the members before
    /// and after it, and its accept says the outcome.
    pub(crate) fn member_commit(&mut self) {
        if self.seq.is_some()
            || self.status != Status::Normal
            || self.view.members_seq > self.stream.commit
        {
            return;
        }
        let need = self.cfg.acks_needed(self.view.members.len());
        if need == 0 {
            return;
        }
        let incarnation = (self.view.inc, self.view.sequencer);
        let helds: Vec<GroupSeq> = self
            .view
            .members
            .iter()
            .filter(|m| m.id != self.me.id)
            .map(|m| match self.stream.peer_held.get(&m.id) {
                Some(&(inc, seqr, held)) if (inc, seqr) == incarnation => held,
                _ => GroupSeq(0),
            })
            .collect();
        if let Some(commit) = held_by(helds, need, self.stream.held)
            && commit > self.stream.commit
        {
            self.stream.commit = commit;
            self.stream.last_known = self.stream.last_known.max(commit);
        }
    }

    /// Asks for missing entries if there is a gap.
    pub(crate) fn check_gap(&mut self, now: Time, timer: bool) {
        if self.seq.is_some() || self.status != Status::Normal {
            return;
        }
        let missing = self.stream.last_known > self.stream.held || !self.stream.accepted.is_empty();
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
            .pacing
            .last_nack
            .is_none_or(|t| now.saturating_since(t) >= interval);
        if !due {
            return;
        }
        self.pacing.last_nack = Some(now);
        self.stats.nacks_sent += 1;
        let body = GroupBody::Nack(Nack {
            held: self.stream.held,
            from: self.stream.held.next(),
            to: self.stream.last_known.max(self.stream.held.next()),
        });
        self.send_to(self.view.sequencer, body);
    }

    pub(crate) fn on_nack(&mut self, now: Time, hdr: GroupHeader, n: &Nack) {
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
        if hdr.inc != self.view.inc || hdr.seqr != self.me.id {
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
                sequencer: self.view.sequencer,
            }),
        );
    }

    pub(crate) fn on_not_member(&mut self, _now: Time, hdr: GroupHeader) {
        // Only a later incarnation can expel us.
        if (hdr.inc, hdr.seqr) > (self.view.inc, self.view.sequencer)
            || (hdr.inc == self.view.inc && hdr.from == self.view.sequencer)
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
        self.recovery.coord = None;
        self.outbox.outgoing.clear();
        self.outbox.outgoing_bytes = 0;
        self.out.events.push_back(Event::Expelled);
    }

    /// Turns committed, held entries into events.
    pub(crate) fn deliver(&mut self) {
        let upto = self.stream.commit.min(self.stream.held);
        while self.stream.delivered < upto {
            let seq = self.stream.delivered.next();
            self.stream.delivered = seq;
            let Some(e) = self.stream.log.get(&seq) else {
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
                    self.out.events.push_back(Event::Message {
                        seq,
                        sender: e.sender,
                        msg_id: e.msg_id,
                        body: e.body,
                    });
                }
                EntryKind::Join => {
                    if let Ok(m) = decode_member(&e.body) {
                        self.out.events.push_back(Event::Joined { seq, member: m });
                        if self.seq.is_some() {
                            self.out
                                .events
                                .push_back(Event::StateWanted { joiner: m.id });
                        }
                    }
                }
                EntryKind::Leave => {
                    if let Ok(bytes) = <[u8; 8]>::try_from(&e.body[..]) {
                        let id = MemberId(u64::from_le_bytes(bytes));
                        self.out.events.push_back(Event::Left { seq, member: id });
                        if id == self.me.id {
                            if self.lifecycle.leaving.is_none() {
                                // Expelled (silent, or holding the
                                // history back).
                                self.expelled();
                                return;
                            }
                            // A leaver stays until every member holds its
                            // leave (or a while): a reset may need its vote
                            // to learn that the leave is committed.
                            self.lifecycle.left_at = Some((seq, self.now));
                        }
                        if id == self.view.sequencer {
                            // The sequencer left: the first remaining
                            // member takes over at once.
                            if self.view.members.first().map(|m| m.id) == Some(self.me.id) {
                                self.start_recovery(self.now, FxHashSet::default(), None);
                            }
                        }
                    }
                }
                EntryKind::View => {
                    if let Ok(view) = decode_view(&e.body) {
                        self.out.events.push_back(Event::View {
                            seq,
                            inc: e.inc,
                            members: view.members,
                        });
                    }
                }
            }
        }
    }

    pub(crate) fn finish_leave(&mut self) {
        if self.status == Status::Left {
            return;
        }
        self.status = Status::Left;
        self.seq = None;
        self.recovery.coord = None;
        self.out.events.push_back(Event::LeftGroup);
    }

    /// This member's message `msg_id` was delivered: it and every earlier
    /// one of ours are ordered.
    pub(crate) fn complete_own(&mut self, msg_id: MsgId, seq: GroupSeq) {
        while let Some(p) = self.outbox.outgoing.front() {
            if p.msg_id > msg_id {
                break;
            }
            let p = self.outbox.outgoing.pop_front().expect("present");
            self.outbox.outgoing_bytes -= p.body.len();
            self.outbox.sent.push_back((p.msg_id, seq));
        }
    }

    /// Forgets entries every member holds and the application has seen.
    pub(crate) fn purge(&mut self) {
        let upto = self
            .stream
            .stable
            .min(self.stream.app_seq)
            .min(self.stream.delivered);
        while let Some((&seq, _)) = self.stream.log.first_key_value() {
            if seq > upto {
                break;
            }
            let e = self.stream.log.remove(&seq).expect("present");
            self.stream.log_bytes -= e.body.len();
        }
    }

    /// Oldest sequence number still in the log (entries before it are gone).
    pub(crate) fn log_start(&self) -> GroupSeq {
        self.stream
            .log
            .first_key_value()
            .map(|(s, _)| *s)
            .unwrap_or(self.stream.held.next())
    }
}

/// How far the stream is held by this member (which holds up to `own`)
/// and `need` of the others, whose holds are `helds`; `None` if fewer
/// than `need` others are known.
pub(crate) fn held_by(mut helds: Vec<GroupSeq>, need: usize, own: GroupSeq) -> Option<GroupSeq> {
    if need == 0 {
        return Some(own);
    }
    if helds.len() < need {
        return None;
    }
    helds.sort_unstable_by(|a, b| b.cmp(a));
    Some(helds[need - 1].min(own))
}
