//! Recovery (reset): when the sequencer or a member is lost, a surviving
//! member becomes coordinator and installs a new incarnation.
//!
//! ```text
//!  coordinator                          members
//!  ballot b = (max incarnation seen + 1, my id)
//!  Invite(b) ───────────────────────▶  promise b if higher than any promise;
//!                                      stop taking part in the old incarnation
//!            ◀─────────────────────── Vote(b, last normal incarnation, held, commit)
//!  wait for every member, or for a quorum after `vote_wait`
//!  best = highest (last normal incarnation, held) among the votes
//!  Fetch(b, my held+1 ..= best.held) ─▶ best voter
//!            ◀─────────────────────── Order(FETCHED) entries
//!  quorum check against the membership at the end of the log
//!  Install = view entry of incarnation b, voters as members ─▶ all
//!                                      keep the log up to what is known
//!                                      committed (or all of it, if it comes
//!                                      from the same incarnation), ask for
//!                                      the rest; the coordinator is the new
//!                                      sequencer
//! ```
//!
//! Safety rests on two facts.  A delivered entry is held by r + 1 members
//! (or all of them, in a smaller group), and a reset needs votes from at
//! least `n − r` members, so some voter holds it and the best log contains
//! it.  Every quorum is also a majority (unless the application lowers the
//! minimum), so two sides of a partition never both install a new
//! incarnation.  As in Viewstamped Replication, the log is taken from the
//! voter with the latest *normal* incarnation, so a tentative entry of an
//! abandoned incarnation never displaces a committed one.

use std::net::SocketAddr;

use rustc_hash::{FxHashMap, FxHashSet};
use shoal_proto::Time;
use shoal_wire::group::{
    Fetch, GroupBody, GroupHeader, Invite, Nack, Order, Reject, Vote, decode_view,
};
use shoal_wire::{GroupSeq, Incarnation, MemberId, MsgId};

use crate::core::{GroupCore, Status};
use crate::event::Event;

/// The coordinator's state during a reset.
#[derive(Debug)]
pub(crate) struct Coordinator {
    pub ballot: Incarnation,
    pub started: Time,
    pub last_invite: Time,
    pub votes: FxHashMap<MemberId, Vote>,
    pub addrs: FxHashMap<MemberId, SocketAddr>,
    pub exclude: FxHashSet<MemberId>,
    pub min_override: Option<usize>,
    /// Entries must be fetched up to here from this voter.
    pub fetch: Option<(MemberId, GroupSeq, Time)>,
    /// The best log's incarnation.
    pub best_inc: (Incarnation, MemberId),
    /// Members that answered holding nothing (joiners still waiting for
    /// their state): they cannot hold a delivered entry, so they neither
    /// count towards nor against the quorum, and are left out of the view.
    pub empty: FxHashSet<MemberId>,
}

impl GroupCore {
    /// Starts a reset coordinated by this member.  `exclude` are members
    /// known dead or to be expelled; `min_override` replaces the quorum
    /// (the application's choice, see [`GroupCore::reset`]).
    pub(crate) fn start_recovery(
        &mut self,
        now: Time,
        exclude: FxHashSet<MemberId>,
        min_override: Option<usize>,
    ) {
        if matches!(self.status, Status::Out | Status::Left | Status::Joining) {
            return;
        }
        if !self.is_member(self.me.id) && min_override.is_none() {
            // Our leave is in the log: a member coordinates, we vote.
            return;
        }
        if let Some(c) = self.recovery.coord.as_mut() {
            c.exclude.extend(exclude);
            if min_override.is_some() {
                c.min_override = min_override;
            }
            return;
        }
        let ballot = self.view.inc.max(self.view.promised.0).next();
        self.view.promised = (ballot, self.me.id);
        self.status = Status::Recovering;
        self.seq = None;
        self.recovery.voted_at = None;
        self.recovery.recovery_failed_at = None;
        let own = Vote {
            ballot,
            coord: self.me.id,
            last_normal: self.view.last_normal.0,
            last_normal_seqr: self.view.last_normal.1,
            held: self.stream.held,
            commit: self.stream.commit,
        };
        let mut votes = FxHashMap::default();
        votes.insert(self.me.id, own);
        let addrs = self
            .view
            .members
            .iter()
            .chain(self.view.prev_members.iter())
            .map(|m| (m.id, m.addr))
            .collect();
        self.recovery.coord = Some(Coordinator {
            ballot,
            started: now,
            last_invite: now,
            votes,
            addrs,
            exclude,
            min_override,
            fetch: None,
            best_inc: self.view.last_normal,
            empty: FxHashSet::default(),
        });
        self.invite(now);
        self.evaluate(now);
    }

    /// Starts a reset on the application's request; `min_members`, if
    /// given, replaces the quorum rule (accepting that messages delivered
    /// only by absent members may be lost).  A reset this member voted in
    /// less than `recovery_timeout` ago is left to finish: it includes
    /// this member, and a new ballot would only abort it (two members
    /// asking every so often would abort each other's for ever).  If it
    /// fails, a call after that time starts one.
    pub fn reset(&mut self, now: Time, min_members: Option<usize>) {
        self.now = now;
        if let Some(c) = self.recovery.coord.as_mut() {
            c.min_override = min_members;
            self.evaluate(now);
            return;
        }
        if self.status == Status::Recovering {
            if self
                .recovery
                .voted_at
                .is_some_and(|at| now.saturating_since(at) < self.cfg.recovery_timeout)
            {
                return;
            }
            self.status = Status::Normal;
        }
        self.start_recovery(now, FxHashSet::default(), min_members);
    }

    fn invite(&mut self, now: Time) {
        let Some(c) = self.recovery.coord.as_mut() else {
            return;
        };
        c.last_invite = now;
        let ballot = c.ballot;
        let c = self.recovery.coord.as_ref().expect("coordinating");
        // The members before the last change too: it may not be committed,
        // and then their votes count.
        let mut seen = FxHashSet::default();
        let targets: Vec<SocketAddr> = self
            .view
            .members
            .iter()
            .chain(self.undecided_members())
            .filter(|m| seen.insert(m.id))
            .filter(|m| {
                m.id != self.me.id
                    && !c.exclude.contains(&m.id)
                    && !c.votes.contains_key(&m.id)
                    && !c.empty.contains(&m.id)
            })
            .map(|m| m.addr)
            .collect();
        let hdr = self.hdr();
        for addr in targets {
            self.emit(
                crate::core::GroupDest::Addr(addr),
                hdr,
                GroupBody::Invite(Invite { ballot }),
            );
        }
    }

    /// The members before the last membership change, if we do not know
    /// that change to be committed.
    fn undecided_members(&self) -> impl Iterator<Item = &shoal_wire::group::MemberEntry> {
        let undecided = self.view.members_seq > self.stream.commit;
        self.view.prev_members.iter().filter(move |_| undecided)
    }

    pub(crate) fn on_invite(
        &mut self,
        now: Time,
        hdr: GroupHeader,
        ballot: Incarnation,
        from: SocketAddr,
    ) {
        let b = (ballot, hdr.from);
        if !self.is_member(hdr.from) && !self.undecided_members().any(|m| m.id == hdr.from) {
            // Someone the group left behind: tell it (it ignores this if it
            // knows a later incarnation than ours).
            self.tell_not_member();
            return;
        }
        if b < self.view.promised {
            self.reject(from);
            return;
        }
        // A member that hears its sequencer does not depose it: a member
        // cut off on its own (or deaf) cannot disrupt the group.
        if self.status == Status::Normal
            && hdr.from != self.view.sequencer
            && self.is_member(self.view.sequencer)
            && now.saturating_since(self.pacing.heard_seq) < self.cfg.suspect_after
        {
            self.reject(from);
            return;
        }
        if b > self.view.promised {
            self.view.promised = b;
            self.recovery.coord = None;
            self.seq = None;
            self.status = Status::Recovering;
            self.recovery.voted_at = Some(now);
        }
        if self.view.promised == b && self.recovery.coord.is_none() {
            let vote = Vote {
                ballot,
                coord: hdr.from,
                last_normal: self.view.last_normal.0,
                last_normal_seqr: self.view.last_normal.1,
                held: self.stream.held,
                commit: self.stream.commit,
            };
            let hdr = self.hdr();
            self.emit(
                crate::core::GroupDest::Addr(from),
                hdr,
                GroupBody::Vote(vote),
            );
        }
    }

    fn reject(&mut self, to: SocketAddr) {
        let hdr = self.hdr();
        self.emit(
            crate::core::GroupDest::Addr(to),
            hdr,
            GroupBody::Reject(Reject {
                ballot: self.view.promised.0,
                coord: self.view.promised.1,
                sequencer: self.view.sequencer,
            }),
        );
    }

    pub(crate) fn on_vote(&mut self, now: Time, hdr: GroupHeader, v: &Vote, from: SocketAddr) {
        let Some(c) = self.recovery.coord.as_mut() else {
            return;
        };
        if v.ballot != c.ballot || v.coord != self.me.id || c.exclude.contains(&hdr.from) {
            return;
        }
        c.addrs.insert(hdr.from, from);
        if v.last_normal == Incarnation(0) {
            c.empty.insert(hdr.from);
        } else {
            c.votes.insert(hdr.from, *v);
        }
        self.evaluate(now);
    }

    pub(crate) fn on_reject(&mut self, now: Time, hdr: GroupHeader, r: &Reject, from: SocketAddr) {
        if (r.ballot, r.coord) > self.view.promised {
            self.view.promised = (r.ballot, r.coord);
            if self.recovery.coord.is_some() {
                self.recovery.coord = None;
                self.recovery.voted_at = Some(now);
            }
        }
        if (hdr.inc, hdr.seqr) > (self.view.inc, self.view.sequencer) {
            // The group moved on without us: ask its sequencer, which sends
            // us its view entry if we are still a member, or tells us we
            // are not.
            let to = self.addr_of(r.sequencer).unwrap_or(from);
            let hdr = self.hdr();
            self.emit(
                crate::core::GroupDest::Addr(to),
                hdr,
                GroupBody::Nack(Nack {
                    held: self.stream.held,
                    from: self.stream.held.next(),
                    to: self.stream.held.next(),
                }),
            );
        }
    }

    pub(crate) fn on_fetch(&mut self, _now: Time, hdr: GroupHeader, f: &Fetch, from: SocketAddr) {
        if self.view.promised != (f.ballot, hdr.from) {
            return;
        }
        let start = self.log_start();
        if f.from < start && f.from <= self.stream.held {
            let hdr = GroupHeader {
                inc: self.view.inc.max(f.ballot),
                ..self.hdr()
            };
            self.emit(
                crate::core::GroupDest::Addr(from),
                hdr,
                GroupBody::NotMember(shoal_wire::group::NotMember {
                    sequencer: self.view.sequencer,
                }),
            );
            return;
        }
        let mut budget = 4 * self.cfg.frag_bytes.max(64 * 1024);
        for seq in f.from.through(f.to.min(self.stream.held)) {
            let Some(e) = self.stream.log.get(&seq).cloned() else {
                continue;
            };
            self.emit_entry(
                crate::core::GroupDest::Addr(from),
                seq,
                &e,
                shoal_wire::group::ORDER_FETCHED,
                (f.ballot, hdr.from),
            );
            budget = budget.saturating_sub(e.body.len() + 64);
            if budget == 0 {
                break;
            }
        }
    }

    pub(crate) fn coord_on_fetched(&mut self, now: Time, hdr: GroupHeader, o: &Order<'_>) {
        let Some(c) = self.recovery.coord.as_ref() else {
            return;
        };
        if hdr.inc != c.ballot || hdr.seqr != self.me.id || c.fetch.is_none() {
            return;
        }
        self.take_entry(o);
        self.after_hold(now);
        self.evaluate(now);
    }

    /// Asks voter `from` for the entries after ours up to `upto`.
    fn send_fetch(&mut self, from: MemberId, upto: GroupSeq) {
        let Some(c) = self.recovery.coord.as_ref() else {
            return;
        };
        let ballot = c.ballot;
        let Some(addr) = c.addrs.get(&from).copied() else {
            return;
        };
        let hdr = self.hdr();
        self.emit(
            crate::core::GroupDest::Addr(addr),
            hdr,
            GroupBody::Fetch(Fetch {
                ballot,
                from: self.stream.held.next(),
                to: upto,
            }),
        );
    }

    /// Decides what to do next in a reset this member coordinates.
    pub(crate) fn evaluate(&mut self, now: Time) {
        let Some(c) = self.recovery.coord.as_ref() else {
            return;
        };
        let invited: Vec<MemberId> = self
            .view
            .members
            .iter()
            .chain(self.undecided_members())
            .filter(|m| !c.exclude.contains(&m.id))
            .map(|m| m.id)
            .collect();
        let all_in = invited
            .iter()
            .all(|id| c.votes.contains_key(id) || c.empty.contains(id));
        if !all_in && now.saturating_since(c.started) < self.cfg.vote_wait {
            return;
        }
        // The best log: latest normal incarnation, then longest.
        let (best_id, best) = c
            .votes
            .iter()
            .max_by_key(|(id, v)| {
                (
                    (v.last_normal, v.last_normal_seqr),
                    v.held,
                    **id == self.me.id,
                )
            })
            .map(|(id, v)| (*id, *v))
            .expect("own vote");
        // Adopt the best log seen so far; a better vote may arrive while
        // we fetch, and then we fetch from it instead.
        let target = c.fetch.map(|(_, upto, _)| (c.best_inc, upto));
        let best_inc = (best.last_normal, best.last_normal_seqr);
        if target.is_none_or(|t| (best_inc, best.held) > t) {
            if best_inc > self.view.last_normal {
                // Our tail may be tentative entries of an abandoned
                // incarnation: keep only what we know is committed.
                self.truncate_to(self.stream.commit);
            }
            let c = self.recovery.coord.as_mut().expect("coordinating");
            c.best_inc = best_inc;
            c.fetch = Some((best_id, best.held, now));
            if self.stream.held < best.held {
                self.send_fetch(best_id, best.held);
            }
        }
        let c = self.recovery.coord.as_ref().expect("coordinating");
        let (_, upto, _) = c.fetch.expect("set above");
        if self.stream.held < upto {
            // The best voter may have died after it voted: a reset that
            // cannot fetch its log fails like one that lacks votes, and
            // the next attempt (a new ballot) goes without that voter.
            if now.saturating_since(c.started) >= self.cfg.recovery_timeout {
                let have = self
                    .view
                    .members
                    .iter()
                    .filter(|m| c.votes.contains_key(&m.id))
                    .count();
                let need = self.cfg.quorum(self.view.members.len());
                self.fail_recovery(now, have, need);
            }
            return;
        }
        // Quorum against the membership at the end of the log, and the one
        // before its last change (which may not be committed).
        if !self.is_member(self.me.id) {
            if self.lifecycle.leaving.is_some() {
                // Our own leave is in the log: let a member coordinate, and
                // vote when asked.
                self.recovery.coord = None;
                self.recovery.voted_at = Some(now);
            } else {
                self.expelled();
            }
            return;
        }
        let voters: FxHashSet<MemberId> = c.votes.keys().copied().collect();
        let mut ok = true;
        let mut have_need = (0, 0);
        // The last membership change, if not known committed, may be
        // undone: then both memberships need a quorum.
        let known_commit = c
            .votes
            .values()
            .map(|v| v.commit)
            .max()
            .unwrap_or(GroupSeq(0))
            .max(self.stream.commit);
        let lists = if self.view.members_seq <= known_commit {
            vec![self.view.members.clone()]
        } else {
            vec![self.view.members.clone(), self.view.prev_members.clone()]
        };
        for list in &lists {
            // Joiners still waiting for their state hold nothing: they do
            // not count towards the n - r that must include a holder of
            // every committed entry, but their votes (they keep their
            // promise) count towards the majority, so a joiner's admission
            // followed by the sequencer's crash leaves a majority able to
            // reset.
            let holders: Vec<_> = list.iter().filter(|m| !c.empty.contains(&m.id)).collect();
            if holders.is_empty() {
                continue;
            }
            let have = holders.iter().filter(|m| voters.contains(&m.id)).count();
            let (have, need) = match c.min_override {
                Some(min) => (have, min.clamp(1, holders.len())),
                None => {
                    let need = self.cfg.holders_needed(holders.len());
                    let answered = have + (list.len() - holders.len());
                    let majority = self.cfg.majority(list.len());
                    if have < need {
                        (have, need)
                    } else {
                        (answered, majority)
                    }
                }
            };
            if have < need {
                ok = false;
                have_need = (have, need);
            }
        }
        // Members we learned of from the fetched log are invited too.
        let uninvited: Vec<_> = self
            .view
            .members
            .iter()
            .filter(|m| {
                !c.exclude.contains(&m.id)
                    && !c.votes.contains_key(&m.id)
                    && !c.empty.contains(&m.id)
            })
            .map(|m| m.id)
            .collect();
        if ok && (uninvited.is_empty() || now.saturating_since(c.started) >= self.cfg.vote_wait) {
            let new_members: Vec<_> = self
                .view
                .members
                .iter()
                .filter(|m| voters.contains(&m.id))
                .copied()
                .collect();
            let ballot = c.ballot;
            let continues = c.best_inc;
            self.install(now, ballot, new_members, continues);
            return;
        }
        if now.saturating_since(c.started) >= self.cfg.recovery_timeout {
            let (have, need) = have_need;
            self.fail_recovery(now, have, need);
        }
    }

    /// The reset this member coordinates failed: it is tried again after
    /// `suspect_after`, or when the application asks.
    fn fail_recovery(&mut self, now: Time, have: usize, need: usize) {
        self.recovery.coord = None;
        self.recovery.recovery_failed_at = Some(now);
        self.out.events.push_back(Event::ResetFailed { have, need });
    }

    /// Drops log entries after `keep` (they may be tentative entries of an
    /// abandoned incarnation) and the membership changes they made.
    pub(crate) fn truncate_to(&mut self, keep: GroupSeq) {
        let keep = keep.max(self.stream.delivered);
        for e in self.stream.log.split_off(&keep.next()).into_values() {
            self.stream.log_bytes -= e.body.len();
            if e.kind == shoal_wire::group::EntryKind::App {
                let last = self.stream.senders.entry(e.sender).or_insert(MsgId(0));
                *last = (*last).min(e.msg_id.prev());
            }
        }
        self.stream.partial.clear();
        self.stream.accepted.clear();
        if self.stream.held > keep {
            self.stream.held = keep;
        }
        self.stream.last_known = self.stream.last_known.min(self.stream.held);
        self.restore_membership(keep);
    }

    /// A view entry of a later incarnation: the new sequencer's install.
    pub(crate) fn on_install(&mut self, now: Time, hdr: GroupHeader, o: &Order<'_>) {
        if (hdr.inc, hdr.from) < self.view.promised || o.frag.count != 1 {
            return;
        }
        let Ok(view) = decode_view(o.payload) else {
            return;
        };
        if !view.members.iter().any(|m| m.id == self.me.id) {
            self.expelled();
            return;
        }
        let end = o.seq.prev();
        let keep = if self.view.last_normal == (view.continues, view.continues_seqr) {
            self.stream.held.min(end)
        } else {
            self.stream.commit.min(end)
        };
        self.truncate_to(keep);
        // Entries beyond the new log's end are not part of it.
        for e in self.stream.log.split_off(&end.next()).into_values() {
            self.stream.log_bytes -= e.body.len();
        }
        self.view.inc = hdr.inc;
        self.view.last_normal = (hdr.inc, hdr.from);
        self.view.sequencer = hdr.from;
        self.view.promised = self.view.promised.max((hdr.inc, hdr.from));
        self.status = Status::Normal;
        self.seq = None;
        self.recovery.coord = None;
        self.recovery.voted_at = None;
        self.recovery.recovery_failed_at = None;
        self.pacing.heard_seq = now;
        self.stream.last_known = self.stream.last_known.max(o.seq);
        let e = crate::core::entry_from_order(o, bytes::Bytes::copy_from_slice(o.payload));
        self.place(o.seq, e);
        self.learn(o.commit, o.stable, o.seq);
        self.after_hold(now);
        self.send_ack(now);
        self.check_gap(now, false);
        self.deliver();
        for p in self.outbox.outgoing.iter_mut() {
            p.tries = 0;
        }
        self.retransmit_due(now, true);
    }

    pub(crate) fn recovery_tick(&mut self, now: Time) {
        if let Some(c) = self.recovery.coord.as_ref() {
            if now.saturating_since(c.last_invite) >= self.cfg.retransmit {
                self.invite(now);
                if let Some((id, upto, last)) = self.recovery.coord.as_ref().and_then(|c| c.fetch)
                    && self.stream.held < upto
                    && now.saturating_since(last) >= self.cfg.retransmit
                {
                    self.recovery.coord.as_mut().expect("coordinating").fetch =
                        Some((id, upto, now));
                    self.send_fetch(id, upto);
                }
            }
            self.evaluate(now);
            return;
        }
        if let Some(at) = self.recovery.voted_at
            && now.saturating_since(at) >= self.cfg.recovery_timeout
        {
            self.recovery.voted_at = None;
            self.start_recovery(now, FxHashSet::default(), None);
            return;
        }
        if let Some(at) = self.recovery.recovery_failed_at
            && now.saturating_since(at) >= self.cfg.suspect_after
        {
            self.start_recovery(now, FxHashSet::default(), None);
        }
    }
}
