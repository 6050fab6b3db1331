//! Names made and removed through the kernel: a new inode in a
//! directory, and an unlink or rmdir, routed to the private copy or to
//! the primary.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use fuser::{INodeNo, Request};
use shoal_fs::model::{Attr, Kind};
use shoal_fs::op::Failure;
use shoal_fs::update::{Answer, UpdateOp};

use super::{ShoalFs, node};
use crate::private::Routed;

impl ShoalFs {
    /// Makes a new inode named `name` in `parent`.
    pub(super) fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        kind: (Kind, u32, u32),
        target: &[u8],
    ) -> Result<Attr, Failure> {
        self.conn
            .make(&self.who(req), node(parent), name.as_bytes(), kind, target)
    }

    /// Removes a name (a directory's with `dir`).
    pub(super) fn remove(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        dir: bool,
    ) -> Result<Answer, Failure> {
        let op = UpdateOp::Unlink {
            parent: node(parent),
            name: name.as_bytes().to_vec(),
            dir,
            open: false,
        };
        let mut op = match self.conn.private_change(&self.who(req), op)? {
            Routed::Local(answer) => return answer.map_err(Failure::Fs),
            Routed::Shared(op) => op,
        };
        if let UpdateOp::Unlink { open, .. } = &mut op {
            *open = self.conn.opens_unknown();
        }
        let before = self.conn.cache.lock().stamp(node(parent));
        let answer = self.conn.change(&self.who(req), op)?;
        self.conn
            .cache
            .lock()
            .removed(node(parent), name.as_bytes(), before);
        if let Answer::Removed {
            gone: Some(ino), ..
        } = &answer
        {
            self.conn.gone(*ino);
        }
        Ok(answer)
    }
}
