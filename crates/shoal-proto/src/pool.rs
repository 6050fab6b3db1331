//! Recycled buffers.
//!
//! Fresh memory is expensive at these sizes: every 4 KiB page of a new
//! allocation faults and is cleared by the kernel, which for a 64 MiB body
//! costs more than moving its bytes.  Datagram buffers and large bodies
//! therefore go back to a small pool when their user is done with them
//! ([`give`]), and the cores take from it ([`take`], [`datagram`]).
//!
//! Safety of reuse: a body buffer is handed out only once every byte has
//! been overwritten by the fragments that make up the new body, so no
//! content of an earlier body can leak into a later one.

use std::sync::Mutex;

/// Bodies at least this big are pooled.
const BIG: usize = 1 << 20;
/// Most big buffers kept, and most bytes in them.
const BIG_KEEP: usize = 8;
const BIG_KEEP_BYTES: usize = 96 << 20;
/// Most datagram buffers kept.
const SMALL_KEEP: usize = 64;

static BIGS: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

thread_local! {
    /// Datagram buffers, per thread: taken and given back on the hot path,
    /// so no lock.
    static SMALLS: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A buffer of exactly `len` initialized bytes (zeros, or an earlier
/// body's bytes that the caller will overwrite entirely).
pub fn take(len: usize) -> Vec<u8> {
    if len >= BIG {
        let mut bigs = BIGS.lock().expect("pool lock");
        let best = bigs
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        if let Some(i) = best {
            let mut buf = bigs.swap_remove(i);
            drop(bigs);
            if buf.len() >= len {
                buf.truncate(len);
            } else {
                buf.resize(len, 0);
            }
            return buf;
        }
    }
    vec![0; len]
}

/// An empty buffer for encoding a datagram.
pub fn datagram() -> Vec<u8> {
    SMALLS
        .with_borrow_mut(Vec::pop)
        .unwrap_or_else(|| Vec::with_capacity(shoal_wire::MAX_DATAGRAM))
}

/// Returns a large body's buffer to the pool if nobody else holds it.
pub fn give_bytes(b: bytes::Bytes) {
    if b.len() >= BIG
        && let Ok(m) = b.try_into_mut()
    {
        give(Vec::from(m));
    }
}

/// An empty buffer of at least `capacity` bytes, from the pool if it has
/// one (its old bytes are still there, beyond the length: the caller
/// appends).
pub fn with_capacity(capacity: usize) -> Vec<u8> {
    let mut v = take(capacity);
    v.clear();
    v
}

/// Returns a buffer to the pool (or frees it, if the pool is full or the
/// buffer is of no use to it).
pub fn give(mut buf: Vec<u8>) {
    if buf.capacity() >= BIG {
        let mut bigs = BIGS.lock().expect("pool lock");
        // Full: the new buffer replaces the smallest kept one if it is
        // bigger (a big buffer serves small bodies too, not the reverse),
        // so a pool filled by 4 MiB requests still keeps the 8 MiB replies
        // that follow.
        let mut held: usize = bigs.iter().map(Vec::capacity).sum();
        while bigs.len() >= BIG_KEEP || held + buf.capacity() > BIG_KEEP_BYTES {
            let Some((i, smallest)) = bigs
                .iter()
                .enumerate()
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, b)| (i, b.capacity()))
            else {
                break;
            };
            if smallest >= buf.capacity() {
                return;
            }
            bigs.swap_remove(i);
            held -= smallest;
        }
        if held + buf.capacity() <= BIG_KEEP_BYTES {
            bigs.push(buf);
        }
    } else if buf.capacity() >= shoal_wire::MAX_DATAGRAM {
        buf.clear();
        SMALLS.with_borrow_mut(|smalls| {
            if smalls.len() < SMALL_KEEP {
                smalls.push(buf);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_buffers_come_back_with_the_asked_length() {
        let mut a = take(3 << 20);
        a.iter_mut().for_each(|b| *b = 7);
        give(a);
        let b = take(2 << 20);
        assert_eq!(b.len(), 2 << 20);
        let c = take(5 << 20);
        assert_eq!(c.len(), 5 << 20);
        give(b);
        give(c);
        let d = take(4 << 20);
        assert_eq!(d.len(), 4 << 20);
    }
}
