//! Round trips for every packet kind, and the decoder's behaviour on
//! hostile input: wrong key, flipped bits, truncation, random bytes.

use std::net::SocketAddr;

use proptest::prelude::*;
use shoal_cap::PutPort;
use shoal_wire::*;

fn key() -> ClusterKey {
    ClusterKey::from_bytes([7u8; 32])
}

fn arb_addr() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, p)| SocketAddr::from((ip, p))),
        (any::<[u8; 16]>(), any::<u16>()).prop_map(|(ip, p)| SocketAddr::from((ip, p))),
    ]
}

fn arb_txn() -> impl Strategy<Value = TxnId> {
    (any::<u64>(), any::<u64>()).prop_map(|(c, s)| TxnId {
        client: ClientId(c),
        seq: Seq(s),
    })
}

fn arb_port() -> impl Strategy<Value = PutPort> {
    any::<[u8; 16]>().prop_map(PutPort::from_bytes)
}

fn arb_frag() -> impl Strategy<Value = Frag> {
    (1u32..1000).prop_flat_map(|count| (0..count).prop_map(move |index| Frag { index, count }))
}

fn arb_packet(payload: &'static [u8]) -> impl Strategy<Value = Packet<'static>> {
    prop_oneof![
        (
            arb_txn(),
            any::<u64>(),
            arb_port(),
            arb_frag(),
            any::<u64>(),
            0..payload.len()
        )
            .prop_map(
                move |(txn, i, port, frag, total_len, n)| Packet::Request(Request {
                    txn,
                    instance: Instance(i),
                    port,
                    frag,
                    total_len,
                    payload: &payload[..n],
                })
            ),
        (
            arb_txn(),
            any::<u64>(),
            0u8..3,
            arb_frag(),
            any::<u64>(),
            0..payload.len()
        )
            .prop_map(move |(txn, i, s, frag, total_len, n)| Packet::Reply(Reply {
                txn,
                instance: Instance(i),
                status: [ReplyStatus::Ok, ReplyStatus::Busy, ReplyStatus::TooLarge][s as usize],
                frag,
                total_len,
                payload: &payload[..n],
            })),
        (
            arb_txn(),
            any::<u64>(),
            any::<bool>(),
            any::<u32>(),
            any::<u64>()
        )
            .prop_map(|(txn, i, d, base, mask)| Packet::Ack(Ack {
                txn,
                instance: Instance(i),
                dir: if d { AckDir::Reply } else { AckDir::Request },
                base,
                mask,
            })),
        (arb_txn(), any::<u64>()).prop_map(|(txn, i)| Packet::Working(Working {
            txn,
            instance: Instance(i)
        })),
        (arb_txn(), arb_port(), any::<u64>(), any::<u64>()).prop_map(|(txn, port, w, a)| {
            Packet::NotHere(NotHere {
                txn,
                port,
                wanted: Instance(w),
                actual: Instance(a),
            })
        }),
        (any::<u64>(), arb_port(), any::<u64>(), any::<u64>()).prop_map(|(n, port, i, node)| {
            Packet::Locate(Locate {
                nonce: Nonce(n),
                port,
                instance: Instance(i),
                node: NodeId(node),
            })
        }),
        (
            any::<u64>(),
            arb_port(),
            any::<u64>(),
            0u8..4,
            prop::collection::vec(
                (arb_addr(), any::<u64>(), any::<u32>(), any::<bool>()),
                0..MAX_HERE_ENDPOINTS
            )
        )
            .prop_map(|(n, port, node, fate, eps)| Packet::Here(Here {
                nonce: Nonce(n),
                port,
                node: NodeId(node),
                fate: [Fate::Unknown, Fate::Serving, Fate::Drained, Fate::Vanished][fate as usize],
                endpoints: eps
                    .into_iter()
                    .map(|(addr, i, uid, system)| Endpoint {
                        addr,
                        instance: Instance(i),
                        uid,
                        system,
                    })
                    .collect(),
            })),
        (
            any::<u64>(),
            any::<u64>(),
            "[a-z0-9-]{0,64}",
            arb_addr(),
            prop::collection::vec((any::<u64>(), arb_addr()), 0..20),
            prop::option::of((1u16.., any::<[u32; 4]>(), any::<bool>())),
        )
            .prop_map(
                |(node, inc, name, addr, ms, load)| Packet::Heartbeat(Heartbeat {
                    node: NodeId(node),
                    incarnation: inc,
                    name,
                    addr,
                    members: ms
                        .into_iter()
                        .map(|(n, addr)| Member {
                            node: NodeId(n),
                            addr
                        })
                        .collect(),
                    load: load.map(|(cores, [q, f, m, p], active)| Load {
                        cores,
                        run_queue_centi: q,
                        foreign_cpu_milli: f,
                        mem_free_mib: m,
                        shoal_procs: p,
                        owner: if active { Owner::Active } else { Owner::Idle },
                    }),
                })
            ),
    ]
}

/// Long enough for both MACs (SipHash up to 1 KiB, BLAKE3 above).
static PAYLOAD: [u8; 3000] = {
    let mut p = [0u8; 3000];
    let mut i = 0;
    while i < 3000 {
        p[i] = (i * 7) as u8;
        i += 1;
    }
    p
};

proptest! {
    #[test]
    fn every_packet_round_trips(p in arb_packet(&PAYLOAD)) {
        let bytes = encode(&p, &key());
        prop_assert_eq!(decode(&bytes, &key()).unwrap(), p);
    }

    #[test]
    fn every_packet_round_trips_as_a_plaintext(p in arb_packet(&PAYLOAD)) {
        let mut bytes = Vec::new();
        encode_plain(&p, &mut bytes);
        prop_assert_eq!(&bytes[1..], &encode(&p, &key())[HEADER_LEN..]);
        prop_assert_eq!(plain_head_len(&p) + match &p {
            Packet::Request(r) => r.payload.len(),
            Packet::Reply(r) => r.payload.len(),
            _ => 0,
        }, bytes.len());
        prop_assert_eq!(decode_plain(&bytes).unwrap(), p);
    }

    #[test]
    fn a_truncated_plaintext_is_rejected(p in arb_packet(&PAYLOAD), cut in any::<prop::sample::Index>()) {
        let mut bytes = Vec::new();
        encode_plain(&p, &mut bytes);
        let payload = match &p {
            Packet::Request(r) => r.payload.len(),
            Packet::Reply(r) => r.payload.len(),
            _ => 0,
        };
        // Cutting into a payload makes a shorter payload, not an error.
        let cut = cut.index(bytes.len() - payload);
        prop_assert!(decode_plain(&bytes[..cut]).is_err());
    }

    #[test]
    fn any_flipped_bit_is_rejected(p in arb_packet(&PAYLOAD), bit in any::<prop::sample::Index>()) {
        let mut bytes = encode(&p, &key());
        let bit = bit.index(bytes.len() * 8);
        bytes[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(decode(&bytes, &key()).is_err());
    }

    #[test]
    fn any_truncation_is_rejected(p in arb_packet(&PAYLOAD), cut in any::<prop::sample::Index>()) {
        let bytes = encode(&p, &key());
        let cut = cut.index(bytes.len());
        prop_assert!(decode(&bytes[..cut], &key()).is_err());
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2000)) {
        let _ = decode(&bytes, &key());
        let _ = decode_plain(&bytes);
    }
}

#[test]
fn another_clusters_key_is_rejected() {
    let p = Packet::Locate(Locate {
        nonce: Nonce(1),
        port: PutPort::from_bytes([1; 16]),
        instance: Instance(0),
        node: NodeId(0),
    });
    let bytes = encode(&p, &key());
    let other = ClusterKey::from_bytes([8u8; 32]);
    assert_eq!(decode(&bytes, &other), Err(WireError::BadMac));
}

#[test]
fn packets_with_bad_structure_but_valid_mac_are_rejected() {
    // A sender holding the key can still send nonsense; the decoder must
    // reject it without panicking.
    let mut bytes = encode(
        &Packet::Request(Request {
            txn: TxnId {
                client: ClientId(1),
                seq: Seq(1),
            },
            instance: Instance(0),
            port: PutPort::from_bytes([0; 16]),
            frag: Frag { index: 0, count: 1 },
            total_len: 0,
            payload: &[],
        }),
        &key(),
    );
    // fragment index = count: out of range
    let off = HEADER_LEN + 16 + 8 + 16;
    bytes[off..off + 4].copy_from_slice(&5u32.to_le_bytes());
    bytes[off + 4..off + 8].copy_from_slice(&5u32.to_le_bytes());
    let mac = key().mac(&bytes);
    bytes[4..HEADER_LEN].copy_from_slice(&mac);
    assert!(matches!(
        decode(&bytes, &key()),
        Err(WireError::Malformed(_))
    ));
}
