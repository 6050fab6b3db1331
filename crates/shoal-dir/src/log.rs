//! The coalescing write-ahead log, as bytes in and bytes out (the replica
//! does the file I/O).
//!
//! Applied writes wait in a [`LogBuffer`] until the replica flushes it.  An
//! append of a name and a delete of the same name that meet in the buffer
//! cancel out: a temporary name written and removed between two flushes
//! never reaches the disk.  Writes that were refused change nothing but the
//! client's session, and are not logged.
//!
//! File layout: a 16-byte header, `"SHOALDL1" | base u64` (the state index
//! of the snapshot this log follows), then records: `len u32 | check [8] |
//! kind u8 | index u64 | payload`, where `len` counts the bytes after the
//! check, `check` is the first 8 bytes of BLAKE3 over `kind | index |
//! payload`, kind 1 is an applied write (payload: the encoded request) and
//! kind 2 a mark (no payload: "the state reached `index`", written when the
//! tail of a flush cancelled out).  A torn or corrupt record ends the log:
//! everything before it is used, the rest is cut off.

use std::collections::HashMap;

use shoal_replica::frame;

use crate::op::{Op, Request};

/// Log file header magic.
pub const LOG_MAGIC: &[u8; 8] = b"SHOALDL1";
/// Length of the log file header.
pub const LOG_HEADER: usize = frame::HEADER;
/// Record kind: an applied write.
pub const KIND_ENTRY: u8 = 1;
/// Record kind: the state reached an index.
pub const KIND_MARK: u8 = 2;
/// Record kind: a cancelled write's session.
pub const KIND_SESSION: u8 = 3;
/// Bytes of a record around its payload.
pub const RECORD_OVERHEAD: usize = frame::RECORD_OVERHEAD;

/// The header of a log that follows the snapshot at `base`.
pub fn header(base: u64) -> [u8; LOG_HEADER] {
    frame::header(LOG_MAGIC, base)
}

fn record(out: &mut Vec<u8>, kind: u8, index: u64, payload: &[u8]) {
    frame::record(out, kind, index, payload)
}

/// One record read back from a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogRecord {
    /// A write applied at `index`.
    Entry { index: u64, request: Request },
    /// The state reached `index`.
    Mark { index: u64 },
    /// Client `client`'s write `seq` succeeded at `index` (and cancelled
    /// out).
    Session { index: u64, client: u64, seq: u64 },
}

/// A log file read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedLog {
    /// The snapshot index the log follows.
    pub base: u64,
    pub records: Vec<LogRecord>,
    /// Bytes of the file that hold whole, intact records (the rest, a torn
    /// tail, should be cut off before appending).
    pub valid_len: usize,
}

/// Reads a log file.  `None` if the header is missing or wrong.
pub fn parse(buf: &[u8]) -> Option<ParsedLog> {
    let f = frame::frames(LOG_MAGIC, buf)?;
    let mut records = Vec::with_capacity(f.records.len());
    let mut valid_len = frame::HEADER;
    for r in &f.records {
        let rec = match r.kind {
            KIND_ENTRY => match Request::decode(r.payload) {
                Ok(request) => LogRecord::Entry {
                    index: r.index,
                    request,
                },
                Err(_) => break,
            },
            KIND_MARK => LogRecord::Mark { index: r.index },
            KIND_SESSION if r.payload.len() == 16 => LogRecord::Session {
                index: r.index,
                client: u64::from_le_bytes(r.payload[..8].try_into().ok()?),
                seq: u64::from_le_bytes(r.payload[8..].try_into().ok()?),
            },
            _ => break,
        };
        records.push(rec);
        valid_len += frame::RECORD_OVERHEAD + r.payload.len();
    }
    Some(ParsedLog {
        base: f.base,
        records,
        valid_len,
    })
}

/// Applied writes waiting to be flushed, with appends and deletes of the
/// same name cancelling out.
#[derive(Debug, Default)]
pub struct LogBuffer {
    pending: Vec<Option<(u64, Vec<u8>)>>,
    /// Sessions of writes that cancelled out: (index, client, seq).
    sessions: Vec<(u64, u64, u64)>,
    /// (directory, name) → position of a pending append of that row that
    /// nothing has touched since.
    appends: HashMap<(u64, Vec<u8>), usize>,
    last_index: u64,
    /// Whether records were cancelled or refused writes noted since the
    /// last take.
    skipped: bool,
    /// Pairs cancelled since the buffer was made.
    pub cancelled_pairs: u64,
}

impl LogBuffer {
    /// An empty buffer.
    pub fn new() -> LogBuffer {
        LogBuffer::default()
    }

    /// Whether nothing waits to be flushed.
    pub fn is_empty(&self) -> bool {
        !self.skipped && self.pending.iter().all(Option::is_none)
    }

    /// The index of the latest write pushed.
    pub fn last_index(&self) -> u64 {
        self.last_index
    }

    /// Adds a write that was applied (and not refused) at `index`;
    /// `encoded` is the request as ordered.
    pub fn push(&mut self, index: u64, request: &Request, encoded: &[u8]) {
        self.last_index = self.last_index.max(index);
        match &request.op {
            Op::Append { dir, name, .. } => {
                let key = (dir.object().get(), name.clone());
                self.appends.insert(key, self.pending.len());
            }
            Op::Delete { dir, name } => {
                let key = (dir.object().get(), name.clone());
                if let Some(pos) = self.appends.remove(&key) {
                    if let Some((i, bytes)) = self.pending[pos].take()
                        && let Ok(append) = Request::decode(&bytes)
                        && append.client != 0
                    {
                        self.sessions.push((i, append.client, append.seq));
                    }
                    if request.client != 0 {
                        self.sessions.push((index, request.client, request.seq));
                    }
                    self.skipped = true;
                    self.cancelled_pairs += 1;
                    return;
                }
            }
            Op::Replace { dir, name, .. } | Op::Chmod { dir, name, .. } => {
                self.appends.remove(&(dir.object().get(), name.clone()));
            }
            Op::Install { items } => {
                for it in items {
                    self.appends
                        .remove(&(it.dir.object().get(), it.name.clone()));
                }
            }
            _ => {}
        }
        self.pending.push(Some((index, encoded.to_vec())));
    }

    /// Notes a write that was refused at `index`: it changed nothing but
    /// the index, and is not logged.
    pub fn note_refused(&mut self, index: u64) {
        self.last_index = self.last_index.max(index);
        self.skipped = true;
    }

    /// The bytes to append to the log file, and empties the buffer.  With
    /// `mark`, if the last records cancelled out or were refused writes,
    /// the bytes end with a mark of the last index, so the file's index
    /// never falls behind the state it holds (the `fsync` mode needs this;
    /// the `replicated` mode writes nothing at all when everything
    /// cancelled).  `None`: nothing to write.
    pub fn take(&mut self, mark: bool) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let mut written = 0;
        for (index, bytes) in self.pending.drain(..).flatten() {
            record(&mut out, KIND_ENTRY, index, &bytes);
            written = index;
        }
        if mark {
            for (index, client, seq) in &self.sessions {
                let mut payload = [0u8; 16];
                payload[..8].copy_from_slice(&client.to_le_bytes());
                payload[8..].copy_from_slice(&seq.to_le_bytes());
                record(&mut out, KIND_SESSION, *index, &payload);
            }
        }
        if mark && self.skipped && written < self.last_index {
            record(&mut out, KIND_MARK, self.last_index, &[]);
        }
        self.sessions.clear();
        self.skipped = false;
        self.appends.clear();
        (!out.is_empty()).then_some(out)
    }
}

/// What recovery rebuilt from a snapshot and its logs.
pub type Recovery = shoal_replica::Recovery<crate::DirState>;

/// Rebuilds a replica's state from its snapshot (if any) and its logs,
/// given as (base, bytes) sorted by base.  A log whose successor starts at
/// or before the snapshot is covered by it; the newest log, if torn or
/// without a valid header, keeps what is intact.  An older log that is
/// not intact is an error: its successor's writes would follow a gap
/// ([`frame::plan`]).
pub fn recover(
    port: shoal_cap::PutPort,
    snapshot: Option<&[u8]>,
    logs: &[(u64, &[u8])],
) -> Result<Recovery, crate::DecodeError> {
    let mut state = match snapshot {
        Some(bytes) => crate::DirState::decode_snapshot(bytes)?,
        None => crate::DirState::new(port),
    };
    if state.port() != port {
        return Err(shoal_cap::codec::bad(
            "directory snapshot",
            "it belongs to another directory service",
        ));
    }
    let snap_index = state.index();
    let mut replayed = 0;
    let mut keep = Vec::with_capacity(logs.len());
    let bases: Vec<u64> = logs.iter().map(|(b, _)| *b).collect();
    for ((_, bytes), plan) in logs.iter().zip(frame::plan(&bases, snap_index)) {
        let Some(older) = plan else {
            keep.push(None);
            continue;
        };
        let Some(parsed) = parse(bytes) else {
            if older {
                return Err(shoal_cap::codec::bad(
                    "directory log",
                    frame::OLDER_LOG_CORRUPT,
                ));
            }
            keep.push(Some(0));
            continue;
        };
        if older && parsed.valid_len < bytes.len() {
            return Err(shoal_cap::codec::bad(
                "directory log",
                frame::OLDER_LOG_CORRUPT,
            ));
        }
        for rec in parsed.records {
            match rec {
                LogRecord::Entry { index, request } if index > state.index() => {
                    state.replay(index, &request);
                    replayed += 1;
                }
                LogRecord::Mark { index } => state.raise_index(index),
                LogRecord::Session { index, client, seq } => {
                    state.remember_done(client, seq, index);
                    state.raise_index(index);
                }
                LogRecord::Entry { .. } => {}
            }
        }
        keep.push(Some(parsed.valid_len));
    }
    Ok(Recovery {
        state,
        replayed,
        keep,
    })
}
