//! The primary's calls back to the mount, and the kernel invalidations
//! they need.
//!
//! Two threads: `fs-events` keeps the session's `Events` request parked at
//! the primary and hands each callback to `fs-callbacks`, which carries
//! it out: a recall invalidates what the kernel keeps of the inode, then
//! is answered (`Return`, with the mount's opens of it); a notice
//! invalidates the changed name, then is confirmed (`Confirm`); "stop
//! caching" invalidates the file.  The events thread never waits on the
//! kernel, so a callback that arrives while another is being carried out
//! is still received.  `fs-callbacks` also watches the lease: when no
//! renewal was answered for most of a lease, the primary may have given
//! the mount's tokens to others, so every cache goes.
//!
//! Invalidating a name takes its directory's lock in the kernel, which a
//! request of the mount's may hold while it waits at the primary (two
//! nodes creating in one directory each wait for the other's
//! confirmation).  So the kernel is given [`KERNEL_WAIT`] and no more: an
//! invalidation still blocked then completes when the request does, and
//! the callback is answered meanwhile.  That is the one window in which a
//! node may see a name as it was after another node's change returned: a
//! name of a directory the node is itself changing, until its own change
//! returns.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::{INodeNo, Notifier};
use shoal_cap::Capability;
use shoal_fs::model::{FsError, Identity, Ino};
use shoal_fs::op::{Failure, Op, Reply};
use shoal_fs::tokens::{Callback, LEASE, Level};
use shoal_fssvc::FsClient;
use shoal_rpc::Context;

use crate::conn::Conn;
use crate::writeback::write_back;
use shoal_fs::cache::{RECALL_TRIES, Recall, RecallStep};

/// How long a callback waits for the kernel to carry out an
/// invalidation.
pub(crate) const KERNEL_WAIT: Duration = Duration::from_millis(500);

/// The kernel's notifier, once the mount is up.
#[derive(Default)]
pub(crate) struct Kernel {
    notifier: OnceLock<Notifier>,
}

impl Kernel {
    pub(crate) fn set(&self, n: Notifier) {
        let _ = self.notifier.set(n);
    }

    /// Invalidates inodes (attributes, and pages from offset for length;
    /// a negative offset: attributes only) and names, waiting at most
    /// [`KERNEL_WAIT`].  Whether the kernel finished in time.
    pub(crate) fn inval(&self, inodes: Vec<(Ino, i64, i64)>, names: Vec<(Ino, Vec<u8>)>) -> bool {
        let Some(n) = self.notifier.get().cloned() else {
            return true;
        };
        let (tx, rx) = channel();
        let spawned = std::thread::Builder::new()
            .name("fs-inval".into())
            .spawn(move || {
                // An inode or name the kernel does not hold is an error
                // (ENOENT) that means there was nothing to do.
                for (ino, off, len) in inodes {
                    let _ = n.inval_inode(INodeNo(ino.0), off, len);
                }
                for (dir, name) in names {
                    let _ = n.inval_entry(INodeNo(dir.0), std::ffi::OsStr::from_bytes(&name));
                }
                let _ = tx.send(());
            });
        if spawned.is_err() {
            tracing::warn!("cannot start a thread to invalidate the kernel's caches");
            return false;
        }
        match rx.recv_timeout(KERNEL_WAIT) {
            Ok(()) => true,
            Err(_) => {
                tracing::debug!("the kernel is still invalidating after {KERNEL_WAIT:?}");
                false
            }
        }
    }
}

use std::os::unix::ffi::OsStrExt;

/// Work for `fs-callbacks`.
#[derive(Debug)]
pub(crate) enum Work {
    /// A recall whose grant the mount has seen.
    Recall {
        ino: Ino,
        to: Level,
        grant: u64,
    },
    /// Write a file back (every dirty file: `None`), then say how it went.
    Flush {
        ino: Option<Ino>,
        safety: bool,
        done: std::sync::mpsc::Sender<Result<(), Failure>>,
    },
    Notice {
        id: u64,
        dir: Ino,
        name: Vec<u8>,
    },
    /// The file has no names: unless it is open here, its dirty changes
    /// are dropped, never written.
    Orphan {
        ino: Ino,
    },
    /// Invalidations with no answer to send ("stop caching", a lost
    /// session).
    Inval {
        inodes: Vec<(Ino, i64, i64)>,
        names: Vec<(Ino, Vec<u8>)>,
    },
    /// Versions no name or open refers to any more (replaced by a
    /// write-back), destroyed off the path of the `fsync` or close that
    /// replaced them; one missed is collected by the file servers' ageing.
    Destroy {
        content: Vec<Capability>,
    },
}

/// The two threads.
pub(crate) struct Callbacks {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Callbacks {
    pub(crate) fn start(ctx: &Context, name: &str, conn: Arc<Conn>) -> Result<Callbacks, Failure> {
        let poller = FsClient::for_session(ctx, name, conn.session())?;
        let answerer = FsClient::for_session(ctx, name, conn.session())?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = channel();
        conn.set_work(tx);
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|e| Failure::Unavailable(format!("cannot start a thread: {e}")))
        };
        let events = {
            let (conn, flag) = (conn.clone(), stop.clone());
            spawn("fs-events", Box::new(move || events(poller, &conn, &flag)))?
        };
        let worker = {
            let flag = stop.clone();
            spawn(
                "fs-callbacks",
                Box::new(move || work(answerer, &conn, &rx, &flag)),
            )?
        };
        Ok(Callbacks {
            stop,
            threads: vec![events, worker],
        })
    }
}

impl Drop for Callbacks {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// `fs-events`: keeps an `Events` request parked at the primary.
fn events(mut poller: FsClient, conn: &Conn, stop: &AtomicBool) {
    // Failed polls in a row: the first is logged, then every 50th (one
    // every ten seconds or so), so a lease that cannot be renewed says why.
    let mut failed = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let sent = conn.lease.now();
        let op = Op::Events {
            confirm: Vec::new(),
        };
        let hellos = conn.hellos();
        let list = match poller.call_within(&Identity::root(), op, Duration::from_secs(5)) {
            Ok(Reply::Events(list)) => list,
            Err(Failure::NoSession) => {
                tracing::debug!("the lease's poll found the session unknown");
                if let Err(e) = conn.recover(hellos) {
                    tracing::warn!("starting the session again failed: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
                continue;
            }
            other => {
                let why = match other {
                    Err(e) => e.to_string(),
                    Ok(r) => format!("an unexpected answer {r:?}"),
                };
                if failed.is_multiple_of(50) {
                    tracing::warn!("renewing the lease ({} failed in a row): {why}", failed + 1);
                } else {
                    tracing::debug!("renewing the lease ({} failed in a row): {why}", failed + 1);
                }
                failed = failed.saturating_add(1);
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        if failed > 0 {
            tracing::info!("the lease is renewed again, after {failed} failed renewals");
        }
        failed = 0;
        conn.lease.renewed(sent);
        for cb in list {
            match cb {
                Callback::Recall { ino, to, grant } => {
                    let ready = conn.cache.lock().recall(ino, to, grant);
                    if let Some((ino, to, grant)) = ready {
                        conn.post(Work::Recall { ino, to, grant });
                    }
                }
                Callback::Notice { id, dir, name } => {
                    // The directory's attributes changed with the name:
                    // those the mount keeps no longer answer `getattr`.
                    conn.cache.lock().noticed(dir, &name);
                    conn.post(Work::Notice { id, dir, name });
                }
                Callback::Orphan { ino } => conn.post(Work::Orphan { ino }),
                Callback::Unlocked { ino } => conn.locks.wake(ino),
                Callback::StopCaching { ino, grant } => {
                    if conn.cache.lock().stop_caching(ino, grant) {
                        conn.post(Work::Inval {
                            inodes: vec![(ino, 0, 0)],
                            names: Vec::new(),
                        });
                    }
                }
            }
        }
    }
}

/// `fs-callbacks`: carries the callbacks out, in the order they came.
fn work(mut answerer: FsClient, conn: &Arc<Conn>, rx: &Receiver<Work>, stop: &AtomicBool) {
    // A lease's end as the mount sees it comes before the primary's: it
    // counts from when the renewal was sent, and gives up 2 s early.
    let lease = LEASE.saturating_sub(Duration::from_secs(2));
    let mut expired = false;
    let mut trim = crate::memory::Trim::default();
    while !stop.load(Ordering::Relaxed) {
        trim.tick(conn.cache.lock().dirty_and_written());
        if conn.lease.older_than(lease) {
            if !expired {
                tracing::warn!("no lease renewal answered for a lease: dropping every cache");
                conn.drop_caches();
                expired = true;
            }
        } else {
            expired = false;
        }
        if conn.push_due()
            && let Err(e) = conn.push()
        {
            tracing::warn!("pushing the private directories' changes: {e}");
        }
        let due = (conn.cache.lock()).due(conn.lease.now(), conn.tuning.write_back_after);
        for ino in due {
            if let Err(e) = write_back(conn, &mut answerer, ino, false) {
                tracing::warn!("writing file {ino} back: {e}");
            }
        }
        let first = match rx.recv_timeout(Duration::from_millis(500)) {
            Ok(w) => w,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let mut confirm = Vec::new();
        let mut next = Some(first);
        while let Some(w) = next.take() {
            match w {
                Work::Recall { ino, to, grant } => {
                    let r = recall(&mut answerer, conn, ino, to, grant);
                    answer(&mut answerer, conn, r);
                }
                Work::Flush { ino, safety, done } => {
                    let inos = match ino {
                        Some(i) => vec![i],
                        None => conn.cache.lock().all_dirty(),
                    };
                    let mut result = Ok(());
                    for i in inos {
                        let written = write_back(conn, &mut answerer, i, safety);
                        // Changes lost at this write-back or an earlier
                        // one (by the clock) are reported once, to the
                        // file's next fsync.
                        if ino.is_some() && conn.cache.lock().take_lost(i) {
                            result = Err(Failure::Fs(FsError::Io));
                        }
                        if let Err(e) = written {
                            tracing::warn!("writing file {i} back: {e}");
                            result = Err(e);
                        }
                    }
                    let _ = done.send(result);
                }
                Work::Notice { id, dir, name } => {
                    let names = if conn.cache.lock().notice(dir, &name) {
                        vec![(dir, name)]
                    } else {
                        Vec::new()
                    };
                    // The directory's own attributes (times, size, link
                    // count) changed with the name.
                    conn.kernel.inval(vec![(dir, 0, 0)], names);
                    confirm.push(id);
                }
                Work::Orphan { ino } => {
                    if !conn.is_open(ino) && conn.cache.lock().discard(ino) {
                        tracing::debug!("file {ino} went with its changes unwritten");
                    }
                }
                Work::Inval { inodes, names } => {
                    conn.kernel.inval(inodes, names);
                }
                Work::Destroy { content } => crate::writeback::destroy(conn, &content),
            }
            next = rx.try_recv().ok();
        }
        if !confirm.is_empty()
            && let Err(e) = answerer.call(&Identity::root(), Op::Confirm { ids: confirm })
        {
            tracing::warn!("confirming notices failed: {e}");
        }
    }
}

/// Takes the token a recall asks for, writing the file's dirty changes
/// back first (they must reach the primary before the answer does).
fn recall(answerer: &mut FsClient, conn: &Arc<Conn>, ino: Ino, to: Level, grant: u64) -> Recall {
    // Another mount looks at a private inode: the pending changes go
    // first, and nothing is private any more (nothing happens otherwise).
    let mut pushed = conn.unprivate(&[ino]);
    for _ in 1..RECALL_TRIES {
        if pushed.is_ok() {
            break;
        }
        pushed = conn.unprivate(&[ino]);
    }
    if let Err(e) = pushed {
        tracing::warn!("pushing the private directories' changes for a recall: {e}");
        conn.lose_private();
    }
    let mut tries = 0;
    loop {
        let step = conn.cache.lock().recall_step(ino, to, grant, tries);
        match step {
            RecallStep::Answer(r) => return r,
            RecallStep::GiveUp(r) => {
                tracing::warn!(
                    "file {ino}: answering a recall with changes not written back \
                     (they are retried)"
                );
                return r;
            }
            RecallStep::WriteBack => {
                if let Err(e) = write_back(conn, answerer, ino, false) {
                    tracing::warn!("writing file {ino} back for a recall: {e}");
                }
                tries += 1;
            }
        }
    }
}

/// Carries out a recall and answers it.
fn answer(answerer: &mut FsClient, conn: &Conn, r: Recall) {
    if r.inval {
        let names = r.names.into_iter().map(|n| (r.ino, n)).collect();
        conn.kernel.inval(vec![(r.ino, 0, 0)], names);
    }
    let back = Op::Return {
        ino: r.ino,
        grant: r.grant,
        kept: r.to,
        opens: conn.report(r.ino),
    };
    match answerer.call(&Identity::root(), back) {
        Ok(_) | Err(Failure::NoSession) => {}
        Err(e) => tracing::warn!("answering a recall of {} failed: {e}", r.ino),
    }
}
