//! Free-space management of the extent store: free ranges kept both by
//! offset (to merge neighbours) and by size (best fit, so small holes fill
//! before the big free run at the end is cut into).

use std::collections::{BTreeMap, BTreeSet};

/// The free ranges of `[0, end)`.
#[derive(Debug, Clone, Default)]
pub struct Allocator {
    by_off: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
    end: u64,
    free: u64,
}

impl Allocator {
    /// Everything of `[0, end)` free except the `used` ranges (which must
    /// not overlap).
    pub fn with_used(end: u64, used: impl IntoIterator<Item = (u64, u64)>) -> Allocator {
        let mut used: Vec<(u64, u64)> = used.into_iter().filter(|&(_, l)| l > 0).collect();
        used.sort_unstable();
        let mut a = Allocator {
            end,
            ..Allocator::default()
        };
        let mut at = 0;
        for (off, len) in used {
            if off > at {
                a.insert(at, off - at);
            }
            at = at.max(off + len);
        }
        if end > at {
            a.insert(at, end - at);
        }
        a
    }

    /// The managed length.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Free bytes.
    pub fn free_bytes(&self) -> u64 {
        self.free
    }

    /// Number of free ranges.
    pub fn holes(&self) -> usize {
        self.by_off.len()
    }

    /// The free ranges, by offset.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_off.iter().map(|(&o, &l)| (o, l))
    }

    fn insert(&mut self, off: u64, len: u64) {
        self.by_off.insert(off, len);
        self.by_size.insert((len, off));
        self.free += len;
    }

    fn remove(&mut self, off: u64, len: u64) {
        self.by_off.remove(&off);
        self.by_size.remove(&(len, off));
        self.free -= len;
    }

    /// Takes `len` bytes from the smallest free range that holds them.
    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        debug_assert!(len > 0);
        let &(size, off) = self.by_size.range((len, 0)..).next()?;
        self.remove(off, size);
        if size > len {
            self.insert(off + len, size - len);
        }
        Some(off)
    }

    /// Takes `len` bytes from the lowest free range below `below` that
    /// holds them (compaction moves extents towards the front).
    pub fn alloc_below(&mut self, len: u64, below: u64) -> Option<u64> {
        let (off, size) = self
            .by_off
            .iter()
            .map(|(&o, &s)| (o, s))
            .take_while(|&(o, _)| o + len <= below)
            .find(|&(_, s)| s >= len)?;
        self.remove(off, size);
        if size > len {
            self.insert(off + len, size - len);
        }
        Some(off)
    }

    /// Returns a range, merging it with free neighbours.
    pub fn free(&mut self, mut off: u64, mut len: u64) {
        if len == 0 {
            return;
        }
        debug_assert!(off + len <= self.end, "free past the end");
        if let Some((&po, &pl)) = self.by_off.range(..off).next_back() {
            debug_assert!(po + pl <= off, "double free at {off}");
            if po + pl == off {
                self.remove(po, pl);
                off = po;
                len += pl;
            }
        }
        if let Some((&no, &nl)) = self.by_off.range(off + len..).next()
            && no == off + len
        {
            self.remove(no, nl);
            len += nl;
        }
        self.insert(off, len);
    }

    /// Adds `[end, new_end)` as free space.
    pub fn grow(&mut self, new_end: u64) {
        if new_end > self.end {
            let old = self.end;
            self.end = new_end;
            self.free(old, new_end - old);
        }
    }

    /// Drops the free run at the end (if any) and returns the new end.
    pub fn trim(&mut self) -> u64 {
        if let Some((&o, &l)) = self.by_off.iter().next_back()
            && o + l == self.end
        {
            self.remove(o, l);
            self.end = o;
        }
        self.end
    }

    /// Whether `[off, off+len)` overlaps a free range.
    pub fn overlaps_free(&self, off: u64, len: u64) -> bool {
        if let Some((&o, &l)) = self.by_off.range(..off + len).next_back() {
            return o + l > off;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Allocations never overlap each other or free space; freeing
        /// everything gives back one range.
        #[test]
        fn alloc_and_free(ops in proptest::collection::vec((1u64..5000, any::<bool>()), 1..200)) {
            let mut a = Allocator::with_used(0, []);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (len, free_one) in ops {
                if free_one && !live.is_empty() {
                    let (o, l) = live.swap_remove(len as usize % live.len());
                    a.free(o, l);
                } else {
                    let off = match a.alloc(len) {
                        Some(o) => o,
                        None => { let e = a.end(); a.grow(e + len.max(4096)); a.alloc(len).unwrap() }
                    };
                    for &(o, l) in &live {
                        prop_assert!(off + len <= o || o + l <= off, "overlap");
                    }
                    prop_assert!(!a.overlaps_free(off, len));
                    live.push((off, len));
                }
                let used: u64 = live.iter().map(|l| l.1).sum();
                prop_assert_eq!(used + a.free_bytes(), a.end());
            }
            for (o, l) in live.drain(..) {
                a.free(o, l);
            }
            prop_assert!(a.holes() <= 1);
            prop_assert_eq!(a.trim(), 0);
        }
    }

    #[test]
    fn with_used_is_the_complement() {
        let a = Allocator::with_used(100, [(10, 10), (50, 5), (15, 10)]);
        let r: Vec<_> = a.ranges().collect();
        assert_eq!(r, vec![(0, 10), (25, 25), (55, 45)]);
        let mut a = a;
        assert_eq!(a.alloc_below(20, 60), Some(25));
        assert_eq!(a.alloc(10), Some(0));
    }
}
