//! The shells' clock: microseconds since the process first asked.

use std::sync::OnceLock;
use std::time::Instant;

use shoal_proto::Time;

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Now, as the protocol cores count time.
pub fn now() -> Time {
    Time(origin().elapsed().as_micros() as u64)
}

/// The core time of `at` (a clock read made for something else, so as
/// not to read the clock twice).
pub fn at(at: Instant) -> Time {
    Time(at.saturating_duration_since(origin()).as_micros() as u64)
}

/// The `std::time::Instant` of a core time.
pub fn instant(t: Time) -> Instant {
    origin() + std::time::Duration::from_micros(t.0)
}
