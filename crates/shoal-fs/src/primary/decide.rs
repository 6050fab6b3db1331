//! Deciding one request: what it asks, checked against the tree and the
//! tokens.

use crate::access::{self, R, W, X};
use crate::model::{Attr, FsError, Identity, Ino, Kind, ROOT};
use crate::op::{self, DirEntry, Failure, Grant, Op, Reply, StatFs};
use crate::tokens::{ClientId, Decision, LEASE, Level, OpenId, Want};
use crate::tree::{Body, OverlayEntry, overlaid_window};
use crate::update::UpdateOp;
use shoal_cap::Capability;

use super::{Flush, Outcome, Shell, Soft, fs};

/// A file's content version, overlay and size.
type FileBody = (Vec<Capability>, Vec<OverlayEntry>, u64);

pub(super) fn granted(d: &Decision) -> Option<Grant> {
    match d {
        Decision::Grant {
            level,
            uncached,
            grant,
        } => Some(Grant {
            level: *level,
            grant: *grant,
            uncached: *uncached,
        }),
        _ => None,
    }
}

/// A file's content version, overlay and size.
fn file_body(shell: &impl Shell, ino: Ino) -> Result<FileBody, Failure> {
    shell.read(|t| match t.get(ino) {
        Some(i) => match &i.body {
            Body::File { content, overlay } => Ok((content.clone(), overlay.clone(), i.attr.size)),
            _ if i.attr.kind == Kind::Dir => Err(fs(FsError::IsDir)),
            _ => Err(fs(FsError::Invalid("only a regular file has contents"))),
        },
        None => Err(fs(FsError::NotFound)),
    })
}

/// `len` bytes of a file at `offset` (fewer at its end): that window of
/// its content version, read from a file server, with the overlay's
/// changes made.
pub(super) fn read_window(
    shell: &mut impl Shell,
    ino: Ino,
    offset: u64,
    len: u32,
) -> Result<Vec<u8>, Failure> {
    let (content, overlay, size) = file_body(shell, ino)?;
    let base = if content.is_empty() || offset >= size {
        Vec::new()
    } else {
        shell.read_content(&content, offset, len)?
    };
    Ok(overlaid_window(&base, offset, len as usize, &overlay, size))
}

impl<H> Soft<H> {
    /// Before a file is cached again, the bytes written while it was
    /// write-shared (its overlay) become a content version on the file
    /// servers.
    fn flush_overlay(&mut self, shell: &mut impl Shell, ino: Ino) -> Result<(), Failure> {
        let pending = shell.read(|t| {
            t.get(ino).and_then(|i| match &i.body {
                Body::File { content, overlay } if !overlay.is_empty() => {
                    Some((i.attr, content.clone(), overlay.clone()))
                }
                _ => None,
            })
        });
        let Some((attr, base, overlay)) = pending else {
            return Ok(());
        };
        let flush = Flush {
            base: &base,
            base_held: attr.held,
            overlay: &overlay,
            size: attr.size,
        };
        let (content, held) = shell.store(ino, &flush)?;
        self.order_own(
            shell,
            UpdateOp::Commit {
                ino,
                base: attr.version,
                content,
                size: attr.size,
                held,
                mtime: attr.mtime,
                flush: true,
            },
        )?;
        Ok(())
    }

    /// Decides one request (of a client with a session).
    pub(super) fn handle(&mut self, shell: &mut impl Shell, req: &op::Request) -> Outcome {
        if req.op.by_capability() {
            return self.by_capability(shell, &req.op);
        }
        let client = req.session;
        let now = self.now;
        if let Op::Hello { node, .. } = &req.op {
            return self.hello(shell, client, node);
        }
        if !self.tokens.knows(client) {
            return Outcome::Reply(Err(Failure::NoSession));
        }
        self.tokens.renew(now, client);
        let who = &req.who;
        let reply = match &req.op {
            Op::Hello { .. }
            | Op::Status
            | Op::Sync
            | Op::CapStat { .. }
            | Op::CapRead { .. }
            | Op::TouchContents { .. } => {
                // The shell's to answer.
                Err(fs(FsError::Invalid(
                    "not a request for the primary's soft state",
                )))
            }
            Op::GetXattr { .. } | Op::ListXattr { .. } => self.xattr(shell, who, &req.op),
            Op::Lock { .. } => return self.lock(shell, client, &req.op),
            Op::Events { confirm } => {
                for id in confirm {
                    self.tokens.confirm(client, *id);
                }
                self.noticed();
                return Outcome::Park;
            }
            Op::Confirm { ids } => {
                for id in ids {
                    self.tokens.confirm(client, *id);
                }
                self.noticed();
                Ok(Reply::Done)
            }
            Op::Lookup { parent, name } => {
                let found = shell.read(|t| {
                    let dir = t.get(*parent).ok_or(FsError::NotFound)?;
                    access::check(&dir.attr, who, X)?;
                    t.lookup(*parent, name).map(|i| i.attr)
                });
                match found {
                    Ok(attr) => return self.look(client, attr),
                    Err(e) => Err(fs(e)),
                }
            }
            Op::GetAttr { ino } => match shell.read(|t| t.get(*ino).map(|i| i.attr)) {
                Some(attr) => return self.look(client, attr),
                None => Err(fs(FsError::NotFound)),
            },
            Op::ReadDir { ino } => return self.read_dir(shell, client, who, *ino),
            Op::ReadLink { ino } => shell.read(|t| match t.get(*ino).map(|i| &i.body) {
                Some(Body::Symlink { target }) => Ok(Reply::Target(target.clone())),
                Some(_) => Err(fs(FsError::Invalid("not a symbolic link"))),
                None => Err(fs(FsError::NotFound)),
            }),
            Op::Open {
                ino,
                want,
                have,
                id,
                ..
            } => return self.open(shell, req, *ino, *want, have, *id),
            Op::Close { ino, id } => {
                if self.tokens.close(client, *ino, *id) {
                    tracing::debug!("inode {ino} is no longer write-shared");
                }
                self.maybe_forget(shell, *ino);
                self.retry(shell);
                Ok(Reply::Done)
            }
            Op::Read { ino, offset, len } => {
                read_window(shell, *ino, *offset, *len).map(Reply::Data)
            }
            Op::Write { ino, offset, data } => match self.tokens.write_through(client, *ino) {
                Decision::Wait { .. } => return Outcome::Wait,
                Decision::NoSession => Err(Failure::NoSession),
                Decision::Grant { .. } => {
                    return self.change(
                        shell,
                        req,
                        UpdateOp::Overlay {
                            ino: *ino,
                            offset: *offset,
                            data: data.clone(),
                        },
                        None,
                    );
                }
            },
            // A change waits out a new primary's grace period: whether a
            // name's inode is open somewhere (and so kept when the name
            // goes) is known once the clients have reclaimed their opens.
            Op::Change { .. } if self.tokens.in_grace() => return Outcome::Wait,
            Op::Change {
                op: UpdateOp::Push { ops },
                ..
            } => return self.push(shell, req, ops),
            Op::Change { op, .. } => return self.change(shell, req, op.clone(), None),
            Op::CreateOpen { .. } if self.tokens.in_grace() => return Outcome::Wait,
            Op::CreateOpen { op, id, want } => return self.create_open(shell, req, op, *id, *want),
            Op::Return {
                ino,
                grant,
                kept,
                opens,
            } => {
                self.tokens.returned(client, *ino, *grant, *kept, opens);
                self.maybe_forget(shell, *ino);
                self.retry(shell);
                Ok(Reply::Done)
            }
            Op::Reclaim {
                ino,
                level,
                version,
                opens,
            } => return self.reclaim(shell, client, *ino, *level, *version, opens),
            Op::StatFs => Ok(stat_fs(shell)),
        };
        Outcome::Reply(reply)
    }

    /// A client's hello: its session starts (or starts again), and it
    /// learns the root, the file servers and how many copies to store.
    fn hello(&mut self, shell: &mut impl Shell, client: ClientId, node: &[u8]) -> Outcome {
        self.tokens.hello(self.now, client);
        tracing::info!(
            "client {client:016x} on {} said hello",
            String::from_utf8_lossy(node)
        );
        let root = shell.read(|t| t.get(ROOT).map(|i| i.attr));
        Outcome::Reply(root.map_or(Err(fs(FsError::Io)), |root| {
            Ok(Reply::Hello {
                lease_ms: LEASE.as_millis() as u32,
                root,
                servers: self.cfg.servers.clone(),
                copies: self.cfg.copies.max(1).min(u8::MAX as usize) as u8,
            })
        }))
    }

    /// A directory's entries, with `Read` on it if nothing conflicts.
    fn read_dir(
        &mut self,
        shell: &mut impl Shell,
        client: ClientId,
        who: &Identity,
        ino: Ino,
    ) -> Outcome {
        let listed = shell.read(|t| {
            let dir = t.get(ino).ok_or(FsError::NotFound)?;
            access::check(&dir.attr, who, R)?;
            let entries = t.entries(ino)?;
            Ok::<_, FsError>(
                entries
                    .iter()
                    .filter_map(|(name, i)| {
                        Some(DirEntry {
                            name: name.clone(),
                            ino: *i,
                            kind: t.get(*i)?.attr.kind,
                        })
                    })
                    .collect::<Vec<_>>(),
            )
        });
        Outcome::Reply(match listed {
            Ok(entries) => match self.tokens.request(client, ino, Want::Look, &[], None) {
                Decision::Wait { .. } => return Outcome::Wait,
                Decision::NoSession => Err(Failure::NoSession),
                d => Ok(Reply::Entries {
                    entries,
                    grant: granted(&d).expect("a grant"),
                }),
            },
            Err(e) => Err(fs(e)),
        })
    }

    /// A new regular file made and opened in one request.
    fn create_open(
        &mut self,
        shell: &mut impl Shell,
        req: &op::Request,
        op: &UpdateOp,
        id: OpenId,
        want: Want,
    ) -> Outcome {
        if !matches!(
            op,
            UpdateOp::Create {
                kind: Kind::File,
                excl: true,
                ..
            }
        ) || !matches!(want, Want::OpenRead | Want::OpenWrite)
        {
            return Outcome::Reply(Err(fs(FsError::Invalid(
                "create-and-open makes a new regular file",
            ))));
        }
        self.change(shell, req, op.clone(), Some((OpenId(id.0), want)))
    }

    /// A client's reclaim of a token (and its opens) from an earlier
    /// primary, in the grace period.
    fn reclaim(
        &mut self,
        shell: &mut impl Shell,
        client: ClientId,
        ino: Ino,
        level: Level,
        version: Option<u64>,
        opens: &[(OpenId, bool)],
    ) -> Outcome {
        let Some(attr) = shell.read(|t| t.get(ino).map(|i| i.attr)) else {
            // The inode went (its last name and open are gone): nothing to
            // reclaim.
            return Outcome::Reply(Err(fs(FsError::NotFound)));
        };
        let current = version == Some(attr.version);
        let now = self.now;
        let grant = match self.tokens.reclaim(now, client, ino, level, current, opens) {
            Ok(grant) => Grant {
                level: if grant == 0 { Level::None } else { level },
                grant,
                uncached: false,
            },
            Err(refused) => {
                tracing::debug!("client {client:016x}'s reclaim of {ino}: {refused:?}");
                Grant {
                    level: Level::None,
                    grant: 0,
                    uncached: false,
                }
            }
        };
        Outcome::Reply(Ok(Reply::Entry { attr, grant }))
    }

    /// A lookup or getattr found `attr`: it comes with `Read` if nothing
    /// conflicts.
    fn look(&mut self, client: ClientId, attr: Attr) -> Outcome {
        match self.tokens.request(client, attr.ino, Want::Look, &[], None) {
            Decision::Wait { .. } => Outcome::Wait,
            Decision::NoSession => Outcome::Reply(Err(Failure::NoSession)),
            d => Outcome::Reply(Ok(Reply::Entry {
                attr,
                grant: granted(&d).expect("a grant"),
            })),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn open(
        &mut self,
        shell: &mut impl Shell,
        req: &op::Request,
        ino: Ino,
        want: Want,
        have: &[(OpenId, bool)],
        id: OpenId,
    ) -> Outcome {
        let checked = shell.read(|t| {
            let i = t.get(ino).ok_or(FsError::NotFound)?;
            match (i.attr.kind, want) {
                (Kind::Dir, Want::OpenWrite) => return Err(FsError::IsDir),
                (Kind::File | Kind::Dir, _) => {}
                _ => return Err(FsError::Invalid("only files and directories are opened")),
            }
            let bits = if want == Want::OpenWrite { W } else { R };
            access::check(&i.attr, &req.who, bits)?;
            Ok(())
        });
        if let Err(e) = checked {
            return Outcome::Reply(Err(fs(e)));
        }
        let grant = match self.tokens.request(req.session, ino, want, have, Some(id)) {
            Decision::Wait { .. } => return Outcome::Wait,
            Decision::NoSession => return Outcome::Reply(Err(Failure::NoSession)),
            d => granted(&d).expect("a grant"),
        };
        if !grant.uncached
            && grant.level != Level::None
            && let Err(e) = self.flush_overlay(shell, ino)
        {
            return Outcome::Reply(Err(e));
        }
        Outcome::Reply(shell.read(|t| match t.get(ino) {
            Some(i) => Ok(Reply::Opened {
                attr: i.attr,
                grant,
                content: match &i.body {
                    Body::File { content, .. } if !grant.uncached => content.clone(),
                    _ => Vec::new(),
                },
            }),
            None => Err(fs(FsError::NotFound)),
        }))
    }
}

/// The file system's figures for `statfs`: how many inodes there are, and
/// no limit (the file servers' space is not gathered here yet).
fn stat_fs(shell: &mut impl Shell) -> Reply {
    let inodes = shell.read(|t| t.inode_count() as u64);
    Reply::StatFs(StatFs {
        block_size: 4096,
        blocks: 1 << 32,
        blocks_free: 1 << 32,
        files: inodes + (1 << 32),
        files_free: 1 << 32,
    })
}
