//! Extended attributes through the mount (`docs/fs.md`, "Authority").
//!
//! Values and listings come from the primary, which checks permissions
//! again and mints `user.shoal.cap`.  Two kinds of name never leave the
//! node: those of namespaces the service does not keep (`security.*`,
//! `system.*`: absent to read, `ENOTSUP` to set), since the kernel asks for
//! `security.capability` before every write to a file; and
//! `user.shoal.content`, the capabilities of the file's current content
//! version, which the mount knows once it holds the file (it opens the
//! file for reading to learn them, so a writer elsewhere writes back
//! first, and writes back its own changes).

use fuser::{Errno, ReplyXattr, Request};
use shoal_fs::model::{FsError, Ino};
use shoal_fs::op::{Failure, Op, Reply};
use shoal_fs::update::{UpdateOp, XattrMode};
use shoal_fs::xattr::{CAP, CONTENT, SHOAL, kept_namespace};

use super::{ShoalFs, errno};

/// Answers `getxattr` or `listxattr`: the size when the caller asks for
/// it (`size` 0), else the bytes, or `ERANGE` if they do not fit.
pub(super) fn answer(reply: ReplyXattr, size: u32, r: Result<Reply, Failure>) {
    match r {
        Ok(Reply::Data(d)) if size == 0 => reply.size(d.len() as u32),
        Ok(Reply::Data(d)) if d.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(Reply::Data(d)) => reply.data(&d),
        Ok(other) => reply.error(errno(shoal_fssvc::client::unexpected(&other))),
        Err(e) => reply.error(errno(e)),
    }
}

impl ShoalFs {
    /// One attribute's value (`Data`).
    pub(super) fn get_xattr(&self, req: &Request, ino: Ino, name: &[u8]) -> Result<Reply, Failure> {
        if !kept_namespace(name) {
            return Err(Failure::Fs(FsError::NoData));
        }
        // Extended attributes are the primary's (a private inode's name is
        // pushed first).
        self.conn.publish(&[ino])?;
        if name == CONTENT {
            return self.content_caps(req, ino).map(Reply::Data);
        }
        let op = Op::GetXattr {
            ino,
            name: name.to_vec(),
        };
        self.conn.call(&super::who::now(req), op)
    }

    /// Sets (`Some((value, flags))`) or removes an attribute at the
    /// primary.
    pub(super) fn set_xattr(
        &self,
        req: &Request,
        ino: Ino,
        name: &[u8],
        value: Option<(&[u8], i32)>,
    ) -> Result<(), Failure> {
        if !kept_namespace(name) {
            return Err(Failure::Fs(FsError::NotSupported));
        }
        // Removing `user.shoal.cap` revokes the inode's capabilities (the
        // primary says who may); no other `user.shoal.` name changes.
        if name.starts_with(SHOAL) && !(name == CAP && value.is_none()) {
            return Err(Failure::Fs(FsError::Perm));
        }
        // A change through the primary: a private inode is pushed first
        // (`Conn::change`).
        let op = match value {
            Some((value, flags)) => UpdateOp::SetXattr {
                ino,
                name: name.to_vec(),
                value: value.to_vec(),
                mode: match flags & (libc::XATTR_CREATE | libc::XATTR_REPLACE) {
                    0 => XattrMode::Any,
                    libc::XATTR_CREATE => XattrMode::Create,
                    libc::XATTR_REPLACE => XattrMode::Replace,
                    _ => return Err(Failure::Fs(FsError::Invalid("create and replace"))),
                },
            },
            None => UpdateOp::RemoveXattr {
                ino,
                name: name.to_vec(),
            },
        };
        self.conn.change(&self.who(req), op).map(|_| ())
    }

    /// `user.shoal.content`: the current content version's capabilities,
    /// with the read right alone, one `cap1:` text a line (none for a file
    /// never written back).  The
    /// mount's own changes are written back first; a file written on
    /// several nodes at once has no such version (`EBUSY`).
    fn content_caps(&self, req: &Request, ino: Ino) -> Result<Vec<u8>, Failure> {
        self.conn.flush(Some(ino), false)?;
        let known = |fs: &ShoalFs| {
            let c = fs.conn.cache.lock().content(ino)?;
            (!fs.conn.cache.lock().is_dirty(ino)).then_some(c.content)
        };
        let caps = match known(self) {
            Some(caps) => caps,
            None => {
                let (fh, _) = self.open_file(&self.who(req), ino, libc::O_RDONLY)?;
                let caps = known(self);
                self.close(fh)?;
                caps.ok_or(Failure::Fs(FsError::Busy))?
            }
        };
        // The mount's own are the primary's, with every right; a reader
        // is given the right to read them alone, never to destroy them.
        let lines: Vec<String> = caps
            .iter()
            .map(|c| c.restrict(shoal_cap::Rights::READ).map(|c| c.to_string()))
            .collect::<Result<_, _>>()
            .map_err(|e| Failure::Unavailable(format!("restricting a content capability: {e}")))?;
        Ok(lines.join("\n").into_bytes())
    }
}
