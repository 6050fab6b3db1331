//! A fixed-size bit set for fragment bookkeeping.

#[derive(Debug, Clone, Default)]
pub(crate) struct BitSet {
    words: Vec<u64>,
}

impl BitSet {
    pub(crate) fn new(bits: u32) -> Self {
        Self {
            words: vec![0; (bits as usize).div_ceil(64)],
        }
    }

    pub(crate) fn get(&self, i: u32) -> bool {
        self.words
            .get(i as usize / 64)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// Sets bit `i`; returns whether it was clear before.
    pub(crate) fn set(&mut self, i: u32) -> bool {
        let w = &mut self.words[i as usize / 64];
        let bit = 1 << (i % 64);
        let was_clear = *w & bit == 0;
        *w |= bit;
        was_clear
    }

    pub(crate) fn clear_all(&mut self) {
        self.words.iter_mut().for_each(|w| *w = 0);
    }
}
