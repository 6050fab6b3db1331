//! The cluster key: every node and program of one cluster holds it, and
//! every datagram carries a MAC made with it.

use std::fmt;
use std::str::FromStr;

/// 256-bit shared secret of one cluster.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey([u8; 32]);

impl ClusterKey {
    /// A fresh random key.
    pub fn random() -> Self {
        Self(rand::random())
    }

    /// A key from raw bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The raw key bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 128-bit MAC of a datagram: bytes `0..4` and `20..` of `datagram`
    /// (the MAC field itself is skipped).  `datagram` must be at least
    /// [`crate::HEADER_LEN`] long.
    pub fn mac(&self, datagram: &[u8]) -> [u8; 16] {
        let mut hasher = blake3::Hasher::new_keyed(&self.0);
        hasher.update(&datagram[..4]);
        hasher.update(&datagram[crate::HEADER_LEN..]);
        let hash = hasher.finalize();
        let mut out = [0u8; 16];
        out.copy_from_slice(&hash.as_bytes()[..16]);
        out
    }

    /// Hex text form, as stored in a cluster's key file.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
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
        Ok(Self(bytes))
    }
}
