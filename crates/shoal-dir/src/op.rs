//! Requests, answers and their wire format.
//!
//! A client sends one [`Request`] per RPC; a replica answers with one
//! [`Response`].  Writes travel through the replicas' group as the encoded
//! request itself, so every replica decodes and applies the same bytes.
//!
//! Layout (little-endian): request = `client u64 | seq u64 | min_index u64
//! | flags u8 | op`; op = `tag u8 | fields`; response = `index u64 | 0 |
//! answer` or `index u64 | 1 | error`.  Names and column names are `u16
//! length | bytes` (raw bytes: the replica, not the decoder, rejects
//! non-UTF-8 names with its own error), capability sets `u8 count | 48
//! bytes each`, mask lists `u8 count | one byte each`.

use shoal_cap::{Capability, Rights};

use crate::model::{DirError, MAX_BATCH, MAX_CAPS, MAX_COLUMNS};
use shoal_cap::codec::{DecodeError, Reader, Writer, bad};

/// What a row must look like for an install item to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Anything, present or not.
    Any,
    /// The name must not exist.
    Absent,
    /// The name must exist.
    Present,
    /// The name must hold exactly this capability set.
    Caps(Vec<Capability>),
}

/// One row of an atomic install: set (or, with `new: None`, delete)
/// `name` in `dir`, if the row is as `expect` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallItem {
    pub dir: Capability,
    pub name: Vec<u8>,
    pub expect: Expect,
    /// The new capability set and masks; `None` deletes the row.
    pub new: Option<(Vec<Capability>, Vec<Rights>)>,
}

/// One directory operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Create a directory with these column names; `secret` is chosen by
    /// the replica that orders it (clients send zeros).
    CreateDir {
        columns: Vec<Vec<u8>>,
        secret: [u8; 32],
    },
    DeleteDir {
        dir: Capability,
    },
    List {
        dir: Capability,
    },
    Lookup {
        dir: Capability,
        name: Vec<u8>,
    },
    /// `a/b/c/foo` in one call, rights restricted at every step.
    PathLookup {
        dir: Capability,
        path: Vec<u8>,
    },
    Append {
        dir: Capability,
        name: Vec<u8>,
        caps: Vec<Capability>,
        masks: Vec<Rights>,
    },
    Delete {
        dir: Capability,
        name: Vec<u8>,
    },
    /// Compare-and-swap on the row's capability set.
    Replace {
        dir: Capability,
        name: Vec<u8>,
        expect: Vec<Capability>,
        caps: Vec<Capability>,
    },
    Chmod {
        dir: Capability,
        name: Vec<u8>,
        masks: Vec<Rights>,
    },
    GetMasks {
        dir: Capability,
        name: Vec<u8>,
    },
    LookupMany {
        dir: Capability,
        names: Vec<Vec<u8>>,
    },
    /// Several rows of several directories, all or nothing.
    Install {
        items: Vec<InstallItem>,
    },
    /// Ordered no-op: a linearizable read waits until its replica has
    /// applied it.
    Sync,
    /// The replica's status (JSON).
    Status,
}

impl Op {
    /// Whether the operation changes the directory state (and so is
    /// ordered through the group and logged).
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Op::CreateDir { .. }
                | Op::DeleteDir { .. }
                | Op::Append { .. }
                | Op::Delete { .. }
                | Op::Replace { .. }
                | Op::Chmod { .. }
                | Op::Install { .. }
        )
    }

    /// A short name for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Op::CreateDir { .. } => "create-dir",
            Op::DeleteDir { .. } => "delete-dir",
            Op::List { .. } => "list",
            Op::Lookup { .. } => "lookup",
            Op::PathLookup { .. } => "path-lookup",
            Op::Append { .. } => "append",
            Op::Delete { .. } => "delete",
            Op::Replace { .. } => "replace",
            Op::Chmod { .. } => "chmod",
            Op::GetMasks { .. } => "get-masks",
            Op::LookupMany { .. } => "lookup-many",
            Op::Install { .. } => "install",
            Op::Sync => "sync",
            Op::Status => "status",
        }
    }
}

/// Request flag: serve the read linearizably (order a [`Op::Sync`] first).
pub const FLAG_LINEARIZABLE: u8 = 1;

/// One client request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The client's session id (random, non-zero for writes).
    pub client: u64,
    /// The client's request number: a retried write carries the same
    /// number and is applied at most once.
    pub seq: u64,
    /// The highest state index the client has seen: the replica answers
    /// only once it has applied that much (read-your-writes).
    pub min_index: u64,
    pub flags: u8,
    pub op: Op,
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Done,
    Cap(Capability),
    Caps(Vec<Capability>),
    Listing {
        columns: Vec<String>,
        rows: Vec<(String, Vec<Rights>)>,
    },
    Masks(Vec<Rights>),
    Many(Vec<Result<Vec<Capability>, DirError>>),
    Status(String),
}

/// A replica's answer: the state index it answered at, and the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub index: u64,
    pub result: Result<Answer, DirError>,
}

mod tag {
    pub const CREATE_DIR: u8 = 1;
    pub const DELETE_DIR: u8 = 2;
    pub const LIST: u8 = 3;
    pub const LOOKUP: u8 = 4;
    pub const PATH_LOOKUP: u8 = 5;
    pub const APPEND: u8 = 6;
    pub const DELETE: u8 = 7;
    pub const REPLACE: u8 = 8;
    pub const CHMOD: u8 = 9;
    pub const GET_MASKS: u8 = 10;
    pub const LOOKUP_MANY: u8 = 11;
    pub const INSTALL: u8 = 12;
    pub const SYNC: u8 = 13;
    pub const STATUS: u8 = 14;
}

fn masks_out(w: &mut Writer<'_>, masks: &[Rights]) {
    w.u8(masks.len() as u8);
    for m in masks {
        w.u8(m.bits());
    }
}

fn masks_in(r: &mut Reader<'_>) -> Result<Vec<Rights>, DecodeError> {
    let n = r.u8()? as usize;
    if n > MAX_COLUMNS {
        return Err(bad("masks", "more than 4 columns"));
    }
    Ok(r.take(n)?.iter().map(|&b| Rights::from_bits(b)).collect())
}

fn caps_in(r: &mut Reader<'_>) -> Result<Vec<Capability>, DecodeError> {
    let caps = r.caps()?;
    if caps.len() > MAX_CAPS {
        return Err(bad("capability set", "more than 16 capabilities"));
    }
    Ok(caps)
}

impl Request {
    /// A replica's status question (no session, no index awaited).
    pub fn status() -> Request {
        Request {
            client: 0,
            seq: 0,
            min_index: 0,
            flags: 0,
            op: Op::Status,
        }
    }

    /// Encodes the request.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        let mut w = Writer(&mut out);
        w.u64(self.client);
        w.u64(self.seq);
        w.u64(self.min_index);
        w.u8(self.flags);
        encode_op(&mut w, &self.op);
        out
    }

    /// Decodes a request; never panics.
    pub fn decode(buf: &[u8]) -> Result<Request, DecodeError> {
        let mut r = Reader::new(buf, "directory request");
        let client = r.u64()?;
        let seq = r.u64()?;
        let min_index = r.u64()?;
        let flags = r.u8()?;
        let op = decode_op(&mut r)?;
        r.end()?;
        Ok(Request {
            client,
            seq,
            min_index,
            flags,
            op,
        })
    }
}

fn encode_op(w: &mut Writer<'_>, op: &Op) {
    match op {
        Op::CreateDir { columns, secret } => {
            w.u8(tag::CREATE_DIR);
            w.u8(columns.len() as u8);
            for c in columns {
                w.str16(c);
            }
            w.raw(secret);
        }
        Op::DeleteDir { dir } => {
            w.u8(tag::DELETE_DIR);
            w.cap(dir);
        }
        Op::List { dir } => {
            w.u8(tag::LIST);
            w.cap(dir);
        }
        Op::Lookup { dir, name } => {
            w.u8(tag::LOOKUP);
            w.cap(dir);
            w.str16(name);
        }
        Op::PathLookup { dir, path } => {
            w.u8(tag::PATH_LOOKUP);
            w.cap(dir);
            w.str16(path);
        }
        Op::Append {
            dir,
            name,
            caps,
            masks,
        } => {
            w.u8(tag::APPEND);
            w.cap(dir);
            w.str16(name);
            w.caps(caps);
            masks_out(w, masks);
        }
        Op::Delete { dir, name } => {
            w.u8(tag::DELETE);
            w.cap(dir);
            w.str16(name);
        }
        Op::Replace {
            dir,
            name,
            expect,
            caps,
        } => {
            w.u8(tag::REPLACE);
            w.cap(dir);
            w.str16(name);
            w.caps(expect);
            w.caps(caps);
        }
        Op::Chmod { dir, name, masks } => {
            w.u8(tag::CHMOD);
            w.cap(dir);
            w.str16(name);
            masks_out(w, masks);
        }
        Op::GetMasks { dir, name } => {
            w.u8(tag::GET_MASKS);
            w.cap(dir);
            w.str16(name);
        }
        Op::LookupMany { dir, names } => {
            w.u8(tag::LOOKUP_MANY);
            w.cap(dir);
            w.u16(names.len() as u16);
            for n in names {
                w.str16(n);
            }
        }
        Op::Install { items } => {
            w.u8(tag::INSTALL);
            w.u16(items.len() as u16);
            for it in items {
                w.cap(&it.dir);
                w.str16(&it.name);
                match &it.expect {
                    Expect::Any => w.u8(0),
                    Expect::Absent => w.u8(1),
                    Expect::Present => w.u8(2),
                    Expect::Caps(c) => {
                        w.u8(3);
                        w.caps(c);
                    }
                }
                match &it.new {
                    None => w.u8(0),
                    Some((caps, masks)) => {
                        w.u8(1);
                        w.caps(caps);
                        masks_out(w, masks);
                    }
                }
            }
        }
        Op::Sync => w.u8(tag::SYNC),
        Op::Status => w.u8(tag::STATUS),
    }
}

fn decode_op(r: &mut Reader<'_>) -> Result<Op, DecodeError> {
    let t = r.u8()?;
    let name = |r: &mut Reader<'_>| r.str16().map(<[u8]>::to_vec);
    Ok(match t {
        tag::CREATE_DIR => {
            let n = r.u8()? as usize;
            if n > MAX_COLUMNS {
                return Err(bad("create-dir", "more than 4 columns"));
            }
            let columns = (0..n).map(|_| name(r)).collect::<Result<_, _>>()?;
            Op::CreateDir {
                columns,
                secret: r.array()?,
            }
        }
        tag::DELETE_DIR => Op::DeleteDir { dir: r.cap()? },
        tag::LIST => Op::List { dir: r.cap()? },
        tag::LOOKUP => Op::Lookup {
            dir: r.cap()?,
            name: name(r)?,
        },
        tag::PATH_LOOKUP => Op::PathLookup {
            dir: r.cap()?,
            path: name(r)?,
        },
        tag::APPEND => Op::Append {
            dir: r.cap()?,
            name: name(r)?,
            caps: caps_in(r)?,
            masks: masks_in(r)?,
        },
        tag::DELETE => Op::Delete {
            dir: r.cap()?,
            name: name(r)?,
        },
        tag::REPLACE => Op::Replace {
            dir: r.cap()?,
            name: name(r)?,
            expect: caps_in(r)?,
            caps: caps_in(r)?,
        },
        tag::CHMOD => Op::Chmod {
            dir: r.cap()?,
            name: name(r)?,
            masks: masks_in(r)?,
        },
        tag::GET_MASKS => Op::GetMasks {
            dir: r.cap()?,
            name: name(r)?,
        },
        tag::LOOKUP_MANY => {
            let dir = r.cap()?;
            let n = r.u16()? as usize;
            if n > MAX_BATCH {
                return Err(bad("lookup-many", "more than 1024 names"));
            }
            r.count(n, 2)?;
            let names = (0..n).map(|_| name(r)).collect::<Result<_, _>>()?;
            Op::LookupMany { dir, names }
        }
        tag::INSTALL => {
            let n = r.u16()? as usize;
            if n > MAX_BATCH {
                return Err(bad("install", "more than 1024 items"));
            }
            r.count(n, Capability::LEN + 4)?;
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                let dir = r.cap()?;
                let name = name(r)?;
                let expect = match r.u8()? {
                    0 => Expect::Any,
                    1 => Expect::Absent,
                    2 => Expect::Present,
                    3 => Expect::Caps(caps_in(r)?),
                    _ => return Err(bad("install", "unknown expectation")),
                };
                let new = match r.u8()? {
                    0 => None,
                    1 => Some((caps_in(r)?, masks_in(r)?)),
                    _ => return Err(bad("install", "unknown row change")),
                };
                items.push(InstallItem {
                    dir,
                    name,
                    expect,
                    new,
                });
            }
            Op::Install { items }
        }
        tag::SYNC => Op::Sync,
        tag::STATUS => Op::Status,
        _ => return Err(bad("directory request", "unknown operation")),
    })
}

mod answer_tag {
    pub const DONE: u8 = 0;
    pub const CAP: u8 = 1;
    pub const CAPS: u8 = 2;
    pub const LISTING: u8 = 3;
    pub const MASKS: u8 = 4;
    pub const MANY: u8 = 5;
    pub const STATUS: u8 = 6;
}

fn error_out(w: &mut Writer<'_>, e: &DirError) {
    w.u8(e.code());
    match e {
        DirError::Denied { have, need } => {
            w.u8(have.bits());
            w.u8(need.bits());
        }
        DirError::NameTooLong { len, max } => {
            w.u32(*len as u32);
            w.u32(*max as u32);
        }
        DirError::Behind { have, want } => {
            w.u64(*have);
            w.u64(*want);
        }
        DirError::NotEmpty(n) => w.u64(*n as u64),
        DirError::Superseded(n) => w.u64(*n),
        DirError::BadName(s)
        | DirError::TooLarge(s)
        | DirError::BadRequest(s)
        | DirError::Exists(s)
        | DirError::NotFound(s)
        | DirError::Conflict(s)
        | DirError::NotADirectory(s)
        | DirError::Unavailable(s) => w.text16(s, MAX_ERROR_TEXT),
        DirError::UnknownDirectory | DirError::BadCapability => {}
    }
}

/// Most bytes of an error's text on the wire.
const MAX_ERROR_TEXT: usize = 1024;

fn error_in(r: &mut Reader<'_>) -> Result<DirError, DecodeError> {
    let code = r.u8()?;
    let text = |r: &mut Reader<'_>| r.text16(MAX_ERROR_TEXT);
    Ok(match code {
        1 => DirError::UnknownDirectory,
        2 => DirError::BadCapability,
        3 => DirError::Denied {
            have: Rights::from_bits(r.u8()?),
            need: Rights::from_bits(r.u8()?),
        },
        4 => DirError::NameTooLong {
            len: r.u32()? as usize,
            max: r.u32()? as usize,
        },
        5 => DirError::BadName(text(r)?),
        6 => DirError::Exists(text(r)?),
        7 => DirError::NotFound(text(r)?),
        8 => DirError::Conflict(text(r)?),
        9 => DirError::NotEmpty(r.u64()? as usize),
        10 => DirError::NotADirectory(text(r)?),
        11 => DirError::TooLarge(text(r)?),
        12 => DirError::BadRequest(text(r)?),
        13 => DirError::Behind {
            have: r.u64()?,
            want: r.u64()?,
        },
        14 => DirError::Unavailable(text(r)?),
        15 => DirError::Superseded(r.u64()?),
        _ => return Err(bad("directory error", "unknown code")),
    })
}

fn names_out(w: &mut Writer<'_>, names: &[String]) {
    w.u32(names.len() as u32);
    for n in names {
        w.str16(n.as_bytes());
    }
}

fn string_in(r: &mut Reader<'_>) -> Result<String, DecodeError> {
    String::from_utf8(r.str16()?.to_vec()).map_err(|_| bad("directory answer", "name not UTF-8"))
}

impl Response {
    /// Encodes the response.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        let mut w = Writer(&mut out);
        w.u64(self.index);
        match &self.result {
            Err(e) => {
                w.u8(1);
                error_out(&mut w, e);
            }
            Ok(a) => {
                w.u8(0);
                match a {
                    Answer::Done => w.u8(answer_tag::DONE),
                    Answer::Cap(c) => {
                        w.u8(answer_tag::CAP);
                        w.cap(c);
                    }
                    Answer::Caps(c) => {
                        w.u8(answer_tag::CAPS);
                        w.caps(c);
                    }
                    Answer::Listing { columns, rows } => {
                        w.u8(answer_tag::LISTING);
                        names_out(&mut w, columns);
                        w.u32(rows.len() as u32);
                        for (name, masks) in rows {
                            w.str16(name.as_bytes());
                            masks_out(&mut w, masks);
                        }
                    }
                    Answer::Masks(m) => {
                        w.u8(answer_tag::MASKS);
                        masks_out(&mut w, m);
                    }
                    Answer::Many(results) => {
                        w.u8(answer_tag::MANY);
                        w.u32(results.len() as u32);
                        for r in results {
                            match r {
                                Ok(c) => {
                                    w.u8(0);
                                    w.caps(c);
                                }
                                Err(e) => {
                                    w.u8(1);
                                    error_out(&mut w, e);
                                }
                            }
                        }
                    }
                    Answer::Status(s) => {
                        w.u8(answer_tag::STATUS);
                        w.bytes32(s.as_bytes());
                    }
                }
            }
        }
        out
    }

    /// Decodes a response; never panics.
    pub fn decode(buf: &[u8]) -> Result<Response, DecodeError> {
        let mut r = Reader::new(buf, "directory response");
        let index = r.u64()?;
        let result = match r.u8()? {
            1 => Err(error_in(&mut r)?),
            0 => Ok(match r.u8()? {
                answer_tag::DONE => Answer::Done,
                answer_tag::CAP => Answer::Cap(r.cap()?),
                answer_tag::CAPS => Answer::Caps(caps_in(&mut r)?),
                answer_tag::LISTING => {
                    let n = r.u32()? as usize;
                    r.count(n, 2)?;
                    let columns = (0..n)
                        .map(|_| string_in(&mut r))
                        .collect::<Result<_, _>>()?;
                    let n = r.u32()? as usize;
                    r.count(n, 3)?;
                    let mut rows = Vec::with_capacity(n);
                    for _ in 0..n {
                        rows.push((string_in(&mut r)?, masks_in(&mut r)?));
                    }
                    Answer::Listing { columns, rows }
                }
                answer_tag::MASKS => Answer::Masks(masks_in(&mut r)?),
                answer_tag::MANY => {
                    let n = r.u32()? as usize;
                    r.count(n, 2)?;
                    let mut out = Vec::with_capacity(n);
                    for _ in 0..n {
                        out.push(match r.u8()? {
                            0 => Ok(caps_in(&mut r)?),
                            1 => Err(error_in(&mut r)?),
                            _ => return Err(bad("directory answer", "bad result tag")),
                        });
                    }
                    Answer::Many(out)
                }
                answer_tag::STATUS => {
                    Answer::Status(String::from_utf8_lossy(r.bytes32()?).into_owned())
                }
                _ => return Err(bad("directory answer", "unknown answer")),
            }),
            _ => return Err(bad("directory response", "bad result tag")),
        };
        r.end()?;
        Ok(Response { index, result })
    }
}
