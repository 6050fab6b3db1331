//! A mount in the file system scenario: the cache and table of opens the
//! FUSE mount ships (`shoal_fs::cache`), driven as the mount drives them.
//! Two things happen at once in each, as in the mount: a program's
//! operation (one at a time: open, read, write, close, `fsync`), and the
//! callbacks thread's work (write-backs when due, recalls, `fsync`s'
//! flushes), one item at a time, each write-back waiting for its commit's
//! answer while the program goes on writing.

use std::collections::VecDeque;

use shoal_cap::Capability;
use shoal_fs::cache::opens::OpenTable;
use shoal_fs::cache::{Cache, FlushJob, RecallStep};
use shoal_fs::model::{Attr, Ino, Timestamp};
use shoal_fs::op::Grant;
use shoal_fs::tokens::{Callback, ClientId, Level, OpenId, Want};
use shoal_fs::tree::overlaid;
use shoal_proto::Time;

use shoal_fs::op::Op;
use shoal_fs::update::UpdateOp;

use super::{Asked, FsSim};

/// What a program waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Busy {
    Open,
    Read,
    Write,
    Close,
    Fsync(Ino),
}

/// An open file of a program.
#[derive(Debug, Clone, Copy)]
pub(super) struct Handle {
    pub ino: Ino,
    pub open: OpenId,
    pub write: bool,
    pub append: bool,
}

/// Work for the callbacks thread.
#[derive(Debug, Clone)]
pub(super) enum Work {
    Recall { ino: Ino, to: Level, grant: u64 },
    Flush { ino: Ino },
}

/// What a write-back is for.
#[derive(Debug, Clone, Copy)]
pub(super) enum Then {
    Due,
    Recall { to: Level, grant: u64, tries: usize },
    Fsync,
}

/// A write-back whose commit is under way.
#[derive(Debug)]
pub(super) struct Doing {
    pub ino: Ino,
    pub job: FlushJob,
    pub content: Vec<Capability>,
    pub then: Then,
}

/// The answers a mount gets.
#[derive(Debug, Clone)]
pub(super) enum ToMount {
    Opened {
        ino: Ino,
        id: OpenId,
        write: bool,
        append: bool,
        have: Vec<(OpenId, bool)>,
        attr: Attr,
        grant: Grant,
        content: Vec<Capability>,
    },
    Data,
    /// A write through the primary was made (the `n`th record of an
    /// append, or 0).
    Written {
        ino: Ino,
        n: u64,
    },
    Committed {
        attr: Attr,
    },
    /// A commit refused; the file's attributes now.
    Refused {
        attr: Option<Attr>,
    },
    Done,
    /// The answer to the mount's parked `Events` request.
    Events(Vec<Callback>),
}

pub(super) struct Mount {
    pub id: ClientId,
    /// The session's last request number.
    pub seq: u64,
    pub cache: Cache,
    pub opens: OpenTable,
    pub busy: Option<Busy>,
    pub handles: Vec<Handle>,
    pub work: VecDeque<Work>,
    pub doing: Option<Doing>,
    /// Records this session appended, and were acknowledged.
    pub appended: u64,
}

impl Mount {
    pub(super) fn new(id: ClientId) -> Mount {
        Mount {
            id,
            seq: 0,
            cache: Cache::default(),
            opens: OpenTable::default(),
            busy: None,
            handles: Vec::new(),
            work: VecDeque::new(),
            doing: None,
            appended: 0,
        }
    }
}

/// The largest file a read asks for.
pub(super) const READ_MAX: usize = 1 << 20;

impl FsSim {
    fn when(&self) -> (Timestamp, Time) {
        (Timestamp::new(self.now as i64, 0), self.clock())
    }

    /// A program's next operation on mount `slot`.
    pub(super) fn start_op(&mut self, slot: usize) {
        let pick = self.rng.random_range(0..5u8);
        let handles = self.mounts[slot].handles.clone();
        if handles.is_empty() || (pick == 0 && handles.len() < 2) {
            let ino = self.files[self.rng.random_range(0..self.files.len())];
            let write = self.rng.random_bool(0.5);
            let append = self.logs.contains(&ino);
            self.open(slot, ino, write, append);
            return;
        }
        let h = handles[self.rng.random_range(0..handles.len())];
        match pick {
            1 => self.read(slot, h.ino),
            2 if h.write && h.append => {
                let m = &mut self.mounts[slot];
                let n = m.appended + 1;
                let data = format!("<{}:{n}>", m.id).into_bytes();
                self.write(slot, h, data, n);
            }
            2 if h.write => {
                let data = vec![self.rng.random_range(b'a'..=b'z'); self.rng.random_range(1..4)];
                self.write(slot, h, data, 0);
            }
            3 if h.write => {
                self.mounts[slot].busy = Some(Busy::Fsync(h.ino));
                self.mounts[slot].work.push_back(Work::Flush { ino: h.ino });
            }
            _ => self.close(slot, h),
        }
    }

    fn open(&mut self, slot: usize, ino: Ino, write: bool, append: bool) {
        let m = &mut self.mounts[slot];
        if !write && m.cache.open_cached(ino).is_some() {
            let id = m.opens.number();
            m.opens.record(ino, id, false);
            m.handles.push(Handle {
                ino,
                open: id,
                write,
                append,
            });
            self.log(format!("mount {slot} opens {ino} under its token"));
            return;
        }
        let id = m.opens.number();
        let have = m.opens.of(ino);
        m.busy = Some(Busy::Open);
        let want = if write {
            Want::OpenWrite
        } else {
            Want::OpenRead
        };
        let asked = Asked::Open {
            ino,
            id,
            write,
            append,
            have: have.clone(),
        };
        let op = Op::Open {
            ino,
            want,
            have,
            id,
            cached: None,
        };
        self.send_primary(slot, asked, op);
    }

    fn read(&mut self, slot: usize, ino: Ino) {
        let m = &self.mounts[slot];
        if let Some(c) = m.cache.content(ino) {
            let base = self.world.store.read(&c.content);
            if let Some(bytes) = m.cache.finish_read(ino, c.version, 0, READ_MAX, &base) {
                self.check_read(slot, ino, &bytes, "its cache");
                return;
            }
        }
        self.mounts[slot].busy = Some(Busy::Read);
        let op = Op::Read {
            ino,
            offset: 0,
            len: READ_MAX as u32,
        };
        self.send_primary(slot, Asked::Read { ino }, op);
    }

    /// A write of `data` (the `n`th record of an append, or 0).
    fn write(&mut self, slot: usize, h: Handle, data: Vec<u8>, n: u64) {
        self.synced.remove(&h.ino);
        let offset = (!h.append).then(|| self.rng.random_range(0..8u64));
        let when = self.when();
        let m = &mut self.mounts[slot];
        if let Some(at) = m.cache.write(h.ino, offset, &data, when) {
            m.appended = m.appended.max(n);
            self.made(h.ino, at, &data);
            let data = String::from_utf8_lossy(&data).into_owned();
            self.log(format!(
                "mount {slot} writes {data:?} to {} at {at} in its cache",
                h.ino
            ));
            return;
        }
        m.busy = Some(Busy::Write);
        let asked = Asked::Write {
            ino: h.ino,
            data: data.clone(),
            n,
        };
        let op = Op::Write {
            ino: h.ino,
            offset,
            data,
        };
        self.send_primary(slot, asked, op);
    }

    fn close(&mut self, slot: usize, h: Handle) {
        let m = &mut self.mounts[slot];
        m.handles.retain(|x| x.open != h.open);
        if m.opens.forget(h.ino, h.open) {
            m.busy = Some(Busy::Close);
            let op = Op::Close {
                ino: h.ino,
                id: h.open,
            };
            self.send_primary(slot, Asked::Close { program: true }, op);
        }
    }

    /// The callbacks thread, when idle: write-backs due first, then the
    /// next item of work.
    pub(super) fn callbacks_thread(&mut self, slot: usize) {
        if self.mounts[slot].doing.is_some() {
            return;
        }
        let due = self.mounts[slot]
            .cache
            .due(self.clock(), self.cfg.write_back_after);
        if let Some(ino) = due.into_iter().min() {
            self.write_back(slot, ino, Then::Due);
            return;
        }
        match self.mounts[slot].work.pop_front() {
            Some(Work::Recall { ino, to, grant }) => self.recall(slot, ino, to, grant, 0),
            Some(Work::Flush { ino }) => self.write_back(slot, ino, Then::Fsync),
            None => {}
        }
    }

    /// The mount's `write_back`: the file's bytes with the changes made
    /// stored as a new file, and its commit sent.
    fn write_back(&mut self, slot: usize, ino: Ino, then: Then) {
        let Some(job) = self.mounts[slot].cache.flush_job(ino) else {
            return self.written_back(slot, ino, then);
        };
        let base = self.world.store.read(&job.content);
        let content = vec![self.world.store.put(overlaid(base, &job.changes, job.size))];
        let op = UpdateOp::Commit {
            ino,
            base: job.version,
            content: content.clone(),
            size: job.size,
            // The simulator's contents are whole: all data.
            held: job.size,
            mtime: job.mtime,
            flush: false,
        };
        self.send_primary(
            slot,
            Asked::Commit { ino },
            Op::Change { op, durable: false },
        );
        self.mounts[slot].doing = Some(Doing {
            ino,
            job,
            content,
            then,
        });
    }

    fn written_back(&mut self, slot: usize, ino: Ino, then: Then) {
        match then {
            Then::Due => {}
            Then::Fsync => {
                let m = &mut self.mounts[slot];
                m.busy = None;
                if !m.cache.take_lost(ino) && !m.cache.is_dirty(ino) {
                    let b = self.contents(ino);
                    self.synced.insert(ino, b);
                }
            }
            Then::Recall { to, grant, tries } => self.recall(slot, ino, to, grant, tries + 1),
        }
    }

    /// The mount's `recall`: write-backs, then the answer.
    fn recall(&mut self, slot: usize, ino: Ino, to: Level, grant: u64, tries: usize) {
        let step = self.mounts[slot].cache.recall_step(ino, to, grant, tries);
        let r = match step {
            RecallStep::WriteBack => {
                return self.write_back(slot, ino, Then::Recall { to, grant, tries });
            }
            RecallStep::Answer(r) => r,
            RecallStep::GiveUp(r) => {
                self.log(format!(
                    "mount {slot} answers the recall of {ino} with changes not written back"
                ));
                r
            }
        };
        let opens = self.mounts[slot].opens.report(ino);
        self.log(format!(
            "mount {slot} answers the recall of {ino} (grant {grant}): keeps {:?}, opens {opens:?}",
            r.to
        ));
        let op = Op::Return {
            ino,
            grant: r.grant,
            kept: r.to,
            opens,
        };
        self.send_primary(slot, Asked::Return, op);
    }

    /// Recalls waiting for a grant just seen go to the callbacks thread.
    fn settle(&mut self, slot: usize) {
        let m = &mut self.mounts[slot];
        for (ino, to, grant) in m.cache.ready() {
            m.work.push_back(Work::Recall { ino, to, grant });
        }
    }

    pub(super) fn mount(&mut self, slot: usize, msg: ToMount) {
        match msg {
            ToMount::Opened {
                ino,
                id,
                write,
                append,
                have,
                attr,
                grant,
                content,
            } => {
                let m = &mut self.mounts[slot];
                if grant.uncached {
                    for old in m.opens.learned(ino, &have) {
                        let op = Op::Close { ino, id: old };
                        self.send_primary(slot, Asked::Close { program: false }, op);
                    }
                }
                let m = &mut self.mounts[slot];
                m.cache.opened(&attr, &grant, content);
                m.opens.record(ino, id, write);
                if grant.uncached {
                    m.opens.learn([id]);
                }
                m.handles.push(Handle {
                    ino,
                    open: id,
                    write,
                    append,
                });
                m.busy = None;
                self.settle(slot);
            }
            ToMount::Data | ToMount::Done => self.mounts[slot].busy = None,
            ToMount::Written { ino, n } => {
                let m = &mut self.mounts[slot];
                m.cache.drop_token(ino);
                m.appended = m.appended.max(n);
                m.busy = None;
            }
            ToMount::Committed { attr } => {
                let Some(d) = self.mounts[slot].doing.take() else {
                    return;
                };
                let at = self.clock();
                let m = &mut self.mounts[slot];
                m.cache.flushed(&d.job, &attr, d.content, at);
                self.written_back(slot, d.ino, d.then);
            }
            ToMount::Refused { attr } => {
                let Some(d) = self.mounts[slot].doing.take() else {
                    return;
                };
                let at = self.clock();
                let m = &mut self.mounts[slot];
                // As the mount decides: under `Write`, a version one past
                // the job's is its own commit made already.
                match attr {
                    Some(a) if m.cache.holds_write(d.ino) && a.version == d.job.version + 1 => {
                        m.cache.flushed(&d.job, &a, d.content, at);
                    }
                    Some(_) => {
                        m.cache.lose(d.ino);
                        self.violation(format!(
                            "mount {slot} lost {} changes to file {}: its commit over version {} was refused",
                            d.job.changes.len(),
                            d.ino,
                            d.job.version
                        ));
                    }
                    None => {
                        m.cache.discard(d.ino);
                    }
                }
                self.written_back(slot, d.ino, d.then);
            }
            ToMount::Events(list) => {
                for cb in list {
                    self.callback(slot, cb);
                }
                let op = Op::Events {
                    confirm: Vec::new(),
                };
                self.send_primary(slot, Asked::Events, op);
            }
        }
    }

    /// A callback, as the mount's events thread takes it.
    fn callback(&mut self, slot: usize, cb: Callback) {
        self.log(format!("callback to mount {slot}: {cb:?}"));
        match cb {
            Callback::Recall { ino, to, grant } => {
                self.report.recalls += 1;
                let m = &mut self.mounts[slot];
                if let Some((ino, to, grant)) = m.cache.recall(ino, to, grant) {
                    m.work.push_back(Work::Recall { ino, to, grant });
                }
            }
            Callback::StopCaching { ino, grant } => {
                self.mounts[slot].cache.stop_caching(ino, grant);
            }
            Callback::Notice { .. } | Callback::Orphan { .. } | Callback::Unlocked { .. } => {}
        }
    }
}

use rand::Rng;
