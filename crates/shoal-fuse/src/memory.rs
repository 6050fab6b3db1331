//! The mount's memory: buffers it frees are kept for the next writes, and
//! returned to the system once the mount has held no dirty data for
//! [`RETAIN`].
//!
//! Every write the mount keeps is a new buffer of up to 1 MiB.  With the C
//! library's defaults, buffers that large are mapped afresh and unmapped
//! when freed (or trimmed from the top of a heap soon after), and each
//! thread allocates from an arena of its own: the next writes then fault
//! every page in again, the kernel zeroing each one first.  On the virtual
//! machines shoal runs on that was over a third of a large write's time:
//! 512 MiB written again after the first copy was deleted took 99,800
//! page faults and ran at 2.3 GB/s, against none and 4.2 GB/s with the
//! settings below.  So a mount that runs as its own process
//! ([`keep_freed_buffers`], called by `shoal fs mount` before it starts
//! any thread) allocates from one arena, never maps a buffer by itself,
//! and leaves freed memory in the heap until [`Trim`] says the mount has
//! been clean long enough to give it back.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long the mount holds no dirty data before it returns the memory it
/// freed to the system.
pub const RETAIN: Duration = Duration::from_secs(5);

/// Whether this process keeps freed buffers (and so must trim).
static KEEPING: AtomicBool = AtomicBool::new(false);

/// Makes the C library keep freed buffers for reuse: one arena for all
/// threads, no buffer mapped on its own, no automatic trimming.  Call it
/// before the process starts threads (arenas are made at a thread's first
/// allocation); whether the library took the settings.
pub fn keep_freed_buffers() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only changes the allocator's parameters.
        let took = unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1) == 1
                && libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX) == 1
        };
        KEEPING.store(took, Ordering::Relaxed);
        took
    }
    #[cfg(not(target_env = "gnu"))]
    false
}

/// When to return kept memory: once, after [`RETAIN`] without dirty data
/// or writes.
#[derive(Debug, Default)]
pub(crate) struct Trim {
    /// Bytes written into the cache when last looked at.
    written: u64,
    clean_since: Option<Instant>,
    done: bool,
}

impl Trim {
    /// Notes the mount's dirty bytes and the bytes ever written into its
    /// cache at `now` (writes between two looks count even if they were
    /// written back meanwhile); whether kept memory is due back now.
    pub(crate) fn due(&mut self, (dirty, written): (u64, u64), now: Instant) -> bool {
        if dirty > 0 || written != self.written {
            self.written = written;
            self.clean_since = None;
            self.done = false;
            return false;
        }
        let since = *self.clean_since.get_or_insert(now);
        if self.done || now.duration_since(since) < RETAIN {
            return false;
        }
        self.done = true;
        true
    }

    /// Returns the heap's free memory to the system if it is due and this
    /// process keeps freed buffers.
    pub(crate) fn tick(&mut self, dirty_and_written: (u64, u64)) {
        if self.due(dirty_and_written, Instant::now()) && KEEPING.load(Ordering::Relaxed) {
            #[cfg(target_env = "gnu")]
            // SAFETY: malloc_trim only releases free memory of the heap.
            unsafe {
                libc::malloc_trim(0);
            }
            tracing::debug!("returned the memory freed since the last writes to the system");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_goes_back_once_after_a_clean_while() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut t = Trim::default();
        assert!(!t.due((0, 0), at(0)));
        assert!(!t.due((0, 0), at(4)));
        assert!(t.due((0, 0), at(5)));
        assert!(!t.due((0, 0), at(60)), "once");
        // Dirty again: the wait starts over.
        assert!(!t.due((10, 10), at(61)));
        assert!(!t.due((0, 10), at(62)));
        assert!(!t.due((0, 10), at(66)));
        assert!(t.due((0, 10), at(67)));
        // Written and gone between two looks: a write all the same.
        assert!(!t.due((0, 20), at(70)));
        assert!(!t.due((0, 20), at(71)));
        assert!(!t.due((0, 20), at(75)));
        assert!(t.due((0, 20), at(76)));
    }
}
