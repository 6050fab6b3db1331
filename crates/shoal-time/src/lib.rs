//! Time as the cores see it: microseconds on a monotonic clock whose origin
//! the shell chooses.  The simulator starts it at zero.
//!
//! Every protocol core takes its "now" as a [`Time`] (the RPC and group
//! cores, the node supervisor and gossip, sessions, the file system's
//! tokens and leases), and a length of time as a `Duration`, so the same
//! core runs on the daemon's clock and on the simulator's.

use std::ops::{Add, AddAssign, Sub};
use std::time::Duration;

/// A point in time, in microseconds since the shell's origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(pub u64);

impl Time {
    /// The origin (where the simulator starts).
    pub const ZERO: Time = Time(0);

    /// `secs` seconds after the origin.
    pub const fn from_secs(secs: u64) -> Time {
        Time(secs * 1_000_000)
    }

    /// Microseconds since the origin.
    pub fn as_micros(self) -> u64 {
        self.0
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Time) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }
}

/// `d` in whole microseconds, at most `u64::MAX`.
fn micros(d: Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

/// `d` later, or the end of time if that is past it.
impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(micros(d)))
    }
}

/// `d` earlier, or the origin if that is before it.
impl Sub<Duration> for Time {
    type Output = Time;
    fn sub(self, d: Duration) -> Time {
        Time(self.0.saturating_sub(micros(d)))
    }
}

impl AddAssign<Duration> for Time {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl Sub<Time> for Time {
    type Output = Duration;
    fn sub(self, earlier: Time) -> Duration {
        self.saturating_since(earlier)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_at_both_ends() {
        let t = Time::from_secs(2);
        assert_eq!(t + Duration::from_millis(1), Time(2_001_000));
        assert_eq!(t - Duration::from_secs(3), Time::ZERO);
        assert_eq!(Time(u64::MAX) + Duration::from_secs(1), Time(u64::MAX));
        assert_eq!(Time::ZERO - t, Duration::ZERO);
        assert_eq!(t - Time::ZERO, Duration::from_secs(2));
        let mut u = t;
        u += Duration::from_secs(1);
        assert_eq!(u.saturating_since(t), Duration::from_secs(1));
    }
}
