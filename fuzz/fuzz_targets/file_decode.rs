//! The file service's decoders (requests, responses, metadata snapshots
//! and records) never panic, and what they accept re-encodes to bytes that
//! decode the same; a store opened on a metadata file made of the input
//! (as after any corruption) opens or refuses cleanly, never panics, and
//! if it opens, fsck runs on it.

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
    let (d, m0, m1) = (SimDisk::new(), SimDisk::new(), SimDisk::new());
    m0.write_at(data, 0).unwrap();
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
    }
});
