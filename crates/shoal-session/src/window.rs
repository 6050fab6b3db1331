//! The replay window: which counters of one key and direction have been
//! opened (RFC 6479's bitmap of blocks).
//!
//! It remembers the highest counter accepted and, below it, a bitmap of
//! [`WINDOW`] counters.  A counter is accepted once; a counter at or below
//! `highest - WINDOW` is refused whether or not it was seen, so nothing
//! older than the window can ever be accepted.  Callers mark a counter only
//! after its datagram's tag verified, so forgeries never move the window.

/// Counters tracked below the highest: 4096 bits less one block.
pub const WINDOW: u64 = (BLOCKS as u64 - 1) * 64;
/// Counters at or above this are refused: a key is retired long before.
pub const COUNTER_LIMIT: u64 = 1 << 60;

const BLOCKS: usize = 64;

/// See the module documentation.
#[derive(Clone)]
pub struct ReplayWindow {
    /// Highest counter accepted, plus one (0: none yet).
    top: u64,
    bits: [u64; BLOCKS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self::new()
    }
}

impl ReplayWindow {
    pub fn new() -> Self {
        Self {
            top: 0,
            bits: [0; BLOCKS],
        }
    }

    /// Whether `counter` would be accepted now.
    pub fn check(&self, counter: u64) -> bool {
        if counter >= COUNTER_LIMIT {
            return false;
        }
        if counter >= self.top {
            return true;
        }
        let highest = self.top - 1;
        if highest - counter >= WINDOW {
            return false;
        }
        let (block, bit) = place(counter);
        self.bits[block] & (1 << bit) == 0
    }

    /// Accepts `counter` if [`ReplayWindow::check`] allows it, marking it
    /// seen; whether it was accepted.
    pub fn accept(&mut self, counter: u64) -> bool {
        if !self.check(counter) {
            return false;
        }
        if counter >= self.top {
            // Clear the blocks the window slides over.
            let old_block = if self.top == 0 {
                None
            } else {
                Some((self.top - 1) / 64)
            };
            let new_block = counter / 64;
            match old_block {
                Some(old) if new_block - old < BLOCKS as u64 => {
                    for b in old + 1..=new_block {
                        self.bits[(b % BLOCKS as u64) as usize] = 0;
                    }
                }
                _ => self.bits = [0; BLOCKS],
            }
            self.top = counter + 1;
        }
        let (block, bit) = place(counter);
        self.bits[block] |= 1 << bit;
        true
    }

    /// The highest counter accepted, if any.
    pub fn highest(&self) -> Option<u64> {
        self.top.checked_sub(1)
    }
}

fn place(counter: u64) -> (usize, u32) {
    (
        ((counter / 64) % BLOCKS as u64) as usize,
        (counter % 64) as u32,
    )
}
