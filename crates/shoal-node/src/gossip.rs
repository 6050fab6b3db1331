//! Signed news between nodes (`docs/security.md`, "Admission and
//! revocation"): the cluster's revocation list and service map are records
//! the administrator signs with a version.  A node that takes a newer one
//! (from the administrator, or from a peer) keeps it, and nodes tell each
//! other the versions they hold inside their node sessions: at once after
//! a node took one, and every [`ANNOUNCE_EVERY`].  A node whose peer holds
//! an older version sends that peer the record; one whose peer holds a
//! newer version answers with its own version, which brings the record
//! back.  So a record given to any node reaches every node its sessions
//! reach, and a node that was away catches up at the next announcement.
//!
//! Checking a record's signature is the caller's (it holds the keys); the
//! rules here decide what a node says, and when.  Time is the caller's
//! monotonic clock.

use std::time::Duration;

use shoal_time::Time;

/// How often a node tells its peers the versions it holds.
pub const ANNOUNCE_EVERY: Duration = Duration::from_secs(5);

/// What to answer a peer that said which version of a record it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer<'a> {
    /// Ours is newer: the record itself.
    Record(&'a [u8]),
    /// Theirs is newer: our version, so that they send theirs.
    OurVersion,
}

/// The answer to a peer that holds version `theirs` of a record of which
/// this node holds `ours` (its version and signed bytes); nothing if the
/// two are the same.  A node holding none has version 0.
pub fn answer(theirs: u64, ours: Option<(u64, &[u8])>) -> Option<Answer<'_>> {
    match ours {
        Some((version, bytes)) if theirs < version => Some(Answer::Record(bytes)),
        _ => (theirs > ours.map_or(0, |(v, _)| v)).then_some(Answer::OurVersion),
    }
}

/// Whether a record of version `offered`, its signature checked, is to be
/// taken by a node that holds version `held` (none: 0): only a newer one
/// is, so a node never goes back.
pub fn newer(held: Option<u64>, offered: u64) -> bool {
    offered > held.unwrap_or(0)
}

/// When a node tells its peers the versions it holds: at start, at once
/// after it took a record ([`Announcer::soon`]), and every
/// [`ANNOUNCE_EVERY`] in between.
#[derive(Debug, Clone)]
pub struct Announcer {
    last: Option<Time>,
    soon: bool,
}

impl Default for Announcer {
    fn default() -> Self {
        Announcer::new()
    }
}

impl Announcer {
    /// One that announces at its first poll.
    pub fn new() -> Announcer {
        Announcer {
            last: None,
            soon: true,
        }
    }

    /// Announce at the next poll (a record was taken).
    pub fn soon(&mut self) {
        self.soon = true;
    }

    /// Whether to announce now; if so, the next is due [`ANNOUNCE_EVERY`]
    /// later.
    pub fn poll(&mut self, now: Time) -> bool {
        let due = self.soon
            || self
                .last
                .is_none_or(|t| now.saturating_since(t) >= ANNOUNCE_EVERY);
        if due {
            self.soon = false;
            self.last = Some(now);
        }
        due
    }

    /// When [`Announcer::poll`] next says yes, unless [`Announcer::soon`]
    /// makes it sooner.
    pub fn next(&self) -> Time {
        match (self.soon, self.last) {
            (false, Some(t)) => t + ANNOUNCE_EVERY,
            _ => Time::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_older_side_gets_the_record_and_equals_say_nothing() {
        let ours = Some((3, &b"list3"[..]));
        assert_eq!(answer(2, ours), Some(Answer::Record(b"list3")));
        assert_eq!(answer(0, ours), Some(Answer::Record(b"list3")));
        assert_eq!(answer(3, ours), None);
        assert_eq!(answer(4, ours), Some(Answer::OurVersion));
        assert_eq!(answer(0, None), None);
        assert_eq!(answer(1, None), Some(Answer::OurVersion));
    }

    #[test]
    fn only_a_newer_record_is_taken() {
        assert!(newer(None, 1));
        assert!(!newer(None, 0));
        assert!(newer(Some(3), 4));
        assert!(!newer(Some(3), 3));
        assert!(!newer(Some(3), 2));
    }

    #[test]
    fn announcements_come_at_start_on_news_and_on_the_interval() {
        let mut a = Announcer::new();
        let s = Time::from_secs;
        assert_eq!(a.next(), Time::ZERO);
        assert!(a.poll(s(1)));
        assert!(!a.poll(s(2)));
        assert_eq!(a.next(), s(6));
        assert!(!a.poll(s(5)));
        assert!(a.poll(s(6)));
        a.soon();
        assert_eq!(a.next(), Time::ZERO);
        assert!(a.poll(s(7)));
        assert!(!a.poll(s(8)));
    }
}
