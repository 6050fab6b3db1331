//! Capabilities: 48-byte bearer tokens naming one object and some rights.
//!
//! Binary form (all a client ever holds; the server keeps only the
//! object's [`ObjectSecret`]):
//!
//! ```text
//!  0         16         24          32             48
//!  +---------+----------+-----------+--------------+
//!  | put-port| object   | chain     | check        |
//!  | 16 B    | u64 LE   | 8 x rights| 16 B         |
//!  +---------+----------+-----------+--------------+
//! ```
//!
//! `chain` is the rights history.  `chain[0]` is what the server minted;
//! each later entry is either a proper subset of the one before (one
//! restriction step) or, once the steps are over, a repeat of the last
//! entry.  That is the only accepted (canonical) form: a strictly shrinking
//! prefix, then repeats.  So a chain fixes its sequence of steps and the
//! sequence fixes the chain; `[FF,0F,0F,07,..]` is rejected, because it
//! would describe the same steps as `[FF,0F,07,07,..]` and a changed byte
//! would go unnoticed.  At most 7 steps fit.  The effective rights are the
//! last entry.
//!
//! `check` is a chained MAC, macaroon style.  With `first16` the first 16
//! bytes of a BLAKE3 output and `||` concatenation:
//!
//! ```text
//! c0 = first16(BLAKE3-keyed(secret,
//!          "shoal 2026 capability mint v1" || put-port || object LE || chain[0]))
//! for each step, at chain position i = 1..=k (chain[i] != chain[i-1]):
//! ci = first16(BLAKE3("shoal 2026 capability restriction v1"
//!          || c(i-1) || [i] || chain[i]))
//! check = ck
//! ```
//!
//! Both inputs are fixed-length and 54 bytes, one BLAKE3 block each, so
//! verifying costs one compression per chain link: a fresh capability
//! needs exactly one (plus a constant-time compare, no allocation).  The
//! mint MAC uses BLAKE3's keyed mode and the steps its plain hash mode,
//! each behind its own prefix, so the two can never be confused.
//!
//! A restriction step needs only the previous check and the new rights, so
//! any holder can restrict offline; undoing one means finding a BLAKE3
//! preimage, so nobody can widen rights.  The step position `i` is hashed
//! in as well, binding each step to its place in the chain.  The server
//! verifies by recomputing the whole chain from its secret.  Replacing the
//! object's secret changes `c0`, which revokes every capability for the
//! object and every restriction of them.
//!
//! Text form for people and the CLI: `cap1:` then 96 lowercase hex digits
//! of the binary form.  `Debug` hides the check field (the capability is a
//! bearer token; logs should not carry it); `Display` is the full token.

use std::fmt;
use std::str::FromStr;

use crate::ct::ct_eq;
use crate::error::CapError;
use crate::object::ObjectId;
use crate::port::{PutPort, first16};
use crate::rights::Rights;
use crate::secret::ObjectSecret;

/// Domain separation prefix of the minting MAC (29 bytes, so the whole
/// mint input is 54 bytes: one BLAKE3 block).
const MINT_DOMAIN: &[u8; 29] = b"shoal 2026 capability mint v1";
/// Domain separation prefix of one restriction step (36 bytes, so the whole
/// step input is 54 bytes: one BLAKE3 block).
const STEP_DOMAIN: &[u8; 36] = b"shoal 2026 capability restriction v1";
/// Prefix of the text form.
const TEXT_PREFIX: &str = "cap1:";

/// An unforgeable reference to one object with some rights: see the
/// module documentation for the format and the MAC.
///
/// Every `Capability` value has a canonical chain; whether its check field
/// is genuine is only known to the server, through [`Capability::verify`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Capability {
    port: PutPort,
    object: ObjectId,
    chain: [Rights; 8],
    check: [u8; 16],
}

impl Capability {
    /// Length of the binary form in bytes.
    pub const LEN: usize = 48;
    /// Number of restriction steps a capability can hold.
    pub const MAX_STEPS: usize = 7;

    /// Mints a capability for `object` of the server at `port` with
    /// `rights`, keyed with the object's `secret`.  Server side only.
    pub fn mint(
        port: PutPort,
        object: ObjectId,
        rights: Rights,
        secret: &ObjectSecret,
    ) -> Capability {
        Capability {
            port,
            object,
            chain: [rights; 8],
            check: mint_check(secret, &port, object, rights),
        }
    }

    /// A capability with rights `current ∩ rights`, computed offline, with
    /// no secret.  If that is no change, returns `self` unchanged and uses
    /// no step.  Never amplifies.
    ///
    /// Fails with [`CapError::ChainFull`] if a real restriction is asked of
    /// a capability that already used all [`Capability::MAX_STEPS`] steps.
    pub fn restrict(&self, rights: Rights) -> Result<Capability, CapError> {
        let current = self.rights();
        let new = current.intersect(rights);
        if new == current {
            return Ok(*self);
        }
        let used = self.steps();
        if used >= Self::MAX_STEPS {
            return Err(CapError::ChainFull);
        }
        let pos = used + 1;
        let mut chain = self.chain;
        for slot in &mut chain[pos..] {
            *slot = new;
        }
        Ok(Capability {
            port: self.port,
            object: self.object,
            chain,
            check: step_check(&self.check, pos, new),
        })
    }

    /// Checks the capability against the object's `secret` and returns the
    /// rights it grants.  Constant-time in the check field; no allocation.
    ///
    /// Fails with [`CapError::Forged`] if the check does not match (forged,
    /// corrupted, or minted under a secret since replaced).
    pub fn verify(&self, secret: &ObjectSecret) -> Result<Rights, CapError> {
        // Values are canonical by construction; checking again is cheap and
        // keeps verify sound on its own.
        check_canonical(&self.chain)?;
        let expect = compute_check(secret, &self.port, self.object, &self.chain);
        if ct_eq(&expect, &self.check) {
            Ok(self.rights())
        } else {
            Err(CapError::Forged)
        }
    }

    /// [`verify`](Capability::verify), then fails with
    /// [`CapError::InsufficientRights`] unless the rights include `needed`.
    /// Returns the capability's full rights.
    pub fn require(&self, secret: &ObjectSecret, needed: Rights) -> Result<Rights, CapError> {
        let have = self.verify(secret)?;
        if have.contains(needed) {
            Ok(have)
        } else {
            Err(CapError::InsufficientRights { have, need: needed })
        }
    }

    /// The binary form.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[0..16].copy_from_slice(self.port.as_bytes());
        out[16..24].copy_from_slice(&self.object.get().to_le_bytes());
        for (dst, r) in out[24..32].iter_mut().zip(self.chain) {
            *dst = r.bits();
        }
        out[32..48].copy_from_slice(&self.check);
        out
    }

    /// Decodes the binary form.  Fails on a length other than
    /// [`Capability::LEN`] or a non-canonical chain; never panics.  Does
    /// not verify the check (only the server can).
    pub fn from_bytes(bytes: &[u8]) -> Result<Capability, CapError> {
        let b: &[u8; Self::LEN] = bytes
            .try_into()
            .map_err(|_| CapError::WrongLength { len: bytes.len() })?;
        let mut port = [0u8; 16];
        port.copy_from_slice(&b[0..16]);
        let mut object = [0u8; 8];
        object.copy_from_slice(&b[16..24]);
        let mut chain = [Rights::NONE; 8];
        for (r, &bits) in chain.iter_mut().zip(&b[24..32]) {
            *r = Rights::from_bits(bits);
        }
        check_canonical(&chain)?;
        let mut check = [0u8; 16];
        check.copy_from_slice(&b[32..48]);
        Ok(Capability {
            port: PutPort::from_bytes(port),
            object: ObjectId::new(u64::from_le_bytes(object)),
            chain,
            check,
        })
    }

    /// The put-port of the server that owns the object.
    pub const fn port(&self) -> PutPort {
        self.port
    }

    /// The object, within that server.
    pub const fn object(&self) -> ObjectId {
        self.object
    }

    /// The effective rights (the last chain entry).  Not yet verified.
    pub const fn rights(&self) -> Rights {
        self.chain[7]
    }

    /// The rights history: `[0]` as minted, then one entry per step, then
    /// repeats of the last.
    pub const fn chain(&self) -> [Rights; 8] {
        self.chain
    }

    /// Number of restriction steps used, 0 ..= [`Capability::MAX_STEPS`].
    pub fn steps(&self) -> usize {
        self.chain.windows(2).filter(|w| w[0] != w[1]).count()
    }
}

/// Accepts exactly the chains that are a strictly shrinking prefix
/// followed only by repeats of its last entry.
fn check_canonical(chain: &[Rights; 8]) -> Result<(), CapError> {
    let mut steps_over = false;
    for i in 1..chain.len() {
        let (prev, cur) = (chain[i - 1], chain[i]);
        if cur == prev {
            steps_over = true;
        } else if steps_over || !cur.is_proper_subset_of(prev) {
            return Err(CapError::NonCanonical);
        }
    }
    Ok(())
}

/// `c0`: the server's MAC over the fixed fields and the minted rights.
fn mint_check(secret: &ObjectSecret, port: &PutPort, object: ObjectId, rights: Rights) -> [u8; 16] {
    let mut input = [0u8; 54];
    input[0..29].copy_from_slice(MINT_DOMAIN);
    input[29..45].copy_from_slice(port.as_bytes());
    input[45..53].copy_from_slice(&object.get().to_le_bytes());
    input[53] = rights.bits();
    first16(blake3::keyed_hash(secret.as_bytes(), &input).as_bytes())
}

/// One restriction step at chain position `pos` (1..=7) to `rights`.
fn step_check(prev: &[u8; 16], pos: usize, rights: Rights) -> [u8; 16] {
    let mut input = [0u8; 54];
    input[0..36].copy_from_slice(STEP_DOMAIN);
    input[36..52].copy_from_slice(prev);
    // pos is at most 7; the cast cannot truncate.
    input[52] = pos as u8;
    input[53] = rights.bits();
    first16(blake3::hash(&input).as_bytes())
}

/// The check a genuine capability with these fields must carry.
fn compute_check(
    secret: &ObjectSecret,
    port: &PutPort,
    object: ObjectId,
    chain: &[Rights; 8],
) -> [u8; 16] {
    let mut c = mint_check(secret, port, object, chain[0]);
    for pos in 1..chain.len() {
        if chain[pos] != chain[pos - 1] {
            c = step_check(&c, pos, chain[pos]);
        }
    }
    c
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 2 * Self::LEN];
        // The buffer is exactly twice the input, so this cannot fail.
        hex::encode_to_slice(self.to_bytes(), &mut buf).map_err(|_| fmt::Error)?;
        f.write_str(TEXT_PREFIX)?;
        f.write_str(std::str::from_utf8(&buf).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Capability")
            .field("port", &self.port)
            .field("object", &self.object)
            .field("rights", &self.rights())
            .field("chain", &self.chain)
            .finish_non_exhaustive()
    }
}

impl FromStr for Capability {
    type Err = CapError;

    /// Parses `cap1:` followed by 96 hex digits (either case).
    fn from_str(s: &str) -> Result<Capability, CapError> {
        let hex = s.strip_prefix(TEXT_PREFIX).ok_or(CapError::MissingPrefix)?;
        if hex.len() != 2 * Self::LEN {
            return Err(CapError::TextLength { len: hex.len() });
        }
        let mut bytes = [0u8; Self::LEN];
        hex::decode_to_slice(hex, &mut bytes).map_err(|_| CapError::BadHex)?;
        Capability::from_bytes(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::GetPort;

    fn setup() -> (PutPort, ObjectId, ObjectSecret) {
        (
            GetPort::from_bytes([5; 16]).put_port(),
            ObjectId::new(0x0102_0304_0506_0708),
            ObjectSecret::from_bytes([0x42; 32]),
        )
    }

    #[test]
    fn mint_then_verify() {
        let (p, o, s) = setup();
        let cap = Capability::mint(p, o, Rights::ALL, &s);
        assert_eq!(cap.verify(&s), Ok(Rights::ALL));
        assert_eq!(cap.port(), p);
        assert_eq!(cap.object(), o);
        assert_eq!(cap.rights(), Rights::ALL);
        assert_eq!(cap.chain(), [Rights::ALL; 8]);
        assert_eq!(cap.steps(), 0);
    }

    #[test]
    fn binary_layout() {
        let (p, o, s) = setup();
        let cap = Capability::mint(p, o, Rights::READ, &s);
        let b = cap.to_bytes();
        assert_eq!(b.len(), Capability::LEN);
        assert_eq!(&b[0..16], p.as_bytes());
        assert_eq!(&b[16..24], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&b[24..32], &[1; 8]);
        assert_eq!(Capability::from_bytes(&b), Ok(cap));
    }

    #[test]
    fn mint_check_known_answer() {
        // Pin the construction so a change to it is deliberate and visible.
        let (p, o, s) = setup();
        let mut input = Vec::new();
        input.extend_from_slice(b"shoal 2026 capability mint v1");
        input.extend_from_slice(p.as_bytes());
        input.extend_from_slice(&o.get().to_le_bytes());
        input.push(0x0f);
        let c0 = first16(blake3::keyed_hash(s.as_bytes(), &input).as_bytes());
        let cap = Capability::mint(p, o, Rights::from_bits(0x0f), &s);
        assert_eq!(&cap.to_bytes()[32..], &c0);

        let mut m = b"shoal 2026 capability restriction v1".to_vec();
        m.extend_from_slice(&c0);
        m.extend_from_slice(&[1, 0x03]);
        let c1 = first16(blake3::hash(&m).as_bytes());
        let r = cap.restrict(Rights::from_bits(0x03)).unwrap();
        assert_eq!(&r.to_bytes()[32..], &c1);
    }

    #[test]
    fn restrict_then_verify_gives_intersection() {
        let (p, o, s) = setup();
        let cap = Capability::mint(p, o, Rights::READ | Rights::WRITE | Rights::DELETE, &s);
        let r = cap.restrict(Rights::READ | Rights::EXEC).unwrap();
        assert_eq!(r.rights(), Rights::READ);
        assert_eq!(r.verify(&s), Ok(Rights::READ));
        assert_eq!(r.steps(), 1);
        assert_eq!(r.chain()[0], cap.rights());
        assert_eq!(r.port(), p);
        assert_eq!(r.object(), o);
    }

    #[test]
    fn restrict_to_superset_is_no_op() {
        let (p, o, s) = setup();
        let cap = Capability::mint(p, o, Rights::READ, &s);
        assert_eq!(cap.restrict(Rights::ALL), Ok(cap));
        assert_eq!(cap.restrict(Rights::READ), Ok(cap));
        let r = cap.restrict(Rights::NONE).unwrap();
        assert_eq!(r.verify(&s), Ok(Rights::NONE));
        assert_eq!(r.restrict(Rights::NONE), Ok(r));
    }

    #[test]
    fn chain_full_after_seven_steps() {
        let (p, o, s) = setup();
        let mut cap = Capability::mint(p, o, Rights::ALL, &s);
        for bits in [0x7f, 0x3f, 0x1f, 0x0f, 0x07, 0x03, 0x01] {
            cap = cap.restrict(Rights::from_bits(bits)).unwrap();
            assert_eq!(cap.verify(&s), Ok(Rights::from_bits(bits)));
        }
        assert_eq!(cap.steps(), 7);
        assert_eq!(cap.restrict(Rights::NONE), Err(CapError::ChainFull));
        // A no-op restriction still succeeds on a full chain.
        assert_eq!(cap.restrict(Rights::ALL), Ok(cap));
        let rt = Capability::from_bytes(&cap.to_bytes()).unwrap();
        assert_eq!(rt.verify(&s), Ok(Rights::READ));
    }

    #[test]
    fn revocation_by_new_secret() {
        let (p, o, s) = setup();
        let cap = Capability::mint(p, o, Rights::ALL, &s);
        let restricted = cap.restrict(Rights::READ).unwrap();
        let new_secret = ObjectSecret::from_bytes([0x43; 32]);
        assert_eq!(cap.verify(&new_secret), Err(CapError::Forged));
        assert_eq!(restricted.verify(&new_secret), Err(CapError::Forged));
        // A capability minted under the new secret works.
        let fresh = Capability::mint(p, o, Rights::ALL, &new_secret);
        assert_eq!(fresh.verify(&new_secret), Ok(Rights::ALL));
        assert_eq!(fresh.verify(&s), Err(CapError::Forged));
    }

    #[test]
    fn require_reports_missing_rights() {
        let (p, o, s) = setup();
        let cap = Capability::mint(p, o, Rights::READ, &s);
        assert_eq!(cap.require(&s, Rights::READ), Ok(Rights::READ));
        assert_eq!(cap.require(&s, Rights::NONE), Ok(Rights::READ));
        let err = cap.require(&s, Rights::READ | Rights::WRITE).unwrap_err();
        assert_eq!(
            err,
            CapError::InsufficientRights {
                have: Rights::READ,
                need: Rights::READ | Rights::WRITE
            }
        );
        let msg = err.to_string();
        assert!(
            msg.contains("r-------") && msg.contains("rw------"),
            "{msg}"
        );
        let bad = ObjectSecret::from_bytes([0; 32]);
        assert_eq!(cap.require(&bad, Rights::READ), Err(CapError::Forged));
    }

    #[test]
    fn amplifying_by_editing_the_chain_fails() {
        let (p, o, s) = setup();
        let cap = Capability::mint(p, o, Rights::ALL, &s)
            .restrict(Rights::READ)
            .unwrap();
        let mut b = cap.to_bytes();
        // Drop the step: chain back to all-FF with the restricted check.
        b[24..32].copy_from_slice(&[0xff; 8]);
        let forged = Capability::from_bytes(&b).unwrap();
        assert_eq!(forged.verify(&s), Err(CapError::Forged));
        // Widen the last step.
        let mut b = cap.to_bytes();
        b[25..32].copy_from_slice(&[0x03; 7]);
        let forged = Capability::from_bytes(&b).unwrap();
        assert_eq!(forged.verify(&s), Err(CapError::Forged));
    }

    #[test]
    fn non_canonical_chains_rejected() {
        let (p, o, s) = setup();
        let good = Capability::mint(p, o, Rights::ALL, &s).to_bytes();
        let bad_chains: [[u8; 8]; 5] = [
            [0xff, 0x0f, 0x0f, 0x07, 0x07, 0x07, 0x07, 0x07], // repeat then step
            [0x0f, 0x1f, 0x1f, 0x1f, 0x1f, 0x1f, 0x1f, 0x1f], // grows
            [0x0f, 0xf0, 0xf0, 0xf0, 0xf0, 0xf0, 0xf0, 0xf0], // not a subset
            [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00], // late step
            [0x03, 0x01, 0x03, 0x01, 0x01, 0x01, 0x01, 0x01], // grows back
        ];
        for chain in bad_chains {
            let mut b = good;
            b[24..32].copy_from_slice(&chain);
            assert_eq!(
                Capability::from_bytes(&b),
                Err(CapError::NonCanonical),
                "{chain:x?}"
            );
        }
        let ok_chains: [[u8; 8]; 2] = [
            [0xff, 0x0f, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07],
            [0xff, 0x7f, 0x3f, 0x1f, 0x0f, 0x07, 0x03, 0x01],
        ];
        for chain in ok_chains {
            let mut b = good;
            b[24..32].copy_from_slice(&chain);
            assert!(Capability::from_bytes(&b).is_ok(), "{chain:x?}");
        }
    }

    #[test]
    fn wrong_length_rejected() {
        for len in [0, 1, 47, 49, 96] {
            assert_eq!(
                Capability::from_bytes(&vec![0; len]),
                Err(CapError::WrongLength { len })
            );
        }
    }

    #[test]
    fn text_round_trip_and_errors() {
        let (p, o, s) = setup();
        let cap = Capability::mint(p, o, Rights::ALL, &s)
            .restrict(Rights::READ | Rights::WRITE)
            .unwrap();
        let text = cap.to_string();
        assert!(text.starts_with("cap1:"));
        assert_eq!(text.len(), 5 + 96);
        assert_eq!(text[5..], hex::encode(cap.to_bytes()));
        assert_eq!(text.parse::<Capability>(), Ok(cap));
        assert_eq!(
            text.to_uppercase().replace("CAP1:", "cap1:").parse(),
            Ok(cap)
        );

        assert_eq!(
            text[5..].parse::<Capability>(),
            Err(CapError::MissingPrefix)
        );
        assert_eq!(
            text.replace("cap1:", "cap2:").parse::<Capability>(),
            Err(CapError::MissingPrefix)
        );
        assert_eq!(
            text[..100].parse::<Capability>(),
            Err(CapError::TextLength { len: 95 })
        );
        assert_eq!(
            format!("{text}0").parse::<Capability>(),
            Err(CapError::TextLength { len: 97 })
        );
        let bad_hex = format!("cap1:{}", "g".repeat(96));
        assert_eq!(bad_hex.parse::<Capability>(), Err(CapError::BadHex));
        let non_ascii = format!("cap1:{}", "é".repeat(48));
        assert_eq!(non_ascii.parse::<Capability>(), Err(CapError::BadHex));
        let mut b = cap.to_bytes();
        b[24..32].copy_from_slice(&[0x0f, 0x1f, 0x1f, 0x1f, 0x1f, 0x1f, 0x1f, 0x1f]);
        let nc = format!("cap1:{}", hex::encode(b));
        assert_eq!(nc.parse::<Capability>(), Err(CapError::NonCanonical));
    }

    #[test]
    fn debug_hides_check() {
        let (p, o, s) = setup();
        let cap = Capability::mint(p, o, Rights::READ, &s);
        let dbg = format!("{cap:?}");
        let check_hex = hex::encode(&cap.to_bytes()[32..]);
        assert!(!dbg.contains(&check_hex), "{dbg}");
        assert!(dbg.contains("r-------"), "{dbg}");
    }

    #[test]
    fn error_messages_are_one_line() {
        let errs = [
            CapError::WrongLength { len: 3 },
            CapError::NonCanonical,
            CapError::Forged,
            CapError::InsufficientRights {
                have: Rights::READ,
                need: Rights::ALL,
            },
            CapError::ChainFull,
            CapError::MissingPrefix,
            CapError::TextLength { len: 2 },
            CapError::BadHex,
            CapError::PortLength { len: 1 },
            CapError::BadRights,
            CapError::BadObjectId,
        ];
        for e in errs {
            let m = e.to_string();
            assert!(!m.is_empty() && !m.contains('\n'), "{m:?}");
        }
        assert_eq!(
            CapError::Forged.to_string(),
            "capability check field does not match: forged, corrupted or revoked"
        );
    }
}
