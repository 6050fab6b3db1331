//! Joining, state transfer and leaving.
//!
//! A joiner sends `Join` to any member it knows of (members forward it to
//! the sequencer).  The sequencer orders a join entry like a message, so
//! every member sees the new membership at the same point of the stream.
//! When the sequencer's application has handled that entry it gets
//! [`Event::StateWanted`] and answers with its state
//! ([`GroupCore::provide_state`]); the joiner receives the state with the
//! group's incarnation, sequencer, membership and sender numbers, starts
//! from it, and asks for every entry after it.  A leave is ordered the same
//! way; when the sequencer itself leaves, the first remaining member
//! coordinates a reset at once.

use std::net::SocketAddr;

use bytes::Bytes;
use rustc_hash::FxHashMap;
use shoal_cap::PutPort;
use shoal_proto::Time;
use shoal_wire::group::{
    EntryKind, GroupBody, GroupHeader, GroupPacket, Join, MemberEntry, State, StateMeta, StateReq,
    decode_member, decode_state, encode_state,
};
use shoal_wire::{Frag, GroupSeq, Incarnation, MemberId};

use crate::assembly::{Assembly, frag_count, frag_range};
use crate::config::GroupConfig;
use crate::core::{GroupCore, GroupDest, Status};
use crate::event::Event;
use crate::sequencer::Change;

/// A joiner's progress.
#[derive(Debug)]
pub(crate) struct Joining {
    pub contacts: Vec<SocketAddr>,
    pub next_contact: usize,
    pub nonce: u64,
    pub started: Time,
    pub last_try: Time,
    /// State being received: (at_seq, sender address, fragments).
    pub state: Option<(GroupSeq, SocketAddr, Assembly)>,
}

/// State transfers this member is serving, by joiner.
pub(crate) type StateOut = FxHashMap<MemberId, (GroupSeq, Bytes, Time)>;

/// Fragments of a state transfer sent per request.
const STATE_BURST: u32 = 64;

impl GroupCore {
    /// Starts joining the group through `contacts` (addresses of members).
    /// The first event is [`Event::State`] (or [`Event::JoinFailed`]).
    pub fn join(
        now: Time,
        group: PutPort,
        me: MemberEntry,
        cfg: GroupConfig,
        contacts: Vec<SocketAddr>,
        nonce: u64,
    ) -> Self {
        let mut core = Self::blank(now, group, me, cfg);
        core.status = Status::Joining;
        core.lifecycle.joining = Some(Joining {
            contacts,
            next_contact: 0,
            nonce,
            started: now,
            last_try: now,
            state: None,
        });
        core.send_join(now);
        core
    }

    fn send_join(&mut self, now: Time) {
        let Some(j) = self.lifecycle.joining.as_mut() else {
            return;
        };
        j.last_try = now;
        if j.contacts.is_empty() {
            return;
        }
        let to = j.contacts[j.next_contact % j.contacts.len()];
        j.next_contact += 1;
        let body = GroupBody::Join(Join {
            nonce: j.nonce,
            addr: self.me.addr,
        });
        let hdr = self.hdr();
        self.emit(GroupDest::Addr(to), hdr, body);
    }

    /// A member address learned after [`GroupCore::join`] started (for
    /// example from a later locate).
    pub fn add_contact(&mut self, addr: SocketAddr) {
        if let Some(j) = self.lifecycle.joining.as_mut()
            && !j.contacts.contains(&addr)
        {
            j.contacts.push(addr);
        }
    }

    /// Datagrams while joining: only state fragments matter.
    pub(crate) fn joining_packet(&mut self, now: Time, from: SocketAddr, p: &GroupPacket<'_>) {
        if let GroupBody::Invite(i) = &p.body {
            // A reset while we wait for our state: we hold nothing, but our
            // vote counts towards the coordinator's majority, so we keep
            // the promise as members do.
            let b = (i.ballot, p.hdr.from);
            if b < self.view.promised {
                return;
            }
            self.view.promised = b;
            let vote = shoal_wire::group::Vote {
                ballot: i.ballot,
                coord: p.hdr.from,
                last_normal: Incarnation(0),
                last_normal_seqr: MemberId(0),
                held: GroupSeq(0),
                commit: GroupSeq(0),
            };
            let hdr = self.hdr();
            self.emit(GroupDest::Addr(from), hdr, GroupBody::Vote(vote));
            return;
        }
        let GroupBody::State(s) = &p.body else {
            return;
        };
        let Some(j) = self.lifecycle.joining.as_mut() else {
            return;
        };
        match &mut j.state {
            Some((at, _, _)) if *at > s.at_seq => return,
            Some((at, _, _)) if *at == s.at_seq => {}
            _ => {
                let Some(asm) = Assembly::new(s.total_len, s.frag.count, self.cfg.max_state_bytes)
                else {
                    return;
                };
                j.state = Some((s.at_seq, from, asm));
            }
        }
        let (_, _, asm) = j.state.as_mut().expect("set above");
        if !asm.add(s.total_len, s.frag.count, s.frag.index, s.payload) {
            return;
        }
        j.last_try = now;
        if !asm.is_complete() {
            return;
        }
        let (at_seq, _, asm) = self
            .lifecycle
            .joining
            .as_mut()
            .expect("joining")
            .state
            .take()
            .expect("state");
        let body = asm.finish();
        let Ok((meta, app)) = decode_state(&body) else {
            self.status = Status::Out;
            self.out.events.push_back(Event::JoinFailed);
            return;
        };
        let app = body.slice_ref(app);
        if !meta.members.iter().any(|m| m.id == self.me.id) {
            // A state from before our join was ordered: wait for another.
            return;
        }
        self.lifecycle.joining = None;
        // The group's parameters are the creator's, whatever ours were.
        self.cfg.resilience = meta.resilience as usize;
        self.cfg.large_bytes = meta.large_bytes as usize;
        self.cfg.min_members = (meta.min_members > 0).then_some(meta.min_members as usize);
        self.view.inc = meta.inc;
        self.view.last_normal = (meta.inc, meta.sequencer);
        self.view.sequencer = meta.sequencer;
        self.view.promised = self.view.promised.max((meta.inc, meta.sequencer));
        self.view.members = meta.members.clone();
        self.view.prev_members = meta.members.clone();
        self.view.members_seq = at_seq;
        self.view.snapshots = vec![(at_seq, meta.members.clone())];
        self.stream.senders = meta.senders.iter().copied().collect();
        self.stream.held = at_seq;
        self.stream.commit = at_seq;
        self.stream.delivered = at_seq;
        self.stream.app_seq = at_seq;
        self.stream.stable = at_seq;
        self.stream.last_known = at_seq;
        self.status = Status::Normal;
        self.pacing.heard_seq = now;
        self.out.events.push_back(Event::State {
            seq: at_seq,
            state: app,
            members: meta.members,
        });
        self.send_ack(now);
    }

    pub(crate) fn joining_tick(&mut self, now: Time) {
        let Some(j) = self.lifecycle.joining.as_ref() else {
            return;
        };
        if now.saturating_since(j.started) >= self.cfg.join_timeout {
            self.lifecycle.joining = None;
            self.status = Status::Out;
            self.out.events.push_back(Event::JoinFailed);
            return;
        }
        if now.saturating_since(j.last_try) < self.cfg.retransmit * 4 {
            return;
        }
        let stalled = now.saturating_since(j.last_try) >= self.cfg.retransmit * 16;
        match &j.state {
            Some(_) if stalled => {
                // The member sending our state went away: ask again.
                self.lifecycle.joining.as_mut().expect("joining").state = None;
                self.send_join(now);
            }
            Some((at, addr, asm)) => {
                let req = StateReq {
                    min_seq: GroupSeq(0),
                    at_seq: *at,
                    from_frag: asm.first_missing(),
                };
                let addr = *addr;
                let hdr = self.hdr();
                self.emit(GroupDest::Addr(addr), hdr, GroupBody::StateReq(req));
                self.lifecycle.joining.as_mut().expect("joining").last_try = now;
            }
            None => self.send_join(now),
        }
    }

    pub(crate) fn on_join(&mut self, now: Time, hdr: GroupHeader, j: &Join, raw: &[u8]) {
        if self.status != Status::Normal {
            return;
        }
        if self.seq.is_none() {
            // Forward to the sequencer unchanged.
            if let Some(addr) = self.addr_of(self.view.sequencer) {
                self.out.transmits.push_back(crate::core::GroupTransmit {
                    dest: GroupDest::Addr(addr),
                    bytes: raw.to_vec(),
                });
            }
            return;
        }
        let m = MemberEntry {
            id: hdr.from,
            addr: j.addr,
        };
        if self.is_member(m.id) {
            // Its join is ordered; it still waits for its state.
            let acked = self
                .seq
                .as_ref()
                .and_then(|s| s.members.get(&m.id))
                .is_some_and(|h| h.acked);
            if !acked {
                self.resend_state(m.id, 0);
            }
            return;
        }
        self.queue_change(now, Change::Join(m));
    }

    pub(crate) fn on_state_req(&mut self, _now: Time, hdr: GroupHeader, r: &StateReq) {
        self.resend_state(hdr.from, r.from_frag);
    }

    fn resend_state(&mut self, joiner: MemberId, from_frag: u32) {
        if self.lifecycle.state_out.contains_key(&joiner) {
            self.send_state(joiner, from_frag);
        } else if self.seq.is_some()
            && self.is_member(joiner)
            && self
                .members_at(self.stream.delivered)
                .iter()
                .any(|m| m.id == joiner)
        {
            self.out.events.push_back(Event::StateWanted { joiner });
        }
    }

    /// The application's answer to [`Event::StateWanted`]: its state after
    /// every event it has polled so far.
    pub fn provide_state(&mut self, now: Time, joiner: MemberId, state: &[u8]) {
        self.now = now;
        if self.status != Status::Normal || !self.is_member(joiner) {
            return;
        }
        let at = self.stream.app_seq;
        // The state must include the joiner's own join.
        let members = self.members_at(at);
        if !members.iter().any(|m| m.id == joiner) {
            return;
        }
        // ... and its latest one: a joiner expelled before its state came
        // (silent meanwhile) and admitted again by its retried join must
        // not start from a state of its first admission, or it would
        // deliver its own expulsion and leave while the group counts it
        // a member.  Entries after `at` are still in the log (purging
        // stops at what the application has seen).
        let changed_later = self
            .stream
            .log
            .range(at.next()..)
            .any(|(_, e)| match e.kind {
                EntryKind::Join => decode_member(&e.body).is_ok_and(|m| m.id == joiner),
                EntryKind::Leave => e.body[..] == joiner.0.to_le_bytes(),
                _ => false,
            });
        if changed_later {
            return;
        }
        let meta = StateMeta {
            inc: Incarnation(self.view.inc.0),
            sequencer: self.view.sequencer,
            resilience: self.cfg.resilience as u32,
            large_bytes: self.cfg.large_bytes as u64,
            min_members: self.cfg.min_members.unwrap_or(0) as u32,
            members,
            senders: self.stream.senders.iter().map(|(k, v)| (*k, *v)).collect(),
        };
        let mut body = Vec::with_capacity(state.len() + 64);
        encode_state(&meta, state, &mut body);
        self.lifecycle
            .state_out
            .insert(joiner, (at, Bytes::from(body), now));
        // State transfers are kept for a while only.
        let limit = self.cfg.join_timeout;
        self.lifecycle
            .state_out
            .retain(|_, (_, _, t)| now.saturating_since(*t) < limit);
        self.send_state(joiner, 0);
    }

    fn send_state(&mut self, joiner: MemberId, from_frag: u32) {
        let Some((at, body, _)) = self.lifecycle.state_out.get(&joiner).cloned() else {
            return;
        };
        let Some(addr) = self.addr_of(joiner) else {
            return;
        };
        let total = body.len();
        let count = frag_count(total, self.cfg.frag_bytes);
        for i in from_frag..count.min(from_frag.saturating_add(STATE_BURST)) {
            let s = State {
                at_seq: at,
                frag: Frag { index: i, count },
                total_len: total as u64,
                payload: &body[frag_range(total, count, i)],
            };
            let hdr = self.hdr();
            self.emit(GroupDest::Addr(addr), hdr, GroupBody::State(s));
        }
    }

    /// The joiner acknowledged: its state transfer is done.
    pub(crate) fn state_done(&mut self, joiner: MemberId) {
        self.lifecycle.state_out.remove(&joiner);
    }

    /// Leaves the group.  Completes with [`Event::LeftGroup`] once the leave
    /// is ordered.
    pub fn leave(&mut self, now: Time) {
        self.now = now;
        if self.status != Status::Normal || self.lifecycle.leaving.is_some() {
            if self.status == Status::Joining || self.status == Status::Recovering {
                self.status = Status::Left;
                self.out.events.push_back(Event::LeftGroup);
            }
            return;
        }
        self.lifecycle.leaving = Some(now);
        if self.seq.is_some() {
            self.queue_change(now, Change::Leave(self.me.id));
        } else {
            self.send_to(self.view.sequencer, GroupBody::Leave);
        }
    }
}
