//! Requests from a file system client (the mount) to the metadata
//! service's primary, and the primary's replies, with their byte layout
//! (little-endian, `shoal_cap::codec`; `docs/fs.md`, "Formats").  The
//! decoders never panic and reserve nothing a hostile count asks for.
//!
//! A request names the client's session (its `ClientId`: chosen at random
//! by the client, the same number its updates carry for exactly-once) and
//! a request number, and the identity the kernel gave the client for the
//! operation.  Name changes travel as the update the client asks for
//! (`Change`): the primary checks who may make it, fills in the time and
//! orders it.

use shoal_cap::Capability;
use shoal_cap::codec::{DecodeError, Reader, Writer, bad};

use crate::locks::{Mode, Style};
use crate::model::{Attr, FsError, Identity, Ino, Kind};
use crate::tokens::{Callback, ClientId, Level, OpenId, Want};
use crate::update::{
    Answer, UpdateOp, flag, opt, read_attr, read_identity, read_opt, read_result, write_attr,
    write_identity, write_result,
};

/// Most bytes one `Read` or `Write` moves (FUSE's largest).
pub const IO_MAX: usize = 1 << 20;
/// Most items in one list (opens, confirmations, callbacks).
pub const LIST_MAX: usize = 65_536;
/// Most entries in one directory listing.
pub const ENTRIES_MAX: usize = 1 << 20;

/// A request to the primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The client's session (`ClientId`), 0 for a caller that is not a
    /// mount (`Status`).
    pub session: ClientId,
    pub seq: u64,
    pub who: Identity,
    pub op: Op,
}

/// What a request asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A client starts its session (or starts it again after its lease
    /// ended or the primary changed).
    Hello {
        instance: [u8; 16],
        node: Vec<u8>,
    },
    /// The parked request that carries callbacks to the client and renews
    /// its lease; `confirm` names the notices it has acted on.
    Events {
        confirm: Vec<u64>,
    },
    Lookup {
        parent: Ino,
        name: Vec<u8>,
    },
    GetAttr {
        ino: Ino,
    },
    ReadDir {
        ino: Ino,
    },
    ReadLink {
        ino: Ino,
    },
    /// Open `ino` (new open `id`), with the opens the client has of it
    /// already, and the version it caches (if any).
    Open {
        ino: Ino,
        want: Want,
        have: Vec<(OpenId, bool)>,
        id: OpenId,
        cached: Option<u64>,
    },
    Close {
        ino: Ino,
        id: OpenId,
    },
    /// Reads through the primary (uncached).
    Read {
        ino: Ino,
        offset: u64,
        len: u32,
    },
    /// Writes through the primary (uncached), at `offset` or at the end.
    Write {
        ino: Ino,
        offset: Option<u64>,
        data: Vec<u8>,
    },
    /// A change to the tree (not `Forget`, which is the primary's);
    /// `durable`, the end of an `fsync`: answered once the primary's log
    /// holds on its disk every update it applied (as [`Op::Sync`], one
    /// request fewer).
    Change {
        op: UpdateOp,
        durable: bool,
    },
    /// A `Create` of a regular file (`excl`) and its first open, `id`, by
    /// the creator (`Changed`, with the open's grant): one message where
    /// a create and an open would take two, and no other client can come
    /// between them.
    CreateOpen {
        op: UpdateOp,
        id: OpenId,
        want: Want,
    },
    /// The answer to a recall: the token kept, and the opens the client
    /// has of the inode.
    Return {
        ino: Ino,
        grant: u64,
        kept: Level,
        opens: Vec<(OpenId, bool)>,
    },
    StatFs,
    /// The service's status (JSON), for `shoal fs status`.
    Status,
    /// After a primary change (its session was unknown, it said hello
    /// again): the token the client held on `ino` and the version it
    /// caches, and its opens of it (Sprite's reopen, NFSv4's reclaim).
    Reclaim {
        ino: Ino,
        level: Level,
        version: Option<u64>,
        opens: Vec<(OpenId, bool)>,
    },
    /// Notices the client has carried out (its caches no longer say what
    /// the names were), confirmed at once rather than with its next
    /// `Events` request.
    Confirm {
        ids: Vec<u64>,
    },
    /// One extended attribute's value (`Data`).  `user.shoal.cap` is the
    /// primary's: a capability for the inode with the rights the caller's
    /// permissions give.
    GetXattr {
        ino: Ino,
        name: Vec<u8>,
    },
    /// The names of an inode's extended attributes, each followed by a
    /// NUL (`Data`, as `listxattr(2)` gives them).
    ListXattr {
        ino: Ino,
    },
    /// The attributes of the inode a capability names (`Entry`, with no
    /// grant): any caller, no session, no identity.
    CapStat {
        cap: Capability,
    },
    /// Bytes of the file a capability with `READ` names (`Data`): any
    /// caller; the primary recalls every cache that holds unwritten
    /// changes first, so the bytes are the file's latest.
    CapRead {
        cap: Capability,
        offset: u64,
        len: u32,
    },
    /// An advisory lock (`Locked`): taken, or released (`mode` `None`),
    /// for lock owner `owner` of the client, on bytes `start..=end`
    /// (`locks::EOF`: to the end, however the file grows).
    Lock {
        ino: Ino,
        owner: u64,
        style: Style,
        mode: Option<Mode>,
        start: u64,
        end: u64,
        pid: u32,
        how: LockHow,
    },
    /// For the object manager, before it ages the file servers: touch the
    /// contents of the files from inode `after` on (`Touched`), in one
    /// batch of at most [`TOUCH_BATCH`] files; a node's root only.
    TouchContents {
        after: Ino,
    },
    /// Every change answered so far on the primary's disk (`Done`): the
    /// end of an `fsync`, whose changes were answered once r + 1 replicas
    /// held them in memory.  A node's root only.
    Sync,
}

/// Most files a `TouchContents` touches.
pub const TOUCH_BATCH: usize = 4096;

/// What a `Lock` request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockHow {
    /// Which lock would keep it from being taken (`F_GETLK`); nothing
    /// changes.
    Test,
    /// Take it if nothing conflicts (`F_SETLK`).
    Try,
    /// The same, and if something conflicts, tell the client when locks
    /// on the inode are released (`Unlocked`), to try again (`F_SETLKW`).
    Wait,
    /// A lock held before the primary changed, taken again in the new
    /// primary's grace period.
    Reclaim,
}

/// A lock that stands in the way: its mode, range and process (of the
/// node that holds it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conflict {
    pub mode: Mode,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

impl Op {
    /// Whether the request acts by a capability (any caller, no session)
    /// rather than for a mount's session.
    pub fn by_capability(&self) -> bool {
        matches!(self, Op::CapStat { .. } | Op::CapRead { .. })
    }

    /// The request's name, for counts (a change by its kind).
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Hello { .. } => "hello",
            Op::Events { .. } => "events",
            Op::Lookup { .. } => "lookup",
            Op::GetAttr { .. } => "getattr",
            Op::ReadDir { .. } => "readdir",
            Op::ReadLink { .. } => "readlink",
            Op::Open { .. } => "open",
            Op::Close { .. } => "close",
            Op::Read { .. } => "read",
            Op::Write { .. } => "write",
            Op::Change { op, .. } => op.kind(),
            Op::CreateOpen { .. } => "create_open",
            Op::Return { .. } => "return",
            Op::StatFs => "statfs",
            Op::Status => "status",
            Op::Reclaim { .. } => "reclaim",
            Op::Confirm { .. } => "confirm",
            Op::GetXattr { .. } => "getxattr",
            Op::ListXattr { .. } => "listxattr",
            Op::CapStat { .. } => "capstat",
            Op::CapRead { .. } => "capread",
            Op::Lock { .. } => "lock",
            Op::TouchContents { .. } => "touch_contents",
            Op::Sync => "sync",
        }
    }
}

/// What a client may cache, as granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub level: Level,
    /// The grant's number (recalls name it).
    pub grant: u64,
    /// The file is write-shared: reads and writes go to the primary.
    pub uncached: bool,
}

/// One name of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: Kind,
}

/// `statfs`'s figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub files: u64,
    pub files_free: u64,
}

/// A reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The session is known; its lease lasts `lease_ms` from each
    /// renewal.  A client writes file contents to `copies` of the file
    /// servers `servers`.
    Hello {
        lease_ms: u32,
        root: Attr,
        servers: Vec<Capability>,
        copies: u8,
    },
    Events(Vec<Callback>),
    Entry {
        attr: Attr,
        grant: Grant,
    },
    Entries {
        entries: Vec<DirEntry>,
        grant: Grant,
    },
    Target(Vec<u8>),
    /// An open answered: with a cached grant, `content` names the
    /// version's bytes on the file servers (the client reads them there).
    Opened {
        attr: Attr,
        grant: Grant,
        content: Vec<Capability>,
    },
    Data(Vec<u8>),
    /// What the tree answered a `Write` or a `Change`.
    Updated(Result<Answer, FsError>),
    /// What the tree answered a `Change` of names (or a `CreateOpen`),
    /// with the attributes of the directories whose names it changed, as
    /// the change left them, and the grant of a `CreateOpen`'s open (if it
    /// was made).  A directory made for a mount comes with `Write` on it
    /// (`opened`) and the capability secret the primary drew for it
    /// (`secret`), so the mount's private copy holds what the replicas do.
    Changed {
        result: Result<Answer, FsError>,
        dirs: Vec<Attr>,
        opened: Option<Grant>,
        secret: Option<[u8; 16]>,
    },
    /// What the tree answered each change of a `Push`, and the inodes it
    /// made (as the push left them), each granted to the pusher.
    Pushed {
        results: Vec<Result<Answer, FsError>>,
        made: Vec<(Attr, Grant)>,
    },
    StatFs(StatFs),
    Status(String),
    Done,
    /// A `Lock` answered: `None`, taken or released (for a test: nothing
    /// in the way); else the lock in the way.
    Locked(Option<Conflict>),
    /// A `TouchContents` batch: the inode the next batch starts after
    /// (`None`: the tree is done), and the contents the file servers had
    /// and did not have.
    Touched {
        next: Option<Ino>,
        touched: u64,
        missing: u64,
    },
}

/// Why a request was not answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    #[error("{0}")]
    Fs(FsError),
    /// The client's session is unknown (its lease ended, or the primary
    /// changed): say hello again, reclaiming what it holds.
    #[error("the client's session is unknown: it must say hello again")]
    NoSession,
    /// This replica is not the primary: try the others.
    #[error("this replica is not the primary")]
    NotPrimary,
    #[error("unavailable: {0}")]
    Unavailable(String),
}

fn level(w: &mut Writer, l: Level) {
    w.u8(match l {
        Level::None => 0,
        Level::Read => 1,
        Level::Write => 2,
    })
}

fn read_level(r: &mut Reader) -> Result<Level, DecodeError> {
    Ok(match r.u8()? {
        0 => Level::None,
        1 => Level::Read,
        2 => Level::Write,
        _ => return Err(bad("fs request", "token level")),
    })
}

fn want(w: &mut Writer, x: Want) {
    w.u8(match x {
        Want::Look => 0,
        Want::OpenRead => 1,
        Want::OpenWrite => 2,
        Want::Change => 3,
    })
}

fn read_want(r: &mut Reader) -> Result<Want, DecodeError> {
    Ok(match r.u8()? {
        0 => Want::Look,
        1 => Want::OpenRead,
        2 => Want::OpenWrite,
        3 => Want::Change,
        _ => return Err(bad("fs request", "want")),
    })
}

/// A count of at most `max` items of at least `min` bytes each.
fn count(r: &mut Reader, max: usize, min: usize) -> Result<usize, DecodeError> {
    let n = r.u32()? as usize;
    if n > max {
        return Err(bad("fs message", "too many items"));
    }
    r.count(n, min)
}

fn opens(w: &mut Writer, list: &[(OpenId, bool)]) {
    w.u32(list.len() as u32);
    for (id, write) in list {
        w.u64(id.0);
        w.u8(u8::from(*write));
    }
}

fn read_opens(r: &mut Reader) -> Result<Vec<(OpenId, bool)>, DecodeError> {
    let n = count(r, LIST_MAX, 9)?;
    (0..n).map(|_| Ok((OpenId(r.u64()?), flag(r)?))).collect()
}

fn data(r: &mut Reader) -> Result<Vec<u8>, DecodeError> {
    let d = r.bytes32()?;
    if d.len() > IO_MAX {
        return Err(bad("fs message", "more than 1 MiB of data"));
    }
    Ok(d.to_vec())
}

/// A lock's mode: 0 none (an unlock), 1 read, 2 write.
fn lock_mode(w: &mut Writer, m: Option<Mode>) {
    w.u8(match m {
        None => 0,
        Some(Mode::Read) => 1,
        Some(Mode::Write) => 2,
    })
}

fn read_lock_mode(r: &mut Reader) -> Result<Option<Mode>, DecodeError> {
    Ok(match r.u8()? {
        0 => None,
        1 => Some(Mode::Read),
        2 => Some(Mode::Write),
        _ => return Err(bad("fs message", "lock mode")),
    })
}

fn grant(w: &mut Writer, g: &Grant) {
    level(w, g.level);
    w.u64(g.grant);
    w.u8(u8::from(g.uncached));
}

fn read_grant(r: &mut Reader) -> Result<Grant, DecodeError> {
    Ok(Grant {
        level: read_level(r)?,
        grant: r.u64()?,
        uncached: flag(r)?,
    })
}

impl Request {
    /// The request's bytes: session 8, request number 8, identity, kind
    /// 1, then the kind's fields.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let w = &mut Writer(&mut out);
        w.u64(self.session.0);
        w.u64(self.seq);
        write_identity(w, &self.who);
        match &self.op {
            Op::Hello { instance, node } => {
                w.u8(1);
                w.raw(instance);
                w.str16(node);
            }
            Op::Events { confirm } => {
                w.u8(2);
                w.u32(confirm.len() as u32);
                for id in confirm {
                    w.u64(*id);
                }
            }
            Op::Lookup { parent, name } => {
                w.u8(3);
                w.u64(parent.0);
                w.str16(name);
            }
            Op::GetAttr { ino } => {
                w.u8(4);
                w.u64(ino.0);
            }
            Op::ReadDir { ino } => {
                w.u8(5);
                w.u64(ino.0);
            }
            Op::ReadLink { ino } => {
                w.u8(6);
                w.u64(ino.0);
            }
            Op::Open {
                ino,
                want: x,
                have,
                id,
                cached,
            } => {
                w.u8(7);
                w.u64(ino.0);
                want(w, *x);
                opens(w, have);
                w.u64(id.0);
                opt(w, *cached, |w, v| w.u64(v));
            }
            Op::Close { ino, id } => {
                w.u8(8);
                w.u64(ino.0);
                w.u64(id.0);
            }
            Op::Read { ino, offset, len } => {
                w.u8(9);
                w.u64(ino.0);
                w.u64(*offset);
                w.u32(*len);
            }
            Op::Write { ino, offset, data } => {
                w.u8(10);
                w.u64(ino.0);
                opt(w, *offset, |w, v| w.u64(v));
                w.bytes32(data);
            }
            Op::Change { op, durable } => {
                w.u8(if *durable { 25 } else { 11 });
                op.encode(w);
            }
            Op::CreateOpen { op, id, want: x } => {
                w.u8(22);
                op.encode(w);
                w.u64(id.0);
                want(w, *x);
            }
            Op::Return {
                ino,
                grant,
                kept,
                opens: list,
            } => {
                w.u8(12);
                w.u64(ino.0);
                w.u64(*grant);
                level(w, *kept);
                opens(w, list);
            }
            Op::Confirm { ids } => {
                w.u8(16);
                w.u32(ids.len() as u32);
                for id in ids {
                    w.u64(*id);
                }
            }
            Op::StatFs => w.u8(13),
            Op::Status => w.u8(14),
            Op::Sync => w.u8(24),
            Op::Reclaim {
                ino,
                level: l,
                version,
                opens: list,
            } => {
                w.u8(15);
                w.u64(ino.0);
                level(w, *l);
                opt(w, *version, |w, v| w.u64(v));
                opens(w, list);
            }
            Op::GetXattr { ino, name } => {
                w.u8(17);
                w.u64(ino.0);
                w.str16(name);
            }
            Op::ListXattr { ino } => {
                w.u8(18);
                w.u64(ino.0);
            }
            Op::CapStat { cap } => {
                w.u8(19);
                w.cap(cap);
            }
            Op::CapRead { cap, offset, len } => {
                w.u8(20);
                w.cap(cap);
                w.u64(*offset);
                w.u32(*len);
            }
            Op::Lock {
                ino,
                owner,
                style,
                mode,
                start,
                end,
                pid,
                how,
            } => {
                w.u8(21);
                w.u64(ino.0);
                w.u64(*owner);
                w.u8(match style {
                    Style::Posix => 0,
                    Style::Flock => 1,
                });
                lock_mode(w, *mode);
                w.u64(*start);
                w.u64(*end);
                w.u32(*pid);
                w.u8(match how {
                    LockHow::Test => 0,
                    LockHow::Try => 1,
                    LockHow::Wait => 2,
                    LockHow::Reclaim => 3,
                });
            }
            Op::TouchContents { after } => {
                w.u8(23);
                w.u64(after.0);
            }
        }
        out
    }

    /// A request from its bytes.
    pub fn decode(bytes: &[u8]) -> Result<Request, DecodeError> {
        let r = &mut Reader::new(bytes, "fs request");
        let session = r.u64()?;
        let seq = r.u64()?;
        let who = read_identity(r)?;
        let op = match r.u8()? {
            1 => Op::Hello {
                instance: r.array()?,
                node: r.str16()?.to_vec(),
            },
            2 => {
                let n = count(r, LIST_MAX, 8)?;
                Op::Events {
                    confirm: (0..n).map(|_| r.u64()).collect::<Result<_, _>>()?,
                }
            }
            3 => Op::Lookup {
                parent: Ino(r.u64()?),
                name: r.str16()?.to_vec(),
            },
            4 => Op::GetAttr { ino: Ino(r.u64()?) },
            5 => Op::ReadDir { ino: Ino(r.u64()?) },
            6 => Op::ReadLink { ino: Ino(r.u64()?) },
            7 => Op::Open {
                ino: Ino(r.u64()?),
                want: read_want(r)?,
                have: read_opens(r)?,
                id: OpenId(r.u64()?),
                cached: read_opt(r, |r| r.u64())?,
            },
            8 => Op::Close {
                ino: Ino(r.u64()?),
                id: OpenId(r.u64()?),
            },
            9 => {
                let (ino, offset, len) = (r.u64()?, r.u64()?, r.u32()?);
                if len as usize > IO_MAX {
                    return Err(bad("fs request", "a read of more than 1 MiB"));
                }
                Op::Read {
                    ino: Ino(ino),
                    offset,
                    len,
                }
            }
            10 => Op::Write {
                ino: Ino(r.u64()?),
                offset: read_opt(r, |r| r.u64())?,
                data: data(r)?,
            },
            tag @ (11 | 25) => Op::Change {
                op: UpdateOp::decode(r, false)?,
                durable: tag == 25,
            },
            22 => Op::CreateOpen {
                op: UpdateOp::decode(r, false)?,
                id: OpenId(r.u64()?),
                want: read_want(r)?,
            },
            12 => Op::Return {
                ino: Ino(r.u64()?),
                grant: r.u64()?,
                kept: read_level(r)?,
                opens: read_opens(r)?,
            },
            16 => {
                let n = count(r, LIST_MAX, 8)?;
                Op::Confirm {
                    ids: (0..n).map(|_| r.u64()).collect::<Result<_, _>>()?,
                }
            }
            13 => Op::StatFs,
            14 => Op::Status,
            24 => Op::Sync,
            17 => Op::GetXattr {
                ino: Ino(r.u64()?),
                name: r.str16()?.to_vec(),
            },
            18 => Op::ListXattr { ino: Ino(r.u64()?) },
            19 => Op::CapStat { cap: r.cap()? },
            20 => {
                let (cap, offset, len) = (r.cap()?, r.u64()?, r.u32()?);
                if len as usize > IO_MAX {
                    return Err(bad("fs request", "a read of more than 1 MiB"));
                }
                Op::CapRead { cap, offset, len }
            }
            23 => Op::TouchContents {
                after: Ino(r.u64()?),
            },
            21 => Op::Lock {
                ino: Ino(r.u64()?),
                owner: r.u64()?,
                style: match r.u8()? {
                    0 => Style::Posix,
                    1 => Style::Flock,
                    _ => return Err(bad("fs request", "lock style")),
                },
                mode: read_lock_mode(r)?,
                start: r.u64()?,
                end: r.u64()?,
                pid: r.u32()?,
                how: match r.u8()? {
                    0 => LockHow::Test,
                    1 => LockHow::Try,
                    2 => LockHow::Wait,
                    3 => LockHow::Reclaim,
                    _ => return Err(bad("fs request", "lock request kind")),
                },
            },
            15 => Op::Reclaim {
                ino: Ino(r.u64()?),
                level: read_level(r)?,
                version: read_opt(r, |r| r.u64())?,
                opens: read_opens(r)?,
            },
            _ => return Err(bad("fs request", "unknown kind")),
        };
        r.end()?;
        Ok(Request {
            session: ClientId(session),
            seq,
            who,
            op,
        })
    }
}

mod reply;
pub use reply::{decode_reply, encode_reply};

#[cfg(test)]
mod tests;
