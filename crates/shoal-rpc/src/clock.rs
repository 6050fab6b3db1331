//! The shells' clock: microseconds since the process first asked.
//!
//! [`now`] reads the monotonic clock directly (what `Instant` reads on
//! Linux) and counts microseconds in a `u64`: the request path reads the
//! clock a few times per call, and `Instant`'s arithmetic (normalised
//! seconds and nanoseconds, checked at every step) cost more than the
//! read itself.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use shoal_proto::Time;

/// The origin, as an `Instant` and as the monotonic clock's microseconds,
/// read together.
struct Origin {
    instant: Instant,
    micros: u64,
}

fn origin() -> &'static Origin {
    static ORIGIN: OnceLock<Origin> = OnceLock::new();
    ORIGIN.get_or_init(|| Origin {
        instant: Instant::now(),
        micros: monotonic_micros(),
    })
}

fn monotonic_micros() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC always
    // exists on Linux, so the call cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// Now, as the protocol cores count time.
pub fn now() -> Time {
    let origin = origin();
    Time(monotonic_micros().saturating_sub(origin.micros))
}

/// The `std::time::Instant` of a core time.
pub fn instant(t: Time) -> Instant {
    origin().instant + Duration::from_micros(t.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_readings_agree() {
        let before = Instant::now();
        let t = instant(now());
        let after = Instant::now();
        // The two origins were read microseconds apart at most.
        let slack = Duration::from_micros(50);
        assert!(
            t + slack >= before && t <= after + slack,
            "{before:?} {t:?} {after:?}"
        );
    }
}
