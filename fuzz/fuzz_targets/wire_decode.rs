//! `shoal_wire::decode` never panics on any datagram, and every packet it
//! accepts re-encodes to bytes that decode to an equal packet;
//! `decode_split` of the same datagram cut after its reply header (as a
//! scattering receive cuts it) agrees with `decode`.
//!
//! A random MAC almost never matches, so inputs of at least a header's
//! length are also tried with their MAC recomputed under the fixed key:
//! that is what lets the fuzzer reach the field parsers.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_wire::{ClusterKey, HEADER_LEN, Packet, REPLY_HEAD, decode, decode_split, encode};

fuzz_target!(|data: &[u8]| {
    let key = ClusterKey::from_bytes([7; 32]);
    let _ = decode(data, &key);
    if data.len() < HEADER_LEN {
        return;
    }
    let mut buf = data.to_vec();
    let mac = key.mac(&buf);
    buf[4..HEADER_LEN].copy_from_slice(&mac);
    let whole = decode(&buf, &key);
    if buf.len() > REPLY_HEAD {
        let (head, tail) = buf.split_at(REPLY_HEAD);
        match (&whole, decode_split(head, tail, &key)) {
            (Ok(Packet::Reply(w)), Ok(Packet::Reply(s))) => {
                assert_eq!([s.payload, tail].concat(), w.payload, "split payload differs");
            }
            (Ok(Packet::Request(w)), Ok(Packet::Request(s))) => {
                assert_eq!([s.payload, tail].concat(), w.payload, "split payload differs");
            }
            (_, Ok(p)) => panic!("a split decode accepted {p:?}, the whole gave {whole:?}"),
            (_, Err(_)) => {}
        }
    }
    if let Ok(packet) = whole {
        let again = encode(&packet, &key);
        let decoded = decode(&again, &key).expect("a re-encoded packet decodes");
        assert_eq!(decoded, packet, "re-encoding changed the packet");
    }
});
