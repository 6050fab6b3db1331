//! The simulated network: per-datagram verdicts drawn from the seed.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// What the network does to datagrams.
#[derive(Debug, Clone)]
pub struct Faults {
    /// Chance a datagram is lost.
    pub drop: f64,
    /// Chance a datagram is delivered twice.
    pub duplicate: f64,
    /// Shortest one-way delay, microseconds.
    pub delay_min_us: u64,
    /// Longest one-way delay, microseconds (delays differ, so datagrams
    /// overtake each other).
    pub delay_max_us: u64,
}

impl Faults {
    /// A clean network: no loss, no duplicates, little jitter.
    pub fn none() -> Self {
        Self {
            drop: 0.0,
            duplicate: 0.0,
            delay_min_us: 50,
            delay_max_us: 150,
        }
    }

    /// A bad network: loss, duplicates and reordering.
    pub fn harsh() -> Self {
        Self {
            drop: 0.1,
            duplicate: 0.05,
            delay_min_us: 50,
            delay_max_us: 5_000,
        }
    }

    /// Delivery times for one datagram sent now: empty if lost, two if
    /// duplicated.
    pub(crate) fn verdict(&self, rng: &mut ChaCha8Rng) -> Vec<u64> {
        if rng.random_bool(self.drop) {
            return Vec::new();
        }
        let mut delays = vec![rng.random_range(self.delay_min_us..=self.delay_max_us)];
        if rng.random_bool(self.duplicate) {
            delays.push(rng.random_range(self.delay_min_us..=self.delay_max_us));
        }
        delays
    }
}
