//! The replicated updates: what the primary sends through the group and
//! every replica applies to its [`Tree`](crate::Tree), and what applying
//! answers.  Both are logged, so both have a byte layout here
//! (little-endian, `shoal_cap::codec`); the decoders never panic and
//! reserve nothing a hostile count asks for.

use shoal_cap::Capability;
use shoal_cap::codec::{DecodeError, Reader, Writer, bad};

use crate::model::{Attr, FsError, GROUPS_MAX, Identity, Ino, Kind, Timestamp};
use crate::tokens::ClientId;

/// A time to set: the applying update's time, or a given one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(Timestamp),
}

/// How `setxattr` treats an existing attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XattrMode {
    /// Create or replace.
    Any = 0,
    /// Only create (`XATTR_CREATE`: `EEXIST` if it exists).
    Create = 1,
    /// Only replace (`XATTR_REPLACE`: `ENODATA` if it does not).
    Replace = 2,
}

/// A change of attributes (`setattr`); `None` leaves a field alone.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SetAttr {
    pub perm: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    /// Made through an open file (`ftruncate`): a size change then needs no
    /// write permission now (it was checked at the open).
    pub by_handle: bool,
    /// The size only grows (`fallocate`): a file that long already keeps
    /// its size, so no write made meanwhile is cut.
    pub grow: bool,
}

impl SetAttr {
    /// Whether this change takes rights away from anyone on an inode of
    /// attributes `attr`: it clears a permission bit, or gives the inode
    /// another owner or group.
    pub fn takes_rights(&self, attr: &Attr) -> bool {
        self.perm.is_some_and(|p| attr.perm & !p & 0o777 != 0)
            || self.uid.is_some_and(|u| u != attr.uid)
            || self.gid.is_some_and(|g| g != attr.gid)
    }
}

/// One change to the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateOp {
    /// A new inode named `name` in `parent`: a file, directory, symbolic
    /// link (`target`), device, FIFO or socket.  `ino` comes from a range
    /// handed out earlier and `secret` is the new inode's capability
    /// secret, chosen by whoever made the update.  Without `excl`, a
    /// regular file that exists already is answered as it is (an open of
    /// it), with [`Answer::Entry`]'s `existed` set.
    Create {
        parent: Ino,
        name: Vec<u8>,
        kind: Kind,
        perm: u16,
        rdev: u32,
        ino: Ino,
        secret: [u8; 16],
        target: Vec<u8>,
        excl: bool,
    },
    /// A new name for an existing inode (not a directory).
    Link {
        ino: Ino,
        parent: Ino,
        name: Vec<u8>,
    },
    /// Removes a name (`rmdir` with `dir`).  With `open`, an inode losing
    /// its last link stays, with no name, until a [`UpdateOp::Forget`]:
    /// some client has it open.
    Unlink {
        parent: Ino,
        name: Vec<u8>,
        dir: bool,
        open: bool,
    },
    /// Moves a name, over an existing target unless `noreplace`; the
    /// target's inode is kept while `open_victim`, as for `Unlink`.
    Rename {
        from: Ino,
        from_name: Vec<u8>,
        to: Ino,
        to_name: Vec<u8>,
        noreplace: bool,
        open_victim: bool,
    },
    SetAttr {
        ino: Ino,
        set: SetAttr,
    },
    /// New contents for a regular file: the capabilities of its new
    /// version on the file servers, its size and mtime.  A client's
    /// write-back needs `base` to be the file's version (it held the
    /// file's `Write` token); the version grows by one.  With `flush`, the
    /// primary moves the overlay up to version `base` into the contents:
    /// the bytes do not change, nor does the version.
    Commit {
        ino: Ino,
        base: u64,
        content: Vec<Capability>,
        size: u64,
        /// The bytes of data the version holds (`Attr::held`).
        held: u64,
        mtime: Timestamp,
        flush: bool,
    },
    /// Bytes written while the file is write-shared, at `offset`, or at
    /// the end (`None`: `O_APPEND`).
    Overlay {
        ino: Ino,
        offset: Option<u64>,
        data: Vec<u8>,
    },
    SetXattr {
        ino: Ino,
        name: Vec<u8>,
        value: Vec<u8>,
        mode: XattrMode,
    },
    RemoveXattr {
        ino: Ino,
        name: Vec<u8>,
    },
    /// The last open of an inode without names closed (or its client's
    /// lease ended): the inode goes.
    Forget {
        ino: Ino,
    },
    /// Hands out `count` fresh inode numbers.
    Range {
        count: u32,
    },
    /// A client's pending changes in its private directories, applied
    /// in order, each as its maker and at its time, each answered on its
    /// own (no `Push` inside).
    Push {
        ops: Vec<Pushed>,
    },
    /// Revokes every capability of an inode (`docs/fs.md`, "Authority"):
    /// gives it the new capability secret `secret`, drawn by the primary,
    /// which no capability minted before verifies against.  Alone
    /// (`set: None`, `shoal fs revoke`), only its owner or root may; with
    /// `set`, a change of attributes that takes rights away (a chmod
    /// clearing a permission bit, a chown or chgrp), made as `SetAttr`
    /// makes it, and the secret replaced only if it succeeds.
    Revoke {
        ino: Ino,
        secret: [u8; 16],
        set: Option<SetAttr>,
    },
}

/// One change of a [`UpdateOp::Push`]: made by `who` at `now` in the
/// client's own copy of its private directories, and so made again here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    pub who: Identity,
    pub now: Timestamp,
    pub op: UpdateOp,
}

/// An ordered update: who made it, when, and in which client session (for
/// exactly-once: a retried request number is answered, not applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub session: ClientId,
    pub seq: u64,
    pub who: Identity,
    pub now: Timestamp,
    pub op: UpdateOp,
}

/// What applying an update answers (or an [`FsError`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The inode created or linked, or found (`existed`).
    Entry {
        attr: Attr,
        existed: bool,
    },
    /// The inode's attributes after the change.
    Attr(Attr),
    /// A name went.  `gone` is the inode that went with it, if it did,
    /// and `content` its file contents' capabilities, to destroy.
    Removed {
        gone: Option<Ino>,
        content: Vec<Capability>,
    },
    /// Overlay bytes placed at `offset`; the file's attributes after.
    Written {
        offset: u64,
        attr: Attr,
    },
    /// Fresh inode numbers `first..first + count`.
    Range {
        first: Ino,
        count: u32,
    },
    /// New contents committed: the file's attributes after, and the
    /// capabilities of the contents they replaced (to destroy once no
    /// client has that version open).
    Committed {
        attr: Attr,
        old: Vec<Capability>,
    },
    Done,
    /// Each change of a [`UpdateOp::Push`], answered in order.
    Pushed(Vec<Result<Answer, FsError>>),
}

/// Most changes in one push.
pub const PUSH_MAX: usize = 65_536;

pub(crate) fn time(w: &mut Writer, t: Timestamp) {
    w.u64(t.secs as u64);
    w.u32(t.nanos);
}

pub(crate) fn read_time(r: &mut Reader) -> Result<Timestamp, DecodeError> {
    let secs = r.u64()? as i64;
    let nanos = r.u32()?;
    if nanos > 999_999_999 {
        return Err(bad("fs update", "nanoseconds beyond a second"));
    }
    Ok(Timestamp { secs, nanos })
}

fn time_set(w: &mut Writer, t: Option<TimeSet>) {
    match t {
        None => w.u8(0),
        Some(TimeSet::Now) => w.u8(1),
        Some(TimeSet::At(t)) => {
            w.u8(2);
            time(w, t);
        }
    }
}

fn read_time_set(r: &mut Reader) -> Result<Option<TimeSet>, DecodeError> {
    Ok(match r.u8()? {
        0 => None,
        1 => Some(TimeSet::Now),
        2 => Some(TimeSet::At(read_time(r)?)),
        _ => return Err(bad("fs update", "time flag")),
    })
}

pub(crate) fn opt<T: Copy>(w: &mut Writer, v: Option<T>, put: impl Fn(&mut Writer, T)) {
    match v {
        None => w.u8(0),
        Some(v) => {
            w.u8(1);
            put(w, v);
        }
    }
}

pub(crate) fn read_opt<T>(
    r: &mut Reader,
    get: impl Fn(&mut Reader) -> Result<T, DecodeError>,
) -> Result<Option<T>, DecodeError> {
    match r.u8()? {
        0 => Ok(None),
        1 => Ok(Some(get(r)?)),
        _ => Err(bad("fs update", "option flag")),
    }
}

pub(crate) fn flag(r: &mut Reader) -> Result<bool, DecodeError> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(bad("fs update", "flag")),
    }
}

fn caps32(w: &mut Writer, caps: &[Capability]) {
    w.u32(caps.len() as u32);
    for c in caps {
        w.cap(c);
    }
}

fn read_caps32(r: &mut Reader) -> Result<Vec<Capability>, DecodeError> {
    let n = r.u32()? as usize;
    r.count(n, Capability::LEN)?;
    (0..n).map(|_| r.cap()).collect()
}

impl UpdateOp {
    /// The change's name, for counts.
    pub fn kind(&self) -> &'static str {
        match self {
            UpdateOp::Create { .. } => "create",
            UpdateOp::Link { .. } => "link",
            UpdateOp::Unlink { .. } => "unlink",
            UpdateOp::Rename { .. } => "rename",
            UpdateOp::SetAttr { .. } => "setattr",
            UpdateOp::Commit { .. } => "commit",
            UpdateOp::Overlay { .. } => "overlay",
            UpdateOp::SetXattr { .. } => "setxattr",
            UpdateOp::RemoveXattr { .. } => "removexattr",
            UpdateOp::Forget { .. } => "forget",
            UpdateOp::Range { .. } => "range",
            UpdateOp::Push { .. } => "push",
            UpdateOp::Revoke { set: None, .. } => "revoke",
            UpdateOp::Revoke { set: Some(_), .. } => "setattr",
        }
    }

    pub(crate) fn encode(&self, w: &mut Writer) {
        match self {
            UpdateOp::Create {
                parent,
                name,
                kind,
                perm,
                rdev,
                ino,
                secret,
                target,
                excl,
            } => {
                w.u8(1);
                w.u64(parent.0);
                w.str16(name);
                w.u8(*kind as u8);
                w.u16(*perm);
                w.u32(*rdev);
                w.u64(ino.0);
                w.raw(secret);
                w.str16(target);
                w.u8(u8::from(*excl));
            }
            UpdateOp::Link { ino, parent, name } => {
                w.u8(2);
                w.u64(ino.0);
                w.u64(parent.0);
                w.str16(name);
            }
            UpdateOp::Unlink {
                parent,
                name,
                dir,
                open,
            } => {
                w.u8(3);
                w.u64(parent.0);
                w.str16(name);
                w.u8(u8::from(*dir));
                w.u8(u8::from(*open));
            }
            UpdateOp::Rename {
                from,
                from_name,
                to,
                to_name,
                noreplace,
                open_victim,
            } => {
                w.u8(4);
                w.u64(from.0);
                w.str16(from_name);
                w.u64(to.0);
                w.str16(to_name);
                w.u8(u8::from(*noreplace));
                w.u8(u8::from(*open_victim));
            }
            UpdateOp::SetAttr { ino, set } => {
                w.u8(5);
                w.u64(ino.0);
                write_set_attr(w, set);
            }
            UpdateOp::Commit {
                ino,
                base,
                content,
                size,
                held,
                mtime,
                flush,
            } => {
                w.u8(6);
                w.u64(ino.0);
                w.u64(*base);
                caps32(w, content);
                w.u64(*size);
                w.u64(*held);
                time(w, *mtime);
                w.u8(u8::from(*flush));
            }
            UpdateOp::Overlay { ino, offset, data } => {
                w.u8(7);
                w.u64(ino.0);
                opt(w, *offset, |w, v| w.u64(v));
                w.bytes32(data);
            }
            UpdateOp::SetXattr {
                ino,
                name,
                value,
                mode,
            } => {
                w.u8(8);
                w.u64(ino.0);
                w.str16(name);
                w.bytes32(value);
                w.u8(*mode as u8);
            }
            UpdateOp::RemoveXattr { ino, name } => {
                w.u8(9);
                w.u64(ino.0);
                w.str16(name);
            }
            UpdateOp::Forget { ino } => {
                w.u8(10);
                w.u64(ino.0);
            }
            UpdateOp::Range { count } => {
                w.u8(11);
                w.u32(*count);
            }
            UpdateOp::Revoke { ino, secret, set } => {
                w.u8(13);
                w.u64(ino.0);
                w.raw(secret);
                match set {
                    None => w.u8(0),
                    Some(set) => {
                        w.u8(1);
                        write_set_attr(w, set);
                    }
                }
            }
            UpdateOp::Push { ops } => {
                w.u8(12);
                w.u32(ops.len() as u32);
                for p in ops {
                    write_identity(w, &p.who);
                    time(w, p.now);
                    p.op.encode(w);
                }
            }
        }
    }

    pub(crate) fn decode(r: &mut Reader, nested: bool) -> Result<UpdateOp, DecodeError> {
        Ok(match r.u8()? {
            1 => UpdateOp::Create {
                parent: Ino(r.u64()?),
                name: r.str16()?.to_vec(),
                kind: Kind::from_u8(r.u8()?).ok_or_else(|| bad("fs update", "kind"))?,
                perm: r.u16()?,
                rdev: r.u32()?,
                ino: Ino(r.u64()?),
                secret: r.array()?,
                target: r.str16()?.to_vec(),
                excl: flag(r)?,
            },
            2 => UpdateOp::Link {
                ino: Ino(r.u64()?),
                parent: Ino(r.u64()?),
                name: r.str16()?.to_vec(),
            },
            3 => UpdateOp::Unlink {
                parent: Ino(r.u64()?),
                name: r.str16()?.to_vec(),
                dir: flag(r)?,
                open: flag(r)?,
            },
            4 => UpdateOp::Rename {
                from: Ino(r.u64()?),
                from_name: r.str16()?.to_vec(),
                to: Ino(r.u64()?),
                to_name: r.str16()?.to_vec(),
                noreplace: flag(r)?,
                open_victim: flag(r)?,
            },
            5 => UpdateOp::SetAttr {
                ino: Ino(r.u64()?),
                set: read_set_attr(r)?,
            },
            6 => UpdateOp::Commit {
                ino: Ino(r.u64()?),
                base: r.u64()?,
                content: read_caps32(r)?,
                size: r.u64()?,
                held: r.u64()?,
                mtime: read_time(r)?,
                flush: flag(r)?,
            },
            7 => UpdateOp::Overlay {
                ino: Ino(r.u64()?),
                offset: read_opt(r, |r| r.u64())?,
                data: r.bytes32()?.to_vec(),
            },
            8 => UpdateOp::SetXattr {
                ino: Ino(r.u64()?),
                name: r.str16()?.to_vec(),
                value: r.bytes32()?.to_vec(),
                mode: match r.u8()? {
                    0 => XattrMode::Any,
                    1 => XattrMode::Create,
                    2 => XattrMode::Replace,
                    _ => return Err(bad("fs update", "xattr mode")),
                },
            },
            9 => UpdateOp::RemoveXattr {
                ino: Ino(r.u64()?),
                name: r.str16()?.to_vec(),
            },
            10 => UpdateOp::Forget { ino: Ino(r.u64()?) },
            11 => UpdateOp::Range { count: r.u32()? },
            12 if !nested => {
                let n = r.u32()? as usize;
                if n > PUSH_MAX {
                    return Err(bad("fs update", "too many changes in a push"));
                }
                r.count(n, 22)?;
                UpdateOp::Push {
                    ops: (0..n)
                        .map(|_| {
                            Ok(Pushed {
                                who: read_identity(r)?,
                                now: read_time(r)?,
                                op: UpdateOp::decode(r, true)?,
                            })
                        })
                        .collect::<Result<_, _>>()?,
                }
            }
            13 => UpdateOp::Revoke {
                ino: Ino(r.u64()?),
                secret: r.array()?,
                set: match r.u8()? {
                    0 => None,
                    1 => Some(read_set_attr(r)?),
                    _ => return Err(bad("fs update", "revoke flag")),
                },
            },
            _ => return Err(bad("fs update", "unknown kind")),
        })
    }
}

/// A [`SetAttr`]: each field's presence and value, then a byte of flags
/// (bit 0 `by_handle`, bit 1 `grow`).
fn write_set_attr(w: &mut Writer, set: &SetAttr) {
    opt(w, set.perm, |w, v| w.u16(v));
    opt(w, set.uid, |w, v| w.u32(v));
    opt(w, set.gid, |w, v| w.u32(v));
    opt(w, set.size, |w, v| w.u64(v));
    time_set(w, set.atime);
    time_set(w, set.mtime);
    w.u8(u8::from(set.by_handle) | u8::from(set.grow) << 1);
}

fn read_set_attr(r: &mut Reader) -> Result<SetAttr, DecodeError> {
    Ok(SetAttr {
        perm: read_opt(r, |r| r.u16())?,
        uid: read_opt(r, |r| r.u32())?,
        gid: read_opt(r, |r| r.u32())?,
        size: read_opt(r, |r| r.u64())?,
        atime: read_time_set(r)?,
        mtime: read_time_set(r)?,
        ..set_attr_flags(r)?
    })
}

fn set_attr_flags(r: &mut Reader) -> Result<SetAttr, DecodeError> {
    match r.u8()? {
        f @ 0..=3 => Ok(SetAttr {
            by_handle: f & 1 != 0,
            grow: f & 2 != 0,
            ..SetAttr::default()
        }),
        _ => Err(bad("fs update", "attribute flags")),
    }
}

pub(crate) fn write_identity(w: &mut Writer, who: &Identity) {
    w.u32(who.uid);
    w.u32(who.gid);
    w.u32(who.groups.len() as u32);
    for g in &who.groups {
        w.u32(*g);
    }
}

pub(crate) fn read_identity(r: &mut Reader) -> Result<Identity, DecodeError> {
    let uid = r.u32()?;
    let gid = r.u32()?;
    let n = r.u32()? as usize;
    if n > GROUPS_MAX {
        return Err(bad("fs identity", "too many groups"));
    }
    r.count(n, 4)?;
    let groups = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
    Ok(Identity { uid, gid, groups })
}

impl Update {
    /// The update's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let w = &mut Writer(&mut out);
        w.u64(self.session.0);
        w.u64(self.seq);
        write_identity(w, &self.who);
        time(w, self.now);
        self.op.encode(w);
        out
    }

    /// An update from its bytes.
    pub fn decode(bytes: &[u8]) -> Result<Update, DecodeError> {
        let r = &mut Reader::new(bytes, "fs update");
        let u = Update {
            session: ClientId(r.u64()?),
            seq: r.u64()?,
            who: read_identity(r)?,
            now: read_time(r)?,
            op: UpdateOp::decode(r, false)?,
        };
        r.end()?;
        Ok(u)
    }
}

pub(crate) fn write_attr(w: &mut Writer, a: &Attr) {
    w.u64(a.ino.0);
    w.u8(a.kind as u8);
    w.u16(a.perm);
    w.u32(a.nlink);
    w.u32(a.uid);
    w.u32(a.gid);
    w.u32(a.rdev);
    w.u64(a.size);
    w.u64(a.held);
    time(w, a.atime);
    time(w, a.mtime);
    time(w, a.ctime);
    w.u64(a.version);
}

pub(crate) fn read_attr(r: &mut Reader) -> Result<Attr, DecodeError> {
    Ok(Attr {
        ino: Ino(r.u64()?),
        kind: Kind::from_u8(r.u8()?).ok_or_else(|| bad("fs attributes", "kind"))?,
        perm: r.u16()?,
        nlink: r.u32()?,
        uid: r.u32()?,
        gid: r.u32()?,
        rdev: r.u32()?,
        size: r.u64()?,
        held: r.u64()?,
        atime: read_time(r)?,
        mtime: read_time(r)?,
        ctime: read_time(r)?,
        version: r.u64()?,
    })
}

/// Writes an answer or error (a status byte: 0 for an answer, else the
/// error's errno, which fits a byte for every [`FsError`]).
pub fn write_result(w: &mut Writer, res: &Result<Answer, FsError>) {
    let a = match res {
        Err(e) => {
            w.u8(e.errno() as u8);
            return;
        }
        Ok(a) => {
            w.u8(0);
            a
        }
    };
    match a {
        Answer::Entry { attr, existed } => {
            w.u8(1);
            write_attr(w, attr);
            w.u8(u8::from(*existed));
        }
        Answer::Attr(attr) => {
            w.u8(2);
            write_attr(w, attr);
        }
        Answer::Removed { gone, content } => {
            w.u8(3);
            opt(w, *gone, |w, v| w.u64(v.0));
            caps32(w, content);
        }
        Answer::Written { offset, attr } => {
            w.u8(4);
            w.u64(*offset);
            write_attr(w, attr);
        }
        Answer::Range { first, count } => {
            w.u8(5);
            w.u64(first.0);
            w.u32(*count);
        }
        Answer::Done => w.u8(6),
        Answer::Committed { attr, old } => {
            w.u8(8);
            write_attr(w, attr);
            caps32(w, old);
        }
        Answer::Pushed(each) => {
            w.u8(7);
            w.u32(each.len() as u32);
            for r in each {
                write_result(w, r);
            }
        }
    }
}

/// Reads what [`write_result`] wrote.
pub fn read_result(r: &mut Reader, nested: bool) -> Result<Result<Answer, FsError>, DecodeError> {
    let status = r.u8()?;
    if status != 0 {
        return Ok(Err(FsError::from_errno(i32::from(status))));
    }
    Ok(Ok(match r.u8()? {
        1 => Answer::Entry {
            attr: read_attr(r)?,
            existed: flag(r)?,
        },
        2 => Answer::Attr(read_attr(r)?),
        3 => Answer::Removed {
            gone: read_opt(r, |r| r.u64().map(Ino))?,
            content: read_caps32(r)?,
        },
        4 => Answer::Written {
            offset: r.u64()?,
            attr: read_attr(r)?,
        },
        5 => Answer::Range {
            first: Ino(r.u64()?),
            count: r.u32()?,
        },
        6 => Answer::Done,
        8 => Answer::Committed {
            attr: read_attr(r)?,
            old: read_caps32(r)?,
        },
        7 if !nested => {
            let n = r.u32()? as usize;
            if n > PUSH_MAX {
                return Err(bad("fs answer", "too many answers"));
            }
            r.count(n, 1)?;
            Answer::Pushed(
                (0..n)
                    .map(|_| read_result(r, true))
                    .collect::<Result<_, _>>()?,
            )
        }
        _ => return Err(bad("fs answer", "unknown kind")),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_ops() -> Vec<UpdateOp> {
        vec![
            UpdateOp::Create {
                parent: Ino(1),
                name: vec![0xff, b'a'],
                kind: Kind::Symlink,
                perm: 0o777,
                rdev: 0,
                ino: Ino(9),
                secret: [7; 16],
                target: b"/x".to_vec(),
                excl: true,
            },
            UpdateOp::Link {
                ino: Ino(9),
                parent: Ino(1),
                name: b"b".to_vec(),
            },
            UpdateOp::Unlink {
                parent: Ino(1),
                name: b"b".to_vec(),
                dir: false,
                open: true,
            },
            UpdateOp::Rename {
                from: Ino(1),
                from_name: b"a".to_vec(),
                to: Ino(2),
                to_name: b"c".to_vec(),
                noreplace: true,
                open_victim: false,
            },
            UpdateOp::SetAttr {
                ino: Ino(3),
                set: SetAttr {
                    perm: Some(0o4755),
                    uid: None,
                    gid: Some(5),
                    size: Some(1 << 40),
                    atime: Some(TimeSet::Now),
                    mtime: Some(TimeSet::At(Timestamp::new(-5, 3))),
                    by_handle: true,
                    grow: true,
                },
            },
            UpdateOp::Commit {
                ino: Ino(3),
                base: 4,
                content: vec![],
                size: 10,
                held: 7,
                mtime: Timestamp::new(1, 2),
                flush: false,
            },
            UpdateOp::Overlay {
                ino: Ino(3),
                offset: None,
                data: b"log line\n".to_vec(),
            },
            UpdateOp::SetXattr {
                ino: Ino(3),
                name: b"user.x".to_vec(),
                value: vec![0; 3],
                mode: XattrMode::Replace,
            },
            UpdateOp::RemoveXattr {
                ino: Ino(3),
                name: b"user.x".to_vec(),
            },
            UpdateOp::Forget { ino: Ino(3) },
            UpdateOp::Range { count: 1000 },
            UpdateOp::Revoke {
                ino: Ino(3),
                secret: [5; 16],
                set: None,
            },
            UpdateOp::Revoke {
                ino: Ino(4),
                secret: [6; 16],
                set: Some(SetAttr {
                    perm: Some(0o600),
                    uid: Some(7),
                    ..SetAttr::default()
                }),
            },
        ]
    }

    #[test]
    fn updates_round_trip() {
        let mut ops = sample_ops();
        ops.push(UpdateOp::Push {
            ops: sample_ops()
                .into_iter()
                .enumerate()
                .map(|(i, op)| Pushed {
                    who: Identity {
                        uid: i as u32,
                        gid: 9,
                        groups: vec![i as u32],
                    },
                    now: Timestamp::new(i as i64, 1),
                    op,
                })
                .collect(),
        });
        for op in ops {
            let u = Update {
                session: ClientId(1),
                seq: 2,
                who: Identity {
                    uid: 3,
                    gid: 4,
                    groups: vec![5, 6],
                },
                now: Timestamp::new(7, 8),
                op,
            };
            let bytes = u.encode();
            assert_eq!(Update::decode(&bytes), Ok(u));
            // Every cut is refused, never a panic.
            for cut in 0..bytes.len() {
                assert!(Update::decode(&bytes[..cut]).is_err());
            }
        }
    }

    #[test]
    fn pushes_do_not_nest() {
        let inner = UpdateOp::Push { ops: vec![] };
        let u = Update {
            session: ClientId(1),
            seq: 1,
            who: Identity::root(),
            now: Timestamp::default(),
            op: UpdateOp::Push {
                ops: vec![Pushed {
                    who: Identity::root(),
                    now: Timestamp::default(),
                    op: inner,
                }],
            },
        };
        assert!(Update::decode(&u.encode()).is_err());
    }

    #[test]
    fn results_round_trip() {
        let attr = crate::testing::sample_attr();
        let results = vec![
            Ok(Answer::Entry {
                attr,
                existed: true,
            }),
            Ok(Answer::Attr(attr)),
            Ok(Answer::Removed {
                gone: Some(Ino(5)),
                content: vec![],
            }),
            Ok(Answer::Written { offset: 7, attr }),
            Ok(Answer::Range {
                first: Ino(100),
                count: 10,
            }),
            Ok(Answer::Done),
            Ok(Answer::Committed { attr, old: vec![] }),
            Err(FsError::NotEmpty),
        ];
        let mut all = results.clone();
        all.push(Ok(Answer::Pushed(results)));
        for res in all {
            let mut out = Vec::new();
            write_result(&mut Writer(&mut out), &res);
            let r = &mut Reader::new(&out, "test");
            assert_eq!(read_result(r, false), Ok(res));
            assert!(r.end().is_ok());
        }
    }
}
