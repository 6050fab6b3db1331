//! Tests of the metadata protocol's encoding: every request and reply
//! round-trips, every cut is refused, oversized I/O is refused, and the
//! decoders never panic.

use proptest::prelude::*;

use super::*;
use crate::testing::sample_attr as attr;

fn sample_ops() -> Vec<Op> {
    vec![
        Op::Hello {
            instance: [3; 16],
            node: b"n1".to_vec(),
        },
        Op::Events {
            confirm: vec![1, 2, 3],
        },
        Op::Confirm { ids: vec![4, 5] },
        Op::Lookup {
            parent: Ino(1),
            name: vec![0xff, 0xfe],
        },
        Op::GetAttr { ino: Ino(7) },
        Op::ReadDir { ino: Ino(1) },
        Op::ReadLink { ino: Ino(9) },
        Op::Open {
            ino: Ino(7),
            want: Want::OpenWrite,
            have: vec![(OpenId(1), true), (OpenId(2), false)],
            id: OpenId(3),
            cached: Some(4),
        },
        Op::Open {
            ino: Ino(7),
            want: Want::Look,
            have: vec![],
            id: OpenId(0),
            cached: None,
        },
        Op::Close {
            ino: Ino(7),
            id: OpenId(3),
        },
        Op::Read {
            ino: Ino(7),
            offset: 1 << 33,
            len: 4096,
        },
        Op::Write {
            ino: Ino(7),
            offset: None,
            data: b"appended\n".to_vec(),
        },
        Op::Change {
            op: UpdateOp::Unlink {
                parent: Ino(1),
                name: b"x".to_vec(),
                dir: false,
                open: false,
            },
            durable: false,
        },
        Op::Change {
            op: UpdateOp::Push { ops: Vec::new() },
            durable: true,
        },
        Op::CreateOpen {
            op: UpdateOp::Create {
                parent: Ino(1),
                name: b"new".to_vec(),
                kind: crate::model::Kind::File,
                perm: 0o644,
                rdev: 0,
                ino: Ino(9),
                secret: [3; 16],
                target: Vec::new(),
                excl: true,
            },
            id: OpenId(5),
            want: Want::OpenWrite,
        },
        Op::Return {
            ino: Ino(7),
            grant: 9,
            kept: Level::Read,
            opens: vec![(OpenId(5), true)],
        },
        Op::StatFs,
        Op::Status,
        Op::Sync,
        Op::Reclaim {
            ino: Ino(7),
            level: Level::Read,
            version: Some(3),
            opens: vec![(OpenId(4), false)],
        },
        Op::GetXattr {
            ino: Ino(7),
            name: b"user.shoal.cap".to_vec(),
        },
        Op::ListXattr { ino: Ino(7) },
        Op::CapStat { cap: sample_cap() },
        Op::CapRead {
            cap: sample_cap(),
            offset: 4096,
            len: 512,
        },
        Op::Lock {
            ino: Ino(7),
            owner: u64::MAX - 3,
            style: Style::Posix,
            mode: Some(Mode::Write),
            start: 10,
            end: crate::locks::EOF,
            pid: 4242,
            how: LockHow::Wait,
        },
        Op::Lock {
            ino: Ino(7),
            owner: 1,
            style: Style::Flock,
            mode: None,
            start: 0,
            end: 0,
            pid: 1,
            how: LockHow::Reclaim,
        },
        Op::TouchContents { after: Ino(77) },
    ]
}

fn sample_cap() -> Capability {
    Capability::mint(
        shoal_cap::GetPort::from_bytes([3; 16]).put_port(),
        shoal_cap::ObjectId::new(7),
        shoal_cap::Rights::READ,
        &shoal_cap::ObjectSecret::from_bytes([9; 32]),
    )
}

fn sample_replies() -> Vec<Result<Reply, Failure>> {
    let grant = Grant {
        level: Level::Write,
        grant: 12,
        uncached: true,
    };
    vec![
        Ok(Reply::Hello {
            lease_ms: 10_000,
            root: attr(),
            servers: vec![shoal_cap::Capability::from_bytes(&[5; 48]).unwrap()],
            copies: 2,
        }),
        Ok(Reply::Events(vec![
            Callback::Recall {
                ino: Ino(5),
                to: Level::None,
                grant: 3,
            },
            Callback::StopCaching {
                ino: Ino(5),
                grant: 4,
            },
            Callback::Orphan { ino: Ino(4) },
            Callback::Unlocked { ino: Ino(6) },
            Callback::Notice {
                id: 9,
                dir: Ino(1),
                name: b"n\xff".to_vec(),
            },
        ])),
        Ok(Reply::Entry {
            attr: attr(),
            grant,
        }),
        Ok(Reply::Entries {
            entries: vec![DirEntry {
                name: b"a".to_vec(),
                ino: Ino(5),
                kind: Kind::Dir,
            }],
            grant,
        }),
        Ok(Reply::Target(b"/etc".to_vec())),
        Ok(Reply::Opened {
            attr: attr(),
            grant,
            content: vec![shoal_cap::Capability::from_bytes(&[7; 48]).unwrap()],
        }),
        Ok(Reply::Data(vec![1, 2, 3])),
        Ok(Reply::Updated(Ok(Answer::Written {
            offset: 3,
            attr: attr(),
        }))),
        Ok(Reply::Updated(Err(FsError::NotEmpty))),
        Ok(Reply::Changed {
            result: Ok(Answer::Entry {
                attr: attr(),
                existed: false,
            }),
            dirs: vec![attr(), attr()],
            opened: Some(grant),
            secret: Some([7; 16]),
        }),
        Ok(Reply::Changed {
            result: Err(FsError::Exists),
            dirs: Vec::new(),
            opened: None,
            secret: None,
        }),
        Ok(Reply::Pushed {
            results: vec![Ok(Answer::Attr(attr())), Err(FsError::NotFound)],
            made: vec![(attr(), grant)],
        }),
        Ok(Reply::StatFs(StatFs {
            block_size: 4096,
            blocks: 10,
            blocks_free: 5,
            files: 100,
            files_free: 90,
        })),
        Ok(Reply::Status("{}".into())),
        Ok(Reply::Done),
        Ok(Reply::Locked(None)),
        Ok(Reply::Touched {
            next: Some(Ino(4097)),
            touched: 4000,
            missing: 96,
        }),
        Ok(Reply::Touched {
            next: None,
            touched: 0,
            missing: 0,
        }),
        Ok(Reply::Locked(Some(Conflict {
            mode: Mode::Read,
            start: 0,
            end: crate::locks::EOF,
            pid: 77,
        }))),
        Err(Failure::Fs(FsError::Access)),
        Err(Failure::NoSession),
        Err(Failure::NotPrimary),
        Err(Failure::Unavailable("the group is re-forming".into())),
    ]
}

#[test]
fn requests_round_trip_and_every_cut_is_refused() {
    for op in sample_ops() {
        let req = Request {
            session: ClientId(1),
            seq: 2,
            who: Identity {
                uid: 1000,
                gid: 1000,
                groups: vec![27],
            },
            op,
        };
        let bytes = req.encode();
        assert_eq!(Request::decode(&bytes), Ok(req));
        for cut in 0..bytes.len() {
            assert!(Request::decode(&bytes[..cut]).is_err());
        }
    }
}

#[test]
fn replies_round_trip_and_every_cut_is_refused() {
    for reply in sample_replies() {
        let bytes = encode_reply(&reply);
        assert_eq!(decode_reply(&bytes), Ok(reply));
        for cut in 0..bytes.len() {
            assert!(decode_reply(&bytes[..cut]).is_err());
        }
    }
}

#[test]
fn oversized_io_is_refused() {
    let req = Request {
        session: ClientId(1),
        seq: 1,
        who: Identity::root(),
        op: Op::Read {
            ino: Ino(2),
            offset: 0,
            len: IO_MAX as u32 + 1,
        },
    };
    assert!(Request::decode(&req.encode()).is_err());
    let req = Request {
        op: Op::Write {
            ino: Ino(2),
            offset: Some(0),
            data: vec![0; IO_MAX + 1],
        },
        ..req
    };
    assert!(Request::decode(&req.encode()).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(req) = Request::decode(&bytes) {
            prop_assert_eq!(Request::decode(&req.encode()), Ok(req));
        }
        if let Ok(reply) = decode_reply(&bytes) {
            prop_assert_eq!(decode_reply(&encode_reply(&reply)), Ok(reply));
        }
    }
}
