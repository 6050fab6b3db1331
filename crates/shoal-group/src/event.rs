//! What a member's core reports to its application, and its errors.

use bytes::Bytes;
use shoal_wire::group::MemberEntry;
use shoal_wire::{GroupSeq, Incarnation, MemberId, MsgId};

/// Something the application must see, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An application message, delivered in the group's total order.
    Message {
        seq: GroupSeq,
        sender: MemberId,
        msg_id: MsgId,
        body: Bytes,
    },
    /// A member joined at this point of the stream.
    Joined { seq: GroupSeq, member: MemberEntry },
    /// A member left, or was expelled, at this point of the stream.
    Left { seq: GroupSeq, member: MemberId },
    /// A reset installed a new incarnation with these members, at this point
    /// of the stream (also the first event of a new group).
    View {
        seq: GroupSeq,
        inc: Incarnation,
        members: Vec<MemberEntry>,
    },
    /// This member joined: its application starts from `state`, the state
    /// after every entry up to `seq`; deliveries continue at `seq + 1`.
    State {
        seq: GroupSeq,
        state: Bytes,
        members: Vec<MemberEntry>,
    },
    /// `joiner` needs the application's state: answer with
    /// [`crate::GroupCore::provide_state`] after handling every event polled
    /// so far.
    StateWanted { joiner: MemberId },
    /// This member is no longer in the group (expelled after a partition,
    /// for falling behind, or left out of a reset): join again.
    Expelled,
    /// This member's own leave is complete.
    LeftGroup,
    /// A reset could not gather enough members; it is retried, or the
    /// application may call [`crate::GroupCore::reset`] with a lower minimum.
    ResetFailed { have: usize, need: usize },
    /// Joining failed: no member answered in time.
    JoinFailed,
}

/// Why [`crate::GroupCore::send`] refused a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("too many messages in flight: wait for some to be ordered")]
    WindowFull,
    #[error("not a member of the group (joining, left or expelled)")]
    NotMember,
    #[error("message larger than the group's history ({limit} bytes)")]
    TooLarge { limit: usize },
}
