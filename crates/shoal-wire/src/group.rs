//! Group-communication datagrams (kinds 16–31).
//!
//! Every group datagram starts, after the common header, with the group's
//! put-port, the sender's incarnation of the group (`inc`, which changes at
//! each reset) and the sender's member id.  The bodies, who sends each to
//! whom, and what it carries:
//!
//! | message | from → to | carries |
//! |---|---|---|
//! | `Data` | member → sequencer (PB), member → all (BB) | one fragment of a message, its number, how far the sender holds the stream |
//! | `Order` | sequencer → all | one fragment of an entry (or, for BB, a body-less accept), its sequence number, flags tentative/accept/retransmit/fetched, the commit and stable points |
//! | `GAck` | member → sequencer; acknowledger → all (its ack of another member's tentative entry) | how far it holds the stream: resilience acknowledgement, status, heartbeat |
//! | `Nack` | member → sequencer | the range it misses |
//! | `Sync` | sequencer → all | heartbeat: last assigned, commit and stable points, "tell me your state" |
//! | `Join`, `StateReq`, `State` | joiner → any member (forwarded to the sequencer); member → joiner | joining and state transfer (the state carries the group's parameters, incarnation, sequencer, membership and per-sender message numbers) |
//! | `Invite`, `Vote`, `Fetch`, `Reject` | coordinator ⇄ members | reset: ballot, last normal incarnation, hold and commit points; entries fetched from the best voter |
//! | `NotMember` | member → outsider | "you are not in this incarnation: join again" |
//! | `Leave` | member → sequencer | ask to leave |
//! | `InfoReq`, `Info` | anyone ⇄ member | `shoal group info` |

use std::net::SocketAddr;

use shoal_cap::PutPort;

use crate::codec::{Fields, Reader, Writer};
use crate::packet::Frag;
use crate::{GroupSeq, Incarnation, MemberId, MsgId, WireError};

/// Most members a list in a group datagram carries.
pub const MAX_GROUP_MEMBERS: usize = 1024;

/// Fields every group datagram carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupHeader {
    pub group: PutPort,
    /// The sender's incarnation of the group (0 for a joiner or outsider):
    /// a number and the member that installed it (its sequencer), so two
    /// resets that chose the same number are never confused.
    pub inc: Incarnation,
    pub seqr: MemberId,
    pub from: MemberId,
}

/// One fragment of a message a member sends to the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Data<'a> {
    /// Per-sender message number, 1, 2, 3, ...
    pub msg_id: MsgId,
    /// Highest sequence number the sender holds without a gap (piggybacked ack).
    pub held: GroupSeq,
    /// Sent by broadcast (BB) rather than to the sequencer (PB).
    pub bb: bool,
    pub frag: Frag,
    pub total_len: u64,
    pub payload: &'a [u8],
}

/// What a sequenced entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum EntryKind {
    /// An application message.
    App = 0,
    /// A member joins (payload: [`encode_member`]).
    Join = 1,
    /// A member leaves or is expelled (payload: member id, 8 bytes).
    Leave = 2,
    /// A new incarnation's membership, first entry after a reset (payload:
    /// [`encode_view`]).
    View = 3,
}

impl EntryKind {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::App),
            1 => Some(Self::Join),
            2 => Some(Self::Leave),
            3 => Some(Self::View),
            _ => None,
        }
    }
}

/// [`Order::flags`]: the entry is tentative (resilience > 0): hold it and,
/// if you are one of the acknowledgers, ack it; deliver only once committed.
pub const ORDER_TENTATIVE: u8 = 1;
/// [`Order::flags`]: a body-less accept of a BB message the members already
/// received from its sender; `total_len` is the message's length.
pub const ORDER_ACCEPT: u8 = 2;
/// [`Order::flags`]: a retransmission; every member that holds it acks.
pub const ORDER_RETRANSMIT: u8 = 4;
/// [`Order::flags`]: sent to a recovery coordinator that fetched it.
pub const ORDER_FETCHED: u8 = 8;

/// One fragment of a sequenced entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order<'a> {
    pub seq: GroupSeq,
    /// Incarnation in which the entry was sequenced.
    pub entry_inc: Incarnation,
    pub sender: MemberId,
    pub msg_id: MsgId,
    pub kind: EntryKind,
    pub flags: u8,
    /// Every entry up to here is committed (may be delivered).
    pub commit: GroupSeq,
    /// Every member holds every entry up to here.
    pub stable: GroupSeq,
    pub frag: Frag,
    pub total_len: u64,
    pub payload: &'a [u8],
}

/// A member's state: how far it holds the stream without a gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GAck {
    pub held: GroupSeq,
}

/// Request to retransmit entries `from..=to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nack {
    pub held: GroupSeq,
    pub from: GroupSeq,
    pub to: GroupSeq,
}

/// The sequencer's heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sync {
    /// Highest sequence number assigned so far.
    pub last: GroupSeq,
    pub commit: GroupSeq,
    pub stable: GroupSeq,
    /// Every member answers with a [`GAck`].
    pub want_status: bool,
}

/// A process asks to join; sent to any member, forwarded to the sequencer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Join {
    pub nonce: u64,
    /// Where the joiner receives group datagrams.
    pub addr: SocketAddr,
}

/// A joiner asks for the group's state (again), from fragment `from_frag`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateReq {
    /// The state must be at least this recent (the joiner's join entry).
    pub min_seq: GroupSeq,
    /// Fragments of the state at `at_seq` the joiner already has before this one.
    pub at_seq: GroupSeq,
    pub from_frag: u32,
}

/// One fragment of a state transfer: [`encode_state_meta`] followed by the
/// application's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State<'a> {
    /// The state is that after applying every entry up to here.
    pub at_seq: GroupSeq,
    pub frag: Frag,
    pub total_len: u64,
    pub payload: &'a [u8],
}

/// Recovery: the coordinator asks members to vote for ballot
/// (`ballot`, header `from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invite {
    pub ballot: Incarnation,
}

/// Recovery: a member's vote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vote {
    pub ballot: Incarnation,
    pub coord: MemberId,
    /// Last incarnation in which the voter was a normal member (number and
    /// sequencer; 0 if it holds nothing yet).
    pub last_normal: Incarnation,
    pub last_normal_seqr: MemberId,
    pub held: GroupSeq,
    pub commit: GroupSeq,
}

/// Recovery: the coordinator asks a voter for entries `from..=to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fetch {
    pub ballot: Incarnation,
    pub from: GroupSeq,
    pub to: GroupSeq,
}

/// Recovery: "I promised a higher ballot", or "I am in a later incarnation".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reject {
    pub ballot: Incarnation,
    pub coord: MemberId,
    pub sequencer: MemberId,
}

/// "You are not a member of incarnation `inc` (header)": join again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotMember {
    pub sequencer: MemberId,
}

/// Inspection request from outside the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InfoReq {
    pub nonce: u64,
}

/// Inspection answer: JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info<'a> {
    pub nonce: u64,
    pub json: &'a [u8],
}

/// The body of a group datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupBody<'a> {
    Data(Data<'a>),
    Order(Order<'a>),
    Ack(GAck),
    Nack(Nack),
    Sync(Sync),
    Join(Join),
    StateReq(StateReq),
    State(State<'a>),
    Invite(Invite),
    Vote(Vote),
    Fetch(Fetch),
    Reject(Reject),
    NotMember(NotMember),
    Leave,
    InfoReq(InfoReq),
    Info(Info<'a>),
}

/// A group datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPacket<'a> {
    pub hdr: GroupHeader,
    pub body: GroupBody<'a>,
}

/// First kind byte of group datagrams.
pub const GROUP_KIND_BASE: u8 = 16;
/// Last kind byte of group datagrams.
pub const GROUP_KIND_LAST: u8 = GROUP_KIND_BASE + 15;

impl GroupBody<'_> {
    pub(crate) fn kind(&self) -> u8 {
        GROUP_KIND_BASE
            + match self {
                GroupBody::Data(_) => 0,
                GroupBody::Order(_) => 1,
                GroupBody::Ack(_) => 2,
                GroupBody::Nack(_) => 3,
                GroupBody::Sync(_) => 4,
                GroupBody::Join(_) => 5,
                GroupBody::StateReq(_) => 6,
                GroupBody::State(_) => 7,
                GroupBody::Invite(_) => 8,
                GroupBody::Vote(_) => 9,
                GroupBody::Fetch(_) => 10,
                GroupBody::Reject(_) => 11,
                GroupBody::NotMember(_) => 12,
                GroupBody::Leave => 13,
                GroupBody::InfoReq(_) => 14,
                GroupBody::Info(_) => 15,
            }
    }

    pub(crate) fn payload_len(&self) -> usize {
        match self {
            GroupBody::Data(d) => d.payload.len(),
            GroupBody::Order(o) => o.payload.len(),
            GroupBody::State(s) => s.payload.len(),
            GroupBody::Info(i) => i.json.len(),
            _ => 0,
        }
    }
}

// Out of line: the RPC path's codec stays small without it.
#[inline(never)]
pub(crate) fn encode_group(p: &GroupPacket<'_>, w: &mut Writer<'_>) {
    w.bytes(p.hdr.group.as_bytes());
    w.u64(p.hdr.inc.0);
    w.u64(p.hdr.seqr.0);
    w.u64(p.hdr.from.0);
    match &p.body {
        GroupBody::Data(d) => {
            w.u64(d.msg_id.0);
            w.u64(d.held.0);
            w.u8(d.bb as u8);
            w.frag(d.frag);
            w.u64(d.total_len);
            w.bytes(d.payload);
        }
        GroupBody::Order(o) => {
            w.u64(o.seq.0);
            w.u64(o.entry_inc.0);
            w.u64(o.sender.0);
            w.u64(o.msg_id.0);
            w.u8(o.kind as u8);
            w.u8(o.flags);
            w.u64(o.commit.0);
            w.u64(o.stable.0);
            w.frag(o.frag);
            w.u64(o.total_len);
            w.bytes(o.payload);
        }
        GroupBody::Ack(a) => w.u64(a.held.0),
        GroupBody::Nack(n) => {
            w.u64(n.held.0);
            w.u64(n.from.0);
            w.u64(n.to.0);
        }
        GroupBody::Sync(s) => {
            w.u64(s.last.0);
            w.u64(s.commit.0);
            w.u64(s.stable.0);
            w.u8(s.want_status as u8);
        }
        GroupBody::Join(j) => {
            w.u64(j.nonce);
            w.addr(j.addr);
        }
        GroupBody::StateReq(s) => {
            w.u64(s.min_seq.0);
            w.u64(s.at_seq.0);
            w.u32(s.from_frag);
        }
        GroupBody::State(s) => {
            w.u64(s.at_seq.0);
            w.frag(s.frag);
            w.u64(s.total_len);
            w.bytes(s.payload);
        }
        GroupBody::Invite(i) => w.u64(i.ballot.0),
        GroupBody::Vote(v) => {
            w.u64(v.ballot.0);
            w.u64(v.coord.0);
            w.u64(v.last_normal.0);
            w.u64(v.last_normal_seqr.0);
            w.u64(v.held.0);
            w.u64(v.commit.0);
        }
        GroupBody::Fetch(f) => {
            w.u64(f.ballot.0);
            w.u64(f.from.0);
            w.u64(f.to.0);
        }
        GroupBody::Reject(r) => {
            w.u64(r.ballot.0);
            w.u64(r.coord.0);
            w.u64(r.sequencer.0);
        }
        GroupBody::NotMember(n) => w.u64(n.sequencer.0),
        GroupBody::Leave => {}
        GroupBody::InfoReq(i) => w.u64(i.nonce),
        GroupBody::Info(i) => {
            w.u64(i.nonce);
            w.bytes(i.json);
        }
    }
}

// Out of line: the RPC path's codec stays small without it.
#[inline(never)]
pub(crate) fn decode_group<'a>(kind: u8, r: &mut Reader<'a>) -> Result<GroupPacket<'a>, WireError> {
    let hdr = GroupHeader {
        group: r.port()?,
        inc: Incarnation(r.u64()?),
        seqr: MemberId(r.u64()?),
        from: MemberId(r.u64()?),
    };
    let body = match kind - GROUP_KIND_BASE {
        0 => GroupBody::Data(Data {
            msg_id: MsgId(r.u64()?),
            held: GroupSeq(r.u64()?),
            bb: r.flag()?,
            frag: r.frag()?,
            total_len: r.u64()?,
            payload: r.rest(),
        }),
        1 => GroupBody::Order(Order {
            seq: GroupSeq(r.u64()?),
            entry_inc: Incarnation(r.u64()?),
            sender: MemberId(r.u64()?),
            msg_id: MsgId(r.u64()?),
            kind: EntryKind::from_u8(r.u8()?).ok_or(WireError::Malformed("entry kind"))?,
            flags: r.u8()?,
            commit: GroupSeq(r.u64()?),
            stable: GroupSeq(r.u64()?),
            frag: r.frag()?,
            total_len: r.u64()?,
            payload: r.rest(),
        }),
        2 => GroupBody::Ack(GAck {
            held: GroupSeq(r.u64()?),
        }),
        3 => GroupBody::Nack(Nack {
            held: GroupSeq(r.u64()?),
            from: GroupSeq(r.u64()?),
            to: GroupSeq(r.u64()?),
        }),
        4 => GroupBody::Sync(Sync {
            last: GroupSeq(r.u64()?),
            commit: GroupSeq(r.u64()?),
            stable: GroupSeq(r.u64()?),
            want_status: r.flag()?,
        }),
        5 => GroupBody::Join(Join {
            nonce: r.u64()?,
            addr: r.addr()?,
        }),
        6 => GroupBody::StateReq(StateReq {
            min_seq: GroupSeq(r.u64()?),
            at_seq: GroupSeq(r.u64()?),
            from_frag: r.u32()?,
        }),
        7 => GroupBody::State(State {
            at_seq: GroupSeq(r.u64()?),
            frag: r.frag()?,
            total_len: r.u64()?,
            payload: r.rest(),
        }),
        8 => GroupBody::Invite(Invite {
            ballot: Incarnation(r.u64()?),
        }),
        9 => GroupBody::Vote(Vote {
            ballot: Incarnation(r.u64()?),
            coord: MemberId(r.u64()?),
            last_normal: Incarnation(r.u64()?),
            last_normal_seqr: MemberId(r.u64()?),
            held: GroupSeq(r.u64()?),
            commit: GroupSeq(r.u64()?),
        }),
        10 => GroupBody::Fetch(Fetch {
            ballot: Incarnation(r.u64()?),
            from: GroupSeq(r.u64()?),
            to: GroupSeq(r.u64()?),
        }),
        11 => GroupBody::Reject(Reject {
            ballot: Incarnation(r.u64()?),
            coord: MemberId(r.u64()?),
            sequencer: MemberId(r.u64()?),
        }),
        12 => GroupBody::NotMember(NotMember {
            sequencer: MemberId(r.u64()?),
        }),
        13 => GroupBody::Leave,
        14 => GroupBody::InfoReq(InfoReq { nonce: r.u64()? }),
        15 => GroupBody::Info(Info {
            nonce: r.u64()?,
            json: r.rest(),
        }),
        _ => return Err(WireError::BadKind(kind)),
    };
    if let GroupBody::Data(Data { frag, .. })
    | GroupBody::Order(Order { frag, .. })
    | GroupBody::State(State { frag, .. }) = &body
        && (frag.count == 0 || frag.index >= frag.count)
    {
        return Err(WireError::Malformed("fragment index out of range"));
    }
    Ok(GroupPacket { hdr, body })
}

/// A member as group datagrams name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemberEntry {
    pub id: MemberId,
    pub addr: SocketAddr,
}

/// Encodes one member (the payload of a join entry).
pub fn encode_member(m: &MemberEntry, out: &mut Vec<u8>) {
    let mut w = Writer(out);
    w.u64(m.id.0);
    w.addr(m.addr);
}

/// Decodes one member; the whole input must be used.
pub fn decode_member(bytes: &[u8]) -> Result<MemberEntry, WireError> {
    let mut r = crate::codec::reader(bytes);
    let m = r.member()?;
    r.end()?;
    Ok(m)
}

/// Encodes a member list (the payload of a view entry).
pub fn encode_members(members: &[MemberEntry], out: &mut Vec<u8>) {
    assert!(members.len() <= MAX_GROUP_MEMBERS);
    let mut w = Writer(out);
    w.u16(members.len() as u16);
    for m in members {
        w.u64(m.id.0);
        w.addr(m.addr);
    }
}

/// Decodes a member list; the whole input must be used.
pub fn decode_members(bytes: &[u8]) -> Result<Vec<MemberEntry>, WireError> {
    let mut r = crate::codec::reader(bytes);
    let list = r.members()?;
    r.end()?;
    Ok(list)
}

/// A view entry: the incarnation whose log the new one continues, and the
/// new membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    pub continues: Incarnation,
    pub continues_seqr: MemberId,
    pub members: Vec<MemberEntry>,
}

/// Encodes a view entry's payload.
pub fn encode_view(view: &View, out: &mut Vec<u8>) {
    let mut w = Writer(out);
    w.u64(view.continues.0);
    w.u64(view.continues_seqr.0);
    encode_members(&view.members, out);
}

/// Decodes a view entry's payload; the whole input must be used.
pub fn decode_view(bytes: &[u8]) -> Result<View, WireError> {
    let mut r = crate::codec::reader(bytes);
    let continues = Incarnation(r.u64()?);
    let continues_seqr = MemberId(r.u64()?);
    let members = r.members()?;
    r.end()?;
    Ok(View {
        continues,
        continues_seqr,
        members,
    })
}

/// What a joiner learns besides the application's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateMeta {
    pub inc: Incarnation,
    pub sequencer: MemberId,
    /// The group's parameters, fixed at creation: resilience degree,
    /// PB/BB threshold, reset minimum (0: the default rule).
    pub resilience: u32,
    pub large_bytes: u64,
    pub min_members: u32,
    /// Membership after entry `at_seq`.
    pub members: Vec<MemberEntry>,
    /// Last message number sequenced for each sender.
    pub senders: Vec<(MemberId, MsgId)>,
}

/// Encodes `meta` followed by `app` (a state transfer's whole body).
pub fn encode_state(meta: &StateMeta, app: &[u8], out: &mut Vec<u8>) {
    assert!(meta.senders.len() <= MAX_GROUP_MEMBERS);
    encode_members(&meta.members, out);
    let mut w = Writer(out);
    w.u64(meta.inc.0);
    w.u64(meta.sequencer.0);
    w.u32(meta.resilience);
    w.u64(meta.large_bytes);
    w.u32(meta.min_members);
    w.u16(meta.senders.len() as u16);
    for (id, last) in &meta.senders {
        w.u64(id.0);
        w.u64(last.0);
    }
    w.bytes(app);
}

/// Splits a state transfer's body into its metadata and application state.
pub fn decode_state(bytes: &[u8]) -> Result<(StateMeta, &[u8]), WireError> {
    let mut r = crate::codec::reader(bytes);
    let members = r.members()?;
    let inc = r.u64()?;
    let sequencer = MemberId(r.u64()?);
    let resilience = r.u32()?;
    let large_bytes = r.u64()?;
    let min_members = r.u32()?;
    let n = r.u16()? as usize;
    if n > MAX_GROUP_MEMBERS {
        return Err(WireError::Malformed("too many senders"));
    }
    let mut senders = Vec::with_capacity(n.min(r.remaining() / 16));
    for _ in 0..n {
        senders.push((MemberId(r.u64()?), MsgId(r.u64()?)));
    }
    let app = r.rest();
    Ok((
        StateMeta {
            inc: Incarnation(inc),
            sequencer,
            resilience,
            large_bytes,
            min_members,
            members,
            senders,
        },
        app,
    ))
}
