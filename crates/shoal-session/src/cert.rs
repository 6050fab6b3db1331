//! Admission: the admin key, node certificates and revocation lists
//! (`docs/security.md`, "Admission and revocation").
//!
//! The admin key (Ed25519) is the cluster's root of trust.  A node
//! certificate binds a node's name to its static X25519 key under that
//! key; a revocation list, also signed, names the serials no longer
//! admitted.  Decoders check lengths and counts before they read, never
//! panic, and check the signature before they return anything.

use std::fmt;

use ring::signature::{self, Ed25519KeyPair, KeyPair};

use crate::SessionError;

/// Length of an Ed25519 signature.
pub const SIGNATURE_LEN: usize = 64;
/// Longest node name, in bytes.
pub const MAX_NAME: usize = 64;
/// Most serials one revocation list names.
pub const MAX_REVOKED: usize = 4096;

const CERT_MAGIC: [u8; 4] = *b"SNC1";
const CERT_CONTEXT: &[u8] = b"shoal 2026 node certificate v1";
/// The revocation list's envelope (`signed.rs`).
const LIST: crate::signed::Kind = crate::signed::Kind {
    magic: *b"SRL1",
    context: b"shoal 2026 revocation list v1",
    bad_magic: "revocation list magic",
};

/// A cluster's public identifier: certificates and sessions of one cluster
/// never verify in another.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClusterId(pub [u8; 16]);

impl ClusterId {
    /// Hex text form.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 32 hex digits.
    pub fn from_hex(text: &str) -> Result<Self, SessionError> {
        let bytes = hex::decode(text.trim()).map_err(|_| SessionError::Malformed("cluster id"))?;
        Ok(Self(
            bytes
                .try_into()
                .map_err(|_| SessionError::Malformed("cluster id"))?,
        ))
    }
}

impl fmt::Debug for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterId({})", self.to_hex())
    }
}

/// The administrator's signing key.  Only its seed is stored.
pub struct AdminKey {
    seed: [u8; 32],
    pair: Ed25519KeyPair,
}

impl AdminKey {
    /// The key whose seed is `seed` (32 random bytes for a new one).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        let pair = Ed25519KeyPair::from_seed_unchecked(&seed).expect("any 32 bytes are a seed");
        Self { seed, pair }
    }

    /// The seed, for the admin key file.
    pub fn seed(&self) -> &[u8; 32] {
        &self.seed
    }

    /// The public half, which every node is configured with.
    pub fn public(&self) -> AdminPublic {
        AdminPublic(
            self.pair
                .public_key()
                .as_ref()
                .try_into()
                .expect("Ed25519 public keys are 32 bytes"),
        )
    }

    pub(crate) fn sign(&self, context: &[u8], body: &[u8]) -> [u8; SIGNATURE_LEN] {
        let mut message = Vec::with_capacity(context.len() + body.len());
        message.extend_from_slice(context);
        message.extend_from_slice(body);
        self.pair
            .sign(&message)
            .as_ref()
            .try_into()
            .expect("Ed25519 signatures are 64 bytes")
    }
}

impl fmt::Debug for AdminKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AdminKey(public {})", self.public().to_hex())
    }
}

/// The admin key's public half.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct AdminPublic(pub [u8; 32]);

impl AdminPublic {
    /// Hex text form.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex digits.
    pub fn from_hex(text: &str) -> Result<Self, SessionError> {
        let bytes = hex::decode(text.trim()).map_err(|_| SessionError::Malformed("admin key"))?;
        Ok(Self(
            bytes
                .try_into()
                .map_err(|_| SessionError::Malformed("admin key"))?,
        ))
    }

    pub(crate) fn verify(
        &self,
        context: &[u8],
        body: &[u8],
        sig: &[u8],
    ) -> Result<(), SessionError> {
        let mut message = Vec::with_capacity(context.len() + body.len());
        message.extend_from_slice(context);
        message.extend_from_slice(body);
        signature::UnparsedPublicKey::new(&signature::ED25519, &self.0)
            .verify(&message, sig)
            .map_err(|_| SessionError::BadSignature)
    }
}

impl fmt::Debug for AdminPublic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AdminPublic({})", self.to_hex())
    }
}

/// What a node certificate says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCert {
    pub cluster: ClusterId,
    /// Unique per cluster; what a revocation names.
    pub serial: u64,
    /// Valid from this Unix second...
    pub not_before: u64,
    /// ...to this one.
    pub not_after: u64,
    /// The node's static X25519 public key.
    pub static_key: [u8; 32],
    /// The node's name: 1 to 64 bytes of `[a-z0-9-]`.
    pub name: String,
}

/// Whether `name` is a valid node name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl NodeCert {
    /// The certificate signed by `admin`, encoded.
    pub fn sign(&self, admin: &AdminKey) -> Result<Vec<u8>, SessionError> {
        if !valid_name(&self.name) {
            return Err(SessionError::Malformed("node name"));
        }
        if self.not_after < self.not_before {
            return Err(SessionError::Malformed("validity"));
        }
        let mut out = Vec::with_capacity(77 + self.name.len() + SIGNATURE_LEN);
        out.extend_from_slice(&CERT_MAGIC);
        out.extend_from_slice(&self.cluster.0);
        out.extend_from_slice(&self.serial.to_le_bytes());
        out.extend_from_slice(&self.not_before.to_le_bytes());
        out.extend_from_slice(&self.not_after.to_le_bytes());
        out.extend_from_slice(&self.static_key);
        out.push(self.name.len() as u8);
        out.extend_from_slice(self.name.as_bytes());
        let sig = admin.sign(CERT_CONTEXT, &out);
        out.extend_from_slice(&sig);
        Ok(out)
    }

    /// Decodes an encoded certificate and checks its signature under
    /// `admin`.  It checks nothing else: see [`Trust::admit`].
    pub fn verify(bytes: &[u8], admin: &AdminPublic) -> Result<NodeCert, SessionError> {
        let mut r = reader(bytes);
        if r.take(4)? != CERT_MAGIC {
            return Err(SessionError::Malformed("certificate magic"));
        }
        let cluster = ClusterId(r.array()?);
        let serial = r.u64()?;
        let not_before = r.u64()?;
        let not_after = r.u64()?;
        let static_key = r.array()?;
        let n = r.u8()? as usize;
        let name = r.take(n)?;
        let signed = bytes.len() - r.remaining();
        let sig = r.take(SIGNATURE_LEN)?;
        if r.remaining() != 0 {
            return Err(SessionError::Malformed("certificate length"));
        }
        admin.verify(CERT_CONTEXT, &bytes[..signed], sig)?;
        let name = std::str::from_utf8(name)
            .ok()
            .filter(|n| valid_name(n))
            .ok_or(SessionError::Malformed("node name"))?;
        Ok(NodeCert {
            cluster,
            serial,
            not_before,
            not_after,
            static_key,
            name: name.to_string(),
        })
    }
}

/// The serials an administrator no longer admits, with a version that only
/// grows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RevocationList {
    pub version: u64,
    pub issued: u64,
    /// Strictly increasing.
    pub serials: Vec<u64>,
}

impl RevocationList {
    /// Whether `serial` is revoked.
    pub fn revokes(&self, serial: u64) -> bool {
        self.serials.binary_search(&serial).is_ok()
    }

    /// The list for `cluster`, signed by `admin`, encoded.  The serials are
    /// sorted and deduplicated first.
    pub fn sign(&self, cluster: ClusterId, admin: &AdminKey) -> Result<Vec<u8>, SessionError> {
        let mut serials = self.serials.clone();
        serials.sort_unstable();
        serials.dedup();
        if serials.len() > MAX_REVOKED {
            return Err(SessionError::Malformed("too many revoked serials"));
        }
        let mut body = Vec::with_capacity(2 + 8 * serials.len());
        body.extend_from_slice(&(serials.len() as u16).to_le_bytes());
        for s in &serials {
            body.extend_from_slice(&s.to_le_bytes());
        }
        let when = (self.version, self.issued);
        Ok(crate::signed::sign(&LIST, cluster, when, &body, admin))
    }

    /// Decodes an encoded list and checks its signature under `admin` and
    /// that it belongs to `cluster`.
    pub fn verify(
        bytes: &[u8],
        cluster: ClusterId,
        admin: &AdminPublic,
    ) -> Result<RevocationList, SessionError> {
        let (version, issued, mut r) = crate::signed::open(&LIST, bytes, cluster, admin)?;
        let n = r.u16()? as usize;
        if n > MAX_REVOKED {
            return Err(SessionError::Malformed("too many revoked serials"));
        }
        let raw = r.take(8 * n)?;
        if r.remaining() != 0 {
            return Err(SessionError::Malformed("revocation list length"));
        }
        let serials: Vec<u64> = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        if serials.windows(2).any(|w| w[0] >= w[1]) {
            return Err(SessionError::Malformed("revoked serials not increasing"));
        }
        Ok(RevocationList {
            version,
            issued,
            serials,
        })
    }
}

/// What a node trusts: its cluster, the admin's public key, and the newest
/// revocation list it has verified.
#[derive(Debug, Clone)]
pub struct Trust {
    pub cluster: ClusterId,
    pub admin: AdminPublic,
    pub revoked: RevocationList,
}

impl Trust {
    /// Checks an encoded certificate completely: signature, cluster,
    /// validity at `now` (Unix seconds) and revocation.
    pub fn admit(&self, bytes: &[u8], now: u64) -> Result<NodeCert, SessionError> {
        let cert = NodeCert::verify(bytes, &self.admin)?;
        if cert.cluster != self.cluster {
            return Err(SessionError::WrongCluster);
        }
        if now < cert.not_before || now > cert.not_after {
            return Err(SessionError::Expired);
        }
        if self.revoked.revokes(cert.serial) {
            return Err(SessionError::Revoked(cert.serial));
        }
        Ok(cert)
    }

    /// Takes `list` if it is newer than the one held: whether it was.
    pub fn update(&mut self, list: RevocationList) -> bool {
        if list.version > self.revoked.version {
            self.revoked = list;
            true
        } else {
            false
        }
    }
}

/// The shared reader (`shoal_cap::codec`).
pub(crate) type Reader<'a> = shoal_cap::codec::Reader<'a>;

/// A reader of `bytes`, one of the session layer's formats.
pub(crate) fn reader(bytes: &[u8]) -> Reader<'_> {
    Reader::new(bytes, "session format")
}

impl From<shoal_cap::codec::DecodeError> for SessionError {
    fn from(e: shoal_cap::codec::DecodeError) -> SessionError {
        if e.is_truncated() {
            SessionError::Truncated
        } else {
            SessionError::Malformed(e.why)
        }
    }
}
