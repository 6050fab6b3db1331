//! Tests of private directories: a push brings the primary to the
//! client's state (a property over random steps), temporary files,
//! what is made here and what goes to the primary, and commits carried
//! in pushes.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::model::ROOT;
use crate::testing::{alice, bob, create, first, update};

/// A primary's tree with a world-writable `/tmp`, a private directory
/// `/tmp/d` of alice's adopted by a client, and that client's copy.
struct World {
    primary: Tree,
    client: Private,
    seq: u64,
    clock: i64,
    next: Ino,
    /// The client's opens, by inode.
    opens: HashMap<Ino, u32>,
    tmp: Ino,
    d: Ino,
    /// A push on its way: its changes, and the copy when it started.
    flying: Option<(Vec<Pushed>, Box<Private>)>,
}

impl World {
    fn new() -> World {
        let mut w = World {
            primary: Tree::new([1; 16], Timestamp::new(1, 0)),
            client: Private::new(),
            seq: 0,
            clock: 1,
            next: Ino(0),
            opens: HashMap::new(),
            tmp: Ino(0),
            d: Ino(0),
            flying: None,
        };
        match w.apply(&Identity::root(), UpdateOp::Range { count: 100_000 }) {
            Ok(Answer::Range { first, .. }) => w.next = first,
            other => panic!("{other:?}"),
        }
        w.tmp = w.made(&Identity::root(), ROOT, b"tmp", Kind::Dir, 0o777);
        w.d = w.made(&alice(), w.tmp, b"d", Kind::Dir, 0o755);
        let d = w.primary.get(w.d).unwrap().clone();
        w.client.adopt_dir(d.attr, d.secret, w.tmp);
        w
    }

    fn now(&mut self) -> Timestamp {
        self.clock += 1;
        Timestamp::new(self.clock, 7)
    }

    /// An update the primary orders.
    fn apply(&mut self, who: &Identity, op: UpdateOp) -> Result<Answer, FsError> {
        self.seq += 1;
        let u = update(5, self.seq, who, self.now(), op);
        first(self.primary.apply(&u))
    }

    fn create_op(&mut self, parent: Ino, name: &[u8], kind: Kind, perm: u16) -> UpdateOp {
        let ino = self.next.take();
        let secret = [self.next.0 as u8; 16];
        create((parent, name), kind, perm, ino, secret, b"")
    }

    /// Made at the primary.
    fn made(&mut self, who: &Identity, parent: Ino, name: &[u8], kind: Kind, perm: u16) -> Ino {
        let op = self.create_op(parent, name, kind, perm);
        match self.apply(who, op) {
            Ok(Answer::Entry { attr, .. }) => attr.ino,
            other => panic!("{other:?}"),
        }
    }

    /// A change in the client's copy.
    fn local(&mut self, who: &Identity, op: UpdateOp) -> Result<Answer, FsError> {
        let now = self.now();
        self.client.change(who, now, op, Time(self.clock as u64))
    }

    /// Made by alice in the client's copy: its attributes.
    fn made_here(&mut self, parent: Ino, name: &[u8], kind: Kind, perm: u16) -> Attr {
        let op = self.create_op(parent, name, kind, perm);
        match self.local(&alice(), op) {
            Ok(Answer::Entry { attr, .. }) => attr,
            other => panic!("{other:?}"),
        }
    }

    /// Unlinked by alice in the client's copy.
    fn unlink_here(&mut self, parent: Ino, name: &[u8], dir: bool, open: bool) {
        let op = UpdateOp::Unlink {
            parent,
            name: name.to_vec(),
            dir,
            open,
        };
        self.local(&alice(), op).unwrap();
    }

    fn push(&mut self) {
        self.land();
        let ops = self.client.to_push();
        self.push_ops(ops);
        self.client.pushed();
    }

    /// A push starts, and changes go on being made while it is on its way.
    fn start_push(&mut self) {
        if self.flying.is_none() {
            let ops = self.client.start_push();
            self.flying = Some((ops, Box::new(self.client.clone())));
        }
    }

    /// The push on its way reaches the primary: which then shows every
    /// inode as the copy did when the push started.
    fn land(&mut self) {
        let Some((ops, then)) = self.flying.take() else {
            return;
        };
        assert_eq!(ops, self.client.on_its_way());
        self.push_ops(ops);
        self.client.pushed();
        assert!(!self.client.is_pushing());
        for i in then.tree.inodes() {
            if i.attr.nlink > 0 {
                assert_eq!(
                    self.primary.get(i.attr.ino),
                    Some(i),
                    "inode {}",
                    i.attr.ino
                );
            }
        }
    }

    fn push_ops(&mut self, ops: Vec<Pushed>) {
        if ops.is_empty() {
            return;
        }
        let n = ops.len();
        match self.apply(&Identity::root(), UpdateOp::Push { ops }) {
            Ok(Answer::Pushed(each)) => {
                assert_eq!(each.len(), n);
                for (i, r) in each.iter().enumerate() {
                    assert!(r.is_ok(), "pushed change {i} refused: {r:?}");
                }
            }
            other => panic!("{other:?}"),
        }
    }

    /// The client's copy says what the primary says of every inode with a
    /// name (an inode without one lives on while open, and only there).
    fn agree(&self) {
        for i in self.primary.inodes() {
            let ino = i.attr.ino;
            if ino == ROOT || ino == self.tmp || i.attr.nlink == 0 {
                continue;
            }
            assert_eq!(self.client.get(ino), Some(i), "inode {ino}");
        }
        for i in self.client.tree.inodes() {
            if i.attr.nlink > 0 {
                assert!(self.primary.get(i.attr.ino).is_some(), "{}", i.attr.ino);
            }
        }
    }

    /// The private directories, in a stable order.
    fn dirs(&self) -> Vec<Ino> {
        self.client
            .tree
            .inodes()
            .filter(|i| i.attr.kind == Kind::Dir && i.attr.nlink > 0)
            .map(|i| i.attr.ino)
            .collect()
    }
}

#[derive(Debug, Clone)]
enum Step {
    Create(u8, u8, bool),
    Mkdir(u8, u8),
    Unlink(u8, u8),
    Rmdir(u8, u8),
    Rename(u8, u8, u8, u8),
    Link(u8, u8, u8, u8),
    Chmod(u8, u8, u16),
    Open(u8, u8),
    Close(u8, u8),
    Push,
    StartPush,
    Land,
}

fn step() -> impl Strategy<Value = Step> {
    let n = 0u8..4;
    prop_oneof![
        4 => (n.clone(), any::<u8>(), any::<bool>()).prop_map(|(a, d, b)| Step::Create(a, d, b)),
        2 => (n.clone(), any::<u8>()).prop_map(|(a, d)| Step::Mkdir(a, d)),
        4 => (n.clone(), any::<u8>()).prop_map(|(a, d)| Step::Unlink(a, d)),
        1 => (n.clone(), any::<u8>()).prop_map(|(a, d)| Step::Rmdir(a, d)),
        2 => (n.clone(), any::<u8>(), n.clone(), any::<u8>())
            .prop_map(|(a, d, b, e)| Step::Rename(a, d, b, e)),
        1 => (n.clone(), any::<u8>(), n.clone(), any::<u8>())
            .prop_map(|(a, d, b, e)| Step::Link(a, d, b, e)),
        1 => (n.clone(), any::<u8>(), prop_oneof![Just(0o755u16), Just(0o500), Just(0o777)])
            .prop_map(|(a, d, p)| Step::Chmod(a, d, p)),
        2 => (n.clone(), any::<u8>()).prop_map(|(a, d)| Step::Open(a, d)),
        2 => (n.clone(), any::<u8>()).prop_map(|(a, d)| Step::Close(a, d)),
        1 => Just(Step::Push),
        1 => Just(Step::StartPush),
        1 => Just(Step::Land),
    ]
}

fn name(n: u8) -> Vec<u8> {
    format!("n{n}").into_bytes()
}

impl World {
    fn dir(&self, pick: u8) -> Ino {
        let dirs = self.dirs();
        dirs[pick as usize % dirs.len()]
    }

    fn run(&mut self, s: &Step) {
        let who = alice();
        match *s {
            Step::Create(n, d, as_bob) => {
                let d = self.dir(d);
                let op = self.create_op(d, &name(n), Kind::File, 0o644);
                let who = if as_bob { bob() } else { who };
                let _ = self.local(&who, op);
            }
            Step::Mkdir(n, d) => {
                let d = self.dir(d);
                let op = self.create_op(d, &name(n), Kind::Dir, 0o755);
                let _ = self.local(&who, op);
            }
            Step::Unlink(n, d) | Step::Rmdir(n, d) => {
                let d = self.dir(d);
                let victim = self.client.lookup(d, &name(n)).ok().map(|a| a.ino);
                let op = UpdateOp::Unlink {
                    parent: d,
                    name: name(n),
                    dir: matches!(s, Step::Rmdir(..)),
                    open: victim.is_some_and(|v| self.opens.contains_key(&v)),
                };
                let _ = self.local(&who, op);
            }
            Step::Rename(a, d, b, e) => {
                let (d, e) = (self.dir(d), self.dir(e));
                let victim = self.client.lookup(e, &name(b)).ok().map(|a| a.ino);
                let op = UpdateOp::Rename {
                    from: d,
                    from_name: name(a),
                    to: e,
                    to_name: name(b),
                    noreplace: false,
                    open_victim: victim.is_some_and(|v| self.opens.contains_key(&v)),
                };
                let _ = self.local(&who, op);
            }
            Step::Link(a, d, b, e) => {
                let (d, e) = (self.dir(d), self.dir(e));
                if let Ok(attr) = self.client.lookup(d, &name(a)) {
                    let op = UpdateOp::Link {
                        ino: attr.ino,
                        parent: e,
                        name: name(b),
                    };
                    let _ = self.local(&who, op);
                }
            }
            Step::Chmod(n, d, perm) => {
                let d = self.dir(d);
                if let Ok(attr) = self.client.lookup(d, &name(n)) {
                    let op = UpdateOp::SetAttr {
                        ino: attr.ino,
                        set: SetAttr {
                            perm: Some(perm),
                            ..SetAttr::default()
                        },
                    };
                    let _ = self.local(&who, op);
                }
            }
            Step::Open(n, d) => {
                let d = self.dir(d);
                if let Ok(attr) = self.client.lookup(d, &name(n))
                    && attr.kind == Kind::File
                {
                    *self.opens.entry(attr.ino).or_default() += 1;
                }
            }
            Step::Close(n, d) => {
                // Closes the open inode picked by position.
                let mut open: Vec<Ino> = self.opens.keys().copied().collect();
                open.sort_unstable();
                if open.is_empty() {
                    return;
                }
                let ino = open[(usize::from(n) + usize::from(d)) % open.len()];
                let left = self.opens.get_mut(&ino).unwrap();
                *left -= 1;
                if *left == 0 {
                    self.opens.remove(&ino);
                    self.client.closed(ino);
                }
            }
            Step::Push => self.push(),
            Step::StartPush => self.start_push(),
            Step::Land => self.land(),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Whatever a client does in its private directories, pushing its
    /// pending changes brings the primary to the state the client showed.
    #[test]
    fn a_push_brings_the_primary_to_the_clients_state(steps in prop::collection::vec(step(), 1..60)) {
        let mut w = World::new();
        for s in &steps {
            w.run(s);
        }
        w.push();
        w.agree();
    }
}

#[test]
fn a_temporary_file_leaves_one_setting_of_its_directorys_times() {
    let mut w = World::new();
    let mut unlinked = Timestamp::default();
    for round in 0..100 {
        let attr = w.made_here(w.d, b"tmp", Kind::File, 0o600);
        // Open while it is unlinked: it goes at the close.
        *w.opens.entry(attr.ino).or_default() += 1;
        w.unlink_here(w.d, b"tmp", false, true);
        unlinked = Timestamp::new(w.clock, 7);
        // The create and the unlink, after the times set last round.
        assert_eq!(w.client.pending_len(), if round == 0 { 2 } else { 3 });
        w.opens.clear();
        assert!(w.client.closed(attr.ino));
        assert_eq!(w.client.pending_len(), 1);
        assert!(w.client.fresh().is_empty());
    }
    w.push();
    w.agree();
    let d = w.primary.get(w.d).unwrap().attr;
    assert_eq!(d.mtime, d.ctime);
    assert_eq!(d.mtime, unlinked);
}

#[test]
fn a_change_that_decides_another_inodes_fate_is_pushed() {
    let mut w = World::new();
    // `keep` is pushed; a fresh file renamed over it and then unlinked
    // must reach the primary, or `keep` would live on there.
    let op = w.create_op(w.d, b"keep", Kind::File, 0o644);
    w.local(&alice(), op).unwrap();
    w.push();
    let op = w.create_op(w.d, b"new", Kind::File, 0o644);
    w.local(&alice(), op).unwrap();
    let op = UpdateOp::Rename {
        from: w.d,
        from_name: b"new".to_vec(),
        to: w.d,
        to_name: b"keep".to_vec(),
        noreplace: false,
        open_victim: false,
    };
    w.local(&alice(), op).unwrap();
    w.unlink_here(w.d, b"keep", false, false);
    assert_eq!(w.client.pending_len(), 3);
    w.push();
    w.agree();
    assert!(w.primary.entries(w.d).unwrap().is_empty());
}

#[test]
fn only_changes_of_names_and_attributes_are_made_here() {
    let mut w = World::new();
    let op = UpdateOp::Forget { ino: w.d };
    assert!(matches!(w.local(&alice(), op), Err(FsError::Invalid(_))));
    assert_eq!(w.client.pending_len(), 0);
}

#[test]
fn an_inode_removed_in_the_copy_is_still_mentioned_until_the_push() {
    let mut w = World::new();
    let attr = w.made_here(w.d, b"sub", Kind::Dir, 0o755);
    w.push();
    w.unlink_here(w.d, b"sub", true, false);
    // Gone from the copy, still at the primary: a recall of it must wait
    // for the push that removes it there.
    assert!(!w.client.holds(attr.ino));
    assert!(w.client.mentions(attr.ino));
    w.push();
    assert!(!w.client.mentions(attr.ino));
    assert!(w.primary.get(attr.ino).is_none());
}

#[test]
fn a_new_primary_is_asked_for_every_inode_a_push_may_name() {
    let mut w = World::new();
    let sub = w.made_here(w.d, b"sub", Kind::Dir, 0o755);
    w.push();
    // Removed from the copy, not yet at the primary; and one made since
    // the last push (a push whose answer was lost may have made it).
    w.unlink_here(w.d, b"sub", true, false);
    let new = w.made_here(w.d, b"new", Kind::File, 0o644);
    let known: Vec<Ino> = w.client.known().into_iter().map(|(i, _)| i).collect();
    assert!(known.contains(&w.d), "the directory itself");
    assert!(known.contains(&sub.ino), "removed here, named by the push");
    assert!(known.contains(&new.ino), "made since the last push");
    // After the push, what the copy no longer has is not asked for.
    w.push();
    let known: Vec<Ino> = w.client.known().into_iter().map(|(i, _)| i).collect();
    assert!(!known.contains(&sub.ino));
    assert!(known.contains(&new.ino));
}

/// A file made in a private directory and written: the push that brings
/// its name carries its commit too (an `fsync`), and the copy, told of
/// the commit, shows the file as the primary holds it.
#[test]
fn a_push_carries_the_commit_of_a_file_it_makes() {
    let mut w = World::new();
    let attr = w.made_here(w.d, b"f", Kind::File, 0o644);
    let commit = UpdateOp::Commit {
        ino: attr.ino,
        base: attr.version,
        content: Vec::new(),
        size: 10,
        held: 10,
        mtime: Timestamp::new(w.clock, 9),
        flush: false,
    };
    let mut ops = w.client.to_push();
    let now = w.now();
    ops.push(Pushed {
        who: Identity::root(),
        now,
        op: commit.clone(),
    });
    let d = w.d;
    assert_eq!(check_push(&ops, |i| i == d), Ok(vec![attr.ino]));
    let results = match w.apply(&Identity::root(), UpdateOp::Push { ops }) {
        Ok(Answer::Pushed(results)) => results,
        other => panic!("{other:?}"),
    };
    let Some(Ok(Answer::Committed {
        attr: committed, ..
    })) = results.last()
    else {
        panic!("{results:?}")
    };
    assert_eq!((committed.version, committed.size), (attr.version + 1, 10));
    assert_eq!(committed.ctime, now);
    w.client.pushed();
    w.client.committed(committed.ctime, &commit);
    w.agree();
}

/// A push's commit is a client's write-back of a file it makes or holds
/// `Write` on; the primary's own flush of an overlay is no client's.
#[test]
fn a_push_commits_only_what_its_client_holds() {
    let commit = |ino, flush| Pushed {
        who: Identity::root(),
        now: Timestamp::new(1, 0),
        op: UpdateOp::Commit {
            ino,
            base: 0,
            content: Vec::new(),
            size: 0,
            held: 0,
            mtime: Timestamp::new(1, 0),
            flush,
        },
    };
    assert!(check_push(&[commit(Ino(7), false)], |i| i == Ino(7)).is_ok());
    assert!(matches!(
        check_push(&[commit(Ino(7), false)], |i| i == Ino(8)),
        Err(FsError::Stale(_))
    ));
    assert!(matches!(
        check_push(&[commit(Ino(7), true)], |_| true),
        Err(FsError::Invalid(_))
    ));
}
