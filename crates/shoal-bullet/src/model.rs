//! Rights, limits and errors of the file service.
//!
//! A file server holds immutable files, each named by a capability whose
//! object number is the file's and whose check field is keyed by the
//! file's own secret.  The server itself is object 0: its capability
//! carries the rights to create files and to run the admin operations.

use shoal_cap::Rights;

/// Read a committed file (read, size, stat).
pub const READ: Rights = Rights::from_bits(0x01);
/// Derive new files from this one (modify, insert, delete-range), and add
/// to or commit an uncommitted one.
pub const MODIFY: Rights = Rights::from_bits(0x02);
/// Create files (on the server's capability, object 0).
pub const CREATE: Rights = Rights::from_bits(0x04);
/// Destroy the file.
pub const DESTROY: Rights = Rights::from_bits(0x08);
/// Admin operations: sync, fsck, compact, age, statistics (object 0).
pub const ADMIN: Rights = Rights::from_bits(0x10);

/// The server's own object number.
pub const SERVER_OBJECT: u64 = 0;

/// Longest extent written in one piece: a file's data is stored in
/// extents of at most this many contiguous bytes, each with its own
/// checksum, so a read verifies at most this much beyond what it needs.
pub const MAX_EXTENT: u64 = 1 << 20;
/// Most bytes in one request's data or one read's answer.
pub const MAX_CHUNK: usize = 8 << 20;
/// Largest file.
pub const MAX_FILE: u64 = 1 << 44;
/// The extent number of a hole: a piece of it reads as zeros and holds no
/// extent (real extents are numbered from 1).
pub const HOLE: u64 = 0;
/// Most pieces (references to extent ranges) one file may have; an edit
/// that would exceed it is refused (copy the file to defragment it).
pub const MAX_PIECES: usize = 1 << 20;
/// Most capabilities in one touch.
pub const MAX_TOUCH: usize = 4096;
/// Most data ranges in one map's answer.
pub const MAX_MAP: usize = 4096;

/// Default time-to-live of an object, in ageing passes.
pub const DEFAULT_TTL: u8 = 24;
/// Default life of an uncommitted file that nobody touches, in seconds.
pub const DEFAULT_UNCOMMITTED_SECS: u64 = 600;
/// Default least time between two ageing passes, in seconds.
pub const DEFAULT_AGE_GAP_SECS: u64 = 3600;

/// Everything a file server can refuse, each with its own message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    #[error("no such file (destroyed, garbage-collected, or never created by this server)")]
    NotFound,
    #[error("capability does not match the file: forged, corrupted, or revoked")]
    BadCapability,
    #[error("capability grants {have} but the operation needs {need}")]
    Denied { have: Rights, need: Rights },
    #[error("the file is not committed yet (commit it first)")]
    NotCommitted,
    #[error("the file is committed and immutable (modify it into a new file)")]
    Committed,
    #[error("range {offset}+{len} is beyond the end of the file ({size} bytes)")]
    Range { offset: u64, len: u64, size: u64 },
    #[error("too large: {0}")]
    TooLarge(String),
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("data corrupted on this server: {0}")]
    Corrupt(String),
    #[error("the store is full: {0}")]
    NoSpace(String),
    #[error("storage error on the server: {0}")]
    Io(String),
}

impl FileError {
    /// Wire code of the error.
    pub(crate) fn code(&self) -> u8 {
        match self {
            FileError::NotFound => 1,
            FileError::BadCapability => 2,
            FileError::Denied { .. } => 3,
            FileError::NotCommitted => 4,
            FileError::Committed => 5,
            FileError::Range { .. } => 6,
            FileError::TooLarge(_) => 7,
            FileError::BadRequest(_) => 8,
            FileError::Corrupt(_) => 9,
            FileError::NoSpace(_) => 10,
            FileError::Io(_) => 11,
        }
    }

    /// Whether another replica of the file might serve what this one
    /// could not (the client library fails over on these).
    pub fn try_another_replica(&self) -> bool {
        matches!(
            self,
            FileError::NotFound | FileError::Corrupt(_) | FileError::Io(_)
        )
    }
}

impl From<std::io::Error> for FileError {
    fn from(e: std::io::Error) -> Self {
        if e.raw_os_error() == Some(libc_enospc()) {
            FileError::NoSpace(e.to_string())
        } else {
            FileError::Io(e.to_string())
        }
    }
}

/// ENOSPC on Linux (kept here so the core needs no libc).
const fn libc_enospc() -> i32 {
    28
}
