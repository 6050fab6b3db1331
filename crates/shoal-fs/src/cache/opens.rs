//! A mount's opens of each inode, and which of them the primary knows
//! (`docs/fs.md`, "Tokens"): an open for reading under a token costs no
//! message, so the primary learns of it only when a recall's answer, an
//! uncached open's request or a reclaim lists it; only the closes of
//! opens it knows are sent.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::model::Ino;
use crate::tokens::OpenId;

/// The mount's opens.
#[derive(Debug, Default)]
pub struct OpenTable {
    /// By inode, each with whether it writes; an inode is here only while
    /// it has one.
    opens: HashMap<Ino, Vec<(OpenId, bool)>>,
    /// The opens the primary knows of (or may: listed in a request under
    /// way).
    known: HashSet<OpenId>,
    /// The last open's number.
    last: OpenId,
}

impl OpenTable {
    /// Numbers a new open (not yet recorded).
    pub fn number(&mut self) -> OpenId {
        self.last.0 += 1;
        self.last
    }

    /// The opens of `ino`.
    pub fn of(&self, ino: Ino) -> Vec<(OpenId, bool)> {
        self.opens.get(&ino).cloned().unwrap_or_default()
    }

    /// Whether `ino` is open.
    pub fn is_open(&self, ino: Ino) -> bool {
        self.opens.contains_key(&ino)
    }

    /// Every open, by inode.
    pub fn all(&self) -> HashMap<Ino, Vec<(OpenId, bool)>> {
        self.opens.clone()
    }

    pub fn record(&mut self, ino: Ino, id: OpenId, write: bool) {
        self.opens.entry(ino).or_default().push((id, write));
    }

    /// Forgets open `id` of `ino`; whether the primary knows it (then its
    /// close is sent).
    pub fn forget(&mut self, ino: Ino, id: OpenId) -> bool {
        if let Some(list) = self.opens.get_mut(&ino) {
            list.retain(|(i, _)| *i != id);
            if list.is_empty() {
                self.opens.remove(&ino);
            }
        }
        self.known.remove(&id)
    }

    /// The inodes with opens the primary does not know of.
    pub fn unknown(&self) -> Vec<Ino> {
        self.opens
            .iter()
            .filter(|(_, list)| list.iter().any(|(id, _)| !self.known.contains(id)))
            .map(|(ino, _)| *ino)
            .collect()
    }

    /// The opens of `ino` a recall's answer reports: the primary knows
    /// them from then on.
    pub fn report(&mut self, ino: Ino) -> Vec<(OpenId, bool)> {
        let list = self.of(ino);
        self.known.extend(list.iter().map(|(id, _)| *id));
        list
    }

    /// The primary learned the opens `listed` of `ino` (an uncached
    /// open's answer): those still open are known from then on; returns
    /// those closed meanwhile, whose closes must be sent now.
    pub fn learned(&mut self, ino: Ino, listed: &[(OpenId, bool)]) -> Vec<OpenId> {
        let now = self.opens.get(&ino);
        let mut closed = Vec::new();
        for (id, _) in listed {
            if now.is_some_and(|l| l.iter().any(|(i, _)| i == id)) {
                self.known.insert(*id);
            } else {
                closed.push(*id);
            }
        }
        closed
    }

    /// The primary learned these opens (an uncached open's answer, or a
    /// reclaim that lists them).
    pub fn learn(&mut self, ids: impl IntoIterator<Item = OpenId>) {
        self.known.extend(ids);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_closes_of_opens_the_primary_knows_are_sent() {
        let mut t = OpenTable::default();
        let (a, b) = (t.number(), t.number());
        t.record(Ino(7), a, false);
        t.record(Ino(7), b, true);
        assert_eq!(t.unknown(), vec![Ino(7)]);
        // An uncached open listed both; `a` closed meanwhile.
        assert!(!t.forget(Ino(7), a), "unknown: no close sent");
        assert_eq!(t.learned(Ino(7), &[(a, false), (b, true)]), vec![a]);
        assert!(t.unknown().is_empty());
        let c = t.number();
        t.record(Ino(7), c, false);
        assert_eq!(t.report(Ino(7)), vec![(b, true), (c, false)]);
        assert!(t.forget(Ino(7), c));
        assert!(t.forget(Ino(7), b));
        assert!(!t.is_open(Ino(7)));
    }
}
