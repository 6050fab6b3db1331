//! The soft state's steps over a one-replica tree: answers now and
//! later, recalls, the grace period, leases and root squash.

use std::time::Duration;

use shoal_cap::{Capability, PutPort};
use shoal_time::Time;

use super::{Config, Flush, GRACE, Shell, Soft};
use crate::model::{FsError, Identity, Ino, Kind, ROOT, Timestamp};
use crate::op::{Failure, Op, Reply, Request};
use crate::tokens::{Callback, ClientId, LEASE, Level, OpenId, Want};
use crate::tree::Tree;
use crate::update::{Answer, Update, UpdateOp};
use crate::{Applied, tree};

struct One {
    tree: Tree,
    clock: u64,
    stored: usize,
}

impl Shell for One {
    fn read<T>(&self, f: impl FnOnce(&Tree) -> T) -> T {
        f(&self.tree)
    }
    fn order(&mut self, u: &Update) -> Result<Result<Answer, FsError>, Failure> {
        Ok(match self.tree.apply(u) {
            Applied::New(r) | Applied::Duplicate(r) => r,
        })
    }
    fn wall(&mut self) -> Timestamp {
        self.clock += 1;
        Timestamp::new(self.clock as i64, 0)
    }
    fn secret(&mut self) -> [u8; 16] {
        [9; 16]
    }
    fn read_content(&mut self, _: &[Capability], _: u64, _: u32) -> Result<Vec<u8>, Failure> {
        Ok(Vec::new())
    }
    fn store(&mut self, _: Ino, f: &Flush<'_>) -> Result<(Vec<Capability>, u64), Failure> {
        self.stored += 1;
        Ok((Vec::new(), f.size))
    }
}

const A: u64 = 3;
const B: u64 = 5;

/// A tree with one file (its inode), a primary started at time 0 whose
/// grace period has ended, and clients `A` and `B` said hello.
fn set_up(allow_root: bool) -> (One, Soft<u32>, Ino) {
    let mut w = One {
        tree: Tree::new([0; 16], Timestamp::new(0, 0)),
        clock: 0,
        stored: 0,
    };
    let up = |w: &mut One, seq, op| {
        let u = Update {
            session: ClientId(1),
            seq,
            who: Identity::root(),
            now: Timestamp::new(0, 0),
            op,
        };
        match w.tree.apply(&u) {
            Applied::New(r) | Applied::Duplicate(r) => r.expect("set-up"),
        }
    };
    let Answer::Range { first, .. } = up(&mut w, 1, UpdateOp::Range { count: 8 }) else {
        panic!("a range")
    };
    let create = UpdateOp::Create {
        parent: ROOT,
        name: b"f".to_vec(),
        kind: Kind::File,
        perm: 0o644,
        rdev: 0,
        ino: first,
        secret: [1; 16],
        target: Vec::new(),
        excl: true,
    };
    up(&mut w, 2, create);
    let mut soft = Soft::new(Config {
        port: PutPort::from_bytes([3; 16]),
        servers: Vec::new(),
        copies: 2,
        allow_root,
        grace: GRACE,
    });
    soft.start(7, 1, Time::ZERO);
    soft.tick(&mut w, Time::ZERO + GRACE);
    for c in [A, B] {
        let hello = Op::Hello {
            instance: [0; 16],
            node: b"n".to_vec(),
        };
        soft.request(&mut w, Time::ZERO + GRACE, 0, req(c, hello));
    }
    assert!(matches!(
        &soft.answers()[..],
        [(0, Ok(Reply::Hello { .. })), (0, Ok(Reply::Hello { .. }))]
    ));
    (w, soft, first)
}

fn req(session: u64, op: Op) -> Request {
    Request {
        session: ClientId(session),
        seq: 0,
        who: Identity::root(),
        op,
    }
}

/// Session `session`'s events request, confirming nothing (it renews the
/// lease).
fn events(session: u64) -> Request {
    req(
        session,
        Op::Events {
            confirm: Vec::new(),
        },
    )
}

fn open(ino: Ino, want: Want, id: u64) -> Op {
    Op::Open {
        ino,
        want,
        have: Vec::new(),
        id: OpenId(id),
        cached: None,
    }
}

#[test]
fn a_replica_not_started_answers_not_the_primary() {
    let (mut w, _, ino) = set_up(true);
    let mut soft: Soft<u32> = Soft::new(Config {
        port: PutPort::from_bytes([3; 16]),
        servers: Vec::new(),
        copies: 1,
        allow_root: true,
        grace: Duration::ZERO,
    });
    soft.request(&mut w, Time::ZERO, 1, req(A, Op::GetAttr { ino }));
    assert_eq!(soft.answers(), vec![(1, Err(Failure::NotPrimary))]);
}

#[test]
fn a_conflicting_open_waits_for_the_recall_and_its_answer() {
    let (mut w, mut soft, ino) = set_up(true);
    let now = Time::ZERO + GRACE + Duration::from_micros(1);
    soft.request(&mut w, now, 1, req(A, open(ino, Want::OpenWrite, 1)));
    let grant = match &soft.answers()[..] {
        [(1, Ok(Reply::Opened { grant, .. }))] => *grant,
        other => panic!("{other:?}"),
    };
    assert_eq!(grant.level, Level::Write);
    // A's events request is parked; B's open recalls A's token.
    soft.request(&mut w, now, 2, events(A));
    assert!(soft.answers().is_empty());
    soft.request(&mut w, now, 3, req(B, open(ino, Want::OpenRead, 2)));
    let answers = soft.answers();
    let recall = match &answers[..] {
        [(2, Ok(Reply::Events(cbs)))] => cbs.clone(),
        other => panic!("B's open answered before the recall: {other:?}"),
    };
    let Some(Callback::Recall { grant: g, .. }) = recall.first().cloned() else {
        panic!("no recall: {recall:?}")
    };
    assert!(soft.is_waiting());
    // A answers, keeping its open: B's open goes uncached.
    let ret = Op::Return {
        ino,
        grant: g,
        kept: Level::None,
        opens: vec![(OpenId(1), true)],
    };
    soft.request(&mut w, now, 4, req(A, ret));
    let answers = soft.answers();
    assert!(
        answers
            .iter()
            .any(|(h, r)| *h == 4 && *r == Ok(Reply::Done))
    );
    assert!(
        answers
            .iter()
            .any(|(h, r)| *h == 3 && matches!(r, Ok(Reply::Opened { grant, .. }) if grant.uncached)),
        "{answers:?}"
    );
    assert!(!soft.is_waiting());
}

#[test]
fn a_new_primary_grants_nothing_until_its_grace_period_ends() {
    let (mut w, mut soft, ino) = set_up(true);
    soft.start(8, 2, Time(10));
    soft.request(&mut w, Time(10), 1, req(A, Op::GetAttr { ino }));
    assert_eq!(soft.answers(), vec![(1, Err(Failure::NoSession))]);
    let hello = Op::Hello {
        instance: [0; 16],
        node: b"n".to_vec(),
    };
    soft.request(&mut w, Time(10), 2, req(A, hello));
    soft.answers();
    soft.request(&mut w, Time(10), 3, req(A, open(ino, Want::OpenRead, 1)));
    assert!(soft.answers().is_empty(), "granted in the grace period");
    soft.tick(&mut w, Time(10) + GRACE / 2);
    assert!(soft.answers().is_empty());
    soft.tick(&mut w, Time(10) + GRACE);
    assert!(matches!(
        &soft.answers()[..],
        [(3, Ok(Reply::Opened { .. }))]
    ));
}

#[test]
fn a_lease_that_runs_out_frees_what_its_client_held() {
    let (mut w, mut soft, ino) = set_up(true);
    let now = Time::ZERO + GRACE + Duration::from_micros(1);
    soft.request(&mut w, now, 1, req(A, open(ino, Want::OpenWrite, 1)));
    soft.answers();
    soft.request(&mut w, now, 2, req(B, open(ino, Want::OpenWrite, 2)));
    assert!(soft.answers().is_empty());
    // B renews (its events request); A never answers and its lease ends.
    let later = now + LEASE / 2;
    soft.request(&mut w, later, 3, events(B));
    soft.tick(&mut w, now + LEASE);
    let answers = soft.answers();
    assert!(
        answers.iter().any(|(h, r)| *h == 2
            && matches!(r, Ok(Reply::Opened { grant, .. }) if grant.level == Level::Write)),
        "{answers:?}"
    );
    soft.request(&mut w, now + LEASE, 4, req(A, Op::GetAttr { ino }));
    assert_eq!(soft.answers(), vec![(4, Err(Failure::NoSession))]);
}

#[test]
fn root_is_squashed_unless_allowed() {
    let (mut w, mut soft, ino) = set_up(false);
    // The file is 0644 root's: nobody may not write it.
    soft.request(
        &mut w,
        Time::ZERO + GRACE,
        1,
        req(A, open(ino, Want::OpenWrite, 1)),
    );
    assert_eq!(soft.answers(), vec![(1, Err(Failure::Fs(FsError::Access)))]);
    let (mut w, mut soft, ino) = set_up(true);
    soft.request(
        &mut w,
        Time::ZERO + GRACE,
        1,
        req(A, open(ino, Want::OpenWrite, 1)),
    );
    assert!(matches!(
        &soft.answers()[..],
        [(1, Ok(Reply::Opened { .. }))]
    ));
}

#[test]
fn a_write_shared_files_overlay_is_stored_before_it_is_cached_again() {
    let (mut w, mut soft, ino) = set_up(true);
    let now = Time::ZERO + GRACE + Duration::from_micros(1);
    soft.request(&mut w, now, 1, req(A, open(ino, Want::OpenWrite, 1)));
    soft.request(&mut w, now, 2, events(B));
    soft.answers();
    // A keeps its open through B's recall: the file is write-shared.
    soft.request(&mut w, now, 3, events(A));
    soft.request(&mut w, now, 4, req(B, open(ino, Want::OpenWrite, 2)));
    let g = soft
        .answers()
        .into_iter()
        .find_map(|(_, r)| match r {
            Ok(Reply::Events(cbs)) => cbs.into_iter().find_map(|c| match c {
                Callback::Recall { grant, .. } => Some(grant),
                _ => None,
            }),
            _ => None,
        })
        .expect("a recall");
    let ret = Op::Return {
        ino,
        grant: g,
        kept: Level::None,
        opens: vec![(OpenId(1), true)],
    };
    soft.request(&mut w, now, 5, req(A, ret));
    soft.answers();
    let write = Op::Write {
        ino,
        offset: Some(0),
        data: b"x".to_vec(),
    };
    soft.request(&mut w, now, 6, req(B, write));
    assert!(matches!(
        &soft.answers()[..],
        [(6, Ok(Reply::Updated(Ok(Answer::Written { .. }))))]
    ));
    let overlay = |w: &One| match &w.tree.get(ino).expect("the file").body {
        tree::Body::File { overlay, .. } => overlay.len(),
        _ => unreachable!(),
    };
    assert_eq!(overlay(&w), 1);
    // Both close; the next open caches it again, from a stored version.
    soft.request(&mut w, now, 7, req(A, Op::Close { ino, id: OpenId(1) }));
    soft.request(&mut w, now, 8, req(B, Op::Close { ino, id: OpenId(2) }));
    soft.request(&mut w, now, 9, req(A, open(ino, Want::OpenRead, 3)));
    let answers = soft.answers();
    assert!(
        answers.iter().any(
            |(h, r)| *h == 9 && matches!(r, Ok(Reply::Opened { grant, .. }) if !grant.uncached)
        ),
        "{answers:?}"
    );
    assert_eq!(w.stored, 1);
    assert_eq!(overlay(&w), 0);
}
