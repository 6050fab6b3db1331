//! A client's cache of regular files (`docs/fs.md`, "Tokens" and
//! "Delayed write"), without I/O: for each file, the token the client
//! holds, the version its clean copy belongs to, its dirty copy, its opens
//! and whether the primary knows them, and whether the file is
//! write-shared (uncached).  The shell (the FUSE client, or the simulator)
//! asks it what each operation needs: an answer from the cache, or a
//! request to the primary.
//!
//! This first version keeps a file's bytes whole in memory; the FUSE
//! client will keep ranges (and leave clean pages to the kernel), behind
//! the same decisions.

use std::collections::BTreeMap;

use crate::model::Ino;
use std::collections::BTreeSet;

use crate::tokens::{Decision, Level, OpenId, Opens, Want};

/// One file as the client holds it.
#[derive(Debug, Clone, Default)]
pub struct CachedFile {
    pub level: Option<Level>,
    /// The number of the primary's latest grant to this client on the
    /// file.
    pub grant: u64,
    /// The version `clean` belongs to.
    pub version: u64,
    /// The file's bytes at `version`, when cached.
    pub clean: Option<Vec<u8>>,
    /// The bytes with this client's writes not yet written back.
    pub dirty: Option<Vec<u8>>,
    /// When the oldest of those writes was made.
    pub dirty_since: u64,
    /// The client's opens of the file: for writing or not.
    pub opens: BTreeMap<OpenId, bool>,
    /// The opens the primary knows of, or may (made uncached, reported in
    /// an answer to a recall, listed in a request under way): their
    /// closes are sent.
    pub known: BTreeSet<OpenId>,
    /// Opens listed in a request under way that were not known before it.
    pending: Vec<OpenId>,
    /// Write-shared: reads and writes go to the primary.
    pub uncached: bool,
    /// A recall to answer: the level asked and the grant recalled.
    pub recall: Option<(Level, u64)>,
}

impl CachedFile {
    fn level(&self) -> Level {
        self.level.unwrap_or(Level::None)
    }
}

/// What an operation needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<T> {
    /// Done in the cache.
    Local(T),
    /// Needs the primary.
    Primary,
}

/// A client's answer to a recall: the grant recalled, the level it keeps
/// and its opens of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecallAnswer {
    pub grant: u64,
    pub kept: Level,
    pub opens: Vec<(OpenId, bool)>,
}

/// Dirty bytes to write back: the file's new contents, made from version
/// `base`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteBack {
    pub ino: Ino,
    pub base: u64,
    pub data: Vec<u8>,
}

/// A client's cache of files.
#[derive(Debug, Default)]
pub struct ClientCache {
    files: BTreeMap<Ino, CachedFile>,
    /// How long dirty bytes wait before they are written back.
    delay: u64,
    /// The last open's number.
    next_open: OpenId,
}

impl CachedFile {
    /// The counts of the client's opens.
    pub fn counts(&self) -> Opens {
        Opens::count(self.opens.values().copied())
    }

    fn list(&self) -> Vec<(OpenId, bool)> {
        self.opens.iter().map(|(id, w)| (*id, *w)).collect()
    }
}

impl ClientCache {
    /// A cache writing dirty bytes back `delay` after their first write
    /// (on the shell's clock).
    pub fn new(delay: u64) -> ClientCache {
        ClientCache {
            files: BTreeMap::new(),
            delay,
            next_open: 0,
        }
    }

    /// The file, as cached.
    pub fn file(&self, ino: Ino) -> Option<&CachedFile> {
        self.files.get(&ino)
    }

    /// An open: done in the cache when the token allows it (its number),
    /// else it needs the primary ([`ClientCache::open_request`]).
    pub fn open(&mut self, ino: Ino, write: bool) -> Step<OpenId> {
        let f = self.files.entry(ino).or_default();
        let enough = if write { Level::Write } else { Level::Read };
        if !f.uncached && f.level() >= enough {
            self.next_open += 1;
            f.opens.insert(self.next_open, write);
            return Step::Local(self.next_open);
        }
        Step::Primary
    }

    /// The request an open that needs the primary sends: what it wants,
    /// the opens the client has of the file already, and the new open's
    /// number.
    pub fn open_request(&mut self, ino: Ino, write: bool) -> (Want, Vec<(OpenId, bool)>, OpenId) {
        self.next_open += 1;
        let id = self.next_open;
        let f = self.files.entry(ino).or_default();
        let want = if write {
            Want::OpenWrite
        } else {
            Want::OpenRead
        };
        let have = f.list();
        for (o, _) in &have {
            if f.known.insert(*o) {
                f.pending.push(*o);
            }
        }
        f.known.insert(id);
        f.pending.push(id);
        (want, have, id)
    }

    /// The primary granted an open: `version` and, when cached, the bytes
    /// of that version (`None` when the cached copy is that version
    /// already, or the open is uncached).
    #[allow(clippy::too_many_arguments)]
    pub fn opened(
        &mut self,
        ino: Ino,
        id: OpenId,
        write: bool,
        decision: &Decision,
        version: u64,
        bytes: Option<Vec<u8>>,
    ) {
        let f = self.files.entry(ino).or_default();
        f.opens.insert(id, write);
        let pending = std::mem::take(&mut f.pending);
        let Decision::Grant {
            level,
            uncached,
            grant,
        } = decision
        else {
            return;
        };
        f.grant = f.grant.max(*grant);
        if *uncached {
            // The primary learned them all.
            f.uncached = true;
            f.level = Some(Level::None);
            f.clean = None;
            return;
        }
        // A cached grant: the primary learned none of them.
        for o in pending {
            f.known.remove(&o);
        }
        f.uncached = false;
        f.level = Some(*level);
        if f.version != version || f.clean.is_none() {
            f.version = version;
            f.clean = bytes;
        }
    }

    /// The version the cached copy of `ino` is, if any (an open sends
    /// it, so the primary need not send the bytes again).
    pub fn cached_version(&self, ino: Ino) -> Option<u64> {
        self.files
            .get(&ino)
            .filter(|f| f.clean.is_some())
            .map(|f| f.version)
    }

    /// A read of the whole file: from the cache, or from the primary.
    pub fn read(&self, ino: Ino) -> Step<Vec<u8>> {
        match self.files.get(&ino) {
            Some(f) if !f.uncached && f.level() >= Level::Read => {
                match f.dirty.as_ref().or(f.clean.as_ref()) {
                    Some(b) => Step::Local(b.clone()),
                    None => Step::Primary,
                }
            }
            _ => Step::Primary,
        }
    }

    /// A write: into the dirty copy when the client holds `Write`, else
    /// to the primary.
    pub fn write(&mut self, ino: Ino, offset: usize, data: &[u8], now: u64) -> Step<()> {
        let Some(f) = self.files.get_mut(&ino) else {
            return Step::Primary;
        };
        if f.uncached || f.level() < Level::Write {
            return Step::Primary;
        }
        let d = match &mut f.dirty {
            Some(d) => d,
            None => {
                f.dirty_since = now;
                f.dirty.insert(f.clean.clone().unwrap_or_default())
            }
        };
        if d.len() < offset + data.len() {
            d.resize(offset + data.len(), 0);
        }
        d[offset..offset + data.len()].copy_from_slice(data);
        Step::Local(())
    }

    /// A close of open `id`; true if the primary must hear of it.
    pub fn close(&mut self, ino: Ino, id: OpenId) -> bool {
        let Some(f) = self.files.get_mut(&ino) else {
            return false;
        };
        f.opens.remove(&id);
        f.known.remove(&id)
    }

    /// What a write-back of `ino` sends now, if it has dirty bytes.
    pub fn write_back(&self, ino: Ino) -> Option<WriteBack> {
        let f = self.files.get(&ino)?;
        Some(WriteBack {
            ino,
            base: f.version,
            data: f.dirty.clone()?,
        })
    }

    /// The files whose dirty bytes are due at `now`.
    pub fn due(&self, now: u64) -> Vec<Ino> {
        self.files
            .iter()
            .filter(|(_, f)| f.dirty.is_some() && now.saturating_sub(f.dirty_since) >= self.delay)
            .map(|(ino, _)| *ino)
            .collect()
    }

    /// A write-back of `wb` became version `version`.  Writes made while
    /// it was under way stay dirty, now on top of that version.
    pub fn written_back(&mut self, wb: &WriteBack, version: u64) {
        let Some(f) = self.files.get_mut(&wb.ino) else {
            return;
        };
        if f.dirty.as_ref() == Some(&wb.data) {
            f.dirty = None;
        }
        f.version = version;
        f.clean = Some(wb.data.clone());
    }

    /// Whether the answer of grant `grant` on `ino` has arrived (a recall
    /// of a grant not yet seen waits for it).
    pub fn has_grant(&self, ino: Ino, grant: u64) -> bool {
        self.files.get(&ino).is_some_and(|f| f.grant >= grant)
    }

    /// A recall arrived: of grant `grant` on `ino`, down to `to`.  Recalls
    /// of one grant may arrive in any order; the strongest is kept (a
    /// weaker one answered first is answered again when the stronger
    /// comes), and a later grant's replaces an earlier grant's.
    pub fn recall(&mut self, ino: Ino, to: Level, grant: u64) {
        let f = self.files.entry(ino).or_default();
        match &mut f.recall {
            Some((l, g)) if *g == grant => *l = (*l).min(to),
            Some((_, g)) if *g > grant => {}
            r => *r = Some((to, grant)),
        }
    }

    /// The recall of `ino` waiting for an answer, if any: its level and
    /// grant.
    pub fn pending_recall(&self, ino: Ino) -> Option<(Level, u64)> {
        self.files.get(&ino).and_then(|f| f.recall)
    }

    /// The answer to the pending recall of `ino`, once its grant's answer
    /// arrived and any dirty bytes are written back: the grant, the level
    /// kept and the opens to report (the primary tracks them from now on).
    pub fn recalled(&mut self, ino: Ino) -> Option<RecallAnswer> {
        let f = self.files.get_mut(&ino)?;
        let (to, grant) = f.recall?;
        if f.grant < grant || f.dirty.is_some() {
            return None;
        }
        f.recall = None;
        debug_assert!(f.dirty.is_none(), "write back before answering a recall");
        // A client writing through the file (no Write left) keeps no read
        // cache of it either.
        let kept = if f.counts().writers > 0 && to < Level::Write {
            Level::None
        } else {
            f.level().min(to)
        };
        f.level = Some(kept);
        if kept == Level::None {
            f.clean = None;
        }
        let list = f.list();
        f.known.extend(list.iter().map(|(o, _)| *o));
        Some(RecallAnswer {
            grant,
            kept,
            opens: list,
        })
    }

    /// The file became write-shared: nothing of it is cached any more,
    /// unless the client was granted it again since (a grant numbered
    /// above `grant`).
    /// True if it applied.
    pub fn stop_caching(&mut self, ino: Ino, grant: u64) -> bool {
        let f = self.files.entry(ino).or_default();
        if f.grant > grant {
            return false;
        }
        f.uncached = true;
        f.level = Some(Level::None);
        f.clean = None;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(level: Level) -> Decision {
        Decision::Grant {
            level,
            uncached: false,
            grant: 1,
        }
    }

    #[test]
    fn opens_under_a_token_stay_local() {
        let mut c = ClientCache::new(30);
        assert_eq!(c.open(1, false), Step::Primary);
        let (want, have, id) = c.open_request(1, false);
        assert_eq!((want, have), (Want::OpenRead, vec![]));
        c.opened(1, id, false, &grant(Level::Read), 4, Some(b"abc".to_vec()));
        assert_eq!(c.read(1), Step::Local(b"abc".to_vec()));
        assert!(
            !c.close(1, id),
            "the primary learned nothing of a cached open"
        );
        let Step::Local(r) = c.open(1, false) else {
            panic!()
        };
        // Writing needs Write.
        assert_eq!(c.open(1, true), Step::Primary);
        let (want, have, w) = c.open_request(1, true);
        assert_eq!((want, have), (Want::OpenWrite, vec![(r, false)]));
        // A close while the request is under way is sent (the primary
        // may learn of the open from the request).
        assert!(c.close(1, r));
        assert_eq!(c.cached_version(1), Some(4));
        c.opened(1, w, true, &grant(Level::Write), 4, None);
        assert_eq!(c.file(1).unwrap().clean.as_deref(), Some(b"abc".as_slice()));
        assert!(!c.close(1, w));
    }

    #[test]
    fn writes_stay_dirty_until_written_back() {
        let mut c = ClientCache::new(30);
        let (_, _, id) = c.open_request(1, true);
        c.opened(1, id, true, &grant(Level::Write), 0, Some(Vec::new()));
        assert_eq!(c.write(1, 2, b"xy", 100), Step::Local(()));
        assert_eq!(c.read(1), Step::Local(b"\0\0xy".to_vec()));
        assert_eq!(c.due(129), Vec::<Ino>::new());
        assert_eq!(c.due(130), vec![1]);
        let wb = c.write_back(1).unwrap();
        assert_eq!(wb.base, 0);
        // A write while the write-back is under way stays dirty.
        c.write(1, 0, b"z", 131);
        c.written_back(&wb, 1);
        let f = c.file(1).unwrap();
        assert_eq!(
            (f.version, f.dirty.as_deref()),
            (1, Some(b"z\0xy".as_slice()))
        );
        let wb2 = c.write_back(1).unwrap();
        assert_eq!(wb2.base, 1);
        c.written_back(&wb2, 2);
        assert!(c.write_back(1).is_none());
    }

    #[test]
    fn recalls_report_opens_and_sharing_goes_uncached() {
        let mut c = ClientCache::new(30);
        let (_, _, id) = c.open_request(1, true);
        c.opened(1, id, true, &grant(Level::Write), 0, Some(Vec::new()));
        // Two recalls of one grant crossing: the stronger counts.
        c.recall(1, Level::None, 1);
        c.recall(1, Level::Read, 1);
        assert_eq!(c.pending_recall(1), Some((Level::None, 1)));
        // A write-through client keeps nothing, whatever was asked.
        assert_eq!(
            c.recalled(1),
            Some(RecallAnswer {
                grant: 1,
                kept: Level::None,
                opens: vec![(id, true)]
            })
        );
        assert_eq!(c.recalled(1), None, "answered once");
        // A recall of a grant not seen yet waits for it.
        c.recall(1, Level::Read, 7);
        assert_eq!(c.recalled(1), None);
        assert_eq!(c.open(1, true), Step::Primary);
        assert!(c.stop_caching(1, 1));
        assert_eq!(c.read(1), Step::Primary);
        assert_eq!(c.write(1, 0, b"a", 5), Step::Primary);
        assert!(c.close(1, id), "a reported open's close is sent");
        // Uncached until a new grant.
        assert_eq!(c.open(1, false), Step::Primary);
        let (_, _, r) = c.open_request(1, false);
        c.opened(1, r, false, &grant(Level::Read), 3, Some(b"new".to_vec()));
        assert_eq!(c.read(1), Step::Local(b"new".to_vec()));
    }
}
