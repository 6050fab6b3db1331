//! Curve25519 for the handshake, as snow's `Dh`, faster than snow's own.
//!
//! snow computes X25519 with curve25519-dalek's Montgomery ladder, which
//! has no vector code.  Here the peer's point goes to the birationally
//! equivalent Edwards curve, is multiplied there by the same clamped
//! scalar (curve25519-dalek's variable-base multiplication, which uses
//! AVX2 where the CPU has it, constant-time either way), and comes back as
//! a Montgomery u-coordinate: the same result as the ladder, in about
//! two thirds of the time.  Either sign of the Edwards point will do: the
//! u-coordinate of k·P and of k·(−P) is the same.  The one difference: a
//! u that is not on the curve (it is on the quadratic twist, which no
//! honest key is) fails the exchange, where the ladder would compute a
//! value.
//!
//! The node's own static public key is known (it is in its certificate):
//! set with that private key, the `Dh` takes the public key as it is
//! instead of deriving it again at every handshake.  A generated
//! (ephemeral) key is never compared with it.

use curve25519_dalek::{EdwardsPoint, MontgomeryPoint};
use snow::types::{Dh, Random};

/// X25519 on the Edwards form (see the module's comment).
#[derive(Default)]
pub(crate) struct Dh25519 {
    private: [u8; 32],
    public: [u8; 32],
    /// The node's static key pair, whose public half need not be derived.
    known: Option<([u8; 32], [u8; 32])>,
}

impl Dh25519 {
    /// A `Dh` that knows the node's static key pair.
    pub(crate) fn knowing(private: [u8; 32], public: [u8; 32]) -> Self {
        Self {
            private: [0; 32],
            public: [0; 32],
            known: Some((private, public)),
        }
    }

    fn derive_public(&mut self) {
        self.public = EdwardsPoint::mul_base_clamped(self.private)
            .to_montgomery()
            .to_bytes();
    }
}

/// X25519(k, u), or `None` if u is not on the curve.
pub(crate) fn x25519(k: [u8; 32], u: [u8; 32]) -> Option<[u8; 32]> {
    let point = MontgomeryPoint(u).to_edwards(0)?;
    Some(point.mul_clamped(k).to_montgomery().to_bytes())
}

impl Dh for Dh25519 {
    fn name(&self) -> &'static str {
        "25519"
    }

    fn pub_len(&self) -> usize {
        32
    }

    fn priv_len(&self) -> usize {
        32
    }

    fn set(&mut self, privkey: &[u8]) {
        let mut private = [0u8; 32];
        let n = privkey.len().min(32);
        private[..n].copy_from_slice(&privkey[..n]);
        self.private = private;
        // snow sets only the static key (an ephemeral one is generated):
        // the comparison is of that key with itself.
        match self.known {
            Some((known, public)) if known == private => self.public = public,
            _ => self.derive_public(),
        }
    }

    fn generate(&mut self, rng: &mut dyn Random) -> Result<(), snow::Error> {
        rng.try_fill_bytes(&mut self.private)?;
        self.derive_public();
        Ok(())
    }

    fn pubkey(&self) -> &[u8] {
        &self.public
    }

    fn privkey(&self) -> &[u8] {
        &self.private
    }

    fn dh(&self, pubkey: &[u8], out: &mut [u8]) -> Result<(), snow::Error> {
        let u: [u8; 32] = pubkey
            .get(..32)
            .and_then(|u| u.try_into().ok())
            .ok_or(snow::Error::Dh)?;
        let shared = x25519(self.private, u).ok_or(snow::Error::Dh)?;
        out.get_mut(..32)
            .ok_or(snow::Error::Dh)?
            .copy_from_slice(&shared);
        Ok(())
    }
}

impl Drop for Dh25519 {
    fn drop(&mut self) {
        // The key is gone once the handshake is (best effort: copies the
        // compiler made are not reached).
        self.private = [0; 32];
        if let Some((known, _)) = &mut self.known {
            *known = [0; 32];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use curve25519_dalek::constants::EIGHT_TORSION;
    use proptest::prelude::*;

    fn ladder(k: [u8; 32], u: [u8; 32]) -> [u8; 32] {
        MontgomeryPoint(u).mul_clamped(k).to_bytes()
    }

    #[test]
    fn rfc7748_vectors() {
        // RFC 7748, section 5.2: the first vector's u is on the curve; the
        // second's is on the twist, which this X25519 refuses (the ladder
        // computes the RFC's value).
        let hex = |s: &str| -> [u8; 32] {
            let v: Vec<u8> = (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                .collect();
            v.try_into().unwrap()
        };
        for (k, u, out) in [
            (
                "a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4",
                "e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c",
                "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552",
            ),
            (
                "4b66e9d4d1b4673c5ad22691957d6af5c11b6421e0ea01d42ca4169e7918ba0d",
                "e5210f12786811d3f4b7959d0538ae2c31dbe7106fc03c3efc4cd549c715a493",
                "95cbde9476e8907d7aade45cb4b873f88b595a68799fa152e6f8f7647aac7957",
            ),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            assert_eq!(MontgomeryPoint(hex(v.1)).to_edwards(0).is_some(), i == 0);
            v
        }) {
            assert_eq!(ladder(hex(k), hex(u)), hex(out));
            let on_curve = MontgomeryPoint(hex(u)).to_edwards(0).is_some();
            let want = on_curve.then(|| hex(out));
            assert_eq!(x25519(hex(k), hex(u)), want);
        }
    }

    #[test]
    fn points_off_the_curve_fail_the_exchange_and_others_agree_with_the_ladder() {
        // About half of all u are on the quadratic twist, not the curve.
        let mut twist = 0;
        for small in 0u8..64 {
            let mut u = [0u8; 32];
            u[0] = small;
            match x25519([7; 32], u) {
                Some(out) => assert_eq!(out, ladder([7; 32], u), "u = {small}"),
                None => {
                    twist += 1;
                    let mut dh = Dh25519::default();
                    dh.set(&[7; 32]);
                    assert!(dh.dh(&u, &mut [0u8; 32]).is_err());
                }
            }
        }
        assert!((16..48).contains(&twist), "{twist} of 64 on the twist");
    }

    #[test]
    fn the_known_public_key_is_used_only_for_its_own_private_key() {
        let private = [9u8; 32];
        let public = ladder(private, curve25519_dalek::constants::X25519_BASEPOINT.0);
        let mut dh = Dh25519::knowing(private, public);
        dh.set(&private);
        assert_eq!(dh.pubkey(), public);
        dh.set(&[10; 32]);
        assert_eq!(
            dh.pubkey(),
            ladder([10; 32], curve25519_dalek::constants::X25519_BASEPOINT.0)
        );
    }

    proptest! {
        #[test]
        fn agrees_with_the_ladder(k: [u8; 32], peer: [u8; 32], torsion in 0usize..8) {
            // The peer's key, with any small-order component added.
            let point = EdwardsPoint::mul_base_clamped(peer) + EIGHT_TORSION[torsion];
            let u = point.to_montgomery().to_bytes();
            prop_assert_eq!(x25519(k, u), Some(ladder(k, u)));
            // And through snow's interface, both ways round.
            let (mut a, mut b) = (Dh25519::default(), Dh25519::default());
            a.set(&k);
            b.set(&peer);
            let (mut ab, mut ba) = ([0u8; 32], [0u8; 32]);
            a.dh(b.pubkey(), &mut ab).unwrap();
            b.dh(a.pubkey(), &mut ba).unwrap();
            prop_assert_eq!(ab, ba);
            prop_assert_eq!(ab, ladder(k, ladder(peer, curve25519_dalek::constants::X25519_BASEPOINT.0)));
        }
    }
}
