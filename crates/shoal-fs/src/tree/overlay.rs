//! A write-shared file's overlay: the changes made since its content
//! version, in the order the tree took them, and how they make the file's
//! bytes (whole, or a window of them) from that version's.

use super::{Body, OVERLAY_WRITE_MAX, Tree};
use crate::access;
use crate::model::*;
use crate::update::Answer;

#[cfg(test)]
mod tests;

/// One change of a write-shared file since its content version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OverlayChange {
    Write { offset: u64, data: Vec<u8> },
    Truncate { size: u64 },
}

/// An overlay change and the file version it made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlayEntry {
    pub version: u64,
    pub change: OverlayChange,
}

/// A file's bytes: its content version's `base` with the overlay's changes
/// made in order, cut or extended (with zeros) to `size`.
pub fn overlaid(mut base: Vec<u8>, overlay: &[OverlayEntry], size: u64) -> Vec<u8> {
    for e in overlay {
        match &e.change {
            OverlayChange::Write { offset, data } => {
                let at = *offset as usize;
                if base.len() < at + data.len() {
                    base.resize(at + data.len(), 0);
                }
                base[at..at + data.len()].copy_from_slice(data);
            }
            OverlayChange::Truncate { size } => base.resize(*size as usize, 0),
        }
    }
    base.resize(size as usize, 0);
    base
}

/// The bytes `[start, start + len)` of a file (fewer at its end): its
/// content version's bytes from `start` (`base`, as many as the content
/// has there) with the overlay's changes made in order, cut to `size`.
/// The same bytes as that window of [`overlaid`], without building the
/// rest of the file.
///
/// Built newest change first, each byte of the window copied at most
/// once: a file rewritten in place keeps every rewrite in its overlay
/// until it is written back, and copying them all in order made each
/// read of it cost its rewrites (a `dbench` run's reads copied twelve
/// times their window).  Walking back, a write fills what no later
/// write filled, below the lowest truncation made after it; what is
/// left of the window below every truncation is the base's.
pub fn overlaid_window(
    base: &[u8],
    start: u64,
    len: usize,
    overlay: &[OverlayEntry],
    size: u64,
) -> Vec<u8> {
    let end = start.saturating_add(len as u64).min(size);
    if end <= start {
        return Vec::new();
    }
    let mut w = vec![0u8; (end - start) as usize];
    // What later changes decided, as disjoint sorted ranges of the
    // window, and how far older bytes still show (no truncation since
    // cut them).
    let mut filled = Filled::default();
    let mut shows = end;
    for e in overlay.iter().rev() {
        match &e.change {
            OverlayChange::Write { offset, data } => {
                let from = (*offset).max(start);
                let to = offset.saturating_add(data.len() as u64).min(shows);
                for (a, b) in filled.take(from, to) {
                    let src = &data[(a - offset) as usize..(b - offset) as usize];
                    w[(a - start) as usize..(b - start) as usize].copy_from_slice(src);
                }
            }
            OverlayChange::Truncate { size } => shows = shows.min((*size).max(start)),
        }
        if filled.whole(start, shows) {
            return w;
        }
    }
    let to = shows.min(start + base.len() as u64);
    for (a, b) in filled.take(start, to) {
        let (a, b) = ((a - start) as usize, (b - start) as usize);
        w[a..b].copy_from_slice(&base[a..b]);
    }
    w
}

/// The parts of a window already decided, as sorted disjoint ranges.
#[derive(Default)]
struct Filled(Vec<(u64, u64)>);

impl Filled {
    /// Marks `[from, to)` decided; the parts of it that were not, in order.
    fn take(&mut self, from: u64, to: u64) -> Vec<(u64, u64)> {
        let mut gaps = Vec::new();
        if from >= to {
            return gaps;
        }
        // The ranges touching [from, to), merged with it.
        let first = self.0.partition_point(|&(_, b)| b < from);
        let last = self.0.partition_point(|&(a, _)| a <= to);
        let mut at = from;
        for &(a, b) in &self.0[first..last] {
            if a > at {
                gaps.push((at, a.min(to)));
            }
            at = at.max(b);
        }
        if at < to {
            gaps.push((at, to));
        }
        let merged = match &self.0[first..last] {
            [] => (from, to),
            touching => (
                touching[0].0.min(from),
                touching[touching.len() - 1].1.max(to),
            ),
        };
        self.0.splice(first..last, [merged]);
        gaps
    }

    /// Whether all of `[from, to)` is decided (the ranges are merged, so
    /// one must hold it all).
    fn whole(&self, from: u64, to: u64) -> bool {
        from >= to || self.0.first().is_some_and(|&(a, b)| a <= from && to <= b)
    }
}

impl Tree {
    /// A write into a write-shared file's overlay (appended when `offset`
    /// is `None`).
    pub(super) fn overlay(
        &mut self,
        who: &Identity,
        now: Timestamp,
        ino: Ino,
        offset: Option<u64>,
        data: &[u8],
    ) -> Result<Answer, FsError> {
        if data.len() > OVERLAY_WRITE_MAX {
            return Err(FsError::Invalid("an overlay write is at most 1 MiB"));
        }
        let i = self.inode_mut(ino)?;
        let Body::File { overlay, .. } = &mut i.body else {
            return Err(if i.attr.kind == Kind::Dir {
                FsError::IsDir
            } else {
                FsError::Invalid("only a regular file has contents")
            });
        };
        let offset = offset.unwrap_or(i.attr.size);
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|e| *e <= FILE_SIZE_MAX)
            .ok_or(FsError::FileTooBig)?;
        i.attr.version += 1;
        overlay.push(OverlayEntry {
            version: i.attr.version,
            change: OverlayChange::Write {
                offset,
                data: data.to_vec(),
            },
        });
        i.attr.size = i.attr.size.max(end);
        i.attr.held = (i.attr.held + data.len() as u64).min(i.attr.size);
        i.attr.perm = access::after_write(&i.attr, who);
        i.attr.mtime = now;
        i.attr.ctime = now;
        Ok(Answer::Written {
            offset,
            attr: i.attr,
        })
    }
}
