//! The metadata service on three in-process node daemons: the replicas
//! form a group and one becomes the primary; two clients share a file
//! through it (a recall, then write sharing with reads and writes through
//! the primary), the primary is stopped and the next one serves the same
//! tree to clients that said hello again, and once the sharing ends the
//! bytes written while it lasted are in a content version on a file
//! server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use shoal_bulletsvc::{FileClient, FileServer, ServerConfig};
use shoal_fs::model::{Identity, Ino, Kind, ROOT};
use shoal_fs::op::{Failure, Op, Reply};
use shoal_fs::tokens::{Callback, Level, OpenId, Want};
use shoal_fs::update::{Answer, UpdateOp};
use shoal_fssvc::{FsClient, FsConfig, MetaReplica};
use shoal_replicasvc::Durability;
use shoal_testnodes::Nodes;

const NAME: &str = "fs-test";

fn start(nodes: &Nodes, i: usize, server: shoal_cap::Capability) -> MetaReplica {
    let mut cfg = FsConfig::new(NAME, i, 3, nodes.path(&format!("meta{i}")));
    cfg.replica.durability = Durability::Fsync;
    cfg.replica.snapshot_bytes = 4096;
    cfg.allow_root = true;
    cfg.file_servers = vec![server];
    cfg.copies = 1;
    MetaReplica::start(nodes.ctx[i].clone(), cfg).unwrap()
}

/// Waits until every running replica serves and one is the primary;
/// returns its index.
fn primary(replicas: &[Option<MetaReplica>]) -> usize {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let running: Vec<(usize, &MetaReplica)> = replicas
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((i, r.as_ref()?)))
            .collect();
        let serving = running.iter().all(|(_, r)| r.is_serving());
        let p: Vec<usize> = running
            .iter()
            .filter(|(_, r)| r.status()["primary"] == true)
            .map(|(i, _)| *i)
            .collect();
        if serving && p.len() == 1 {
            return p[0];
        }
        assert!(
            Instant::now() < until,
            "no primary within 60 s: {:?}",
            running.iter().map(|(_, r)| r.status()).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A client whose `Events` loop answers recalls at once (giving the
/// token down to what was asked, reporting `opens`) and records every
/// callback.
struct Mount {
    client: Arc<Mutex<FsClient>>,
    callbacks: Arc<Mutex<Vec<Callback>>>,
    opens: Arc<Mutex<Vec<(OpenId, bool)>>>,
    stop: Arc<AtomicBool>,
    events: Option<JoinHandle<()>>,
}

impl Mount {
    fn new(nodes: &Nodes, i: usize) -> Mount {
        let mut client = FsClient::new(&nodes.ctx[i], NAME).unwrap();
        client.hello(&format!("n{}", i + 1)).unwrap();
        // The events loop has its own session-less RPC client: it speaks
        // for the same session.
        let events_client = Arc::new(Mutex::new(client));
        let callbacks = Arc::new(Mutex::new(Vec::new()));
        let opens = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut poller =
            FsClient::for_session(&nodes.ctx[i], NAME, events_client.lock().session()).unwrap();
        let events = {
            let (callbacks, opens, stop, main) = (
                callbacks.clone(),
                opens.clone(),
                stop.clone(),
                events_client.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let got = poller.call(&Identity::root(), Op::Events { confirm: vec![] });
                    let Ok(Reply::Events(list)) = got else {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    };
                    for cb in list {
                        callbacks.lock().push(cb.clone());
                        if let Callback::Recall { ino, to, grant } = cb {
                            let opens = opens.lock().clone();
                            let back = Op::Return {
                                ino,
                                grant,
                                kept: to,
                                opens,
                            };
                            let _ = main.lock().call(&Identity::root(), back);
                        }
                    }
                }
            })
        };
        Mount {
            client: events_client,
            callbacks,
            opens,
            stop,
            events: Some(events),
        }
    }

    fn call(&self, op: Op) -> Result<Reply, Failure> {
        self.client.lock().call(&Identity::root(), op)
    }

    fn change(&self, op: UpdateOp) -> Answer {
        match self.call(Op::Change { op, durable: false }) {
            Ok(Reply::Updated(Ok(a))) => a,
            Ok(Reply::Changed {
                result: Ok(a),
                dirs,
                opened: None,
                ..
            }) => {
                assert!(!dirs.is_empty(), "a change of names names its directories");
                a
            }
            other => panic!("change: {other:?}"),
        }
    }

    fn hello_again(&self, node: &str) {
        self.client.lock().hello(node).unwrap();
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.events.take() {
            let _ = t.join();
        }
    }
}

fn read(m: &Mount, ino: Ino) -> Vec<u8> {
    match m.call(Op::Read {
        ino,
        offset: 0,
        len: 1 << 20,
    }) {
        Ok(Reply::Data(d)) => d,
        other => panic!("read: {other:?}"),
    }
}

#[test]
fn clients_share_a_file_through_the_primary_and_its_successor() {
    let nodes = Nodes::up(3);
    let fserver =
        FileServer::start(&nodes.ctx[0], &nodes.path("files"), ServerConfig::default()).unwrap();
    let mut replicas: Vec<Option<MetaReplica>> = (0..3)
        .map(|i| Some(start(&nodes, i, fserver.cap())))
        .collect();
    let first = primary(&replicas);

    let a = Mount::new(&nodes, 0);
    let b = Mount::new(&nodes, 1);
    let Answer::Range { first: ino, .. } = a.change(UpdateOp::Range { count: 16 }) else {
        panic!("no range");
    };
    let created = a.change(UpdateOp::Create {
        parent: ROOT,
        name: b"shared".to_vec(),
        kind: Kind::File,
        perm: 0o644,
        rdev: 0,
        ino,
        secret: [9; 16],
        target: Vec::new(),
        excl: true,
    });
    assert!(matches!(created, Answer::Entry { existed: false, .. }));

    // A opens it to write: it may cache it (Write).
    a.opens.lock().push((OpenId(1), true));
    let Ok(Reply::Opened { grant, .. }) = a.call(Op::Open {
        ino,
        want: Want::OpenWrite,
        have: vec![],
        id: OpenId(1),
        cached: None,
    }) else {
        panic!("open");
    };
    assert_eq!((grant.level, grant.uncached), (Level::Write, false));

    // B looks it up: A's Write is recalled first, and A reports its open.
    let Ok(Reply::Entry { attr, .. }) = b.call(Op::Lookup {
        parent: ROOT,
        name: b"shared".to_vec(),
    }) else {
        panic!("lookup");
    };
    assert_eq!(attr.ino, ino);
    assert!(
        a.callbacks
            .lock()
            .iter()
            .any(|c| matches!(c, Callback::Recall { ino: i, .. } if *i == ino)),
        "A's token was recalled"
    );

    // B opens it to read while A writes: write-shared, uncached for both.
    let Ok(Reply::Opened { grant, .. }) = b.call(Op::Open {
        ino,
        want: Want::OpenRead,
        have: vec![],
        id: OpenId(1),
        cached: None,
    }) else {
        panic!("open");
    };
    assert!(grant.uncached, "{grant:?}");

    // A writes through the primary; B reads through it.
    for (offset, data) in [(Some(0), &b"hello "[..]), (None, b"world\n")] {
        let Ok(Reply::Updated(Ok(Answer::Written { .. }))) = a.call(Op::Write {
            ino,
            offset,
            data: data.to_vec(),
        }) else {
            panic!("write");
        };
    }
    assert_eq!(read(&b, ino), b"hello world\n");

    // The primary stops: another replica becomes the primary, with the
    // tree (the writes were ordered) and none of the sessions.
    replicas[first].take().unwrap().stop();
    let second = primary(&replicas);
    assert_ne!(second, first);
    assert_eq!(
        b.call(Op::GetAttr { ino }).map(|_| ()),
        Err(Failure::NoSession)
    );
    a.hello_again("n1");
    b.hello_again("n2");
    assert_eq!(read(&b, ino), b"hello world\n");

    // Alone, B opens it to read: cached, so the primary first makes the
    // bytes written while it was shared a content version on the file
    // server, which B reads there.
    a.opens.lock().clear();
    // B reports this open when its token is recalled (a cached open is
    // known to the primary only so).
    b.opens.lock().push((OpenId(2), false));
    let Ok(Reply::Opened {
        grant,
        content,
        attr,
    }) = b.call(Op::Open {
        ino,
        want: Want::OpenRead,
        have: vec![],
        id: OpenId(2),
        cached: None,
    })
    else {
        panic!("open");
    };
    assert_eq!((grant.level, grant.uncached), (Level::Read, false));
    assert_eq!(attr.size, 12);
    assert_eq!(content.len(), 1);
    let mut files = FileClient::new(&nodes.ctx[2]).unwrap();
    assert_eq!(files.read_all(&content).unwrap(), b"hello world\n");

    // A name removed while B has the file open stays until it closes:
    // B's token is recalled, and its answer reports the open.
    let recalls = |m: &Mount| {
        m.callbacks
            .lock()
            .iter()
            .filter(|c| matches!(c, Callback::Recall { ino: i, .. } if *i == ino))
            .count()
    };
    let before = recalls(&b);
    a.change(UpdateOp::Unlink {
        parent: ROOT,
        name: b"shared".to_vec(),
        dir: false,
        open: false,
    });
    let until = Instant::now() + Duration::from_secs(10);
    while recalls(&b) == before {
        assert!(Instant::now() < until, "B's token was not recalled");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(read(&b, ino), b"hello world\n");
    assert!(matches!(
        b.call(Op::Lookup {
            parent: ROOT,
            name: b"shared".to_vec()
        }),
        Err(Failure::Fs(shoal_fs::FsError::NotFound))
    ));

    // A restarted replica joins and holds the same tree.
    replicas[first] = Some(start(&nodes, first, fserver.cap()));
    primary(&replicas);
    let until = Instant::now() + Duration::from_secs(30);
    while replicas
        .iter()
        .flatten()
        .map(|r| r.status()["index"].as_u64())
        .collect::<std::collections::BTreeSet<_>>()
        .len()
        > 1
    {
        assert!(Instant::now() < until, "replicas did not converge");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop((a, b));
    for r in replicas.into_iter().flatten() {
        r.stop();
    }
    fserver.stop().unwrap();
}
