//! Rights: what a capability lets its holder do to an object.
//!
//! A [`Rights`] is a set of 8 rights packed in one byte, bit `i` for right
//! `i`.  Six have names ([`Rights::READ`] .. [`Rights::EXEC`]); the top two
//! ([`Rights::R6`], [`Rights::R7`]) are left for servers to give a meaning.
//!
//! Text form, one character per bit from bit 0 up: `r w c d a x 6 7`, with
//! `-` for a right that is absent, so read+write is `rw------` and all
//! rights is `rwcdax67`.  Parsing also takes `0xNN` (1 or 2 hex digits).

use std::fmt;
use std::ops::{BitAnd, BitOr};
use std::str::FromStr;

use crate::error::CapError;

/// A set of up to 8 rights, one bit each.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Rights(u8);

/// Letters of the text form, in bit order.
const LETTERS: [u8; 8] = *b"rwcdax67";

impl Rights {
    /// Read the object.
    pub const READ: Rights = Rights(0x01);
    /// Write or modify the object.
    pub const WRITE: Rights = Rights(0x02);
    /// Create objects under this one.
    pub const CREATE: Rights = Rights(0x04);
    /// Delete the object.
    pub const DELETE: Rights = Rights(0x08);
    /// Administer the object (e.g. change its secret, revoking capabilities).
    pub const ADMIN: Rights = Rights(0x10);
    /// Execute / invoke the object.
    pub const EXEC: Rights = Rights(0x20);
    /// Server-defined right 6.
    pub const R6: Rights = Rights(0x40);
    /// Server-defined right 7.
    pub const R7: Rights = Rights(0x80);
    /// Every right.
    pub const ALL: Rights = Rights(0xFF);
    /// No right at all.
    pub const NONE: Rights = Rights(0);

    /// Rights with exactly the given bits.
    pub const fn from_bits(bits: u8) -> Rights {
        Rights(bits)
    }

    /// The bits of this set.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// True if every right in `other` is also in `self`.
    pub const fn contains(self, other: Rights) -> bool {
        self.0 & other.0 == other.0
    }

    /// True if every right in `self` is also in `other`.
    pub const fn is_subset_of(self, other: Rights) -> bool {
        other.contains(self)
    }

    /// True if `self` is a subset of `other` and not equal to it.
    pub const fn is_proper_subset_of(self, other: Rights) -> bool {
        self.is_subset_of(other) && self.0 != other.0
    }

    /// The rights in both `self` and `other`.
    pub const fn intersect(self, other: Rights) -> Rights {
        Rights(self.0 & other.0)
    }

    /// The rights in either `self` or `other`.
    pub const fn union(self, other: Rights) -> Rights {
        Rights(self.0 | other.0)
    }

    /// The rights in `self` that are not in `other`.
    pub const fn difference(self, other: Rights) -> Rights {
        Rights(self.0 & !other.0)
    }

    /// True if no right is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl BitAnd for Rights {
    type Output = Rights;
    fn bitand(self, rhs: Rights) -> Rights {
        self.intersect(rhs)
    }
}

impl BitOr for Rights {
    type Output = Rights;
    fn bitor(self, rhs: Rights) -> Rights {
        self.union(rhs)
    }
}

impl fmt::Display for Rights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = [b'-'; 8];
        for (i, slot) in out.iter_mut().enumerate() {
            if self.0 & (1 << i) != 0 {
                *slot = LETTERS[i];
            }
        }
        // Only ASCII was written, so this cannot fail.
        f.write_str(std::str::from_utf8(&out).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Rights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Rights({self})")
    }
}

impl FromStr for Rights {
    type Err = CapError;

    fn from_str(s: &str) -> Result<Rights, CapError> {
        if let Some(hex) = s.strip_prefix("0x") {
            if hex.is_empty() || hex.len() > 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(CapError::BadRights);
            }
            return u8::from_str_radix(hex, 16)
                .map(Rights)
                .map_err(|_| CapError::BadRights);
        }
        let bytes = s.as_bytes();
        if bytes.len() != 8 {
            return Err(CapError::BadRights);
        }
        let mut bits = 0u8;
        for (i, &b) in bytes.iter().enumerate() {
            if b == LETTERS[i] {
                bits |= 1 << i;
            } else if b != b'-' {
                return Err(CapError::BadRights);
            }
        }
        Ok(Rights(bits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_letters_in_bit_order() {
        assert_eq!(Rights::NONE.to_string(), "--------");
        assert_eq!(Rights::ALL.to_string(), "rwcdax67");
        assert_eq!((Rights::READ | Rights::WRITE).to_string(), "rw------");
        assert_eq!((Rights::EXEC | Rights::R7).to_string(), "-----x-7");
        assert_eq!(format!("{:?}", Rights::READ), "Rights(r-------)");
    }

    #[test]
    fn parse_round_trips_every_value() {
        for b in 0..=255u8 {
            let r = Rights::from_bits(b);
            assert_eq!(r.to_string().parse::<Rights>(), Ok(r));
            assert_eq!(format!("0x{b:02x}").parse::<Rights>(), Ok(r));
            assert_eq!(format!("0x{b:X}").parse::<Rights>(), Ok(r));
        }
    }

    #[test]
    fn parse_rejects_garbage() {
        for bad in [
            "",
            "rw",
            "rw-------",
            "wr------",
            "RW------",
            "0x",
            "0x123",
            "0x+1",
            "0xg0",
            "ff",
            "rw-----é",
            "--------\n",
        ] {
            assert_eq!(bad.parse::<Rights>(), Err(CapError::BadRights), "{bad:?}");
        }
    }

    #[test]
    fn set_operations() {
        let rw = Rights::READ | Rights::WRITE;
        assert!(rw.contains(Rights::READ));
        assert!(!rw.contains(Rights::DELETE));
        assert!(Rights::READ.is_subset_of(rw));
        assert!(Rights::READ.is_proper_subset_of(rw));
        assert!(!rw.is_proper_subset_of(rw));
        assert!(rw.is_subset_of(rw));
        assert!(Rights::NONE.is_subset_of(Rights::NONE));
        assert_eq!(rw.intersect(Rights::WRITE | Rights::EXEC), Rights::WRITE);
        assert_eq!(rw & Rights::READ, Rights::READ);
        assert_eq!(rw.difference(Rights::READ), Rights::WRITE);
        assert_eq!(Rights::ALL.bits(), 0xFF);
        assert!(Rights::NONE.is_empty());
        assert!(!Rights::R6.is_empty());
    }
}
