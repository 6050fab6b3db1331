//! The tree as a replicated machine (`shoal_replica::Machine`): what a
//! metadata replica does with each ordered update, its log and its
//! recovery.
//!
//! The log is `shoal_replica::frame`'s framing with magic `SHOALFL1` and
//! one record kind, 1: an update applied at `index` (payload: the update
//! as ordered, `shoal_fs::update`'s layout).  Every new update is logged,
//! refused ones too (they change a client's session), so replaying the
//! log in order rebuilds the same tree; a duplicate changes nothing and is
//! not logged.  Unlike the directory's log nothing cancels: a temporary
//! file costs the metadata service nothing because it never leaves the
//! client (`docs/fs.md`, "Private directories").

use shoal_cap::PutPort;
use shoal_replica::{Machine, Recovery, frame};

use crate::model::{FsError, Timestamp};
use crate::tree::{Applied, Tree};
use crate::update::{Answer, Update};

/// Log file header magic.
pub const LOG_MAGIC: &[u8; 8] = b"SHOALFL1";
/// Record kind: an applied update.
pub const KIND_UPDATE: u8 = 1;

/// What applying an ordered update answered: the index it was applied at
/// (for a duplicate, the index now) and its result.
pub type Output = (u64, Result<Answer, FsError>);

/// A metadata replica's tree and its unflushed log.
#[derive(Debug)]
pub struct FsReplica {
    pub tree: Tree,
    pending: Vec<u8>,
    logged: u64,
}

impl FsReplica {
    pub fn new(tree: Tree) -> FsReplica {
        let logged = tree.index();
        FsReplica {
            tree,
            pending: Vec::new(),
            logged,
        }
    }

    /// The tree a service starts with: the root alone, with no
    /// capability secret yet (zero: no capability verifies against it;
    /// the first primary gives it one) and times at the epoch.
    pub fn empty() -> FsReplica {
        FsReplica::new(Tree::new([0; 16], Timestamp { secs: 0, nanos: 0 }))
    }
}

impl Machine for FsReplica {
    type Output = Output;

    fn index(&self) -> u64 {
        self.tree.index()
    }

    fn deliver(&mut self, message: &[u8]) -> Option<Output> {
        let update = Update::decode(message).ok()?;
        match self.tree.apply(&update) {
            Applied::New(result) => {
                let index = self.tree.index();
                frame::record(&mut self.pending, KIND_UPDATE, index, message);
                self.logged = index;
                Some((index, result))
            }
            Applied::Duplicate(result) => Some((self.tree.index(), result)),
        }
    }

    fn take_log(&mut self, _mark: bool) -> Option<Vec<u8>> {
        (!self.pending.is_empty()).then(|| std::mem::take(&mut self.pending))
    }

    fn logged_index(&self) -> u64 {
        self.logged
    }

    fn log_header(base: u64) -> Vec<u8> {
        frame::header(LOG_MAGIC, base).to_vec()
    }

    fn encode_snapshot(&self) -> Vec<u8> {
        self.tree.encode_snapshot()
    }

    fn decode_snapshot(bytes: &[u8]) -> Result<FsReplica, String> {
        Tree::decode_snapshot(bytes)
            .map(FsReplica::new)
            .map_err(|e| e.to_string())
    }

    fn recover(
        _port: PutPort,
        snapshot: Option<&[u8]>,
        logs: &[(u64, &[u8])],
    ) -> Result<Recovery<FsReplica>, String> {
        let mut tree = match snapshot {
            Some(bytes) => Tree::decode_snapshot(bytes).map_err(|e| e.to_string())?,
            None => FsReplica::empty().tree,
        };
        let bases: Vec<u64> = logs.iter().map(|(b, _)| *b).collect();
        let mut replayed = 0;
        let mut keep = Vec::with_capacity(logs.len());
        for ((_, bytes), plan) in logs.iter().zip(frame::plan(&bases, tree.index())) {
            let Some(older) = plan else {
                keep.push(None);
                continue;
            };
            let Some(f) = frame::frames(LOG_MAGIC, bytes) else {
                if older {
                    return Err(format!("metadata log: {}", frame::OLDER_LOG_CORRUPT));
                }
                keep.push(Some(0));
                continue;
            };
            let mut valid = frame::HEADER;
            for r in &f.records {
                if r.index > tree.index() {
                    let update = match Update::decode(r.payload) {
                        Ok(u) if r.kind == KIND_UPDATE && r.index == tree.index() + 1 => u,
                        _ => break,
                    };
                    tree.apply(&update);
                    replayed += 1;
                }
                valid += frame::RECORD_OVERHEAD + r.payload.len();
            }
            if older && valid < bytes.len() {
                return Err(format!("metadata log: {}", frame::OLDER_LOG_CORRUPT));
            }
            keep.push(Some(valid));
        }
        Ok(Recovery {
            state: FsReplica::new(tree),
            replayed,
            keep,
        })
    }

    fn counts(&self) -> Vec<(&'static str, u64)> {
        vec![("inodes", self.tree.inode_count() as u64)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Identity, Ino, Kind, ROOT};
    use crate::tokens::ClientId;
    use crate::update::UpdateOp;

    fn update(seq: u64, op: UpdateOp) -> Vec<u8> {
        Update {
            session: ClientId(7),
            seq,
            who: Identity::root(),
            now: Timestamp { secs: 1, nanos: 0 },
            op,
        }
        .encode()
    }

    /// A tree with inode numbers 2 to 100 handed out (index 1).
    fn ranged() -> FsReplica {
        let mut r = FsReplica::empty();
        let (_, result) = r
            .deliver(&update(1, UpdateOp::Range { count: 99 }))
            .unwrap();
        assert!(result.is_ok(), "{result:?}");
        r
    }

    fn create(seq: u64, name: &str, ino: u64) -> Vec<u8> {
        update(
            seq,
            UpdateOp::Create {
                parent: ROOT,
                name: name.as_bytes().to_vec(),
                kind: Kind::File,
                perm: 0o644,
                rdev: 0,
                ino: Ino(ino),
                secret: [ino as u8; 16],
                target: Vec::new(),
                excl: true,
            },
        )
    }

    /// Replays what `r` logged, after the snapshot `snap` (if any).
    fn recover(snap: Option<&[u8]>, logs: &[(u64, &[u8])]) -> Recovery<FsReplica> {
        let port = PutPort::from_bytes([1; 16]);
        FsReplica::recover(port, snap, logs).unwrap()
    }

    #[test]
    fn the_log_and_snapshot_rebuild_the_tree_and_a_torn_tail_is_cut() {
        let mut r = ranged();
        let mut log = FsReplica::log_header(0);
        for (i, name) in ["a", "b", "a"].iter().enumerate() {
            // The third is refused (the name exists) and still logged.
            let (index, result) = r
                .deliver(&create(i as u64 + 2, name, 10 + i as u64))
                .unwrap();
            assert_eq!(index, i as u64 + 2);
            assert_eq!(result.is_ok(), i < 2, "{result:?}");
        }
        // A duplicate of the session's latest is answered again (the same
        // refusal) and not logged.
        let (index, again) = r.deliver(&create(4, "a", 12)).unwrap();
        assert_eq!((index, again), (4, Err(FsError::Exists)));
        log.extend(r.take_log(true).unwrap());
        assert!(r.take_log(true).is_none());
        assert_eq!(r.logged_index(), 4);
        let back = recover(None, &[(0, &log)]);
        assert_eq!(back.replayed, 4);
        assert_eq!(back.state.tree, r.tree);
        assert_eq!(back.keep, vec![Some(log.len())]);
        // Torn: the intact records are kept.
        let torn = &log[..log.len() - 3];
        let back = recover(None, &[(0, torn)]);
        assert_eq!(back.replayed, 3);
        assert!(back.keep[0].unwrap() < torn.len());
        // After a snapshot at 3, a new log holds the fourth.
        let mut at3 = ranged();
        at3.deliver(&create(2, "a", 10));
        at3.deliver(&create(3, "b", 11));
        let snap = at3.encode_snapshot();
        at3.take_log(true);
        at3.deliver(&create(4, "a", 12));
        let mut log2 = FsReplica::log_header(3);
        log2.extend(at3.take_log(true).unwrap());
        let back = recover(Some(&snap), &[(0, &log), (3, &log2)]);
        assert_eq!(back.keep[0], None);
        assert_eq!(back.replayed, 1);
        assert_eq!(back.state.tree, r.tree);
        // An older log that is torn is refused.
        let port = PutPort::from_bytes([1; 16]);
        assert!(FsReplica::recover(port, None, &[(0, torn), (4, &log2)]).is_err());
        // Someone else's log is not read.
        let dir_log = frame::header(b"SHOALDL1", 0);
        assert_eq!(recover(None, &[(0, &dir_log)]).keep, vec![Some(0)]);
    }
}
