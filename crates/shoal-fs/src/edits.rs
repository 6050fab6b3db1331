//! A write-back as edits (`docs/fs.md`, "Delayed write"): a file's
//! overlay of changes turned into the fewest cuts and writes that make
//! its content version into the new one, so that the file service's
//! `edit` shares every unchanged extent and a write-back costs what
//! changed, not the file's size.  No I/O: the mount maps each piece to a
//! file service edit.

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
    /// `data` over the file from `offset` (no further than its length),
    /// growing it if it runs past the end.
    Write { offset: u64, data: Vec<u8> },
}

/// The pieces that make a base content of `base_len` bytes into what
/// [`crate::tree::overlaid`] makes of it with `overlay`, cut or grown to
/// `size`: a cut at the lowest length any truncation left (if below the
/// base's), then every range written since, merged, with zeros where the
/// file grew past it unwritten.
pub fn pieces(base_len: u64, overlay: &[OverlayEntry], size: u64) -> Vec<Piece> {
    let mut keep = base_len.min(size);
    // Ranges written, start → end, merged; a truncation cuts them.
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
    let mut out = Vec::new();
    if keep < base_len {
        out.push(Piece::Cut { at: keep });
    }
    let mut len = keep;
    let emit = |out: &mut Vec<Piece>, len: &mut u64, from: u64, to: u64, zeros: bool| {
        let mut at = from;
        while at < to {
            let n = ((to - at) as usize).min(PIECE_MAX);
            let data = if zeros {
                vec![0; n]
            } else {
                overlaid_window(&[], at, n, overlay, size)
            };
            out.push(Piece::Write { offset: at, data });
            at += n as u64;
        }
        *len = (*len).max(to);
    };
    for (&start, &end) in &written {
        if start > len {
            let gap = len;
            emit(&mut out, &mut len, gap, start, true);
        }
        emit(&mut out, &mut len, start, end, false);
    }
    if size > len {
        let gap = len;
        emit(&mut out, &mut len, gap, size, true);
    }
    out
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
    fn apply(mut file: Vec<u8>, pieces: &[Piece]) -> Vec<u8> {
        for p in pieces {
            match p {
                Piece::Cut { at } => {
                    assert!(*at as usize <= file.len(), "a cut past the end");
                    file.truncate(*at as usize);
                }
                Piece::Write { offset, data } => {
                    let at = *offset as usize;
                    assert!(at <= file.len(), "a write past the end leaves a gap");
                    assert!(data.len() <= PIECE_MAX);
                    if file.len() < at + data.len() {
                        file.resize(at + data.len(), 0);
                    }
                    file[at..at + data.len()].copy_from_slice(data);
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

    proptest! {
        #[test]
        fn pieces_make_what_the_overlay_makes(
            base in prop::collection::vec(any::<u8>(), 0..300),
            changes in prop::collection::vec(change(), 0..12),
        ) {
            // The size as the mount keeps it: writes grow, truncations set.
            let mut size = base.len() as u64;
            let overlay: Vec<OverlayEntry> = changes
                .into_iter()
                .map(|change| {
                    size = match &change {
                        OverlayChange::Write { offset, data } => size.max(offset + data.len() as u64),
                        OverlayChange::Truncate { size } => *size,
                    };
                    OverlayEntry { version: 1, change }
                })
                .collect();
            let want = overlaid(base.clone(), &overlay, size);
            let plan = pieces(base.len() as u64, &overlay, size);
            prop_assert_eq!(apply(base, &plan), want);
        }
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
                data: vec![1; 10]
            }]
        );
    }
}
