//! `shoal_wire::decode` and `decode_plain` never panic on any input, and
//! every packet either accepts re-encodes to bytes that decode to an equal
//! packet.
//!
//! A random MAC almost never matches, so inputs of at least a header's
//! length are also tried with their MAC recomputed under the fixed key:
//! that is what lets the fuzzer reach the field parsers through `decode`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_wire::{ClusterKey, HEADER_LEN, decode, decode_plain, encode, encode_plain};

fuzz_target!(|data: &[u8]| {
    let key = ClusterKey::from_bytes([7; 32]);
    let _ = decode(data, &key);
    if let Ok(packet) = decode_plain(data) {
        let mut again = Vec::new();
        encode_plain(&packet, &mut again);
        let decoded = decode_plain(&again).expect("a re-encoded plaintext decodes");
        assert_eq!(decoded, packet, "re-encoding changed the plaintext");
    }
    if data.len() < HEADER_LEN {
        return;
    }
    let mut buf = data.to_vec();
    let mac = key.mac(&buf);
    buf[4..HEADER_LEN].copy_from_slice(&mac);
    if let Ok(packet) = decode(&buf, &key) {
        let again = encode(&packet, &key);
        let decoded = decode(&again, &key).expect("a re-encoded packet decodes");
        assert_eq!(decoded, packet, "re-encoding changed the packet");
    }
});
