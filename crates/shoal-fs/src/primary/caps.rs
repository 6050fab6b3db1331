//! Extended attributes, and the requests made by capability rather than
//! for a mount's session (`docs/fs.md`, "Authority").
//!
//! `user.shoal.cap` is minted here, for the caller's identity, with the
//! rights its permissions give on the inode.  A capability is then all a
//! program needs: any caller, on any node and as any user, may ask the
//! primary for the attributes (`CapStat`) and, with `READ`, the bytes
//! (`CapRead`) of the inode it names.  A read by capability sees the
//! file's latest bytes: every mount holding `Write` on it is recalled to
//! `Read` first, and so writes its changes back (the request waits with
//! the others that wait for recalls).

use crate::model::{FsError, Identity, Ino, Kind};
use crate::op::{Failure, Grant, Op, Reply};
use crate::tokens::Level;
use crate::xattr;
use shoal_cap::{Capability, Rights};

use super::decide::read_window;
use super::{Outcome, Shell, Soft, fs};

impl<H> Soft<H> {
    /// `GetXattr` and `ListXattr` for a mount's caller `who`.
    pub(super) fn xattr(
        &self,
        shell: &impl Shell,
        who: &Identity,
        op: &Op,
    ) -> Result<Reply, Failure> {
        let port = self.cfg.port;
        shell
            .read(|t| {
                let inode = |ino: &Ino| t.get(*ino).ok_or(FsError::NotFound);
                match op {
                    Op::GetXattr { ino, name } if name == xattr::CAP => {
                        let cap = xattr::mint(port, inode(ino)?, who)?;
                        Ok(Reply::Data(cap.to_string().into_bytes()))
                    }
                    Op::GetXattr { ino, name } => {
                        xattr::get(inode(ino)?, who, name).map(Reply::Data)
                    }
                    Op::ListXattr { ino } => xattr::list(inode(ino)?, who).map(Reply::Data),
                    _ => unreachable!("only the xattr requests come here"),
                }
            })
            .map_err(fs)
    }

    /// A request by capability: checked against the inode's secret, and
    /// made with the capability's rights whoever calls.
    pub(super) fn by_capability(&mut self, shell: &mut impl Shell, op: &Op) -> Outcome {
        let (cap, need) = match op {
            Op::CapStat { cap } => (cap, Rights::NONE),
            Op::CapRead { cap, .. } => (cap, Rights::READ),
            _ => unreachable!("only requests by capability come here"),
        };
        let attr = match self.checked(shell, cap, need) {
            Ok(attr) => attr,
            Err(e) => return Outcome::Reply(Err(fs(e))),
        };
        match op {
            Op::CapStat { .. } => Outcome::Reply(Ok(Reply::Entry {
                attr,
                grant: Grant {
                    level: Level::None,
                    grant: 0,
                    uncached: false,
                },
            })),
            Op::CapRead { offset, len, .. } => {
                if attr.kind != Kind::File {
                    return Outcome::Reply(Err(fs(if attr.kind == Kind::Dir {
                        FsError::IsDir
                    } else {
                        FsError::Invalid("only a regular file has contents")
                    })));
                }
                if !self.tokens.writers_flushed(attr.ino) {
                    return Outcome::Wait;
                }
                Outcome::Reply(read_window(shell, attr.ino, *offset, *len).map(Reply::Data))
            }
            _ => unreachable!("matched above"),
        }
    }

    /// The attributes of the inode `cap` names, if it is genuine, was
    /// made by this service and holds `need`.
    fn checked(
        &self,
        shell: &impl Shell,
        cap: &Capability,
        need: Rights,
    ) -> Result<crate::model::Attr, FsError> {
        if cap.port() != self.cfg.port {
            return Err(FsError::Access);
        }
        shell.read(|t| {
            let inode = t.get(Ino(cap.object().get())).ok_or(FsError::Access)?;
            xattr::verify(cap, inode, need)?;
            Ok(inode.attr)
        })
    }
}
