//! The file service's decoders (requests, responses, metadata snapshots
//! and records) never panic, and what they accept re-encodes to bytes that
//! decode the same; a store opened on a metadata file made of the input
//! (as after any corruption) opens or refuses cleanly, never panics, and
//! if it opens, fsck runs on it.  So that recovery gets past the
//! checksums, the input is also framed as a valid metadata file: split at
//! 0xA5 bytes, the first piece becomes the snapshot body and the others
//! records, each under a correct check.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_bullet::meta::{Record, Snapshot};
use shoal_bullet::op::{Op, decode_result, encode_result};
use shoal_bullet::{Disk, Disks, SimDisk, Store, StoreConfig};

fuzz_target!(|data: &[u8]| {
    if let Ok(op) = Op::decode(data) {
        assert_eq!(Op::decode(&op.encode()).expect("re-encoded request"), op);
    }
    if let Ok(r) = decode_result(data) {
        assert_eq!(decode_result(&encode_result(&r)).expect("re-encoded result"), r);
    }
    if let Ok((generation, snap, start)) = Snapshot::decode(data) {
        let again = snap.encode(generation);
        assert_eq!(Snapshot::decode(&again).expect("snapshot").1, snap);
        let (records, end) = Record::replay(data, generation, start);
        assert!(end <= data.len());
        for r in records {
            let at = again.len() as u64;
            let bytes = r.encode(generation, at);
            let mut file = again.clone();
            file.extend_from_slice(&bytes);
            assert_eq!(Record::replay(&file, generation, again.len()).0, vec![r]);
        }
    }
    open_on(data);
    open_on(&framed(data));
});

/// A metadata file whose header and record checks are right, with the
/// input's pieces as snapshot body and record bodies.
fn framed(data: &[u8]) -> Vec<u8> {
    let check = |parts: &[&[u8]]| -> [u8; 16] {
        let mut h = blake3::Hasher::new();
        for p in parts {
            h.update(p);
        }
        h.finalize().as_bytes()[..16].try_into().unwrap()
    };
    let generation = 1u64;
    let mut pieces = data.split(|&b| b == 0xA5);
    let body = pieces.next().unwrap_or_default();
    let mut file = Vec::new();
    file.extend_from_slice(b"SHOALBM1");
    file.extend_from_slice(&generation.to_le_bytes());
    file.extend_from_slice(&(body.len() as u64).to_le_bytes());
    let c = check(&[&file, body]);
    file.extend_from_slice(&c);
    file.extend_from_slice(body);
    for rec in pieces.filter(|r| !r.is_empty()) {
        let at = file.len() as u64;
        file.extend_from_slice(&(rec.len() as u32).to_le_bytes());
        file.extend_from_slice(&check(&[&generation.to_le_bytes(), &at.to_le_bytes(), rec]));
        file.extend_from_slice(rec);
    }
    file
}

fn open_on(meta: &[u8]) {
    let (d, m0, m1) = (SimDisk::new(), SimDisk::new(), SimDisk::new());
    d.write_at(&[7u8; 4096], 0).unwrap();
    m0.write_at(meta, 0).unwrap();
    if let Ok(store) = Store::open(
        Disks {
            data: d,
            meta: [m0, m1],
        },
        StoreConfig {
            seed: Some(1),
            ..StoreConfig::default()
        },
    ) {
        let _ = store.fsck();
        // The simulated disk is memory: compact (which may set the data
        // disk's length to the end of the last extent) only small stores.
        let small = match store.stats() {
            shoal_bullet::Answer::Report { figures, .. } => figures
                .iter()
                .any(|(k, v)| k == "store_bytes" && *v <= 64 << 20),
            _ => false,
        };
        if small {
            let _ = store.compact();
        }
        let _ = store.age();
    }
}
