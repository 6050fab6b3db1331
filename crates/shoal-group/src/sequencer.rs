//! The sequencer's duties: stamp messages with the next sequence number
//! and broadcast them (PB) or a short accept (BB); with resilience r, wait
//! for r members to hold an entry before committing it; keep the history
//! and retransmit from it; purge what every member holds; order joins and
//! leaves one at a time; notice dead and lagging members.

use std::collections::VecDeque;

use bytes::Bytes;
use rustc_hash::FxHashMap;
use shoal_proto::Time;
use shoal_wire::group::{
    Data, EntryKind, GroupBody, GroupHeader, MemberEntry, ORDER_ACCEPT, ORDER_RETRANSMIT,
    ORDER_TENTATIVE, Sync, encode_member,
};
use shoal_wire::{GroupSeq, Incarnation, MemberId, MsgId};

use crate::assembly::Assembly;
use crate::core::{Entry, GroupCore, GroupDest, Status};
use crate::stream::held_by;

/// What the sequencer knows of one member.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MemberHeld {
    /// Highest entry the member holds without a gap, in this incarnation.
    pub held: GroupSeq,
    /// Last datagram from it.
    pub heard: Time,
    /// It acknowledged in this incarnation (a joiner that has not yet
    /// received its state, or a member that missed the install, has not).
    pub acked: bool,
}

/// Sequencer state.
#[derive(Debug)]
pub(crate) struct Sequencer {
    /// Next sequence number to assign.
    pub next: GroupSeq,
    /// Sequence number of this incarnation's view entry.
    pub view_seq: GroupSeq,
    pub members: FxHashMap<MemberId, MemberHeld>,
    /// Joins and leaves waiting for the previous membership change to commit.
    pub changes: VecDeque<Change>,
    /// BB bodies being received from their senders.
    pub bb: FxHashMap<(MemberId, MsgId), Assembly>,
    pub last_broadcast: Time,
    /// Last status request.
    pub last_status: Time,
    /// When the last membership change was ordered.
    pub change_since: Time,
    /// Since when the history has been full.
    pub full_since: Option<Time>,
    /// When the commit point's broadcast held back for the next entry is
    /// due on its own (`GroupConfig::accept_delay`).
    pub accept_due: Option<Time>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    Join(MemberEntry),
    Leave(MemberId),
}

impl Sequencer {
    pub(crate) fn new(
        now: Time,
        next: GroupSeq,
        view_seq: GroupSeq,
        members: &[MemberEntry],
    ) -> Self {
        Self {
            next,
            view_seq,
            members: members
                .iter()
                .map(|m| {
                    (
                        m.id,
                        MemberHeld {
                            held: GroupSeq(0),
                            heard: now,
                            acked: false,
                        },
                    )
                })
                .collect(),
            changes: VecDeque::new(),
            bb: FxHashMap::default(),
            last_broadcast: now,
            last_status: now,
            change_since: now,
            full_since: None,
            accept_due: None,
        }
    }
}

impl GroupCore {
    /// A member's message fragment reached the sequencer.
    pub(crate) fn seq_on_data(&mut self, now: Time, hdr: GroupHeader, d: &Data<'_>) {
        if self.seq.is_none() {
            return;
        }
        if !self.is_member(hdr.from) {
            self.tell_not_member();
            return;
        }
        if hdr.inc == self.view.inc && hdr.seqr == self.me.id {
            self.seq_on_held(now, hdr, d.held);
        } else if let Some(m) = self.seq.as_mut().and_then(|s| s.members.get_mut(&hdr.from)) {
            m.heard = now;
        }
        let body = if d.frag.count == 1 {
            if d.total_len != d.payload.len() as u64 {
                return;
            }
            Bytes::copy_from_slice(d.payload)
        } else {
            let key = (hdr.from, d.msg_id);
            let history = self.cfg.history_bytes;
            let s = self.seq.as_mut().expect("sequencer");
            let pending: usize = s.bb.values().map(|a| a.total()).sum();
            if !s.bb.contains_key(&key) && pending.saturating_add(d.total_len as usize) > history {
                // Partial bodies that stopped arriving make room (their
                // senders send them again).
                s.bb.clear();
                if d.total_len as usize > history {
                    return;
                }
            }
            let asm = match s.bb.entry(key) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let Some(a) = Assembly::new(d.total_len, d.frag.count, history) else {
                        return;
                    };
                    v.insert(a)
                }
            };
            if !asm.add(d.total_len, d.frag.count, d.frag.index, d.payload) || !asm.is_complete() {
                return;
            }
            s.bb.remove(&key).expect("present").finish()
        };
        self.seq_accept_data(now, hdr.from, d.msg_id, body, d.bb);
    }

    /// Orders a complete message, if it is the sender's next one and there
    /// is room.
    pub(crate) fn seq_accept_data(
        &mut self,
        now: Time,
        sender: MemberId,
        msg_id: MsgId,
        body: Bytes,
        bb: bool,
    ) {
        let last = self
            .stream
            .senders
            .get(&sender)
            .copied()
            .unwrap_or(MsgId(0));
        if msg_id <= last {
            // Already ordered: tell the sender how far the stream goes, so
            // it asks for what it missed.
            if sender != self.me.id {
                let sync = self.sync_body(false);
                self.send_to(sender, sync);
            }
            return;
        }
        if msg_id != last.next() || self.lifecycle.left_at.is_some() {
            return;
        }
        if self.stream.log_bytes + body.len() > self.cfg.history_bytes {
            let s = self.seq.as_mut().expect("sequencer");
            s.full_since.get_or_insert(now);
            return;
        }
        let entry = Entry {
            inc: self.view.inc,
            sender,
            msg_id,
            kind: EntryKind::App,
            body,
        };
        self.seq_order(now, entry, bb);
    }

    /// A membership change is ordered but not committed: no other change
    /// is ordered until it is, so that a reset sees at most one.
    pub(crate) fn change_pending(&self) -> bool {
        self.view.members_seq > self.stream.commit
    }

    /// Stamps `entry` with the next sequence number and broadcasts it.
    pub(crate) fn seq_order(&mut self, now: Time, entry: Entry, bb: bool) {
        let seq = self.seq.as_ref().expect("sequencer").next;
        debug_assert_eq!(seq, self.stream.held.next());
        let need = self.cfg.acks_needed(self.view.members.len());
        let kind = entry.kind;
        // Holding the entry may commit others and deliver them; nothing is
        // ordered in between (see `try_change`).
        self.ordering = true;
        self.place(seq, entry.clone());
        self.after_hold(now);
        self.ordering = false;
        assert_eq!(
            self.stream.held, seq,
            "the sequencer holds every entry it orders"
        );
        if kind == EntryKind::Join
            && let Ok(m) = shoal_wire::group::decode_member(&entry.body)
        {
            let s = self.seq.as_mut().expect("sequencer");
            s.members.insert(
                m.id,
                MemberHeld {
                    held: seq,
                    heard: now,
                    acked: false,
                },
            );
            // A state made for an earlier admission of the same member
            // (expelled before it arrived) is not for this one.
            self.lifecycle.state_out.remove(&m.id);
        }
        if need == 0 {
            self.stream.commit = seq;
        }
        let mut flags = if need > 0 { ORDER_TENTATIVE } else { 0 };
        if bb {
            flags |= ORDER_ACCEPT;
        }
        self.emit_entry(
            GroupDest::Members,
            seq,
            &entry,
            flags,
            (self.view.inc, self.view.sequencer),
        );
        if let Some(s) = self.seq.as_mut() {
            s.last_broadcast = now;
        }
        self.seq_recompute(now);
        self.deliver();
        self.try_change(now);
    }

    /// The sequencer's own hold advanced (it orders, or a new incarnation
    /// starts).
    pub(crate) fn seq_after_hold(&mut self, now: Time) {
        if self.seq.is_some() {
            self.seq_recompute(now);
        }
    }

    /// A member reported how far it holds the stream.
    pub(crate) fn seq_on_held(&mut self, now: Time, hdr: GroupHeader, held: GroupSeq) {
        let inc = self.view.inc;
        let Some(s) = self.seq.as_mut() else { return };
        let Some(m) = s.members.get_mut(&hdr.from) else {
            if !self.is_member(hdr.from) {
                self.tell_not_member();
            }
            return;
        };
        m.heard = now;
        if hdr.inc != inc || hdr.seqr != self.me.id {
            return;
        }
        let first = !m.acked;
        // A joiner's first ack replaces the placeholder (its join); its
        // state may be from before the join.
        m.held = if first {
            held.min(self.stream.held)
        } else {
            m.held.max(held.min(self.stream.held))
        };
        m.acked = true;
        if first {
            self.state_done(hdr.from);
        }
        self.seq_recompute(now);
        self.try_change(now);
    }

    /// Recomputes the commit and stable points; broadcasts an accept when
    /// the commit point moved.
    fn seq_recompute(&mut self, now: Time) {
        // While a membership change is not committed, entries are committed
        // by the members before and after it: a joiner cannot hold anything
        // before its state arrives (which needs the join committed), and a
        // leaver's copy must not count, for it will not vote in a reset.
        let both: Vec<MemberEntry>;
        let voters = if self.change_pending() {
            both = self
                .view
                .members
                .iter()
                .filter(|m| self.view.prev_members.iter().any(|p| p.id == m.id))
                .copied()
                .collect();
            &both
        } else {
            &self.view.members
        };
        let need = self.cfg.acks_needed(voters.len());
        let Some(s) = self.seq.as_ref() else { return };
        let helds: Vec<GroupSeq> = voters
            .iter()
            .filter(|m| m.id != self.me.id)
            .filter_map(|m| s.members.get(&m.id))
            .filter(|h| h.acked)
            .map(|h| h.held)
            .collect();
        let commit = held_by(helds, need, self.stream.held).unwrap_or(self.stream.commit);
        let stable = self
            .view
            .members
            .iter()
            .filter(|m| m.id != self.me.id)
            .map(|m| s.members.get(&m.id).map(|h| h.held).unwrap_or(GroupSeq(0)))
            .min()
            .unwrap_or(self.stream.held)
            .min(self.stream.held);
        let moved = commit > self.stream.commit;
        // Only application messages committed: each one's sender knows,
        // either this process (`poll_sent`) or a member that heard the
        // acks, which go to every member when another member sent the
        // message (`member_commit`).  The next entry's broadcast carries
        // the commit point to the others, so it need not go out now, ahead
        // of whatever the sequencer's process does next (a directory's
        // answer to its client, for one).  A membership change's commit
        // goes at once: members do not count acks across one.
        let held_back = moved
            && !self.cfg.accept_delay.is_zero()
            && self.stream.commit.next().through(commit).all(|q| {
                self.stream
                    .log
                    .get(&q)
                    .is_some_and(|e| e.kind == EntryKind::App)
            });
        self.stream.commit = self.stream.commit.max(commit);
        self.stream.stable = self.stream.stable.max(stable);
        if moved && need > 0 {
            if held_back {
                let due = now + self.cfg.accept_delay;
                let s = self.seq.as_mut().expect("sequencer");
                s.accept_due.get_or_insert(due);
            } else {
                self.broadcast_commit(now);
            }
        }
        if moved {
            self.deliver();
            self.try_change(now);
        }
        self.purge();
        if self.stream.log_bytes < self.cfg.history_bytes
            && let Some(s) = self.seq.as_mut()
        {
            s.full_since = None;
        }
    }

    /// Broadcasts the commit point (an accept).
    fn broadcast_commit(&mut self, now: Time) {
        let sync = self.sync_body(false);
        self.broadcast(sync);
        if let Some(s) = self.seq.as_mut() {
            s.last_broadcast = now;
        }
    }

    /// Broadcasts the commit point held back for the next entry, if no
    /// entry came within `accept_delay`.
    pub(crate) fn seq_accept_due(&mut self, now: Time) {
        if self.held_accept_due().is_some_and(|due| due <= now) {
            self.broadcast_commit(now);
        }
    }

    /// When the commit point held back for the next entry goes out on its
    /// own, if one is held back and the group works normally.
    pub(crate) fn held_accept_due(&self) -> Option<Time> {
        self.seq
            .as_ref()
            .and_then(|s| s.accept_due)
            .filter(|_| self.status == Status::Normal)
    }

    pub(crate) fn sync_body(&self, want_status: bool) -> GroupBody<'static> {
        GroupBody::Sync(Sync {
            last: self.stream.held,
            commit: self.stream.commit,
            stable: self.stream.stable,
            want_status,
        })
    }

    /// Retransmits entries `from..=to` to `member`.
    pub(crate) fn seq_retransmit(&mut self, member: MemberId, from: GroupSeq, to: GroupSeq) {
        let Some(addr) = self.addr_of(member) else {
            return;
        };
        // A nack overtaken by a later ack may ask for entries the member
        // has and we purged.
        let known = self
            .seq
            .as_ref()
            .and_then(|s| s.members.get(&member))
            .filter(|h| h.acked)
            .map_or(GroupSeq(0), |h| h.held);
        let start = self.log_start();
        let from = if from < start && known.next() >= start {
            start
        } else {
            from
        };
        if from < start && from <= self.stream.held {
            // Gone from history: the member must join again for a state.
            self.tell_not_member_at(addr);
            return;
        }
        let mut budget = 4 * self.cfg.frag_bytes.max(64 * 1024);
        for seq in from.through(to.min(self.stream.held)) {
            let Some(e) = self.stream.log.get(&seq).cloned() else {
                continue;
            };
            let mut flags = ORDER_RETRANSMIT;
            if seq > self.stream.commit {
                flags |= ORDER_TENTATIVE;
            }
            self.stats.retransmissions += 1;
            self.emit_entry(
                GroupDest::Addr(addr),
                seq,
                &e,
                flags,
                (self.view.inc, self.view.sequencer),
            );
            budget = budget.saturating_sub(e.body.len() + 64);
            if budget == 0 {
                break;
            }
        }
    }

    /// Sends this incarnation's view entry to a member that missed it.
    pub(crate) fn seq_resend_view(&mut self, member: MemberId) {
        let Some(view_seq) = self.seq.as_ref().map(|s| s.view_seq) else {
            return;
        };
        let Some(addr) = self.addr_of(member) else {
            return;
        };
        if !self.is_member(member) {
            self.tell_not_member_at(addr);
            return;
        }
        if let Some(e) = self.stream.log.get(&view_seq).cloned() {
            let flags = if view_seq > self.stream.commit {
                ORDER_TENTATIVE | ORDER_RETRANSMIT
            } else {
                ORDER_RETRANSMIT
            };
            self.emit_entry(
                GroupDest::Addr(addr),
                view_seq,
                &e,
                flags,
                (self.view.inc, self.view.sequencer),
            );
        }
    }

    /// A member asked to leave.
    pub(crate) fn seq_on_leave(&mut self, now: Time, hdr: GroupHeader) {
        if self.seq.is_none() || !self.is_member(hdr.from) {
            return;
        }
        self.queue_change(now, Change::Leave(hdr.from));
    }

    pub(crate) fn queue_change(&mut self, now: Time, change: Change) {
        let s = self.seq.as_mut().expect("sequencer");
        if !s.changes.contains(&change) {
            s.changes.push_back(change);
        }
        self.try_change(now);
    }

    /// Orders the next queued join or leave, once everything before is
    /// committed.
    pub(crate) fn try_change(&mut self, now: Time) {
        if self.seq.is_none()
            || self.ordering
            || self.change_pending()
            || self.lifecycle.left_at.is_some()
        {
            return;
        }
        loop {
            let Some(change) = self.seq.as_mut().expect("sequencer").changes.pop_front() else {
                return;
            };
            let (kind, body) = match change {
                Change::Join(m) => {
                    if self.is_member(m.id) {
                        continue;
                    }
                    // Admit nobody while a member is silent: its join
                    // would wait for that member's acknowledgement, and a
                    // reset then would need a quorum of a membership that
                    // counts both the silent member and the joiner (two
                    // dead, if the joiner dies too).  The silent member is
                    // expelled first; the join waits in the queue.
                    if self.member_silent(now) {
                        let changes = &mut self.seq.as_mut().expect("sequencer").changes;
                        changes.push_front(Change::Join(m));
                        // Leaves (expulsions) go first.
                        match changes.iter().position(|c| matches!(c, Change::Leave(_))) {
                            Some(i) => {
                                let leave = changes.remove(i).expect("found");
                                changes.push_front(leave);
                                continue;
                            }
                            None => return,
                        }
                    }
                    let mut body = Vec::new();
                    encode_member(&m, &mut body);
                    (EntryKind::Join, body)
                }
                Change::Leave(id) => {
                    if !self.is_member(id) {
                        continue;
                    }
                    (EntryKind::Leave, id.0.to_le_bytes().to_vec())
                }
            };
            let entry = Entry {
                inc: self.view.inc,
                sender: self.me.id,
                msg_id: MsgId(0),
                kind,
                body: Bytes::from(body),
            };
            self.seq.as_mut().expect("sequencer").change_since = now;
            self.seq_order(now, entry, false);
            return;
        }
    }

    pub(crate) fn seq_tick(&mut self, now: Time) {
        // Our own messages wait when the history is full or a membership
        // change is pending; try them again.
        self.retransmit_due(now, false);
        if self.seq.is_none() {
            return;
        }
        if let Some(since) = self.lifecycle.leaving
            && now.saturating_since(since) >= self.cfg.retransmit
        {
            self.lifecycle.leaving = Some(now);
            self.queue_change(now, Change::Leave(self.me.id));
        }
        self.try_change(now);
        let hb = self.cfg.heartbeat;
        let (quiet, lagging, unheard, unacked, dead, blocker) = {
            let s = self.seq.as_ref().expect("sequencer");
            let quiet = now.saturating_since(s.last_broadcast) >= hb;
            let mut lagging = false;
            let mut unheard = false;
            let mut unacked = Vec::new();
            let mut dead = Vec::new();
            let mut blocker: Option<(GroupSeq, MemberId)> = None;
            for m in &self.view.members {
                if m.id == self.me.id {
                    continue;
                }
                let Some(h) = s.members.get(&m.id) else {
                    continue;
                };
                if h.held < self.stream.held {
                    lagging = true;
                }
                if now.saturating_since(h.heard) >= 2 * hb {
                    unheard = true;
                }
                if !h.acked {
                    unacked.push(m.id);
                }
                if now.saturating_since(h.heard) >= self.cfg.dead_after {
                    dead.push(m.id);
                }
                if blocker.is_none_or(|(held, _)| h.held < held) {
                    blocker = Some((h.held, m.id));
                }
            }
            let blocker = match (s.full_since, blocker) {
                (Some(since), Some((_, id)))
                    if now.saturating_since(since) >= self.cfg.dead_after =>
                {
                    Some(id)
                }
                _ => None,
            };
            (quiet, lagging, unheard, unacked, dead, blocker)
        };
        // Ask for status when a member has not been heard from (however
        // busy the stream), and remind the members when entries wait for
        // acknowledgements; at most once per heartbeat.
        let asked_long_ago =
            now.saturating_since(self.seq.as_ref().expect("sequencer").last_status) >= hb;
        let want_status =
            (unheard || (lagging && self.stream.commit < self.stream.held)) && asked_long_ago;
        if quiet || want_status {
            let sync = self.sync_body(want_status || lagging);
            self.broadcast(sync);
            let s = self.seq.as_mut().expect("sequencer");
            s.last_broadcast = now;
            if want_status {
                s.last_status = now;
            }
        }
        if quiet {
            for id in unacked {
                self.seq_resend_view(id);
            }
        }
        // Silent members, and one that holds a full history back, are
        // expelled through the stream like a leave: the sequencer is alive,
        // so no reset is needed (and the entry commits by the others).
        // But while a membership change waits for acknowledgements a dead
        // member owes, no other change can be ordered (one at a time): then
        // a reset without the dead members unblocks the group.
        if !dead.is_empty() && self.change_pending() {
            let pending_for =
                now.saturating_since(self.seq.as_ref().expect("sequencer").change_since);
            if pending_for >= self.cfg.dead_after {
                self.start_recovery(now, dead.into_iter().collect(), None);
                return;
            }
        }
        let mut expel = dead;
        expel.extend(blocker);
        for id in expel {
            self.queue_change(now, Change::Leave(id));
        }
        // Joins deferred while a member was silent.
        self.try_change(now);
    }

    /// Whether some member has not been heard from for `suspect_after`.
    fn member_silent(&self, now: Time) -> bool {
        let Some(s) = self.seq.as_ref() else {
            return false;
        };
        self.view.members.iter().any(|m| {
            m.id != self.me.id
                && s.members
                    .get(&m.id)
                    .is_some_and(|h| now.saturating_since(h.heard) >= self.cfg.suspect_after)
        })
    }

    /// Makes this member the sequencer of incarnation `inc` with
    /// `members`; the view entry goes at `held + 1`.  `continues` is the
    /// incarnation whose log this one continues (0 for a new group).
    pub(crate) fn install(
        &mut self,
        now: Time,
        inc: Incarnation,
        members: Vec<MemberEntry>,
        continues: (Incarnation, MemberId),
    ) {
        self.view.inc = inc;
        self.view.last_normal = (inc, self.me.id);
        self.view.sequencer = self.me.id;
        self.status = Status::Normal;
        self.recovery.coord = None;
        self.recovery.voted_at = None;
        self.recovery.recovery_failed_at = None;
        // Entries beyond our hold (buffered out of order) are not part of
        // the new incarnation's log.
        self.truncate_to(self.stream.held);
        let view_seq = self.stream.held.next();
        self.view.members = members.clone();
        self.seq = Some(Sequencer::new(now, view_seq, view_seq, &members));
        let mut body = Vec::new();
        let view = shoal_wire::group::View {
            continues: Incarnation(continues.0.0),
            continues_seqr: continues.1,
            members: members.clone(),
        };
        shoal_wire::group::encode_view(&view, &mut body);
        let entry = Entry {
            inc,
            sender: self.me.id,
            msg_id: MsgId(0),
            kind: EntryKind::View,
            body: Bytes::from(body),
        };
        // The view entry replaces the membership: every later quorum is
        // counted against it.
        self.stats.resets += 1;
        self.pacing.heard_seq = now;
        self.seq_order(now, entry, false);
        // Unordered messages of ours go again, in the new incarnation.
        self.retransmit_due(now, true);
        if self.view.members.len() <= 1 {
            self.stream.commit = self.stream.held;
            self.deliver();
        }
    }
}
