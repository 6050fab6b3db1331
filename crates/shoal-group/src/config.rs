//! Group parameters: those fixed when the group is created (resilience,
//! the PB/BB threshold) and local timing and memory limits.

use std::time::Duration;

/// Parameters of one member.  `resilience` and `large_bytes` are the
/// group's: every member should use the creator's values (they travel in
/// the group's description; see `shoal-rpc`'s `group` module).
#[derive(Debug, Clone)]
pub struct GroupConfig {
    /// Resilience degree r: a message is delivered only once r members
    /// besides the sequencer hold it, so it survives any r simultaneous
    /// crashes.
    pub resilience: usize,
    /// Messages of at least this many bytes are broadcast by their sender
    /// (BB); smaller ones go through the sequencer (PB).
    pub large_bytes: usize,
    /// Largest fragment payload this member sends.
    pub frag_bytes: usize,
    /// Bytes of history the sequencer keeps before it stops accepting new
    /// messages and expels the member that holds it back.  Members keep
    /// at most twice this.
    pub history_bytes: usize,
    /// Messages a member may have in flight (sent, not yet ordered).
    pub send_window: usize,
    /// Bytes a member may have in flight.
    pub send_window_bytes: usize,
    /// Internal clock tick: retries and failure checks run this often.
    pub tick: Duration,
    /// The sequencer broadcasts a heartbeat when it has been quiet this long.
    pub heartbeat: Duration,
    /// With resilience r > 0: how long the sequencer holds back the
    /// broadcast of a commit point that only its own process's messages
    /// moved.  Their sender is told at once (it lives with the sequencer);
    /// the other members learn the commit point from the next entry's
    /// broadcast, which carries it, or after this long.  Zero: at once.
    pub accept_delay: Duration,
    /// A member suspects the sequencer after this much silence.
    pub suspect_after: Duration,
    /// The sequencer suspects a member after this much silence, despite
    /// status requests; also how long a member may hold history back
    /// before it is expelled.
    pub dead_after: Duration,
    /// Retransmission interval for data, acks, nacks, invites and joins.
    pub retransmit: Duration,
    /// A sender retries this many times before it suspects the sequencer.
    pub send_retries: u32,
    /// A recovery coordinator waits this long for every member's vote
    /// before it settles for a quorum.
    pub vote_wait: Duration,
    /// A recovery that has not installed a new incarnation after this long
    /// fails (and is tried again after `suspect_after`).
    pub recovery_timeout: Duration,
    /// A joiner gives up after this long.
    pub join_timeout: Duration,
    /// Largest application state a joiner accepts (its buffer is allocated
    /// when the first fragment arrives).
    pub max_state_bytes: usize,
    /// Least number of members a reset needs, besides the resilience rule
    /// (see [`GroupConfig::quorum`]); `None`: a majority.
    pub min_members: Option<usize>,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            resilience: 0,
            large_bytes: 8 * 1024,
            frag_bytes: 60_000,
            history_bytes: 64 << 20,
            send_window: 64,
            send_window_bytes: 16 << 20,
            tick: Duration::from_millis(10),
            heartbeat: Duration::from_millis(40),
            accept_delay: Duration::from_millis(1),
            suspect_after: Duration::from_millis(200),
            dead_after: Duration::from_millis(600),
            retransmit: Duration::from_millis(30),
            send_retries: 8,
            vote_wait: Duration::from_millis(100),
            recovery_timeout: Duration::from_millis(1500),
            join_timeout: Duration::from_secs(5),
            max_state_bytes: 1 << 30,
            min_members: None,
        }
    }
}

impl GroupConfig {
    /// Members that must vote for a reset of a group of `n` members:
    /// at least `n - r` (so the voters include a holder of every delivered
    /// message) and at least `min_members`, by default a majority (so two
    /// sides of a partition can never both reset).
    pub fn quorum(&self, n: usize) -> usize {
        self.majority(n).max(self.holders_needed(n))
    }

    /// The majority part of [`GroupConfig::quorum`]: `min_members`, by
    /// default a majority of `n`.
    pub fn majority(&self, n: usize) -> usize {
        self.min_members.unwrap_or(n / 2 + 1).clamp(1, n.max(1))
    }

    /// The resilience part of [`GroupConfig::quorum`]: at least `n - r`
    /// (and 1) of the `n` members that may hold entries.
    pub fn holders_needed(&self, n: usize) -> usize {
        n.saturating_sub(self.resilience).clamp(1, n.max(1))
    }

    /// Members besides the sequencer that must hold an entry before it
    /// is delivered, in a group of `n` members.
    pub fn acks_needed(&self, n: usize) -> usize {
        self.resilience.min(n.saturating_sub(1))
    }
}
