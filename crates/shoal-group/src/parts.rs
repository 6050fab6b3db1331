//! The parts of a group member's state (`GroupCore`), each the state of
//! one concern, so that what a handler touches is plain from its paths
//! (`self.stream.held`, `self.view.members`).

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use rustc_hash::FxHashMap;
use shoal_proto::Time;
use shoal_wire::group::{MemberEntry, Order};
use shoal_wire::{GroupSeq, Incarnation, MemberId, MsgId};

use crate::assembly::Assembly;
use crate::core::{Entry, GroupTransmit, Pending};
use crate::event::Event;
use crate::join::Joining;
use crate::recovery::Coordinator;

/// The membership as of the stream held: incarnation, sequencer, members
/// and their recent changes, and the ballot promised.
pub(crate) struct View {
    /// Current incarnation (changes at each reset).
    pub(crate) inc: Incarnation,
    /// Last incarnation in which this member was a normal member.
    pub(crate) last_normal: (Incarnation, MemberId),
    pub(crate) sequencer: MemberId,
    /// Membership after entry `members_seq`.
    pub(crate) members: Vec<MemberEntry>,
    pub(crate) members_seq: GroupSeq,
    /// Membership before the last membership change (a reset needs a
    /// quorum of both, since that change may not be committed).
    pub(crate) prev_members: Vec<MemberEntry>,
    /// Membership after each recent change: (seq, members), oldest first.
    pub(crate) snapshots: Vec<(GroupSeq, Vec<MemberEntry>)>,
    /// Highest ballot promised: (incarnation, coordinator).
    pub(crate) promised: (Incarnation, MemberId),
}

/// The stream of entries: what is held, committed, stable and delivered,
/// what is being reassembled, and how far the others hold it.
pub(crate) struct Stream {
    /// Entries held, by sequence number (beyond `held` too, out of order).
    pub(crate) log: BTreeMap<GroupSeq, Entry>,
    pub(crate) log_bytes: usize,
    /// Every entry up to here is held (or covered by the joined state).
    pub(crate) held: GroupSeq,
    /// Every entry up to here is committed.
    pub(crate) commit: GroupSeq,
    /// Every entry up to here is held by every member.
    pub(crate) stable: GroupSeq,
    /// Every entry up to here was turned into an event.
    pub(crate) delivered: GroupSeq,
    /// Sequence number of the last event the application polled.
    pub(crate) app_seq: GroupSeq,
    /// Highest sequence number known to exist.
    pub(crate) last_known: GroupSeq,
    /// Last message number sequenced per sender, as of `held`.
    pub(crate) senders: FxHashMap<MemberId, MsgId>,
    /// Entry fragments being reassembled, by sequence number.
    pub(crate) partial: FxHashMap<GroupSeq, (Order<'static>, Assembly)>,
    /// Accepted BB entries whose body has not arrived: seq → header.
    pub(crate) accepted: BTreeMap<GroupSeq, Entry>,
    /// BB bodies received from their senders, by (sender, msg_id).
    pub(crate) bb: FxHashMap<(MemberId, MsgId), Assembly>,
    pub(crate) bb_done: FxHashMap<(MemberId, MsgId), Bytes>,
    /// How far the sequencer and the other members hold the stream, as
    /// heard from them, each with the incarnation `(inc, sequencer)` it
    /// was heard in: a member works out the commit point itself from the
    /// sequencer's broadcasts and the acks multicast to it
    /// (`member_commit`).
    pub(crate) peer_held: FxHashMap<MemberId, (Incarnation, MemberId, GroupSeq)>,
}

/// This member's own messages: numbered, waiting to be ordered, and ordered
/// (for the sender).
pub(crate) struct Outbox {
    pub(crate) next_msg: MsgId,
    pub(crate) outgoing: VecDeque<Pending>,
    pub(crate) outgoing_bytes: usize,
    /// Own messages ordered: (msg_id, seq), apart from the event stream so
    /// a sender learns of them without reading every delivery first.
    pub(crate) sent: VecDeque<(MsgId, GroupSeq)>,
}

/// A reset this member coordinates, or voted in, or that failed.
pub(crate) struct Recovery {
    pub(crate) coord: Option<Coordinator>,
    /// When this member voted in a recovery it does not coordinate.
    pub(crate) voted_at: Option<Time>,
    /// When recovery last failed (to retry later).
    pub(crate) recovery_failed_at: Option<Time>,
}

/// Joining (and the state handed to joiners) and leaving.
pub(crate) struct Lifecycle {
    pub(crate) joining: Option<Joining>,
    pub(crate) state_out: crate::join::StateOut,
    pub(crate) leaving: Option<Time>,
    /// Our own leave was delivered here (a sequencer lingers after it).
    pub(crate) left_at: Option<(GroupSeq, Time)>,
}

/// When the sequencer was last heard, when this member last asked for gaps
/// and told how far it holds, and the next tick.
pub(crate) struct Pacing {
    /// Last datagram from the sequencer (or, as sequencer, last broadcast).
    pub(crate) heard_seq: Time,
    pub(crate) last_nack: Option<Time>,
    pub(crate) last_ack: Time,
    /// `held` as of the last datagram that told the sequencer, and the
    /// bytes held since.
    pub(crate) acked_held: GroupSeq,
    pub(crate) bytes_since_ack: usize,
    pub(crate) next_tick: Time,
}

/// What the shell takes: datagrams to send and events for the application.
pub(crate) struct Outputs {
    pub(crate) transmits: VecDeque<GroupTransmit>,
    pub(crate) events: VecDeque<Event>,
}
