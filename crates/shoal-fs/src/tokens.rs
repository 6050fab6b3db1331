//! The primary's soft state (`docs/fs.md`, "Tokens"): which client may
//! cache which inode, the opens the primary knows of, which files are
//! write-shared, the recalls and change notices in flight, and the
//! clients' leases.  None of it is replicated: after a primary change the
//! clients reclaim it.
//!
//! [`Tokens`] decides; the shell does the I/O.  A request either gets its
//! answer at once or must [wait](Decision::Wait): the tokens it conflicts
//! with have been recalled (the callbacks are in [`Tokens::poll_callback`]),
//! and the shell asks again when a recall is answered or a lease ends.
//! Time is an argument (microseconds on the shell's clock).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::model::Ino;

/// A client session at the primary (one mount process).
pub type ClientId = u64;

/// How long a lease lasts after its last renewal (µs).
pub const LEASE_US: u64 = 10_000_000;

/// What a client may cache of an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Nothing: it asks the primary for everything.
    None,
    /// Attributes and data of the version granted (a file), entries and
    /// listings (a directory); opens for reading without asking.
    Read,
    /// Exclusive: also writes (a file), name changes (a directory).
    Write,
}

/// What a request needs of an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// To look at it (lookup, getattr, readdir): asks for `Read`.
    Look,
    /// To open a file for reading.
    OpenRead,
    /// To open a file for writing (or reading and writing).
    OpenWrite,
    /// To change names in a directory: `Write` (a private directory, whose
    /// changes the client makes itself) when no other client holds a
    /// token on it; otherwise the change is the primary's to make, with
    /// notices to the readers, and this is a `Look` (only another
    /// client's `Write` is recalled, so that its pending changes come
    /// first).
    Change,
}

/// The opens a client has of one inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Opens {
    pub readers: u32,
    pub writers: u32,
}

impl Opens {
    fn is_empty(&self) -> bool {
        self.readers == 0 && self.writers == 0
    }
}

/// A call from the primary to a client, carried by its event request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Callback {
    /// Give the inode's token up to `to`: write back or push first, then
    /// answer with [`Tokens::returned`] and the opens you have of it.
    Recall { ino: Ino, to: Level },
    /// The file is write-shared: stop caching it, send its reads and
    /// writes to the primary, until you are granted a token again.
    StopCaching { ino: Ino },
    /// Notice `id`: a name in directory `dir` changed (the shell carries
    /// what changed); confirm with [`Tokens::confirm`].
    Notice { id: u64, dir: Ino },
}

/// What the primary answers a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Answer now: the client may cache at `level`; with `uncached`, the
    /// file is write-shared and the open goes uncached (the primary now
    /// knows it).
    Grant { level: Level, uncached: bool },
    /// Hold the request: recalls are out to these clients.
    Wait { recalled: Vec<ClientId> },
    /// The client is unknown or its lease ended: it must say hello again.
    NoSession,
}

#[derive(Debug, Default)]
struct InodeState {
    holders: BTreeMap<ClientId, Level>,
    /// Opens the primary knows of: those made uncached, and those reported
    /// in answers to recalls.
    opens: BTreeMap<ClientId, Opens>,
    /// Write-shared: nobody caches it.
    shared: bool,
    /// Recalls out, and the level each asks for.
    recalling: BTreeMap<ClientId, Level>,
}

impl InodeState {
    fn is_idle(&self) -> bool {
        self.holders.is_empty()
            && self.opens.is_empty()
            && self.recalling.is_empty()
            && !self.shared
    }
}

struct Client {
    lease_until: u64,
}

struct Notice {
    waiting: BTreeSet<ClientId>,
}

/// The primary's soft state.
#[derive(Default)]
pub struct Tokens {
    clients: HashMap<ClientId, Client>,
    inodes: HashMap<Ino, InodeState>,
    notices: HashMap<u64, Notice>,
    next_notice: u64,
    callbacks: VecDeque<(ClientId, Callback)>,
}

impl Tokens {
    pub fn new() -> Tokens {
        Tokens::default()
    }

    /// A client's session begins (or is renewed) at `now`.
    pub fn hello(&mut self, now: u64, client: ClientId) {
        self.renew(now, client);
    }

    /// Renews a client's lease; false if it has none (it must say hello).
    pub fn renew(&mut self, now: u64, client: ClientId) -> bool {
        let until = now + LEASE_US;
        match self.clients.get_mut(&client) {
            Some(c) => {
                c.lease_until = until;
                true
            }
            None => {
                self.clients.insert(client, Client { lease_until: until });
                false
            }
        }
    }

    /// Whether a client has a live session.
    pub fn knows(&self, client: ClientId) -> bool {
        self.clients.contains_key(&client)
    }

    /// The next callback to deliver, and to whom.
    pub fn poll_callback(&mut self) -> Option<(ClientId, Callback)> {
        self.callbacks.pop_front()
    }

    /// The level `client` holds on `ino`.
    pub fn level(&self, client: ClientId, ino: Ino) -> Level {
        self.inodes
            .get(&ino)
            .and_then(|s| s.holders.get(&client).copied())
            .unwrap_or(Level::None)
    }

    /// Whether `ino` is write-shared.
    pub fn is_shared(&self, ino: Ino) -> bool {
        self.inodes.get(&ino).is_some_and(|s| s.shared)
    }

    /// Whether any client has `ino` open, as far as the primary knows.
    pub fn is_open(&self, ino: Ino) -> bool {
        self.inodes.get(&ino).is_some_and(|s| !s.opens.is_empty())
    }

    /// Decides a request of `client` on `ino`; `have` is the opens the
    /// client has of it already (which the primary tracks from then on if
    /// the answer is uncached: they become uncached too).  Call again,
    /// with the same arguments, when told to wait and a recall was
    /// answered or a lease ended.
    pub fn request(&mut self, client: ClientId, ino: Ino, want: Want, have: Opens) -> Decision {
        if !self.clients.contains_key(&client) {
            return Decision::NoSession;
        }
        let s = self.inodes.entry(ino).or_default();
        let others_hold = s.holders.keys().any(|c| *c != client);
        let asked = match want {
            Want::Look | Want::OpenRead => Level::Read,
            Want::Change if others_hold => Level::Read,
            Want::OpenWrite | Want::Change => Level::Write,
        };
        // Write-sharing, as far as the known opens tell: then nobody else
        // may keep any token.
        let opening = matches!(want, Want::OpenRead | Want::OpenWrite);
        let others_open = s.opens.iter().any(|(c, o)| *c != client && !o.is_empty());
        let others_write = s.opens.iter().any(|(c, o)| *c != client && o.writers > 0);
        let sharing =
            s.shared || (opening && ((want == Want::OpenWrite && others_open) || others_write));
        // Others' tokens in the way: recall them (each once).
        let to = if asked == Level::Read && !sharing {
            Level::Read
        } else {
            Level::None
        };
        let conflicting: Vec<ClientId> = s
            .holders
            .iter()
            .filter(|(c, l)| {
                **c != client && (sharing || asked == Level::Write || **l == Level::Write)
            })
            .map(|(c, _)| *c)
            .collect();
        if !conflicting.is_empty() {
            for c in &conflicting {
                let out = s.recalling.get(c).copied();
                if out.is_none_or(|l| l > to) {
                    s.recalling.insert(*c, to);
                    self.callbacks.push_back((*c, Callback::Recall { ino, to }));
                }
            }
            return Decision::Wait {
                recalled: conflicting,
            };
        }
        if sharing {
            if !s.shared {
                s.shared = true;
                for (c, o) in &s.opens {
                    if *c != client && !o.is_empty() {
                        self.callbacks
                            .push_back((*c, Callback::StopCaching { ino }));
                    }
                }
            }
            s.holders.remove(&client);
            if opening {
                let o = s.opens.entry(client).or_default();
                *o = have;
                if want == Want::OpenWrite {
                    o.writers += 1;
                } else {
                    o.readers += 1;
                }
            }
            return Decision::Grant {
                level: Level::None,
                uncached: true,
            };
        }
        let level = s
            .holders
            .get(&client)
            .copied()
            .unwrap_or(Level::None)
            .max(asked);
        s.holders.insert(client, level);
        // An open the primary already tracks for this client stays tracked:
        // its close will be reported.
        Decision::Grant {
            level,
            uncached: false,
        }
    }

    /// `client` answered a recall of `ino`: it keeps `kept` (at most what
    /// the recall asked) and has `opens` of the inode, which the primary
    /// now tracks until they close.
    pub fn returned(&mut self, client: ClientId, ino: Ino, kept: Level, opens: Opens) {
        let Some(s) = self.inodes.get_mut(&ino) else {
            return;
        };
        let asked = s.recalling.remove(&client).unwrap_or(kept);
        let kept = kept.min(asked);
        if kept == Level::None {
            s.holders.remove(&client);
        } else if s.holders.contains_key(&client) {
            s.holders.insert(client, kept);
        }
        if opens.is_empty() {
            s.opens.remove(&client);
        } else {
            s.opens.insert(client, opens);
        }
        self.tidy(ino);
    }

    /// `client` gives up its token on `ino` of its own accord (cache
    /// pressure), with no opens left.
    pub fn release(&mut self, client: ClientId, ino: Ino) {
        if let Some(s) = self.inodes.get_mut(&ino) {
            s.holders.remove(&client);
            s.recalling.remove(&client);
        }
        self.tidy(ino);
    }

    /// A close of an open the primary knows of.  Returns true when the
    /// file stopped being write-shared.
    pub fn close(&mut self, client: ClientId, ino: Ino, writer: bool) -> bool {
        let Some(s) = self.inodes.get_mut(&ino) else {
            return false;
        };
        if let Some(o) = s.opens.get_mut(&client) {
            if writer {
                o.writers = o.writers.saturating_sub(1);
            } else {
                o.readers = o.readers.saturating_sub(1);
            }
            if o.is_empty() {
                s.opens.remove(&client);
            }
        }
        let ended = s.shared && !Self::still_shared(s);
        if ended {
            s.shared = false;
        }
        self.tidy(ino);
        ended
    }

    /// Whether the known opens still make a write-sharing: more than one
    /// client has the file open and one of them writes.
    fn still_shared(s: &InodeState) -> bool {
        let open: Vec<&Opens> = s.opens.values().filter(|o| !o.is_empty()).collect();
        open.len() > 1 && open.iter().any(|o| o.writers > 0)
    }

    fn tidy(&mut self, ino: Ino) {
        if self.inodes.get(&ino).is_some_and(InodeState::is_idle) {
            self.inodes.remove(&ino);
        }
    }

    /// Sends a notice of a change in directory `dir`, made by `client`, to
    /// every other client holding `Read` on it.  Returns the notice's id,
    /// or `None` if nobody needs it; [`Tokens::notice_done`] tells when
    /// every receiver confirmed (or lost its lease).
    pub fn notify(&mut self, client: ClientId, dir: Ino) -> Option<u64> {
        let s = self.inodes.get(&dir)?;
        let waiting: BTreeSet<ClientId> = s
            .holders
            .iter()
            .filter(|(c, l)| **c != client && **l >= Level::Read)
            .map(|(c, _)| *c)
            .collect();
        if waiting.is_empty() {
            return None;
        }
        self.next_notice += 1;
        let id = self.next_notice;
        for c in &waiting {
            self.callbacks.push_back((*c, Callback::Notice { id, dir }));
        }
        self.notices.insert(id, Notice { waiting });
        Some(id)
    }

    /// `client` confirmed notice `id`.
    pub fn confirm(&mut self, client: ClientId, id: u64) {
        if let Some(n) = self.notices.get_mut(&id) {
            n.waiting.remove(&client);
        }
    }

    /// Whether every receiver of notice `id` confirmed it (forgets it
    /// then).
    pub fn notice_done(&mut self, id: u64) -> bool {
        let done = self.notices.get(&id).is_none_or(|n| n.waiting.is_empty());
        if done {
            self.notices.remove(&id);
        }
        done
    }

    /// Ends the leases that ran out by `now`, and a client's session on
    /// purpose (`end`), releasing their tokens, opens, recalls and
    /// notices.  Returns the clients whose sessions ended and the inodes
    /// whose last known open went with them (an unlinked one may go now).
    pub fn expire(&mut self, now: u64, end: Option<ClientId>) -> (Vec<ClientId>, Vec<Ino>) {
        let mut gone: Vec<ClientId> = self
            .clients
            .iter()
            .filter(|(_, c)| c.lease_until <= now)
            .map(|(id, _)| *id)
            .collect();
        gone.extend(end.filter(|c| self.clients.contains_key(c)));
        gone.sort_unstable();
        gone.dedup();
        let mut closed = Vec::new();
        for c in &gone {
            self.clients.remove(c);
            self.callbacks.retain(|(to, _)| to != c);
            for n in self.notices.values_mut() {
                n.waiting.remove(c);
            }
        }
        if gone.is_empty() {
            return (gone, closed);
        }
        let inos: Vec<Ino> = self.inodes.keys().copied().collect();
        for ino in inos {
            let s = self.inodes.get_mut(&ino).expect("listed");
            let had_opens = !s.opens.is_empty();
            for c in &gone {
                s.holders.remove(c);
                s.opens.remove(c);
                s.recalling.remove(c);
            }
            if s.shared && !Self::still_shared(s) {
                s.shared = false;
            }
            if had_opens && s.opens.is_empty() {
                closed.push(ino);
            }
            self.tidy(ino);
        }
        (gone, closed)
    }

    /// The earliest lease end, to set a timer by.
    pub fn next_expiry(&self) -> Option<u64> {
        self.clients.values().map(|c| c.lease_until).min()
    }

    /// Checks the rules every state keeps; panics with what broke.  For
    /// tests and the simulator.
    pub fn check(&self) {
        for (ino, s) in &self.inodes {
            let writers = s.holders.values().filter(|l| **l == Level::Write).count();
            assert!(
                writers == 0 || s.holders.len() == 1,
                "inode {ino}: a Write token beside other tokens: {:?}",
                s.holders
            );
            if s.shared {
                assert!(
                    s.holders.values().all(|l| *l == Level::None),
                    "inode {ino}: a token on a write-shared file"
                );
            }
            for c in s.holders.keys().chain(s.opens.keys()) {
                assert!(
                    self.clients.contains_key(c),
                    "inode {ino}: state of a client without a lease"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
