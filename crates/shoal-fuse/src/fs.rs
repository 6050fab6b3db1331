//! The FUSE file system: each kernel request becomes a call to the
//! metadata service's primary, made as the identity the kernel gave the
//! request (uid, gid, and the caller's supplementary groups from
//! `/proc/PID/status`, kept a second: `who`).
//!
//! What the kernel may keep follows the mount's tokens (`cache`):
//! attributes with a long timeout while the mount holds `Read` on the
//! inode, names while it holds `Read` on their directory, and a file's
//! pages while it holds `Read` on the file at their version (an open that
//! finds that version keeps them, `FOPEN_KEEP_CACHE`); an open for
//! reading under the token costs no message, and reads of pages the
//! kernel lacks go to a file server, not the primary.  Under `Write`,
//! writes and truncations stay in the mount as dirty changes until they
//! are written back (`writeback`).  Without it a write goes through the
//! primary and the kernel's pages of the range written are dropped, as
//! are those a read through the primary fills for a cached open: a file
//! the mount holds no token on keeps no pages ("The client as built" in
//! `docs/fs.md`).  An open for writing only skips the kernel's page cache
//! altogether (`open::kernel_flags`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use shoal_fs::model::{Attr, FILE_SIZE_MAX, FsError, Identity, Ino, Kind, Timestamp};
use shoal_fs::op::{Failure, Op, Reply};
use shoal_fs::tokens::{OpenId, Want};
use shoal_fs::update::{Answer, SetAttr, UpdateOp};

use crate::conn::Conn;
use crate::private::Routed;
use shoal_fs::cache::{Content, FOREVER, Open as CacheUse};

pub(crate) mod attr;
mod lock;
mod names;
mod open;
mod sparse;
mod who;
mod xattr;

use attr::{absent, file_attr, file_type, kind_of_mode, node, time_of, time_set};

fn open_flags(open: CacheUse) -> FopenFlags {
    match open {
        CacheUse::Direct => FopenFlags::FOPEN_DIRECT_IO,
        CacheUse::Cached { keep: true } => FopenFlags::FOPEN_KEEP_CACHE,
        CacheUse::Cached { keep: false } => FopenFlags::empty(),
    }
}

/// What the kernel may keep of what the mount holds no token on.
const NONE: Duration = Duration::ZERO;

/// The time of a change: the one asked for, or now.
fn now(t: Option<TimeOrNow>) -> Timestamp {
    match t {
        Some(TimeOrNow::SpecificTime(s)) => time_of(s),
        _ => time_of(SystemTime::now()),
    }
}

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
    callers: who::Callers,
    /// Whether opens for writing only skip the kernel's page cache
    /// (`open::kernel_flags`): set at the kernel's `INIT`.
    direct_writes: Arc<AtomicBool>,
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
/// Answers a request that returns nothing.
fn answer_empty<T>(reply: ReplyEmpty, r: Result<T, Failure>) {
    match r {
        Ok(_) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

impl ShoalFs {
    pub(crate) fn new(conn: Arc<Conn>, direct_writes: Arc<AtomicBool>) -> ShoalFs {
        ShoalFs {
            conn,
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            callers: who::Callers::default(),
            direct_writes,
        }
    }

    /// Who makes `req` (groups kept a moment: `who`).
    fn who(&self, req: &Request) -> Identity {
        self.callers.of(req)
    }

    /// `ino`'s attributes and how long the kernel may keep them: from the
    /// mount if it may answer, else from the primary (asked as `req`'s
    /// caller, who is only looked up then).
    fn attr_of(&self, req: &Request, ino: Ino) -> Result<(Attr, Duration), Failure> {
        if let Some(attr) = self.conn.private_attr(ino) {
            return Ok((attr, FOREVER));
        }
        if let Some(held) = self.conn.cache.lock().attr_held(ino) {
            return Ok(held);
        }
        let stamp = self.conn.cache.lock().stamp(ino);
        match self.conn.call(&self.who(req), Op::GetAttr { ino })? {
            Reply::Entry { mut attr, grant } => {
                let ttl = self.conn.granted(&attr, &grant);
                self.conn.cache.lock().attrs_asked_at(ino, stamp);
                self.conn.cache.lock().patch(&mut attr);
                Ok((attr, ttl))
            }
            other => Err(shoal_fssvc::client::unexpected(&other)),
        }
    }

    /// Answers a request that made a name in `parent` for an inode.
    fn answer_entry(
        &self,
        reply: ReplyEntry,
        parent: INodeNo,
        name: &OsStr,
        r: Result<Attr, Failure>,
    ) {
        match r {
            Ok(attr) => {
                let entry = self
                    .conn
                    .cache
                    .lock()
                    .entry_ttl(node(parent), name.as_bytes());
                let (attr, ttl) = match self.conn.private_attr(attr.ino) {
                    Some(attr) => (attr, FOREVER),
                    None => (attr, NONE),
                };
                reply.entry_with_ttls(&ttl, &entry, &file_attr(&attr), Generation(0))
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    /// Reads a window of a file the mount holds: its content version's
    /// bytes from a file server, with the mount's dirty changes made;
    /// `None` if the version moved on meanwhile.
    fn read_cached(
        &self,
        ino: Ino,
        c: &Content,
        offset: u64,
        size: u32,
    ) -> Result<Option<Vec<u8>>, Failure> {
        let end = c.size.min(offset.saturating_add(size.into()));
        let len = end.saturating_sub(offset) as u32;
        let base = if c.content.is_empty() || len == 0 {
            Vec::new()
        } else {
            self.conn.with_files(|f| {
                let mut last = None;
                for replica in &c.content {
                    match f.read(replica, offset, len) {
                        Ok(d) => return Ok(d),
                        Err(e) if e.try_another() => last = Some(e),
                        Err(e) => return Err(e),
                    }
                }
                Err(last.expect("a file has a replica"))
            })?
        };
        Ok(self
            .conn
            .cache
            .lock()
            .finish_read(ino, c.version, offset, size as usize, &base))
    }
}

impl Filesystem for ShoalFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let direct = crate::kernel::negotiate(config)?;
        self.direct_writes.store(direct, Ordering::Relaxed);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if let Some(found) = self.conn.private_lookup(node(parent), name.as_bytes()) {
            let entry = self
                .conn
                .cache
                .lock()
                .entry_ttl(node(parent), name.as_bytes());
            return match found {
                Ok(attr) => {
                    reply.entry_with_ttls(&FOREVER, &entry, &file_attr(&attr), Generation(0))
                }
                Err(FsError::NotFound) => {
                    reply.entry_with_ttls(&NONE, &entry, &file_attr(&absent()), Generation(0))
                }
                Err(e) => reply.error(errno(Failure::Fs(e))),
            };
        }
        if self
            .conn
            .cache
            .lock()
            .known_absent(node(parent), name.as_bytes())
        {
            return reply.error(Errno::ENOENT);
        }
        let op = Op::Lookup {
            parent: node(parent),
            name: name.as_bytes().to_vec(),
        };
        // A notice of the name that crossed the answer (the count moved)
        // would leave the kernel a stale entry: none is given then.
        let stamp = self.conn.cache.lock().stamp(node(parent));
        let entry_ttl = |this: &Self| {
            if this.conn.cache.lock().stamp(node(parent)) == stamp {
                this.conn
                    .cache
                    .lock()
                    .entry_ttl(node(parent), name.as_bytes())
            } else {
                NONE
            }
        };
        match self.conn.call(&self.who(req), op) {
            Ok(Reply::Entry { mut attr, grant }) => {
                let attr_ttl = self.conn.granted(&attr, &grant);
                self.conn.cache.lock().patch(&mut attr);
                let entry = entry_ttl(self);
                reply.entry_with_ttls(&attr_ttl, &entry, &file_attr(&attr), Generation(0))
            }
            Ok(other) => reply.error(errno(shoal_fssvc::client::unexpected(&other))),
            // An absent name the kernel may remember as absent (a negative
            // entry: node 0) while the mount holds the directory: a
            // notice of its creation elsewhere invalidates it.
            Err(Failure::Fs(FsError::NotFound)) => match entry_ttl(self) {
                ttl if ttl.is_zero() => reply.error(Errno::ENOENT),
                ttl => {
                    let none = file_attr(&absent());
                    reply.entry_with_ttls(&NONE, &ttl, &none, Generation(0))
                }
            },
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr_of(req, node(ino)) {
            Ok((attr, ttl)) => reply.attr(&ttl, &file_attr(&attr)),
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
        // A truncation of a file this mount holds `Write` on is one more
        // dirty change.
        if size.is_some_and(|s| s > FILE_SIZE_MAX) {
            return reply.error(Errno::EFBIG);
        }
        let truncated = match (size, mode, uid, gid, atime) {
            (Some(size), None, None, None, None) => {
                let when = (now(mtime), self.conn.lease.now());
                self.conn.cache.lock().truncate(node(ino), size, when)
            }
            _ => None,
        };
        if let Some(attr) = truncated {
            return match self.conn.private_attr(node(ino)) {
                Some(attr) => reply.attr(&FOREVER, &file_attr(&attr)),
                None => reply.attr(&NONE, &file_attr(&attr)),
            };
        }
        // So is a setting of a dirty file's modification time (its
        // write-back sets it); what else is set goes on as any change.
        let mut mtime = mtime;
        if size.is_none() && mtime.is_some() {
            let when = (now(mtime), self.conn.lease.now());
            let touched = self.conn.cache.lock().touch(node(ino), when);
            if let Some(attr) = touched {
                mtime = None;
                if mode.is_none() && uid.is_none() && gid.is_none() && atime.is_none() {
                    return match self.conn.private_attr(node(ino)) {
                        Some(attr) => reply.attr(&FOREVER, &file_attr(&attr)),
                        None => reply.attr(&NONE, &file_attr(&attr)),
                    };
                }
            }
        }
        let set = SetAttr {
            perm: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size,
            atime: time_set(atime),
            mtime: time_set(mtime),
            by_handle: fh.is_some(),
            grow: false,
        };
        // A private inode's mode, owner or times (not a dirty file's
        // mtime, which its write-back sets) change in the private copy.
        let private =
            size.is_none() && (mtime.is_none() || !self.conn.cache.lock().is_dirty(node(ino)));
        match self.change_attrs(&self.who(req), node(ino), set, private) {
            Ok((attr, ttl)) => reply.attr(&ttl, &file_attr(&attr)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.conn.private_target(node(ino)) {
            Some(Ok(t)) => return reply.data(&t),
            Some(Err(e)) => return reply.error(errno(Failure::Fs(e))),
            None => {}
        }
        match self
            .conn
            .call(&self.who(req), Op::ReadLink { ino: node(ino) })
        {
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
        let made = self.make(req, parent, name, (kind, mode & !umask, rdev), &[]);
        self.answer_entry(reply, parent, name, made);
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
        let made = self.make(req, parent, name, (Kind::Dir, mode & !umask, 0), &[]);
        self.answer_entry(reply, parent, name, made);
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
        let made = self.make(req, parent, link_name, (Kind::Symlink, 0o777, 0), target);
        self.answer_entry(reply, parent, link_name, made);
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
            from: node(parent),
            from_name: name.as_bytes().to_vec(),
            to: node(newparent),
            to_name: newname.as_bytes().to_vec(),
            noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            open_victim: false,
        };
        // A private directory moved to another parent: the kernel's
        // listing of it (`opendir`) names its old parent as `..`, and the
        // kernel drops it only for changes of the directory's own names.
        let moved_dir = (parent != newparent)
            .then(|| self.conn.private_lookup(node(parent), name.as_bytes()))
            .flatten()
            .and_then(Result::ok)
            .filter(|a| a.kind == Kind::Dir)
            .map(|a| a.ino);
        let changed = self.conn.route(&self.who(req), op);
        if changed.is_ok() {
            // The kernel moves its entry, timeout and all.
            self.conn
                .cache
                .lock()
                .kernel_has(node(newparent), newname.as_bytes());
            if let Some(dir) = moved_dir {
                self.conn.kernel.inval(vec![(dir, 0, 0)], Vec::new());
            }
        }
        answer_empty(reply, changed);
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
            ino: node(ino),
            parent: node(newparent),
            name: newname.as_bytes().to_vec(),
        };
        match self.conn.route(&self.who(req), op) {
            Ok((Answer::Entry { attr, .. }, private)) => {
                if !private {
                    self.conn.cache.lock().drop_token(node(ino));
                }
                self.answer_entry(reply, newparent, newname, Ok(attr))
            }
            Ok((other, _)) => reply.error(errno(Failure::Unavailable(format!("{other:?}")))),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.open_file(&self.who(req), node(ino), flags.0) {
            Ok((fh, how)) => reply.opened(FileHandle(fh), self.kernel_flags(how, flags.0)),
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
        let write = (flags & libc::O_ACCMODE) != libc::O_RDONLY;
        let want = if write {
            Want::OpenWrite
        } else {
            Want::OpenRead
        };
        let id = self.conn.next_open();
        let append = flags & libc::O_APPEND != 0;
        let made = self
            .conn
            .create_op(
                node(parent),
                name.as_bytes(),
                (Kind::File, mode & !umask, 0),
                &[],
            )
            .and_then(|op| {
                self.conn
                    .private_create_open(&self.who(req), op, (id, write))
            });
        let op = match made {
            Ok(Routed::Shared(op)) => op,
            // Made in a private directory: opened there too.
            Ok(Routed::Local(Ok(Answer::Entry { attr, .. }))) => {
                let how = self
                    .conn
                    .cache
                    .lock()
                    .open_cached(attr.ino)
                    .unwrap_or(CacheUse::Direct);
                let fh = self.handle(attr.ino, id, append);
                let entry = self
                    .conn
                    .cache
                    .lock()
                    .entry_ttl(node(parent), name.as_bytes());
                return reply.created(
                    &entry.min(FOREVER),
                    &file_attr(&attr),
                    Generation(0),
                    FileHandle(fh),
                    self.kernel_flags(open_flags(how), flags),
                );
            }
            Ok(Routed::Local(Ok(other))) => {
                return reply.error(errno(Failure::Unavailable(format!("{other:?}"))));
            }
            Ok(Routed::Local(Err(e))) => return reply.error(errno(Failure::Fs(e))),
            Err(e) => return reply.error(errno(e)),
        };
        let made = self
            .conn
            .create_open(&self.who(req), op, id, want)
            .and_then(|(attr, grant)| {
                let stamp = self.conn.cache.lock().stamp(attr.ino);
                let (fh, how) = match grant {
                    Some(grant) => self.opened(&attr, &grant, Vec::new(), id, write, append),
                    // The creator may open what it made whatever its mode
                    // says (POSIX: `open(O_CREAT)` of a new file checks only
                    // the directory), so the open is made as root.
                    None => self.open_file(&Identity::root(), attr.ino, flags)?,
                };
                self.conn.cache.lock().attrs_asked_at(attr.ino, stamp);
                Ok((fh, how, attr))
            });
        // Made by another node meanwhile: without `O_EXCL`, opened.
        let made = match made {
            Err(Failure::Fs(FsError::Exists)) if flags & libc::O_EXCL == 0 => {
                self.open_existing(&self.who(req), node(parent), name.as_bytes(), flags)
            }
            made => made,
        };
        match made {
            Ok((fh, how, attr)) => {
                // `created` gives one timeout for the entry and the
                // attributes: the shorter of what the parent's token
                // allows for the name and the new file's (its open's) for
                // the attributes.
                let (attr, attr_ttl) = self
                    .conn
                    .cache
                    .lock()
                    .attr_held(attr.ino)
                    .unwrap_or((attr, NONE));
                let entry_ttl = if attr_ttl.is_zero() {
                    NONE
                } else {
                    self.conn
                        .cache
                        .lock()
                        .entry_ttl(node(parent), name.as_bytes())
                };
                let ttl = attr_ttl.min(entry_ttl);
                let how = self.kernel_flags(how, flags);
                reply.created(&ttl, &file_attr(&attr), Generation(0), FileHandle(fh), how)
            }
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
        let size = size.min(shoal_fs::op::IO_MAX as u32);
        // Under a token: from a file server (again if a write-back moved
        // the version on meanwhile).
        for _ in 0..3 {
            let Some(c) = self.conn.cache.lock().content(node(ino)) else {
                break;
            };
            match self.read_cached(node(ino), &c, offset, size) {
                Ok(Some(d)) => return reply.data(&d),
                Ok(None) => {}
                // Dirty changes are only here: the primary's bytes would
                // be stale.
                Err(e) if self.conn.cache.lock().is_dirty(node(ino)) => {
                    return reply.error(errno(e));
                }
                Err(e) => {
                    tracing::debug!("reading {} from a file server: {e}", ino.0);
                    break;
                }
            }
        }
        let op = Op::Read {
            ino: node(ino),
            offset,
            len: size,
        };
        // Read without a token: pages this fills (an open that kept the
        // page cache) are checked at each later read, against the
        // attributes the kernel asks for then (no token: they expire at
        // once), and dropped if the file changed (`FUSE_AUTO_INVAL_DATA`).
        match self.conn.call(&self.who(req), op) {
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
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // A direct write by a caller without `CAP_FSETID`: the set-id
        // bits go first (through the primary the write drops them itself).
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID)
            && self.conn.cache.lock().holds_write(node(ino));
        if kill && let Err(e) = self.drop_setid(req, node(ino)) {
            return reply.error(errno(e));
        }
        let append = self.handles.lock().get(&fh.0).is_some_and(|h| h.append);
        if !append && offset.saturating_add(data.len() as u64) > FILE_SIZE_MAX {
            return reply.error(Errno::EFBIG);
        }
        // Under `Write`, the bytes stay here until written back.
        let when = (now(None), self.conn.lease.now());
        let cached = (self.conn.cache.lock())
            .write(node(ino), (!append).then_some(offset), data, when)
            .is_some();
        if cached {
            let over = self.conn.cache.lock().dirty_bytes() > self.conn.tuning.dirty_max;
            if over && let Err(e) = self.conn.flush(Some(node(ino)), false) {
                tracing::warn!("writing file {} back: {e}", ino.0);
            }
            return reply.written(data.len() as u32);
        }
        let op = Op::Write {
            ino: node(ino),
            offset: (!append).then_some(offset),
            data: data.to_vec(),
        };
        match self.conn.call(&self.who(req), op) {
            Ok(Reply::Updated(Ok(_))) => {
                // The primary took every token on the file, this mount's
                // too.  The kernel drops the file's attributes after a
                // write; pages another open of it keeps are checked at its
                // next read against the new ones (`FUSE_AUTO_INVAL_DATA`).
                self.conn.cache.lock().drop_token(node(ino));
                reply.written(data.len() as u32);
            }
            Ok(Reply::Updated(Err(e))) => reply.error(Errno::from_i32(e.errno())),
            Ok(other) => reply.error(errno(shoal_fssvc::client::unexpected(&other))),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match self.seek(req, node(ino), offset, whence) {
            Ok(at) => reply.offset(at),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.allocate(req, node(ino), offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Every write reached the primary or the mount's cache before it
        // returned; a close drops the process's locks on the file.
        self.closed_by(node(ino), lock_owner.0);
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
        self.release_locks(fh.0);
        answer_empty(reply, self.close(fh.0));
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Dirty changes are written back with the safety flag (on the file
        // servers' disks) and committed; a private file's name is pushed
        // with its commit, or after it if the file is clean (its
        // directories stay private).  Then what the primary answered, held
        // by r + 1 replicas in memory, goes to its disk: with the commit or
        // push (durable), or by a sync of its own if this thread sent
        // neither.
        let before = crate::writeback::durable_answers();
        let synced = self
            .conn
            .flush(Some(node(ino)), true)
            .and_then(|()| self.conn.publish_durable(&[node(ino)]))
            .and_then(|()| crate::writeback::sync_unless_durable(&self.conn, before));
        answer_empty(reply, synced);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // A private directory's names are pushed; then what the primary
        // answered goes to its disk (with the push, if one went).
        let before = crate::writeback::durable_answers();
        let pushed = if self.conn.is_private(node(ino)) {
            self.conn.push_durable()
        } else {
            Ok(())
        };
        let synced =
            pushed.and_then(|()| crate::writeback::sync_unless_durable(&self.conn, before));
        answer_empty(reply, synced);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // A private directory's listing is the kernel's to keep, across
        // opens: every change to its names comes through this kernel,
        // which then drops the listing itself, and the privacy's end
        // leaves a token whose recall, or a lost session, invalidates it
        // as it does the names.  Any other listing is asked for anew.
        let keep = if self.conn.is_private(node(ino)) {
            FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        reply.opened(FileHandle(0), keep);
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let (up, entries) = match self.conn.private_entries(node(ino)) {
            Some(Ok((up, list))) => (
                up,
                list.into_iter()
                    .map(|(name, ino, kind)| shoal_fs::op::DirEntry { name, ino, kind })
                    .collect(),
            ),
            Some(Err(e)) => return reply.error(errno(Failure::Fs(e))),
            None => match self
                .conn
                .call(&self.who(req), Op::ReadDir { ino: node(ino) })
            {
                Ok(Reply::Entries { entries, grant }) => {
                    // The grant must be known as seen, or a recall of it
                    // would wait for it for ever.
                    self.conn.saw(node(ino), &grant);
                    (node(ino), entries)
                }
                Ok(other) => return reply.error(errno(shoal_fssvc::client::unexpected(&other))),
                Err(e) => return reply.error(errno(e)),
            },
        };
        let dots = [
            (node(ino), FileType::Directory, &b"."[..]),
            (up, FileType::Directory, &b".."[..]),
        ];
        let all = dots.into_iter().chain(
            entries
                .iter()
                .map(|e| (e.ino, file_type(e.kind), e.name.as_slice())),
        );
        for (i, (ino, kind, name)) in all.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino.0), i as u64 + 1, kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        xattr::answer(reply, size, self.get_xattr(req, node(ino), name.as_bytes()));
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let listed = self.conn.publish(&[node(ino)]).and_then(|()| {
            self.conn
                .call(&self.who(req), Op::ListXattr { ino: node(ino) })
        });
        xattr::answer(reply, size, listed);
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let set = self.set_xattr(req, node(ino), name.as_bytes(), Some((value, flags)));
        answer_empty(reply, set);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        answer_empty(reply, self.set_xattr(req, node(ino), name.as_bytes(), None));
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let asked = lock::Asked::new((ino, fh, lock_owner), (start, end), typ, pid);
        self.get_lock(asked, reply);
    }

    fn setlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let asked = lock::Asked::new((ino, fh, lock_owner), (start, end), typ, pid);
        self.set_lock(asked, sleep, reply);
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.conn.statfs(&self.who(req)) {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_free,
                s.files,
                s.files_free,
                s.block_size,
                shoal_fs::model::NAME_MAX as u32,
                s.block_size,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }
}

impl std::fmt::Debug for ShoalFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShoalFs").finish_non_exhaustive()
    }
}
