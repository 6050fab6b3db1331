//! A client's change to the tree: checked, its conflicting tokens
//! recalled, ordered, and answered once the clients caching the names it
//! changed have been told.

use crate::model::{FsError, Ino, Kind};
use crate::op::{self, Failure, Reply};
use crate::tokens::{ClientId, Decision, Level, OpenId, Tokens, Want};
use crate::update::{Answer, Update, UpdateOp};
use crate::xattr;

use super::decide::granted;
use super::{Outcome, Shell, Soft, fs};

impl<H> Soft<H> {
    /// Orders a client's change (after the checks only the primary can
    /// make).  Every other client's token on an inode whose attributes
    /// it changes is recalled first; once it is made, the clients that
    /// hold the directories it touched are told which names changed, and
    /// the change is answered when they confirmed (or their leases
    /// ended): a lookup anywhere that starts after the answer sees it.
    /// With `open` (a `CreateOpen`), the new file is opened for the
    /// creator once made, before any other request is decided.
    pub(super) fn change(
        &mut self,
        shell: &mut impl Shell,
        req: &op::Request,
        mut op: UpdateOp,
        open: Option<(OpenId, Want)>,
    ) -> Outcome {
        let mut p = Prepared::default();
        if let Err(e) = prepare(shell, &self.tokens, req.session, &mut op, &mut p) {
            return Outcome::Reply(Err(e));
        }
        let mut wait = false;
        for ino in &p.touched {
            // A commit by the holder of `Write` has nobody else to recall
            // (and must not wait for a recall of its own token, whose
            // answer follows it).
            if matches!(op, UpdateOp::Commit { .. })
                && self.tokens.level(req.session, *ino) == Level::Write
            {
                continue;
            }
            match self.tokens.exclusive(req.session, *ino) {
                Decision::Wait { .. } => wait = true,
                Decision::NoSession => return Outcome::Reply(Err(Failure::NoSession)),
                Decision::Grant { .. } => {}
            }
        }
        if wait {
            return Outcome::Wait;
        }
        // A client's commit names the version it was made from, so made
        // twice it fails the second time: it needs no exactly-once record,
        // and may come from any of the session's threads (whose request
        // numbers are their own).
        let session = if matches!(op, UpdateOp::Commit { .. }) {
            ClientId(0)
        } else {
            req.session
        };
        let update = Update {
            session,
            seq: req.seq,
            who: req.who.clone(),
            now: shell.wall(),
            op,
        };
        let result = match shell.order(&update) {
            Ok(result) => result,
            Err(e) => return Outcome::Reply(Err(e)),
        };
        let mut notices = Vec::new();
        if result.is_ok() {
            for (dir, name) in &p.names {
                notices.extend(self.tokens.notify(req.session, *dir, name));
            }
        }
        // A victim kept because it may be open loses its tokens: their
        // answers report the opens, and the last close forgets it.
        if let Ok(Answer::Removed { gone: None, .. }) = &result {
            for ino in p.victims {
                self.maybe_forget(shell, ino);
            }
        }
        if let Ok(Answer::Removed {
            gone: Some(ino), ..
        }) = &result
            && p.mine.contains(ino)
        {
            self.tokens.forget(*ino);
        }
        let reply = if p.names.is_empty() && open.is_none() {
            Ok(Reply::Updated(result))
        } else {
            // The creator's open of what it made: nobody else can hold the
            // new inode yet, so it is granted at once.  A directory made
            // is its maker's to change alone (`Write`: private) until
            // another mount looks at it.
            let asked = match (&result, open) {
                (Ok(Answer::Entry { attr, .. }), Some((id, want))) => {
                    Some((attr.ino, want, Some(id)))
                }
                (
                    Ok(Answer::Entry {
                        attr,
                        existed: false,
                    }),
                    None,
                ) if attr.kind == Kind::Dir && req.session != ClientId(0) => {
                    Some((attr.ino, Want::Change, None))
                }
                _ => None,
            };
            let opened = asked.and_then(|(ino, want, id)| {
                granted(&self.tokens.request(req.session, ino, want, &[], id))
            });
            // As the tree holds it (a create answered again holds the
            // first one's).
            let secret = match (&result, opened) {
                (Ok(Answer::Entry { attr, .. }), Some(g))
                    if attr.kind == Kind::Dir && g.level == Level::Write =>
                {
                    shell.read(|t| t.get(attr.ino).map(|i| i.secret))
                }
                _ => None,
            };
            let mut dirs: Vec<Ino> = p.names.iter().map(|(d, _)| *d).collect();
            dirs.sort_unstable();
            dirs.dedup();
            let dirs = shell.read(|t| {
                dirs.iter()
                    .filter_map(|d| t.get(*d).map(|i| i.attr))
                    .collect()
            });
            Ok(Reply::Changed {
                result,
                dirs,
                opened,
                secret,
            })
        };
        if notices.is_empty() {
            Outcome::Reply(reply)
        } else {
            Outcome::Notified(reply, notices)
        }
    }

    /// Answers the changes whose notices every receiver confirmed.
    pub(super) fn noticed(&mut self) {
        let mut still = Vec::new();
        for (held, mut ids, reply) in std::mem::take(&mut self.noticing) {
            ids.retain(|id| !self.tokens.notice_done(*id));
            if ids.is_empty() {
                self.out.push((held, reply));
            } else {
                still.push((held, ids, reply));
            }
        }
        self.noticing = still;
    }
}

/// Checks a client's change and fills in what only the primary knows
/// (whether a victim is open somewhere); collects the names it
/// changes, the inodes whose attributes it changes and those it may
/// take the last name of.
fn prepare(
    shell: &mut impl Shell,
    tokens: &Tokens,
    client: ClientId,
    op: &mut UpdateOp,
    p: &mut Prepared,
) -> Result<(), Failure> {
    let fresh = shell.secret();
    let shell = &*shell;
    let victim_of =
        |parent: Ino, name: &[u8]| shell.read(|t| t.lookup(parent, name).map(|i| i.attr.ino).ok());
    let in_use = |victim: Option<Ino>, p: &mut Prepared| {
        p.victims.extend(victim);
        p.touched.extend(victim);
        victim.is_some_and(|ino| tokens.is_open(ino) || tokens.is_held(ino))
    };
    // Removing `user.shoal.cap` revokes every capability of the inode
    // (`shoal fs revoke`), and so does a change of attributes that
    // takes rights away (`docs/fs.md`, "Authority"): the inode gets a
    // new secret.
    let revoke = match &*op {
        UpdateOp::RemoveXattr { ino, name } if name == xattr::CAP => Some((*ino, None)),
        UpdateOp::SetAttr { ino, set }
            if shell.read(|t| t.get(*ino).is_some_and(|i| set.takes_rights(&i.attr))) =>
        {
            Some((*ino, Some(set.clone())))
        }
        _ => None,
    };
    if let Some((ino, set)) = revoke {
        *op = UpdateOp::Revoke {
            ino,
            secret: [0; 16],
            set,
        };
    }
    match op {
        UpdateOp::Forget { .. } => {
            return Err(fs(FsError::Perm));
        }
        UpdateOp::Commit { flush: true, .. } => return Err(fs(FsError::Perm)),
        // A new inode's capability secret is the primary's to draw,
        // whatever the client put there.
        UpdateOp::Create {
            parent,
            name,
            secret,
            ..
        } => {
            *secret = fresh;
            p.names.push((*parent, name.clone()));
        }
        UpdateOp::Revoke { ino, secret, .. } => {
            p.touched.push(*ino);
            *secret = fresh;
        }
        UpdateOp::Link { ino, parent, name } => {
            p.names.push((*parent, name.clone()));
            p.touched.push(*ino);
        }
        UpdateOp::Unlink {
            parent, name, open, ..
        } => {
            // The client's `open` says whether it may have the inode
            // open without the primary knowing.  If it says not and is
            // the only one holding it, the inode goes with its name,
            // with no recall: the client drops its token on the answer.
            let victim = victim_of(*parent, name);
            match victim {
                Some(ino) if !*open && tokens.only(client, ino) => {
                    p.victims.push(ino);
                    p.mine.push(ino);
                }
                _ => *open = in_use(victim, p),
            }
            p.names.push((*parent, name.clone()));
        }
        UpdateOp::Rename {
            from,
            from_name,
            to,
            to_name,
            open_victim,
            ..
        } => {
            *open_victim = in_use(victim_of(*to, to_name), p);
            let moved = shell.read(|t| t.lookup(*from, from_name).map(|i| i.attr.ino).ok());
            p.touched.extend(moved);
            p.names.push((*from, from_name.clone()));
            p.names.push((*to, to_name.clone()));
        }
        UpdateOp::Push { .. } => {
            return Err(fs(FsError::Invalid("a push is a request of its own")));
        }
        UpdateOp::SetAttr { ino, .. }
        | UpdateOp::Commit { ino, .. }
        | UpdateOp::Overlay { ino, .. }
        | UpdateOp::SetXattr { ino, .. }
        | UpdateOp::RemoveXattr { ino, .. } => p.touched.push(*ino),
        UpdateOp::Range { .. } => {}
    }
    p.names.dedup();
    p.touched.sort_unstable();
    p.touched.dedup();
    Ok(())
}

/// What a change touches, as [`prepare`] found it.
#[derive(Default)]
struct Prepared {
    /// The names it changes: directory, name.
    names: Vec<(Ino, Vec<u8>)>,
    /// The inodes whose attributes it changes.
    touched: Vec<Ino>,
    /// The inodes it may take the last name of.
    victims: Vec<Ino>,
    /// Victims only the asking client holds, which go with their name.
    mine: Vec<Ino>,
}
