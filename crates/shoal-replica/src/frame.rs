//! How a replica's log file frames its records (the payloads are the
//! machine's own).
//!
//! A log file is a 16-byte header, `magic [8] | base u64` (the state
//! index of the snapshot this log follows), then records: `len u32 |
//! check [8] | kind u8 | index u64 | payload`, where `len` counts the
//! bytes after the check and `check` is the first 8 bytes of BLAKE3 over
//! `kind | index | payload`.  A torn or corrupt record ends the log:
//! everything before it is used, the rest is cut off.

use shoal_cap::codec::{Reader, Writer};

/// Length of a log file's header.
pub const HEADER: usize = 16;
/// Bytes of a record around its payload.
pub const RECORD_OVERHEAD: usize = 4 + 8 + 1 + 8;

/// The header of a log with `magic` that follows the snapshot at `base`.
pub fn header(magic: &[u8; 8], base: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(magic);
    h[8..].copy_from_slice(&base.to_le_bytes());
    h
}

/// Appends one record to `out`.
pub fn record(out: &mut Vec<u8>, kind: u8, index: u64, payload: &[u8]) {
    let mut body = Vec::with_capacity(9 + payload.len());
    body.push(kind);
    body.extend_from_slice(&index.to_le_bytes());
    body.extend_from_slice(payload);
    let mut w = Writer(out);
    w.u32(body.len() as u32);
    w.raw(&blake3::hash(&body).as_bytes()[..8]);
    w.raw(&body);
}

/// One intact record: its kind, index and payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub kind: u8,
    pub index: u64,
    pub payload: &'a [u8],
}

/// A log file's intact records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frames<'a> {
    /// The snapshot index the log follows.
    pub base: u64,
    pub records: Vec<Record<'a>>,
    /// Bytes of the file that hold whole, intact records (the rest, a torn
    /// tail, should be cut off before appending).
    pub valid_len: usize,
}

/// Reads a log file's frames.  `None` if the header is missing or not
/// `magic`.
pub fn frames<'a>(magic: &[u8; 8], buf: &'a [u8]) -> Option<Frames<'a>> {
    if buf.len() < HEADER || &buf[..8] != magic {
        return None;
    }
    let base = u64::from_le_bytes(buf[8..16].try_into().ok()?);
    let mut records = Vec::new();
    let mut pos = HEADER;
    loop {
        let mut r = Reader::new(&buf[pos..], "log record");
        let Ok(len) = r.u32() else { break };
        let Ok(check) = r.take(8) else { break };
        let Ok(body) = r.take(len as usize) else {
            break;
        };
        if len < 9 || &blake3::hash(body).as_bytes()[..8] != check {
            break;
        }
        records.push(Record {
            kind: body[0],
            index: u64::from_le_bytes(body[1..9].try_into().ok()?),
            payload: &body[9..],
        });
        pos += 12 + len as usize;
    }
    Some(Frames {
        base,
        records,
        valid_len: pos,
    })
}

/// Which logs recovery reads, and which must be intact: given the logs'
/// bases in order and the snapshot's index, `None` for a log the snapshot
/// covers (its successor starts at or before the index), else whether it
/// is older than the newest (an older log was synced whole before its
/// successor was made, so a bad record in it is lost data, and replaying
/// past it would skip acknowledged writes).
pub fn plan(bases: &[u64], snapshot_index: u64) -> Vec<Option<bool>> {
    (0..bases.len())
        .map(|i| {
            if bases.get(i + 1).is_some_and(|next| *next <= snapshot_index) {
                None
            } else {
                Some(i + 1 < bases.len())
            }
        })
        .collect()
}

/// What recovery says of an older log that is not intact.
pub const OLDER_LOG_CORRUPT: &str = "a log older than the newest is corrupt, so writes it held are \
     lost; move this replica's data directory aside and start it empty to rejoin from the others";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_a_torn_tail_is_cut() {
        let mut log = header(b"TESTLOG1", 7).to_vec();
        record(&mut log, 1, 8, b"eight");
        record(&mut log, 2, 9, b"");
        let whole = log.len();
        record(&mut log, 1, 10, b"ten");
        let f = frames(b"TESTLOG1", &log).unwrap();
        assert_eq!(f.base, 7);
        assert_eq!(f.records.len(), 3);
        assert_eq!(f.records[0].payload, b"eight");
        assert_eq!((f.records[1].kind, f.records[1].index), (2, 9));
        assert_eq!(f.valid_len, log.len());
        let torn = &log[..log.len() - 1];
        let f = frames(b"TESTLOG1", torn).unwrap();
        assert_eq!((f.records.len(), f.valid_len), (2, whole));
        let mut bad = log.clone();
        bad[HEADER + 20] ^= 1;
        assert_eq!(frames(b"TESTLOG1", &bad).unwrap().records.len(), 0);
        assert!(frames(b"OTHERLOG", &log).is_none());
        assert!(frames(b"TESTLOG1", &log[..10]).is_none());
    }

    #[test]
    fn the_plan_skips_covered_logs() {
        assert_eq!(plan(&[1, 5, 9], 5), vec![None, Some(true), Some(false)]);
        assert_eq!(plan(&[1], 0), vec![Some(false)]);
    }
}
