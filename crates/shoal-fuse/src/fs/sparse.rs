//! Sparse files at the mount (`docs/fs.md`, "Sparse files"): `lseek`'s
//! `SEEK_DATA` and `SEEK_HOLE`, and `fallocate`.
//!
//! A file the mount holds is answered from its content version's map
//! (asked of a file server at each seek) with the dirty changes made over
//! it (`shoal_fs::edits::Layout`); a file it does not hold (write-shared,
//! or not open here under a token) is all data to its size, which POSIX
//! allows, as it allows a hole to be reported as data when a map cannot
//! be had.

use fuser::{Errno, Request};
use shoal_bullet::model::MAX_MAP;
use shoal_fs::edits::Layout;
use shoal_fs::model::{FILE_SIZE_MAX, Ino, Kind};
use shoal_fs::update::SetAttr;

use super::{ShoalFs, errno, now};

impl ShoalFs {
    /// Where data (or, with `hole`, a hole) starts at or after `offset`.
    pub(super) fn seek(
        &self,
        req: &Request,
        ino: Ino,
        offset: i64,
        whence: i32,
    ) -> Result<i64, Errno> {
        let hole = match whence {
            libc::SEEK_DATA => false,
            libc::SEEK_HOLE => true,
            _ => return Err(Errno::EINVAL),
        };
        let offset = u64::try_from(offset).map_err(|_| Errno::ENXIO)?;
        let held = self.conn.cache.lock().layout(ino);
        let found = match held {
            Some((content, layout)) => {
                let (map, full) = if content.is_empty() || offset >= layout.keep {
                    (Vec::new(), false)
                } else {
                    match self.conn.with_files(|f| f.map(&content, offset)) {
                        Ok(map) => {
                            let full = map.len() == MAX_MAP;
                            (map, full)
                        }
                        // A version replaced meanwhile, or its servers
                        // away: its bytes are taken as data.
                        Err(e) => {
                            tracing::debug!("mapping file {ino}: {e}");
                            (vec![(offset, layout.keep)], false)
                        }
                    }
                };
                layout.seek(&map, full, offset, hole)
            }
            None => {
                let (attr, _) = self.attr_of(req, ino).map_err(errno)?;
                let all = Layout {
                    keep: attr.size,
                    written: Vec::new(),
                    size: attr.size,
                };
                all.seek(&[(offset, attr.size)], false, offset, hole)
            }
        };
        found.map(|at| at as i64).ok_or(Errno::ENXIO)
    }

    /// `fallocate`: mode 0 grows the file to `offset + length` if it is
    /// shorter, the new bytes a hole (space is not reserved ahead);
    /// `FALLOC_FL_KEEP_SIZE` alone does nothing; other modes are
    /// `EOPNOTSUPP`.
    pub(super) fn allocate(
        &self,
        req: &Request,
        ino: Ino,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        if mode == libc::FALLOC_FL_KEEP_SIZE {
            return Ok(());
        }
        if mode != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        let end = offset
            .checked_add(length)
            .filter(|end| *end <= FILE_SIZE_MAX)
            .ok_or(Errno::EFBIG)?;
        let when = (now(None), self.conn.lease.now());
        if self.conn.cache.lock().grow(ino, end, when).is_some() {
            return Ok(());
        }
        let (attr, _) = self.attr_of(req, ino).map_err(errno)?;
        if attr.kind != Kind::File {
            return Err(Errno::ENODEV);
        }
        if attr.size >= end {
            return Ok(());
        }
        let set = SetAttr {
            size: Some(end),
            by_handle: true,
            grow: true,
            ..SetAttr::default()
        };
        self.change_attrs(&self.who(req), ino, set, false)
            .map(|_| ())
            .map_err(errno)
    }
}
