//! Sealed start grants (`docs/security.md`, "Local authority"): what a
//! home's daemon vouches for about a program it lets start on another
//! node, sealed under a key only the two daemons hold ([`grant_key`] of
//! their session's endpoint root), so that the program's owner carries it
//! to the exec service and can neither read nor change it.
//!
//! Layout: session index (4, little-endian: the index the *receiving*
//! node knows the session by) | nonce (12) | ciphertext | tag (16).  The
//! index and the purpose are authenticated as associated data.  Nonces
//! are random (96 bits; a home seals one grant per program it starts).
//!
//! [`grant_key`]: crate::kdf::grant_key

use crate::SessionError;
use crate::aead::{Key, TAG_LEN};
use crate::channel::Root;
use crate::kdf::grant_key;

/// Bytes a sealed grant adds to its plaintext.
pub const OVERHEAD: usize = 4 + 12 + TAG_LEN;
/// Longest sealed grant accepted.
pub const MAX_SEALED: usize = 16 * 1024;

fn aad(index: u32) -> [u8; 15] {
    let mut a = [0u8; 15];
    a[..11].copy_from_slice(b"start grant");
    a[11..].copy_from_slice(&index.to_le_bytes());
    a
}

/// Seals `plain` for the other end of the session `root` (whose `index`
/// is what the other end knows it by), under `nonce`.
pub fn seal(root: &Root, nonce: [u8; 12], plain: &[u8]) -> Vec<u8> {
    let key = Key::new(root.algorithm, &grant_key(&root.secret));
    let mut out = Vec::with_capacity(plain.len() + OVERHEAD);
    out.extend_from_slice(&root.index.to_le_bytes());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(plain);
    let tag = key.seal(nonce, &aad(root.index), &mut out[16..]);
    out.extend_from_slice(&tag);
    out
}

/// The session index a sealed grant names, to find its root.
pub fn index(sealed: &[u8]) -> Result<u32, SessionError> {
    if sealed.len() < OVERHEAD {
        return Err(SessionError::Truncated);
    }
    if sealed.len() > MAX_SEALED {
        return Err(SessionError::Malformed("grant too long"));
    }
    Ok(u32::from_le_bytes(sealed[..4].try_into().expect("4 bytes")))
}

/// Opens a grant sealed under `root` (found by [`index`]).
pub fn open(root: &Root, sealed: &[u8]) -> Result<Vec<u8>, SessionError> {
    let index = index(sealed)?;
    if index != root.index {
        return Err(SessionError::Malformed("grant of another session"));
    }
    let key = Key::new(root.algorithm, &grant_key(&root.secret));
    let nonce: [u8; 12] = sealed[4..16].try_into().expect("12 bytes");
    let mut body = sealed[16..].to_vec();
    let plain = key.open(nonce, &aad(index), &mut body)?.len();
    body.truncate(plain);
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aead::Algorithm;
    use proptest::prelude::*;

    fn root(index: u32, secret: u8, algorithm: Algorithm) -> Root {
        Root {
            index,
            secret: [secret; 32],
            algorithm,
            expires: shoal_time::Time(u64::MAX),
        }
    }

    #[test]
    fn a_grant_opens_only_under_its_own_root() {
        for algorithm in [Algorithm::Aes256Gcm, Algorithm::ChaCha20Poly1305] {
            let r = root(7, 1, algorithm);
            let sealed = seal(&r, [3; 12], b"uid 1000");
            assert_eq!(index(&sealed), Ok(7));
            assert_eq!(open(&r, &sealed).unwrap(), b"uid 1000");
            assert_eq!(
                open(&root(7, 2, algorithm), &sealed),
                Err(SessionError::BadTag)
            );
            assert!(open(&root(8, 1, algorithm), &sealed).is_err());
            // The index is authenticated: moved to another session's, the
            // grant does not open there either.
            let mut moved = sealed.clone();
            moved[..4].copy_from_slice(&8u32.to_le_bytes());
            assert_eq!(
                open(&root(8, 1, algorithm), &moved),
                Err(SessionError::BadTag)
            );
        }
    }

    proptest! {
        #[test]
        fn any_changed_byte_is_refused(plain in proptest::collection::vec(any::<u8>(), 0..64),
                                       at in any::<prop::sample::Index>(), bit in 0u8..8) {
            let r = root(42, 9, Algorithm::Aes256Gcm);
            let mut sealed = seal(&r, [5; 12], &plain);
            prop_assert_eq!(open(&r, &sealed).unwrap(), plain);
            let i = at.index(sealed.len());
            sealed[i] ^= 1 << bit;
            prop_assert!(open(&r, &sealed).is_err());
        }

        #[test]
        fn any_bytes_decode_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = index(&bytes);
            let _ = open(&root(1, 1, Algorithm::ChaCha20Poly1305), &bytes);
        }
    }
}
