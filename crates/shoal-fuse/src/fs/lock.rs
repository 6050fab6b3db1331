//! `fcntl` locks through the mount: every lock, unlock and test is one
//! call to the primary, which keeps them for the whole cluster
//! (`docs/fs.md`, "Locks"), but on a private inode, which no other mount
//! can lock: the mount decides those itself, and hands them to the
//! primary when the privacy ends.  A lock that must wait (`F_SETLKW`) is taken
//! over by a thread of its own, so the two FUSE threads never wait: it
//! tries again each time the primary says locks on the inode were
//! released, and at least once a second, until it has the lock, the
//! program that asked is gone, or the mount stops.
//!
//! `flock` locks stay each node's kernel's own: `fuser` does not tell a
//! `flock` request from an `fcntl` one (`FUSE_LK_FLOCK`), and the two must
//! not conflict, so the mount does not ask for `FUSE_FLOCK_LOCKS`.

use std::sync::Arc;
use std::time::Duration;

use fuser::{Errno, FileHandle, INodeNo, LockOwner, ReplyEmpty, ReplyLock};
use shoal_fs::locks::{EOF, Mode, Style};
use shoal_fs::model::{Identity, Ino};
use shoal_fs::op::{Conflict, Failure, LockHow, Op, Reply};

use super::{ShoalFs, errno, node};
use crate::conn::Conn;

/// The largest offset the kernel's locks name (`OFFSET_MAX`): its "to
/// the end of the file".
const KERNEL_EOF: u64 = i64::MAX as u64;

/// How often a waiting lock asks again without being told.
const POLL: Duration = Duration::from_secs(1);

/// One lock request as the kernel gave it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Asked {
    pub ino: Ino,
    pub fh: u64,
    pub owner: u64,
    pub start: u64,
    pub end: u64,
    pub typ: i32,
    pub pid: u32,
}

impl Asked {
    /// What the kernel asked, on open file `fh` of `ino`, for lock owner
    /// `owner`.
    pub(super) fn new(
        (ino, fh, owner): (INodeNo, FileHandle, LockOwner),
        (start, end): (u64, u64),
        typ: i32,
        pid: u32,
    ) -> Asked {
        Asked {
            ino: node(ino),
            fh: fh.0,
            owner: owner.0,
            start,
            end,
            typ,
            pid,
        }
    }

    fn mode(&self) -> Result<Option<Mode>, Errno> {
        match self.typ {
            libc::F_RDLCK => Ok(Some(Mode::Read)),
            libc::F_WRLCK => Ok(Some(Mode::Write)),
            libc::F_UNLCK => Ok(None),
            _ => Err(Errno::EINVAL),
        }
    }

    fn end(&self) -> u64 {
        if self.end >= KERNEL_EOF {
            EOF
        } else {
            self.end
        }
    }

    fn op(&self, mode: Option<Mode>, how: LockHow) -> Op {
        Op::Lock {
            ino: self.ino,
            owner: self.owner,
            style: Style::Posix,
            mode,
            start: self.start,
            end: self.end(),
            pid: self.pid,
            how,
        }
    }
}

/// One call about a lock: `None` if done (taken, released, or nothing in
/// the way), else the lock in the way.
fn call(conn: &Conn, op: Op) -> Result<Option<Conflict>, Failure> {
    match conn.call(&Identity::root(), op)? {
        Reply::Locked(c) => Ok(c),
        other => Err(shoal_fssvc::client::unexpected(&other)),
    }
}

/// Tries for `a`'s lock (`how`), recording it if taken: decided by the
/// mount on a private inode, else by the primary (a private file's name
/// pushed first; its directories stay private).
fn take(conn: &Conn, a: &Asked, mode: Option<Mode>, how: LockHow) -> Result<bool, Failure> {
    if let Some(taken) = conn.private_lock((a.fh, a.ino, a.owner), mode, (a.start, a.end(), a.pid))
    {
        return taken;
    }
    conn.publish(&[a.ino])?;
    let taken = call(conn, a.op(mode, how))?.is_none();
    if taken {
        conn.locks
            .record(a.fh, a.ino, a.owner, mode, (a.start, a.end(), a.pid));
    }
    Ok(taken)
}

impl ShoalFs {
    /// `F_GETLK`: the lock in the way, or `F_UNLCK`.
    pub(super) fn get_lock(&self, a: Asked, reply: ReplyLock) {
        let mode = match a.mode() {
            Ok(Some(m)) => m,
            Ok(None) => return reply.error(Errno::EINVAL),
            Err(e) => return reply.error(e),
        };
        // A private inode's locks are the mount's; others are the
        // primary's (a private file's name is pushed first; its
        // directories stay private).
        let found = match self
            .conn
            .private_lock_test(a.ino, a.owner, mode, (a.start, a.end()))
        {
            Some(local) => Ok(local.map(|l| (l.mode, l.start, l.end, l.pid))),
            None => self
                .conn
                .publish(&[a.ino])
                .and_then(|()| call(&self.conn, a.op(Some(mode), LockHow::Test)))
                .map(|c| c.map(|c| (c.mode, c.start, c.end, c.pid))),
        };
        match found {
            Ok(None) => reply.locked(a.start, a.end, libc::F_UNLCK, 0),
            Ok(Some((mode, start, end, pid))) => {
                let typ = match mode {
                    Mode::Read => libc::F_RDLCK,
                    Mode::Write => libc::F_WRLCK,
                };
                reply.locked(start, end.min(KERNEL_EOF), typ, pid)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    /// `F_SETLK` and `F_SETLKW`.
    pub(super) fn set_lock(&self, a: Asked, sleep: bool, reply: ReplyEmpty) {
        let mode = match a.mode() {
            Ok(m) => m,
            Err(e) => return reply.error(e),
        };
        match take(&self.conn, &a, mode, LockHow::Try) {
            Ok(true) => return reply.ok(),
            Ok(false) if !sleep => return reply.error(Errno::EAGAIN),
            Ok(false) => {}
            Err(e) => return reply.error(errno(e)),
        }
        let conn = self.conn.clone();
        let spawned = std::thread::Builder::new()
            .name("fs-lock-wait".into())
            .spawn(move || wait_for(&conn, a, mode, reply));
        if let Err(e) = spawned {
            tracing::warn!("cannot start a thread to wait for a lock: {e}");
        }
    }

    /// A process closed a descriptor of `ino` (`flush`): POSIX drops its
    /// `fcntl` locks on the file, whichever descriptor took them.  Costs a
    /// message only if it holds some.
    pub(super) fn closed_by(&self, ino: Ino, owner: u64) {
        if self.conn.locks.holds(ino, owner) {
            self.unlock_all(ino, owner);
        }
    }

    /// Handle `fh` was closed for good: the `fcntl` locks taken through it
    /// that are still held go (a process that shared the descriptor and
    /// never closed it, or one the `flush` missed).
    pub(super) fn release_locks(&self, fh: u64) {
        let Some((ino, owners)) = self.conn.locks.closed(fh) else {
            return;
        };
        for owner in owners {
            self.unlock_all(ino, owner);
        }
    }

    fn unlock_all(&self, ino: Ino, owner: u64) {
        let all = Asked {
            ino,
            fh: 0,
            owner,
            start: 0,
            end: KERNEL_EOF,
            typ: libc::F_UNLCK,
            pid: 0,
        };
        if let Err(e) = take(&self.conn, &all, None, LockHow::Try) {
            tracing::warn!("releasing the locks on inode {ino} at close: {e}");
        }
    }
}

/// `F_SETLKW` after a first refusal: asks again whenever locks on the
/// inode are released (and once a second), until the lock is taken, the
/// program that asked is gone, or the mount stops.
fn wait_for(conn: &Arc<Conn>, a: Asked, mode: Option<Mode>, reply: ReplyEmpty) {
    loop {
        if conn.locks.is_stopping() {
            return reply.error(Errno::EIO);
        }
        if !alive(a.pid) {
            // The kernel gave up on the request with its program.
            return reply.error(Errno::EINTR);
        }
        let seen = conn.locks.generation(a.ino);
        match take(conn, &a, mode, LockHow::Wait) {
            Ok(true) if alive(a.pid) => return reply.ok(),
            Ok(true) => {
                // Taken for a program that went meanwhile (its files may
                // be closed already): given back.
                if let Err(e) = take(conn, &a, None, LockHow::Try) {
                    tracing::warn!("giving back a lock on inode {}: {e}", a.ino);
                }
                return reply.error(Errno::EINTR);
            }
            Ok(false) => {}
            Err(e) => return reply.error(errno(e)),
        }
        conn.locks.wait(a.ino, seen, POLL);
    }
}

/// Whether process `pid` still runs (not gone, nor a zombie).  Pid 0 is a
/// process the kernel could not name in the mount's pid namespace: taken
/// to run (its wait ends with the lock or the mount).
fn alive(pid: u32) -> bool {
    if pid == 0 {
        return true;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command, which is in parentheses and may hold
    // any bytes: look after the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state != "Z" && state != "X")
}
