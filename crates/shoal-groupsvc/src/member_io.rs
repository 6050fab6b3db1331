//! A member's I/O: the thread that reads the sockets while no application
//! thread does, the application threads' own waits inside `send` and
//! `receive`, and sending what the core queued.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use shoal_group::{GroupDest, Status};

use super::{Inner, Shared};
use shoal_rpc::{clock, socket};

impl Shared {
    /// Sends what the core queued and collects completed sends.
    pub(super) fn flush(&self, inner: &mut Inner) {
        if self.mcast.is_some() {
            // Loop our multicasts back only if another member lives at our
            // address (then it needs them); else they would come back to us
            // for nothing.
            let me = inner.core.id();
            let shared = inner
                .core
                .members()
                .iter()
                .any(|m| m.id != me && m.addr.ip() == self.me.ip());
            if shared != inner.mcast_loop {
                let _ = socket2::SockRef::from(&self.socket).set_multicast_loop_v4(shared);
                inner.mcast_loop = shared;
            }
        }
        while let Some(t) = inner.core.poll_transmit() {
            inner.seal.seal(&t.bytes, &mut inner.sealed);
            let mut targets: Vec<SocketAddr> = Vec::new();
            match t.dest {
                GroupDest::Addr(a) => targets.push(a),
                GroupDest::Members => match &self.mcast {
                    Some((_, addr)) => targets.push(SocketAddr::V4(*addr)),
                    None => {
                        let me = inner.core.id();
                        targets.extend(
                            inner
                                .core
                                .members()
                                .iter()
                                .filter(|m| m.id != me)
                                .map(|m| m.addr),
                        );
                    }
                },
            }
            for to in targets {
                match inner.delay.as_mut() {
                    Some(d) => d.push(to, inner.sealed.clone()),
                    None => {
                        let _ = self.socket.send_to(&inner.sealed, to);
                    }
                }
            }
        }
        if let Some(d) = inner.delay.as_mut() {
            let now = Instant::now();
            while d.next_due().is_some_and(|due| due <= now) {
                let std::cmp::Reverse((_, _, to, bytes)) = d.queue.pop().expect("peeked");
                let _ = self.socket.send_to(&bytes, to);
            }
        }
        self.collect_sent(inner);
    }

    /// Records the sends the core has ordered.
    fn collect_sent(&self, inner: &mut Inner) {
        while let Some((msg_id, seq)) = inner.core.poll_sent() {
            inner.sent.insert(msg_id, seq);
        }
    }

    /// One wait step of an application thread inside `send`/`receive`:
    /// until `spin_until`, poll the sockets without sleeping; after, sleep
    /// in `poll` on them (at most until `until` or the next timer), then
    /// take in what came and run the timers.
    pub(super) fn wait_io(
        &self,
        inner: &mut parking_lot::MutexGuard<'_, Inner>,
        spin_until: Instant,
        until: Instant,
        batch: bool,
    ) {
        if Instant::now() < spin_until {
            if self.take_in(inner) {
                self.flush(inner);
                self.wake(inner);
            } else {
                parking_lot::MutexGuard::unlocked(inner, || {
                    // SAFETY: sched_yield has no preconditions.
                    unsafe { libc::sched_yield() };
                });
            }
            return;
        }
        let due = next_due(inner).map_or(until, |d| d.min(until));
        if batch {
            // Nobody waits on this member's answers: take datagrams in
            // batches rather than waking for each (on a machine with few
            // cores, every wake-up here is taken from the members that
            // are on the critical path).
            let nap = due.saturating_duration_since(Instant::now()).min(BATCH);
            parking_lot::MutexGuard::unlocked(inner, || std::thread::sleep(nap));
            self.service(inner);
            return;
        }
        let wait_ms = poll_ms(due, 20);
        let mut fds = [
            libc::pollfd {
                fd: self.socket.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.mcast.as_ref().map_or(-1, |(m, _)| m.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        parking_lot::MutexGuard::unlocked(inner, || {
            // SAFETY: a valid array of two pollfd (a negative fd is ignored).
            unsafe { libc::poll(fds.as_mut_ptr(), 2, wait_ms) };
        });
        self.service(inner);
    }

    /// Takes in what the sockets hold, then runs the timers (in that
    /// order: after a stall, the timers would otherwise take members whose
    /// answers wait unread for dead ones), sends, and wakes whoever has
    /// something to pick up.  True if a datagram came in.
    fn service(&self, inner: &mut Inner) -> bool {
        let got = self.pump(inner);
        inner.core.handle_timeout(clock::now());
        self.flush(inner);
        self.wake(inner);
        got
    }

    /// Wakes the threads that have something to pick up: senders whose
    /// messages were ordered, readers of deliveries (or of a status change).
    fn wake(&self, inner: &Inner) {
        if !inner.sent.is_empty() {
            self.sent_cv.notify_all();
        }
        if inner.core.has_events() || inner.core.status() != Status::Normal {
            self.events_cv.notify_all();
        }
    }

    /// Reads every queued datagram of both sockets into the core and sends
    /// what it answers; true if there was any.
    fn pump(&self, inner: &mut Inner) -> bool {
        let got = self.take_in(inner);
        if got {
            self.flush(inner);
        }
        got
    }

    /// Reads every queued datagram of both sockets into the core, sending
    /// nothing; true if there was any.
    fn take_in(&self, inner: &mut Inner) -> bool {
        let mut got = false;
        let mut arrived = false;
        let Inner {
            core,
            rx,
            seal,
            window,
            last_arrival,
            ..
        } = inner;
        for s in std::iter::once(&self.socket).chain(self.mcast.as_ref().map(|(m, _)| m)) {
            while let Ok(Some((len, from))) = socket::try_recv_from(s, rx) {
                if !arrived {
                    // One gap per batch: datagrams read together came
                    // together.
                    arrived = true;
                    let now = Instant::now();
                    window.saw(now.saturating_duration_since(*last_arrival));
                    *last_arrival = now;
                }
                if from == self.me {
                    // Our own multicast, looped back (other members on
                    // this host need the loop): skip it unread.
                    continue;
                }
                if let Some(plain) = seal.open(clock::now(), &mut rx[..len]) {
                    core.handle_datagram(clock::now(), from, &rx[plain]);
                    if seal.sending() != core.info_key_epoch() {
                        core.set_key_epoch(seal.sending());
                    }
                }
                got = true;
            }
        }
        got
    }

    /// The I/O thread: read both sockets, run the timers; after activity,
    /// poll for a while before sleeping (a busy group answers sooner).
    pub(super) fn run(&self) {
        let mut fds = vec![
            libc::pollfd {
                fd: self.kick.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.socket.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        if let Some((m, _)) = &self.mcast {
            fds.push(libc::pollfd {
                fd: m.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        while !self.closed.load(Ordering::Acquire) {
            let wait_ms = {
                let inner = self.core.lock();
                next_due(&inner).map_or(50, |due| poll_ms(due, 50))
            };
            let idle_for = clock::now()
                .0
                .saturating_sub(self.idle_since.load(Ordering::SeqCst));
            if self.active.load(Ordering::SeqCst) > 0 || idle_for < LINGER_US {
                // Application threads read the sockets (or did a moment
                // ago, and likely will again): run the timers only.
                let mut inner = self.core.lock();
                // (`active` may have dropped to zero since it was read
                // above: the linger left is then at most LINGER_US.)
                let wait = if self.active.load(Ordering::SeqCst) > 0 {
                    Duration::from_millis(1)
                } else {
                    Duration::from_micros(LINGER_US.saturating_sub(idle_for).max(1))
                };
                // A timer of the core's may fall due sooner (a commit
                // point held back for the next entry, at the sequencer).
                let wait = next_due(&inner).map_or(wait, |due| {
                    wait.min(due.saturating_duration_since(Instant::now()))
                });
                self.io_cv.wait_for(&mut inner, wait);
                self.service(&mut inner);
                continue;
            }
            self.io_polling.store(true, Ordering::SeqCst);
            if self.active.load(Ordering::SeqCst) > 0 {
                self.io_polling.store(false, Ordering::SeqCst);
                continue;
            }
            for f in fds.iter_mut() {
                f.revents = 0;
            }
            // SAFETY: `fds` is a valid array of pollfd for its length.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
            self.io_polling.store(false, Ordering::SeqCst);
            if fds[0].revents != 0 {
                let mut v = [0u8; 8];
                // SAFETY: reading 8 bytes from our own eventfd into a buffer
                // of 8 bytes.
                unsafe { libc::read(self.kick.as_raw_fd(), v.as_mut_ptr().cast(), 8) };
            }
            let mut inner = self.core.lock();
            // Poll on only where someone waits on our answers.
            let mut active = self.service(&mut inner) && inner.core.answers_on_the_critical_path();
            drop(inner);
            let mut idle_since = Instant::now();
            while active
                && !self.closed.load(Ordering::Acquire)
                && self.active.load(Ordering::Acquire) == 0
            {
                let mut inner = self.core.lock();
                if self.pump(&mut inner) {
                    idle_since = Instant::now();
                    self.wake(&inner);
                    drop(inner);
                } else {
                    let window = inner.window.get();
                    drop(inner);
                    active = idle_since.elapsed() < window;
                }
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
    }
}

/// Marks an application thread as inside `send` or `receive` (reading the
/// sockets itself) while it lives.
pub(super) struct Active<'a>(&'a Shared);

impl<'a> Active<'a> {
    pub(super) fn new(shared: &'a Shared) -> Self {
        if shared.active.fetch_add(1, Ordering::SeqCst) == 0
            && shared.io_polling.load(Ordering::SeqCst)
        {
            // Get the I/O thread out of its poll.
            let one = 1u64.to_ne_bytes();
            // SAFETY: writing 8 bytes to our own eventfd.
            unsafe { libc::write(shared.kick.as_raw_fd(), one.as_ptr().cast(), 8) };
        }
        Active(shared)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            // No wake-up: the I/O thread looks again within a millisecond
            // (a program that calls again at once never pays for one).
            self.0.idle_since.store(clock::now().0, Ordering::SeqCst);
        }
    }
}

/// After the last application thread leaves `send`/`receive`, the I/O
/// thread waits this long before it reads the sockets again: a program
/// that calls again at once keeps the sockets to itself.
const LINGER_US: u64 = 200;

/// How long a member nobody waits on lets datagrams gather before it reads
/// them.
const BATCH: Duration = Duration::from_millis(1);

/// When the member next has something to do on its own: its core's next
/// timer, or an injected delay coming due.
pub(super) fn next_due(inner: &Inner) -> Option<Instant> {
    inner
        .core
        .poll_timeout()
        .map(clock::instant)
        .into_iter()
        .chain(inner.delay.as_ref().and_then(|d| d.next_due()))
        .min()
}

/// Milliseconds from now to `due` for `poll`, rounded up (a timer a few
/// hundred microseconds away must not make a thread spin on a zero
/// timeout), between 1 and `max`.
pub(super) fn poll_ms(due: Instant, max: u64) -> i32 {
    due.saturating_duration_since(Instant::now())
        .as_micros()
        .div_ceil(1000)
        .clamp(1, u128::from(max)) as i32
}
