//! The directory's two-phase-commit baseline (two replicas; moved here
//! from `shoal-dirsvc` with the baseline) on two in-process node daemons
//! on loopback: writes at either replica reach both, writes
//! at both at once are ordered alike, a stopped replica's peer goes on
//! alone and the restarted replica copies its state, and both recover
//! from their disks after both stopped.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use shoal_bench::dir::twopc::{TwoPc, TwoPcConfig};
use shoal_cap::Capability;
use shoal_dir::{Answer, DirError, Op, Request, Response};
use shoal_dirsvc::DirClient;
use shoal_rpc::Context;

const SERVICE: &str = "twopc-test";

/// Two node daemons that know each other, and a context on each.
struct Nodes {
    nodes: shoal_testnodes::Nodes,
    ctx: Vec<Context>,
}

impl Nodes {
    fn up() -> Nodes {
        let nodes = shoal_testnodes::Nodes::up(2);
        let ctx = nodes.ctx.clone();
        Nodes { nodes, ctx }
    }

    fn data(&self, i: usize) -> PathBuf {
        self.nodes.path(&format!("data{i}"))
    }

    fn start(&self, i: usize) -> TwoPc {
        start(&self.ctx[i], i, &self.data(i))
    }
}

fn start(ctx: &Context, i: usize, data: &Path) -> TwoPc {
    let mut cfg = TwoPcConfig::new(i, data.to_path_buf());
    cfg.service = SERVICE.into();
    TwoPc::start(ctx.clone(), cfg).unwrap()
}

fn wait_paired(replicas: &[&TwoPc]) {
    let until = Instant::now() + Duration::from_secs(30);
    while replicas.iter().any(|r| r.status()["phase"] != "paired") {
        assert!(
            Instant::now() < until,
            "replicas not paired within 30 s: {:?}",
            replicas.iter().map(|r| r.status()).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A client session that aims at a replica of its choice.
struct Session {
    client: u64,
    seq: u64,
    seen: u64,
}

impl Session {
    fn new(client: u64) -> Session {
        Session {
            client,
            seq: 0,
            seen: 0,
        }
    }

    fn call(&mut self, at: &TwoPc, op: Op) -> Result<Answer, DirError> {
        if op.is_write() {
            self.seq += 1;
        }
        let r: Response = at.execute(Request {
            client: self.client,
            seq: self.seq,
            min_index: self.seen,
            flags: 0,
            op,
        });
        self.seen = self.seen.max(r.index);
        r.result
    }

    fn append(&mut self, at: &TwoPc, dir: &Capability, name: &str) {
        let a = self.call(
            at,
            Op::Append {
                dir: *dir,
                name: name.into(),
                caps: vec![*dir],
                masks: shoal_dir::model::default_masks(3),
            },
        );
        assert_eq!(a, Ok(Answer::Done), "append {name}");
    }

    fn names(&mut self, at: &TwoPc, dir: &Capability) -> Vec<String> {
        match self.call(at, Op::List { dir: *dir }) {
            Ok(Answer::Listing { rows, .. }) => rows.into_iter().map(|(n, _)| n).collect(),
            other => panic!("list: {other:?}"),
        }
    }
}

fn create_dir(s: &mut Session, at: &TwoPc) -> Capability {
    match s.call(
        at,
        Op::CreateDir {
            columns: vec![b"owner".to_vec(), b"group".to_vec(), b"other".to_vec()],
            secret: [0; 32],
        },
    ) {
        Ok(Answer::Cap(c)) => c,
        other => panic!("create-dir: {other:?}"),
    }
}

#[test]
fn writes_reach_both_and_a_restarted_replica_catches_up() {
    let nodes = Nodes::up();
    let a = nodes.start(0);
    let mut b = nodes.start(1);
    wait_paired(&[&a, &b]);

    // Writes at either replica are visible at both.
    let mut s = Session::new(11);
    let root = create_dir(&mut s, &a);
    s.append(&b, &root, "from-b");
    s.append(&a, &root, "from-a");
    assert_eq!(s.names(&a, &root), ["from-a", "from-b"]);
    assert_eq!(s.names(&b, &root), ["from-a", "from-b"]);

    // The unchanged client library, through the service port.
    let mut client = DirClient::with_port(&nodes.ctx[0], a.port()).unwrap();
    client.append(&root, "by-rpc", &[root], None).unwrap();
    assert_eq!(client.lookup(&root, "by-rpc").unwrap(), vec![root]);
    let mut fresh = Session::new(12);
    fresh.seen = client.seen();
    assert_eq!(fresh.names(&b, &root), ["by-rpc", "from-a", "from-b"]);

    // Writes at both replicas at once: both apply them in one order.
    std::thread::scope(|sc| {
        for (k, r) in [&a, &b].into_iter().enumerate() {
            sc.spawn(move || {
                let mut s = Session::new(100 + k as u64);
                for i in 0..40 {
                    s.append(r, &root, &format!("c{k}-{i}"));
                }
            });
        }
    });
    assert_eq!(a.status()["index"], b.status()["index"]);
    let mut s2 = Session::new(13);
    s2.seen = a.status()["index"].as_u64().unwrap();
    let all = s2.names(&a, &root);
    assert_eq!(all.len(), 83);
    assert_eq!(s2.names(&b, &root), all);

    // B stops: A goes on alone.
    b.stop();
    s.append(&a, &root, "while-b-was-down");
    assert_eq!(a.status()["phase"], "alone");
    assert!(a.status()["alone_writes"].as_u64().unwrap() >= 1);

    // B restarts from its disk and copies A's state before serving.
    b = nodes.start(1);
    wait_paired(&[&a, &b]);
    let mut late = Session::new(14);
    late.seen = a.status()["index"].as_u64().unwrap();
    assert!(
        late.names(&b, &root)
            .contains(&"while-b-was-down".to_string())
    );
    assert_eq!(a.status()["index"], b.status()["index"]);

    // And B's writes reach A again.
    s.call(
        &b,
        Op::Delete {
            dir: root,
            name: b"from-a".to_vec(),
        },
    )
    .unwrap();
    assert_eq!(
        s.call(
            &a,
            Op::Lookup {
                dir: root,
                name: b"from-a".to_vec(),
            }
        ),
        Err(DirError::NotFound("from-a".into()))
    );

    // Both stop; both recover from their disks and pair again.
    let index = a.status()["index"].clone();
    let before = s.names(&a, &root);
    a.stop();
    b.stop();
    let a = nodes.start(0);
    let b = nodes.start(1);
    wait_paired(&[&a, &b]);
    assert_eq!(a.status()["index"], index);
    assert_eq!(b.status()["index"], index);
    assert_eq!(s.names(&a, &root), before);
    assert_eq!(s.names(&b, &root), before);
    a.stop();
    b.stop();
}
