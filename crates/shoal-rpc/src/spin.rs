//! Whether a client should poll for its reply before it sleeps.
//!
//! Polling pays when the server runs on another core: the reply is picked
//! up the moment it lands, without waking a sleeping thread (about 90 µs
//! on some virtual machines).  It costs when client and server share a
//! core: the polling client only delays the server it waits for.  Which
//! case holds is the scheduler's choice and changes over time, so the
//! client finds out by trying: it mostly uses the mode that has been
//! faster, and now and then runs a few calls in the other mode, switching
//! when that one is clearly faster.  Only small calls (one fragment each
//! way) are timed, so bulk transfers do not distort the comparison.

use std::time::Duration;

/// Calls per cycle; the last `PROBE` of each cycle try the other mode.
const CYCLE: u32 = 256;
const PROBE: u32 = 16;
/// Round trips kept of the current mode.
const KEEP: usize = 64;

#[derive(Debug)]
pub struct SpinPolicy {
    /// Poll this long when polling.
    spin: Duration,
    /// A fixed choice (`SHOAL_CLIENT_SPIN_US` set), or adaptive.
    fixed: bool,
    spinning: bool,
    calls: u32,
    current: Vec<u32>,
    probe: Vec<u32>,
}

impl SpinPolicy {
    /// A fixed policy: always poll for `spin` (zero: never).
    pub fn fixed(spin: Duration) -> Self {
        Self {
            spin,
            fixed: true,
            spinning: !spin.is_zero(),
            calls: 0,
            current: Vec::new(),
            probe: Vec::new(),
        }
    }

    /// An adaptive policy polling for `spin` when it polls.
    pub fn adaptive(spin: Duration) -> Self {
        Self {
            fixed: false,
            ..Self::fixed(spin)
        }
    }

    fn probing(&self) -> bool {
        !self.fixed && self.calls % CYCLE >= CYCLE - PROBE
    }

    /// How long to poll in the coming call.
    pub fn spin(&self) -> Duration {
        if self.spinning != self.probing() {
            self.spin
        } else {
            Duration::ZERO
        }
    }

    /// A small call took `rtt`.
    pub fn record(&mut self, rtt: Duration) {
        if self.fixed {
            return;
        }
        let us = rtt.as_micros().min(u32::MAX as u128) as u32;
        if self.probing() {
            self.probe.push(us);
        } else {
            // The latest `KEEP` round trips, oldest overwritten first.
            if self.current.len() < KEEP {
                self.current.push(us);
            } else {
                self.current[self.calls as usize % KEEP] = us;
            }
        }
        self.calls = self.calls.wrapping_add(1);
        if self.probe.len() >= PROBE as usize {
            let probe = median(&mut self.probe);
            let current = median(&mut self.current.clone());
            // Switch only for a clear win: noise must not flap the mode.
            if current.is_some_and(|c| probe.is_some_and(|p| p * 10 < c * 9)) {
                self.spinning = !self.spinning;
                self.current = std::mem::take(&mut self.probe);
            }
            self.probe.clear();
        }
    }
}

fn median(v: &mut [u32]) -> Option<u32> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    Some(v[v.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(policy: &mut SpinPolicy, calls: u32, rtt: impl Fn(bool) -> u64) {
        for _ in 0..calls {
            let spinning = !policy.spin().is_zero();
            policy.record(Duration::from_micros(rtt(spinning)));
        }
    }

    #[test]
    fn settles_on_the_faster_mode_and_follows_changes() {
        let mut p = SpinPolicy::adaptive(Duration::from_micros(50));
        // Server on another core: polling wins.
        run(&mut p, 1024, |s| if s { 10 } else { 100 });
        assert!(!p.spin().is_zero() || p.probing());
        assert!(p.spinning);
        // Now they share a core: sleeping wins.
        run(&mut p, 1024, |s| if s { 9 } else { 6 });
        assert!(!p.spinning);
    }

    #[test]
    fn fixed_policies_never_change() {
        let mut p = SpinPolicy::fixed(Duration::ZERO);
        run(&mut p, 2048, |s| if s { 1 } else { 100 });
        assert!(p.spin().is_zero());
        let mut p = SpinPolicy::fixed(Duration::from_micros(20));
        run(&mut p, 2048, |s| if s { 100 } else { 1 });
        assert_eq!(p.spin(), Duration::from_micros(20));
    }
}
