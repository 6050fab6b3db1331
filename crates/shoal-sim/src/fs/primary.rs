//! The primary in the file system scenarios: the soft state and
//! decisions the metadata service ships ([`shoal_fs::primary`]), over a
//! [`World`] standing for the replicas' tree and the file servers (the
//! private directories' scenario runs on it too), and what its answers
//! tell each mount.

use std::collections::BTreeMap;

use shoal_cap::{Capability, GetPort, ObjectId, ObjectSecret, Rights};
use shoal_fs::model::{FsError, Identity, Ino, Timestamp};
use shoal_fs::op::{Failure, Reply};
use shoal_fs::primary::{Flush, Shell};
use shoal_fs::tokens::ClientId;
use shoal_fs::tree::{Body, overlaid};
use shoal_fs::update::{Answer, Update, UpdateOp};
use shoal_fs::{Applied, Tree};

use super::mount::ToMount;
use super::{Asked, FsSim};

/// The file servers: contents by object number (every version a file
/// ever had is kept: a write-back's base is read after its commit).
#[derive(Default)]
pub(crate) struct Store {
    objects: BTreeMap<u64, Vec<u8>>,
    next: u64,
}

impl Store {
    pub(crate) fn put(&mut self, bytes: Vec<u8>) -> Capability {
        self.next += 1;
        self.objects.insert(self.next, bytes);
        Capability::mint(
            GetPort::from_bytes([1; 16]).put_port(),
            ObjectId::new(self.next),
            Rights::ALL,
            &ObjectSecret::from_bytes([2; 32]),
        )
    }

    pub(crate) fn read(&self, content: &[Capability]) -> Vec<u8> {
        content
            .first()
            .and_then(|c| self.objects.get(&c.object().get()))
            .cloned()
            .unwrap_or_default()
    }
}

/// The replicas' tree (the state every replica holds alike, which a
/// primary's crash leaves as it was; every update ordered is durable at
/// once) and the file servers.
pub(crate) struct World {
    pub tree: Tree,
    pub store: Store,
    /// Updates made: the wall clock's seconds, and the set-up's numbers.
    clock: u64,
}

impl World {
    pub(crate) fn new() -> World {
        World {
            tree: Tree::new([0; 16], Timestamp::new(0, 0)),
            store: Store::default(),
            clock: 0,
        }
    }

    /// An update of the run's set-up.
    pub(crate) fn set_up(&mut self, op: UpdateOp) -> Result<Answer, FsError> {
        self.clock += 1;
        let u = Update {
            session: ClientId(1),
            seq: self.clock,
            who: Identity::root(),
            now: Timestamp::new(self.clock as i64, 0),
            op,
        };
        match self.tree.apply(&u) {
            Applied::New(r) | Applied::Duplicate(r) => r,
        }
    }

    /// A file's bytes: its content version's with the overlay made.
    pub(super) fn contents(&self, ino: Ino) -> Vec<u8> {
        let i = self.tree.get(ino).expect("a file");
        match &i.body {
            Body::File { content, overlay } => {
                overlaid(self.store.read(content), overlay, i.attr.size)
            }
            _ => unreachable!("only files"),
        }
    }
}

impl Shell for World {
    fn read<T>(&self, f: impl FnOnce(&Tree) -> T) -> T {
        f(&self.tree)
    }

    fn order(&mut self, update: &Update) -> Result<Result<Answer, FsError>, Failure> {
        Ok(match self.tree.apply(update) {
            Applied::New(r) | Applied::Duplicate(r) => r,
        })
    }

    fn wall(&mut self) -> Timestamp {
        self.clock += 1;
        Timestamp::new(self.clock as i64, 0)
    }

    fn secret(&mut self) -> [u8; 16] {
        self.clock += 1;
        let mut s = [0; 16];
        s[..8].copy_from_slice(&self.clock.to_le_bytes());
        s
    }

    fn read_content(
        &mut self,
        content: &[Capability],
        offset: u64,
        len: u32,
    ) -> Result<Vec<u8>, Failure> {
        let bytes = self.store.read(content);
        let start = (offset as usize).min(bytes.len());
        let end = start.saturating_add(len as usize).min(bytes.len());
        Ok(bytes[start..end].to_vec())
    }

    fn store(&mut self, _ino: Ino, flush: &Flush<'_>) -> Result<(Vec<Capability>, u64), Failure> {
        let bytes = overlaid(self.store.read(flush.base), flush.overlay, flush.size);
        Ok((vec![self.store.put(bytes)], flush.size))
    }
}

impl FsSim {
    /// Sends the primary's answers on to the mounts, checking what they
    /// tell as they are made (a read's bytes, a write's place).
    pub(super) fn answer(&mut self) {
        for ((slot, id, asked), reply) in self.soft.answers() {
            if self.mounts[slot].id != id {
                continue;
            }
            let msg = match (asked, reply) {
                (Asked::Hello | Asked::Return, Ok(_)) => continue,
                (Asked::Events, Ok(Reply::Events(list))) => ToMount::Events(list),
                (
                    Asked::Open {
                        ino,
                        id: open,
                        write,
                        append,
                        have,
                    },
                    Ok(Reply::Opened {
                        attr,
                        grant,
                        content,
                    }),
                ) => {
                    if grant.uncached {
                        self.report.uncached_opens += 1;
                    }
                    self.log(format!(
                        "mount {slot} opens {ino} (write {write}): {:?} uncached={} grant {} at version {}",
                        grant.level, grant.uncached, grant.grant, attr.version
                    ));
                    ToMount::Opened {
                        ino,
                        id: open,
                        write,
                        append,
                        have,
                        attr,
                        grant,
                        content,
                    }
                }
                (Asked::Close { program }, Ok(_)) => {
                    if !program {
                        continue;
                    }
                    ToMount::Done
                }
                (Asked::Read { ino }, Ok(Reply::Data(bytes))) => {
                    self.check_read(slot, ino, &bytes, "the primary");
                    ToMount::Data
                }
                (Asked::Write { ino, data, n }, Ok(Reply::Updated(r))) => {
                    if let Ok(Answer::Written { offset, .. }) = r {
                        self.made(ino, offset, &data);
                    }
                    self.log(format!(
                        "mount {slot} writes {ino} through the primary: {r:?}"
                    ));
                    if r.is_err() {
                        self.violation(format!("a write through to {ino} was refused: {r:?}"));
                    }
                    self.synced.remove(&ino);
                    ToMount::Written { ino, n }
                }
                (Asked::Commit { ino }, Ok(Reply::Updated(r))) => {
                    self.log(format!("mount {slot} commits {ino}: {r:?}"));
                    self.synced.remove(&ino);
                    match r {
                        Ok(Answer::Committed { attr, .. }) => ToMount::Committed { attr },
                        _ => ToMount::Refused {
                            attr: self.world.tree.get(ino).map(|i| i.attr),
                        },
                    }
                }
                (asked, reply) => {
                    self.violation(format!("mount {slot}'s {asked:?} was answered {reply:?}"));
                    continue;
                }
            };
            self.send_mount(slot, id, msg);
        }
    }
}
