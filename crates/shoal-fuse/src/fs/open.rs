//! Opens and closes: the handles the kernel gets, and which opens the
//! primary hears of (an open for reading under a token, or of a private
//! file, costs no message; its close neither); what an open for writing
//! only asks of the kernel, and the attribute changes a write makes.

use std::sync::atomic::Ordering;
use std::time::Duration;

use fuser::{FopenFlags, Request};
use shoal_fs::model::{Attr, FsError, Identity, Ino, Kind};
use shoal_fs::op::{Failure, Op, Reply};
use shoal_fs::tokens::{OpenId, Want};
use shoal_fs::update::{Answer, SetAttr, UpdateOp};

use super::{Handle, NONE, ShoalFs, open_flags};
use crate::private::Routed;
use shoal_fs::cache::FOREVER;

impl ShoalFs {
    /// Opens `ino` for the kernel: a handle, recorded with the mount's
    /// opens, and the flags the kernel gets.  An open for reading that
    /// the mount's token allows costs no message.
    pub(super) fn open_file(
        &self,
        who: &Identity,
        ino: Ino,
        flags: i32,
    ) -> Result<(u64, FopenFlags), Failure> {
        let write = (flags & libc::O_ACCMODE) != libc::O_RDONLY;
        let append = flags & libc::O_APPEND != 0;
        // A private file, or a file read under a token: no message.
        let cached = (!write || self.conn.is_private(ino))
            .then(|| self.conn.cache.lock().open_cached(ino))
            .flatten();
        if let Some(open) = cached {
            let id = self.conn.next_open();
            self.conn.record_open(ino, id, false);
            return Ok((self.handle(ino, id, append), open_flags(open)));
        }
        let id = self.conn.next_open();
        let have = self.conn.opens_of(ino);
        let op = Op::Open {
            ino,
            want: if write {
                Want::OpenWrite
            } else {
                Want::OpenRead
            },
            have: have.clone(),
            id,
            cached: None,
        };
        let (attr, grant, content) = match self.conn.call(who, op)? {
            Reply::Opened {
                attr,
                grant,
                content,
            } => {
                if grant.uncached {
                    // The primary learned every open listed; one closed
                    // meanwhile (its close not sent: it was not known
                    // then) is closed now.
                    let closed = self.conn.learned(ino, &have);
                    for old in closed {
                        let _ = self
                            .conn
                            .call(&Identity::root(), Op::Close { ino, id: old });
                    }
                    // The file is write-shared: whatever the kernel kept
                    // of it under this mount's token (attributes with a
                    // long timeout, pages of earlier opens) goes now, for
                    // no recall will come to this mount while it holds
                    // none.
                    self.conn.kernel.inval(vec![(ino, 0, 0)], Vec::new());
                }
                (attr, grant, content)
            }
            other => return Err(shoal_fssvc::client::unexpected(&other)),
        };
        Ok(self.opened(&attr, &grant, content, id, write, append))
    }

    /// `open(O_CREAT)` without `O_EXCL` of a name that another node made
    /// between the kernel's lookup and this mount's create: the file
    /// there, opened as `who` as an open of it would be, and truncated
    /// with `O_TRUNC`, as a local file system answers (anything but a
    /// regular file stays `EEXIST`).  Its handle, flags and attributes.
    pub(super) fn open_existing(
        &self,
        who: &Identity,
        parent: Ino,
        name: &[u8],
        flags: i32,
    ) -> Result<(u64, FopenFlags, Attr), Failure> {
        let lookup = Op::Lookup {
            parent,
            name: name.to_vec(),
        };
        let attr = match self.conn.call(who, lookup)? {
            Reply::Entry { mut attr, grant } => {
                self.conn.granted(&attr, &grant);
                self.conn.cache.lock().patch(&mut attr);
                attr
            }
            other => return Err(shoal_fssvc::client::unexpected(&other)),
        };
        if attr.kind != Kind::File {
            return Err(Failure::Fs(FsError::Exists));
        }
        let (fh, how) = self.open_file(who, attr.ino, flags)?;
        if flags & libc::O_TRUNC != 0 && (flags & libc::O_ACCMODE) != libc::O_RDONLY {
            let set = SetAttr {
                size: Some(0),
                by_handle: true,
                ..SetAttr::default()
            };
            if let Err(e) = self.change_attrs(who, attr.ino, set, false) {
                let _ = self.close(fh);
                return Err(e);
            }
        }
        Ok((fh, how, attr))
    }

    /// An open `id` of the file `attr` describes, granted `grant` (with
    /// the `content` of its version): recorded, with its handle and the
    /// flags the kernel gets.
    pub(super) fn opened(
        &self,
        attr: &Attr,
        grant: &shoal_fs::op::Grant,
        content: Vec<shoal_cap::Capability>,
        id: OpenId,
        write: bool,
        append: bool,
    ) -> (u64, FopenFlags) {
        let open = self.conn.opened(attr, grant, content);
        self.conn.record_open(attr.ino, id, write);
        if grant.uncached {
            self.conn.learn_new(id);
        }
        (self.handle(attr.ino, id, append), open_flags(open))
    }

    /// Closes handle `fh`: the primary hears of it only if it knew of the
    /// open.
    pub(super) fn close(&self, fh: u64) -> Result<(), Failure> {
        let Some(h) = self.handles.lock().remove(&fh) else {
            return Ok(());
        };
        let known = self.conn.forget_open(h.ino, h.open);
        self.conn.gone_closed(h.ino);
        if !self.conn.is_open(h.ino) {
            self.conn.private_closed(h.ino);
        }
        if !known {
            // The primary never learned of it: an open under a token.
            return Ok(());
        }
        let close = Op::Close {
            ino: h.ino,
            id: h.open,
        };
        self.conn.call(&Identity::root(), close).map(|_| ())
    }

    /// The flags the kernel gets for an open with `flags` that the mount
    /// answers with `how`.  An open for writing only also skips the
    /// kernel's page cache (`FOPEN_DIRECT_IO`) where the kernel drops the
    /// pages it caches of a direct write's range (`direct_writes`): nothing
    /// reads through such an open, and its writes reach the mount's cache
    /// without first being copied into pages (nor asking whether the file
    /// has capabilities to drop: the write says whether set-id bits must
    /// go, `drop_setid`).
    pub(super) fn kernel_flags(&self, how: FopenFlags, flags: i32) -> FopenFlags {
        if self.direct_writes.load(Ordering::Relaxed) && flags & libc::O_ACCMODE == libc::O_WRONLY {
            how | FopenFlags::FOPEN_DIRECT_IO
        } else {
            how
        }
    }

    /// Changes `ino`'s attributes as `who`: in the mount's private copy
    /// if the inode is private and `private` allows, else at the primary
    /// after the mount's dirty changes (a private inode is pushed before
    /// either reaches it).  The new attributes, and how long the kernel
    /// may keep them.
    pub(super) fn change_attrs(
        &self,
        who: &Identity,
        ino: Ino,
        set: SetAttr,
        private: bool,
    ) -> Result<(Attr, Duration), Failure> {
        if private {
            let op = UpdateOp::SetAttr {
                ino,
                set: set.clone(),
            };
            match self.conn.private_change(who, op)? {
                Routed::Local(Ok(_)) => {
                    let attr = self.conn.private_attr(ino).expect("private");
                    return Ok((attr, FOREVER));
                }
                Routed::Local(Err(e)) => return Err(Failure::Fs(e)),
                Routed::Shared(_) => {}
            }
        }
        self.conn.flush(Some(ino), false)?;
        let changed = self.conn.change(who, UpdateOp::SetAttr { ino, set });
        // Its version may have moved (a truncate): what the mount knew of
        // it goes; the next look at it asks again.
        self.conn.cache.lock().drop_token(ino);
        match changed? {
            Answer::Attr(attr) => Ok((attr, NONE)),
            other => Err(Failure::Unavailable(format!("{other:?}"))),
        }
    }

    /// Before a write the kernel marks as made without `CAP_FSETID`, to a
    /// file the mount keeps writes of: its set-user-id bit goes, and its
    /// set-group-id bit with group execute, as a local file system drops
    /// them (the writer may ask that of the tree: `drops_only_setid`).  A
    /// write through the primary drops them there.
    pub(super) fn drop_setid(&self, req: &Request, ino: Ino) -> Result<(), Failure> {
        let who = self.who(req);
        let Some(attr) = self
            .conn
            .private_attr(ino)
            .or_else(|| self.conn.cache.lock().attr(ino))
        else {
            return Ok(());
        };
        let perm = shoal_fs::access::after_write(&attr, &who);
        if perm == attr.perm {
            return Ok(());
        }
        let set = SetAttr {
            perm: Some(perm),
            ..SetAttr::default()
        };
        self.change_attrs(&who, ino, set, true).map(drop)
    }

    pub(super) fn handle(&self, ino: Ino, open: OpenId, append: bool) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, Handle { ino, open, append });
        fh
    }
}
