//! The tree: every replica of the metadata service applies the same
//! ordered [`Update`]s to a [`Tree`] and so holds the same inodes.
//! Applying is deterministic (times, inode numbers and secrets travel in
//! the updates), and it is where the POSIX rules are enforced: permission,
//! sticky directories, link counts, renames that would make a cycle.
//!
//! The tree keeps one *session* per client: the number and answer of its
//! latest update, so an update retried after a primary change is
//! answered, not applied twice.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use shoal_cap::Capability;

use crate::access::{self, W, X};
use crate::model::*;
use crate::tokens::ClientId;
use crate::update::{Answer, SetAttr, TimeSet, Update, UpdateOp, XattrMode};

mod overlay;
mod snapshot;
#[cfg(test)]
mod tests;

pub use overlay::{OverlayChange, OverlayEntry, overlaid, overlaid_window};

/// Most client sessions kept; the least recently used is forgotten first.
pub const MAX_SESSIONS: usize = 65_536;
/// Most bytes in one overlay write (FUSE's largest write).
pub const OVERLAY_WRITE_MAX: usize = 1 << 20;
/// Most inode numbers handed out at once.
pub const RANGE_MAX: u32 = 1 << 20;

/// What an inode holds besides its attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// A regular file: the capabilities of its content version on the file
    /// servers (empty: no bytes stored yet), and the changes made since.
    File {
        content: Vec<Capability>,
        overlay: Vec<OverlayEntry>,
    },
    /// A directory: its entries, and its parent (itself for the root).
    Dir {
        entries: BTreeMap<Vec<u8>, Ino>,
        parent: Ino,
    },
    Symlink {
        target: Vec<u8>,
    },
    /// A device, FIFO or socket.
    Special,
}

/// One inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub attr: Attr,
    /// The inode's capability secret.
    pub secret: [u8; 16],
    pub body: Body,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Session {
    seq: u64,
    index: u64,
    result: Result<Answer, FsError>,
}

/// What [`Tree::apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// A new update: applied (or refused) now.
    New(Result<Answer, FsError>),
    /// An update this session made already: its earlier answer.
    Duplicate(Result<Answer, FsError>),
}

impl Applied {
    pub fn result(&self) -> &Result<Answer, FsError> {
        match self {
            Applied::New(r) | Applied::Duplicate(r) => r,
        }
    }
}

/// Every inode of one file system, and the client sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    index: u64,
    next_ino: Ino,
    /// Boxed: a node of the map moves its values when it changes, and an
    /// inode is a few hundred bytes.
    inodes: BTreeMap<Ino, Box<Inode>>,
    sessions: HashMap<ClientId, Session>,
    lru: BTreeSet<(u64, ClientId)>,
}

impl Tree {
    /// A tree holding only the root directory (mode 0755, owned by root),
    /// made at `now` with capability secret `secret`.
    pub fn new(secret: [u8; 16], now: Timestamp) -> Tree {
        let root = Inode {
            attr: Attr {
                ino: ROOT,
                kind: Kind::Dir,
                perm: 0o755,
                nlink: 2,
                uid: 0,
                gid: 0,
                rdev: 0,
                size: 0,
                held: 0,
                atime: now,
                mtime: now,
                ctime: now,
                version: 0,
            },
            secret,
            body: Body::Dir {
                entries: BTreeMap::new(),
                parent: ROOT,
            },
            xattrs: BTreeMap::new(),
        };
        Tree {
            index: 0,
            next_ino: ROOT.plus(1),
            inodes: BTreeMap::from([(ROOT, Box::new(root))]),
            sessions: HashMap::new(),
            lru: BTreeSet::new(),
        }
    }

    /// A client's copy of its private directories (`docs/fs.md`, "Private
    /// directories"): no root, and any inode number may be made (they
    /// come from ranges the primary handed out).  Directories come in by
    /// [`Tree::adopt_dir`]; changes are made by [`Tree::change`].
    pub fn private() -> Tree {
        Tree {
            index: 0,
            next_ino: Ino::MAX,
            inodes: BTreeMap::new(),
            sessions: HashMap::new(),
            lru: BTreeSet::new(),
        }
    }

    /// Takes in an empty directory the primary made (`attr`, with
    /// capability secret `secret`, named in `parent`, which this tree need
    /// not hold).
    pub fn adopt_dir(&mut self, attr: Attr, secret: [u8; 16], parent: Ino) {
        self.inodes.insert(
            attr.ino,
            Box::new(Inode {
                attr,
                secret,
                body: Body::Dir {
                    entries: BTreeMap::new(),
                    parent,
                },
                xattrs: BTreeMap::new(),
            }),
        );
    }

    /// Makes one change as `who` at `now`, outside any session: the same
    /// checks and results as when the replicas apply it.
    pub fn change(
        &mut self,
        who: &Identity,
        now: Timestamp,
        op: &UpdateOp,
    ) -> Result<Answer, FsError> {
        self.apply_op(who, now, op, false)
    }

    /// How many updates were applied (the replicas' log index).
    pub fn index(&self) -> u64 {
        self.index
    }

    /// How many inodes there are.
    pub fn inode_count(&self) -> usize {
        self.inodes.len()
    }

    /// Every inode.
    pub fn inodes(&self) -> impl Iterator<Item = &Inode> {
        self.inodes.values().map(|i| &**i)
    }

    /// The inodes numbered above `after`, in order.
    pub fn inodes_after(&self, after: Ino) -> impl Iterator<Item = &Inode> {
        use std::ops::Bound::{Excluded, Unbounded};
        self.inodes
            .range((Excluded(after), Unbounded))
            .map(|(_, i)| &**i)
    }

    /// The inode numbered `ino`.
    pub fn get(&self, ino: Ino) -> Option<&Inode> {
        self.inodes.get(&ino).map(|i| &**i)
    }

    /// The inode `name` names in directory `parent` (a name longer than
    /// any name can be is `ENAMETOOLONG`, as POSIX says, not `ENOENT`).
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<&Inode, FsError> {
        if name.len() > NAME_MAX {
            return Err(FsError::NameTooLong);
        }
        let ino = *self.entries(parent)?.get(name).ok_or(FsError::NotFound)?;
        self.inodes.get(&ino).map(|i| &**i).ok_or(FsError::Io)
    }

    /// The inodes without names, kept while some client may have them
    /// open (until a [`UpdateOp::Forget`]).
    pub fn orphans(&self) -> Vec<Ino> {
        self.inodes
            .values()
            .filter(|i| i.attr.nlink == 0)
            .map(|i| i.attr.ino)
            .collect()
    }

    /// A directory's entries.
    pub fn entries(&self, dir: Ino) -> Result<&BTreeMap<Vec<u8>, Ino>, FsError> {
        match &self.inodes.get(&dir).ok_or(FsError::NotFound)?.body {
            Body::Dir { entries, .. } => Ok(entries),
            _ => Err(FsError::NotDir),
        }
    }

    /// The answer to request `seq` of exactly-once session `session`, if it
    /// is the last one the session had applied: sent again, it is answered
    /// so and changes nothing.
    pub fn recorded(&self, session: ClientId, seq: u64) -> Option<&Result<Answer, FsError>> {
        self.sessions
            .get(&session)
            .filter(|s| session != ClientId(0) && s.seq == seq)
            .map(|s| &s.result)
    }

    /// Applies one update.
    pub fn apply(&mut self, u: &Update) -> Applied {
        if u.session != ClientId(0)
            && let Some(s) = self.sessions.get(&u.session)
        {
            if u.seq == s.seq {
                return Applied::Duplicate(s.result.clone());
            }
            if u.seq < s.seq {
                return Applied::Duplicate(Err(FsError::Stale(
                    "a later request of this session was applied",
                )));
            }
        }
        self.index += 1;
        let result = self.apply_op(&u.who, u.now, &u.op, false);
        if u.session != ClientId(0) {
            self.remember(u.session, u.seq, result.clone());
        }
        Applied::New(result)
    }

    fn remember(&mut self, session: ClientId, seq: u64, result: Result<Answer, FsError>) {
        let index = self.index;
        if let Some(old) = self
            .sessions
            .insert(session, Session { seq, index, result })
        {
            self.lru.remove(&(old.index, session));
        }
        self.lru.insert((index, session));
        while self.sessions.len() > MAX_SESSIONS {
            let Some((_, s)) = self.lru.pop_first() else {
                break;
            };
            self.sessions.remove(&s);
        }
    }

    fn apply_op(
        &mut self,
        who: &Identity,
        now: Timestamp,
        op: &UpdateOp,
        in_push: bool,
    ) -> Result<Answer, FsError> {
        match op {
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
            } => self.create(
                who,
                now,
                *parent,
                name,
                (*kind, *perm, *rdev),
                *ino,
                *secret,
                target,
                *excl,
            ),
            UpdateOp::Link { ino, parent, name } => self.link(who, now, *ino, *parent, name),
            UpdateOp::Unlink {
                parent,
                name,
                dir,
                open,
            } => self.unlink(who, now, *parent, name, *dir, *open),
            UpdateOp::Rename {
                from,
                from_name,
                to,
                to_name,
                noreplace,
                open_victim,
            } => self.rename(
                who,
                now,
                (*from, from_name),
                (*to, to_name),
                *noreplace,
                *open_victim,
            ),
            UpdateOp::SetAttr { ino, set } => self.set_attr(who, now, *ino, set),
            UpdateOp::Commit {
                ino,
                base,
                content,
                size,
                held,
                mtime,
                flush,
            } => self.commit(now, *ino, *base, content, (*size, *held), *mtime, *flush),
            UpdateOp::Overlay { ino, offset, data } => self.overlay(who, now, *ino, *offset, data),
            UpdateOp::SetXattr {
                ino,
                name,
                value,
                mode,
            } => self.set_xattr(who, now, *ino, name, Some((value, *mode))),
            UpdateOp::RemoveXattr { ino, name } => self.set_xattr(who, now, *ino, name, None),
            UpdateOp::Revoke { ino, secret, set } => self.revoke(who, now, *ino, secret, set),
            UpdateOp::Forget { ino } => self.forget(*ino),
            UpdateOp::Range { count } => {
                if *count == 0 || *count > RANGE_MAX {
                    return Err(FsError::Invalid("an inode range is 1 to 2^20 numbers"));
                }
                let first = self.next_ino;
                self.next_ino = self.next_ino.plus(u64::from(*count));
                Ok(Answer::Range {
                    first,
                    count: *count,
                })
            }
            UpdateOp::Push { ops } => {
                if in_push {
                    return Err(FsError::Invalid("a push inside a push"));
                }
                Ok(Answer::Pushed(
                    ops.iter()
                        .map(|p| self.apply_op(&p.who, p.now, &p.op, true))
                        .collect(),
                ))
            }
        }
    }

    fn inode(&self, ino: Ino) -> Result<&Inode, FsError> {
        self.inodes.get(&ino).map(|i| &**i).ok_or(FsError::NotFound)
    }

    fn inode_mut(&mut self, ino: Ino) -> Result<&mut Inode, FsError> {
        self.inodes
            .get_mut(&ino)
            .map(|i| &mut **i)
            .ok_or(FsError::NotFound)
    }

    /// A directory that may gain or lose entries by `who`: it exists, is a
    /// directory still linked, and `who` may write and search it.
    fn writable_dir(&self, who: &Identity, dir: Ino) -> Result<&Inode, FsError> {
        let d = self.inode(dir)?;
        if d.attr.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        if d.attr.nlink == 0 {
            return Err(FsError::NotFound);
        }
        access::check(&d.attr, who, W | X)?;
        Ok(d)
    }

    fn entry(&self, dir: Ino, name: &[u8]) -> Option<Ino> {
        match &self.inodes.get(&dir)?.body {
            Body::Dir { entries, .. } => entries.get(name).copied(),
            _ => None,
        }
    }

    /// Changes a directory's entry (`None`: removes it) and sets its times.
    fn set_entry(&mut self, dir: Ino, name: &[u8], to: Option<Ino>, now: Timestamp) {
        let d = self.inodes.get_mut(&dir).expect("checked directory");
        if let Body::Dir { entries, .. } = &mut d.body {
            match to {
                Some(ino) => entries.insert(name.to_vec(), ino),
                None => entries.remove(name),
            };
        }
        d.attr.mtime = now;
        d.attr.ctime = now;
    }

    fn adjust_links(&mut self, ino: Ino, by: i64) {
        let a = &mut self.inodes.get_mut(&ino).expect("checked inode").attr;
        a.nlink = (i64::from(a.nlink) + by).max(0) as u32;
    }

    #[allow(clippy::too_many_arguments)]
    fn create(
        &mut self,
        who: &Identity,
        now: Timestamp,
        parent: Ino,
        name: &[u8],
        (kind, perm, rdev): (Kind, u16, u32),
        ino: Ino,
        secret: [u8; 16],
        target: &[u8],
        excl: bool,
    ) -> Result<Answer, FsError> {
        check_name(name)?;
        // Device nodes are root's to make, as mknod(2) is.
        if matches!(kind, Kind::CharDev | Kind::BlockDev) && !who.is_root() {
            return Err(FsError::Perm);
        }
        let p = self.writable_dir(who, parent)?.attr;
        if let Some(existing) = self.entry(parent, name) {
            let e = self.inode(existing)?;
            if excl || kind != Kind::File || e.attr.kind != Kind::File {
                return Err(FsError::Exists);
            }
            return Ok(Answer::Entry {
                attr: e.attr,
                existed: true,
            });
        }
        if ino <= ROOT || ino >= self.next_ino || self.inodes.contains_key(&ino) {
            return Err(FsError::Stale(
                "the inode number was not handed out, or is in use",
            ));
        }
        let body = match kind {
            Kind::Symlink => {
                if target.is_empty() {
                    return Err(FsError::NotFound);
                }
                if target.len() > SYMLINK_MAX {
                    return Err(FsError::NameTooLong);
                }
                Body::Symlink {
                    target: target.to_vec(),
                }
            }
            _ if !target.is_empty() => return Err(FsError::Invalid("only a symlink has a target")),
            Kind::Dir => {
                if p.nlink >= LINK_MAX {
                    return Err(FsError::TooManyLinks);
                }
                Body::Dir {
                    entries: BTreeMap::new(),
                    parent,
                }
            }
            Kind::File => Body::File {
                content: Vec::new(),
                overlay: Vec::new(),
            },
            _ => Body::Special,
        };
        let gid = if p.perm & S_ISGID != 0 {
            p.gid
        } else {
            who.gid
        };
        let mut perm = perm & 0o7777;
        if kind == Kind::Dir && p.perm & S_ISGID != 0 {
            perm |= S_ISGID;
        } else if kind != Kind::Dir && !who.is_root() && !who.in_group(gid) {
            perm &= !S_ISGID;
        }
        if kind == Kind::Symlink {
            perm = 0o777;
        }
        let attr = Attr {
            ino,
            kind,
            perm,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            uid: who.uid,
            gid,
            rdev: if matches!(kind, Kind::CharDev | Kind::BlockDev) {
                rdev
            } else {
                0
            },
            size: if kind == Kind::Symlink {
                target.len() as u64
            } else {
                0
            },
            held: 0,
            atime: now,
            mtime: now,
            ctime: now,
            version: 0,
        };
        self.inodes.insert(
            ino,
            Box::new(Inode {
                attr,
                secret,
                body,
                xattrs: BTreeMap::new(),
            }),
        );
        self.set_entry(parent, name, Some(ino), now);
        if kind == Kind::Dir {
            self.adjust_links(parent, 1);
        }
        Ok(Answer::Entry {
            attr,
            existed: false,
        })
    }

    fn link(
        &mut self,
        who: &Identity,
        now: Timestamp,
        ino: Ino,
        parent: Ino,
        name: &[u8],
    ) -> Result<Answer, FsError> {
        check_name(name)?;
        let a = self.inode(ino)?.attr;
        if a.kind == Kind::Dir {
            return Err(FsError::Perm);
        }
        if a.nlink == 0 {
            return Err(FsError::NotFound);
        }
        if a.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        self.writable_dir(who, parent)?;
        if self.entry(parent, name).is_some() {
            return Err(FsError::Exists);
        }
        self.set_entry(parent, name, Some(ino), now);
        self.adjust_links(ino, 1);
        let i = self.inode_mut(ino)?;
        i.attr.ctime = now;
        Ok(Answer::Entry {
            attr: i.attr,
            existed: false,
        })
    }

    /// Whether `who` may take `victim`'s name away from `dir` (its sticky
    /// bit), as an error.
    fn may_remove(&self, who: &Identity, dir: Ino, victim: Ino) -> Result<(), FsError> {
        let (d, v) = (self.inode(dir)?, self.inode(victim)?);
        if access::sticky_allows(&d.attr, &v.attr, who) {
            Ok(())
        } else {
            Err(FsError::Perm)
        }
    }

    /// Checks that `victim` may be replaced or removed by something that
    /// is (`dir`) or is not a directory.
    fn replaceable(&self, victim: Ino, dir: bool) -> Result<(), FsError> {
        let v = self.inode(victim)?;
        match (&v.body, dir) {
            (Body::Dir { entries, .. }, true) if entries.is_empty() => Ok(()),
            (Body::Dir { .. }, true) => Err(FsError::NotEmpty),
            (Body::Dir { .. }, false) => Err(FsError::IsDir),
            (_, true) => Err(FsError::NotDir),
            (_, false) => Ok(()),
        }
    }

    /// Takes one link from `ino` (a directory loses its last); an inode
    /// left without links goes unless it is `open`.
    fn drop_link(&mut self, ino: Ino, open: bool, now: Timestamp) -> Answer {
        let i = self.inodes.get_mut(&ino).expect("checked inode");
        i.attr.nlink = if i.attr.kind == Kind::Dir {
            0
        } else {
            i.attr.nlink.saturating_sub(1)
        };
        i.attr.ctime = now;
        if i.attr.nlink > 0 || open {
            return Answer::Removed {
                gone: None,
                content: Vec::new(),
            };
        }
        self.remove_inode(ino)
    }

    fn remove_inode(&mut self, ino: Ino) -> Answer {
        let content = match self.inodes.remove(&ino).map(|i| i.body) {
            Some(Body::File { content, .. }) => content,
            _ => Vec::new(),
        };
        Answer::Removed {
            gone: Some(ino),
            content,
        }
    }

    fn unlink(
        &mut self,
        who: &Identity,
        now: Timestamp,
        parent: Ino,
        name: &[u8],
        dir: bool,
        open: bool,
    ) -> Result<Answer, FsError> {
        if name == b"." {
            return Err(FsError::Invalid("cannot remove ."));
        }
        if name == b".." {
            return Err(FsError::NotEmpty);
        }
        check_name(name)?;
        self.writable_dir(who, parent)?;
        let victim = self.entry(parent, name).ok_or(FsError::NotFound)?;
        self.may_remove(who, parent, victim)?;
        self.replaceable(victim, dir)?;
        self.set_entry(parent, name, None, now);
        if dir {
            self.adjust_links(parent, -1);
        }
        Ok(self.drop_link(victim, open, now))
    }

    /// Whether `ino` is `dir` or inside it.
    fn within(&self, mut ino: Ino, dir: Ino) -> bool {
        loop {
            if ino == dir {
                return true;
            }
            match self.inodes.get(&ino).map(|i| &i.body) {
                Some(Body::Dir { parent, .. }) if *parent != ino => ino = *parent,
                _ => return false,
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn rename(
        &mut self,
        who: &Identity,
        now: Timestamp,
        (from, from_name): (Ino, &[u8]),
        (to, to_name): (Ino, &[u8]),
        noreplace: bool,
        open_victim: bool,
    ) -> Result<Answer, FsError> {
        for name in [from_name, to_name] {
            if name == b"." || name == b".." {
                return Err(FsError::Invalid("cannot rename . or .."));
            }
            check_name(name)?;
        }
        self.writable_dir(who, from)?;
        self.writable_dir(who, to)?;
        let src = self.entry(from, from_name).ok_or(FsError::NotFound)?;
        let unchanged = Answer::Removed {
            gone: None,
            content: Vec::new(),
        };
        if from == to && from_name == to_name {
            return Ok(unchanged);
        }
        self.may_remove(who, from, src)?;
        let is_dir = self.inode(src)?.attr.kind == Kind::Dir;
        if is_dir && from != to {
            if self.within(to, src) {
                return Err(FsError::Invalid("a directory cannot move into itself"));
            }
            // Its ".." changes: that is a write to it.
            access::check(&self.inode(src)?.attr, who, W)?;
        }
        let victim = self.entry(to, to_name);
        if let Some(v) = victim {
            if v == src {
                return Ok(unchanged);
            }
            if noreplace {
                return Err(FsError::Exists);
            }
            self.may_remove(who, to, v)?;
            self.replaceable(v, is_dir)?;
        } else if is_dir && from != to && self.inode(to)?.attr.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        self.set_entry(from, from_name, None, now);
        let gone = match victim {
            Some(v) => {
                if is_dir {
                    self.adjust_links(to, -1);
                }
                self.drop_link(v, open_victim, now)
            }
            None => unchanged,
        };
        self.set_entry(to, to_name, Some(src), now);
        if is_dir && from != to {
            self.adjust_links(from, -1);
            self.adjust_links(to, 1);
        }
        let s = self.inode_mut(src)?;
        s.attr.ctime = now;
        if let Body::Dir { parent, .. } = &mut s.body {
            *parent = to;
        }
        Ok(gone)
    }

    fn set_attr(
        &mut self,
        who: &Identity,
        now: Timestamp,
        ino: Ino,
        set: &SetAttr,
    ) -> Result<Answer, FsError> {
        let a = self.inode(ino)?.attr;
        let owner = access::owns(&a, who);
        if let Some(perm) = set.perm
            && !owner
        {
            // A writer may drop the set-id bits its write drops.
            if !access::drops_only_setid(&a, perm) {
                return Err(FsError::Perm);
            }
            access::check(&a, who, W)?;
        }
        if let Some(uid) = set.uid
            && uid != a.uid
            && !who.is_root()
        {
            return Err(FsError::Perm);
        }
        if let Some(gid) = set.gid
            && gid != a.gid
            && !(who.is_root() || (who.uid == a.uid && who.in_group(gid)))
        {
            return Err(FsError::Perm);
        }
        if let Some(size) = set.size {
            match a.kind {
                Kind::File => {}
                Kind::Dir => return Err(FsError::IsDir),
                _ => return Err(FsError::Invalid("only a regular file has a size to set")),
            }
            if !set.by_handle {
                access::check(&a, who, W)?;
            }
            if size > FILE_SIZE_MAX {
                return Err(FsError::FileTooBig);
            }
        }
        for t in [set.atime, set.mtime].into_iter().flatten() {
            match t {
                TimeSet::Now if !owner => access::check(&a, who, W)?,
                TimeSet::At(_) if !owner => return Err(FsError::Perm),
                _ => {}
            }
        }
        let i = self.inode_mut(ino)?;
        if let Some(perm) = set.perm {
            i.attr.perm = access::chmod_bits(&i.attr, who, perm);
        }
        if set.uid.is_some() || set.gid.is_some() {
            if set.perm.is_none() {
                i.attr.perm = access::after_chown(&i.attr);
            }
            i.attr.uid = set.uid.unwrap_or(i.attr.uid);
            i.attr.gid = set.gid.unwrap_or(i.attr.gid);
        }
        if let Some(size) = set.size.filter(|s| !set.grow || *s > i.attr.size) {
            i.attr.size = size;
            i.attr.held = i.attr.held.min(size);
            i.attr.version += 1;
            i.attr.mtime = now;
            if let Body::File { overlay, .. } = &mut i.body {
                overlay.push(OverlayEntry {
                    version: i.attr.version,
                    change: OverlayChange::Truncate { size },
                });
            }
        }
        let at = |t: TimeSet| match t {
            TimeSet::Now => now,
            TimeSet::At(t) => t,
        };
        if let Some(t) = set.atime {
            i.attr.atime = at(t);
        }
        if let Some(t) = set.mtime {
            i.attr.mtime = at(t);
        }
        i.attr.ctime = now;
        Ok(Answer::Attr(i.attr))
    }

    #[allow(clippy::too_many_arguments)]
    fn commit(
        &mut self,
        now: Timestamp,
        ino: Ino,
        base: u64,
        new: &[Capability],
        (size, held): (u64, u64),
        mtime: Timestamp,
        flush: bool,
    ) -> Result<Answer, FsError> {
        let i = self.inode_mut(ino)?;
        let Body::File { content, overlay } = &mut i.body else {
            return Err(if i.attr.kind == Kind::Dir {
                FsError::IsDir
            } else {
                FsError::Invalid("only a regular file has contents")
            });
        };
        if flush {
            if base > i.attr.version {
                return Err(FsError::Stale("the overlay flushed is newer than the file"));
            }
            overlay.retain(|e| e.version > base);
        } else {
            if base != i.attr.version || !overlay.is_empty() {
                return Err(FsError::Stale(
                    "the file changed since the writer's version",
                ));
            }
            if size > FILE_SIZE_MAX {
                return Err(FsError::FileTooBig);
            }
            i.attr.size = size;
            i.attr.held = held.min(size);
            i.attr.mtime = mtime;
            i.attr.ctime = now;
            i.attr.version += 1;
        }
        let old = std::mem::replace(content, new.to_vec());
        Ok(Answer::Committed { attr: i.attr, old })
    }

    fn set_xattr(
        &mut self,
        who: &Identity,
        now: Timestamp,
        ino: Ino,
        name: &[u8],
        value: Option<(&Vec<u8>, XattrMode)>,
    ) -> Result<Answer, FsError> {
        let a = self.inode(ino)?.attr;
        let user = name.starts_with(b"user.");
        if !(user || name.starts_with(b"trusted.")) {
            return Err(FsError::NotSupported);
        }
        if name.len() > XATTR_NAME_MAX || name.len() <= if user { 5 } else { 8 } {
            return Err(FsError::Range);
        }
        if name.starts_with(b"user.shoal.") {
            return Err(FsError::Perm);
        }
        if user {
            if !matches!(a.kind, Kind::File | Kind::Dir) {
                return Err(FsError::Perm);
            }
            access::check(&a, who, W)?;
        } else if !who.is_root() {
            return Err(FsError::Perm);
        }
        let i = self.inode_mut(ino)?;
        let exists = i.xattrs.contains_key(name);
        match value {
            Some((v, mode)) => {
                if v.len() > XATTR_VALUE_MAX {
                    return Err(FsError::TooBig);
                }
                match (mode, exists) {
                    (XattrMode::Create, true) => return Err(FsError::Exists),
                    (XattrMode::Replace, false) => return Err(FsError::NoData),
                    _ => {}
                }
                let total: usize = i
                    .xattrs
                    .iter()
                    .filter(|(n, _)| n.as_slice() != name)
                    .map(|(n, v)| n.len() + v.len())
                    .sum();
                if total + name.len() + v.len() > XATTR_TOTAL_MAX {
                    return Err(FsError::NoSpace);
                }
                i.xattrs.insert(name.to_vec(), v.clone());
            }
            None => {
                if i.xattrs.remove(name).is_none() {
                    return Err(FsError::NoData);
                }
            }
        }
        i.attr.ctime = now;
        Ok(Answer::Done)
    }

    /// [`UpdateOp::Revoke`].
    fn revoke(
        &mut self,
        who: &Identity,
        now: Timestamp,
        ino: Ino,
        secret: &[u8; 16],
        set: &Option<SetAttr>,
    ) -> Result<Answer, FsError> {
        let answer = match set {
            Some(set) => self.set_attr(who, now, ino, set)?,
            None => {
                if !access::owns(&self.inode(ino)?.attr, who) {
                    return Err(FsError::Perm);
                }
                self.inode_mut(ino)?.attr.ctime = now;
                Answer::Done
            }
        };
        self.inode_mut(ino)?.secret = *secret;
        Ok(answer)
    }

    fn forget(&mut self, ino: Ino) -> Result<Answer, FsError> {
        let nlink = self.inode(ino)?.attr.nlink;
        if nlink > 0 {
            return Ok(Answer::Done);
        }
        Ok(self.remove_inode(ino))
    }
}
