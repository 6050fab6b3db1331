//! A fixed-size bit set for fragment bookkeeping.  Up to 64 bits live
//! inline, so the one-fragment bodies of small RPCs allocate nothing.

#[derive(Debug, Clone)]
pub(crate) enum BitSet {
    Inline(u64),
    Heap(Vec<u64>),
}

impl Default for BitSet {
    fn default() -> Self {
        BitSet::Inline(0)
    }
}

impl BitSet {
    pub(crate) fn new(bits: u32) -> Self {
        if bits <= 64 {
            BitSet::Inline(0)
        } else {
            BitSet::Heap(vec![0; (bits as usize).div_ceil(64)])
        }
    }

    fn word(&self, i: u32) -> Option<&u64> {
        match self {
            BitSet::Inline(w) => (i < 64).then_some(w),
            BitSet::Heap(words) => words.get(i as usize / 64),
        }
    }

    pub(crate) fn get(&self, i: u32) -> bool {
        self.word(i).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// Sets bit `i`; returns whether it was clear before.
    pub(crate) fn set(&mut self, i: u32) -> bool {
        let w = match self {
            BitSet::Inline(w) => {
                assert!(i < 64, "bit {i} out of range");
                w
            }
            BitSet::Heap(words) => &mut words[i as usize / 64],
        };
        let bit = 1 << (i % 64);
        let was_clear = *w & bit == 0;
        *w |= bit;
        was_clear
    }

    pub(crate) fn clear_all(&mut self) {
        match self {
            BitSet::Inline(w) => *w = 0,
            BitSet::Heap(words) => words.iter_mut().for_each(|w| *w = 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::BitSet;

    #[test]
    fn inline_and_heap_sets_agree() {
        for bits in [1u32, 63, 64, 65, 200] {
            let mut s = BitSet::new(bits);
            for i in (0..bits).step_by(3) {
                assert!(s.set(i));
                assert!(!s.set(i));
            }
            for i in 0..bits {
                assert_eq!(s.get(i), i % 3 == 0);
            }
            s.clear_all();
            assert!((0..bits).all(|i| !s.get(i)));
        }
    }
}
