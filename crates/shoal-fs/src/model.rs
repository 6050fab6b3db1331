//! Inodes, attributes, identities, limits and errors.

/// An inode number.  Numbers are never reused: a removed inode's number
/// stays retired, so a kernel or client holding it gets "not found", never
/// another file.  It travels as a `u64` (the kernel's node id too).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Ino(pub u64);

impl Ino {
    /// The largest number (a tree that may not make inodes has it next).
    pub const MAX: Ino = Ino(u64::MAX);

    /// The number `n` past this one.
    pub fn plus(self, n: u64) -> Ino {
        Ino(self.0 + n)
    }

    /// This number, leaving the next in its place (a supply of numbers
    /// handed out in order).
    pub fn take(&mut self) -> Ino {
        let n = *self;
        *self = self.plus(1);
        n
    }
}

/// Gives a number's newtype `Display`, `Debug` and `LowerHex` that print
/// the bare number, as the kernel, `stat` and the traces show it.
macro_rules! printed_as_number {
    ($name:ident) => {
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }

        impl std::fmt::LowerHex for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}
pub(crate) use printed_as_number;

printed_as_number!(Ino);

/// The root directory's inode number (FUSE's root node id).
pub const ROOT: Ino = Ino(1);

/// Longest name in a directory, in bytes.
pub const NAME_MAX: usize = 255;
/// Longest symbolic link target, in bytes.
pub const SYMLINK_MAX: usize = 4095;
/// Most links to one inode.
pub const LINK_MAX: u32 = 65_000;
/// Longest extended attribute name, in bytes.
pub const XATTR_NAME_MAX: usize = 255;
/// Largest extended attribute value, in bytes.
pub const XATTR_VALUE_MAX: usize = 65_536;
/// Most bytes of extended attributes (names and values) on one inode.
pub const XATTR_TOTAL_MAX: usize = 1 << 20;
/// Largest file (the file service's limit).
pub const FILE_SIZE_MAX: u64 = 16 << 40;

/// The mode's set-user-id bit.
pub const S_ISUID: u16 = 0o4000;
/// The mode's set-group-id bit.
pub const S_ISGID: u16 = 0o2000;
/// The mode's sticky bit.
pub const S_ISVTX: u16 = 0o1000;

/// What an inode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    Fifo = 4,
    Socket = 5,
    CharDev = 6,
    BlockDev = 7,
}

impl Kind {
    /// The kind with this wire number.
    pub fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::File,
            2 => Kind::Dir,
            3 => Kind::Symlink,
            4 => Kind::Fifo,
            5 => Kind::Socket,
            6 => Kind::CharDev,
            7 => Kind::BlockDev,
            _ => return None,
        })
    }

    /// The `S_IFMT` bits of a mode for this kind.
    pub fn format_bits(self) -> u32 {
        match self {
            Kind::File => 0o100_000,
            Kind::Dir => 0o040_000,
            Kind::Symlink => 0o120_000,
            Kind::Fifo => 0o010_000,
            Kind::Socket => 0o140_000,
            Kind::CharDev => 0o020_000,
            Kind::BlockDev => 0o060_000,
        }
    }

    /// Whether an inode of this kind is a device, FIFO or socket: a name
    /// and attributes only.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            Kind::Fifo | Kind::Socket | Kind::CharDev | Kind::BlockDev
        )
    }
}

/// A file's time (`stat`'s atime, mtime and ctime): seconds and nanoseconds
/// since the Unix epoch, on the wall clock (the cores' monotonic clock is
/// `shoal_time::Time`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp {
    pub secs: i64,
    pub nanos: u32,
}

impl Timestamp {
    /// A time from seconds and nanoseconds (nanoseconds above a second are
    /// cut to 999,999,999).
    pub fn new(secs: i64, nanos: u32) -> Timestamp {
        Timestamp {
            secs,
            nanos: nanos.min(999_999_999),
        }
    }
}

/// An inode's attributes, as `stat` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: Kind,
    /// Permission bits, with set-user-id, set-group-id and sticky
    /// (the low 12 bits of a mode).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    /// The bytes of data a regular file holds, its holes not counted
    /// (at most its size; what `st_blocks` reports): 0 for other kinds.
    pub held: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    /// Grows by one at every change of a regular file's contents.
    pub version: u64,
}

impl Attr {
    /// The whole mode: format bits and permission bits.
    pub fn mode(&self) -> u32 {
        self.kind.format_bits() | u32::from(self.perm)
    }
}

/// Who asks: a uid, its primary group and its supplementary groups, as
/// the kernel of the caller's node gave them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// Most supplementary groups an identity carries (Linux's `NGROUPS_MAX`).
pub const GROUPS_MAX: usize = 65_536;

impl Identity {
    /// Root.
    pub fn root() -> Identity {
        Identity::default()
    }

    /// A user with a primary group and no others.
    pub fn user(uid: u32, gid: u32) -> Identity {
        Identity {
            uid,
            gid,
            groups: Vec::new(),
        }
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether `gid` is this identity's primary or a supplementary group.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// Why an operation failed; each maps to the errno a program sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("permission denied")]
    Access,
    #[error("operation not permitted")]
    Perm,
    #[error("name too long")]
    NameTooLong,
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    #[error("too many links")]
    TooManyLinks,
    #[error("no space left")]
    NoSpace,
    #[error("no such attribute")]
    NoData,
    #[error("attribute name or value too long")]
    Range,
    #[error("attribute value too large")]
    TooBig,
    #[error("file too large")]
    FileTooBig,
    #[error("not supported")]
    NotSupported,
    #[error("resource busy")]
    Busy,
    #[error("stale: {0}")]
    Stale(&'static str),
    #[error("input/output error")]
    Io,
}

impl FsError {
    /// The errno a program sees for this error.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => 2,
            FsError::Exists => 17,
            FsError::NotDir => 20,
            FsError::IsDir => 21,
            FsError::NotEmpty => 39,
            FsError::Access => 13,
            FsError::Perm => 1,
            FsError::NameTooLong => 36,
            FsError::Invalid(_) => 22,
            FsError::TooManyLinks => 31,
            FsError::NoSpace => 28,
            FsError::NoData => 61,
            FsError::Range => 34,
            FsError::TooBig => 7,
            FsError::FileTooBig => 27,
            FsError::NotSupported => 95,
            FsError::Busy => 16,
            FsError::Stale(_) => 116,
            FsError::Io => 5,
        }
    }

    /// The wire code of this error (its errno; the text of `Invalid` and
    /// `Stale` is not sent).
    pub fn from_errno(errno: i32) -> FsError {
        match errno {
            2 => FsError::NotFound,
            17 => FsError::Exists,
            20 => FsError::NotDir,
            21 => FsError::IsDir,
            39 => FsError::NotEmpty,
            13 => FsError::Access,
            1 => FsError::Perm,
            36 => FsError::NameTooLong,
            22 => FsError::Invalid("refused"),
            31 => FsError::TooManyLinks,
            28 => FsError::NoSpace,
            61 => FsError::NoData,
            34 => FsError::Range,
            7 => FsError::TooBig,
            27 => FsError::FileTooBig,
            95 => FsError::NotSupported,
            16 => FsError::Busy,
            116 => FsError::Stale("refused"),
            _ => FsError::Io,
        }
    }
}

/// Checks a name for a directory entry: any bytes but `/` and NUL, not
/// empty, not `.` or `..`, at most [`NAME_MAX`] bytes (POSIX allows names
/// that are not UTF-8, and so does shoal).
pub fn check_name(name: &[u8]) -> Result<(), FsError> {
    if name.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(FsError::Invalid(
            "a name is 1 to 255 bytes, without / or NUL",
        ));
    }
    if name == b"." || name == b".." {
        return Err(FsError::Exists);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(check_name(b"a"), Ok(()));
        assert_eq!(
            check_name(&[0xff, 0xfe]),
            Ok(()),
            "bytes that are not UTF-8"
        );
        assert_eq!(check_name(&[b'x'; 255]), Ok(()));
        assert_eq!(check_name(&[b'x'; 256]), Err(FsError::NameTooLong));
        assert!(matches!(check_name(b""), Err(FsError::Invalid(_))));
        assert!(matches!(check_name(b"a/b"), Err(FsError::Invalid(_))));
        assert!(matches!(check_name(b"a\0"), Err(FsError::Invalid(_))));
        assert_eq!(check_name(b"."), Err(FsError::Exists));
        assert_eq!(check_name(b".."), Err(FsError::Exists));
    }

    #[test]
    fn errnos_round_trip() {
        for e in [
            FsError::NotFound,
            FsError::Exists,
            FsError::NotDir,
            FsError::IsDir,
            FsError::NotEmpty,
            FsError::Access,
            FsError::Perm,
            FsError::NameTooLong,
            FsError::TooManyLinks,
            FsError::NoSpace,
            FsError::NoData,
            FsError::Range,
            FsError::TooBig,
            FsError::FileTooBig,
            FsError::NotSupported,
            FsError::Busy,
            FsError::Io,
        ] {
            assert_eq!(FsError::from_errno(e.errno()), e);
        }
        assert_eq!(FsError::from_errno(12345), FsError::Io);
    }

    #[test]
    fn kinds_round_trip() {
        for v in 0..=255u8 {
            if let Some(k) = Kind::from_u8(v) {
                assert_eq!(k as u8, v);
            }
        }
        assert_eq!(Kind::from_u8(0), None);
        assert_eq!(Kind::from_u8(8), None);
    }
}
