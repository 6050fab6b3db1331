//! The cluster key: the one secret every node of a cluster shared before
//! node sessions, the key of the header form's MAC (`lib.rs`).  Nothing
//! is sealed under it any more; a node that still has its cluster's old
//! key file reads it only to count datagrams in the old form.
//!
//! Two MACs, each under its own key derived from the secret: small
//! datagrams (the common case: requests and replies of small RPCs, acks,
//! locate) use SipHash-2-4 with a 128-bit tag, a PRF built for short
//! inputs, at a few tens of nanoseconds; large ones use keyed BLAKE3,
//! which is faster per byte on bulk data thanks to its SIMD tree.  Both are
//! truncated to the 128-bit MAC field.

use std::fmt;
use std::str::FromStr;

/// Datagrams up to this many bytes are authenticated with SipHash.
const SMALL: usize = 1024;

/// 256-bit shared secret of one cluster, with the MAC keys derived from it.
#[derive(Clone)]
pub struct ClusterKey {
    secret: [u8; 32],
    small: siphasher::sip128::SipHasher24,
    large: [u8; 32],
}

impl PartialEq for ClusterKey {
    fn eq(&self, other: &Self) -> bool {
        self.secret == other.secret
    }
}

impl Eq for ClusterKey {}

impl ClusterKey {
    /// A fresh random key.
    pub fn random() -> Self {
        Self::from_bytes(rand::random())
    }

    /// A key from raw bytes.
    pub fn from_bytes(secret: [u8; 32]) -> Self {
        let small = blake3::derive_key("shoal 2026 datagram MAC SipHash-2-4", &secret);
        let small_key: [u8; 16] = small[..16].try_into().expect("16 bytes");
        Self {
            secret,
            small: siphasher::sip128::SipHasher24::new_with_key(&small_key),
            large: blake3::derive_key("shoal 2026 datagram MAC BLAKE3", &secret),
        }
    }

    /// The raw key bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.secret
    }

    /// The 128-bit MAC of a datagram: bytes `0..4` and `20..` of `datagram`
    /// (the MAC field itself is skipped).  `datagram` must be at least
    /// [`crate::HEADER_LEN`] long.
    pub fn mac(&self, datagram: &[u8]) -> [u8; 16] {
        if datagram.len() <= SMALL {
            use siphasher::sip128::Hasher128;
            use std::hash::Hasher;
            let mut h = self.small;
            h.write(&datagram[..4]);
            h.write(&datagram[crate::HEADER_LEN..]);
            return h.finish128().as_bytes();
        }
        let mut hasher = blake3::Hasher::new_keyed(&self.large);
        hasher.update(&datagram[..4]);
        hasher.update(&datagram[crate::HEADER_LEN..]);
        let hash = hasher.finalize();
        let mut out = [0u8; 16];
        out.copy_from_slice(&hash.as_bytes()[..16]);
        out
    }

    /// Hex text form, as stored in a cluster's key file.
    pub fn to_hex(&self) -> String {
        hex::encode(self.secret)
    }
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

impl FromStr for ClusterKey {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = hex::decode(s.trim()).map_err(|e| format!("cluster key is not hex: {e}"))?;
        let bytes: [u8; 32] = bytes
            .try_into()
            .map_err(|_| "cluster key must be 64 hex characters (32 bytes)".to_string())?;
        Ok(Self::from_bytes(bytes))
    }
}
