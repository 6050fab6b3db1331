//! The directory state machine: every operation, every error, rights, the
//! snapshot and log formats.

use proptest::prelude::*;
use shoal_cap::{Capability, GetPort, ObjectId, ObjectSecret, PutPort, Rights};
use shoal_dir::log::{self, LogBuffer, LogRecord};
use shoal_dir::model::{self, COLUMNS, DESTROY, MODIFY, column};
use shoal_dir::*;

fn port() -> PutPort {
    GetPort::derive(&[7; 32], "test dir").put_port()
}

/// A foreign object's capability (what rows name).
fn obj(n: u64) -> Capability {
    let p = GetPort::derive(&[9; 32], "test objects").put_port();
    Capability::mint(
        p,
        ObjectId::new(n),
        Rights::ALL,
        &ObjectSecret::from_bytes([n as u8; 32]),
    )
}

struct T {
    s: DirState,
    seq: u64,
}

impl T {
    fn new() -> T {
        T {
            s: DirState::new(port()),
            seq: 0,
        }
    }
    /// The client's next request.
    fn next(&mut self, op: Op) -> Request {
        self.seq += 1;
        Request {
            client: 1,
            seq: self.seq,
            min_index: 0,
            flags: 0,
            op,
        }
    }
    fn w(&mut self, op: Op) -> Result<Answer, DirError> {
        let req = self.next(op);
        self.s.apply(&req).response().result.clone()
    }
    /// Appends `name` to `dir` and deletes it again, logging both in `buf`.
    fn append_delete(&mut self, dir: Capability, name: &[u8], buf: &mut LogBuffer) {
        let append = Op::Append {
            dir,
            name: name.to_vec(),
            caps: vec![obj(1)],
            masks: vec![Rights::ALL; 3],
        };
        let delete = Op::Delete {
            dir,
            name: name.to_vec(),
        };
        for op in [append, delete] {
            let req = self.next(op);
            let r = self.s.apply(&req);
            buf.push(r.response().index, &req, &req.encode());
        }
    }
    fn mkdir(&mut self) -> Capability {
        match self.w(Op::CreateDir {
            columns: vec![b"owner".to_vec(), b"group".to_vec(), b"other".to_vec()],
            secret: [self.seq as u8 + 1; 32],
        }) {
            Ok(Answer::Cap(c)) => c,
            r => panic!("mkdir: {r:?}"),
        }
    }
    fn append(&mut self, dir: Capability, name: &str, cap: Capability) -> Result<Answer, DirError> {
        self.w(Op::Append {
            dir,
            name: name.into(),
            caps: vec![cap],
            masks: vec![Rights::ALL, Rights::READ, Rights::NONE],
        })
    }
    fn lookup(&self, dir: Capability, name: &str) -> Result<Vec<Capability>, DirError> {
        match self.s.read(&Op::Lookup {
            dir,
            name: name.into(),
        })? {
            Answer::Caps(c) => Ok(c),
            a => panic!("{a:?}"),
        }
    }
}

#[test]
fn every_operation() {
    let mut t = T::new();
    let d = t.mkdir();
    let e = t.mkdir();
    assert_eq!(t.append(d, "foo", obj(1)), Ok(Answer::Done));
    assert_eq!(t.lookup(d, "foo").unwrap(), vec![obj(1)]);
    // Column 1 ("group") sees read only.
    let g = d.restrict(column(1)).unwrap();
    assert_eq!(t.lookup(g, "foo").unwrap()[0].rights(), Rights::READ);
    // Column 2 ("other") sees no rights at all.
    let o = d.restrict(column(2)).unwrap();
    assert_eq!(t.lookup(o, "foo").unwrap()[0].rights(), Rights::NONE);
    // List and get masks.
    match t.s.read(&Op::List { dir: d }).unwrap() {
        Answer::Listing { columns, rows } => {
            assert_eq!(columns, ["owner", "group", "other"]);
            assert_eq!(rows.len(), 1);
            assert_eq!(rows[0].0, "foo");
        }
        a => panic!("{a:?}"),
    }
    assert_eq!(
        t.s.read(&Op::GetMasks {
            dir: d,
            name: b"foo".to_vec()
        }),
        Ok(Answer::Masks(vec![Rights::ALL, Rights::READ, Rights::NONE]))
    );
    // Replace: compare-and-swap.
    assert_eq!(
        t.w(Op::Replace {
            dir: d,
            name: b"foo".to_vec(),
            expect: vec![obj(9)],
            caps: vec![obj(2)]
        }),
        Err(DirError::Conflict("foo".into()))
    );
    assert_eq!(
        t.w(Op::Replace {
            dir: d,
            name: b"foo".to_vec(),
            expect: vec![obj(1)],
            caps: vec![obj(2), obj(3)]
        }),
        Ok(Answer::Done)
    );
    assert_eq!(t.lookup(d, "foo").unwrap(), vec![obj(2), obj(3)]);
    // Chmod.
    t.w(Op::Chmod {
        dir: d,
        name: b"foo".to_vec(),
        masks: vec![Rights::ALL, Rights::ALL, Rights::READ],
    })
    .unwrap();
    assert_eq!(t.lookup(o, "foo").unwrap()[0].rights(), Rights::READ);
    // Batched lookup.
    match t
        .s
        .read(&Op::LookupMany {
            dir: d,
            names: vec![b"foo".to_vec(), b"nope".to_vec()],
        })
        .unwrap()
    {
        Answer::Many(r) => {
            assert_eq!(r[0], Ok(vec![obj(2), obj(3)]));
            assert_eq!(r[1], Err(DirError::NotFound("nope".into())));
        }
        a => panic!("{a:?}"),
    }
    // Path lookup: d/sub/bar, rights restricted at every step.
    t.w(Op::Append {
        dir: d,
        name: b"sub".to_vec(),
        caps: vec![e],
        masks: vec![Rights::ALL, column(1).union(column(2)), column(2)],
    })
    .unwrap();
    t.append(e, "bar", obj(5)).unwrap();
    let path = |t: &T, dir, p: &str| {
        t.s.read(&Op::PathLookup {
            dir,
            path: p.into(),
        })
    };
    assert_eq!(path(&t, d, "sub/bar"), Ok(Answer::Caps(vec![obj(5)])));
    assert_eq!(path(&t, d, "/sub//bar"), Ok(Answer::Caps(vec![obj(5)])));
    // Through "other": sub is reached with column 2 only, where bar's mask is NONE.
    match path(&t, o, "sub/bar").unwrap() {
        Answer::Caps(c) => assert_eq!(c[0].rights(), Rights::NONE),
        a => panic!("{a:?}"),
    }
    assert_eq!(
        path(&t, d, "foo/bar"),
        Err(DirError::NotADirectory("foo".into()))
    );
    // Install: atomic move from d to e.
    assert_eq!(
        t.w(Op::Install {
            items: vec![
                InstallItem {
                    dir: d,
                    name: b"foo".to_vec(),
                    expect: Expect::Caps(vec![obj(2), obj(3)]),
                    new: None
                },
                InstallItem {
                    dir: e,
                    name: b"foo2".to_vec(),
                    expect: Expect::Absent,
                    new: Some((vec![obj(2)], vec![Rights::ALL; 3]))
                },
            ]
        }),
        Ok(Answer::Done)
    );
    assert_eq!(t.lookup(d, "foo"), Err(DirError::NotFound("foo".into())));
    assert_eq!(t.lookup(e, "foo2").unwrap(), vec![obj(2)]);
    // A failing item leaves everything as it was.
    let before = t.s.clone();
    assert_eq!(
        t.w(Op::Install {
            items: vec![
                InstallItem {
                    dir: e,
                    name: b"bar".to_vec(),
                    expect: Expect::Any,
                    new: None
                },
                InstallItem {
                    dir: d,
                    name: b"sub".to_vec(),
                    expect: Expect::Absent,
                    new: Some((vec![obj(1)], vec![Rights::ALL; 3]))
                },
            ]
        }),
        Err(DirError::Exists("sub".into()))
    );
    assert_eq!(t.lookup(e, "bar").unwrap(), vec![obj(5)]);
    assert_eq!(t.s.dir_count(), before.dir_count());
    assert_eq!(t.s.row_count(), before.row_count());
    // Delete rows, then the directory.
    assert_eq!(t.w(Op::DeleteDir { dir: e }), Err(DirError::NotEmpty(2)));
    t.w(Op::Delete {
        dir: e,
        name: b"bar".to_vec(),
    })
    .unwrap();
    t.w(Op::Delete {
        dir: e,
        name: b"foo2".to_vec(),
    })
    .unwrap();
    assert_eq!(t.w(Op::DeleteDir { dir: e }), Ok(Answer::Done));
    // The deleted directory's capability is now stale.
    assert_eq!(t.lookup(e, "bar"), Err(DirError::UnknownDirectory));
}

#[test]
fn every_error() {
    let mut t = T::new();
    let d = t.mkdir();
    // Forged: right object, wrong check.
    let forged = Capability::mint(
        port(),
        d.object(),
        Rights::ALL,
        &ObjectSecret::from_bytes([0; 32]),
    );
    assert_eq!(t.lookup(forged, "x"), Err(DirError::BadCapability));
    // Another service's capability.
    assert_eq!(t.lookup(obj(1), "x"), Err(DirError::UnknownDirectory));
    // Never created.
    let unknown = Capability::mint(
        port(),
        ObjectId::new(999),
        Rights::ALL,
        &ObjectSecret::from_bytes([1; 32]),
    );
    assert_eq!(t.lookup(unknown, "x"), Err(DirError::UnknownDirectory));
    let long = "x".repeat(model::MAX_NAME + 1);
    assert_eq!(
        t.append(d, &long, obj(1)),
        Err(DirError::NameTooLong { len: 256, max: 255 })
    );
    assert!(t.append(d, &"x".repeat(model::MAX_NAME), obj(1)).is_ok());
    assert!(matches!(
        t.w(Op::Append {
            dir: d,
            name: vec![0xff, 0xfe],
            caps: vec![obj(1)],
            masks: vec![Rights::ALL; 3]
        }),
        Err(DirError::BadName(m)) if m.contains("UTF-8")
    ));
    for bad in ["", "a/b", ".", "..", "a\0b"] {
        assert!(
            matches!(t.append(d, bad, obj(1)), Err(DirError::BadName(_))),
            "{bad:?}"
        );
    }
    t.append(d, "a", obj(1)).unwrap();
    assert_eq!(t.append(d, "a", obj(1)), Err(DirError::Exists("a".into())));
    assert_eq!(
        t.w(Op::Delete {
            dir: d,
            name: b"zz".to_vec()
        }),
        Err(DirError::NotFound("zz".into()))
    );
    assert!(matches!(
        t.w(Op::Append {
            dir: d,
            name: b"m".to_vec(),
            caps: vec![obj(1)],
            masks: vec![Rights::ALL]
        }),
        Err(DirError::BadRequest(_))
    ));
    assert!(matches!(
        t.w(Op::Append {
            dir: d,
            name: b"m".to_vec(),
            caps: vec![obj(1); 17],
            masks: vec![Rights::ALL; 3]
        }),
        Err(DirError::TooLarge(_))
    ));
}

#[test]
fn retried_writes_apply_once() {
    let mut s = DirState::new(port());
    let mk = Request {
        client: 5,
        seq: 1,
        min_index: 0,
        flags: 0,
        op: Op::CreateDir {
            columns: vec![b"owner".to_vec()],
            secret: [3; 32],
        },
    };
    let first = s.apply(&mk);
    assert!(matches!(first, Applied::New(_)));
    let again = s.apply(&mk);
    assert_eq!(again, Applied::Duplicate(first.response().clone()));
    assert_eq!(s.index(), 1);
    assert_eq!(s.dir_count(), 1);
    let mut next = mk.clone();
    next.seq = 2;
    s.apply(&next);
    assert!(matches!(
        s.apply(&mk).response().result,
        Err(DirError::Superseded(1))
    ));
}

/// Rights bits of a directory capability that an operation needs.
fn needs(op: &Op) -> Rights {
    match op {
        Op::DeleteDir { .. } => DESTROY,
        Op::Append { .. } | Op::Delete { .. } | Op::Replace { .. } | Op::Chmod { .. } => MODIFY,
        _ => Rights::NONE,
    }
}

proptest! {
    /// A restricted capability never does more than its rights allow: a
    /// write without MODIFY (or DESTROY) is denied and changes nothing; a
    /// read without a usable column is denied; what a lookup returns never
    /// has more rights than the union of the usable columns' masks, nor
    /// than the stored capability.
    #[test]
    fn rights_are_never_exceeded(
        rights in any::<u8>(),
        masks in proptest::collection::vec(any::<u8>(), 3),
        stored in any::<u8>(),
        which in 0usize..7,
    ) {
        let mut t = T::new();
        let d = t.mkdir();
        let stored_cap = obj(1).restrict(Rights::from_bits(stored)).unwrap();
        t.w(Op::Append {
            dir: d,
            name: b"x".to_vec(),
            caps: vec![stored_cap],
            masks: masks.iter().map(|&m| Rights::from_bits(m)).collect(),
        }).unwrap();
        let r = d.restrict(Rights::from_bits(rights)).unwrap();
        let have = r.rights();
        let usable = have.bits() & 0x07;
        let union = (0..3).filter(|i| usable & (1 << i) != 0)
            .fold(0u8, |a, i| a | masks[i]);
        let ops = [
            Op::Lookup { dir: r, name: b"x".to_vec() },
            Op::List { dir: r },
            Op::GetMasks { dir: r, name: b"x".to_vec() },
            Op::Append { dir: r, name: b"y".to_vec(), caps: vec![obj(2)], masks: vec![Rights::ALL; 3] },
            Op::Delete { dir: r, name: b"x".to_vec() },
            Op::Chmod { dir: r, name: b"x".to_vec(), masks: vec![Rights::ALL; 3] },
            Op::DeleteDir { dir: r },
        ];
        let op = ops[which].clone();
        let before = t.s.clone();
        let result = if op.is_write() { t.w(op.clone()) } else { t.s.read(&op) };
        let need = needs(&op);
        if op.is_write() {
            if !have.contains(need) {
                prop_assert!(matches!(result, Err(DirError::Denied { .. })), "{result:?}");
                prop_assert_eq!(t.s.row_count(), before.row_count());
                prop_assert_eq!(t.s.dir_count(), before.dir_count());
            } else {
                prop_assert!(!matches!(result, Err(DirError::Denied { .. })), "{result:?}");
            }
        } else if usable == 0 {
            prop_assert!(matches!(result, Err(DirError::Denied { .. })), "{result:?}");
        } else if let Ok(Answer::Caps(c)) = &result {
            let got = c[0].rights();
            prop_assert!(got.is_subset_of(Rights::from_bits(union)));
            prop_assert!(got.is_subset_of(stored_cap.rights()));
            prop_assert_eq!(got, Rights::from_bits(union & stored_cap.rights().bits()));
        } else {
            prop_assert!(result.is_ok(), "{result:?}");
        }
        let _ = COLUMNS;
    }

    /// Random operations: the snapshot decodes to the same state, and a
    /// log of the successful writes replays to it too.
    #[test]
    fn snapshot_and_log_rebuild_the_state(ops in proptest::collection::vec((0u8..6, 0u8..6, 0u8..4), 1..80)) {
        let mut t = T::new();
        let dirs = [t.mkdir(), t.mkdir()];
        let start = t.s.clone();
        let mut buf = LogBuffer::new();
        for (kind, name, d) in ops {
            let dir = dirs[(d % 2) as usize];
            let name = vec![b'a' + name];
            let op = match kind {
                0 | 1 => Op::Append { dir, name, caps: vec![obj(kind as u64)], masks: vec![Rights::ALL; 3] },
                2 | 3 => Op::Delete { dir, name },
                4 => Op::Replace { dir, name, expect: vec![obj(0)], caps: vec![obj(1)] },
                _ => Op::Chmod { dir, name, masks: vec![Rights::READ; 3] },
            };
            t.seq += 1;
            let req = Request { client: 1, seq: t.seq, min_index: 0, flags: 0, op };
            let r = t.s.apply(&req);
            if r.response().result.is_ok() {
                buf.push(r.response().index, &req, &req.encode());
            } else {
                buf.note_refused(r.response().index);
            }
        }
        let snap = t.s.encode_snapshot();
        prop_assert_eq!(&DirState::decode_snapshot(&snap).unwrap(), &t.s);
        // Rebuild from the starting snapshot and the coalesced log.
        let mut file = log::header(start.index()).to_vec();
        if let Some(bytes) = buf.take(true) {
            file.extend_from_slice(&bytes);
        }
        let parsed = log::parse(&file).unwrap();
        prop_assert_eq!(parsed.valid_len, file.len());
        let snap = start.encode_snapshot();
        let rec = log::recover(port(), Some(&snap), &[(start.index(), &file)]).unwrap();
        prop_assert_eq!(&rec.keep, &vec![Some(file.len())]);
        let r = rec.state;
        prop_assert_eq!(r.index(), t.s.index());
        for d in dirs {
            prop_assert_eq!(&r.dir(d.object().get()).unwrap().rows, &t.s.dir(d.object().get()).unwrap().rows);
        }
        // A torn tail is cut off, never misread.
        if file.len() > log::LOG_HEADER + 1 {
            let cut = &file[..file.len() - 1];
            let p = log::parse(cut).unwrap();
            prop_assert!(p.valid_len < file.len());
        }
    }

    /// Decoders never panic.
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = Request::decode(&bytes);
        let _ = Response::decode(&bytes);
        let _ = DirState::decode_snapshot(&bytes);
        let _ = log::parse(&bytes);
    }
}

/// A torn newest log is cut; a torn older one is refused, because the
/// writes after the tear would be skipped while later logs still replay.
#[test]
fn only_the_newest_log_may_be_torn() {
    let mut t = T::new();
    let start = t.s.clone();
    let mut logs = Vec::new();
    for round in 0..2 {
        let base = t.s.index();
        let mut buf = LogBuffer::new();
        for _ in 0..3 {
            let dir = t.mkdir();
            t.seq += 1;
            let op = Op::Append {
                dir,
                name: vec![b'a' + round],
                caps: vec![obj(1)],
                masks: vec![Rights::ALL; 3],
            };
            let req = Request {
                client: 1,
                seq: t.seq,
                min_index: 0,
                flags: 0,
                op,
            };
            let r = t.s.apply(&req);
            buf.push(r.response().index, &req, &req.encode());
        }
        let mut file = log::header(base).to_vec();
        file.extend_from_slice(&buf.take(true).unwrap());
        logs.push((base, file));
    }
    let snap = start.encode_snapshot();
    let given = |logs: &[(u64, Vec<u8>)]| -> Vec<(u64, Vec<u8>)> { logs.to_vec() };
    let run = |logs: Vec<(u64, Vec<u8>)>| {
        let refs: Vec<(u64, &[u8])> = logs.iter().map(|(b, f)| (*b, f.as_slice())).collect();
        log::recover(port(), Some(&snap), &refs).map(|r| (r.state.index(), r.keep))
    };
    let (index, _) = run(given(&logs)).unwrap();
    assert_eq!(index, t.s.index());
    let mut torn_newest = given(&logs);
    let n = torn_newest[1].1.len();
    torn_newest[1].1.truncate(n - 1);
    let (_, keep) = run(torn_newest).unwrap();
    assert!(matches!(keep[1], Some(len) if len < n - 1));
    let mut torn_older = given(&logs);
    let n = torn_older[0].1.len();
    torn_older[0].1[n - 3] ^= 0xff;
    let err = run(torn_older).unwrap_err();
    assert!(err.to_string().contains("older than the newest"), "{err}");
    let mut headless = given(&logs);
    headless[0].1[0] = b'X';
    assert!(run(headless).is_err());
}

#[test]
fn temporary_names_cancel_out_in_the_log() {
    let mut t = T::new();
    let d = t.mkdir();
    let mut buf = LogBuffer::new();
    for i in 0..100 {
        t.append_delete(d, format!("tmp{i}").as_bytes(), &mut buf);
    }
    assert_eq!(buf.cancelled_pairs, 100);
    assert_eq!(buf.take(false), None, "nothing reaches the disk");
    t.append_delete(d, b"x", &mut buf);
    // With marks (the fsync mode) the sessions of the two writes and the
    // index are written, so a retry after recovery is answered, not
    // applied again.
    let bytes = buf.take(true).unwrap();
    let mut file = log::header(0).to_vec();
    file.extend_from_slice(&bytes);
    let index = t.s.index();
    assert_eq!(
        log::parse(&file).unwrap().records,
        vec![
            LogRecord::Session {
                index: index - 1,
                client: 1,
                seq: t.seq - 1
            },
            LogRecord::Session {
                index,
                client: 1,
                seq: t.seq
            },
            LogRecord::Mark { index },
        ]
    );
}

#[test]
fn requests_and_responses_round_trip() {
    let d = obj(1);
    let ops = vec![
        Op::CreateDir {
            columns: vec![b"a".to_vec()],
            secret: [1; 32],
        },
        Op::DeleteDir { dir: d },
        Op::List { dir: d },
        Op::Lookup {
            dir: d,
            name: b"n".to_vec(),
        },
        Op::PathLookup {
            dir: d,
            path: b"a/b".to_vec(),
        },
        Op::Append {
            dir: d,
            name: b"n".to_vec(),
            caps: vec![d, d],
            masks: vec![Rights::ALL],
        },
        Op::Delete {
            dir: d,
            name: b"n".to_vec(),
        },
        Op::Replace {
            dir: d,
            name: b"n".to_vec(),
            expect: vec![d],
            caps: vec![],
        },
        Op::Chmod {
            dir: d,
            name: b"n".to_vec(),
            masks: vec![Rights::READ; 4],
        },
        Op::GetMasks {
            dir: d,
            name: b"n".to_vec(),
        },
        Op::LookupMany {
            dir: d,
            names: vec![b"a".to_vec(), b"b".to_vec()],
        },
        Op::Install {
            items: vec![InstallItem {
                dir: d,
                name: b"n".to_vec(),
                expect: Expect::Caps(vec![d]),
                new: Some((vec![d], vec![Rights::ALL])),
            }],
        },
        Op::Sync,
        Op::Status,
    ];
    for op in ops {
        let req = Request {
            client: 1,
            seq: 2,
            min_index: 3,
            flags: 1,
            op,
        };
        assert_eq!(Request::decode(&req.encode()).unwrap(), req);
    }
    let answers = vec![
        Ok(Answer::Done),
        Ok(Answer::Cap(d)),
        Ok(Answer::Caps(vec![d])),
        Ok(Answer::Listing {
            columns: vec!["o".into()],
            rows: vec![("x".into(), vec![Rights::ALL])],
        }),
        Ok(Answer::Masks(vec![Rights::READ])),
        Ok(Answer::Many(vec![
            Ok(vec![d]),
            Err(DirError::NotFound("q".into())),
        ])),
        Ok(Answer::Status("{}".into())),
        Err(DirError::Denied {
            have: Rights::READ,
            need: MODIFY,
        }),
        Err(DirError::Behind { have: 1, want: 2 }),
        Err(DirError::NameTooLong { len: 300, max: 255 }),
    ];
    for result in answers {
        let r = Response { index: 9, result };
        assert_eq!(Response::decode(&r.encode()).unwrap(), r);
    }
}

/// An error's text on the wire is at most 1,024 bytes; one of invalid
/// UTF-8 decodes with replacement characters (three bytes each), cut
/// again at a character boundary, so what was decoded encodes back to
/// itself (a case the fuzzer found).
#[test]
fn an_error_text_of_invalid_utf8_round_trips_once_decoded() {
    let long = Response {
        index: 1,
        result: Err(DirError::Conflict("é".repeat(700))),
    };
    let once = Response::decode(&long.encode()).unwrap();
    let Err(DirError::Conflict(text)) = &once.result else {
        panic!("{once:?}");
    };
    assert!(text.len() <= 1024 && text.chars().all(|c| c == 'é'));
    assert_eq!(Response::decode(&once.encode()).unwrap(), once);
    // The same answer with a text of 1,024 invalid bytes (the text is
    // the last field: its 1,024 bytes, after its u16 length).
    let mut wire = long.encode();
    wire.truncate(wire.len() - 1024 - 2);
    wire.extend_from_slice(&1024u16.to_le_bytes());
    wire.extend(std::iter::repeat_n(0xffu8, 1024));
    let r = Response::decode(&wire).unwrap();
    assert_eq!(Response::decode(&r.encode()).unwrap(), r);
}

/// The operations the property test does not draw, each with too few
/// rights: replace and install need MODIFY in every directory they touch;
/// batched and path lookups restrict like single lookups.
#[test]
fn rights_of_replace_install_and_batched_lookups() {
    let mut t = T::new();
    let d = t.mkdir();
    let e = t.mkdir();
    t.append(d, "x", obj(1)).unwrap();
    let read_only = d.restrict(COLUMNS).unwrap();
    assert!(matches!(
        t.w(Op::Replace {
            dir: read_only,
            name: b"x".to_vec(),
            expect: vec![obj(1)],
            caps: vec![obj(2)]
        }),
        Err(DirError::Denied { .. })
    ));
    // An install is refused whole if one of its directories lacks MODIFY.
    let before = t.s.row_count();
    assert!(matches!(
        t.w(Op::Install {
            items: vec![
                InstallItem {
                    dir: e,
                    name: b"y".to_vec(),
                    expect: Expect::Absent,
                    new: Some((vec![obj(3)], vec![Rights::ALL; 3]))
                },
                InstallItem {
                    dir: read_only,
                    name: b"x".to_vec(),
                    expect: Expect::Any,
                    new: None
                },
            ]
        }),
        Err(DirError::Denied { .. })
    ));
    assert_eq!(t.s.row_count(), before);
    // Batched lookup through "other" (column 2): its mask is NONE.
    let other = d.restrict(column(2)).unwrap();
    match t
        .s
        .read(&Op::LookupMany {
            dir: other,
            names: vec![b"x".to_vec()],
        })
        .unwrap()
    {
        Answer::Many(r) => assert_eq!(r[0].as_ref().unwrap()[0].rights(), Rights::NONE),
        a => panic!("{a:?}"),
    }
    // Without any column, batched and path lookups are refused.
    let none = d.restrict(MODIFY).unwrap();
    assert!(matches!(
        t.s.read(&Op::LookupMany {
            dir: none,
            names: vec![b"x".to_vec()]
        }),
        Err(DirError::Denied { .. })
    ));
    assert!(matches!(
        t.s.read(&Op::PathLookup {
            dir: none,
            path: b"x".to_vec()
        }),
        Err(DirError::Denied { .. })
    ));
    // A restricted capability never yields more rights through a path.
    t.w(Op::Append {
        dir: d,
        name: b"sub".to_vec(),
        caps: vec![e],
        masks: model::directory_masks(3),
    })
    .unwrap();
    t.append(e, "z", obj(4)).unwrap();
    for cols in [column(0), column(1), column(2)] {
        let r = d.restrict(cols).unwrap();
        if let Ok(Answer::Caps(c)) = t.s.read(&Op::PathLookup {
            dir: r,
            path: b"sub/z".to_vec(),
        }) {
            let direct = t.lookup(e.restrict(cols).unwrap(), "z").unwrap();
            assert!(c[0].rights().is_subset_of(direct[0].rights()));
        }
    }
}
