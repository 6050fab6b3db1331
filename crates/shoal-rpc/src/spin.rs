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
//!
//! How long to poll is a [`Window`]: a little longer than the waits a
//! thread has lately seen end in a datagram, so that on a machine where
//! a round trip is slow (a virtual machine whose every system call and
//! wake-up is dear) a busy thread still catches its answer awake, while
//! an idle one polls no longer than the base window, and one whose waits
//! the base window would hardly ever catch does not poll at all: a file
//! server taking a `fsync` every millisecond or so from each of a node's
//! programs polled 50 µs before each sleep for nothing, a tenth of the
//! machine's CPU under `dbench` (the programs and their mount went 10 %
//! faster without it).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Waits remembered by a [`Window`].
const GAPS: usize = 32;
/// A [`Window`] looks at its waits again after this many.
const RETHINK: u32 = 8;
/// The longest an adaptive [`Window`] polls: it follows waits of up to
/// half this.  Polling longer would spend more CPU on every wait than a
/// wake-up costs (tens of microseconds, at worst about a hundred).
pub const MAX_WINDOW: Duration = Duration::from_micros(500);
/// The share of its latest waits (one in this many) that the base window
/// must have caught for a thread whose waits are mostly long to go on
/// polling.  A wait counts as caught within twice the base: a thread that
/// slept measures its waits from before the wake-up it paid for.
const CAUGHT: usize = 4;

/// How long a waiting thread polls before it sleeps: fixed, or learned
/// from the waits it saw end in a datagram (twice their median, when that
/// is within [`MAX_WINDOW`]; else the base window, or, for a thread that
/// waits for requests ([`Window::from_setting`]), the base window if at
/// least a [`CAUGHT`] share of the waits were short enough for it to
/// catch, and no polling if not).  A client's window keeps its base: its
/// [`SpinPolicy`] decides whether it polls at all, by trying.
#[derive(Debug, Clone)]
pub struct Window {
    base: Duration,
    adaptive: bool,
    /// Whether it stops polling when the base would hardly ever catch a
    /// wait.
    stops: bool,
    /// The latest waits, in microseconds, oldest overwritten first.
    gaps: [u32; GAPS],
    seen: u32,
    current: Duration,
}

impl Window {
    /// Always `spin`.
    pub fn fixed(spin: Duration) -> Self {
        Self {
            base: spin,
            adaptive: false,
            stops: false,
            gaps: [u32::MAX; GAPS],
            seen: 0,
            current: spin,
        }
    }

    /// At least `base`, longer while the waits are short enough.
    pub fn adaptive(base: Duration) -> Self {
        Self {
            adaptive: true,
            ..Self::fixed(base)
        }
    }

    /// A waiting server's window, from a setting: `Some(d)` fixed, `None`
    /// adaptive from `base`, and none at all while `base` would catch too
    /// few of its waits.
    pub fn from_setting(setting: Option<Duration>, base: Duration) -> Self {
        match setting {
            Some(d) => Self::fixed(d),
            None => Self {
                stops: true,
                ..Self::adaptive(base)
            },
        }
    }

    /// How long to poll now.
    pub fn get(&self) -> Duration {
        self.current
    }

    /// The least it polls (a fixed window's only value).
    pub fn base(&self) -> Duration {
        self.base
    }

    /// A wait ended in a datagram after `gap`.
    pub fn saw(&mut self, gap: Duration) {
        self.push(gap.as_micros().min(u128::from(u32::MAX)) as u32);
    }

    /// A wait ended with nothing (it timed out, or was cut short).
    pub fn saw_nothing(&mut self) {
        self.push(u32::MAX);
    }

    fn push(&mut self, us: u32) {
        if !self.adaptive {
            return;
        }
        self.gaps[self.seen as usize % GAPS] = us;
        self.seen = self.seen.wrapping_add(1);
        if self.seen.is_multiple_of(RETHINK) {
            let mut sorted = self.gaps;
            sorted.sort_unstable();
            let twice = Duration::from_micros(u64::from(sorted[GAPS / 2]) * 2);
            let reach = (self.base * 2).as_micros().min(u128::from(u32::MAX)) as u32;
            let caught = sorted.partition_point(|&g| g <= reach);
            self.current = if twice <= MAX_WINDOW {
                twice.max(self.base)
            } else if !self.stops || caught * CAUGHT >= GAPS {
                self.base
            } else {
                Duration::ZERO
            };
        }
    }
}

/// A client thread waiting for its reply, counted while it waits: a
/// process's client threads poll only while no more of them wait than
/// half the CPUs (at least one).  Each polling thread keeps a CPU busy;
/// when more threads wait at once, the process is pushing many calls
/// through, the CPUs have other work (its servers', its own), and the
/// replies are better waited for asleep.
pub struct Waiting(bool);

static WAITING: AtomicUsize = AtomicUsize::new(0);

impl Waiting {
    /// Counts this thread as waiting until the guard drops.
    pub fn enter() -> Waiting {
        Waiting(WAITING.fetch_add(1, Ordering::AcqRel) < Self::max())
    }

    /// How many threads of a process may wait polling: half the CPUs, at
    /// least one.
    fn max() -> usize {
        static MAX: OnceLock<usize> = OnceLock::new();
        *MAX.get_or_init(|| {
            std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
        })
    }

    /// Whether few enough threads wait for this one to poll.
    pub fn may_poll(&self) -> bool {
        self.0
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Calls per cycle; the last `PROBE` of each cycle try the other mode.
const CYCLE: u32 = 256;
const PROBE: u32 = 16;
/// Round trips kept of the current mode.
const KEEP: usize = 64;

#[derive(Debug)]
pub struct SpinPolicy {
    /// Poll this long when polling; a fixed window (`SHOAL_CLIENT_SPIN_US`
    /// set) also fixes the choice to poll or not.
    window: Window,
    spinning: bool,
    calls: u32,
    current: Vec<u32>,
    probe: Vec<u32>,
}

impl SpinPolicy {
    /// A fixed policy: always poll for `spin` (zero: never).
    pub fn fixed(spin: Duration) -> Self {
        Self {
            window: Window::fixed(spin),
            spinning: !spin.is_zero(),
            calls: 0,
            current: Vec::new(),
            probe: Vec::new(),
        }
    }

    /// An adaptive policy polling, when it polls, for an adaptive
    /// [`Window`] of at least `spin`.
    pub fn adaptive(spin: Duration) -> Self {
        Self {
            window: Window::adaptive(spin),
            ..Self::fixed(spin)
        }
    }

    fn probing(&self) -> bool {
        self.window.adaptive && self.calls % CYCLE >= CYCLE - PROBE
    }

    /// How long to poll in the coming call.
    pub fn spin(&self) -> Duration {
        if self.spinning != self.probing() {
            self.window.get()
        } else {
            Duration::ZERO
        }
    }

    /// A small call took `rtt`.
    pub fn record(&mut self, rtt: Duration) {
        if !self.window.adaptive {
            return;
        }
        let us = rtt.as_micros().min(u32::MAX as u128) as u32;
        if self.probing() {
            self.probe.push(us);
        } else {
            // The window learns from the current mode's calls only.
            self.window.saw(rtt);
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
    fn a_window_follows_short_waits_and_falls_back_on_long_ones() {
        let base = Duration::from_micros(50);
        let mut w = Window::from_setting(None, base);
        assert_eq!(w.get(), base);
        for _ in 0..GAPS {
            w.saw(Duration::from_micros(120));
        }
        assert_eq!(w.get(), Duration::from_micros(240));
        // Waits shorter than half the base: the base.
        for _ in 0..GAPS {
            w.saw(Duration::from_micros(10));
        }
        assert_eq!(w.get(), base);
        // Mostly long waits, but a quarter the base catches: the base.
        for i in 0..GAPS {
            if i % 4 == 0 {
                w.saw(Duration::from_micros(30));
            } else {
                w.saw(Duration::from_micros(2000));
            }
        }
        assert_eq!(w.get(), base);
        // Mostly idle: waits that time out, or too long to poll through,
        // and few the base would catch: no polling (a client's window,
        // whose policy decides whether it polls, keeps its base).
        let mut client = Window::adaptive(base);
        for i in 0..GAPS {
            for w in [&mut w, &mut client] {
                match i % 8 {
                    0 => w.saw(Duration::from_micros(30)),
                    1..4 => w.saw_nothing(),
                    _ => w.saw(Duration::from_micros(400)),
                }
            }
        }
        assert_eq!(w.get(), Duration::ZERO);
        assert_eq!(client.get(), base);
        // Short waits again: polling again, within a few rethinks.
        for _ in 0..GAPS {
            w.saw(Duration::from_micros(120));
        }
        assert_eq!(w.get(), Duration::from_micros(240));
        // A fixed window ignores what it sees.
        let mut f = Window::fixed(Duration::ZERO);
        for _ in 0..GAPS {
            f.saw(Duration::from_micros(100));
        }
        assert_eq!(f.get(), Duration::ZERO);
    }

    #[test]
    fn a_spinning_client_polls_about_twice_its_round_trip() {
        let mut p = SpinPolicy::adaptive(Duration::from_micros(50));
        // Polling wins; round trips of 150 µs when polling.
        run(&mut p, 1024, |s| if s { 150 } else { 300 });
        assert!(p.spinning);
        assert_eq!(p.window.get(), Duration::from_micros(300));
    }

    #[test]
    fn clients_poll_only_while_few_of_them_wait() {
        // No other test of this crate waits as a client.
        let first: Vec<Waiting> = (0..Waiting::max()).map(|_| Waiting::enter()).collect();
        assert!(first.iter().all(Waiting::may_poll));
        let more = Waiting::enter();
        assert!(!more.may_poll());
        drop(more);
        drop(first);
        assert!(Waiting::enter().may_poll());
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
