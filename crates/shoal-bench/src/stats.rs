//! Summaries of samples.

use std::time::Duration;

/// Percentile `p` (0-100) of `samples`, in microseconds.
pub fn percentile_us(samples: &mut [Duration], p: usize) -> f64 {
    assert!(!samples.is_empty(), "no samples");
    samples.sort_unstable();
    let i = (samples.len() * p / 100).min(samples.len() - 1);
    samples[i].as_secs_f64() * 1e6
}

/// The median of `values`.
pub fn median(values: &mut [f64]) -> f64 {
    assert!(!values.is_empty(), "no values");
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
