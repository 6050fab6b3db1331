//! Splitting bodies into fragments and putting them back together.
//!
//! A body of `total` bytes travels as `count` fragments of
//! `ceil(total / count)` bytes (the last one shorter), so a receiver needs
//! nothing but the fragment header to place a fragment, whatever fragment
//! size the sender chose.

use bytes::Bytes;

/// Number of fragments for `total` bytes with at most `frag_bytes` each.
pub fn frag_count(total: usize, frag_bytes: usize) -> u32 {
    total.div_ceil(frag_bytes.max(1)).max(1) as u32
}

/// Byte range of fragment `index` of `count` in a body of `total` bytes.
pub fn frag_range(total: usize, count: u32, index: u32) -> std::ops::Range<usize> {
    let chunk = total.div_ceil(count.max(1) as usize).max(1);
    let start = (index as usize * chunk).min(total);
    start..(start + chunk).min(total)
}

/// A body being reassembled.
#[derive(Debug)]
pub struct Assembly {
    total: usize,
    count: u32,
    got: Vec<bool>,
    missing: u32,
    buf: Vec<u8>,
}

impl Assembly {
    /// Starts a body of `total` bytes in `count` fragments, or `None` if the
    /// two do not fit together (a forged or corrupt header) or the body is
    /// larger than `limit` (its buffer is allocated here, whole).
    pub fn new(total: u64, count: u32, limit: usize) -> Option<Self> {
        let total = usize::try_from(total).ok()?;
        if total > limit || count == 0 || (count as usize) > total.max(1) {
            return None;
        }
        Some(Self {
            total,
            count,
            got: vec![false; count as usize],
            missing: count,
            buf: vec![0; total],
        })
    }

    /// Adds one fragment; returns false if it does not belong.
    pub fn add(&mut self, total: u64, count: u32, index: u32, payload: &[u8]) -> bool {
        if total as usize != self.total || count != self.count || index >= count {
            return false;
        }
        let range = frag_range(self.total, count, index);
        if range.len() != payload.len() {
            return false;
        }
        if !self.got[index as usize] {
            self.got[index as usize] = true;
            self.missing -= 1;
            self.buf[range].copy_from_slice(payload);
        }
        true
    }

    pub fn is_complete(&self) -> bool {
        self.missing == 0
    }

    /// First fragment not yet received.
    pub fn first_missing(&self) -> u32 {
        self.got.iter().position(|g| !g).unwrap_or(self.got.len()) as u32
    }

    pub fn total(&self) -> usize {
        self.total
    }

    /// The finished body.
    pub fn finish(self) -> Bytes {
        debug_assert!(self.is_complete());
        Bytes::from(self.buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragments_cover_the_body_exactly() {
        for total in [0usize, 1, 7, 1400, 1401, 100_000] {
            for frag in [1usize, 3, 1400, 60_000] {
                let count = frag_count(total, frag);
                let mut covered = 0;
                for i in 0..count {
                    let r = frag_range(total, count, i);
                    assert_eq!(r.start, covered);
                    assert!(r.len() <= frag.max(1));
                    covered = r.end;
                }
                assert_eq!(covered, total);
            }
        }
    }

    #[test]
    fn reassembles_out_of_order_and_ignores_strangers() {
        let body: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let count = frag_count(body.len(), 1400);
        let mut a = Assembly::new(body.len() as u64, count, 1 << 20).unwrap();
        for i in (0..count).rev() {
            let r = frag_range(body.len(), count, i);
            assert!(!a.add(body.len() as u64 + 1, count, i, &body[r.clone()]));
            assert!(a.add(body.len() as u64, count, i, &body[r]));
        }
        assert!(a.is_complete());
        assert_eq!(&a.finish()[..], &body[..]);
        assert!(Assembly::new(10, 11, 100).is_none());
        assert!(Assembly::new(0, 1, 100).is_some());
        assert!(Assembly::new(101, 1, 100).is_none(), "over the limit");
    }
}
