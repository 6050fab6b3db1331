//! Writing a file's dirty changes back (`docs/fs.md`, "Delayed write"):
//! the changes stored as a new version on `copies` file servers (edits of
//! the version they were made over, `shoal_fssvc::store`), then one
//! `Commit` naming the
//! version the changes were made over.  The primary makes it the file's
//! next version, or refuses it if the file changed meanwhile (possible
//! only after this mount lost its token): then the file's bytes as this
//! mount had them are kept as `/.lost/NODE-INO-SECS`, root's alone, the
//! loss is logged, and the `fsync` that asked, or else the file's next
//! one, fails with `EIO`.  Done by the mount's callbacks thread (for a
//! recall, and when the write-back window ends) and by the thread that
//! asks (`fsync`, a file over the dirty limit), files in parallel, each
//! by one thread at a time ([`WriteBacks`]): a recall's answer follows
//! the write-back it needs.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use rustc_hash::FxHashSet;

use shoal_cap::Capability;
use shoal_fs::model::{Attr, FsError, Identity, Ino, Kind, ROOT, Timestamp};
use shoal_fs::op::{Failure, Op, Reply};
use shoal_fs::update::{Answer, UpdateOp};
use shoal_fssvc::FsClient;
use shoal_fssvc::store::{Changes, Version};

use crate::callbacks::Work;
use crate::conn::Conn;
use shoal_fs::cache::FlushJob;

/// The write-backs in flight, and the session's clients for those made on
/// the thread that asks for them (an `fsync`): files are written back in
/// parallel, each one by one thread at a time, so that a recall's
/// write-back follows the one in flight, and two never commit over the
/// same version.
#[derive(Default)]
pub(crate) struct WriteBacks {
    busy: Mutex<FxHashSet<Ino>>,
    done: Condvar,
    /// Clients of the mount's session, one per thread writing back at a
    /// time (a commit needs no exactly-once record: any of the session's
    /// callers may send it).
    clients: Mutex<Vec<FsClient>>,
}

/// A file's turn to be written back; the next waits until it is dropped.
struct Turn<'a> {
    of: &'a WriteBacks,
    ino: Ino,
}

impl WriteBacks {
    fn turn(&self, ino: Ino) -> Turn<'_> {
        let mut busy = self.busy.lock();
        while busy.contains(&ino) {
            self.done.wait(&mut busy);
        }
        busy.insert(ino);
        Turn { of: self, ino }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.of.busy.lock().remove(&self.ino);
        self.of.done.notify_all();
    }
}

/// Writes `ino`'s dirty changes back on this thread, through a client of
/// the session's own; with `safety`, the bytes are on the file servers'
/// disks before the commit.  Changes lost at this write-back or an earlier
/// one are reported once, here.
pub(crate) fn write_back_here(conn: &Arc<Conn>, ino: Ino, safety: bool) -> Result<(), Failure> {
    let written = with_pooled(conn, |via| write_back(conn, via, ino, safety));
    if conn.cache.lock().take_lost(ino) {
        return Err(Failure::Fs(FsError::Io));
    }
    written
}

thread_local! {
    /// Durable changes this thread sent and had answered: each was
    /// answered once the primary's log held on its disk every update it
    /// had applied.
    static DURABLE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many durable changes this thread has had answered: an `fsync`
/// whose write-back or push was one needs no [`sync_primary`] after it.
pub(crate) fn durable_answers() -> u64 {
    DURABLE.get()
}

/// A durable change sent from this thread was answered.
pub(crate) fn answered_durable() {
    DURABLE.set(DURABLE.get() + 1);
}

/// The end of an `fsync` on this thread, which found `before` durable
/// answers: a [`sync_primary`] unless it had one since.  (A durable
/// answer came after the primary applied every update this `fsync`
/// made: its own commit or push carried them.)
pub(crate) fn sync_unless_durable(conn: &Arc<Conn>, before: u64) -> Result<(), Failure> {
    if durable_answers() == before {
        sync_primary(conn)
    } else {
        Ok(())
    }
}

/// Makes every change the primary answered so far durable on its disk
/// (`Op::Sync`): the end of an `fsync` that sent no durable change (a
/// clean file whose names were pushed already, perhaps by a push that
/// was not), whose updates were answered once r + 1 metadata replicas
/// held them in memory.
pub(crate) fn sync_primary(conn: &Arc<Conn>) -> Result<(), Failure> {
    match with_pooled(conn, |via| via.call(&Identity::root(), Op::Sync))? {
        Reply::Done => Ok(()),
        other => Err(shoal_fssvc::client::unexpected(&other)),
    }
}

/// Runs `f` with a client of the write-backs' pool (one made for the
/// session if none is free), not holding the session's own client across
/// a wait for the disks; if the primary forgot the session, starts it
/// again and runs `f` once more (at most five times).
fn with_pooled<T>(
    conn: &Arc<Conn>,
    mut f: impl FnMut(&mut FsClient) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let mut tries = 0;
    loop {
        let seen = conn.hellos();
        let taken = conn.write_backs.clients.lock().pop();
        let mut via = match taken {
            Some(c) => c,
            None => FsClient::for_session(&conn.ctx, &conn.name, conn.session())?,
        };
        let done = f(&mut via);
        conn.write_backs.clients.lock().push(via);
        match done {
            Err(Failure::NoSession) if tries < 5 => {
                tries += 1;
                conn.recover(seen)?;
            }
            done => return done,
        }
    }
}

/// Writes `ino`'s dirty changes back through `via` (a client of the
/// mount's session); with `safety` (an `fsync`), the bytes are on the
/// file servers' disks before the commit, and the commit is durable (on
/// the primary's disk before it is answered).
pub(crate) fn write_back(
    conn: &Arc<Conn>,
    via: &mut FsClient,
    ino: Ino,
    safety: bool,
) -> Result<(), Failure> {
    let _turn = conn.write_backs.turn(ino);
    if !conn.cache.lock().is_dirty(ino) {
        return Ok(());
    }
    // A private file's name must reach the primary before its bytes (its
    // directories stay private): its commit is pushed after the pending
    // changes, in the same request.
    let private = conn.private_mentions(ino);
    let Some(job) = conn.cache.lock().flush_job(ino) else {
        return Ok(());
    };
    // As edits of each replica of the version the changes were made
    // over, or copies of it, or a new file (`shoal_fssvc::store`).
    let changes = Changes {
        base: &job.content,
        base_size: job.base_size,
        base_held: job.base_held,
        overlay: &job.changes,
        size: job.size,
    };
    match conn.store(ino, &changes, safety) {
        Ok(version) => commit(conn, via, ino, &job, version, private, safety),
        // A version's content goes when a newer version replaced it: if
        // the file moved on (after this mount lost its token), the changes
        // can never be written back, and are kept over nothing; so they
        // are if no file server holds the version any more.  Otherwise the
        // file servers failed: try again.
        Err(e) if !job.content.is_empty() => {
            match conn.publish(&[ino]).and_then(|()| attr_now(conn, via, ino)) {
                Ok(Some(attr)) if attr.version != job.version || e == Failure::Fs(FsError::Io) => {
                    let over_nothing = Changes {
                        base: &[],
                        base_size: 0,
                        base_held: 0,
                        ..changes
                    };
                    let version = conn.store(ino, &over_nothing, false)?;
                    let why = if attr.version != job.version {
                        "its version is gone"
                    } else {
                        "no file server holds its version"
                    };
                    Err(lose(conn, ino, &job, version, why))
                }
                // The file went (its last name and open): nothing to keep.
                Ok(None) => {
                    conn.cache.lock().discard(ino);
                    Ok(())
                }
                _ => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Commits `version`, the file with `job`'s changes, as its next version:
/// pushed with the pending changes if the file is `private`; `durable`,
/// answered once the primary's log holds it on disk.
fn commit(
    conn: &Arc<Conn>,
    via: &mut FsClient,
    ino: Ino,
    job: &FlushJob,
    version: Version,
    private: bool,
    durable: bool,
) -> Result<(), Failure> {
    let Version { content, held } = version;
    let lost = |content| Version { content, held };
    let op = UpdateOp::Commit {
        ino,
        base: job.version,
        content: content.clone(),
        size: job.size,
        held,
        mtime: job.mtime,
        flush: false,
    };
    let made = op.clone();
    // Pushed, the commit is answered as one sent on its own would be (a
    // failed push may have been made with its answer lost: the content
    // stays, as below).
    // A commit pushed went in a durable push if it is durable: the
    // push that took it was made for every commit queued.
    let pushed = if private {
        conn.push_commit(ino, &op, durable)?
    } else {
        None
    };
    let answer = match pushed {
        Some(result) => {
            if durable {
                answered_durable();
            }
            Ok(Reply::Updated(result))
        }
        None => {
            let answer = via.call(&Identity::root(), Op::Change { op, durable });
            if durable && answer.is_ok() {
                answered_durable();
            }
            answer
        }
    };
    match answer {
        Ok(Reply::Updated(Ok(Answer::Committed { attr, old }))) => {
            conn.private_committed(&made, attr.ctime);
            conn.cache
                .lock()
                .flushed(job, &attr, content, conn.lease.now());
            // Nobody else held the file while this mount wrote it: the
            // replaced version is no one's.
            if !old.is_empty() {
                conn.post(Work::Destroy { content: old });
            }
            Ok(())
        }
        // The file went (its last name and open): nothing to keep.
        Ok(Reply::Updated(Err(FsError::NotFound))) => {
            gone(conn, ino, &content);
            Ok(())
        }
        // Refused while this mount holds the file's `Write` token: if it
        // held it since the changes were made, no one else changed the
        // file, so this is the commit made already, whose answer was
        // lost, asked again.  Otherwise the token is a newer grant (the
        // session was lost and the file opened again since), and the file
        // changed elsewhere in between: the changes are lost.
        Ok(Reply::Updated(Err(e))) if conn.cache.lock().holds_write(ino) => {
            match attr_now(conn, via, ino)? {
                Some(attr) if attr.version == job.version + 1 => {
                    conn.private_committed(&made, attr.ctime);
                    conn.cache
                        .lock()
                        .flushed(job, &attr, content, conn.lease.now());
                    Ok(())
                }
                Some(_) => Err(lose(conn, ino, job, lost(content), &e.to_string())),
                None => {
                    gone(conn, ino, &content);
                    Ok(())
                }
            }
        }
        Ok(Reply::Updated(Err(e))) => Err(lose(conn, ino, job, lost(content), &e.to_string())),
        Ok(other) => {
            destroy(conn, &content);
            Err(shoal_fssvc::client::unexpected(&other))
        }
        // The commit may have been made with its answer lost: its
        // content stays.
        Err(e) => Err(e),
    }
}

/// The file went while its changes were being written back: they go,
/// and so does the version just stored for them.
fn gone(conn: &Conn, ino: Ino, content: &[Capability]) {
    conn.cache.lock().discard(ino);
    destroy(conn, content);
}

/// `ino`'s attributes now (`None`: it is gone), asked of the primary
/// through `via`.
fn attr_now(conn: &Conn, via: &mut FsClient, ino: Ino) -> Result<Option<Attr>, Failure> {
    match via.call(&Identity::root(), Op::GetAttr { ino }) {
        Ok(Reply::Entry { attr, grant }) => {
            conn.granted(&attr, &grant);
            Ok(Some(attr))
        }
        Err(Failure::Fs(FsError::NotFound)) => Ok(None),
        Ok(other) => Err(shoal_fssvc::client::unexpected(&other)),
        Err(e) => Err(e),
    }
}

/// Changes that can never be written back (`why`): the file changed
/// elsewhere after this mount lost its token.  The bytes its programs
/// wrote, stored as `version`, are kept aside, root's alone, and the
/// error for the `fsync` that asked.  Kept on a thread of its own, not
/// this one, which answers recalls: names are made through the session's
/// shared client, which a FUSE thread may hold while it waits for a
/// recall's answer.
fn lose(conn: &Arc<Conn>, ino: Ino, job: &FlushJob, version: Version, why: &str) -> Failure {
    tracing::error!(
        "file {ino}: {} changes not written back ({why}): the file changed \
         elsewhere after this mount lost its token",
        job.changes.len()
    );
    conn.cache.lock().lose(ino);
    // The kernel may hold attributes patched with them: the callbacks
    // thread invalidates them (this may be a FUSE thread, in the middle
    // of the kernel's request).
    conn.post(crate::callbacks::Work::Inval {
        inodes: vec![(ino, 0, 0)],
        names: Vec::new(),
    });
    let keeper = conn.clone();
    let (size, mtime) = (job.size, job.mtime);
    let kept = std::thread::Builder::new()
        .name("fs-lost".into())
        .spawn(
            move || match keep_lost(&keeper, ino, &version, size, mtime) {
                Ok(name) => tracing::error!(
                    "file {ino}: its bytes as this mount had them are kept as /{LOST}/{name}"
                ),
                Err(k) => {
                    tracing::error!(
                        "file {ino}: keeping its bytes in /{LOST} failed ({k}): they are lost"
                    );
                    destroy(&keeper, &version.content);
                }
            },
        );
    if let Err(e) = kept {
        tracing::error!("file {ino}: cannot start a thread to keep its bytes ({e})");
    }
    // What a program's fsync sees when its writes were lost.
    Failure::Fs(FsError::Io)
}

/// The directory, in the tree's root, where changes that could not be
/// written back are kept.
const LOST: &str = ".lost";

/// Keeps a file's bytes that could not be written back as
/// `/.lost/NODE-INO-SECS` (root's, mode 0600, in a directory made mode
/// 0700 if need be), through the session's shared client: the name made.
fn keep_lost(
    conn: &Conn,
    ino: Ino,
    version: &Version,
    size: u64,
    mtime: Timestamp,
) -> Result<String, Failure> {
    let root = Identity::root();
    let lookup = || match conn.call(
        &root,
        Op::Lookup {
            parent: ROOT,
            name: LOST.into(),
        },
    )? {
        Reply::Entry { attr, grant } => {
            conn.granted(&attr, &grant);
            Ok(attr)
        }
        other => Err(shoal_fssvc::client::unexpected(&other)),
    };
    let create =
        |parent, name: &[u8], kind, perm| conn.make(&root, parent, name, (kind, perm, 0), &[]);
    let dir = match lookup() {
        Err(Failure::Fs(FsError::NotFound)) => {
            match create(ROOT, LOST.as_bytes(), Kind::Dir, 0o700) {
                // Made meanwhile by another node.
                Err(Failure::Fs(FsError::Exists)) => lookup()?,
                other => other?,
            }
        }
        other => other?,
    };
    if dir.kind != Kind::Dir {
        return Err(Failure::Fs(FsError::NotDir));
    }
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let name = format!("{}-{ino}-{secs}", conn.node);
    let attr = create(dir.ino, name.as_bytes(), Kind::File, 0o600)?;
    let op = UpdateOp::Commit {
        ino: attr.ino,
        base: attr.version,
        content: version.content.clone(),
        size,
        held: version.held,
        mtime,
        flush: false,
    };
    conn.change(&root, op)?;
    Ok(name)
}

pub(crate) fn destroy(conn: &Conn, content: &[Capability]) {
    for c in content {
        if let Err(e) = conn.with_files(|f| f.destroy(c)) {
            tracing::debug!("destroying a replaced version: {e}");
        }
    }
}
