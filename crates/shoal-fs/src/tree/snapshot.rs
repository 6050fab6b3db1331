//! The tree's snapshot: the whole state at an index, as a replica writes
//! it to disk and sends it to a joiner.
//!
//! ```text
//! "SHOALFS1"  index u64  next_ino u64  inode count u32
//! per inode:  attributes (update.rs)  secret [16]
//!             xattr count u32, then (name str16, value bytes32) each
//!             body kind u8: 1 file: content count u32 and capabilities,
//!                               overlay count u32, then (version u64,
//!                               1 write: offset u64, bytes32 | 2 truncate: size u64)
//!                           2 directory: parent u64, entry count u32,
//!                               then (name str16, inode u64) each
//!                           3 symlink: target str16
//!                           4 device, FIFO or socket
//! session count u32, then (session u64, seq u64, index u64, result) each
//! ```
//!
//! Decoding checks that the tree hangs together (every entry names an
//! inode, the root is a directory), so a snapshot that passes its
//! checksum but was written by a bug is refused rather than served.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use shoal_cap::codec::{DecodeError, Reader, Writer, bad};

use super::{Body, Inode, OverlayChange, OverlayEntry, Session, Tree};
use crate::model::{Ino, Kind, ROOT};
use crate::tokens::ClientId;
use crate::update::{read_attr, read_result, write_attr, write_result};

const MAGIC: &[u8; 8] = b"SHOALFS1";
const WHAT: &str = "fs snapshot";

impl Tree {
    /// The snapshot's bytes.
    pub fn encode_snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let w = &mut Writer(&mut out);
        w.raw(MAGIC);
        w.u64(self.index);
        w.u64(self.next_ino.0);
        w.u32(self.inodes.len() as u32);
        for i in self.inodes.values() {
            write_attr(w, &i.attr);
            w.raw(&i.secret);
            w.u32(i.xattrs.len() as u32);
            for (n, v) in &i.xattrs {
                w.str16(n);
                w.bytes32(v);
            }
            match &i.body {
                Body::File { content, overlay } => {
                    w.u8(1);
                    w.u32(content.len() as u32);
                    for c in content {
                        w.cap(c);
                    }
                    w.u32(overlay.len() as u32);
                    for e in overlay {
                        w.u64(e.version);
                        match &e.change {
                            OverlayChange::Write { offset, data } => {
                                w.u8(1);
                                w.u64(*offset);
                                w.bytes32(data);
                            }
                            OverlayChange::Truncate { size } => {
                                w.u8(2);
                                w.u64(*size);
                            }
                        }
                    }
                }
                Body::Dir { entries, parent } => {
                    w.u8(2);
                    w.u64(parent.0);
                    w.u32(entries.len() as u32);
                    for (n, ino) in entries {
                        w.str16(n);
                        w.u64(ino.0);
                    }
                }
                Body::Symlink { target } => {
                    w.u8(3);
                    w.str16(target);
                }
                Body::Special => w.u8(4),
            }
        }
        let mut sessions: Vec<_> = self.sessions.iter().collect();
        sessions.sort_by_key(|(id, _)| **id);
        w.u32(sessions.len() as u32);
        for (id, s) in sessions {
            w.u64(id.0);
            w.u64(s.seq);
            w.u64(s.index);
            write_result(w, &s.result);
        }
        out
    }

    /// A tree from a snapshot's bytes.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<Tree, DecodeError> {
        let r = &mut Reader::new(bytes, WHAT);
        if r.take(8)? != MAGIC {
            return Err(bad(WHAT, "not a file system snapshot"));
        }
        let index = r.u64()?;
        let next_ino = r.u64()?;
        let n = counted(r, 64)?;
        let mut inodes = BTreeMap::new();
        for _ in 0..n {
            let attr = read_attr(r)?;
            let secret = r.array()?;
            let nx = counted(r, 6)?;
            let mut xattrs = BTreeMap::new();
            for _ in 0..nx {
                xattrs.insert(r.str16()?.to_vec(), r.bytes32()?.to_vec());
            }
            let body = match r.u8()? {
                1 => {
                    let nc = counted(r, shoal_cap::Capability::LEN)?;
                    let content = (0..nc).map(|_| r.cap()).collect::<Result<_, _>>()?;
                    let no = counted(r, 17)?;
                    let mut overlay = Vec::with_capacity(no);
                    for _ in 0..no {
                        let version = r.u64()?;
                        let change = match r.u8()? {
                            1 => OverlayChange::Write {
                                offset: r.u64()?,
                                data: r.bytes32()?.to_vec(),
                            },
                            2 => OverlayChange::Truncate { size: r.u64()? },
                            _ => return Err(bad(WHAT, "overlay change kind")),
                        };
                        overlay.push(OverlayEntry { version, change });
                    }
                    Body::File { content, overlay }
                }
                2 => {
                    let parent = Ino(r.u64()?);
                    let ne = counted(r, 10)?;
                    let mut entries = BTreeMap::new();
                    for _ in 0..ne {
                        entries.insert(r.str16()?.to_vec(), Ino(r.u64()?));
                    }
                    Body::Dir { entries, parent }
                }
                3 => Body::Symlink {
                    target: r.str16()?.to_vec(),
                },
                4 => Body::Special,
                _ => return Err(bad(WHAT, "body kind")),
            };
            let expected = match &body {
                Body::File { .. } => attr.kind == Kind::File,
                Body::Dir { .. } => attr.kind == Kind::Dir,
                Body::Symlink { .. } => attr.kind == Kind::Symlink,
                Body::Special => attr.kind.is_special(),
            };
            if !expected || attr.ino >= Ino(next_ino) {
                return Err(bad(WHAT, "an inode does not match its body or number"));
            }
            if inodes
                .insert(
                    attr.ino,
                    Box::new(Inode {
                        attr,
                        secret,
                        body,
                        xattrs,
                    }),
                )
                .is_some()
            {
                return Err(bad(WHAT, "an inode number twice"));
            }
        }
        let ns = counted(r, 25)?;
        let mut sessions = HashMap::new();
        let mut lru = BTreeSet::new();
        for _ in 0..ns {
            let id = ClientId(r.u64()?);
            let seq = r.u64()?;
            let sindex = r.u64()?;
            let result = read_result(r, false)?;
            sessions.insert(
                id,
                Session {
                    seq,
                    index: sindex,
                    result,
                },
            );
            lru.insert((sindex, id));
        }
        r.end()?;
        let tree = Tree {
            index,
            next_ino: Ino(next_ino),
            inodes,
            sessions,
            lru,
        };
        tree.check()?;
        Ok(tree)
    }

    /// Checks that the tree hangs together: the root is a directory, every
    /// entry names an inode, and every directory's parent is a directory.
    fn check(&self) -> Result<(), DecodeError> {
        let bad_tree = || bad(WHAT, "the tree does not hang together");
        match self.inodes.get(&ROOT) {
            Some(i) if i.attr.kind == Kind::Dir => {}
            _ => return Err(bad_tree()),
        }
        for i in self.inodes.values() {
            if let Body::Dir { entries, parent } = &i.body {
                if !matches!(self.inodes.get(parent), Some(p) if p.attr.kind == Kind::Dir) {
                    return Err(bad_tree());
                }
                if entries.values().any(|e| !self.inodes.contains_key(e)) {
                    return Err(bad_tree());
                }
            }
        }
        Ok(())
    }
}

/// A u32 count of items of at least `min` bytes each, checked against the
/// bytes left.
fn counted(r: &mut Reader, min: usize) -> Result<usize, DecodeError> {
    let n = r.u32()? as usize;
    r.count(n, min)
}
