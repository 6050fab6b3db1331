//! Constant-time byte comparison.
//!
//! Comparing a presented check field with the expected one must not leak,
//! through timing, how many leading bytes matched: that would let an
//! attacker forge a check byte by byte.  [`ct_eq`] ORs together the XOR of
//! every byte pair and looks at the result once, and hides the accumulator
//! from the optimiser with `black_box` so it cannot add an early exit.

use std::hint::black_box;

/// True if `a == b`, in time that does not depend on where they differ.
pub(crate) fn ct_eq<const N: usize>(a: &[u8; N], b: &[u8; N]) -> bool {
    let mut diff = 0u8;
    for i in 0..N {
        diff = black_box(diff | (a[i] ^ b[i]));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_and_unequal() {
        assert!(ct_eq(&[1, 2, 3], &[1, 2, 3]));
        assert!(ct_eq::<0>(&[], &[]));
        for i in 0..16 {
            let a = [0u8; 16];
            let mut b = [0u8; 16];
            b[i] = 0x80;
            assert!(!ct_eq(&a, &b));
        }
    }
}
