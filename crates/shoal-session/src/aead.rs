//! The datagram AEAD: AES-256-GCM where both ends have AES instructions,
//! ChaCha20-Poly1305 otherwise, both through `ring` (BoringSSL's
//! assembly, the same code rustls uses).

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};

use crate::SessionError;

/// Length of an AEAD tag.
pub const TAG_LEN: usize = 16;

/// Which AEAD a session uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Aes256Gcm,
    ChaCha20Poly1305,
}

impl Algorithm {
    /// The AEAD for two ends, each saying whether it has AES instructions.
    pub fn choose(local_aes: bool, remote_aes: bool) -> Self {
        if local_aes && remote_aes {
            Self::Aes256Gcm
        } else {
            Self::ChaCha20Poly1305
        }
    }

    /// Whether this CPU has the instructions that make AES-GCM fast.
    pub fn cpu_has_aes() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("aes")
                && std::arch::is_x86_feature_detected!("pclmulqdq")
        }
        #[cfg(target_arch = "aarch64")]
        {
            std::arch::is_aarch64_feature_detected!("aes")
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            false
        }
    }

    /// The name used in status output and benchmarks.
    pub fn name(self) -> &'static str {
        match self {
            Self::Aes256Gcm => "AES-256-GCM",
            Self::ChaCha20Poly1305 => "ChaCha20-Poly1305",
        }
    }

    fn ring(self) -> &'static aead::Algorithm {
        match self {
            Self::Aes256Gcm => &aead::AES_256_GCM,
            Self::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
        }
    }
}

/// One direction's AEAD key.  It never leaves this type.
pub struct Key {
    algorithm: Algorithm,
    key: LessSafeKey,
}

impl Key {
    /// The key `bytes` for `algorithm`.
    pub fn new(algorithm: Algorithm, bytes: &[u8; 32]) -> Self {
        let unbound = UnboundKey::new(algorithm.ring(), bytes).expect("both AEADs take 32 bytes");
        Self {
            algorithm,
            key: LessSafeKey::new(unbound),
        }
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Encrypts `in_out` in place under `nonce`, authenticating `aad` too;
    /// returns the tag.
    pub fn seal(&self, nonce: [u8; 12], aad: &[u8], in_out: &mut [u8]) -> [u8; TAG_LEN] {
        let tag = self
            .key
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), in_out)
            .expect("datagrams are far below the AEAD's length limit");
        tag.as_ref().try_into().expect("16-byte tag")
    }

    /// Checks and decrypts `in_out` (ciphertext followed by its tag) in
    /// place; returns the plaintext, which is `in_out` less the tag.
    pub fn open<'a>(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        in_out: &'a mut [u8],
    ) -> Result<&'a mut [u8], SessionError> {
        self.key
            .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), in_out)
            .map_err(|_| SessionError::BadTag)
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({})", self.algorithm.name())
    }
}
