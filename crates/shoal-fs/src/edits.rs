//! A write-back as edits (`docs/fs.md`, "Delayed write"): a file's
//! overlay of changes turned into the fewest cuts and writes that make
//! its content version into the new one, so that the file service's
//! `edit` shares every unchanged extent and a write-back costs what
//! changed, not the file's size.  Where the file grew past what was
//! written, the plan says so with a hole, never zeros: a sparse file's
//! write-back costs what was written whatever its size, and its bytes
//! are made a window ([`PIECE_MAX`]) at a time ([`Piece::bytes`]).  No
//! I/O: the store maps each piece to a file service edit.

use std::collections::BTreeMap;

use crate::tree::{OverlayChange, OverlayEntry, overlaid_window};

/// The most bytes one piece carries.
pub const PIECE_MAX: usize = 1 << 20;

/// One step of the plan, applied in order to the base content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// The file ends at `at` (below the base's length): only ever the
    /// first piece.
    Cut { at: u64 },
    /// The overlay's `len` bytes at `offset` (at most [`PIECE_MAX`], no
    /// further than the file's length) over the file, growing it if they
    /// run past the end: [`Piece::bytes`] makes them.
    Write { offset: u64, len: usize },
    /// Zeros held as a hole, `len` bytes from `offset` (the file's length
    /// at that point): the file grew past what was written.
    Hole { offset: u64, len: u64 },
}

impl Piece {
    /// A write's bytes: the overlay's window it names (the plan was made
    /// from `overlay` and `size`).  Empty for a cut or a hole.
    pub fn bytes(&self, overlay: &[OverlayEntry], size: u64) -> Vec<u8> {
        match *self {
            Piece::Write { offset, len } => overlaid_window(&[], offset, len, overlay, size),
            Piece::Cut { .. } | Piece::Hole { .. } => Vec::new(),
        }
    }
}

/// The pieces that make a base content of `base_len` bytes into what
/// [`crate::tree::overlaid`] makes of it with `overlay`, cut or grown to
/// `size`: a cut at the lowest length any truncation left (if below the
/// base's), then every range written since, merged, with holes where the
/// file grew past it unwritten.  Costs what the overlay holds, whatever
/// `size` is.
pub fn pieces(base_len: u64, overlay: &[OverlayEntry], size: u64) -> Vec<Piece> {
    let Layout { keep, written, .. } = Layout::of(base_len, overlay, size);
    let mut out = Vec::new();
    if keep < base_len {
        out.push(Piece::Cut { at: keep });
    }
    let mut len = keep;
    for &(start, end) in &written {
        if start > len {
            out.push(Piece::Hole {
                offset: len,
                len: start - len,
            });
        }
        let mut at = start;
        while at < end {
            let n = ((end - at) as usize).min(PIECE_MAX);
            out.push(Piece::Write { offset: at, len: n });
            at += n as u64;
        }
        len = len.max(end);
    }
    if size > len {
        out.push(Piece::Hole {
            offset: len,
            len: size - len,
        });
    }
    out
}

/// Where a file holds data, as changes over a content version left it:
/// the prefix of the version that still shows (below the lowest
/// truncation), and the ranges written since, merged; beyond the prefix,
/// what is not written is a hole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub keep: u64,
    pub written: Vec<(u64, u64)>,
    pub size: u64,
}

impl Layout {
    /// What `overlay` leaves of a content version of `base_len` bytes,
    /// cut or grown to `size`.
    pub fn of(base_len: u64, overlay: &[OverlayEntry], size: u64) -> Layout {
        let mut keep = base_len.min(size);
        let mut written: BTreeMap<u64, u64> = BTreeMap::new();
        for e in overlay {
            match &e.change {
                OverlayChange::Write { offset, data } => {
                    add(&mut written, *offset, *offset + data.len() as u64);
                }
                OverlayChange::Truncate { size } => {
                    keep = keep.min(*size);
                    cut(&mut written, *size);
                }
            }
        }
        cut(&mut written, size);
        Layout {
            keep,
            written: written.into_iter().collect(),
            size,
        }
    }

    /// `lseek`'s `SEEK_DATA` (or, with `hole`, `SEEK_HOLE`) from
    /// `offset`: the first byte of data (of a hole) there or after;
    /// `None` at or past the end (`ENXIO`).  `base` is the content
    /// version's data ranges from `offset` on, as its file server's map
    /// answered them; `full` if the map stopped at its limit, when what
    /// lies past its last range is taken as data (POSIX lets a hole be
    /// reported as data, never the other way).
    pub fn seek(&self, base: &[(u64, u64)], full: bool, offset: u64, hole: bool) -> Option<u64> {
        if offset >= self.size {
            return None;
        }
        let mut data: BTreeMap<u64, u64> = BTreeMap::new();
        for &(s, e) in base {
            add(&mut data, s.max(offset), e.min(self.keep));
        }
        if full && let Some(&(_, last)) = base.last() {
            add(&mut data, last, self.keep);
        }
        for &(s, e) in &self.written {
            add(&mut data, s.max(offset), e);
        }
        let mut from = data
            .range(..=offset)
            .next_back()
            .filter(|(_, e)| **e > offset);
        if hole {
            // Ranges are merged: the end of the one holding `offset` is a
            // hole's start, or the file's end (a hole there too).
            return Some(from.map_or(offset, |(_, e)| (*e).min(self.size)));
        }
        if from.is_none() {
            from = data.range(offset..).next();
        }
        from.map(|(s, _)| (*s).max(offset))
            .filter(|s| *s < self.size)
    }
}

/// Adds `[start, end)` to `ranges`, merging what it touches.
fn add(ranges: &mut BTreeMap<u64, u64>, mut start: u64, mut end: u64) {
    if start >= end {
        return;
    }
    let touching: Vec<(u64, u64)> = ranges
        .range(..=end)
        .filter(|(_, e)| **e >= start)
        .map(|(s, e)| (*s, *e))
        .collect();
    for (s, e) in touching {
        ranges.remove(&s);
        start = start.min(s);
        end = end.max(e);
    }
    ranges.insert(start, end);
}

/// Cuts `ranges` at `at`.
fn cut(ranges: &mut BTreeMap<u64, u64>, at: u64) {
    let above: Vec<u64> = ranges.range(at..).map(|(s, _)| *s).collect();
    for s in above {
        ranges.remove(&s);
    }
    if let Some((_, e)) = ranges.range_mut(..at).next_back()
        && *e > at
    {
        *e = at;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::tree::overlaid;

    /// The pieces applied as the file service applies edits.
    fn apply(mut file: Vec<u8>, pieces: &[Piece], overlay: &[OverlayEntry], size: u64) -> Vec<u8> {
        for p in pieces {
            match p {
                Piece::Hole { offset, len } => {
                    assert_eq!(*offset as usize, file.len(), "a hole not at the end");
                    file.resize((offset + len) as usize, 0);
                }
                Piece::Cut { at } => {
                    assert!(*at as usize <= file.len(), "a cut past the end");
                    file.truncate(*at as usize);
                }
                Piece::Write { offset, len } => {
                    let data = p.bytes(overlay, size);
                    assert_eq!(data.len(), *len);
                    let at = *offset as usize;
                    assert!(at <= file.len(), "a write past the end leaves a gap");
                    assert!(data.len() <= PIECE_MAX);
                    if file.len() < at + data.len() {
                        file.resize(at + data.len(), 0);
                    }
                    file[at..at + data.len()].copy_from_slice(&data);
                }
            }
        }
        file
    }

    fn change() -> impl Strategy<Value = OverlayChange> {
        prop_oneof![
            3 => (0u64..400, prop::collection::vec(any::<u8>(), 1..60))
                .prop_map(|(offset, data)| OverlayChange::Write { offset, data }),
            1 => (0u64..400).prop_map(|size| OverlayChange::Truncate { size }),
        ]
    }

    /// The changes as an overlay, and the size the mount keeps for it:
    /// writes grow, truncations set.
    fn sized(base_len: u64, changes: Vec<OverlayChange>) -> (Vec<OverlayEntry>, u64) {
        let mut size = base_len;
        let overlay = changes
            .into_iter()
            .map(|change| {
                size = match &change {
                    OverlayChange::Write { offset, data } => size.max(offset + data.len() as u64),
                    OverlayChange::Truncate { size } => *size,
                };
                OverlayEntry { version: 1, change }
            })
            .collect();
        (overlay, size)
    }

    proptest! {
        #[test]
        fn pieces_make_what_the_overlay_makes(
            base in prop::collection::vec(any::<u8>(), 0..300),
            changes in prop::collection::vec(change(), 0..12),
        ) {
            let (overlay, size) = sized(base.len() as u64, changes);
            let want = overlaid(base.clone(), &overlay, size);
            let plan = pieces(base.len() as u64, &overlay, size);
            prop_assert_eq!(apply(base, &plan, &overlay, size), want);
        }
    }

    /// Which bytes hold data (the base's marked ones, each byte written,
    /// nothing a truncation cut), and what `lseek` answers from them.
    fn data_mask(base: &[bool], overlay: &[OverlayEntry], size: u64) -> Vec<bool> {
        let mut mask = base.to_vec();
        for e in overlay {
            match &e.change {
                OverlayChange::Write { offset, data } => {
                    let end = (*offset as usize) + data.len();
                    if mask.len() < end {
                        mask.resize(end, false);
                    }
                    mask[*offset as usize..end].fill(true);
                }
                OverlayChange::Truncate { size } => mask.resize(*size as usize, false),
            }
        }
        mask.resize(size as usize, false);
        mask
    }

    fn runs_from(mask: &[bool], offset: usize) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (i, d) in mask.iter().enumerate().skip(offset) {
            if !*d {
                continue;
            }
            match out.last_mut() {
                Some(last) if last.1 == i as u64 => last.1 += 1,
                _ => out.push((i as u64, i as u64 + 1)),
            }
        }
        out
    }

    proptest! {
        #[test]
        fn seeks_find_the_data_and_the_holes(
            base in prop::collection::vec(any::<bool>(), 0..120),
            changes in prop::collection::vec(change(), 0..8),
            offset in 0u64..500,
        ) {
            let (overlay, size) = sized(base.len() as u64, changes);
            let mask = data_mask(&base, &overlay, size);
            let layout = Layout::of(base.len() as u64, &overlay, size);
            let map = runs_from(&base, offset as usize);
            let at = offset as usize;
            let want_data = (at..mask.len()).find(|i| mask[*i]).map(|i| i as u64);
            let want_hole = (at < mask.len())
                .then(|| (at..mask.len()).find(|i| !mask[*i]).unwrap_or(mask.len()) as u64);
            prop_assert_eq!(layout.seek(&map, false, offset, false), want_data);
            prop_assert_eq!(layout.seek(&map, false, offset, true), want_hole);
        }
    }

    #[test]
    fn a_full_map_takes_what_lies_past_it_as_data() {
        let layout = Layout::of(1000, &[], 1000);
        assert_eq!(layout.seek(&[(0, 10), (20, 30)], true, 12, false), Some(20));
        assert_eq!(
            layout.seek(&[(0, 10), (20, 30)], true, 22, true),
            Some(1000)
        );
        assert_eq!(layout.seek(&[(0, 10), (20, 30)], false, 22, true), Some(30));
        assert_eq!(layout.seek(&[], false, 1000, false), None);
    }

    #[test]
    fn a_small_change_to_a_large_file_is_a_small_write() {
        let overlay = [OverlayEntry {
            version: 1,
            change: OverlayChange::Write {
                offset: 5 << 20,
                data: vec![1; 10],
            },
        }];
        let plan = pieces(100 << 20, &overlay, 100 << 20);
        assert_eq!(
            plan,
            vec![Piece::Write {
                offset: 5 << 20,
                len: 10
            }]
        );
        assert_eq!(plan[0].bytes(&overlay, 100 << 20), vec![1; 10]);
    }

    #[test]
    fn a_sparse_file_is_a_few_writes_and_holes() {
        const TIB: u64 = 1 << 40;
        let write = |offset: u64| OverlayEntry {
            version: 1,
            change: OverlayChange::Write {
                offset,
                data: vec![7; 4],
            },
        };
        let overlay = [
            write(TIB / 2),
            write(8),
            OverlayEntry {
                version: 1,
                change: OverlayChange::Truncate { size: TIB },
            },
        ];
        let plan = pieces(0, &overlay, TIB);
        assert_eq!(
            plan,
            vec![
                Piece::Hole { offset: 0, len: 8 },
                Piece::Write { offset: 8, len: 4 },
                Piece::Hole {
                    offset: 12,
                    len: TIB / 2 - 12
                },
                Piece::Write {
                    offset: TIB / 2,
                    len: 4
                },
                Piece::Hole {
                    offset: TIB / 2 + 4,
                    len: TIB / 2 - 4
                },
            ]
        );
    }
}
