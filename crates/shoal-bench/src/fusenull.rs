//! The null FUSE file system of `shoal bench fs`: the floor under any
//! file system served through FUSE on this machine.
//!
//! It keeps names and attributes in one table in memory and no file
//! bytes (a write only moves the size; a read answers zeros), and it is
//! mounted and agreed with the kernel exactly as a node's shoal mount is
//! (`shoal_fuse::kernel`: io_uring workers per CPU, `default_permissions`,
//! locks through the mount, direct writes for opens that only write), and
//! answers as that mount answers from its private directories: names,
//! absent names and attributes kept by the kernel for a day, listings and
//! pages kept across opens, opens for writing only without the page
//! cache, `fcntl` locks granted by the mount with no message, a question
//! for an extended attribute answered "none", each `fsync` a round trip.
//! Its threads yield their CPU as the node's mount's do (`SCHED_IDLE`, in
//! a session of their own).  So the kernel sends it the same requests for
//! the same program, and what a temporary file, a create or a `dbench`
//! run costs on it is what the kernel, FUSE and the scheduler cost before
//! any file system does any work.
//!
//! Given a directory on the disk ([`ShoalDisk`]), each `fsync` also does
//! the least disk work a shoal `fsync` does on this machine, so that what
//! `dbench` makes of it is the ceiling of any FUSE file system keeping
//! shoal's promise of `fsync` here.
//!
//! Stripped ([`Bare`]), it leaves out what the shoal mount cannot: the
//! kernel's permission checks (without them it would let any user through
//! a directory whose names the kernel cached) and `FLUSH` (answered
//! "not implemented", so the kernel stops sending it, and a close no
//! longer releases the closer's POSIX locks): the floor of FUSE itself,
//! whatever a file system gives up.
//!
//! Benchmark machinery: nothing users run links it.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

/// How long the kernel keeps what it is told (as the mount's `FOREVER`).
const FOREVER: Duration = Duration::from_secs(24 * 3600);

const ROOT: u64 = 1;

struct Node {
    attr: FileAttr,
    /// A directory's names.
    names: Option<BTreeMap<Vec<u8>, u64>>,
    /// Bytes written since the last `fsync`.
    dirty: u64,
}

struct Table {
    nodes: HashMap<u64, Node>,
    next: u64,
}

/// What a stripped null file system leaves out.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bare {
    /// Mounted without `default_permissions`.
    pub no_permissions: bool,
    /// `FLUSH` answered "not implemented".
    pub no_flush: bool,
}

/// The null file system.
pub struct NullFs {
    table: Mutex<Table>,
    bare: Bare,
    disk: Option<ShoalDisk>,
}

/// The least disk work a shoal `fsync` does on this machine, done by
/// the null file system's own `fsync` when it has one: the bytes written
/// to the file since its last `fsync` written to two logs and synced at
/// once (the copies on k = 2 file servers, each making a small write
/// durable with its commit record, one sync), then 512 bytes written to
/// two more and synced at once (the metadata's log; shoal's `fsync` syncs
/// one, the primary's, after the group entry, which two at once on one
/// disk do not undercut).  Like shoal's logs, each is made ahead of its
/// records in zeros (as `shoal_replicasvc::store` and
/// `shoal_bullet::store` do theirs), so a sync writes
/// the records alone.  The cluster's nodes share this machine's one
/// disk, as these logs do.
pub struct ShoalDisk {
    logs: [Log; 4],
}

/// A log is written from its start again past this many bytes.
const LOG_WRAP: u64 = 256 << 20;

/// The step in which a log is made ahead, as shoal's are.
const AHEAD: u64 = 1 << 20;

/// One log: its file, where the next record goes and how far the file
/// is made.
struct Log {
    file: File,
    at: Mutex<(u64, u64)>,
}

impl Log {
    /// Writes `bytes` at the log's end (made ahead first if need be) and
    /// syncs them.
    fn append(&self, bytes: &[u8]) -> std::io::Result<()> {
        let len = bytes.len() as u64;
        let at = {
            let mut g = self.at.lock();
            let (mut at, made) = *g;
            if at + len > LOG_WRAP {
                at = 0;
            }
            let made = if at + len > made {
                let to = (at + len).next_multiple_of(AHEAD);
                self.file
                    .write_all_at(&vec![0; (to - made) as usize], made)?;
                to
            } else {
                made
            };
            *g = (at + len, made);
            at
        };
        self.file.write_all_at(bytes, at)?;
        self.file.sync_data()
    }
}

impl ShoalDisk {
    /// Four logs in `dir` (made if need be).
    pub fn open(dir: &Path) -> std::io::Result<ShoalDisk> {
        std::fs::create_dir_all(dir)?;
        let log = |i: usize| {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(dir.join(format!("log-{i}")))
                .map(|file| Log {
                    file,
                    at: Mutex::new((0, 0)),
                })
        };
        Ok(ShoalDisk {
            logs: [log(0)?, log(1)?, log(2)?, log(3)?],
        })
    }

    /// One `fsync` of a file with `dirty` bytes written since the last.
    pub(crate) fn sync(&self, dirty: u64) -> std::io::Result<()> {
        let [a, b, c, d] = &self.logs;
        if dirty > 0 {
            pair((a, b), &vec![0x5a; dirty as usize])?;
        }
        pair((c, d), &[0x5a; 512])
    }
}

/// `bytes` appended to both logs and synced, at once.
fn pair((a, b): (&Log, &Log), bytes: &[u8]) -> std::io::Result<()> {
    std::thread::scope(|s| {
        let there = s.spawn(|| b.append(bytes));
        let here = a.append(bytes);
        here.and(
            there
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("panicked"))),
        )
    })
}

fn attr(ino: u64, kind: FileType, perm: u16, uid: u32, gid: u32) -> FileAttr {
    let now = SystemTime::now();
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid,
        gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// What a negative entry carries: node 0, the name is absent.
fn absent() -> FileAttr {
    let mut a = attr(0, FileType::RegularFile, 0, 0, 0);
    a.nlink = 0;
    a
}

impl NullFs {
    /// An empty tree whose root belongs to the calling process's user.
    pub fn new(bare: Bare, disk: Option<ShoalDisk>) -> NullFs {
        // SAFETY: getuid and getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node {
                attr: attr(ROOT, FileType::Directory, 0o755, uid, gid),
                names: Some(BTreeMap::new()),
                dirty: 0,
            },
        );
        NullFs {
            table: Mutex::new(Table {
                nodes,
                next: ROOT + 1,
            }),
            bare,
            disk,
        }
    }

    /// Makes `name` in `parent`: its attributes.
    fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        kind: FileType,
        perm: u32,
    ) -> Result<FileAttr, Errno> {
        let mut t = self.table.lock();
        let ino = t.next;
        let names = t
            .nodes
            .get_mut(&parent.0)
            .ok_or(Errno::ENOENT)?
            .names
            .as_mut()
            .ok_or(Errno::ENOTDIR)?;
        if names.contains_key(name.as_bytes()) {
            return Err(Errno::EEXIST);
        }
        names.insert(name.as_bytes().to_vec(), ino);
        t.next += 1;
        let a = attr(ino, kind, (perm & 0o7777) as u16, req.uid(), req.gid());
        let names = (kind == FileType::Directory).then(BTreeMap::new);
        t.nodes.insert(
            ino,
            Node {
                attr: a,
                names,
                dirty: 0,
            },
        );
        Ok(a)
    }

    /// Removes `name` from `parent` (a directory only when empty).
    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let mut t = self.table.lock();
        let names = t
            .nodes
            .get(&parent.0)
            .and_then(|n| n.names.as_ref())
            .ok_or(Errno::ENOTDIR)?;
        let &ino = names.get(name.as_bytes()).ok_or(Errno::ENOENT)?;
        match (&t.nodes[&ino].names, dir) {
            (Some(n), true) if !n.is_empty() => return Err(Errno::ENOTEMPTY),
            (Some(_), false) => return Err(Errno::EISDIR),
            (None, true) => return Err(Errno::ENOTDIR),
            _ => {}
        }
        if let Some(n) = t.nodes.get_mut(&parent.0).and_then(|n| n.names.as_mut()) {
            n.remove(name.as_bytes());
        }
        t.nodes.remove(&ino);
        Ok(())
    }

    /// Moves `name` of `parent` to `to` in `into`, replacing what is there
    /// as `rename` does (an empty directory by a directory, a file by a
    /// file; with `RENAME_NOREPLACE`, nothing).
    fn rename(
        &self,
        (parent, name): (INodeNo, &OsStr),
        (into, to): (INodeNo, &OsStr),
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let mut t = self.table.lock();
        let &ino = names_of(&t, parent.0)?
            .get(name.as_bytes())
            .ok_or(Errno::ENOENT)?;
        let replaced = names_of(&t, into.0)?.get(to.as_bytes()).copied();
        if let Some(old) = replaced {
            if old == ino {
                return Ok(());
            }
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            match (&t.nodes[&old].names, &t.nodes[&ino].names) {
                (Some(n), Some(_)) if !n.is_empty() => return Err(Errno::ENOTEMPTY),
                (Some(_), None) => return Err(Errno::EISDIR),
                (None, Some(_)) => return Err(Errno::ENOTDIR),
                _ => {}
            }
            t.nodes.remove(&old);
        } else if !flags.is_empty() && flags != RenameFlags::RENAME_NOREPLACE {
            return Err(Errno::EINVAL);
        }
        for (dir, change) in [(parent.0, None), (into.0, Some(ino))] {
            let n = t.nodes.get_mut(&dir).and_then(|n| n.names.as_mut());
            let n = n.expect("a directory");
            match change {
                None => n.remove(name.as_bytes()),
                Some(ino) => n.insert(to.as_bytes().to_vec(), ino),
            };
        }
        Ok(())
    }
}

/// The names of directory `dir`.
fn names_of(t: &Table, dir: u64) -> Result<&BTreeMap<Vec<u8>, u64>, Errno> {
    let names = t.nodes.get(&dir).and_then(|n| n.names.as_ref());
    names.ok_or(Errno::ENOTDIR)
}

/// The mount's rule: an open for writing only skips the page cache; any
/// other keeps the pages of earlier opens (this kernel made them all).
fn open_flags(flags: i32) -> FopenFlags {
    if flags & libc::O_ACCMODE == libc::O_WRONLY {
        FopenFlags::FOPEN_DIRECT_IO
    } else {
        FopenFlags::FOPEN_KEEP_CACHE
    }
}

impl Filesystem for NullFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        shoal_fuse::kernel::negotiate(config).map(|_| ())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let t = self.table.lock();
        let Some(names) = t.nodes.get(&parent.0).and_then(|n| n.names.as_ref()) else {
            return reply.error(Errno::ENOTDIR);
        };
        match names.get(name.as_bytes()) {
            Some(ino) => reply.entry(&FOREVER, &t.nodes[ino].attr, Generation(0)),
            None => reply.entry_with_ttls(&Duration::ZERO, &FOREVER, &absent(), Generation(0)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.table.lock().nodes.get(&ino.0) {
            Some(n) => reply.attr(&FOREVER, &n.attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut t = self.table.lock();
        let Some(n) = t.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        if let Some(m) = mode {
            n.attr.perm = (m & 0o7777) as u16;
        }
        n.attr.uid = uid.unwrap_or(n.attr.uid);
        n.attr.gid = gid.unwrap_or(n.attr.gid);
        if let Some(s) = size {
            n.attr.size = s;
        }
        n.attr.ctime = SystemTime::now();
        reply.attr(&FOREVER, &n.attr)
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
        match self.make(req, parent, name, FileType::Directory, mode & !umask) {
            Ok(a) => reply.entry(&FOREVER, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove(parent, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove(parent, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), open_flags(flags.0))
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
        match self.make(req, parent, name, FileType::RegularFile, mode & !umask) {
            Ok(a) => reply.created(
                &FOREVER,
                &a,
                Generation(0),
                FileHandle(0),
                open_flags(flags),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let len = self
            .table
            .lock()
            .nodes
            .get(&ino.0)
            .map_or(0, |n| n.attr.size);
        let n = len.saturating_sub(offset).min(size as u64) as usize;
        reply.data(&vec![0u8; n])
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut t = self.table.lock();
        let Some(n) = t.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        n.attr.size = n.attr.size.max(offset + data.len() as u64);
        n.dirty += data.len() as u64;
        n.attr.mtime = SystemTime::now();
        reply.written(data.len() as u32)
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        if self.bare.no_flush {
            return reply.error(Errno::ENOSYS);
        }
        reply.ok()
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        match NullFs::rename(self, (parent, name), (newparent, newname), flags) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _d: bool, reply: ReplyEmpty) {
        let Some(disk) = &self.disk else {
            return reply.ok();
        };
        let dirty = self
            .table
            .lock()
            .nodes
            .get_mut(&ino.0)
            .map_or(0, |n| std::mem::take(&mut n.dirty));
        match disk.sync(dirty) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))),
        }
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENODATA)
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(0)
        } else {
            reply.data(&[])
        }
    }

    /// Every lock is granted, with no table: the floor of a lock the mount
    /// decides itself.
    fn getlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        start: u64,
        end: u64,
        _typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        reply.locked(start, end, libc::F_UNLCK, pid)
    }

    fn setlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        _sleep: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }

    /// Listings kept by the kernel across opens, dropped at each change of
    /// the names: as the mount answers for a private directory.
    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(
            FileHandle(0),
            FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
        )
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let t = self.table.lock();
        let Some(names) = t.nodes.get(&ino.0).and_then(|n| n.names.as_ref()) else {
            return reply.error(Errno::ENOTDIR);
        };
        for (i, (name, child)) in names.iter().enumerate().skip(offset as usize) {
            let kind = t.nodes[child].attr.kind;
            if reply.add(INodeNo(*child), i as u64 + 1, kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok()
    }
}

/// Mounts a null file system at `at` and serves it until standard input
/// closes (the agent's way of being stopped), then unmounts.
pub fn serve(at: &Path, bare: Bare, disk: Option<&Path>) -> Result<(), String> {
    let disk = disk
        .map(|d| ShoalDisk::open(d).map_err(|e| format!("{}: {e}", d.display())))
        .transpose()?;
    // A session, and so a scheduling group, of its own, with every thread
    // started below under SCHED_IDLE: as a node's mount runs.
    // SAFETY: setsid and sched_setscheduler on this process have no
    // preconditions; a failure leaves the process as it was.
    let yielding = unsafe {
        libc::setsid();
        let p = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &p) == 0
    };
    let mut config = shoal_fuse::kernel::session_config("shoal-bench:null", true);
    if bare.no_permissions {
        config
            .mount_options
            .retain(|o| !matches!(o, fuser::MountOption::DefaultPermissions));
    }
    let session = fuser::Session::new(NullFs::new(bare, disk), at, &config)
        .map_err(|e| format!("cannot mount the null file system at {}: {e}", at.display()))?;
    let uring = session.uses_uring();
    let session = session
        .spawn()
        .map_err(|e| format!("cannot serve {}: {e}", at.display()))?;
    crate::agent::serve_commands(|w| match w[0] {
        "how" => Ok(serde_json::json!({ "uring": uring, "yielding": yielding })),
        other => Err(format!("unknown command {other}")),
    });
    session
        .umount_and_join()
        .map_err(|e| format!("cannot unmount {}: {e}", at.display()))
}

#[cfg(test)]
mod tests {
    use std::fs::{self, OpenOptions};
    use std::io::{ErrorKind, Write};
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// The floor is only worth reading if the null file system does what
    /// the bench asks of it: names made, found, listed and removed, sizes
    /// kept, the kernel's checks applied.
    #[test]
    fn the_null_file_system_keeps_names_and_sizes() {
        let dir = tempfile::tempdir().unwrap();
        let config = shoal_fuse::kernel::session_config("shoal-bench:null-test", false);
        let session = fuser::Session::new(NullFs::new(Bare::default(), None), dir.path(), &config)
            .expect("mount a null file system (needs /dev/fuse and root)")
            .spawn()
            .unwrap();
        let at = dir.path();
        let d = at.join("d");
        fs::create_dir(&d).unwrap();
        let f = d.join("f");
        let mut file = fs::File::create(&f).unwrap();
        file.write_all(&[7; 4096]).unwrap();
        drop(file);
        assert_eq!(fs::metadata(&f).unwrap().len(), 4096);
        let err = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&f)
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::AlreadyExists);
        fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let names: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["f"]);
        // What dbench asks besides: renames (over a file, not over a full
        // directory), locks, fsync, extended attributes.
        let g = d.join("g");
        fs::write(&g, b"").unwrap();
        fs::rename(&g, &f).unwrap();
        assert_eq!(fs::metadata(&f).unwrap().len(), 0);
        fs::rename(&f, &g).unwrap();
        let names: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["g"], "the kernel's kept listing follows renames");
        fs::rename(&g, &f).unwrap();
        let full = at.join("full");
        fs::create_dir(&full).unwrap();
        fs::write(full.join("x"), b"").unwrap();
        assert_eq!(
            fs::rename(at.join("d"), &full).unwrap_err().raw_os_error(),
            Some(libc::ENOTEMPTY)
        );
        fs::remove_file(full.join("x")).unwrap();
        fs::remove_dir(&full).unwrap();
        let file = OpenOptions::new().read(true).write(true).open(&f).unwrap();
        let lock = libc::flock {
            l_type: libc::F_WRLCK as i16,
            l_whence: libc::SEEK_SET as i16,
            l_start: 0,
            l_len: 0,
            l_pid: 0,
        };
        use std::os::fd::AsRawFd;
        // SAFETY: a valid descriptor and a valid lock description.
        let locked = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) };
        assert_eq!(locked, 0);
        file.sync_all().unwrap();
        assert_eq!(xattr_get(&f), Some(libc::ENODATA));
        drop(file);
        assert_eq!(
            fs::remove_dir(&d).unwrap_err().kind(),
            ErrorKind::DirectoryNotEmpty
        );
        fs::remove_file(&f).unwrap();
        assert_eq!(fs::metadata(&f).unwrap_err().kind(), ErrorKind::NotFound);
        fs::remove_dir(&d).unwrap();
        session.umount_and_join().unwrap();
    }

    /// A shoal `fsync`'s disk work: the file's new bytes on two logs,
    /// then a group entry's 512 on two more; a clean file's, the entry's
    /// alone.
    #[test]
    fn an_fsync_does_the_disk_work_of_a_shoal_fsync() {
        let dir = tempfile::tempdir().unwrap();
        let disk = ShoalDisk::open(dir.path()).unwrap();
        disk.sync(5000).unwrap();
        disk.sync(0).unwrap();
        let written = disk.logs.each_ref().map(|l| l.at.lock().0);
        assert_eq!(written, [5000, 5000, 1024, 1024]);
        // Each log made ahead in zeros, as shoal's are.
        for (i, n) in written.into_iter().enumerate() {
            let bytes = fs::read(dir.path().join(format!("log-{i}"))).unwrap();
            assert_eq!(bytes.len() as u64, AHEAD);
            assert!(bytes[..n as usize].iter().all(|b| *b == 0x5a));
            assert!(bytes[n as usize..].iter().all(|b| *b == 0));
        }
    }

    /// The error of `getxattr(path, "user.x")`, if it failed.
    fn xattr_get(path: &Path) -> Option<i32> {
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        let mut buf = [0u8; 16];
        // SAFETY: NUL-terminated strings and a buffer of the length given.
        let n = unsafe {
            libc::getxattr(
                c.as_ptr(),
                c"user.x".as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        (n < 0).then(|| std::io::Error::last_os_error().raw_os_error().unwrap())
    }
}
