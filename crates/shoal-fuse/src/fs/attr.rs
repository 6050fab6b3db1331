//! The kernel's view of the tree's attributes, times and kinds.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};
use shoal_fs::model::{Attr, Ino, Kind, Timestamp};
use shoal_fs::update::TimeSet;

pub(super) fn system_time(t: Timestamp) -> SystemTime {
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::new(t.secs as u64, t.nanos)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs())
            + Duration::from_nanos(t.nanos.into())
    }
}

pub(crate) fn time_of(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp::new(d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            Timestamp::new(-(d.as_secs() as i64), 0)
        }
    }
}

pub(super) fn file_type(k: Kind) -> FileType {
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

pub(super) fn kind_of_mode(mode: u32) -> Option<Kind> {
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
pub(super) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino.0),
        size: a.size,
        // What it holds: a sparse file's holes take no blocks.
        blocks: if a.kind == Kind::File { a.held } else { a.size }.div_ceil(512),
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

/// The inode the kernel's node id names (the same number).
pub(super) fn node(n: INodeNo) -> Ino {
    Ino(n.0)
}

/// The attributes of a negative entry (node 0: the name is absent).
pub(super) fn absent() -> Attr {
    let zero = Timestamp { secs: 0, nanos: 0 };
    Attr {
        ino: Ino(0),
        kind: Kind::File,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        size: 0,
        held: 0,
        atime: zero,
        mtime: zero,
        ctime: zero,
        version: 0,
    }
}

pub(super) fn time_set(t: Option<TimeOrNow>) -> Option<TimeSet> {
    t.map(|t| match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(s) => TimeSet::At(time_of(s)),
    })
}
