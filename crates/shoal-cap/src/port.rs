//! Ports, after Amoeba's F-box.
//!
//! A server listens on a secret [`GetPort`] and publishes only the matching
//! [`PutPort`]; clients address requests to the put-port.  The put-port is a
//! one-way function of the get-port,
//!
//! ```text
//! put = first16(BLAKE3-derive_key("shoal 2026 port F-box v1", get))
//! ```
//!
//! so knowing a put-port (it is in every capability) does not let anyone
//! listen on, i.e. impersonate, the service.  The node enforces the F-box:
//! a process registers a get-port, and the node announces only `put_port()`.
//!
//! Both are 16 bytes and print / parse as 32 hex characters.  A get-port is
//! a secret: its `Debug` prints `GetPort(..)`, it has no `Display`, and
//! [`GetPort::to_hex`] is the one deliberate way to write it out.
//!
//! A get-port comes from the OS random number generator
//! ([`GetPort::random`]), from a caller's generator ([`GetPort::from_rng`],
//! for deterministic simulation), or from a 32-byte master key and a service
//! name ([`GetPort::derive`]), so a restarted server gets the same port back:
//!
//! ```text
//! get = first16(BLAKE3-keyed(key, "shoal 2026 get-port derive v1" || context))
//! ```

use std::fmt;
use std::str::FromStr;

use rand::{RngCore, TryRngCore};

use crate::error::CapError;

/// Context string of the F-box one-way function.
const FBOX_CONTEXT: &str = "shoal 2026 port F-box v1";
/// Domain separation prefix for [`GetPort::derive`] (fixed length, so the
/// context that follows it is unambiguous).
const DERIVE_DOMAIN: &[u8] = b"shoal 2026 get-port derive v1";

/// The secret port a server listens on.  Never put it on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GetPort([u8; 16]);

/// The public port clients send requests to: the F-box image of a [`GetPort`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PutPort([u8; 16]);

impl GetPort {
    /// A fresh get-port from the operating system's random number generator.
    ///
    /// # Panics
    ///
    /// If the operating system cannot supply random bytes.
    pub fn random() -> GetPort {
        let mut b = [0u8; 16];
        rand::rngs::OsRng
            .try_fill_bytes(&mut b)
            .expect("operating system random number generator failed");
        GetPort(b)
    }

    /// A get-port drawn from `rng` (use a seeded generator for reproducible
    /// simulations, never for production ports).
    pub fn from_rng<R: RngCore + ?Sized>(rng: &mut R) -> GetPort {
        let mut b = [0u8; 16];
        rng.fill_bytes(&mut b);
        GetPort(b)
    }

    /// The get-port for service `context` under master `key`: the same
    /// inputs always give the same port, different contexts unrelated ones.
    pub fn derive(key: &[u8; 32], context: &str) -> GetPort {
        let mut h = blake3::Hasher::new_keyed(key);
        h.update(DERIVE_DOMAIN);
        h.update(context.as_bytes());
        GetPort(first16(h.finalize().as_bytes()))
    }

    /// The public put-port matching this get-port (one-way).
    pub fn put_port(&self) -> PutPort {
        PutPort(first16(&blake3::derive_key(FBOX_CONTEXT, &self.0)))
    }

    /// A get-port with exactly these bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> GetPort {
        GetPort(bytes)
    }

    /// The secret bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The secret as 32 lowercase hex characters (what `FromStr` parses).
    /// Write it only where the secret belongs, e.g. a server's key file.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl PutPort {
    /// A put-port with exactly these bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> PutPort {
        PutPort(bytes)
    }

    /// The port's bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Debug for GetPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GetPort(..)")
    }
}

impl fmt::Debug for PutPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PutPort({self})")
    }
}

impl fmt::Display for PutPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 32];
        // The buffer is exactly twice the input, so this cannot fail.
        hex::encode_to_slice(self.0, &mut buf).map_err(|_| fmt::Error)?;
        f.write_str(std::str::from_utf8(&buf).map_err(|_| fmt::Error)?)
    }
}

impl FromStr for GetPort {
    type Err = CapError;
    fn from_str(s: &str) -> Result<GetPort, CapError> {
        parse_hex16(s).map(GetPort)
    }
}

impl FromStr for PutPort {
    type Err = CapError;
    fn from_str(s: &str) -> Result<PutPort, CapError> {
        parse_hex16(s).map(PutPort)
    }
}

/// The first 16 bytes of a 32-byte hash output.
pub(crate) fn first16(h: &[u8; 32]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out.copy_from_slice(&h[..16]);
    out
}

/// Parses exactly 32 hex characters (either case) into 16 bytes.
fn parse_hex16(s: &str) -> Result<[u8; 16], CapError> {
    if s.len() != 32 {
        return Err(CapError::PortLength { len: s.len() });
    }
    let mut out = [0u8; 16];
    hex::decode_to_slice(s, &mut out).map_err(|_| CapError::BadHex)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ports_differ() {
        assert_ne!(GetPort::random(), GetPort::random());
    }

    #[test]
    fn put_port_is_deterministic_and_differs_from_get() {
        let g = GetPort::from_bytes([7; 16]);
        assert_eq!(g.put_port(), g.put_port());
        assert_ne!(g.put_port().as_bytes(), g.as_bytes());
        assert_ne!(g.put_port(), GetPort::from_bytes([8; 16]).put_port());
    }

    #[test]
    fn put_port_known_answer() {
        // Pin the F-box so a change to it is a deliberate, visible one.
        let g = GetPort::from_bytes([0; 16]);
        let expect = first16(&blake3::derive_key("shoal 2026 port F-box v1", &[0; 16]));
        assert_eq!(g.put_port().as_bytes(), &expect);
    }

    #[test]
    fn derive_is_deterministic_and_separated() {
        let k = [1u8; 32];
        assert_eq!(GetPort::derive(&k, "fs"), GetPort::derive(&k, "fs"));
        assert_ne!(GetPort::derive(&k, "fs"), GetPort::derive(&k, "fs2"));
        assert_ne!(GetPort::derive(&k, "fs"), GetPort::derive(&[2u8; 32], "fs"));
        // Domain separation: not the plain keyed hash of the context.
        let plain = first16(blake3::keyed_hash(&k, b"fs").as_bytes());
        assert_ne!(GetPort::derive(&k, "fs").as_bytes(), &plain);
    }

    #[test]
    fn debug_hides_get_port() {
        let g = GetPort::from_bytes([0xab; 16]);
        assert_eq!(format!("{g:?}"), "GetPort(..)");
        assert!(!format!("{g:?}").contains("ab"));
    }

    #[test]
    fn text_round_trips() {
        let g = GetPort::random();
        assert_eq!(g.to_hex().len(), 32);
        assert_eq!(g.to_hex().parse::<GetPort>(), Ok(g));
        let p = g.put_port();
        let s = p.to_string();
        assert_eq!(s.len(), 32);
        assert!(
            s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        assert_eq!(s.parse::<PutPort>(), Ok(p));
        assert_eq!(s.to_uppercase().parse::<PutPort>(), Ok(p));
        assert_eq!(format!("{p:?}"), format!("PutPort({s})"));
    }

    #[test]
    fn parse_errors() {
        assert_eq!("".parse::<PutPort>(), Err(CapError::PortLength { len: 0 }));
        assert_eq!(
            "ab".repeat(17).parse::<PutPort>(),
            Err(CapError::PortLength { len: 34 })
        );
        assert_eq!("zz".repeat(16).parse::<GetPort>(), Err(CapError::BadHex));
        // 16 two-byte characters: right byte length, not hex; must not panic.
        assert_eq!("é".repeat(16).parse::<PutPort>(), Err(CapError::BadHex));
    }

    #[test]
    fn bytes_round_trip() {
        let b = [3u8; 16];
        assert_eq!(GetPort::from_bytes(b).as_bytes(), &b);
        assert_eq!(PutPort::from_bytes(b).as_bytes(), &b);
    }
}
