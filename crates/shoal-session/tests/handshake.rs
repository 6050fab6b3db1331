//! Admission and the node handshake: two admitted nodes agree on keys;
//! every way of not being admitted fails, and so does any altered message.

use proptest::prelude::*;
use shoal_session::cert::MAX_REVOKED;
use shoal_session::handshake::{handshake_receiver, static_public};
use shoal_session::{
    AdminKey, Algorithm, ClusterId, Established, Header, Initiator, NodeCert, NodeIdentity,
    Responder, RevocationList, SessionError, Trust, open, seal,
};

const NOW: u64 = 1_800_000_000;
const CLUSTER: ClusterId = ClusterId([7; 16]);

fn admin() -> AdminKey {
    AdminKey::from_seed([1; 32])
}

fn trust(admin: &AdminKey) -> Trust {
    Trust {
        cluster: CLUSTER,
        admin: admin.public(),
        revoked: RevocationList::default(),
    }
}

fn cert_for(admin: &AdminKey, name: &str, serial: u64, private: &[u8; 32]) -> Vec<u8> {
    NodeCert {
        cluster: CLUSTER,
        serial,
        not_before: NOW - 10,
        not_after: NOW + 3600,
        static_key: static_public(private),
        name: name.into(),
    }
    .sign(admin)
    .unwrap()
}

fn node(admin: &AdminKey, name: &str, serial: u64) -> NodeIdentity {
    let private = [serial as u8 + 100; 32];
    NodeIdentity::new(
        private,
        cert_for(admin, name, serial, &private),
        &trust(admin),
        NOW,
    )
    .unwrap()
}

/// A whole handshake between `a` (initiator) and `b`, each with its own
/// trust; the sessions, or the first error.
fn shake(
    a: &NodeIdentity,
    ta: &Trust,
    b: &NodeIdentity,
    tb: &Trust,
    aes: (bool, bool),
) -> Result<(Established, Established), SessionError> {
    let (mut m1, mut m2, mut m3) = (Vec::new(), Vec::new(), Vec::new());
    let init = Initiator::start(a, ta, 11, [2; 32], &mut m1)?;
    let resp = Responder::answer(&m1, b, tb, 22, [3; 32], aes.1, &mut m2)?;
    assert_eq!(handshake_receiver(&m2)?, 11);
    let sa = init.finish(&m2, a, ta, NOW, aes.0, &mut m3)?;
    assert_eq!(handshake_receiver(&m3)?, 22);
    let sb = resp.finish(&m3, tb, NOW)?;
    Ok((sa, sb))
}

fn talks(from: &Established, to: &Established, text: &[u8]) -> bool {
    let mut out = Vec::new();
    let header = Header::Node {
        receiver: from.remote_index,
        counter: 5,
    };
    seal(&from.send, &header, &[text], &mut out);
    match open(&to.recv, &mut out) {
        Ok((h, plain)) => h == header && plain == text,
        Err(_) => false,
    }
}

#[test]
fn two_admitted_nodes_agree_on_keys_and_learn_each_other() {
    let admin = admin();
    let t = trust(&admin);
    let (a, b) = (node(&admin, "n1", 1), node(&admin, "n2", 2));
    let (sa, sb) = shake(&a, &t, &b, &t, (true, true)).unwrap();
    assert_eq!(sa.peer.name, "n2");
    assert_eq!(sb.peer.name, "n1");
    assert_eq!((sa.local_index, sa.remote_index), (11, 22));
    assert_eq!((sb.local_index, sb.remote_index), (22, 11));
    assert!(sa.initiator && !sb.initiator);
    assert_eq!(sa.endpoint_root, sb.endpoint_root);
    assert_eq!(sa.send.algorithm(), Algorithm::Aes256Gcm);
    assert!(talks(&sa, &sb, b"heartbeat"));
    assert!(talks(&sb, &sa, b"here"));
    // Each direction has its own key.
    assert!(!talks(&sa, &sa, b"to myself"));
}

#[test]
fn chacha_unless_both_have_aes() {
    let admin = admin();
    let t = trust(&admin);
    let (a, b) = (node(&admin, "n1", 1), node(&admin, "n2", 2));
    for aes in [(true, false), (false, true), (false, false)] {
        let (sa, sb) = shake(&a, &t, &b, &t, aes).unwrap();
        assert_eq!(sa.send.algorithm(), Algorithm::ChaCha20Poly1305);
        assert_eq!(sb.recv.algorithm(), Algorithm::ChaCha20Poly1305);
        assert!(talks(&sa, &sb, b"x"));
    }
}

#[test]
fn the_same_seeds_give_the_same_session_and_others_another() {
    let admin = admin();
    let t = trust(&admin);
    let (a, b) = (node(&admin, "n1", 1), node(&admin, "n2", 2));
    let (s1, _) = shake(&a, &t, &b, &t, (true, true)).unwrap();
    let (s2, _) = shake(&a, &t, &b, &t, (true, true)).unwrap();
    assert_eq!(s1.endpoint_root, s2.endpoint_root);
    let (mut m1, mut m2, mut m3) = (Vec::new(), Vec::new(), Vec::new());
    let init = Initiator::start(&a, &t, 11, [9; 32], &mut m1).unwrap();
    let resp = Responder::answer(&m1, &b, &t, 22, [3; 32], true, &mut m2).unwrap();
    let s3 = init.finish(&m2, &a, &t, NOW, true, &mut m3).unwrap();
    resp.finish(&m3, &t, NOW).unwrap();
    assert_ne!(s1.endpoint_root, s3.endpoint_root);
}

#[test]
fn nodes_not_admitted_are_refused() {
    let admin = admin();
    let t = trust(&admin);
    let good = node(&admin, "n1", 1);
    // Signed by another admin.
    let rogue_admin = AdminKey::from_seed([66; 32]);
    let rogue = node(&rogue_admin, "n9", 9);
    let rogue_trust = trust(&rogue_admin);
    assert_eq!(
        shake(&rogue, &rogue_trust, &good, &t, (true, true)).unwrap_err(),
        SessionError::BadSignature
    );
    assert_eq!(
        shake(&good, &t, &rogue, &rogue_trust, (true, true)).unwrap_err(),
        SessionError::BadSignature
    );
    // Another cluster, same admin.
    let private = [50; 32];
    let other = NodeCert {
        cluster: ClusterId([8; 16]),
        serial: 5,
        not_before: 0,
        not_after: u64::MAX,
        static_key: static_public(&private),
        name: "n5".into(),
    }
    .sign(&admin)
    .unwrap();
    assert_eq!(
        NodeIdentity::new(private, other, &t, NOW).unwrap_err(),
        SessionError::WrongCluster
    );
    // A certificate for another key.
    let stolen = cert_for(&admin, "n1", 1, &[101; 32]);
    assert_eq!(
        NodeIdentity::new([51; 32], stolen, &t, NOW).unwrap_err(),
        SessionError::KeyMismatch
    );
    // Expired, seen by a peer whose clock is later.
    let b = node(&admin, "n2", 2);
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    let init = Initiator::start(&good, &t, 1, [4; 32], &mut out.0).unwrap();
    let resp = Responder::answer(&out.0, &b, &t, 2, [5; 32], true, &mut out.1).unwrap();
    let _ = init
        .finish(&out.1, &good, &t, NOW, true, &mut out.2)
        .unwrap();
    assert_eq!(
        resp.finish(&out.2, &t, NOW + 7200).unwrap_err(),
        SessionError::Expired
    );
}

#[test]
fn a_revoked_node_is_refused_and_the_rest_are_not() {
    let admin = admin();
    let mut t = trust(&admin);
    let (a, b, c) = (
        node(&admin, "n1", 1),
        node(&admin, "n2", 2),
        node(&admin, "n3", 3),
    );
    let list = RevocationList {
        version: 1,
        issued: NOW,
        serials: vec![3],
    };
    let bytes = list.sign(CLUSTER, &admin).unwrap();
    let verified = RevocationList::verify(&bytes, CLUSTER, &admin.public()).unwrap();
    assert!(t.update(verified.clone()));
    assert!(!t.update(verified), "an equal version is not newer");
    assert_eq!(
        shake(&c, &trust(&admin), &a, &t, (true, true)).unwrap_err(),
        SessionError::Revoked(3)
    );
    assert!(shake(&a, &t, &b, &t, (true, true)).is_ok());
}

#[test]
fn revocation_lists_verify_only_as_signed() {
    let admin = admin();
    let list = RevocationList {
        version: 4,
        issued: NOW,
        serials: vec![9, 3, 3, 7],
    };
    let bytes = list.sign(CLUSTER, &admin).unwrap();
    let back = RevocationList::verify(&bytes, CLUSTER, &admin.public()).unwrap();
    assert_eq!(back.serials, vec![3, 7, 9]);
    assert!(back.revokes(7) && !back.revokes(8));
    assert_eq!(
        RevocationList::verify(&bytes, ClusterId([0; 16]), &admin.public()).unwrap_err(),
        SessionError::WrongCluster
    );
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 0x10;
        assert!(RevocationList::verify(&bad, CLUSTER, &admin.public()).is_err());
    }
    let too_many = RevocationList {
        version: 1,
        issued: 0,
        serials: (0..=MAX_REVOKED as u64).collect(),
    };
    assert!(too_many.sign(CLUSTER, &admin).is_err());
}

#[test]
fn an_altered_handshake_message_fails() {
    let admin = admin();
    let t = trust(&admin);
    let (a, b) = (node(&admin, "n1", 1), node(&admin, "n2", 2));
    let mut m1 = Vec::new();
    let mut m2 = Vec::new();
    let mut m3 = Vec::new();
    Initiator::start(&a, &t, 11, [2; 32], &mut m1).unwrap();
    Responder::answer(&m1, &b, &t, 22, [3; 32], true, &mut m2).unwrap();
    // Every bit of the response past its indexes.
    for i in 12..m2.len() {
        let mut bad = m2.clone();
        bad[i] ^= 1;
        let init = Initiator::start(&a, &t, 11, [2; 32], &mut m1).unwrap();
        assert!(init.finish(&bad, &a, &t, NOW, true, &mut m3).is_err());
    }
    // Every bit of the finish past its indexes.
    let init = Initiator::start(&a, &t, 11, [2; 32], &mut m1).unwrap();
    init.finish(&m2, &a, &t, NOW, true, &mut m3).unwrap();
    for i in 12..m3.len() {
        let mut bad = m3.clone();
        bad[i] ^= 1;
        let resp = Responder::answer(&m1, &b, &t, 22, [3; 32], true, &mut m2).unwrap();
        assert!(resp.finish(&bad, &t, NOW).is_err());
    }
    // A finish naming another handshake.
    let resp = Responder::answer(&m1, &b, &t, 22, [3; 32], true, &mut m2).unwrap();
    let mut wrong = m3.clone();
    wrong[8] ^= 1;
    assert_eq!(
        resp.finish(&wrong, &t, NOW).unwrap_err(),
        SessionError::UnknownIndex
    );
}

#[test]
fn certificates_verify_only_as_signed() {
    let admin = admin();
    let bytes = cert_for(&admin, "node-7", 7, &[3; 32]);
    let cert = NodeCert::verify(&bytes, &admin.public()).unwrap();
    assert_eq!(cert.name, "node-7");
    assert_eq!(cert.serial, 7);
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 0x40;
        assert!(NodeCert::verify(&bad, &admin.public()).is_err(), "byte {i}");
    }
    assert!(NodeCert::verify(&bytes[..bytes.len() - 1], &admin.public()).is_err());
    let mut long = bytes.clone();
    long.push(0);
    assert!(NodeCert::verify(&long, &admin.public()).is_err());
    for name in ["", "N1", "n 1", &"x".repeat(65)] {
        let c = NodeCert {
            cluster: CLUSTER,
            serial: 1,
            not_before: 0,
            not_after: 1,
            static_key: [0; 32],
            name: name.into(),
        };
        assert!(c.sign(&admin).is_err(), "{name:?}");
    }
}

proptest! {
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let admin = admin();
        let _ = NodeCert::verify(&bytes, &admin.public());
        let _ = RevocationList::verify(&bytes, CLUSTER, &admin.public());
        let _ = shoal_session::handshake::decode_hello(&bytes);
        let _ = handshake_receiver(&bytes);
        let _ = Header::peek(&bytes);
        let t = trust(&admin);
        let b = node(&admin, "n2", 2);
        let mut out = Vec::new();
        let _ = Responder::answer(&bytes, &b, &t, 1, [0; 32], true, &mut out);
        let init = Initiator::start(&b, &t, 1, [0; 32], &mut out).unwrap();
        let _ = init.finish(&bytes, &b, &t, NOW, true, &mut out);
    }
}
