//! Directories, rows, rights and limits.
//!
//! A directory is a table: each row maps a name to a *capability set* (one
//! capability per replica of the named object) and holds one rights mask
//! per column.  A directory has 1–4 columns (normally "owner", "group",
//! "other").  The low four rights bits of a *directory* capability select
//! the columns its holder may use; a lookup returns the stored
//! capabilities restricted to the union of the usable columns' masks.

use shoal_cap::{Capability, Rights};

/// Rights bit for column `i` (0–3) of a directory capability.
pub const fn column(i: usize) -> Rights {
    Rights::from_bits(1 << i)
}
/// The four column bits.
pub const COLUMNS: Rights = Rights::from_bits(0x0F);
/// Append, delete, replace and chmod rows.
pub const MODIFY: Rights = Rights::from_bits(0x40);
/// Delete the directory itself.
pub const DESTROY: Rights = Rights::from_bits(0x80);

/// Longest name, in bytes of UTF-8.
pub const MAX_NAME: usize = 255;
/// Longest path for a path lookup, in bytes.
pub const MAX_PATH: usize = 4096;
/// Most capabilities in one row's set.
pub const MAX_CAPS: usize = 16;
/// Most columns of a directory.
pub const MAX_COLUMNS: usize = 4;
/// Longest column name, in bytes.
pub const MAX_COLUMN_NAME: usize = 32;
/// Most rows in one directory.
pub const MAX_ROWS: usize = 1_000_000;
/// Most names in one batched lookup, and most rows in one install.
pub const MAX_BATCH: usize = 1024;

/// One row: a name's capability set and one rights mask per column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// One capability per replica of the named object.
    pub caps: Vec<Capability>,
    /// One rights mask per column of the directory.
    pub masks: Vec<Rights>,
}

/// Everything a directory service can refuse, each with its own message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirError {
    #[error("no such directory (deleted, or never created by this service)")]
    UnknownDirectory,
    #[error("capability does not match the directory: forged, corrupted, or revoked")]
    BadCapability,
    #[error("capability grants {have} but the operation needs {need}")]
    Denied { have: Rights, need: Rights },
    #[error("name is {len} bytes long; the limit is {max}")]
    NameTooLong { len: usize, max: usize },
    #[error("bad name: {0}")]
    BadName(String),
    #[error("name {0:?} already exists")]
    Exists(String),
    #[error("name {0:?} not found")]
    NotFound(String),
    #[error("name {0:?} changed since it was read (replace conflict); read it again and retry")]
    Conflict(String),
    #[error("directory is not empty ({0} rows); delete its rows first")]
    NotEmpty(usize),
    #[error("path component {0:?} is not a directory of this service")]
    NotADirectory(String),
    #[error("too large: {0}")]
    TooLarge(String),
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error(
        "this replica has applied updates up to {have} but the client has seen {want}; try another replica"
    )]
    Behind { have: u64, want: u64 },
    #[error("replica unavailable: {0}")]
    Unavailable(String),
    #[error("request {0} of this client was superseded by a later one")]
    Superseded(u64),
}

impl DirError {
    /// Wire code of the error.
    pub(crate) fn code(&self) -> u8 {
        match self {
            DirError::UnknownDirectory => 1,
            DirError::BadCapability => 2,
            DirError::Denied { .. } => 3,
            DirError::NameTooLong { .. } => 4,
            DirError::BadName(_) => 5,
            DirError::Exists(_) => 6,
            DirError::NotFound(_) => 7,
            DirError::Conflict(_) => 8,
            DirError::NotEmpty(_) => 9,
            DirError::NotADirectory(_) => 10,
            DirError::TooLarge(_) => 11,
            DirError::BadRequest(_) => 12,
            DirError::Behind { .. } => 13,
            DirError::Unavailable(_) => 14,
            DirError::Superseded(_) => 15,
        }
    }

    /// Whether another replica might answer differently (the client library
    /// retries these elsewhere).
    pub fn is_retryable(&self) -> bool {
        matches!(self, DirError::Behind { .. } | DirError::Unavailable(_))
    }
}

/// Checks a row name: UTF-8, 1–[`MAX_NAME`] bytes, no `/` or NUL, not `.`
/// or `..`.
pub fn check_name(name: &[u8]) -> Result<&str, DirError> {
    if name.len() > MAX_NAME {
        return Err(DirError::NameTooLong {
            len: name.len(),
            max: MAX_NAME,
        });
    }
    let s = std::str::from_utf8(name).map_err(|_| DirError::BadName("not valid UTF-8".into()))?;
    if s.is_empty() {
        return Err(DirError::BadName("empty".into()));
    }
    if s.contains('/') {
        return Err(DirError::BadName("contains '/'".into()));
    }
    if s.contains('\0') {
        return Err(DirError::BadName("contains NUL".into()));
    }
    if s == "." || s == ".." {
        return Err(DirError::BadName("'.' and '..' are reserved".into()));
    }
    Ok(s)
}

/// Checks a capability set for a row.
pub fn check_caps(caps: &[Capability]) -> Result<(), DirError> {
    if caps.is_empty() {
        return Err(DirError::BadRequest(
            "a row needs at least one capability".into(),
        ));
    }
    if caps.len() > MAX_CAPS {
        return Err(DirError::TooLarge(
            "more than 16 capabilities in one row".into(),
        ));
    }
    Ok(())
}

/// Checks column names for a new directory.
pub fn check_columns(columns: &[Vec<u8>]) -> Result<Vec<String>, DirError> {
    if columns.is_empty() || columns.len() > MAX_COLUMNS {
        return Err(DirError::BadRequest(
            "a directory has 1 to 4 columns".into(),
        ));
    }
    columns
        .iter()
        .map(|c| {
            if c.is_empty() || c.len() > MAX_COLUMN_NAME {
                return Err(DirError::BadRequest(
                    "column names are 1 to 32 bytes".into(),
                ));
            }
            String::from_utf8(c.clone())
                .map_err(|_| DirError::BadName("column name not UTF-8".into()))
        })
        .collect()
}

/// The default columns of a new directory.
pub fn default_columns() -> Vec<String> {
    vec!["owner".into(), "group".into(), "other".into()]
}

/// Default masks of a new row: everything for the owner, the READ bit
/// (0x01) for the other columns.
pub fn default_masks(ncols: usize) -> Vec<Rights> {
    (0..ncols)
        .map(|i| if i == 0 { Rights::ALL } else { Rights::READ })
        .collect()
}

/// Masks for a row naming a directory: everything for the owner; column
/// i of the parent reaches the subdirectory with column i only, so group
/// and other keep their columns all the way down (Amoeba's convention).
pub fn directory_masks(ncols: usize) -> Vec<Rights> {
    (0..ncols)
        .map(|i| if i == 0 { Rights::ALL } else { column(i) })
        .collect()
}
