//! The FUSE file system: each kernel request becomes a call to the
//! metadata service's primary, made as the identity the kernel gave the
//! request (uid, gid, and the caller's supplementary groups from
//! `/proc/PID/status`).
//!
//! This first client caches nothing: entries and attributes are given to
//! the kernel with a zero timeout, files are opened with direct I/O and
//! every read and write goes through the primary, as in the file system's
//! uncached mode (`docs/fs.md`).  So every node sees each change at once;
//! the caching client (tokens kept, data in the client and the kernel)
//! comes next.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};
use parking_lot::Mutex;
use shoal_fs::model::{Attr, Identity, Ino, Kind, Time};
use shoal_fs::op::{Failure, Op, Reply};
use shoal_fs::tokens::{OpenId, Want};
use shoal_fs::update::{Answer, SetAttr, TimeSet, UpdateOp};

use crate::conn::Conn;

/// What the kernel may keep: nothing, in this client.
const TTL: Duration = Duration::ZERO;

/// One open file of the kernel's.
#[derive(Debug, Clone, Copy)]
struct Handle {
    ino: Ino,
    open: OpenId,
    append: bool,
}

/// The mounted file system.
pub struct ShoalFs {
    conn: Arc<Conn>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
}

fn errno(f: Failure) -> Errno {
    match f {
        Failure::Fs(e) => Errno::from_i32(e.errno()),
        Failure::NoSession | Failure::NotPrimary | Failure::Unavailable(_) => {
            tracing::warn!("metadata service: {f}");
            Errno::EIO
        }
    }
}

/// The identity the kernel gave a request: its uid and gid, and the
/// supplementary groups of the calling process.
fn who(req: &Request) -> Identity {
    let mut id = Identity::user(req.uid(), req.gid());
    if let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", req.pid()))
        && let Some(line) = status.lines().find(|l| l.starts_with("Groups:"))
    {
        id.groups = line[7..]
            .split_whitespace()
            .filter_map(|g| g.parse().ok())
            .collect();
    }
    id
}

fn system_time(t: Time) -> SystemTime {
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::new(t.secs as u64, t.nanos)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs())
            + Duration::from_nanos(t.nanos.into())
    }
}

fn time_of(t: SystemTime) -> Time {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Time::new(d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            Time::new(-(d.as_secs() as i64), 0)
        }
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
    }
}

fn kind_of_mode(mode: u32) -> Option<Kind> {
    Some(match mode & libc::S_IFMT {
        libc::S_IFREG | 0 => Kind::File,
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFLNK => Kind::Symlink,
        libc::S_IFIFO => Kind::Fifo,
        libc::S_IFSOCK => Kind::Socket,
        libc::S_IFCHR => Kind::CharDev,
        libc::S_IFBLK => Kind::BlockDev,
        _ => return None,
    })
}

/// The kernel's view of an inode's attributes.
fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.ctime),
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

fn time_set(t: Option<TimeOrNow>) -> Option<TimeSet> {
    t.map(|t| match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(s) => TimeSet::At(time_of(s)),
    })
}

/// Answers a request that makes or finds an inode.
fn answer_entry(reply: ReplyEntry, r: Result<Attr, Failure>) {
    match r {
        Ok(attr) => reply.entry(&TTL, &file_attr(&attr), Generation(0)),
        Err(e) => reply.error(errno(e)),
    }
}

/// Answers a request that returns nothing.
fn answer_empty<T>(reply: ReplyEmpty, r: Result<T, Failure>) {
    match r {
        Ok(_) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

impl ShoalFs {
    pub(crate) fn new(conn: Arc<Conn>) -> ShoalFs {
        ShoalFs {
            conn,
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        }
    }

    fn attr_of(&self, who: &Identity, ino: Ino) -> Result<Attr, Failure> {
        match self.conn.call(who, Op::GetAttr { ino })? {
            Reply::Entry { attr, .. } => Ok(attr),
            other => Err(shoal_fssvc::client::unexpected(&other)),
        }
    }

    /// Makes a new inode named `name` in `parent`.
    fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        (kind, perm, rdev): (Kind, u32, u32),
        target: &[u8],
    ) -> Result<Attr, Failure> {
        let ino = self.conn.new_ino()?;
        let op = UpdateOp::Create {
            parent: parent.0,
            name: name.as_bytes().to_vec(),
            kind,
            perm: (perm & 0o7777) as u16,
            rdev,
            ino,
            secret: rand::random(),
            target: target.to_vec(),
            excl: true,
        };
        match self.conn.change(&who(req), op)? {
            Answer::Entry { attr, .. } => Ok(attr),
            other => Err(Failure::Unavailable(format!("unexpected answer {other:?}"))),
        }
    }

    /// Removes a name (a directory's with `dir`).
    fn remove(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        dir: bool,
    ) -> Result<Answer, Failure> {
        let op = UpdateOp::Unlink {
            parent: parent.0,
            name: name.as_bytes().to_vec(),
            dir,
            open: false,
        };
        self.conn.change(&who(req), op)
    }

    /// Opens `ino` for the kernel: a handle, recorded with the mount's
    /// opens.
    fn open_file(&self, who: &Identity, ino: Ino, flags: i32) -> Result<(u64, Attr), Failure> {
        let write = (flags & libc::O_ACCMODE) != libc::O_RDONLY;
        let id = self.conn.next_open();
        let have = self.conn.opens_of(ino);
        let op = Op::Open {
            ino,
            want: if write {
                Want::OpenWrite
            } else {
                Want::OpenRead
            },
            have,
            id,
            cached: None,
        };
        let attr = match self.conn.call(who, op)? {
            Reply::Opened { attr, .. } => attr,
            other => return Err(shoal_fssvc::client::unexpected(&other)),
        };
        self.conn.record_open(ino, id, write);
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(
            fh,
            Handle {
                ino,
                open: id,
                append: flags & libc::O_APPEND != 0,
            },
        );
        Ok((fh, attr))
    }
}

impl Filesystem for ShoalFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(shoal_fs::op::IO_MAX as u32);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let op = Op::Lookup {
            parent: parent.0,
            name: name.as_bytes().to_vec(),
        };
        match self.conn.call(&who(req), op) {
            Ok(Reply::Entry { attr, .. }) => reply.entry(&TTL, &file_attr(&attr), Generation(0)),
            Ok(other) => reply.error(errno(shoal_fssvc::client::unexpected(&other))),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr_of(&who(req), ino.0) {
            Ok(attr) => reply.attr(&TTL, &file_attr(&attr)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            perm: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size,
            atime: time_set(atime),
            mtime: time_set(mtime),
            by_handle: fh.is_some(),
        };
        match self
            .conn
            .change(&who(req), UpdateOp::SetAttr { ino: ino.0, set })
        {
            Ok(Answer::Attr(attr)) => reply.attr(&TTL, &file_attr(&attr)),
            Ok(other) => reply.error(errno(Failure::Unavailable(format!("{other:?}")))),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.conn.call(&who(req), Op::ReadLink { ino: ino.0 }) {
            Ok(Reply::Target(t)) => reply.data(&t),
            Ok(other) => reply.error(errno(shoal_fssvc::client::unexpected(&other))),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let Some(kind) = kind_of_mode(mode) else {
            return reply.error(Errno::EINVAL);
        };
        answer_entry(
            reply,
            self.make(req, parent, name, (kind, mode & !umask, rdev), &[]),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        answer_entry(
            reply,
            self.make(req, parent, name, (Kind::Dir, mode & !umask, 0), &[]),
        );
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        answer_empty(reply, self.remove(req, parent, name, false));
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        answer_empty(reply, self.remove(req, parent, name, true));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let target = target.as_os_str().as_bytes();
        answer_entry(
            reply,
            self.make(req, parent, link_name, (Kind::Symlink, 0o777, 0), target),
        );
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return reply.error(Errno::EINVAL);
        }
        let op = UpdateOp::Rename {
            from: parent.0,
            from_name: name.as_bytes().to_vec(),
            to: newparent.0,
            to_name: newname.as_bytes().to_vec(),
            noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            open_victim: false,
        };
        answer_empty(reply, self.conn.change(&who(req), op));
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let op = UpdateOp::Link {
            ino: ino.0,
            parent: newparent.0,
            name: newname.as_bytes().to_vec(),
        };
        match self.conn.change(&who(req), op) {
            Ok(Answer::Entry { attr, .. }) => reply.entry(&TTL, &file_attr(&attr), Generation(0)),
            Ok(other) => reply.error(errno(Failure::Unavailable(format!("{other:?}")))),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.open_file(&who(req), ino.0, flags.0) {
            Ok((fh, _)) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let made = self
            .make(req, parent, name, (Kind::File, mode & !umask, 0), &[])
            .and_then(|attr| {
                // The creator may open what it made whatever its mode says
                // (POSIX: `open(O_CREAT)` of a new file checks only the
                // directory), so the open is made as root.
                let (fh, _) = self.open_file(&Identity::root(), attr.ino, flags)?;
                Ok((fh, attr))
            });
        match made {
            Ok((fh, attr)) => reply.created(
                &TTL,
                &file_attr(&attr),
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let op = Op::Read {
            ino: ino.0,
            offset,
            len: size.min(shoal_fs::op::IO_MAX as u32),
        };
        match self.conn.call(&who(req), op) {
            Ok(Reply::Data(d)) => reply.data(&d),
            Ok(other) => reply.error(errno(shoal_fssvc::client::unexpected(&other))),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let append = self.handles.lock().get(&fh.0).is_some_and(|h| h.append);
        let op = Op::Write {
            ino: ino.0,
            offset: (!append).then_some(offset),
            data: data.to_vec(),
        };
        match self.conn.call(&who(req), op) {
            Ok(Reply::Updated(Ok(_))) => reply.written(data.len() as u32),
            Ok(Reply::Updated(Err(e))) => reply.error(Errno::from_i32(e.errno())),
            Ok(other) => reply.error(errno(shoal_fssvc::client::unexpected(&other))),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Every write reached the primary before it returned.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let Some(h) = self.handles.lock().remove(&fh.0) else {
            return reply.ok();
        };
        self.conn.forget_open(h.ino, h.open);
        match self.conn.call(
            &Identity::root(),
            Op::Close {
                ino: h.ino,
                id: h.open,
            },
        ) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Writes through the primary are durable when they return (the
        // metadata service's `fsync` durability, r + 1 replicas).
        reply.ok();
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.conn.call(&who(req), Op::ReadDir { ino: ino.0 }) {
            Ok(Reply::Entries { entries, .. }) => entries,
            Ok(other) => return reply.error(errno(shoal_fssvc::client::unexpected(&other))),
            Err(e) => return reply.error(errno(e)),
        };
        let dots = [
            (ino.0, FileType::Directory, &b"."[..]),
            (ino.0, FileType::Directory, &b".."[..]),
        ];
        let all = dots.into_iter().chain(
            entries
                .iter()
                .map(|e| (e.ino, file_type(e.kind), e.name.as_slice())),
        );
        for (i, (ino, kind, name)) in all.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.conn.call(&who(req), Op::StatFs) {
            Ok(Reply::StatFs(s)) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_free,
                s.files,
                s.files_free,
                s.block_size,
                shoal_fs::model::NAME_MAX as u32,
                s.block_size,
            ),
            Ok(other) => reply.error(errno(shoal_fssvc::client::unexpected(&other))),
            Err(e) => reply.error(errno(e)),
        }
    }
}

impl std::fmt::Debug for ShoalFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShoalFs").finish_non_exhaustive()
    }
}
