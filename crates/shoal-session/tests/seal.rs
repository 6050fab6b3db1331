//! Sealed datagrams, the replay window and key derivation.

use std::collections::BTreeSet;

use proptest::prelude::*;
use shoal_session::datagram::{ENDPOINT_HEAD, GROUP_HEAD, NODE_HEAD};
use shoal_session::kdf::{SessionSecrets, channel_key, member_key, server_secret};
use shoal_session::window::{COUNTER_LIMIT, WINDOW};
use shoal_session::{Algorithm, Header, Key, ReplayWindow, SessionError, TAG_LEN, open, seal};

fn headers() -> impl Strategy<Value = Header> {
    prop_oneof![
        (any::<u32>(), 0..COUNTER_LIMIT)
            .prop_map(|(receiver, counter)| Header::Node { receiver, counter }),
        (
            any::<bool>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            0..COUNTER_LIMIT
        )
            .prop_map(|(to_client, receiver, uid, sender, counter)| {
                Header::Endpoint {
                    to_client,
                    receiver,
                    uid,
                    sender,
                    counter,
                }
            }),
        (
            any::<[u8; 8]>(),
            any::<u32>(),
            any::<u64>(),
            0..COUNTER_LIMIT
        )
            .prop_map(|(group, epoch, member, counter)| Header::Group {
                group,
                epoch,
                member,
                counter,
            }),
    ]
}

fn algorithms() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::Aes256Gcm),
        Just(Algorithm::ChaCha20Poly1305)
    ]
}

proptest! {
    #[test]
    fn a_sealed_datagram_opens_to_its_header_and_pieces(
        alg in algorithms(),
        key in any::<[u8; 32]>(),
        header in headers(),
        pieces in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..4),
    ) {
        let key = Key::new(alg, &key);
        let refs: Vec<&[u8]> = pieces.iter().map(|p| p.as_slice()).collect();
        let mut out = Vec::new();
        seal(&key, &header, &refs, &mut out);
        let joined: Vec<u8> = pieces.concat();
        prop_assert_eq!(out.len(), header.len() + joined.len() + TAG_LEN);
        if !joined.is_empty() {
            // The plaintext does not appear in clear.
            prop_assert!(out[header.len()..out.len() - TAG_LEN] != joined[..]);
        }
        let (h, plain) = open(&key, &mut out).unwrap();
        prop_assert_eq!(h, header);
        prop_assert_eq!(&plain[..], &joined[..]);
    }

    #[test]
    fn any_flipped_bit_fails_to_open(
        alg in algorithms(),
        header in headers(),
        body in proptest::collection::vec(any::<u8>(), 0..200),
        at in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let key = Key::new(alg, &[9; 32]);
        let mut out = Vec::new();
        seal(&key, &header, &[&body], &mut out);
        let i = at.index(out.len());
        out[i] ^= 1 << bit;
        prop_assert!(open(&key, &mut out).is_err());
    }

    #[test]
    fn the_window_accepts_each_counter_once_and_nothing_below_it(
        counters in proptest::collection::vec(
            prop_oneof![0u64..10_000, 0u64..200, COUNTER_LIMIT - 5..COUNTER_LIMIT + 5],
            1..400,
        ),
    ) {
        let mut window = ReplayWindow::new();
        let mut seen = BTreeSet::new();
        let mut highest: Option<u64> = None;
        for c in counters {
            let fresh = !seen.contains(&c);
            let recent = highest.is_none_or(|h| c > h || h - c < WINDOW);
            let expected = c < COUNTER_LIMIT && fresh && recent;
            prop_assert_eq!(window.check(c), expected);
            prop_assert_eq!(window.accept(c), expected, "counter {}", c);
            if expected {
                seen.insert(c);
                highest = highest.max(Some(c));
            }
            prop_assert_eq!(window.highest(), highest);
        }
    }

    #[test]
    fn derived_keys_differ_for_every_differing_input(
        root in any::<[u8; 32]>(),
        a in (any::<u64>(), any::<[u8; 16]>(), any::<u64>(), any::<u64>(), any::<u32>(), any::<u64>()),
        b in (any::<u64>(), any::<[u8; 16]>(), any::<u64>(), any::<u64>(), any::<u32>(), any::<u64>()),
    ) {
        let ka = channel_key(&server_secret(&root, a.0, &a.1, a.2), a.3, a.4, a.5);
        let kb = channel_key(&server_secret(&root, b.0, &b.1, b.2), b.3, b.4, b.5);
        prop_assert_eq!(ka == kb, a == b);
        prop_assert_eq!(member_key(&root, a.0) == member_key(&root, b.0), a.0 == b.0);
    }
}

#[test]
fn the_window_slides_and_forgets() {
    let mut w = ReplayWindow::new();
    assert!(w.accept(0));
    assert!(!w.accept(0));
    assert!(w.accept(WINDOW));
    assert!(!w.check(0), "0 is now at the window's edge");
    assert!(w.accept(1));
    assert!(w.accept(10 * WINDOW));
    assert!(!w.accept(WINDOW), "slid far past");
    assert!(w.accept(10 * WINDOW - 1));
    assert!(!w.accept(COUNTER_LIMIT));
}

#[test]
fn directions_and_keys_do_not_mix() {
    let key = Key::new(Algorithm::Aes256Gcm, &[1; 32]);
    let other = Key::new(Algorithm::Aes256Gcm, &[2; 32]);
    let chacha = Key::new(Algorithm::ChaCha20Poly1305, &[1; 32]);
    let mut out = Vec::new();
    let to_server = Header::Endpoint {
        to_client: false,
        receiver: 1,
        uid: 1000,
        sender: 5,
        counter: 0,
    };
    seal(&key, &to_server, &[b"request"], &mut out);
    assert_eq!(out[3], 5);
    assert_eq!(
        open(&other, &mut out.clone()).unwrap_err(),
        SessionError::BadTag
    );
    assert_eq!(
        open(&chacha, &mut out.clone()).unwrap_err(),
        SessionError::BadTag
    );
    // The same counter the other way is another nonce: a reflected
    // datagram with its class byte changed does not open.
    out[3] = 6;
    assert_eq!(open(&key, &mut out).unwrap_err(), SessionError::BadTag);
    assert_eq!(
        [NODE_HEAD, ENDPOINT_HEAD, GROUP_HEAD],
        [16, 28, 32],
        "the layouts docs/security.md gives"
    );
}

#[test]
fn session_secrets_are_distinct() {
    let s = SessionSecrets::from_split(&[1; 32], &[2; 32]);
    assert_ne!(s.i2r, s.r2i);
    assert_ne!(s.i2r, s.endpoint_root);
    let swapped = SessionSecrets::from_split(&[2; 32], &[1; 32]);
    assert_ne!(s.endpoint_root, swapped.endpoint_root);
}

#[test]
fn truncated_and_foreign_datagrams_are_refused() {
    assert_eq!(Header::peek(b"SH").unwrap_err(), SessionError::Truncated);
    assert!(Header::peek(b"XX\x02\x04").is_err());
    assert!(Header::peek(b"SH\x01\x04").is_err(), "version 1");
    let mut short = b"SH\x02\x04".to_vec();
    short.extend_from_slice(&[0; 12 + TAG_LEN - 1]);
    assert_eq!(Header::peek(&short).unwrap_err(), SessionError::Truncated);
}
