//! The key core's codec and decisions (moved from `shoal_groupsvc::keys`,
//! with the late-rekey and catch-up cases added).

use super::*;
use proptest::prelude::*;

fn members() -> impl Strategy<Value = Vec<u64>> {
    proptest::collection::btree_set(any::<u64>(), 0..20).prop_map(|s| s.into_iter().collect())
}

fn port(open: bool) -> PutPort {
    let mut bytes = [0x42u8; 16];
    bytes[0] = if open { 1 } else { 2 };
    PutPort::from_bytes(bytes)
}

fn keys(epoch: u32) -> Keys {
    Keys {
        master: [9; 32],
        epoch,
        key: [epoch as u8; 32],
        members: vec![1],
    }
}

proptest! {
    #[test]
    fn requests_and_replies_decode_to_what_was_encoded(
        epoch in any::<u32>(), key in any::<[u8; 32]>(), mac in any::<[u8; 32]>(),
        master in any::<[u8; 32]>(), members in members(), text in ".{0,40}",
    ) {
        for r in [KeyRequest::Admit, KeyRequest::Rekey { epoch, key, members: members.clone(), mac }] {
            prop_assert_eq!(decode_request(&encode_request(&r)).unwrap(), r);
        }
        let keys = Keys { master, epoch, key, members };
        for r in [KeyReply::Admitted(keys), KeyReply::Taken, KeyReply::Refused(text)] {
            prop_assert_eq!(decode_reply(&encode_reply(&r)).unwrap(), r);
        }
    }

    #[test]
    fn no_byte_string_panics_the_decoders(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode_request(&bytes);
        let _ = decode_reply(&bytes);
    }
}

fn rekey(epoch: u32, master: &[u8; 32]) -> Vec<u8> {
    encode_request(&KeyRequest::rekey(&Keys {
        master: *master,
        epoch,
        key: [epoch as u8; 32],
        members: vec![1, 2],
    }))
}

#[test]
fn a_member_takes_a_new_key_only_under_the_master_and_from_its_uid_if_owned() {
    let owned = port(false);
    let keys = keys(7);
    let mut core = KeyCore::new(keys.clone());
    let mut took = Vec::new();
    // Another uid is refused, whatever it asks.
    for r in [encode_request(&KeyRequest::Admit), rekey(1, &keys.master)] {
        let (reply, take) = core.answer(&owned, 1000, 1001, &r);
        assert!(matches!(reply, KeyReply::Refused(_)), "{reply:?}");
        assert_eq!(take, None);
    }
    // The same uid is admitted, and a rekey under the master is taken.
    let admit = encode_request(&KeyRequest::Admit);
    let (reply, _) = core.answer(&owned, 1000, 1000, &admit);
    assert_eq!(reply, KeyReply::Admitted(keys.clone()));
    let (reply, take) = core.answer(&owned, 1000, 1000, &rekey(1, &keys.master));
    assert_eq!(reply, KeyReply::Taken);
    took.extend(take);
    // Not under another master; not the current epoch again.
    let (reply, take) = core.answer(&owned, 1000, 1000, &rekey(2, &[0; 32]));
    assert!(matches!(reply, KeyReply::Refused(_)));
    took.extend(take);
    let (_, take) = core.answer(&owned, 1000, 1000, &rekey(1, &keys.master));
    took.extend(take);
    assert_eq!(took, vec![(1, [1; 32])]);
    assert_eq!(
        (
            core.keys().epoch,
            core.keys().members.clone(),
            core.taken,
            core.refused
        ),
        (1, vec![1, 2], 1, 3)
    );
    // An open group admits any uid.
    let open = port(true);
    assert!(admits(&open, 1000, 0) && admits(&open, 0, 1001) && !admits(&owned, 0, 1000));
    // Garbage is refused and counted.
    let (reply, _) = core.answer(&open, 1000, 1000, &[9, 9]);
    assert!(matches!(reply, KeyReply::Refused(_)));
    assert_eq!(core.refused, 4);
}

#[test]
fn a_late_rekey_for_an_epoch_held_before_takes_nothing() {
    // A push of epoch 1 delayed past its deadline arrives after the push
    // of epoch 2: the member stays in epoch 2, with the others.
    let group = port(false);
    let master = keys(7).master;
    let mut core = KeyCore::new(keys(7));
    let (_, take) = core.answer(&group, 5, 5, &rekey(1, &master));
    assert_eq!(take, Some((1, [1; 32])));
    let (_, take) = core.answer(&group, 5, 5, &rekey(2, &master));
    assert_eq!(take, Some((2, [2; 32])));
    for late in [1, 7] {
        let (reply, take) = core.answer(&group, 5, 5, &rekey(late, &master));
        assert_eq!((reply, take), (KeyReply::Taken, None), "epoch {late}");
    }
    assert_eq!(core.keys().epoch, 2);
}

#[test]
fn the_sequencer_rekeys_on_a_change_of_members_and_on_the_timer() {
    let mut core = KeyCore::new(keys(7));
    let t0 = Time(1_000_000);
    let view = |incarnation, entry| Membership { incarnation, entry };
    assert!(
        core.rekey_due(t0, view(Incarnation(1), GroupSeq(4))),
        "never drew one"
    );
    let mut draws = [7u32, 0, 8].into_iter();
    let next = core.next(vec![1], || draws.next().unwrap(), [8; 32]);
    assert_eq!(next.epoch, 8, "neither the current epoch nor 0");
    core.drawn(t0, view(Incarnation(1), GroupSeq(4)), next);
    let half = t0 + REKEY_EVERY / 2;
    assert!(!core.rekey_due(half, view(Incarnation(1), GroupSeq(4))));
    assert!(
        core.rekey_due(half, view(Incarnation(1), GroupSeq(6))),
        "a joiner, or one that came and went"
    );
    assert!(
        core.rekey_due(half, view(Incarnation(2), GroupSeq(4))),
        "a new incarnation"
    );
    assert!(
        core.rekey_due(t0 + REKEY_EVERY, view(Incarnation(1), GroupSeq(4))),
        "the timer"
    );
}

#[test]
fn a_member_behind_asks_at_most_every_interval_and_takes_only_what_it_wanted() {
    let mut core = KeyCore::new(keys(7));
    let t0 = Time(5_000_000);
    assert!(core.catch_up_due(t0));
    assert!(!core.catch_up_due(t0 + CATCH_UP_EVERY / 2));
    assert!(core.catch_up_due(t0 + CATCH_UP_EVERY));
    let mut other = keys(9);
    assert_eq!(core.caught(8, true, &other), None, "not the epoch wanted");
    other.master = [1; 32];
    assert_eq!(core.caught(9, true, &other), None, "another group's");
    assert_eq!(
        core.caught(9, false, &keys(9)),
        Some(Catch::Extra(9, [9; 32]))
    );
    assert_eq!(core.keys().epoch, 7, "another side's epoch is not its own");
    assert_eq!(core.caught(9, true, &keys(9)), Some(Catch::Own(9, [9; 32])));
    assert_eq!(core.keys().epoch, 9);
}
