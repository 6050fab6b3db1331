//! Writing a file's dirty changes back (`docs/fs.md`, "Delayed write"):
//! its bytes (the content version's, with the changes made) stored as a
//! new file on `copies` file servers, then one `Commit` naming the
//! version the changes were made over.  The primary makes it the file's
//! next version, or refuses it if the file changed meanwhile (possible
//! only after this mount lost its token): then the changes are lost, and
//! said so.  Done only by the mount's callbacks thread, one file at a
//! time, so a recall's answer follows the write-back it needs.

use shoal_cap::Capability;
use shoal_fs::model::{FsError, Identity, Ino};
use shoal_fs::op::{Failure, Op, Reply};
use shoal_fs::tree::overlaid;
use shoal_fs::update::{Answer, UpdateOp};
use shoal_fssvc::FsClient;

use crate::conn::Conn;

/// Writes `ino`'s dirty changes back through `via` (a client of the
/// mount's session); with `safety`, the bytes are on the file servers'
/// disks before the commit.
pub(crate) fn write_back(
    conn: &Conn,
    via: &mut FsClient,
    ino: Ino,
    safety: bool,
) -> Result<(), Failure> {
    let Some(job) = conn.cache.flush_job(ino) else {
        return Ok(());
    };
    let base = if job.content.is_empty() {
        Vec::new()
    } else {
        conn.with_files(|f| f.read_all(&job.content))?
    };
    let bytes = overlaid(base, &job.changes, job.size);
    let content = conn.store(ino, &bytes, safety)?;
    let op = UpdateOp::Commit {
        ino,
        base: job.version,
        content: content.clone(),
        size: job.size,
        mtime: job.mtime,
        flush: false,
    };
    match via.call(&Identity::root(), Op::Change { op }) {
        Ok(Reply::Updated(Ok(Answer::Committed { attr, old }))) => {
            conn.cache.flushed(&job, &attr, content);
            // Nobody else held the file while this mount wrote it: the
            // replaced version is no one's.
            destroy(conn, &old);
            Ok(())
        }
        Ok(Reply::Updated(Err(FsError::NotFound))) => {
            // The file went (its last name and open): nothing to keep.
            conn.cache.discard(ino);
            destroy(conn, &content);
            Ok(())
        }
        Ok(Reply::Updated(Err(e))) => {
            tracing::error!(
                "file {ino}: {} changes not written back ({e}): the file changed \
                 elsewhere after this mount lost its token",
                job.changes.len()
            );
            conn.cache.discard(ino);
            destroy(conn, &content);
            Err(Failure::Fs(e))
        }
        Ok(other) => {
            destroy(conn, &content);
            Err(shoal_fssvc::client::unexpected(&other))
        }
        // The commit may have been made with its answer lost: its
        // content stays.
        Err(e) => Err(e),
    }
}

fn destroy(conn: &Conn, content: &[Capability]) {
    for c in content {
        if let Err(e) = conn.with_files(|f| f.destroy(c)) {
            tracing::debug!("destroying a replaced version: {e}");
        }
    }
}
