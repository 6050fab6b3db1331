//! Requests, answers and their wire format.
//!
//! A client sends one [`Op`] per RPC; the server answers with one
//! response.  Layout (little-endian): request = `tag u8 | fields`;
//! response = `0 u8 | answer` or `1 u8 | code u8 | message u16-string`.
//! Capabilities are 48 bytes, data is `u32 length | bytes`, and the edit
//! flags are one byte: bit 0 commit, bit 1 safety (commit only once the
//! data is on disk).

use shoal_cap::Capability;
use shoal_cap::codec::{DecodeError, Reader, Writer, bad};

use crate::model::{FileError, MAX_CHUNK, MAX_MAP, MAX_TOUCH};

/// Edit flag: commit the result (make it immutable and readable).
pub const FLAG_COMMIT: u8 = 1;
/// Edit flag: return only once the committed data is durable (fsync).
pub const FLAG_SAFETY: u8 = 2;

/// One edit of a file's bytes.  `D` holds the data: owned (`Vec<u8>`) in
/// programs, borrowed from the request (`&[u8]`) in the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit<D = Vec<u8>> {
    /// Overwrite from `offset` (which may be the end: an append), growing
    /// the file if the data runs past its end.
    Write { offset: u64, data: D },
    /// Insert at `offset`, shifting what follows.
    Insert { offset: u64, data: D },
    /// Remove `len` bytes at `offset`.
    Delete { offset: u64, len: u64 },
    /// Make `len` bytes from `offset` (which may be the end) zeros held
    /// as a hole, no extent and no disk space, growing the file if they
    /// run past its end.
    Hole { offset: u64, len: u64 },
}

/// One file-service operation (data held as in [`Edit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op<D = Vec<u8>> {
    /// Create a file from `data` (needs CREATE on the server's
    /// capability); left uncommitted unless `flags` has [`FLAG_COMMIT`].
    Create {
        server: Capability,
        flags: u8,
        data: D,
    },
    /// Apply an edit (needs MODIFY): to an uncommitted file in place, or to
    /// a committed one, producing a new file that shares the unchanged
    /// extents.  Answers the capability of the file edited or made.
    Edit {
        file: Capability,
        flags: u8,
        edit: Edit<D>,
    },
    /// Make one file of several uncommitted ones, in order (needs CREATE on
    /// the server's capability and MODIFY on each part); the parts are
    /// consumed.  A client streams a big file as parts created in
    /// parallel, then joins them: no byte is copied.
    Concat {
        server: Capability,
        flags: u8,
        parts: Vec<Capability>,
    },
    /// Commit an uncommitted file (needs MODIFY).
    Commit { file: Capability, flags: u8 },
    /// Read `len` bytes at `offset` (needs READ); the answer may be short
    /// only at the end of the file.
    Read {
        file: Capability,
        offset: u64,
        len: u32,
    },
    /// Size and state of a file (needs READ).
    Stat { file: Capability },
    /// Where a committed file holds data (needs READ): its data ranges
    /// from `offset` on, merged, at most [`MAX_MAP`] of them; holes are
    /// what lies between (for `SEEK_DATA` and `SEEK_HOLE`).
    Map { file: Capability, offset: u64 },
    /// Destroy a file (needs DESTROY).
    Destroy { file: Capability },
    /// Read every extent of the file from the disk, bypassing the cache,
    /// and check its checksum (needs READ): answers done or corrupt.
    Verify { file: Capability },
    /// Reset the time-to-live of each object named (any valid capability
    /// does); answers which ones exist.
    Touch { files: Vec<Capability> },
    /// Admin operations on the server's capability (need ADMIN).
    Admin { server: Capability, what: AdminOp },
}

/// The admin operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminOp {
    /// Make everything committed so far durable.
    Sync,
    /// Verify every extent's checksum and the metadata's consistency.
    Fsck,
    /// Move extents into free space at the front and shrink the store.
    Compact,
    /// Run one ageing pass: decrement every time-to-live, destroy objects
    /// that reach zero.
    Age,
    /// Figures about the store.
    Stats,
}

/// What a file's stat says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub size: u64,
    pub committed: bool,
    /// Pieces (references to extent ranges) making up the file.
    pub pieces: u32,
    /// Ageing passes left before the file is garbage-collected unless
    /// touched.
    pub ttl: u8,
    /// The file's digest: BLAKE3 over its pieces' extent checksums and
    /// ranges, so it names the contents exactly (zeros while uncommitted).
    /// It is not the BLAKE3 of the bytes themselves.
    pub hash: [u8; 32],
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Done,
    Cap(Capability),
    Data(Vec<u8>),
    Stat(Stat),
    /// One flag per touched capability: whether the object exists.
    Touched(Vec<bool>),
    /// Data ranges `[start, end)`, in order (a map).
    Map(Vec<(u64, u64)>),
    /// Figures by name, then problems found (fsck, compact, age, stats).
    Report {
        figures: Vec<(String, u64)>,
        problems: Vec<String>,
    },
}

fn flags_ok(flags: u8) -> Result<u8, DecodeError> {
    if flags & !(FLAG_COMMIT | FLAG_SAFETY) != 0 {
        return Err(bad("file request", "unknown flag bits"));
    }
    Ok(flags)
}

fn data<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], DecodeError> {
    let d = r.bytes32()?;
    if d.len() > MAX_CHUNK {
        return Err(bad("file request", "data larger than 8 MiB"));
    }
    Ok(d)
}

impl<D: AsRef<[u8]>> Edit<D> {
    /// The same edit, borrowing its data.
    pub fn as_ref(&self) -> Edit<&[u8]> {
        match self {
            Edit::Write { offset, data } => Edit::Write {
                offset: *offset,
                data: data.as_ref(),
            },
            Edit::Insert { offset, data } => Edit::Insert {
                offset: *offset,
                data: data.as_ref(),
            },
            Edit::Delete { offset, len } => Edit::Delete {
                offset: *offset,
                len: *len,
            },
            Edit::Hole { offset, len } => Edit::Hole {
                offset: *offset,
                len: *len,
            },
        }
    }
}

impl Edit<&[u8]> {
    pub fn to_owned(&self) -> Edit {
        match *self {
            Edit::Write { offset, data } => Edit::Write {
                offset,
                data: data.to_vec(),
            },
            Edit::Insert { offset, data } => Edit::Insert {
                offset,
                data: data.to_vec(),
            },
            Edit::Delete { offset, len } => Edit::Delete { offset, len },
            Edit::Hole { offset, len } => Edit::Hole { offset, len },
        }
    }
}

impl Op {
    /// Decodes a request into an owned operation.
    pub fn decode(bytes: &[u8]) -> Result<Op, DecodeError> {
        Ok(Op::decode_ref(bytes)?.to_owned())
    }
}

impl Op<&[u8]> {
    /// The same operation, owning its data.
    pub fn to_owned(&self) -> Op {
        match self {
            Op::Create {
                server,
                flags,
                data,
            } => Op::Create {
                server: *server,
                flags: *flags,
                data: data.to_vec(),
            },
            Op::Edit { file, flags, edit } => Op::Edit {
                file: *file,
                flags: *flags,
                edit: edit.to_owned(),
            },
            Op::Commit { file, flags } => Op::Commit {
                file: *file,
                flags: *flags,
            },
            Op::Read { file, offset, len } => Op::Read {
                file: *file,
                offset: *offset,
                len: *len,
            },
            Op::Stat { file } => Op::Stat { file: *file },
            Op::Map { file, offset } => Op::Map {
                file: *file,
                offset: *offset,
            },
            Op::Destroy { file } => Op::Destroy { file: *file },
            Op::Verify { file } => Op::Verify { file: *file },
            Op::Concat {
                server,
                flags,
                parts,
            } => Op::Concat {
                server: *server,
                flags: *flags,
                parts: parts.clone(),
            },
            Op::Touch { files } => Op::Touch {
                files: files.clone(),
            },
            Op::Admin { server, what } => Op::Admin {
                server: *server,
                what: *what,
            },
        }
    }
}

impl<D: AsRef<[u8]>> Op<D> {
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        self.encode_into(&mut buf);
        buf
    }

    /// Appends the request's bytes to `buf` (a recycled buffer, for large
    /// data).
    pub fn encode_into(&self, buf: &mut Vec<u8>) {
        let mut w = Writer(buf);
        match self {
            Op::Create {
                server,
                flags,
                data,
            } => {
                w.u8(1);
                w.cap(server);
                w.u8(*flags);
                w.bytes32(data.as_ref());
            }
            Op::Edit { file, flags, edit } => {
                w.u8(2);
                w.cap(file);
                w.u8(*flags);
                match edit {
                    Edit::Write { offset, data } => {
                        w.u8(1);
                        w.u64(*offset);
                        w.bytes32(data.as_ref());
                    }
                    Edit::Insert { offset, data } => {
                        w.u8(2);
                        w.u64(*offset);
                        w.bytes32(data.as_ref());
                    }
                    Edit::Delete { offset, len } => {
                        w.u8(3);
                        w.u64(*offset);
                        w.u64(*len);
                    }
                    Edit::Hole { offset, len } => {
                        w.u8(4);
                        w.u64(*offset);
                        w.u64(*len);
                    }
                }
            }
            Op::Commit { file, flags } => {
                w.u8(3);
                w.cap(file);
                w.u8(*flags);
            }
            Op::Read { file, offset, len } => {
                w.u8(4);
                w.cap(file);
                w.u64(*offset);
                w.u32(*len);
            }
            Op::Stat { file } => {
                w.u8(5);
                w.cap(file);
            }
            Op::Destroy { file } => {
                w.u8(6);
                w.cap(file);
            }
            Op::Map { file, offset } => {
                w.u8(11);
                w.cap(file);
                w.u64(*offset);
            }
            Op::Touch { files } => {
                w.u8(7);
                w.u16(files.len() as u16);
                for f in files {
                    w.cap(f);
                }
            }
            Op::Verify { file } => {
                w.u8(9);
                w.cap(file);
            }
            Op::Concat {
                server,
                flags,
                parts,
            } => {
                w.u8(10);
                w.cap(server);
                w.u8(*flags);
                w.u16(parts.len() as u16);
                for p in parts {
                    w.cap(p);
                }
            }
            Op::Admin { server, what } => {
                w.u8(8);
                w.cap(server);
                w.u8(match what {
                    AdminOp::Sync => 1,
                    AdminOp::Fsck => 2,
                    AdminOp::Compact => 3,
                    AdminOp::Age => 4,
                    AdminOp::Stats => 5,
                });
            }
        }
    }
}

impl<'a> Op<&'a [u8]> {
    /// Decodes a request, borrowing its data from `bytes` (no copy).
    pub fn decode_ref(bytes: &'a [u8]) -> Result<Op<&'a [u8]>, DecodeError> {
        let mut r = Reader::new(bytes, "file request");
        let op = match r.u8()? {
            1 => Op::Create {
                server: r.cap()?,
                flags: flags_ok(r.u8()?)?,
                data: data(&mut r)?,
            },
            2 => {
                let file = r.cap()?;
                let flags = flags_ok(r.u8()?)?;
                let edit = match r.u8()? {
                    1 => Edit::Write {
                        offset: r.u64()?,
                        data: data(&mut r)?,
                    },
                    2 => Edit::Insert {
                        offset: r.u64()?,
                        data: data(&mut r)?,
                    },
                    3 => Edit::Delete {
                        offset: r.u64()?,
                        len: r.u64()?,
                    },
                    4 => Edit::Hole {
                        offset: r.u64()?,
                        len: r.u64()?,
                    },
                    _ => return Err(bad("file request", "unknown edit")),
                };
                Op::Edit { file, flags, edit }
            }
            3 => Op::Commit {
                file: r.cap()?,
                flags: flags_ok(r.u8()?)?,
            },
            4 => Op::Read {
                file: r.cap()?,
                offset: r.u64()?,
                len: r.u32()?,
            },
            5 => Op::Stat { file: r.cap()? },
            9 => Op::Verify { file: r.cap()? },
            10 => {
                let server = r.cap()?;
                let flags = flags_ok(r.u8()?)?;
                let n = r.u16()? as usize;
                if n > MAX_TOUCH {
                    return Err(bad("file request", "more than 4096 parts in a concat"));
                }
                r.count(n, Capability::LEN)?;
                Op::Concat {
                    server,
                    flags,
                    parts: (0..n).map(|_| r.cap()).collect::<Result<_, _>>()?,
                }
            }
            6 => Op::Destroy { file: r.cap()? },
            11 => Op::Map {
                file: r.cap()?,
                offset: r.u64()?,
            },
            7 => {
                let n = r.u16()? as usize;
                if n > MAX_TOUCH {
                    return Err(bad(
                        "file request",
                        "more than 4096 capabilities in a touch",
                    ));
                }
                r.count(n, Capability::LEN)?;
                Op::Touch {
                    files: (0..n).map(|_| r.cap()).collect::<Result<_, _>>()?,
                }
            }
            8 => Op::Admin {
                server: r.cap()?,
                what: match r.u8()? {
                    1 => AdminOp::Sync,
                    2 => AdminOp::Fsck,
                    3 => AdminOp::Compact,
                    4 => AdminOp::Age,
                    5 => AdminOp::Stats,
                    _ => return Err(bad("file request", "unknown admin operation")),
                },
            },
            _ => return Err(bad("file request", "unknown operation")),
        };
        r.end()?;
        Ok(op)
    }
}

/// The data an operation carries: bytes, possibly in a buffer that can be
/// shared (the store's cache then keeps a new file's extents in the
/// request's own buffer instead of copying them).
pub trait OpData: AsRef<[u8]> {
    /// The same bytes as a shared buffer, if they are in one.
    fn shared(&self) -> Option<bytes::Bytes> {
        None
    }
}

impl OpData for Vec<u8> {}
impl OpData for &[u8] {}

impl OpData for bytes::Bytes {
    fn shared(&self) -> Option<bytes::Bytes> {
        Some(self.clone())
    }
}

/// Bytes of [`create_head`]'s result, whatever its arguments.
pub const CREATE_HEAD: usize = 1 + Capability::LEN + 1 + 4;

/// The bytes that precede the data of `Op::Create { server, flags, data }`
/// with `len` bytes of data: a client builds the request by reading the
/// data in right behind them, with no extra copy.
pub fn create_head(server: &Capability, flags: u8, len: u32) -> [u8; CREATE_HEAD] {
    let mut buf = Vec::with_capacity(CREATE_HEAD);
    Op::Create {
        server: *server,
        flags,
        data: &[][..],
    }
    .encode_into(&mut buf);
    buf[CREATE_HEAD - 4..].copy_from_slice(&len.to_le_bytes());
    buf.try_into().expect("a create head has a fixed length")
}

/// The bytes that precede a read's data in its response: a server builds
/// the response by appending the data to this prefix, with no extra copy.
pub fn data_prefix(len: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(6 + len);
    buf.extend_from_slice(&data_head(len));
    buf
}

/// The 6 bytes that precede `len` bytes of data in a read's response.
pub fn data_head(len: usize) -> [u8; 6] {
    let mut head = [0, 3, 0, 0, 0, 0];
    head[2..].copy_from_slice(&(len as u32).to_le_bytes());
    head
}

/// The data of a successful read's response, if that is what `reply` is.
pub fn data_of(reply: &[u8]) -> Option<&[u8]> {
    if reply.len() < 6 || reply[0] != 0 || reply[1] != 3 {
        return None;
    }
    let n = u32::from_le_bytes(reply[2..6].try_into().unwrap()) as usize;
    (reply.len() == 6 + n).then(|| &reply[6..])
}

/// Sets the length field of a response started with [`data_prefix`] to
/// the bytes appended after it.
pub fn finish_data(buf: &mut [u8]) {
    let n = (buf.len() - 6) as u32;
    buf[2..6].copy_from_slice(&n.to_le_bytes());
}

/// Encodes a result.
pub fn encode_result(result: &Result<Answer, FileError>) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut w = Writer(&mut buf);
    match result {
        Ok(a) => {
            w.u8(0);
            match a {
                Answer::Done => w.u8(1),
                Answer::Cap(c) => {
                    w.u8(2);
                    w.cap(c);
                }
                Answer::Data(d) => {
                    w.u8(3);
                    w.bytes32(d);
                }
                Answer::Stat(s) => {
                    w.u8(4);
                    w.u64(s.size);
                    w.u8(s.committed as u8);
                    w.u32(s.pieces);
                    w.u8(s.ttl);
                    w.raw(&s.hash);
                }
                Answer::Touched(v) => {
                    w.u8(5);
                    w.u16(v.len() as u16);
                    for b in v {
                        w.u8(*b as u8);
                    }
                }
                Answer::Map(ranges) => {
                    w.u8(7);
                    w.u16(ranges.len() as u16);
                    for (start, end) in ranges {
                        w.u64(*start);
                        w.u64(*end);
                    }
                }
                Answer::Report { figures, problems } => {
                    w.u8(6);
                    w.u16(figures.len() as u16);
                    for (k, v) in figures {
                        w.text16(k, MAX_TEXT);
                        w.u64(*v);
                    }
                    w.u16(problems.len() as u16);
                    for p in problems {
                        w.text16(p, MAX_TEXT);
                    }
                }
            }
        }
        Err(e) => {
            w.u8(1);
            w.u8(e.code());
            match e {
                FileError::Denied { have, need } => {
                    w.u8(have.bits());
                    w.u8(need.bits());
                }
                FileError::Range { offset, len, size } => {
                    w.u64(*offset);
                    w.u64(*len);
                    w.u64(*size);
                }
                FileError::TooLarge(s)
                | FileError::BadRequest(s)
                | FileError::Corrupt(s)
                | FileError::NoSpace(s)
                | FileError::Io(s) => w.text16(s, MAX_TEXT),
                _ => {}
            }
        }
    }
    buf
}

/// Most bytes of a text on the wire.
const MAX_TEXT: usize = 4096;

fn text(r: &mut Reader<'_>) -> Result<String, DecodeError> {
    r.text16(MAX_TEXT)
}

/// Decodes a result.
pub fn decode_result(bytes: &[u8]) -> Result<Result<Answer, FileError>, DecodeError> {
    let mut r = Reader::new(bytes, "file response");
    let out = match r.u8()? {
        0 => Ok(match r.u8()? {
            1 => Answer::Done,
            2 => Answer::Cap(r.cap()?),
            3 => Answer::Data(r.bytes32()?.to_vec()),
            4 => Answer::Stat(Stat {
                size: r.u64()?,
                committed: r.u8()? != 0,
                pieces: r.u32()?,
                ttl: r.u8()?,
                hash: r.array()?,
            }),
            5 => {
                let n = r.u16()? as usize;
                r.count(n, 1)?;
                Answer::Touched(
                    (0..n)
                        .map(|_| r.u8().map(|b| b != 0))
                        .collect::<Result<_, _>>()?,
                )
            }
            6 => {
                let n = r.u16()? as usize;
                r.count(n, 10)?;
                let figures = (0..n)
                    .map(|_| Ok((text(&mut r)?, r.u64()?)))
                    .collect::<Result<_, DecodeError>>()?;
                let n = r.u16()? as usize;
                r.count(n, 2)?;
                let problems = (0..n).map(|_| text(&mut r)).collect::<Result<_, _>>()?;
                Answer::Report { figures, problems }
            }
            7 => {
                let n = r.u16()? as usize;
                if n > MAX_MAP {
                    return Err(bad("file response", "more than 4096 ranges in a map"));
                }
                r.count(n, 16)?;
                Answer::Map(
                    (0..n)
                        .map(|_| Ok((r.u64()?, r.u64()?)))
                        .collect::<Result<_, DecodeError>>()?,
                )
            }
            _ => return Err(bad("file response", "unknown answer")),
        }),
        1 => Err(match r.u8()? {
            1 => FileError::NotFound,
            2 => FileError::BadCapability,
            3 => FileError::Denied {
                have: shoal_cap::Rights::from_bits(r.u8()?),
                need: shoal_cap::Rights::from_bits(r.u8()?),
            },
            4 => FileError::NotCommitted,
            5 => FileError::Committed,
            6 => FileError::Range {
                offset: r.u64()?,
                len: r.u64()?,
                size: r.u64()?,
            },
            7 => FileError::TooLarge(text(&mut r)?),
            8 => FileError::BadRequest(text(&mut r)?),
            9 => FileError::Corrupt(text(&mut r)?),
            10 => FileError::NoSpace(text(&mut r)?),
            11 => FileError::Io(text(&mut r)?),
            _ => return Err(bad("file response", "unknown error code")),
        }),
        _ => return Err(bad("file response", "bad result tag")),
    };
    r.end()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use shoal_cap::{GetPort, ObjectId, ObjectSecret, Rights};

    fn cap(n: u64) -> Capability {
        Capability::mint(
            GetPort::from_bytes([n as u8; 16]).put_port(),
            ObjectId::new(n),
            Rights::ALL,
            &ObjectSecret::from_bytes([7; 32]),
        )
    }

    fn ops() -> impl Strategy<Value = Op> {
        let d = proptest::collection::vec(any::<u8>(), 0..64);
        prop_oneof![
            (any::<u64>(), 0u8..4, d.clone()).prop_map(|(n, flags, data)| Op::Create {
                server: cap(n),
                flags,
                data
            }),
            (any::<u64>(), 0u8..4, any::<u64>(), d.clone()).prop_map(|(n, flags, offset, data)| {
                Op::Edit {
                    file: cap(n),
                    flags,
                    edit: Edit::Write { offset, data },
                }
            }),
            (any::<u64>(), any::<u64>(), d).prop_map(|(n, offset, data)| Op::Edit {
                file: cap(n),
                flags: 0,
                edit: Edit::Insert { offset, data },
            }),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(n, offset, len)| Op::Edit {
                file: cap(n),
                flags: FLAG_COMMIT,
                edit: Edit::Delete { offset, len },
            }),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(n, offset, len)| Op::Edit {
                file: cap(n),
                flags: 0,
                edit: Edit::Hole { offset, len },
            }),
            (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(n, offset, len)| Op::Read {
                file: cap(n),
                offset,
                len
            }),
            any::<u64>().prop_map(|n| Op::Stat { file: cap(n) }),
            any::<u64>().prop_map(|n| Op::Destroy { file: cap(n) }),
            any::<u64>().prop_map(|n| Op::Verify { file: cap(n) }),
            (any::<u64>(), any::<u64>()).prop_map(|(n, offset)| Op::Map {
                file: cap(n),
                offset
            }),
            proptest::collection::vec(any::<u64>(), 0..5).prop_map(|v| Op::Concat {
                server: cap(0),
                flags: FLAG_COMMIT,
                parts: v.into_iter().map(cap).collect()
            }),
            proptest::collection::vec(any::<u64>(), 0..5).prop_map(|v| Op::Touch {
                files: v.into_iter().map(cap).collect()
            }),
            any::<u64>().prop_map(|n| Op::Admin {
                server: cap(n),
                what: AdminOp::Compact
            }),
        ]
    }

    proptest! {
        #[test]
        fn ops_round_trip(op in ops()) {
            prop_assert_eq!(Op::decode(&op.encode()).unwrap(), op);
        }

        #[test]
        fn a_create_head_and_its_data_make_the_create(n in any::<u64>(), flags in 0u8..4, data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut req = create_head(&cap(n), flags, data.len() as u32).to_vec();
            req.extend_from_slice(&data);
            prop_assert_eq!(req, Op::Create { server: cap(n), flags, data }.encode());
        }

        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Op::decode(&bytes);
            let _ = decode_result(&bytes);
        }

        /// A text of invalid UTF-8 decodes longer (replacement characters
        /// take three bytes), and is cut as the encoder cuts it, at a
        /// character boundary: what was decoded encodes back to itself.
        #[test]
        fn a_decoded_text_encodes_back_to_itself(bad in proptest::collection::vec(0x80u8..=0xff, 1..4096)) {
            let mut wire = encode_result(&Err(FileError::Io(String::new())));
            wire.truncate(wire.len() - 2);
            wire.extend_from_slice(&(bad.len() as u16).to_le_bytes());
            wire.extend_from_slice(&bad);
            let r = decode_result(&wire).unwrap();
            prop_assert_eq!(decode_result(&encode_result(&r)).unwrap(), r);
        }
    }

    #[test]
    fn results_round_trip() {
        let all = vec![
            Ok(Answer::Done),
            Ok(Answer::Cap(cap(3))),
            Ok(Answer::Data(vec![1, 2, 3])),
            Ok(Answer::Map(vec![])),
            Ok(Answer::Map(vec![(0, 4096), (1 << 40, (1 << 40) + 3)])),
            Ok(Answer::Stat(Stat {
                size: 9,
                committed: true,
                pieces: 2,
                ttl: 5,
                hash: [4; 32],
            })),
            Ok(Answer::Touched(vec![true, false])),
            Ok(Answer::Report {
                figures: vec![("files".into(), 3)],
                problems: vec!["extent 4 corrupt".into()],
            }),
            Err(FileError::NotFound),
            Err(FileError::Denied {
                have: Rights::READ,
                need: Rights::ALL,
            }),
            Err(FileError::Range {
                offset: 1,
                len: 2,
                size: 3,
            }),
            Err(FileError::Corrupt("x".into())),
        ];
        for r in all {
            assert_eq!(decode_result(&encode_result(&r)).unwrap(), r);
        }
        let mut pre = data_prefix(3);
        pre.extend_from_slice(b"abc");
        assert_eq!(
            decode_result(&pre).unwrap(),
            Ok(Answer::Data(b"abc".to_vec()))
        );
    }
}
