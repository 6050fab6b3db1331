//! Per-object secrets.
//!
//! The server keeps one [`ObjectSecret`] (32 random bytes) for each object
//! and keys every capability for that object with it.  Nobody else ever
//! sees it.  Replacing an object's secret revokes every capability minted
//! under the old one, including all offline restrictions of them, at once.
//!
//! `Debug` prints `ObjectSecret(..)`; equality is constant-time.

use std::fmt;

use rand::{RngCore, TryRngCore};

/// The server-side key of one object's capabilities.
#[derive(Clone)]
pub struct ObjectSecret([u8; 32]);

impl ObjectSecret {
    /// A fresh secret from the operating system's random number generator.
    ///
    /// # Panics
    ///
    /// If the operating system cannot supply random bytes.
    pub fn random() -> ObjectSecret {
        let mut b = [0u8; 32];
        rand::rngs::OsRng
            .try_fill_bytes(&mut b)
            .expect("operating system random number generator failed");
        ObjectSecret(b)
    }

    /// A secret drawn from `rng` (use a seeded generator only for
    /// reproducible simulations and tests).
    pub fn from_rng<R: RngCore + ?Sized>(rng: &mut R) -> ObjectSecret {
        let mut b = [0u8; 32];
        rng.fill_bytes(&mut b);
        ObjectSecret(b)
    }

    /// A secret with exactly these bytes (e.g. loaded from the server's store).
    pub const fn from_bytes(bytes: [u8; 32]) -> ObjectSecret {
        ObjectSecret(bytes)
    }

    /// The secret bytes, for the server to persist.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl PartialEq for ObjectSecret {
    fn eq(&self, other: &ObjectSecret) -> bool {
        crate::ct::ct_eq(&self.0, &other.0)
    }
}

impl Eq for ObjectSecret {}

impl fmt::Debug for ObjectSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ObjectSecret(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_secrets_differ() {
        assert_ne!(ObjectSecret::random(), ObjectSecret::random());
    }

    #[test]
    fn debug_hides_secret() {
        let s = ObjectSecret::from_bytes([0xcd; 32]);
        assert_eq!(format!("{s:?}"), "ObjectSecret(..)");
    }

    #[test]
    fn bytes_round_trip_and_eq() {
        let s = ObjectSecret::from_bytes([9; 32]);
        assert_eq!(s.as_bytes(), &[9; 32]);
        assert_eq!(s, ObjectSecret::from_bytes([9; 32]));
        let mut other = [9; 32];
        other[31] = 8;
        assert_ne!(s, ObjectSecret::from_bytes(other));
    }
}
