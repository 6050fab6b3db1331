//! The metadata formats: a snapshot of every committed file and extent,
//! followed by a log of records (commit, destroy, move, bytes), in one of two
//! metadata files.  `docs/files.md` draws them byte by byte.
//!
//! File = `header | snapshot body | records...`.
//! Header = `"SHOALBM1" | generation u64 | body length u64 | check 16`,
//! where check is the first 16 bytes of BLAKE3 over magic, generation,
//! length and body (the body follows the header).
//! Record = `length u32 | check 16 | kind u8 | body`, where length counts
//! kind and body and check is BLAKE3 over (generation, the record's offset
//! in the file, kind and body): a record left over from an earlier
//! generation or a torn one never verifies, and replay stops at the first
//! record that does not.

use shoal_cap::codec::{DecodeError, Reader, Writer, bad};

/// First bytes of a metadata file.
pub const MAGIC: &[u8; 8] = b"SHOALBM1";
/// Header bytes before the snapshot body.
pub const HEADER: usize = 8 + 8 + 8 + 16;
/// Bytes before a record's kind.
pub const RECORD_HEAD: usize = 4 + 16;
/// Largest record accepted when replaying.
pub const MAX_RECORD: usize = 64 << 20;

/// A stored extent: `len` contiguous bytes at `off` in the data file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentRec {
    pub id: u64,
    pub off: u64,
    pub len: u32,
    /// BLAKE3 of the extent's bytes.
    pub hash: [u8; 32],
}

/// A range of an extent, in file order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub extent: u64,
    pub off: u32,
    pub len: u32,
}

/// A committed file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRec {
    pub object: u64,
    pub secret: [u8; 32],
    pub size: u64,
    pub digest: [u8; 32],
    pub pieces: Vec<Piece>,
}

/// Everything committed, as of one generation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// The server's get-port (its identity across restarts).
    pub port: [u8; 16],
    /// The secret of the server's own capability (object 0).
    pub server_secret: [u8; 32],
    pub next_object: u64,
    pub next_extent: u64,
    pub extents: Vec<ExtentRec>,
    pub files: Vec<FileRec>,
}

/// One change after the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A file was committed; `extents` are the extents it introduced.
    Commit {
        file: FileRec,
        extents: Vec<ExtentRec>,
    },
    /// A file was destroyed.
    Destroy { object: u64 },
    /// Compaction moved an extent.
    Move { extent: u64, off: u64 },
    /// The bytes of an extent that the next commit record introduces,
    /// written with it so that a flush of small commits needs no sync of
    /// the data disk: recovery writes them where the extent lies if they
    /// are not there (`crate::store`, crash rule 1).
    Bytes { extent: u64, data: Vec<u8> },
}

fn w_extent(w: &mut Writer<'_>, e: &ExtentRec) {
    w.u64(e.id);
    w.u64(e.off);
    w.u32(e.len);
    w.raw(&e.hash);
}

fn r_extent(r: &mut Reader<'_>) -> Result<ExtentRec, DecodeError> {
    Ok(ExtentRec {
        id: r.u64()?,
        off: r.u64()?,
        len: r.u32()?,
        hash: r.array()?,
    })
}

const EXTENT_BYTES: usize = 8 + 8 + 4 + 32;
const PIECE_BYTES: usize = 16;
const FILE_MIN: usize = 8 + 32 + 8 + 32 + 4;

fn w_file(w: &mut Writer<'_>, f: &FileRec) {
    w.u64(f.object);
    w.raw(&f.secret);
    w.u64(f.size);
    w.raw(&f.digest);
    w.u32(f.pieces.len() as u32);
    for p in &f.pieces {
        w.u64(p.extent);
        w.u32(p.off);
        w.u32(p.len);
    }
}

fn r_file(r: &mut Reader<'_>) -> Result<FileRec, DecodeError> {
    let object = r.u64()?;
    let secret = r.array()?;
    let size = r.u64()?;
    let digest = r.array()?;
    let n = r.u32()? as usize;
    let n = r.count(n, PIECE_BYTES)?;
    let pieces = (0..n)
        .map(|_| {
            Ok(Piece {
                extent: r.u64()?,
                off: r.u32()?,
                len: r.u32()?,
            })
        })
        .collect::<Result<Vec<_>, DecodeError>>()?;
    let sum: u64 = pieces.iter().map(|p| p.len as u64).sum();
    if sum != size {
        return Err(bad("file record", "pieces do not add up to the size"));
    }
    Ok(FileRec {
        object,
        secret,
        size,
        digest,
        pieces,
    })
}

fn check(parts: &[&[u8]]) -> [u8; 16] {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().as_bytes()[..16].try_into().unwrap()
}

impl Snapshot {
    fn encode_body(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut w = Writer(&mut buf);
        w.raw(&self.port);
        w.raw(&self.server_secret);
        w.u64(self.next_object);
        w.u64(self.next_extent);
        w.u64(self.extents.len() as u64);
        for e in &self.extents {
            w_extent(&mut w, e);
        }
        w.u64(self.files.len() as u64);
        for f in &self.files {
            w_file(&mut w, f);
        }
        buf
    }

    fn decode_body(body: &[u8]) -> Result<Snapshot, DecodeError> {
        let mut r = Reader::new(body, "snapshot");
        let port = r.array()?;
        let server_secret = r.array()?;
        let next_object = r.u64()?;
        let next_extent = r.u64()?;
        let n = r.u64()? as usize;
        let n = r.count(n, EXTENT_BYTES)?;
        let extents = (0..n).map(|_| r_extent(&mut r)).collect::<Result<_, _>>()?;
        let n = r.u64()? as usize;
        let n = r.count(n, FILE_MIN)?;
        let files = (0..n).map(|_| r_file(&mut r)).collect::<Result<_, _>>()?;
        r.end()?;
        Ok(Snapshot {
            port,
            server_secret,
            next_object,
            next_extent,
            extents,
            files,
        })
    }

    /// The start of a metadata file of `generation`: header and body.
    pub fn encode(&self, generation: u64) -> Vec<u8> {
        let body = self.encode_body();
        let mut buf = Vec::with_capacity(HEADER + body.len());
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&generation.to_le_bytes());
        buf.extend_from_slice(&(body.len() as u64).to_le_bytes());
        let c = check(&[&buf, &body]);
        buf.extend_from_slice(&c);
        buf.extend_from_slice(&body);
        buf
    }

    /// Decodes the start of a metadata file: (generation, snapshot, where
    /// the records begin).
    pub fn decode(file: &[u8]) -> Result<(u64, Snapshot, usize), DecodeError> {
        if file.len() < HEADER || &file[..8] != MAGIC {
            return Err(bad("metadata file", "no header"));
        }
        let generation = u64::from_le_bytes(file[8..16].try_into().unwrap());
        let len = u64::from_le_bytes(file[16..24].try_into().unwrap());
        let end = (HEADER as u64).saturating_add(len);
        if end > file.len() as u64 {
            return Err(bad("metadata file", "snapshot truncated"));
        }
        let body = &file[HEADER..end as usize];
        if check(&[&file[..24], body]) != file[24..40] {
            return Err(bad("metadata file", "snapshot checksum mismatch"));
        }
        Ok((generation, Snapshot::decode_body(body)?, end as usize))
    }
}

impl Record {
    /// The record as it is written at `offset` of a file of `generation`.
    pub fn encode(&self, generation: u64, offset: u64) -> Vec<u8> {
        let mut body = Vec::new();
        let mut w = Writer(&mut body);
        match self {
            Record::Commit { file, extents } => {
                w.u8(1);
                w.u32(extents.len() as u32);
                for e in extents {
                    w_extent(&mut w, e);
                }
                w_file(&mut w, file);
            }
            Record::Destroy { object } => {
                w.u8(2);
                w.u64(*object);
            }
            Record::Move { extent, off } => {
                w.u8(3);
                w.u64(*extent);
                w.u64(*off);
            }
            Record::Bytes { extent, data } => {
                w.u8(4);
                w.u64(*extent);
                w.bytes32(data);
            }
        }
        let mut buf = Vec::with_capacity(RECORD_HEAD + body.len());
        buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
        buf.extend_from_slice(&check(&[
            &generation.to_le_bytes(),
            &offset.to_le_bytes(),
            &body,
        ]));
        buf.extend_from_slice(&body);
        buf
    }

    fn decode_body(body: &[u8]) -> Result<Record, DecodeError> {
        let mut r = Reader::new(body, "metadata record");
        let rec = match r.u8()? {
            1 => {
                let n = r.u32()? as usize;
                let n = r.count(n, EXTENT_BYTES)?;
                let extents = (0..n).map(|_| r_extent(&mut r)).collect::<Result<_, _>>()?;
                Record::Commit {
                    extents,
                    file: r_file(&mut r)?,
                }
            }
            2 => Record::Destroy { object: r.u64()? },
            3 => Record::Move {
                extent: r.u64()?,
                off: r.u64()?,
            },
            4 => Record::Bytes {
                extent: r.u64()?,
                data: r.bytes32()?.to_vec(),
            },
            _ => return Err(bad("metadata record", "unknown kind")),
        };
        r.end()?;
        Ok(rec)
    }

    /// Replays the records of a file of `generation` from `start`: every
    /// record up to the first that does not verify, and where that is
    /// (the end of the valid log).
    pub fn replay(file: &[u8], generation: u64, start: usize) -> (Vec<Record>, usize) {
        let mut out = Vec::new();
        let mut at = start;
        while let Some(head) = file.get(at..at + RECORD_HEAD) {
            let len = u32::from_le_bytes(head[..4].try_into().unwrap()) as usize;
            if len == 0 || len > MAX_RECORD {
                break;
            }
            let Some(body) = file.get(at + RECORD_HEAD..at + RECORD_HEAD + len) else {
                break;
            };
            let c = check(&[&generation.to_le_bytes(), &(at as u64).to_le_bytes(), body]);
            if c != head[4..20] {
                break;
            }
            match Record::decode_body(body) {
                Ok(r) => out.push(r),
                Err(_) => break,
            }
            at += RECORD_HEAD + len;
        }
        (out, at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Snapshot, Vec<Record>) {
        let e = ExtentRec {
            id: 1,
            off: 0,
            len: 10,
            hash: [3; 32],
        };
        let f = FileRec {
            object: 5,
            secret: [1; 32],
            size: 4,
            digest: [2; 32],
            pieces: vec![Piece {
                extent: 1,
                off: 2,
                len: 4,
            }],
        };
        let snap = Snapshot {
            port: [9; 16],
            server_secret: [8; 32],
            next_object: 6,
            next_extent: 2,
            extents: vec![e],
            files: vec![f.clone()],
        };
        let recs = vec![
            Record::Commit {
                file: FileRec { object: 6, ..f },
                extents: vec![],
            },
            Record::Move { extent: 1, off: 40 },
            Record::Bytes {
                extent: 2,
                data: b"late".to_vec(),
            },
            Record::Destroy { object: 5 },
        ];
        (snap, recs)
    }

    #[test]
    fn round_trip_and_torn_tail() {
        let (snap, recs) = sample();
        let mut file = snap.encode(7);
        for r in &recs {
            let at = file.len() as u64;
            file.extend(r.encode(7, at));
        }
        let (g, s, start) = Snapshot::decode(&file).unwrap();
        assert_eq!((g, &s), (7, &snap));
        let (got, end) = Record::replay(&file, 7, start);
        assert_eq!(got, recs);
        assert_eq!(end, file.len());
        // The wrong generation verifies nothing; a torn last record ends
        // the replay before it; any flipped bit of the snapshot is caught.
        assert!(Record::replay(&file, 8, start).0.is_empty());
        let cut = file.len() - 3;
        assert_eq!(Record::replay(&file[..cut], 7, start).0.len(), 3);
        for i in 0..start {
            let mut bad = file.clone();
            bad[i] ^= 1;
            assert!(Snapshot::decode(&bad).is_err() || i >= start, "bit {i}");
        }
    }
}
