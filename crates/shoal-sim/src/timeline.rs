//! The event queue of the simulations (the group's and directory's
//! events, the file system scenarios' messages in flight, the supervisor's
//! and the gossip's events): events by
//! virtual time, ties in the order they were scheduled, so a seed replays
//! exactly.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use shoal_proto::Time;

/// Scheduled events of type `E`.
pub(crate) struct Timeline<E> {
    queue: BinaryHeap<Reverse<(Time, u64, usize)>>,
    events: Vec<Option<E>>,
    counter: u64,
}

impl<E> Timeline<E> {
    pub(crate) fn new() -> Self {
        Timeline {
            queue: BinaryHeap::new(),
            events: Vec::new(),
            counter: 0,
        }
    }

    /// Schedules `ev` at `t`.
    pub(crate) fn at(&mut self, t: Time, ev: E) {
        let idx = self.events.len();
        self.events.push(Some(ev));
        self.counter += 1;
        self.queue.push(Reverse((t, self.counter, idx)));
    }

    /// When the next event is due.
    pub(crate) fn peek(&self) -> Option<Time> {
        self.queue.peek().map(|Reverse((t, _, _))| *t)
    }

    /// The next event due no later than `end`, with its time; later ones
    /// stay queued.
    pub(crate) fn next(&mut self, end: Time) -> Option<(Time, E)> {
        if self.peek()? > end {
            return None;
        }
        let Reverse((t, _, idx)) = self.queue.pop()?;
        let ev = self.events[idx].take().expect("each event runs once");
        Some((t, ev))
    }

    /// The next event due by `now`, leaving later ones queued.
    pub(crate) fn due(&mut self, now: Time) -> Option<E> {
        self.next(now).map(|(_, ev)| ev)
    }

    /// Drops everything scheduled.
    pub(crate) fn clear(&mut self) {
        self.queue.clear();
        self.events.clear();
    }
}

/// A scenario's trace, kept only with `SHOAL_SIM_TRACE` set: its first
/// 100,000 lines, each with its time.
pub(crate) struct Trace {
    lines: Vec<String>,
    on: bool,
}

impl Trace {
    pub(crate) fn from_env() -> Trace {
        Trace {
            lines: Vec::new(),
            on: std::env::var_os("SHOAL_SIM_TRACE").is_some(),
        }
    }

    /// Whether lines are kept.
    pub(crate) fn on(&self) -> bool {
        self.on
    }

    pub(crate) fn line(&mut self, now: impl std::fmt::Display, line: impl FnOnce() -> String) {
        if self.on && self.lines.len() < 100_000 {
            let l = line();
            self.lines.push(format!("{now:>10} {l}"));
        }
    }

    /// Lines without a time (a history printed after the run).
    pub(crate) fn extend(&mut self, lines: impl IntoIterator<Item = String>) {
        if self.on {
            self.lines.extend(lines);
        }
    }

    /// Traces the broken promise `v`, and keeps it in `violations` (the
    /// first twenty).
    pub(crate) fn violation(
        &mut self,
        now: impl std::fmt::Display,
        violations: &mut Vec<String>,
        v: String,
    ) {
        if violations.len() < 20 {
            self.line(now, || format!("VIOLATION {v}"));
            violations.push(v);
        }
    }

    pub(crate) fn lines(&self) -> &[String] {
        &self.lines
    }
}
