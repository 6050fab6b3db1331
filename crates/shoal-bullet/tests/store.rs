//! The store's operations on simulated disks: semantics, rights, sharing of
//! extents between versions, garbage collection, compaction, recovery.

use std::time::Duration;

use proptest::prelude::*;
use shoal_bullet::meta::MAGIC;
use shoal_bullet::model::{ADMIN, CREATE, DESTROY, MAX_EXTENT, MODIFY, READ};
use shoal_bullet::op::{FLAG_COMMIT, FLAG_SAFETY};
use shoal_bullet::{Answer, Disk, Disks, Edit, FileError, SimDisk, Store, StoreConfig};
use shoal_cap::{Capability, GetPort, Rights};
use shoal_time::Time;

const CS: u8 = FLAG_COMMIT | FLAG_SAFETY;

fn disks() -> (SimDisk, SimDisk, SimDisk) {
    (SimDisk::new(), SimDisk::new(), SimDisk::new())
}

fn open(d: &(SimDisk, SimDisk, SimDisk), cfg: StoreConfig) -> Store<SimDisk> {
    Store::open(
        Disks {
            data: d.0.clone(),
            meta: [d.1.clone(), d.2.clone()],
        },
        cfg,
    )
    .unwrap()
}

fn fresh(cfg: StoreConfig) -> ((SimDisk, SimDisk, SimDisk), Store<SimDisk>) {
    let d = disks();
    let s = Store::format(
        Disks {
            data: d.0.clone(),
            meta: [d.1.clone(), d.2.clone()],
        },
        GetPort::from_bytes([1; 16]),
        cfg,
    )
    .unwrap();
    (d, s)
}

fn read_all(s: &Store<SimDisk>, cap: &Capability) -> Result<Vec<u8>, FileError> {
    let size = s.stat(cap)?.size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        s.read_into(cap, out.len() as u64, 8 << 20, &mut out)?;
    }
    Ok(out)
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn create_read_stat_destroy() {
    let (_, s) = fresh(StoreConfig::default());
    let server = s.server_cap();
    let data = bytes(3 * MAX_EXTENT as usize + 17, 1);
    let cap = s.create(&server, CS, &data, Time::ZERO).unwrap();
    assert_eq!(read_all(&s, &cap).unwrap(), data);
    let st = s.stat(&cap).unwrap();
    assert_eq!(
        (st.size, st.committed, st.pieces),
        (data.len() as u64, true, 4)
    );
    // Any range, and a short read only at the end.
    let mut out = Vec::new();
    s.read_into(&cap, 1_000_000, 100_000, &mut out).unwrap();
    assert_eq!(out, data[1_000_000..1_100_000]);
    out.clear();
    s.read_into(&cap, data.len() as u64 - 5, 100, &mut out)
        .unwrap();
    assert_eq!(out.len(), 5);
    assert!(matches!(
        s.read_into(&cap, data.len() as u64 + 1, 1, &mut out),
        Err(FileError::Range { .. })
    ));
    let empty = s.create(&server, CS, &[], Time::ZERO).unwrap();
    assert_eq!(read_all(&s, &empty).unwrap(), Vec::<u8>::new());
    s.destroy(&cap).unwrap();
    assert_eq!(s.stat(&cap), Err(FileError::NotFound));
    assert_eq!(s.destroy(&cap), Err(FileError::NotFound));
}

#[test]
fn rights_are_enforced_per_operation() {
    let (_, s) = fresh(StoreConfig::default());
    let server = s.server_cap();
    let cap = s.create(&server, CS, b"data", Time::ZERO).unwrap();
    let read_only = cap.restrict(READ).unwrap();
    let mut out = Vec::new();
    s.read_into(&read_only, 0, 4, &mut out).unwrap();
    assert!(matches!(
        s.destroy(&read_only),
        Err(FileError::Denied { .. })
    ));
    assert!(matches!(
        s.edit(
            &read_only,
            CS,
            Edit::<&[u8]>::Delete { offset: 0, len: 1 },
            Time::ZERO
        ),
        Err(FileError::Denied { .. })
    ));
    let no_read = cap.restrict(DESTROY.union(MODIFY)).unwrap();
    assert!(matches!(
        s.read_into(&no_read, 0, 4, &mut out),
        Err(FileError::Denied { .. })
    ));
    // The server's capability: create needs CREATE, admin needs ADMIN.
    let weak = server.restrict(CREATE).unwrap();
    s.create(&weak, 0, b"x", Time::ZERO).unwrap();
    assert!(matches!(
        s.create(&server.restrict(ADMIN).unwrap(), 0, b"x", Time::ZERO),
        Err(FileError::Denied { .. })
    ));
    assert!(matches!(
        s.execute(
            shoal_bullet::Op::<Vec<u8>>::Admin {
                server: weak,
                what: shoal_bullet::AdminOp::Fsck
            },
            Time::ZERO
        ),
        Err(FileError::Denied { .. })
    ));
    // A forged check field, or a capability of another object.
    let mut forged = cap.to_bytes();
    forged[40] ^= 1;
    let forged = Capability::from_bytes(&forged).unwrap();
    assert_eq!(s.stat(&forged), Err(FileError::BadCapability));
    // A file a capability with too few rights derives from stays intact.
    assert_eq!(read_all(&s, &cap).unwrap(), b"data");
    let _ = Rights::ALL;
}

#[test]
fn uncommitted_files_are_invisible_then_expire() {
    let cfg = StoreConfig {
        uncommitted_life: Duration::from_micros(1_000),
        ..Default::default()
    };
    let (_, s) = fresh(cfg);
    let cap = s
        .create(&s.server_cap(), 0, b"part one ", Time::ZERO)
        .unwrap();
    let mut out = Vec::new();
    assert_eq!(
        s.read_into(&cap, 0, 1, &mut out),
        Err(FileError::NotCommitted)
    );
    // Filling in place keeps the capability.
    let same = s
        .edit(
            &cap,
            0,
            Edit::Write {
                offset: 9,
                data: b"part two".to_vec(),
            },
            Time(500),
        )
        .unwrap();
    assert_eq!(same, cap);
    assert_eq!(s.expire(Time(1_000)), 0, "touched at 500");
    assert_eq!(s.expire(Time(1_501)), 1);
    assert_eq!(s.stat(&cap), Err(FileError::NotFound));
    let cap = s.create(&s.server_cap(), 0, b"abc", Time(2_000)).unwrap();
    s.commit(&cap, FLAG_SAFETY, Time(2_000)).unwrap();
    assert_eq!(
        s.expire(Time(1_000_000)),
        0,
        "committed files do not expire"
    );
    assert_eq!(
        s.edit(
            &cap,
            0,
            Edit::<&[u8]>::Delete { offset: 0, len: 1 },
            Time::ZERO
        )
        .map(|c| c == cap),
        Ok(false),
        "an edit of a committed file makes a new one"
    );
}

#[test]
fn appending_to_a_big_file_writes_only_the_append() {
    let (d, s) = fresh(StoreConfig::default());
    let data = bytes(20 * MAX_EXTENT as usize, 7);
    let big = s.create(&s.server_cap(), CS, &data, Time::ZERO).unwrap();
    let before = s.stats();
    let (_, writes_before) = d.0.counts();
    let appended = s
        .edit(
            &big,
            CS,
            Edit::Write {
                offset: data.len() as u64,
                data: vec![9; 4096],
            },
            Time::ZERO,
        )
        .unwrap();
    let (_, writes_after) = d.0.counts();
    assert_eq!(writes_after - writes_before, 1, "one 4 KiB extent written");
    let fig = |a: &Answer, k: &str| match a {
        Answer::Report { figures, .. } => figures.iter().find(|f| f.0 == k).unwrap().1,
        _ => unreachable!(),
    };
    assert_eq!(
        fig(&s.stats(), "bytes_stored") - fig(&before, "bytes_stored"),
        4096
    );
    let mut want = data.clone();
    want.extend_from_slice(&[9; 4096]);
    assert_eq!(read_all(&s, &appended).unwrap(), want);
    assert_eq!(
        read_all(&s, &big).unwrap(),
        data,
        "the old version is intact"
    );
    // Destroying the old version keeps the shared extents for the new one.
    s.destroy(&big).unwrap();
    s.flush().unwrap();
    assert_eq!(read_all(&s, &appended).unwrap(), want);
    drop(s);
    let s = open(&d, StoreConfig::default());
    assert_eq!(read_all(&s, &appended).unwrap(), want);
    assert!(matches!(s.fsck(), Answer::Report { problems, .. } if problems.is_empty()));
}

#[test]
fn concat_joins_uncommitted_parts_in_order_and_consumes_them() {
    let (d, s) = fresh(StoreConfig::default());
    let server = s.server_cap();
    let parts: Vec<_> = (0..3)
        .map(|i| {
            s.create(&server, 0, &bytes(300_000, i), Time::ZERO)
                .unwrap()
        })
        .collect();
    let whole = s.concat(&server, CS, &parts, Time::ZERO).unwrap();
    let want: Vec<u8> = (0..3).flat_map(|i| bytes(300_000, i)).collect();
    assert_eq!(read_all(&s, &whole).unwrap(), want);
    for p in &parts {
        assert_eq!(s.stat(p), Err(FileError::NotFound), "parts are consumed");
    }
    // Refused: a committed part, a part named twice, a part without
    // MODIFY, a server capability without CREATE; nothing is consumed.
    let a = s.create(&server, 0, b"a", Time::ZERO).unwrap();
    assert_eq!(
        s.concat(&server, CS, &[a, whole], Time::ZERO),
        Err(FileError::Committed)
    );
    assert!(matches!(
        s.concat(&server, CS, &[a, a], Time::ZERO),
        Err(FileError::BadRequest(_))
    ));
    assert!(matches!(
        s.concat(&server, CS, &[a.restrict(READ).unwrap()], Time::ZERO),
        Err(FileError::Denied { .. })
    ));
    assert!(matches!(
        s.concat(&server.restrict(READ).unwrap(), CS, &[a], Time::ZERO),
        Err(FileError::Denied { .. })
    ));
    assert!(s.stat(&a).is_ok());
    drop(s);
    let s = open(&d, StoreConfig::default());
    assert_eq!(read_all(&s, &whole).unwrap(), want);
    assert!(matches!(s.fsck(), Answer::Report { problems, .. } if problems.is_empty()));
}

#[test]
fn verify_reads_the_disk_not_the_cache() {
    let (d, s) = fresh(StoreConfig::default());
    let cap = s
        .create(&s.server_cap(), CS, &bytes(100_000, 5), Time::ZERO)
        .unwrap();
    s.verify(&cap).unwrap();
    d.0.corrupt(10);
    // The cache (filled on write) still serves the right bytes; verify
    // reads the disk and says what is wrong.
    assert_eq!(read_all(&s, &cap).unwrap(), bytes(100_000, 5));
    assert!(matches!(s.verify(&cap), Err(FileError::Corrupt(_))));
}

#[test]
fn ageing_destroys_what_nobody_touches() {
    let cfg = StoreConfig {
        ttl: 2,
        ..Default::default()
    };
    let (_, s) = fresh(cfg);
    let a = s.create(&s.server_cap(), CS, b"kept", Time::ZERO).unwrap();
    let b = s.create(&s.server_cap(), CS, b"lost", Time::ZERO).unwrap();
    assert_eq!(s.age(), 0);
    assert_eq!(
        s.touch(&[a, a.restrict(READ).unwrap()], Time::ZERO),
        vec![true, true]
    );
    assert_eq!(s.age(), 1);
    assert_eq!(s.stat(&b), Err(FileError::NotFound));
    assert_eq!(s.stat(&a).unwrap().ttl, 1);
    assert_eq!(s.touch(&[b], Time::ZERO), vec![false]);
}

/// A manager's request ages at most once per gap, however many passes
/// (or managers) ask.
#[test]
fn ageing_asked_for_runs_at_most_once_per_gap() {
    let cfg = StoreConfig {
        ttl: 1,
        age_gap: Duration::from_micros(1_000),
        ..Default::default()
    };
    let (_, s) = fresh(cfg);
    let a = s.create(&s.server_cap(), CS, b"one", Time::ZERO).unwrap();
    assert_eq!(s.age_when_due(Time(5_000)), Some(1));
    let b = s.create(&s.server_cap(), CS, b"two", Time(5_000)).unwrap();
    assert_eq!(s.age_when_due(Time(5_999)), None, "too soon");
    assert!(s.stat(&b).is_ok());
    assert_eq!(s.age_when_due(Time(6_000)), Some(1));
    assert_eq!(s.stat(&a), Err(FileError::NotFound));
    assert_eq!(s.stat(&b), Err(FileError::NotFound));
}

#[test]
fn compaction_moves_extents_and_shrinks_the_store() {
    let cfg = StoreConfig {
        grow_step: 64 << 10,
        ..Default::default()
    };
    let (d, s) = fresh(cfg.clone());
    let server = s.server_cap();
    let caps: Vec<_> = (0..40)
        .map(|i| {
            s.create(&server, CS, &bytes(50_000, i), Time::ZERO)
                .unwrap()
        })
        .collect();
    for c in caps.iter().step_by(2) {
        s.destroy(c).unwrap();
    }
    s.flush().unwrap();
    let before = d.0.len().unwrap();
    let Answer::Report { figures, .. } = s.compact().unwrap() else {
        panic!()
    };
    let after = d.0.len().unwrap();
    assert!(after < before, "{before} -> {after} ({figures:?})");
    assert!(after <= 20 * 50_000 + 50_000);
    for (i, c) in caps.iter().enumerate().skip(1).step_by(2) {
        assert_eq!(read_all(&s, c).unwrap(), bytes(50_000, i as u8));
    }
    drop(s);
    let s = open(&d, cfg);
    for (i, c) in caps.iter().enumerate().skip(1).step_by(2) {
        assert_eq!(read_all(&s, c).unwrap(), bytes(50_000, i as u8));
    }
    assert!(matches!(s.fsck(), Answer::Report { problems, .. } if problems.is_empty()));
}

#[test]
fn corruption_is_reported_never_returned() {
    let (d, s) = fresh(StoreConfig::default());
    let cap = s
        .create(&s.server_cap(), CS, &bytes(100_000, 3), Time::ZERO)
        .unwrap();
    // After a checkpoint the log no longer holds the small file's bytes
    // (which recovery would write back over the rot).
    s.checkpoint().unwrap();
    drop(s);
    d.0.corrupt(50_000);
    let s = open(&d, StoreConfig::default());
    assert!(matches!(read_all(&s, &cap), Err(FileError::Corrupt(_))));
    let Answer::Report { problems, .. } = s.fsck() else {
        panic!()
    };
    assert_eq!(problems.len(), 1, "{problems:?}");
}

#[test]
fn recovery_cuts_the_log_after_the_last_valid_record() {
    let (d, s) = fresh(StoreConfig::default());
    let before = (d.1.len().unwrap(), d.2.len().unwrap());
    let cap = s.create(&s.server_cap(), CS, b"kept", Time::ZERO).unwrap();
    let valid = match s.stats() {
        Answer::Report { figures, .. } => {
            figures.iter().find(|f| f.0 == "meta_log_bytes").unwrap().1
        }
        _ => unreachable!(),
    };
    drop(s);
    // The metadata file the record went to is the one in use.
    let log = if d.1.len().unwrap() != before.0 {
        &d.1
    } else {
        assert_ne!(d.2.len().unwrap(), before.1, "the record was written");
        &d.2
    };
    // The file was made ahead of the records, in zeros.
    let made = log.len().unwrap();
    assert!(made > valid, "{made} bytes made for {valid} of records");
    let mut past = vec![1u8; (made - valid) as usize];
    log.read_at(&mut past, valid).unwrap();
    assert!(past.iter().all(|b| *b == 0), "zeros past the records");
    let mut head = [0u8; 8];
    log.read_at(&mut head, 0).unwrap();
    assert_eq!(&head, MAGIC);
    log.write_at(&[0xAB; 300], valid).unwrap();
    let s = open(&d, StoreConfig::default());
    // (The start's checkpoint then goes to the other file.)
    assert_eq!(
        log.len().unwrap(),
        valid,
        "garbage and zeros past the records are cut"
    );
    assert_eq!(read_all(&s, &cap).unwrap(), b"kept");
}

#[test]
fn a_small_safe_commit_is_one_sync_and_survives_a_power_loss() {
    for seed in 0..64u64 {
        let (d, s) = fresh(StoreConfig::default());
        let big = s
            .create(&s.server_cap(), CS, &bytes(300_000, 1), Time::ZERO)
            .unwrap();
        let syncs =
            |d: &(SimDisk, SimDisk, SimDisk)| (d.0.counts().0, d.1.counts().0 + d.2.counts().0);
        let before = syncs(&d);
        let small: Vec<_> = (0..4)
            .map(|i| {
                s.create(&s.server_cap(), CS, &bytes(5_000, i), Time::ZERO)
                    .unwrap()
            })
            .collect();
        let after = syncs(&d);
        assert_eq!(after.0, before.0, "no sync of the data disk");
        assert_eq!(after.1, before.1 + 4, "one sync of the metadata each");
        // Written but never synced: a power loss may keep any part of it.
        let lost = s
            .create(&s.server_cap(), FLAG_COMMIT, &bytes(5_000, 9), Time::ZERO)
            .unwrap();
        std::mem::forget(s);
        let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed);
        d.0.crash(&mut rng);
        d.1.crash(&mut rng);
        d.2.crash(&mut rng);
        let s = open(&d, StoreConfig::default());
        assert_eq!(read_all(&s, &big).unwrap(), bytes(300_000, 1));
        for (i, c) in small.iter().enumerate() {
            assert_eq!(
                read_all(&s, c).unwrap(),
                bytes(5_000, i as u8),
                "seed {seed}"
            );
        }
        assert!(matches!(read_all(&s, &lost), Err(FileError::NotFound)));
        assert!(matches!(s.fsck(), Answer::Report { problems, .. } if problems.is_empty()));
    }
}

#[test]
fn checkpoints_alternate_between_the_metadata_files() {
    let cfg = StoreConfig {
        checkpoint_after: 4096,
        ..Default::default()
    };
    let (d, s) = fresh(cfg.clone());
    let caps: Vec<_> = (0..200)
        .map(|i| {
            s.create(&s.server_cap(), CS, &bytes(10, i as u8), Time::ZERO)
                .unwrap()
        })
        .collect();
    assert!(d.2.len().unwrap() > 0, "the second file was used");
    drop(s);
    let s = open(&d, cfg);
    for (i, c) in caps.iter().enumerate() {
        assert_eq!(read_all(&s, c).unwrap(), bytes(10, i as u8));
    }
}

#[test]
fn a_file_lost_at_a_crash_is_not_found_and_its_number_never_given_again() {
    let (d, s) = fresh(StoreConfig::default());
    let kept = s.create(&s.server_cap(), CS, b"kept", Time::ZERO).unwrap();
    s.flush().unwrap();
    // Created after the last flush, then the process dies: its commit
    // record never reached the disk.
    let lost = s
        .create(&s.server_cap(), FLAG_COMMIT, b"lost", Time::ZERO)
        .unwrap();
    std::mem::forget(s);
    for _ in 0..3 {
        let s = open(&d, StoreConfig::default());
        assert_eq!(read_all(&s, &kept).unwrap(), b"kept");
        let again = s.create(&s.server_cap(), CS, b"again", Time::ZERO).unwrap();
        assert_ne!(
            again.object(),
            lost.object(),
            "a lost file's number was given again"
        );
        assert!(
            matches!(read_all(&s, &lost), Err(FileError::NotFound)),
            "{:?}",
            read_all(&s, &lost)
        );
        std::mem::forget(s);
    }
}

#[derive(Debug, Clone)]
enum E {
    W(u64, usize),
    I(u64, usize),
    D(u64, u64),
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Any sequence of edits, of committed files (new versions) and in
    /// place, reads back as the same edits of a byte vector.
    #[test]
    fn edits_match_a_byte_vector(
        init in 0usize..300_000,
        edits in proptest::collection::vec(
            prop_oneof![
                (any::<u64>(), 0usize..200_000).prop_map(|(o, n)| E::W(o, n)),
                (any::<u64>(), 0usize..200_000).prop_map(|(o, n)| E::I(o, n)),
                (any::<u64>(), any::<u64>()).prop_map(|(o, n)| E::D(o, n)),
            ],
            1..12,
        ),
        commit_each in any::<bool>(),
    ) {
        let (_, s) = fresh(StoreConfig { cache_bytes: 1 << 20, ..Default::default() });
        let mut model = bytes(init, 1);
        let mut cap = s.create(&s.server_cap(), if commit_each { CS } else { 0 }, &model, Time::ZERO).unwrap();
        let mut versions = vec![];
        for (i, e) in edits.into_iter().enumerate() {
            let size = model.len() as u64;
            let edit = match e {
                E::W(o, n) => {
                    let o = o % (size + 1);
                    let d = bytes(n, i as u8 + 2);
                    let end = (o as usize + n).max(model.len());
                    model.resize(end, 0);
                    model[o as usize..o as usize + n].copy_from_slice(&d);
                    Edit::Write { offset: o, data: d }
                }
                E::I(o, n) => {
                    let o = o % (size + 1);
                    let d = bytes(n, i as u8 + 2);
                    model.splice(o as usize..o as usize, d.iter().copied());
                    Edit::Insert { offset: o, data: d }
                }
                E::D(o, n) => {
                    let o = o % (size + 1);
                    let n = n % (size - o + 1);
                    model.drain(o as usize..(o + n) as usize);
                    Edit::Delete { offset: o, len: n }
                }
            };
            cap = s.edit(&cap, if commit_each { CS } else { 0 }, edit, Time::ZERO).unwrap();
            if commit_each {
                versions.push((cap, model.clone()));
            }
        }
        if !commit_each {
            s.commit(&cap, FLAG_SAFETY, Time::ZERO).unwrap();
            versions.push((cap, model.clone()));
        }
        for (c, m) in versions {
            prop_assert_eq!(read_all(&s, &c).unwrap(), m);
        }
        let fsck_clean = matches!(s.fsck(), Answer::Report { problems, .. } if problems.is_empty());
        prop_assert!(fsck_clean);
    }
}

/// Holes: a file grown by 5 GiB (more than one piece's length) holds no
/// more extents or bytes than what was written into it; its holes read
/// as zeros, a write into one and a hole over data read as they should,
/// fsck finds nothing wrong, and all of it survives compaction and a
/// restart from the metadata.
#[test]
fn holes_cost_nothing_and_read_as_zeros() {
    const GIB: u64 = 1 << 30;
    let (d, s) = fresh(StoreConfig::default());
    let before = s.stats();
    let f = s.create(&s.server_cap(), 0, b"abcdef", Time::ZERO).unwrap();
    let f = s
        .edit(
            &f,
            0,
            Edit::<&[u8]>::Hole {
                offset: 6,
                len: 5 * GIB,
            },
            Time::ZERO,
        )
        .unwrap();
    let f = s
        .edit(
            &f,
            0,
            Edit::Write {
                offset: 4 * GIB,
                data: &b"middle"[..],
            },
            Time::ZERO,
        )
        .unwrap();
    let f = s
        .edit(
            &f,
            CS,
            Edit::<&[u8]>::Hole { offset: 1, len: 2 },
            Time::ZERO,
        )
        .unwrap();
    assert_eq!(s.stat(&f).unwrap().size, 6 + 5 * GIB);
    let fig = |a: &Answer, k: &str| match a {
        Answer::Report { figures, .. } => figures.iter().find(|f| f.0 == k).unwrap().1,
        _ => unreachable!(),
    };
    let stored = fig(&s.stats(), "bytes_stored") - fig(&before, "bytes_stored");
    assert_eq!(stored, 12, "only the bytes written are stored");
    let read = |s: &Store<SimDisk>, at: u64, n: u32| {
        let mut out = Vec::new();
        s.read_into(&f, at, n, &mut out).unwrap();
        out
    };
    let check = |s: &Store<SimDisk>| {
        assert_eq!(read(s, 0, 8), b"a\0\0def\0\0");
        assert_eq!(read(s, 4 * GIB - 2, 10), b"\0\0middle\0\0");
        assert!(read(s, 3 * GIB, 8 << 20).iter().all(|b| *b == 0));
        assert_eq!(read(s, 6 + 5 * GIB - 3, 8).len(), 3, "short at the end");
        let data = [(0, 1), (3, 6), (4 * GIB, 4 * GIB + 6)];
        assert_eq!(s.map(&f, 0).unwrap(), data, "the map is the data");
        assert_eq!(s.map(&f, 4).unwrap(), [(4, 6), data[2]], "from inside data");
        assert_eq!(s.map(&f, 7).unwrap(), [data[2]], "from inside a hole");
        assert_eq!(s.map(&f, 6 + 5 * GIB).unwrap(), [], "from the end");
    };
    check(&s);
    match s.fsck() {
        Answer::Report { problems, .. } => assert!(problems.is_empty(), "{problems:?}"),
        other => panic!("fsck: {other:?}"),
    }
    s.compact().unwrap();
    check(&s);
    s.flush().unwrap();
    drop(s);
    let s = open(&d, StoreConfig::default());
    check(&s);
}
