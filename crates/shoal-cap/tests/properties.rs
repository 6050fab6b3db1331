//! Property tests of the capability scheme.
//!
//! The claims checked here are the ones the rest of shoal relies on:
//! restriction never amplifies, any single-bit change to a capability is
//! caught, the text form round-trips, decoders never panic on any input,
//! and a capability is only good under the secret it was minted with.

use proptest::prelude::*;
use shoal_cap::{CapError, Capability, GetPort, ObjectId, ObjectSecret, PutPort, Rights};

/// A restriction request: half the time an arbitrary set, half the time
/// "drop one right", so that long chains (up to full) are common.
fn arb_request() -> impl Strategy<Value = u8> {
    prop_oneof![any::<u8>(), (0..8u8).prop_map(|k| !(1u8 << k))]
}

/// A capability minted with arbitrary fields, then restricted by a random
/// sequence of requests, together with the secret it verifies under.
fn arb_cap() -> impl Strategy<Value = (Capability, ObjectSecret)> {
    (
        any::<[u8; 16]>(),
        any::<u64>(),
        any::<u8>(),
        any::<[u8; 32]>(),
        proptest::collection::vec(arb_request(), 0..10),
    )
        .prop_map(|(port, object, rights, secret, requests)| {
            let secret = ObjectSecret::from_bytes(secret);
            let mut cap = Capability::mint(
                PutPort::from_bytes(port),
                ObjectId::new(object),
                Rights::from_bits(rights),
                &secret,
            );
            for r in requests {
                if let Ok(next) = cap.restrict(Rights::from_bits(r)) {
                    cap = next;
                }
            }
            (cap, secret)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// (a) Verified rights only ever shrink, and equal the minted rights
    /// intersected with every request that was applied.
    #[test]
    fn restriction_never_amplifies(
        port in any::<[u8; 16]>(),
        object in any::<u64>(),
        minted in any::<u8>(),
        secret in any::<[u8; 32]>(),
        requests in proptest::collection::vec(arb_request(), 0..16),
    ) {
        let secret = ObjectSecret::from_bytes(secret);
        let minted = Rights::from_bits(minted);
        let mut cap = Capability::mint(PutPort::from_bytes(port), ObjectId::new(object), minted, &secret);
        let mut expected = minted;
        let mut history = vec![cap.verify(&secret).unwrap()];
        for r in requests {
            let r = Rights::from_bits(r);
            match cap.restrict(r) {
                Ok(next) => {
                    expected = expected.intersect(r);
                    cap = next;
                }
                Err(CapError::ChainFull) => {
                    // Only a real restriction of a full chain may fail.
                    prop_assert_eq!(cap.steps(), Capability::MAX_STEPS);
                    prop_assert_ne!(cap.rights().intersect(r), cap.rights());
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
            let got = cap.verify(&secret).unwrap();
            prop_assert_eq!(got, expected);
            for earlier in &history {
                prop_assert!(got.is_subset_of(*earlier));
            }
            history.push(got);
            // Round trip through the binary form keeps it valid.
            let rt = Capability::from_bytes(&cap.to_bytes()).unwrap();
            prop_assert_eq!(rt.verify(&secret), Ok(expected));
        }
    }

    /// (b) Flipping any one of the 384 bits never yields a capability that
    /// verifies.
    #[test]
    fn every_single_bit_flip_is_caught((cap, secret) in arb_cap()) {
        prop_assert!(cap.verify(&secret).is_ok());
        let good = cap.to_bytes();
        for bit in 0..Capability::LEN * 8 {
            let mut b = good;
            b[bit / 8] ^= 1 << (bit % 8);
            if let Ok(flipped) = Capability::from_bytes(&b) {
                prop_assert!(
                    flipped.verify(&secret).is_err(),
                    "bit {} flip of {} still verifies", bit, cap
                );
            }
        }
    }

    /// (c) Text and binary forms round-trip.
    #[test]
    fn text_form_round_trips((cap, _secret) in arb_cap()) {
        let text = cap.to_string();
        prop_assert!(text.starts_with("cap1:"));
        prop_assert_eq!(text.len(), 5 + 2 * Capability::LEN);
        prop_assert_eq!(text.parse::<Capability>(), Ok(cap));
        prop_assert_eq!(Capability::from_bytes(&cap.to_bytes()), Ok(cap));
        let port = cap.port();
        prop_assert_eq!(port.to_string().parse::<PutPort>(), Ok(port));
        prop_assert_eq!(cap.rights().to_string().parse::<Rights>(), Ok(cap.rights()));
        prop_assert_eq!(cap.object().to_string().parse::<ObjectId>(), Ok(cap.object()));
    }

    /// (d) The binary decoder never panics, and what it accepts re-encodes
    /// to the same bytes.
    #[test]
    fn from_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
        match Capability::from_bytes(&bytes) {
            Ok(cap) => prop_assert_eq!(&cap.to_bytes()[..], &bytes[..]),
            Err(CapError::WrongLength { len }) => {
                prop_assert_eq!(len, bytes.len());
                prop_assert_ne!(len, Capability::LEN);
            }
            Err(e) => prop_assert_eq!(e, CapError::NonCanonical),
        }
    }

    /// (d') The text parsers never panic on any string.
    #[test]
    fn text_parsers_never_panic(s in ".{0,120}", hexish in "cap1:[0-9a-fA-Fg]{0,100}") {
        let _ = s.parse::<Capability>();
        let _ = hexish.parse::<Capability>();
        let _ = s.parse::<Rights>();
        let _ = s.parse::<PutPort>();
        let _ = s.parse::<GetPort>();
        let _ = s.parse::<ObjectId>();
    }

    /// (e) A capability does not verify under any other secret.
    #[test]
    fn other_secret_fails((cap, secret) in arb_cap(), other in any::<[u8; 32]>()) {
        let other = ObjectSecret::from_bytes(other);
        prop_assume!(other != secret);
        prop_assert_eq!(cap.verify(&other), Err(CapError::Forged));
    }
}
