//! The decisions of a replica of a replicated service, without I/O: when
//! a write's answer may leave (durability), how replicas form, join and
//! re-form their group, how group messages name the replica that sent
//! them, and how a log file frames its records.  The state machine being
//! replicated is a [`Machine`]; the directory service (`shoal_dir`) and
//! the file system's metadata service (`shoal_fs`) are two.  The replica
//! shell (`shoal-replicasvc`) and the simulator both drive this code.
//!
//! **Architecture invariant:** no sockets, files, clocks or randomness;
//! decoders never panic.

#![forbid(unsafe_code)]

pub mod frame;

use std::time::Duration;

use shoal_cap::PutPort;

/// A deterministic state machine that replicas keep identical by applying
/// the same group messages in the same order.
pub trait Machine: Sized + Send + Sync + 'static {
    /// What applying one message answers (the replica that sent it passes
    /// it to the client).
    type Output: Send + 'static;

    /// The state's index: how far the ordered messages that changed it
    /// (or a log's marks) have taken it.
    fn index(&self) -> u64;

    /// Applies one ordered message (its payload, after the origin): the
    /// state changes and the message is kept for the log.  `None` for an
    /// undecodable message, which changes nothing.
    fn deliver(&mut self, message: &[u8]) -> Option<Self::Output>;

    /// The bytes to append to the log since the last take, emptying the
    /// buffer; with `mark`, they end at the state's index even when the
    /// last messages left nothing to log ([`Durability::marks`]).
    fn take_log(&mut self, mark: bool) -> Option<Vec<u8>>;

    /// The index of the latest message the log buffer has seen.
    fn logged_index(&self) -> u64;

    /// The header of a log that follows the snapshot at `base`.
    fn log_header(base: u64) -> Vec<u8>;

    /// The whole state, for a snapshot file or a state transfer.
    fn encode_snapshot(&self) -> Vec<u8>;

    /// A state transfer's state.
    fn decode_snapshot(bytes: &[u8]) -> Result<Self, String>;

    /// Rebuilds the state of the service at `port` from its snapshot (if
    /// any) and its logs, given as (base, bytes) sorted by base.
    fn recover(
        port: PutPort,
        snapshot: Option<&[u8]>,
        logs: &[(u64, &[u8])],
    ) -> Result<Recovery<Self>, String>;

    /// Sizes to show in the replica's status (name, value).
    fn counts(&self) -> Vec<(&'static str, u64)>;
}

/// What recovery rebuilt from a snapshot and its logs.
#[derive(Debug)]
pub struct Recovery<M> {
    pub state: M,
    /// Log records replayed.
    pub replayed: usize,
    /// Per log (in the order given): `Some(len)` to keep it cut to `len`
    /// bytes (its intact records; `len` below its size means a torn tail),
    /// `None` if the snapshot covers it (delete it).
    pub keep: Vec<Option<usize>>,
}

/// A group message: `origin u64 | payload` (the origin tells the replica
/// that sent it which answers are its own).
pub fn entry(origin: u64, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(8 + payload.len());
    body.extend_from_slice(&origin.to_le_bytes());
    body.extend_from_slice(payload);
    body
}

/// A group message's origin and payload; `None` if it is too short.
pub fn split_entry(body: &[u8]) -> Option<(u64, &[u8])> {
    let (origin, payload) = body.split_at_checked(8)?;
    Some((u64::from_le_bytes(origin.try_into().ok()?), payload))
}

/// When a replica's log reaches the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Each replica appends the update to its log and fsyncs it; the replica
    /// that answers does so before it answers.  Losing every replica at
    /// once loses no acknowledged update.
    Fsync,
    /// The update is acknowledged once r + 1 replicas hold it in memory;
    /// logs are flushed in the background.  Survives any r simultaneous
    /// crashes, not the loss of every replica at once.
    Replicated,
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fsync" => Ok(Durability::Fsync),
            "replicated" => Ok(Durability::Replicated),
            _ => Err(format!("unknown durability {s:?}: use fsync or replicated")),
        }
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Durability::Fsync => "fsync",
            Durability::Replicated => "replicated",
        })
    }
}

impl Durability {
    /// Whether the answer to a write applied at `index` may leave when the
    /// log is on disk up to `durable`.
    pub fn reply_ready(self, index: u64, durable: u64) -> bool {
        self == Durability::Replicated || durable >= index
    }

    /// Whether flushes end with a mark when their tail cancelled out (see
    /// [`LogBuffer::take`]).
    pub fn marks(self) -> bool {
        self == Durability::Fsync
    }
}

/// Where a replica stands, as its peers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Not in a group: asking peers.
    Forming,
    /// Joined; waiting for the state transfer.
    Joining,
    /// In the group and serving.
    Member,
    /// In a group that cannot reset (too few members answer).
    Stuck,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Forming => "forming",
            Phase::Joining => "joining",
            Phase::Member => "member",
            Phase::Stuck => "stuck",
        }
    }

    pub fn parse(s: &str) -> Option<Phase> {
        Some(match s {
            "forming" => Phase::Forming,
            "joining" => Phase::Joining,
            "member" => Phase::Member,
            "stuck" => Phase::Stuck,
            _ => return None,
        })
    }
}

/// One peer's answer to "where are you?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerStatus {
    pub phase: Phase,
    /// The generation of the group it is in, or was last in.
    pub generation: u64,
    /// Writes it has applied.
    pub index: u64,
    /// Which group instance it is in ([`group_tag`]; 0: none).
    pub group: u64,
}

/// Names one instance of a group (an incarnation and its sequencer), so
/// replicas can tell whether they are in the same one.
pub fn group_tag(incarnation: u64, sequencer: &str) -> u64 {
    // FNV-1a: stable across processes and versions.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in incarnation.to_le_bytes().iter().chain(sequencer.as_bytes()) {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h | 1
}

/// What a replica outside the group does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Formation {
    /// Join the group of this generation.
    Join(u64),
    /// Create the group of this generation from this replica's state.
    Create(u64),
    /// Wait: these replicas did not answer (or another replica will
    /// create the group).
    Wait { missing: Vec<usize> },
}

/// The forming rule.  A replica joins a peer's group (unless that group has
/// applied fewer writes than this replica: then it waits for the group to
/// dissolve).  With no group
/// anywhere, the group is re-formed only once *every* replica has
/// answered, by the one with the most applied writes (ties: the lowest
/// number), in a generation above every one seen: so no replica starts
/// alone with a state that misses an update another replica acknowledged.
pub fn decide(
    me: usize,
    my_index: u64,
    my_generation: u64,
    peers: &[(usize, Option<PeerStatus>)],
) -> Formation {
    let members: Vec<PeerStatus> = peers
        .iter()
        .filter_map(|(_, s)| *s)
        .filter(|s| s.phase == Phase::Member)
        .collect();
    if let Some(m) = members.iter().max_by_key(|s| (s.index, s.generation)) {
        if m.index >= my_index {
            return Formation::Join(m.generation);
        }
        // A group behind this replica: it dissolves when it notices
        // ([`behind`]); joining it would throw this replica's writes away.
        return Formation::Wait {
            missing: Vec::new(),
        };
    }
    let missing: Vec<usize> = peers
        .iter()
        .filter(|(_, s)| s.is_none_or(|s| s.phase != Phase::Forming))
        .map(|(i, _)| *i)
        .collect();
    if !missing.is_empty() {
        return Formation::Wait { missing };
    }
    let mine = (my_index, std::cmp::Reverse(me));
    let best = peers
        .iter()
        .filter_map(|(i, s)| s.map(|s| (s.index, std::cmp::Reverse(*i))))
        .max();
    if best.is_some_and(|b| b > mine) {
        return Formation::Wait {
            missing: Vec::new(),
        };
    }
    let generation = peers
        .iter()
        .filter_map(|(_, s)| s.map(|s| s.generation))
        .chain([my_generation])
        .max()
        .unwrap_or(0)
        + 1;
    Formation::Create(generation)
}

/// What a replica whose group could not reset does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stuck {
    /// Reset the group with the members it can reach, however few: they
    /// keep everything they hold, delivered or not.
    Reset,
    /// The group works again and holds the most: serve.
    Serve,
    /// Leave the group, to join another.
    Leave,
    /// Wait for every replica to answer.
    Wait,
}

/// The rule for a stuck replica (one whose group could not reset: more
/// members are lost than its quorum allows).  Only when every other replica
/// answered: if one is in another, working group, leave this one and join
/// that.  If none is, and no replica has applied more writes than this one
/// can reach by delivering what its member holds (`held`: messages held and
/// not yet applied), reset the group with whoever it reaches — without
/// serving yet: two stuck groups may both do so — and once it works, serve
/// unless a replica outside its group has applied more writes, or another
/// stuck group ranks higher (more writes; ties: the lowest number); else
/// leave, and join the one that goes on.  So at most one group serves, and it holds every write
/// any replica applied.  `my_group` is this replica's [`group_tag`].
///
/// The check before the reset matters for a replica that joined shortly
/// before the others failed: writes committed while it joined went to
/// the members before and after the join, not to it (`docs/group.md`).  A
/// reset with itself alone would order new writes in their place; a peer
/// restarted from its disk, still joining this group, would take the
/// new state in its turn and the committed writes would be lost.
pub fn when_stuck(
    me: usize,
    my_index: u64,
    held: u64,
    my_group: u64,
    group_works: bool,
    peers: &[(usize, Option<PeerStatus>)],
) -> Stuck {
    if peers.iter().any(|(_, s)| s.is_none()) {
        return Stuck::Wait;
    }
    let outside = || {
        peers
            .iter()
            .filter_map(|(i, s)| s.map(|s| (*i, s)))
            .filter(|(_, s)| s.group != my_group)
    };
    if outside().any(|(_, s)| s.phase == Phase::Member) {
        return Stuck::Leave;
    }
    if !group_works {
        let reach = my_index.saturating_add(held);
        if peers
            .iter()
            .any(|(_, s)| s.is_some_and(|s| s.index > reach))
        {
            return Stuck::Leave;
        }
        return Stuck::Reset;
    }
    // Serve unless a replica outside has applied more, or another stuck
    // group ranks higher (most writes, then the lowest number).  A replica
    // out of any group with as many writes holds the same state, and joins.
    let mine = (my_index, std::cmp::Reverse(me));
    let outranked = outside().any(|(i, s)| {
        s.index > my_index || (s.phase == Phase::Stuck && (s.index, std::cmp::Reverse(i)) > mine)
    });
    if outranked {
        Stuck::Leave
    } else {
        Stuck::Serve
    }
}

/// Whether a working group is behind a replica outside it (one that has
/// applied more writes: the group was re-formed without it after more
/// than r failures): then the group must dissolve and re-form from the
/// best replica, so no applied — possibly acknowledged — write is lost.
///
/// `unapplied` counts the group messages this replica's member holds and
/// it has not applied yet: each may still raise its index by one.
/// A peer is ahead only beyond them.  A replica restarted from its disk
/// may report more than this one has *applied* while this one's group
/// still holds everything it has (the commit point of the last writes was
/// lost with their sequencer); dissolving then would throw away the only
/// copy of acknowledged writes, and of the sessions that keep retries from
/// applying twice.  Instead the group delivers them (it resets, alone if
/// it must: [`when_stuck`]) and then compares.
pub fn behind(my_index: u64, unapplied: u64, peers: &[(usize, Option<PeerStatus>)]) -> bool {
    let reach = my_index.saturating_add(unapplied);
    peers.iter().any(|(_, s)| {
        s.is_some_and(|s| matches!(s.phase, Phase::Forming | Phase::Joining) && s.index > reach)
    })
}

/// How long a joiner waits for its state transfer before it leaves the
/// group and forms (joins) again.
pub const JOIN_WAIT: Duration = Duration::from_secs(15);

/// Where a replica stands, for [`control`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// Its number among the replicas.
    pub me: usize,
    pub phase: Phase,
    /// Writes it has applied, and the group messages its member holds and
    /// has not applied yet.
    pub index: u64,
    pub unapplied: u64,
    /// The generation of the group it is in, or was last in.
    pub generation: u64,
    /// Its group's [`group_tag`] (0: none), and whether that group works.
    pub group: u64,
    pub group_works: bool,
    /// How long it has been joining (in [`Phase::Joining`]).
    pub joining_for: Duration,
}

/// Why a replica leaves its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// A replica outside the group has applied more writes ([`behind`]).
    Behind,
    /// No state transfer came within [`JOIN_WAIT`].
    NoStateTransfer,
    /// Its group cannot reset and another replica goes on ([`when_stuck`]).
    AnotherGoesOn,
}

/// What a replica's control loop does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Go on as it is.
    Stay,
    /// Leave the group, to form or join again.
    Leave(Why),
    /// Reset the group with the members it reaches ([`Stuck::Reset`]).
    Reset,
    /// Its stuck group works again and holds the most: serve.
    Serve,
    /// Outside a group: join, create or wait ([`decide`]).
    Form(Formation),
}

/// One turn of a replica's control loop, the replica shell's and the
/// simulator's alike: what the replica does, given where it stands and
/// its peers' answers (which a joiner does not need).  A member leaves a
/// group that is [`behind`]; a joiner leaves once it has waited
/// [`JOIN_WAIT`] for its state; a stuck replica does what
/// [`when_stuck`] says; a replica outside a group does what [`decide`]
/// says.
pub fn control(s: &Standing, peers: &[(usize, Option<PeerStatus>)]) -> Control {
    match s.phase {
        Phase::Member if behind(s.index, s.unapplied, peers) => Control::Leave(Why::Behind),
        Phase::Member => Control::Stay,
        Phase::Joining if s.joining_for > JOIN_WAIT => Control::Leave(Why::NoStateTransfer),
        Phase::Joining => Control::Stay,
        Phase::Stuck => {
            match when_stuck(s.me, s.index, s.unapplied, s.group, s.group_works, peers) {
                Stuck::Reset => Control::Reset,
                Stuck::Serve => Control::Serve,
                Stuck::Leave => Control::Leave(Why::AnotherGoesOn),
                Stuck::Wait => Control::Stay,
            }
        }
        Phase::Forming => Control::Form(decide(s.me, s.index, s.generation, peers)),
    }
}

/// How long a member's group may be in a reset before the replica reports
/// itself stuck (so replicas outside do not wait to join it).
pub const STUCK_AFTER: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    fn st(phase: Phase, generation: u64, index: u64) -> Option<PeerStatus> {
        Some(PeerStatus {
            phase,
            generation,
            index,
            group: generation,
        })
    }

    #[test]
    fn one_turn_of_the_control_loop_per_phase() {
        let me = |phase, index, unapplied, joining_for| Standing {
            me: 0,
            phase,
            index,
            unapplied,
            generation: 1,
            group: 1,
            group_works: true,
            joining_for,
        };
        let ahead = [(1, st(Phase::Forming, 1, 9)), (2, st(Phase::Member, 1, 5))];
        // A member leaves a group a replica outside has overtaken, unless
        // what it holds unapplied would take it as far.
        let m = me(Phase::Member, 5, 0, Duration::ZERO);
        assert_eq!(control(&m, &ahead), Control::Leave(Why::Behind));
        assert_eq!(
            control(&me(Phase::Member, 5, 4, Duration::ZERO), &ahead),
            Control::Stay
        );
        // A joiner waits for its state, then leaves; it asks no one.
        assert_eq!(
            control(&me(Phase::Joining, 0, 0, JOIN_WAIT), &[]),
            Control::Stay
        );
        assert_eq!(
            control(
                &me(Phase::Joining, 0, 0, JOIN_WAIT + Duration::from_micros(1)),
                &[]
            ),
            Control::Leave(Why::NoStateTransfer)
        );
        // Stuck: the rule of `when_stuck`.
        let stuck = Standing {
            group_works: false,
            ..me(Phase::Stuck, 5, 0, Duration::ZERO)
        };
        assert_eq!(control(&stuck, &[(1, None)]), Control::Stay);
        assert_eq!(
            control(&stuck, &[(1, st(Phase::Forming, 1, 2))]),
            Control::Reset
        );
        assert_eq!(
            control(&stuck, &[(1, st(Phase::Member, 3, 2))]),
            Control::Leave(Why::AnotherGoesOn)
        );
        let works = Standing {
            group_works: true,
            ..stuck
        };
        assert_eq!(
            control(&works, &[(1, st(Phase::Forming, 1, 2))]),
            Control::Serve
        );
        // Outside a group: the forming rule.
        assert_eq!(
            control(
                &me(Phase::Forming, 2, 0, Duration::ZERO),
                &[(1, st(Phase::Member, 3, 2))]
            ),
            Control::Form(Formation::Join(3))
        );
    }

    #[test]
    fn forming_rule() {
        // Someone is in a group: join it, unless it is behind.
        assert_eq!(
            decide(0, 2, 1, &[(1, st(Phase::Member, 3, 2)), (2, None)]),
            Formation::Join(3)
        );
        assert_eq!(
            decide(0, 9, 1, &[(1, st(Phase::Member, 3, 2)), (2, None)]),
            Formation::Wait { missing: vec![] }
        );
        // Not everyone answered: wait, however good my state.
        assert_eq!(
            decide(0, 9, 1, &[(1, st(Phase::Forming, 1, 2)), (2, None)]),
            Formation::Wait { missing: vec![2] }
        );
        // All answered: the most writes creates, above every generation.
        let peers = [(1, st(Phase::Forming, 4, 7)), (2, st(Phase::Forming, 2, 9))];
        assert_eq!(decide(0, 8, 1, &peers), Formation::Wait { missing: vec![] });
        assert_eq!(
            decide(
                2,
                9,
                2,
                &[(0, st(Phase::Forming, 1, 8)), (1, st(Phase::Forming, 4, 7))]
            ),
            Formation::Create(5)
        );
        // Ties go to the lowest number.
        assert_eq!(
            decide(1, 5, 1, &[(0, st(Phase::Forming, 1, 5))]),
            Formation::Wait { missing: vec![] }
        );
        assert_eq!(
            decide(0, 5, 1, &[(1, st(Phase::Forming, 1, 5))]),
            Formation::Create(2)
        );
        // A stuck peer is neither a group to join nor out of one.
        assert_eq!(
            decide(0, 5, 1, &[(1, st(Phase::Stuck, 1, 5))]),
            Formation::Wait { missing: vec![1] }
        );
        let all_out = [(1, st(Phase::Forming, 1, 0)), (2, st(Phase::Stuck, 1, 3))];
        assert_eq!(when_stuck(0, 3, 0, 7, false, &all_out), Stuck::Reset);
        assert_eq!(when_stuck(0, 0, 0, 7, false, &all_out), Stuck::Leave);
        assert_eq!(when_stuck(0, 3, 0, 7, true, &all_out), Stuck::Serve);
        assert_eq!(when_stuck(3, 3, 0, 7, true, &all_out), Stuck::Leave);
        // Out of any group with as many writes: it joins; with more: leave.
        let joiner = [(0, st(Phase::Joining, 1, 3))];
        assert_eq!(when_stuck(2, 3, 0, 7, true, &joiner), Stuck::Serve);
        assert_eq!(when_stuck(2, 2, 0, 7, true, &joiner), Stuck::Leave);
        assert_eq!(when_stuck(0, 9, 0, 7, false, &[(1, None)]), Stuck::Wait);
        assert_eq!(
            when_stuck(0, 9, 0, 7, true, &[(1, st(Phase::Member, 1, 0))]),
            Stuck::Leave
        );
        // A member of this replica's own group (it joined after the reset)
        // is neither another group nor a rival.
        assert_eq!(
            when_stuck(3, 9, 0, 1, true, &[(1, st(Phase::Member, 1, 9))]),
            Stuck::Serve
        );
        // Before resetting alone: a peer that applied more than this
        // replica holds (one joining this very group, too) goes on instead.
        let ahead = [
            (1, st(Phase::Joining, 1, 26)),
            (2, st(Phase::Forming, 1, 26)),
        ];
        assert_eq!(when_stuck(0, 25, 0, 1, false, &ahead), Stuck::Leave);
        assert_eq!(when_stuck(0, 25, 1, 1, false, &ahead), Stuck::Reset);
        assert!(behind(4, 0, &[(1, st(Phase::Forming, 1, 5))]));
        assert!(!behind(
            5,
            0,
            &[(1, st(Phase::Forming, 1, 5)), (2, st(Phase::Member, 1, 9))]
        ));
        // Messages held and not yet applied may still bring it level.
        assert!(!behind(4, 1, &[(1, st(Phase::Forming, 1, 5))]));
        assert!(behind(4, 1, &[(1, st(Phase::Forming, 1, 6))]));
    }
}
