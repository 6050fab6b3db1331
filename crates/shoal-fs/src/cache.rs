//! What a mount may let the kernel keep (`docs/fs.md`, "Tokens" and "The
//! kernel side"): the token it holds on each inode, the content version a
//! file's cached pages belong to, and the names it handed the kernel with
//! a long entry timeout, so that a recall or a change notice knows what to
//! invalidate.
//!
//! The rules this keeps:
//! - the kernel keeps an inode's attributes, or a file's pages, only
//!   while the mount holds a token of at least `Read` on it (pages: of
//!   the version the token was granted at); a recall, a "stop caching"
//!   or a lost session invalidates them before it is answered;
//! - the kernel keeps a name only while the mount holds `Read` on its
//!   directory, and the name is recorded here, so that a notice of its
//!   change, or the directory's recall, invalidates it;
//! - a recall may arrive before the answer that made the grant it names
//!   (they travel apart): it waits here until that answer was seen, and
//!   a grant older than a recall already answered is taken as recalled;
//! - under `Write`, a file's writes (and truncations) stay here as dirty
//!   changes over its content version until they are written back
//!   (`writeback`); a recall takes the token only once none are left, and
//!   from its first step keeps no new change dirty, so a write either is
//!   dirty here and written back before the answer, or goes through the
//!   primary, which orders it after the answer.  Dirty changes outlive the token
//!   (a lost lease keeps them, to be written back if the file did not
//!   change meanwhile).

use std::time::Duration;

pub mod opens;

use crate::edits::Layout;
use crate::model::{Attr, Ino, Kind, Timestamp};
use crate::op::Grant;
use crate::tokens::Level;
use crate::tree::{OverlayChange, OverlayEntry, overlaid_window};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use shoal_cap::Capability;
use shoal_time::Time;

/// How long the kernel may keep what a token covers: until the mount
/// invalidates it.
pub const FOREVER: Duration = Duration::from_secs(24 * 3600);

/// What the mount holds of one inode.
#[derive(Debug, Default)]
struct Held {
    level: Option<Level>,
    dir: bool,
    /// The grant `level` came with.
    grant: u64,
    /// The highest grant number seen in an answer.
    seen: u64,
    /// The highest grant recalled, and to what.
    recalled: Option<(u64, Level)>,
    /// The version the content capabilities name (a file).
    version: u64,
    content: Option<Vec<Capability>>,
    /// The version of the pages the kernel may hold (`FOPEN_KEEP_CACHE`
    /// when an open finds it unchanged).
    pages: Option<u64>,
    /// Where the counts of changes stood before the request whose answer
    /// brought the attributes was sent, when that is known: the attributes
    /// may answer a `getattr` while they stand there ([`Cache::attr_held`]).
    attrs_at: Option<Stamp>,
    /// A recall of this grant (or a later one) to less than `Write` is
    /// being carried out: no change is kept dirty any more, so the
    /// write-back it waits for is the last (writes go through the
    /// primary, which orders them after the recall's answer).
    draining: Option<u64>,
}

impl Held {
    /// Whether changes may still be kept dirty under the token.
    fn takes_changes(&self) -> bool {
        self.level() == Level::Write && self.draining.is_none_or(|g| self.grant > g)
    }

    fn level(&self) -> Level {
        self.level.unwrap_or(Level::None)
    }
}

/// A recall to carry out: invalidate what the kernel keeps (when `inval`:
/// the inode's attributes and pages, and `names` in it), then answer.
#[derive(Debug)]
pub struct Recall {
    pub ino: Ino,
    pub to: Level,
    pub grant: u64,
    pub inval: bool,
    pub names: Vec<Vec<u8>>,
}

/// Write-backs made for a recall before it is answered without: they
/// fail only when the file servers or the primary do, for no change is
/// kept dirty while a recall is carried out.
pub const RECALL_TRIES: usize = 3;

/// What carrying out a recall needs next ([`Cache::recall_step`]).
#[derive(Debug)]
pub enum RecallStep {
    /// Answer: the token is taken.
    Answer(Recall),
    /// Write the file's dirty changes back first.
    WriteBack,
    /// Answer with dirty changes left (they are retried).
    GiveUp(Recall),
}

/// A file's cached content, for a read: its version and that version's
/// capabilities.
#[derive(Debug, Clone)]
pub struct Content {
    pub version: u64,
    pub content: Vec<Capability>,
    /// How many bytes the version holds.
    pub size: u64,
}

/// A file's changes not yet written back, over its content version.
#[derive(Debug)]
pub struct Dirty {
    /// The changes, and what they were made over: what a write-back
    /// takes ([`Cache::flush_job`]).
    pub work: FlushJob,
    /// When the oldest change was made, on the shell's clock.
    pub since: Time,
    pub bytes: u64,
    /// The leading changes a write-back under way took
    /// ([`Cache::flush_job`]): none of them is changed in place.
    pub frozen: usize,
}

/// A file's changes over `content`, version `version`: a dirty file's,
/// and a write-back's (a copy of them as they were when it began).
#[derive(Debug, Clone)]
pub struct FlushJob {
    /// The version the changes were made over, and its content.
    pub version: u64,
    pub content: Vec<Capability>,
    pub changes: Vec<OverlayEntry>,
    /// The content version's size, and the bytes of data it holds.
    pub base_size: u64,
    pub base_held: u64,
    pub size: u64,
    pub mtime: Timestamp,
}

/// A mount's cache state.
#[derive(Debug, Default)]
pub struct Cache {
    held: HashMap<Ino, Held>,
    /// Names handed to the kernel with a long timeout, by directory.
    names: HashMap<Ino, HashSet<Vec<u8>>>,
    /// Recalls of grants not seen yet.
    deferred: Vec<(Ino, Level, u64)>,
    /// The highest grant seen before the tokens were last all dropped: a
    /// recall of a grant up to it is carried out at once (the token is
    /// gone already, but the primary may not know it yet).
    dropped: u64,
    /// The attributes last heard from the primary.
    attrs: HashMap<Ino, Attr>,
    dirty: HashMap<Ino, Dirty>,
    /// The dirty bytes of all files (the sum of their `bytes`).
    dirty_bytes: u64,
    /// Bytes written into the cache, ever.
    written: u64,
    /// Files whose changes were lost and no `fsync` was told yet.
    lost: HashSet<Ino>,
    /// The mount's own changes through the primary, counted before each is
    /// sent and after its answer: a link, unlink or rename changes an
    /// inode's link count or times without taking the asker's token.
    changes: u64,
    /// Changes of names in one directory only (the mount's creates, and
    /// notices), by directory: they make no other inode's attributes
    /// stale.
    dir_changes: HashMap<Ino, u64>,
    /// Names the mount removed itself, by directory, with the grant on the
    /// directory it held then: absent until a notice names them, the mount
    /// makes them again, or the grant changes.
    absent: HashMap<(Ino, Vec<u8>), u64>,
}

/// Most names remembered as removed.
const ABSENT_MAX: usize = 4096;

/// The counts an inode's cached attributes were asked under: the mount's
/// changes that may touch any inode, and those of names in the inode
/// alone (a directory).
pub type Stamp = (u64, u64);

impl Cache {
    /// Where the counts that may make `ino`'s attributes stale stand.
    pub fn stamp(&self, ino: Ino) -> Stamp {
        (
            self.changes,
            self.dir_changes.get(&ino).copied().unwrap_or(0),
        )
    }

    /// Dirty changes that cannot be written back (the file went, or
    /// changed elsewhere): dropped; whether there were any.
    pub fn discard(&mut self, ino: Ino) -> bool {
        let gone = self.dirty.remove(&ino);
        self.dirty_bytes -= gone.as_ref().map_or(0, |d| d.bytes);
        gone.is_some()
    }
}

impl Cache {
    /// An answer granted `grant` on the inode `attr` describes: the
    /// attribute timeout the kernel gets.
    pub fn install(&mut self, attr: &Attr, grant: &Grant) -> Duration {
        let h = self.held.entry(attr.ino).or_default();
        h.dir = attr.kind == Kind::Dir;
        h.seen = h.seen.max(grant.grant);
        if grant.grant <= h.grant {
            // An older grant's answer, overtaken.
            return ttl(h.level());
        }
        let mut level = if grant.uncached {
            Level::None
        } else {
            grant.level
        };
        if let Some((g, to)) = h.recalled
            && grant.grant <= g
        {
            level = level.min(to);
        }
        h.level = Some(level);
        h.grant = grant.grant;
        if level == Level::None {
            h.content = None;
        }
        if attr.version < h.version {
            // Made before a version this mount has seen already (its own
            // write-back's commit, whose answer came first): the grant
            // holds, the attributes are older than those kept, and the
            // kernel keeps them no time.
            return Duration::ZERO;
        }
        if h.version != attr.version {
            h.version = attr.version;
            h.content = None;
        }
        h.attrs_at = None;
        self.attrs.insert(attr.ino, *attr);
        ttl(level)
    }

    /// An inode made in a private directory: this mount holds it as if
    /// granted `Write` (the push that makes it at the primary brings the
    /// grant); a file's content is empty.
    pub fn hold_local(&mut self, attr: &Attr) {
        let h = self.held.entry(attr.ino).or_default();
        h.dir = attr.kind == Kind::Dir;
        h.level = Some(Level::Write);
        h.version = attr.version;
        h.content = (attr.kind == Kind::File).then(Vec::new);
        h.attrs_at = None;
        self.attrs.insert(attr.ino, *attr);
    }

    /// A grant on directory `ino` seen in an answer that brought no
    /// attributes (a listing).
    pub fn saw(&mut self, ino: Ino, grant: u64) {
        let h = self.held.entry(ino).or_default();
        h.dir = true;
        h.seen = h.seen.max(grant);
    }

    /// A change through the primary that may change inodes the mount does
    /// not know (a link, unlink or rename: a link count, a ctime) is about
    /// to be sent, or was answered.
    pub fn count_change(&mut self) {
        self.changes += 1;
    }

    /// A change of names in `dir` alone (a create of the mount's, about to
    /// be sent or answered, or another mount's change, noticed).
    pub fn count_dir(&mut self, dir: Ino) {
        *self.dir_changes.entry(dir).or_default() += 1;
    }

    /// The attributes last installed for `ino` came from a request sent
    /// when the counts stood at `stamp`.
    pub fn attrs_asked_at(&mut self, ino: Ino, stamp: Stamp) {
        if let Some(h) = self.held.get_mut(&ino) {
            h.attrs_at = Some(stamp);
        }
    }

    /// The mount removed `name` from `dir` itself; the counts stood at
    /// `before` when it asked: if only its own change moved them since
    /// (counted twice), no notice of that name came in between.
    pub fn removed(&mut self, dir: Ino, name: &[u8], before: Stamp) {
        if self.stamp(dir) != (before.0 + 2, before.1) {
            return;
        }
        let Some(grant) = self
            .held
            .get(&dir)
            .filter(|h| h.dir && h.level() >= Level::Read)
            .map(|h| h.grant)
        else {
            return;
        };
        if self.absent.len() >= ABSENT_MAX {
            self.absent.clear();
        }
        self.absent.insert((dir, name.to_vec()), grant);
    }

    /// Another mount changed `name` of `dir` (a notice): counted for the
    /// directory, and the name no longer known to be absent, under one
    /// lock.
    pub fn noticed(&mut self, dir: Ino, name: &[u8]) {
        *self.dir_changes.entry(dir).or_default() += 1;
        self.absent.remove(&(dir, name.to_vec()));
    }

    /// The mount is about to make `name` in `dir`: no longer known to be
    /// absent.
    pub fn making(&mut self, dir: Ino, name: &[u8]) {
        self.absent.remove(&(dir, name.to_vec()));
    }

    /// Whether `name` is known to be absent from `dir`: the mount removed
    /// it and has held `Read` on `dir` since, under the same grant, and
    /// neither a notice named it (another mount's create there sends one
    /// first) nor did the mount make it again.  A temporary file's name is
    /// then looked up without asking.
    pub fn known_absent(&self, dir: Ino, name: &[u8]) -> bool {
        let Some(grant) = self.absent.get(&(dir, name.to_vec())) else {
            return false;
        };
        self.held
            .get(&dir)
            .is_some_and(|h| h.dir && h.level() >= Level::Read && h.grant == *grant)
    }

    /// The attributes a change of the mount's own left the directories it
    /// changed names in (read by the primary right after it): kept for
    /// those the mount holds a token on, to answer `getattr` until the
    /// next change, own or noticed ([`Cache::attr_held`]), if the counts
    /// of each stand where the change alone left them (`expected`).
    pub fn dirs_changed(&mut self, dirs: &[Attr], expected: &[(Ino, Stamp)]) {
        for attr in dirs {
            let stamp = self.stamp(attr.ino);
            if !expected.contains(&(attr.ino, stamp)) {
                continue;
            }
            let Some(h) = self.held.get_mut(&attr.ino) else {
                continue;
            };
            if !h.dir || h.level() < Level::Read {
                continue;
            }
            h.version = attr.version;
            h.attrs_at = Some(stamp);
            self.attrs.insert(attr.ino, *attr);
        }
    }

    /// An open's answer: the grant, and the content of the version it
    /// was made at.  Returns whether the open may use the kernel's
    /// pages, and whether those pages are of this version already.
    pub fn opened(&mut self, attr: &Attr, grant: &Grant, content: Vec<Capability>) -> Open {
        self.install(attr, grant);
        let h = self.held.get_mut(&attr.ino).expect("installed");
        if h.level() == Level::None || h.version != attr.version {
            return Open::Direct;
        }
        h.content = Some(content);
        let keep = h.pages == Some(attr.version);
        h.pages = Some(attr.version);
        Open::Cached { keep }
    }

    /// An open for reading that the mount's token allows without asking
    /// the primary.
    pub fn open_cached(&mut self, ino: Ino) -> Option<Open> {
        let h = self.held.get_mut(&ino)?;
        if h.level() < Level::Read || h.content.is_none() {
            return None;
        }
        let keep = h.pages == Some(h.version);
        h.pages = Some(h.version);
        Some(Open::Cached { keep })
    }

    /// Where a read of a file the mount holds can be served from: its
    /// content version on the file servers (finished by
    /// [`Cache::finish_read`]).
    pub fn content(&self, ino: Ino) -> Option<Content> {
        let h = self.held.get(&ino)?;
        if h.level() < Level::Read {
            return None;
        }
        Some(Content {
            version: h.version,
            content: h.content.clone()?,
            size: self.attrs.get(&ino)?.size,
        })
    }

    /// Where a file the mount holds has data: its content version's
    /// replicas (whose map tells where the version has data) and what the
    /// dirty changes made of it (`lseek`'s `SEEK_DATA` and `SEEK_HOLE`).
    pub fn layout(&self, ino: Ino) -> Option<(Vec<Capability>, Layout)> {
        let c = self.content(ino)?;
        Some(match self.dirty.get(&ino) {
            Some(d) if d.work.version == c.version => (
                d.work.content.clone(),
                Layout::of(d.work.base_size, &d.work.changes, d.work.size),
            ),
            _ => (c.content, Layout::of(c.size, &[], c.size)),
        })
    }

    /// A window read from content version `version` (`base`: what the
    /// file servers had from `offset`), with the dirty changes made and
    /// cut to the size; `None` if the version moved on meanwhile.
    pub fn finish_read(
        &self,
        ino: Ino,
        version: u64,
        offset: u64,
        len: usize,
        base: &[u8],
    ) -> Option<Vec<u8>> {
        let h = self.held.get(&ino)?;
        if h.version != version {
            return None;
        }
        Some(match self.dirty.get(&ino) {
            Some(d) if d.work.version == version => {
                overlaid_window(base, offset, len, &d.work.changes, d.work.size)
            }
            Some(_) => return None,
            None => overlaid_window(base, offset, len, &[], self.attrs.get(&ino)?.size),
        })
    }

    /// The attributes as this mount sees them: the primary's, with the
    /// size and time of changes not yet written back, if they were made
    /// over the version the primary gave (changes over an older one, kept
    /// through a lost lease, are not the file's: another node changed it
    /// since, and they cannot be written back).
    pub fn patch(&self, attr: &mut Attr) {
        patch_dirty(&self.dirty, attr);
    }

    /// The attributes of an inode the mount holds a token on (as the
    /// answer that granted it gave them, with the mount's dirty changes
    /// made), and how long the kernel may keep them: what a `getattr`
    /// would get from the primary, whose changes to them for other mounts
    /// recall the token first.  Only while the mount made no change of its
    /// own since the request that brought them was sent (its link, unlink
    /// or rename changes a link count or times and leaves its token), and
    /// received no notice since (another mount's change of a directory's
    /// names, which leaves the directory's `Read` token).
    pub fn attr_held(&self, ino: Ino) -> Option<(Attr, Duration)> {
        let h = self.held.get(&ino)?;
        if h.level() < Level::Read || h.attrs_at != Some(self.stamp(ino)) {
            return None;
        }
        let mut attr = *self.attrs.get(&ino)?;
        if attr.version != h.version {
            return None;
        }
        patch_dirty(&self.dirty, &mut attr);
        Some((attr, ttl(h.level())))
    }

    /// A write under `Write`, made at `now` (at `at` on the shell's
    /// clock): kept dirty.  `None` (go through the primary) without the
    /// token; else the offset written at (the end, for an append).
    pub fn write(
        &mut self,
        ino: Ino,
        offset: Option<u64>,
        data: &[u8],
        (now, at): (Timestamp, Time),
    ) -> Option<u64> {
        self.change(ino, (now, at), |size| {
            let at = offset.unwrap_or(size);
            (
                OverlayChange::Write {
                    offset: at,
                    data: data.to_vec(),
                },
                size.max(at + data.len() as u64),
                at,
            )
        })
    }

    /// A truncation under `Write`: kept dirty; the new attributes, or
    /// `None` without the token.
    pub fn truncate(&mut self, ino: Ino, size: u64, when: (Timestamp, Time)) -> Option<Attr> {
        self.change(ino, when, |_| {
            (OverlayChange::Truncate { size }, size, size)
        })?;
        let mut attr = *self.attrs.get(&ino)?;
        self.patch(&mut attr);
        Some(attr)
    }

    /// A setting of a dirty file's modification time under `Write`
    /// (`utimensat`): one more dirty change (a truncation to its size,
    /// which changes no byte), whose write-back sets it; the attributes
    /// then, or `None` if the file is not dirty here.
    pub fn touch(&mut self, ino: Ino, when: (Timestamp, Time)) -> Option<Attr> {
        let size = self.dirty.get(&ino)?.work.size;
        self.truncate(ino, size, when)
    }

    /// A growth to `size` under `Write` (`fallocate`): a truncation
    /// upwards if the file is shorter, nothing if not; the attributes
    /// then, or `None` without the token.
    pub fn grow(&mut self, ino: Ino, size: u64, when: (Timestamp, Time)) -> Option<Attr> {
        let h = self.held.get(&ino)?;
        if !h.takes_changes() || h.content.is_none() {
            return None;
        }
        let mut attr = *self.attrs.get(&ino)?;
        self.patch(&mut attr);
        if attr.size >= size {
            return Some(attr);
        }
        self.truncate(ino, size, when)
    }

    fn change(
        &mut self,
        ino: Ino,
        (now, at): (Timestamp, Time),
        make: impl FnOnce(u64) -> (OverlayChange, u64, u64),
    ) -> Option<u64> {
        let h = self.held.get(&ino)?;
        if !h.takes_changes() || h.content.is_none() {
            return None;
        }
        let version = h.version;
        let content = h.content.clone().unwrap_or_default();
        let base = self.attrs.get(&ino)?;
        let (base, base_held) = (base.size, base.held);
        let d = self.dirty.entry(ino).or_insert_with(|| Dirty {
            work: FlushJob {
                version,
                content,
                changes: Vec::new(),
                base_size: base,
                base_held,
                size: base,
                mtime: now,
            },
            since: at,
            bytes: 0,
            frozen: 0,
        });
        if d.work.version != version {
            return None;
        }
        let (change, size, at) = make(d.work.size);
        let open = d.work.changes.len() > d.frozen;
        let merged = match (&change, d.work.changes.last_mut()) {
            (OverlayChange::Write { offset, data }, Some(last)) if open => {
                self.written += data.len() as u64;
                merge_write(&mut last.change, *offset, data)
            }
            (OverlayChange::Write { data, .. }, _) => {
                self.written += data.len() as u64;
                None
            }
            _ => None,
        };
        match (merged, &change) {
            (Some(grew), _) => {
                d.bytes += grew;
                self.dirty_bytes += grew;
            }
            (None, OverlayChange::Write { data, .. }) => {
                d.bytes += data.len() as u64;
                self.dirty_bytes += data.len() as u64;
                d.work.changes.push(OverlayEntry { version, change });
            }
            (None, _) => d.work.changes.push(OverlayEntry { version, change }),
        }
        d.work.size = size;
        d.work.mtime = now;
        Some(at)
    }

    /// The attributes the mount was last given for `ino`, if any (without
    /// its dirty changes).
    pub fn attr(&self, ino: Ino) -> Option<Attr> {
        self.attrs.get(&ino).copied()
    }

    /// Whether the mount holds `Write` on `ino`.
    pub fn holds_write(&self, ino: Ino) -> bool {
        self.held
            .get(&ino)
            .is_some_and(|h| h.level() == Level::Write)
    }

    /// Whether `ino` has changes not yet written back.
    pub fn is_dirty(&self, ino: Ino) -> bool {
        self.dirty.contains_key(&ino)
    }

    /// Dirty bytes waiting, in all files.
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes
    }

    /// Dirty bytes waiting, and bytes written into the cache ever.
    pub fn dirty_and_written(&self) -> (u64, u64) {
        (self.dirty_bytes, self.written)
    }

    /// Files whose oldest dirty change is `age` old or older at `now`
    /// (on the shell's clock).
    pub fn due(&self, now: Time, age: Duration) -> Vec<Ino> {
        self.dirty
            .iter()
            .filter(|(_, d)| now.saturating_since(d.since) >= age)
            .map(|(i, _)| *i)
            .collect()
    }

    /// Every file with dirty changes.
    pub fn all_dirty(&self) -> Vec<Ino> {
        self.dirty.keys().copied().collect()
    }

    /// Every file with dirty changes, and the version they were made over.
    pub fn dirty_versions(&self) -> Vec<(Ino, u64)> {
        self.dirty
            .iter()
            .map(|(i, d)| (*i, d.work.version))
            .collect()
    }

    /// A token reclaimed at a new primary, installed as granted.  A file
    /// whose dirty changes were made over the version it was granted at
    /// gets its content back, so its reads and writes go on through the
    /// mount as before the primary changed.
    pub fn reclaimed(&mut self, attr: &Attr, grant: &Grant) {
        self.install(attr, grant);
        if let (Some(h), Some(d)) = (self.held.get_mut(&attr.ino), self.dirty.get(&attr.ino))
            && h.level() == Level::Write
            && d.work.version == attr.version
        {
            h.content = Some(d.work.content.clone());
        }
    }

    /// What writing `ino` back means now, if it has dirty changes.  Its
    /// changes are not changed in place until it is [`Cache::flushed`].
    pub fn flush_job(&mut self, ino: Ino) -> Option<FlushJob> {
        let d = self.dirty.get_mut(&ino)?;
        d.frozen = d.work.changes.len();
        Some(d.work.clone())
    }

    /// A write-back committed: the file is version `attr.version`, stored
    /// as `content`; the job's changes are in it.  Changes made since
    /// wait from `at` (the shell's clock).
    pub fn flushed(&mut self, job: &FlushJob, attr: &Attr, content: Vec<Capability>, at: Time) {
        if let Some(d) = self.dirty.get_mut(&attr.ino) {
            let done = job.changes.len().min(d.work.changes.len());
            d.work.changes.drain(..done);
            d.frozen = d.frozen.saturating_sub(done);
            d.work.version = attr.version;
            d.work.content = content.clone();
            d.work.base_size = job.size;
            d.work.base_held = attr.held;
            for c in &mut d.work.changes {
                c.version = attr.version;
            }
            let left = d
                .work
                .changes
                .iter()
                .map(|c| match &c.change {
                    OverlayChange::Write { data, .. } => data.len() as u64,
                    OverlayChange::Truncate { .. } => 0,
                })
                .sum();
            self.dirty_bytes -= d.bytes - left;
            d.bytes = left;
            d.since = at;
            if d.work.changes.is_empty() {
                self.dirty.remove(&attr.ino);
            }
        }
        let mut base = *attr;
        // The committed attributes are the job's; later changes patch them.
        base.size = job.size;
        self.attrs.insert(attr.ino, base);
        if let Some(h) = self.held.get_mut(&attr.ino) {
            let current = h.pages == Some(h.version);
            h.version = attr.version;
            h.content = Some(content);
            h.pages = current.then_some(attr.version);
        }
    }

    /// Dirty changes that could not be written back because the file
    /// changed elsewhere: dropped, and remembered until the next `fsync`
    /// of the file asks ([`Cache::take_lost`]).
    pub fn lose(&mut self, ino: Ino) {
        self.discard(ino);
        self.lost.insert(ino);
    }

    /// Whether changes to `ino` were lost since the last time this was
    /// asked.
    pub fn take_lost(&mut self, ino: Ino) -> bool {
        self.lost.remove(&ino)
    }

    /// Whether the kernel may keep name `name` of `parent`: then it is
    /// recorded, to be invalidated when it changes.
    pub fn entry_ttl(&mut self, parent: Ino, name: &[u8]) -> Duration {
        if self
            .held
            .get(&parent)
            .is_none_or(|h| h.level() < Level::Read)
        {
            return Duration::ZERO;
        }
        self.names.entry(parent).or_default().insert(name.to_vec());
        FOREVER
    }

    /// Records a name the kernel holds whatever its timeout (the target
    /// of this mount's own rename keeps the moved entry's).
    pub fn kernel_has(&mut self, parent: Ino, name: &[u8]) {
        self.names.entry(parent).or_default().insert(name.to_vec());
    }

    /// Drops the tokens of `inos` (not their unwritten changes): the names
    /// recorded in those of them that are directories, which the kernel
    /// must forget.
    pub fn forget_held(&mut self, inos: &[Ino]) -> Vec<(Ino, Vec<u8>)> {
        let mut names = Vec::new();
        for ino in inos {
            self.held.remove(ino);
            self.attrs.remove(ino);
            if let Some(set) = self.names.remove(ino) {
                names.extend(set.into_iter().map(|n| (*ino, n)));
            }
        }
        names
    }

    /// Forgets everything of `ino`, which the primary forgot with its last
    /// name: its token, attributes and unwritten changes.
    pub fn forget(&mut self, ino: Ino) {
        self.discard(ino);
        self.held.remove(&ino);
        self.attrs.remove(&ino);
    }

    /// The mount changed `ino` itself (written through the primary, or
    /// changed its attributes): the primary took its token, and the
    /// kernel's copy must go.
    pub fn drop_token(&mut self, ino: Ino) {
        if let Some(h) = self.held.get_mut(&ino) {
            h.level = Some(Level::None);
            h.content = None;
            h.pages = None;
        }
    }

    /// A recall from the primary: to carry out now (`take` it once the
    /// file's dirty changes are written back), or nothing while the grant
    /// it names has not been seen.
    pub fn recall(&mut self, ino: Ino, to: Level, grant: u64) -> Option<(Ino, Level, u64)> {
        let seen = self.held.get(&ino).map_or(0, |h| h.seen).max(self.dropped);
        if seen < grant {
            self.deferred.push((ino, to, grant));
            return None;
        }
        Some((ino, to, grant))
    }

    /// The next step of carrying out a recall, after `tries` write-backs
    /// made for it: the token taken (when no dirty changes of the file
    /// are left), or a write-back to make first, or, after
    /// [`RECALL_TRIES`], the token taken with the changes left.
    ///
    /// From the first step on, the file's changes are no longer kept
    /// dirty: a program writing all the while cannot keep the write-back
    /// from catching up, and each write either is in it or, through the
    /// primary, follows the answer.
    pub fn recall_step(&mut self, ino: Ino, to: Level, grant: u64, tries: usize) -> RecallStep {
        if to == Level::Write || !self.dirty.contains_key(&ino) {
            return RecallStep::Answer(self.take_from(ino, to, grant));
        }
        if let Some(h) = self.held.get_mut(&ino)
            && h.grant <= grant
        {
            h.draining = Some(grant);
        }
        if tries < RECALL_TRIES {
            return RecallStep::WriteBack;
        }
        RecallStep::GiveUp(self.take_from(ino, to, grant))
    }

    /// Recalls whose grants have been seen since they came.
    pub fn ready(&mut self) -> Vec<(Ino, Level, u64)> {
        if self.deferred.is_empty() {
            return Vec::new();
        }
        let dropped = self.dropped;
        let (ready, still): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|(ino, _, g)| {
                *g <= dropped || self.held.get(ino).is_some_and(|h| h.seen >= *g)
            });
        self.deferred = still;
        ready
    }

    fn take_from(&mut self, ino: Ino, to: Level, grant: u64) -> Recall {
        let h = self.held.entry(ino).or_default();
        let strongest = match h.recalled {
            Some((g, l)) if g == grant => l.min(to),
            _ => to,
        };
        h.recalled = Some((grant.max(h.recalled.map_or(0, |r| r.0)), strongest));
        if h.grant <= grant && h.level() > to {
            h.level = Some(to);
        }
        let mut names = Vec::new();
        if to == Level::None {
            h.content = None;
            h.pages = None;
            if h.dir {
                names = self
                    .names
                    .remove(&ino)
                    .map(|s| s.into_iter().collect())
                    .unwrap_or_default();
            }
        }
        Recall {
            ino,
            to,
            grant,
            inval: to == Level::None,
            names,
        }
    }

    /// "Stop caching" for a file granted no later than `grant`: whether
    /// the kernel's copy must go.
    pub fn stop_caching(&mut self, ino: Ino, grant: u64) -> bool {
        let Some(h) = self.held.get_mut(&ino) else {
            return false;
        };
        if h.grant > grant {
            return false;
        }
        h.level = Some(Level::None);
        h.content = None;
        h.pages = None;
        true
    }

    /// A notice that name `name` of `dir` changed: whether the kernel may
    /// hold it (then it must be invalidated).
    pub fn notice(&mut self, dir: Ino, name: &[u8]) -> bool {
        self.names.get_mut(&dir).is_some_and(|s| s.remove(name))
    }

    /// The session ended (its lease, or the primary changed): every token
    /// is gone (dirty changes stay).  Returns what the kernel may hold: inodes, and names by
    /// directory.
    #[allow(clippy::type_complexity)]
    pub fn drop_all(&mut self) -> (Vec<Ino>, Vec<(Ino, Vec<Vec<u8>>)>) {
        self.absent.clear();
        let inodes = self
            .held
            .iter()
            .filter(|(_, h)| h.level() > Level::None || h.pages.is_some())
            .map(|(i, _)| *i)
            .collect();
        let seen = self.held.values().map(|h| h.seen).max().unwrap_or(0);
        self.dropped = self.dropped.max(seen);
        self.held.clear();
        self.deferred.clear();
        let names = self
            .names
            .drain()
            .map(|(d, s)| (d, s.into_iter().collect()))
            .collect();
        (inodes, names)
    }
}

/// How an open may use the kernel's page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    /// Not at all (`FOPEN_DIRECT_IO`).
    Direct,
    /// Through the page cache; `keep`: the pages it has are current.
    Cached { keep: bool },
}

/// Writes `data` at `offset` into `last`, the latest change of a file, if
/// that is a write whose bytes `data`'s overlap: the one change then makes
/// what the two made one after the other.  How many bytes it grew by, or
/// `None` if it is not such a write.  (Writes that only follow one
/// another stay apart: merging them would copy a growing buffer at each,
/// and a read of them copies each byte once already.)
fn merge_write(last: &mut OverlayChange, offset: u64, data: &[u8]) -> Option<u64> {
    let OverlayChange::Write {
        offset: lo,
        data: bytes,
    } = last
    else {
        return None;
    };
    let (end, new_end) = (*lo + bytes.len() as u64, offset + data.len() as u64);
    if offset >= end || new_end <= *lo {
        return None;
    }
    let before = bytes.len() as u64;
    let (from, to) = ((*lo).min(offset), end.max(new_end));
    if from < *lo {
        let mut grown = vec![0u8; (to - from) as usize];
        let at = (*lo - from) as usize;
        grown[at..at + bytes.len()].copy_from_slice(bytes);
        *bytes = grown;
        *lo = from;
    } else if to > end {
        bytes.resize((to - from) as usize, 0);
    }
    let at = (offset - from) as usize;
    bytes[at..at + data.len()].copy_from_slice(data);
    Some(bytes.len() as u64 - before)
}

/// `attr` with the dirty changes made over its version.
fn patch_dirty(dirty: &HashMap<Ino, Dirty>, attr: &mut Attr) {
    if let Some(d) = dirty.get(&attr.ino)
        && d.work.version == attr.version
    {
        attr.size = d.work.size;
        // At most: a write over data the file holds counts again.
        attr.held = (attr.held + d.bytes).min(d.work.size);
        attr.mtime = d.work.mtime;
        attr.ctime = attr.ctime.max(d.work.mtime);
    }
}

fn ttl(level: Level) -> Duration {
    if level >= Level::Read {
        FOREVER
    } else {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests;
