//! The event queue of the simulations (the group's and directory's
//! events, the file system scenarios' messages in flight): events by
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

    /// The next event due no later than `end`, with its time.
    pub(crate) fn next(&mut self, end: Time) -> Option<(Time, E)> {
        let Reverse((t, _, idx)) = self.queue.pop()?;
        if t > end {
            return None;
        }
        let ev = self.events[idx].take().expect("each event runs once");
        Some((t, ev))
    }

    /// The next event due by `now`, leaving later ones queued.
    pub(crate) fn due(&mut self, now: Time) -> Option<E> {
        let Reverse((t, _, _)) = self.queue.peek()?;
        if *t > now {
            return None;
        }
        self.next(now).map(|(_, ev)| ev)
    }

    /// Drops everything scheduled.
    pub(crate) fn clear(&mut self) {
        self.queue.clear();
        self.events.clear();
    }
}
