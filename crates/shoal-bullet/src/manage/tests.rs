//! The pass against a small world of directories and servers it asks.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use shoal_cap::{Capability, GetPort, ObjectId, ObjectSecret, PutPort, Rights};

use super::*;

fn cap(port: u8, object: u64) -> Capability {
    Capability::mint(
        GetPort::from_bytes([port; 16]).put_port(),
        ObjectId::new(object),
        Rights::ALL,
        &ObjectSecret::from_bytes([port; 32]),
    )
}

/// Directories on port 1 (the root is object 1); servers on ports 2, 3
/// and 4.
struct World {
    dirs: BTreeMap<u64, Vec<(String, Vec<Capability>)>>,
    files: HashSet<Capability>,
    touched: HashSet<Capability>,
    corrupt: HashSet<Capability>,
    down: BTreeSet<PutPort>,
    unlistable: bool,
    trees_fail: bool,
    aged: Vec<PutPort>,
    next: u64,
}

impl World {
    fn new() -> World {
        World {
            dirs: BTreeMap::from([(1, Vec::new())]),
            files: HashSet::new(),
            touched: HashSet::new(),
            corrupt: HashSet::new(),
            down: BTreeSet::new(),
            unlistable: false,
            trees_fail: false,
            aged: Vec::new(),
            next: 100,
        }
    }

    /// A world whose root names directory 9 as `sub`.
    fn with_subdir() -> World {
        let mut w = World::new();
        w.dirs.insert(9, Vec::new());
        w.dirs
            .get_mut(&1)
            .unwrap()
            .push(("sub".into(), vec![cap(1, 9)]));
        w
    }

    fn servers() -> Vec<(String, Capability)> {
        (2..=4).map(|p| (format!("fs{p}"), cap(p, 0))).collect()
    }

    /// A file on the servers of `ports`, named `name` in directory `dir`.
    fn file(&mut self, dir: u64, name: &str, ports: &[u8]) -> Vec<Capability> {
        let caps: Vec<Capability> = ports
            .iter()
            .map(|p| {
                self.next += 1;
                cap(*p, self.next)
            })
            .collect();
        self.files.extend(caps.iter().copied());
        self.dirs
            .get_mut(&dir)
            .unwrap()
            .push((name.into(), caps.clone()));
        caps
    }

    fn up(&self, c: &Capability) -> Result<(), String> {
        if self.down.contains(&c.port()) {
            Err("unreachable".into())
        } else {
            Ok(())
        }
    }

    fn answer(&mut self, ask: Ask) -> Heard {
        match ask {
            Ask::List { dir } => Heard::Listed(if self.unlistable && dir.object().get() != 1 {
                Err("unreachable".into())
            } else {
                Ok(self.dirs[&dir.object().get()]
                    .iter()
                    .map(|(n, c)| (n.clone(), Ok(c.clone())))
                    .collect())
            }),
            Ask::Touch { files } => Heard::Touched(self.up(&files[0]).map(|()| {
                self.touched.extend(files.iter().copied());
                files.iter().map(|f| self.files.contains(f)).collect()
            })),
            Ask::Verify { file } => Heard::Verified(Ok(!self.corrupt.contains(&file))),
            Ask::Destroy { file } => {
                self.files.remove(&file);
                Heard::Done(Ok(()))
            }
            Ask::Copy { from, to } => {
                assert!(
                    from.iter().all(|f| self.files.contains(f)),
                    "copied from a live replica"
                );
                let made: Vec<Capability> = to
                    .iter()
                    .map(|s| {
                        self.next += 1;
                        cap(port_of(s), self.next)
                    })
                    .collect();
                self.files.extend(made.iter().copied());
                Heard::Copied(Ok(made))
            }
            Ask::Replace {
                dir,
                name,
                old,
                new,
            } => {
                let rows = self.dirs.get_mut(&dir.object().get()).unwrap();
                let row = rows.iter_mut().find(|r| r.0 == name).unwrap();
                Heard::Done(if row.1 == old {
                    row.1 = new;
                    Ok(())
                } else {
                    Err("changed".into())
                })
            }
            Ask::Trees => Heard::Trees(Ok(vec!["fs".into()])),
            Ask::TouchTree { .. } => Heard::TreeTouched(if self.trees_fail {
                Err("its primary is away".into())
            } else {
                Ok((7, 0))
            }),
            Ask::Age { server } => {
                self.aged.push(server.port());
                Heard::Aged(self.up(&server).map(|()| (true, 0)))
            }
            Ask::Done(_) => unreachable!(),
        }
    }

    fn pass(&mut self, k: usize) -> PassReport {
        let opts = PassOptions {
            k,
            verify: true,
            age: true,
        };
        let mut pass = Pass::new(cap(1, 1), World::servers(), opts);
        for _ in 0..10_000 {
            match pass.ask() {
                Ask::Done(report) => return report,
                ask => {
                    let heard = self.answer(ask);
                    pass.heard(heard);
                }
            }
        }
        panic!("the pass never ended");
    }
}

/// Which of the world's ports a server capability is on.
fn port_of(server: &Capability) -> u8 {
    (2..=4)
        .find(|p| cap(*p, 0).port() == server.port())
        .expect("a server of the world")
}

#[test]
fn a_complete_pass_touches_everything_named_then_ages_every_server() {
    let mut w = World::with_subdir();
    let a = w.file(1, "a", &[2, 3]);
    let b = w.file(9, "b", &[3, 4]);
    let r = w.pass(2);
    assert_eq!((r.directories, r.files, r.replicas_touched), (2, 2, 4));
    assert!(a.iter().chain(&b).all(|c| w.touched.contains(c)));
    assert_eq!(w.aged.len(), 3, "{r:?}");
    assert!(r.problems.is_empty(), "{r:?}");
    assert_eq!(r.trees, vec![("fs".into(), 7, 0)]);
}

#[test]
fn nothing_ages_when_a_directory_or_a_tree_could_not_be_touched() {
    let mut w = World::with_subdir();
    w.file(9, "b", &[3, 4]);
    w.unlistable = true;
    let r = w.pass(2);
    assert!(w.aged.is_empty(), "{r:?}");
    assert!(r.problems.iter().any(|p| p.contains("no ageing")), "{r:?}");
    w.unlistable = false;
    w.trees_fail = true;
    let r = w.pass(2);
    assert!(w.aged.is_empty(), "{r:?}");
}

#[test]
fn a_lost_replica_is_made_again_and_the_entry_swapped() {
    let mut w = World::new();
    let a = w.file(1, "a", &[2, 3]);
    w.files.remove(&a[1]);
    let r = w.pass(2);
    assert_eq!((r.replicas_missing, r.replicas_recreated), (1, 1), "{r:?}");
    let now = &w.dirs[&1][0].1;
    assert_eq!(now.len(), 2);
    assert!(now.contains(&a[0]) && !now.contains(&a[1]));
    assert!(now.iter().all(|c| w.files.contains(c)));
    let ports: BTreeSet<PutPort> = now.iter().map(|c| c.port()).collect();
    assert_eq!(ports.len(), 2, "on two servers");
    // Whole again: the next pass changes nothing.
    let r = w.pass(2);
    assert_eq!(r.replicas_recreated, 0, "{r:?}");
}

#[test]
fn a_server_away_is_neither_aged_nor_trusted_and_its_files_are_copied() {
    let mut w = World::new();
    let a = w.file(1, "a", &[2, 4]);
    w.down.insert(cap(4, 0).port());
    let r = w.pass(2);
    assert_eq!(r.servers_unreachable, vec!["fs4".to_string()], "{r:?}");
    assert!(
        !w.aged.contains(&cap(4, 0).port()),
        "a server away is not asked to age"
    );
    assert_eq!(
        w.aged.len(),
        2,
        "the others age: what they hold was touched"
    );
    let now = &w.dirs[&1][0].1;
    assert!(now.contains(&a[0]) && !now.contains(&a[1]), "{now:?}");
    assert!(
        now.iter().any(|c| c.port() == cap(3, 0).port()),
        "made again on fs3"
    );
}

#[test]
fn a_corrupt_replica_is_destroyed_and_replaced() {
    let mut w = World::new();
    let a = w.file(1, "a", &[2, 3]);
    w.corrupt.insert(a[0]);
    let r = w.pass(2);
    assert_eq!((r.replicas_corrupt, r.replicas_recreated), (1, 1), "{r:?}");
    assert!(!w.files.contains(&a[0]), "the corrupt replica is destroyed");
    let now = &w.dirs[&1][0].1;
    assert!(
        !now.contains(&a[0]) && now.contains(&a[1]) && now.len() == 2,
        "{now:?}"
    );
}
