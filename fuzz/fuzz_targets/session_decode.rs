//! The trust core's decoders never panic on any input: certificates,
//! revocation lists, service maps, hellos, sealed headers, the three handshake messages
//! fed to a responder and to an initiator waiting for them, and a session
//! table fed the input as a datagram.  An
//! input sealed under a key opens to itself, and with any byte changed
//! does not open.  A certificate and a revocation list built from the
//! input's bytes verify back to the same values.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_session::handshake::{decode_hello, handshake_receiver, static_public};
use shoal_session::{
    AdminKey, Algorithm, ClusterId, Header, Initiator, Key, NodeCert, NodeIdentity, Responder,
    RevocationList, ServiceEntry, ServiceMap, Trust, open, seal,
};

const NOW: u64 = 1_800_000_000;

fuzz_target!(|data: &[u8]| {
    let admin = AdminKey::from_seed([1; 32]);
    let cluster = ClusterId([7; 16]);
    let trust = Trust {
        cluster,
        admin: admin.public(),
        revoked: RevocationList::default(),
    };
    let _ = NodeCert::verify(data, &admin.public());
    let _ = RevocationList::verify(data, cluster, &admin.public());
    let _ = ServiceMap::verify(data, cluster, &admin.public());
    let _ = decode_hello(data);
    let _ = handshake_receiver(data);
    let _ = Header::peek(data);
    // A start grant: any bytes are refused or open only under their root.
    let root = shoal_session::Root {
        index: 3,
        secret: [9; 32],
        algorithm: Algorithm::Aes256Gcm,
        expires: shoal_proto::Time(u64::MAX),
    };
    let _ = shoal_session::grant::index(data);
    assert!(shoal_session::grant::open(&root, data).is_err() || data.len() >= shoal_session::grant::OVERHEAD);
    let sealed = shoal_session::grant::seal(&root, [1; 12], data);
    assert_eq!(shoal_session::grant::open(&root, &sealed).ok().as_deref(), (sealed.len() <= shoal_session::grant::MAX_SEALED).then_some(data));

    // The handshake's three messages.
    let private = [5; 32];
    let cert = NodeCert {
        cluster,
        serial: 1,
        not_before: 0,
        not_after: u64::MAX,
        static_key: static_public(&private),
        name: "n1".into(),
    }
    .sign(&admin)
    .unwrap();
    let me = NodeIdentity::new(private, cert, &trust, NOW).unwrap();
    let mut out = Vec::new();
    let _ = Responder::answer(data, &me, &trust, 1, [0; 32], true, &mut out);
    let init = Initiator::start(&me, &trust, 1, [0; 32], &mut out).unwrap();
    let m1 = out.clone();
    let _ = init.finish(data, &me, &trust, NOW, true, &mut out);
    if let Ok(resp) = Responder::answer(&m1, &me, &trust, 2, [0; 32], true, &mut out) {
        let _ = resp.finish(data, &trust, NOW);
    }

    // A session table takes any datagram from anyone without panicking.
    let mut table = shoal_session::Sessions::new(
        shoal_session::table::Config::default(),
        me.clone(),
        trust.clone(),
        true,
        [1; 32],
    );
    let from = std::net::SocketAddr::from(([10, 0, 0, 1], 7700));
    let mut outputs = Vec::new();
    table.send(shoal_proto::Time(0), from, b"x", &mut outputs);
    let _ = table.handle(shoal_proto::Time(1), NOW, from, &mut data.to_vec(), &mut outputs);
    table.poll(shoal_proto::Time(20_000_000), &mut outputs);

    // Sealing round-trips; any change fails.
    for alg in [Algorithm::Aes256Gcm, Algorithm::ChaCha20Poly1305] {
        let key = Key::new(alg, &[3; 32]);
        let mut copy = data.to_vec();
        let _ = open(&key, &mut copy);
        let header = Header::Endpoint {
            to_client: data.first().is_some_and(|b| b & 1 == 1),
            receiver: 9,
            uid: 1000,
            sender: 42,
            counter: data.len() as u64,
        };
        let mut sealed = Vec::new();
        seal(&key, &header, &[data], &mut sealed);
        let mut copy = sealed.clone();
        let (h, plain) = open(&key, &mut copy).expect("opens");
        assert_eq!(h, header);
        assert_eq!(plain, data);
        if !data.is_empty() {
            let i = data[0] as usize % sealed.len();
            sealed[i] ^= 0x80;
            assert!(open(&key, &mut sealed).is_err());
        }
    }

    // Built from the input, signed, verified back.
    if data.len() >= 24 {
        let serial = u64::from_le_bytes(data[..8].try_into().unwrap());
        let a = u64::from_le_bytes(data[8..16].try_into().unwrap());
        let b = u64::from_le_bytes(data[16..24].try_into().unwrap());
        let name: String = data[24..]
            .iter()
            .take(64)
            .map(|&c| b"abcdefghijklmnopqrstuvwxyz0123456789-"[c as usize % 37] as char)
            .collect();
        let cert = NodeCert {
            cluster,
            serial,
            not_before: a.min(b),
            not_after: a.max(b),
            static_key: [data[0]; 32],
            name,
        };
        if let Ok(bytes) = cert.sign(&admin) {
            assert_eq!(NodeCert::verify(&bytes, &admin.public()), Ok(cert));
        }
        let list = RevocationList {
            version: serial,
            issued: a,
            serials: data.chunks(8).map(|c| c.len() as u64 * c[0] as u64).collect(),
        };
        let bytes = list.sign(cluster, &admin).unwrap();
        let back = RevocationList::verify(&bytes, cluster, &admin.public()).unwrap();
        assert!(list.serials.iter().all(|&s| back.revokes(s)));
        assert_eq!(back.version, serial);
        // A service map of the input's names and node ids.
        let entries: Vec<ServiceEntry> = data[24..]
            .chunks(9)
            .map(|c| ServiceEntry {
                name: format!("service {}", c[0]),
                nodes: c.iter().map(|&b| b as u64).collect(),
            })
            .collect();
        let map = ServiceMap { version: serial, issued: a, entries };
        if let Ok(bytes) = map.sign(cluster, &admin) {
            let back = ServiceMap::verify(&bytes, cluster, &admin.public()).unwrap();
            for e in &map.entries {
                let servers = back.servers(&e.name).unwrap();
                assert!(e.nodes.iter().all(|n| servers.contains(n)));
            }
        }
    }
});
