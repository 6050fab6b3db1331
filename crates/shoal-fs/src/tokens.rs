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
//! Time is an argument: a [`Time`] on the shell's clock.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use shoal_time::Time;

use crate::model::{Ino, printed_as_number};

/// A client session at the primary (one mount process): a number the
/// mount draws at random, always odd, so that the even number beside it
/// is free to name its pushes (`ClientId::pushes`).  Updates carry it for
/// exactly-once; 0 is a caller that is not a mount.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ClientId(pub u64);

impl ClientId {
    /// The session a client's pushes are recorded under for
    /// exactly-once: its number with the low bit clear, apart from the
    /// updates it asks for one at a time.
    pub fn pushes(self) -> ClientId {
        ClientId(self.0 & !1)
    }
}

printed_as_number!(ClientId);

/// How long a lease lasts after its last renewal.
pub const LEASE: Duration = Duration::from_secs(10);

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

/// How many opens a client has of one inode, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Opens {
    pub readers: u32,
    pub writers: u32,
}

impl Opens {
    fn is_empty(&self) -> bool {
        self.readers == 0 && self.writers == 0
    }

    /// The counts of opens, each said to be for writing or not.
    pub fn count(writes: impl IntoIterator<Item = bool>) -> Opens {
        writes.into_iter().fold(Opens::default(), |mut o, w| {
            if w {
                o.writers += 1;
            } else {
                o.readers += 1;
            }
            o
        })
    }

    /// The counts of a list of opens (id, for writing).
    pub fn of(list: &[(OpenId, bool)]) -> Opens {
        Opens::count(list.iter().map(|(_, w)| *w))
    }
}

/// One open of a client, numbered by the client (never reused within its
/// session).  The primary tracks opens one by one, as NFSv4 does, so that
/// a close and a report of the opens can arrive in either order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct OpenId(pub u64);

/// A call from the primary to a client, carried by its event request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Callback {
    /// Give the inode's token up to `to`: write back or push first, then
    /// answer with [`Tokens::returned`] and the opens you have of it.
    /// `grant` numbers the grant recalled: a client that has not yet seen
    /// that grant's answer (they travel apart, and may cross) answers once
    /// it has.
    Recall { ino: Ino, to: Level, grant: u64 },
    /// The file is write-shared: stop caching it, send its reads and
    /// writes to the primary, until you are granted a token again.  A
    /// client holding a grant numbered above `grant` (made after this
    /// was sent) ignores it.
    StopCaching { ino: Ino, grant: u64 },
    /// Notice `id`: name `name` in directory `dir` changed; confirm with
    /// [`Tokens::confirm`] once the client's caches no longer say what
    /// it was.
    Notice { id: u64, dir: Ino, name: Vec<u8> },
    /// The inode has no names left: a client that does not have it open
    /// may drop its changes not yet written back rather than write them
    /// (a recall follows).
    Orphan { ino: Ino },
    /// Locks on the inode were released: a program of the client waiting
    /// for one there may try again.
    Unlocked { ino: Ino },
}

/// What the primary answers a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Answer now: the client may cache at `level`; with `uncached`, the
    /// file is write-shared and the open goes uncached (the primary now
    /// knows it).  `grant` numbers this grant (recalls name it).
    Grant {
        level: Level,
        uncached: bool,
        grant: u64,
    },
    /// Hold the request: recalls are out to these clients.
    Wait { recalled: Vec<ClientId> },
    /// The client is unknown or its lease ended: it must say hello again.
    NoSession,
}

#[derive(Debug, Default)]
struct InodeState {
    holders: BTreeMap<ClientId, Level>,
    /// The number of each holder's grant.
    grants: BTreeMap<ClientId, u64>,
    /// Opens the primary knows of: those made uncached, and those reported
    /// in answers to recalls (for writing or not).
    opens: BTreeMap<ClientId, BTreeMap<OpenId, bool>>,
    /// Opens closed before the primary learned of them (their report is
    /// still on its way): not to be learned when it comes.
    closed: BTreeMap<ClientId, BTreeSet<OpenId>>,
    /// Write-shared: nobody caches it.
    shared: bool,
    /// Recalls out, and the level each asks for.
    recalling: BTreeMap<ClientId, Level>,
}

impl InodeState {
    fn is_idle(&self) -> bool {
        self.holders.is_empty()
            && self.opens.is_empty()
            && self.closed.is_empty()
            && self.recalling.is_empty()
            && !self.shared
    }

    /// Each client's counts of known opens.
    fn counts(&self) -> impl Iterator<Item = (ClientId, Opens)> + '_ {
        self.opens
            .iter()
            .map(|(c, ids)| (*c, Opens::count(ids.values().copied())))
    }

    /// Recalls `client`'s grant down to `to`, unless a recall as strong
    /// is out already.
    fn recall(
        &mut self,
        callbacks: &mut VecDeque<(ClientId, Callback)>,
        ino: Ino,
        client: ClientId,
        to: Level,
    ) {
        if self.recalling.get(&client).is_none_or(|l| *l > to) {
            self.recalling.insert(client, to);
            let grant = self.grants.get(&client).copied().unwrap_or(0);
            callbacks.push_back((client, Callback::Recall { ino, to, grant }));
        }
    }

    /// Learns opens a client reports, except those it closed already.
    fn learn(&mut self, client: ClientId, list: &[(OpenId, bool)]) {
        for (id, write) in list {
            if let Some(t) = self.closed.get_mut(&client)
                && t.remove(id)
            {
                if t.is_empty() {
                    self.closed.remove(&client);
                }
                continue;
            }
            self.opens.entry(client).or_default().insert(*id, *write);
        }
    }
}

struct Client {
    lease_until: Time,
}

struct Notice {
    waiting: BTreeSet<ClientId>,
}

/// The primary's soft state.
#[derive(Default)]
pub struct Tokens {
    clients: HashMap<ClientId, Client>,
    /// Ordered, so what is done to every inode (a grace period's end, a
    /// client's loss) is done in one order, and the simulator replays it.
    inodes: BTreeMap<Ino, InodeState>,
    notices: HashMap<u64, Notice>,
    next_notice: u64,
    next_grant: u64,
    callbacks: VecDeque<(ClientId, Callback)>,
    /// In the grace period after a primary change: only reclaims.
    grace: bool,
}

/// Why a reclaim was refused: the client drops its cache of the inode
/// (its opens are learned all the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The grace period is over.
    Late,
    /// The version the client caches is not the file's any more.
    Stale,
    /// Another client reclaimed a token this one conflicts with.
    Conflict,
}

impl Tokens {
    pub fn new() -> Tokens {
        Tokens::default()
    }

    /// The soft state of a new primary, of group incarnation `epoch`: empty,
    /// in its grace period (only reclaims until [`Tokens::end_grace`]),
    /// numbering its grants above every earlier primary's.
    pub fn after_change(epoch: u32) -> Tokens {
        Tokens {
            next_grant: u64::from(epoch) << 40,
            grace: true,
            ..Tokens::default()
        }
    }

    /// Whether the grace period is on.
    pub fn in_grace(&self) -> bool {
        self.grace
    }

    /// A client reclaims, after a primary change, its token `level` on
    /// `ino` (`current`: the version it caches is still the file's, as
    /// the replicated state says) and its `opens` of it.  The opens are
    /// learned whatever the answer; the token gets a new grant number, or
    /// is refused.
    pub fn reclaim(
        &mut self,
        now: Time,
        client: ClientId,
        ino: Ino,
        level: Level,
        current: bool,
        opens: &[(OpenId, bool)],
    ) -> Result<u64, Refused> {
        self.renew(now, client);
        let s = self.inodes.entry(ino).or_default();
        s.learn(client, opens);
        if level == Level::None {
            return Ok(0);
        }
        if !self.grace {
            return Err(Refused::Late);
        }
        if !current {
            return Err(Refused::Stale);
        }
        let conflict = s
            .holders
            .iter()
            .any(|(c, l)| *c != client && (level == Level::Write || *l == Level::Write));
        if conflict {
            return Err(Refused::Conflict);
        }
        self.next_grant += 1;
        s.holders.insert(client, level);
        s.grants.insert(client, self.next_grant);
        Ok(self.next_grant)
    }

    /// Ends the grace period: files the reclaimed opens show write-shared
    /// are so again, and requests are decided again.  (A consistent old
    /// primary left no token on such a file; any reclaimed one is
    /// recalled, and the next request finds the sharing.)
    pub fn end_grace(&mut self) {
        self.grace = false;
        let inos: Vec<Ino> = self.inodes.keys().copied().collect();
        for ino in inos {
            let s = self.inodes.get_mut(&ino).expect("listed");
            if Self::still_shared(s) {
                if s.holders.is_empty() {
                    s.shared = true;
                }
                let holders: Vec<ClientId> = s.holders.keys().copied().collect();
                for c in holders {
                    s.recall(&mut self.callbacks, ino, c, Level::None);
                }
            }
        }
    }

    /// A client's session begins (or is renewed) at `now`.
    pub fn hello(&mut self, now: Time, client: ClientId) {
        self.renew(now, client);
    }

    /// Renews a client's lease; false if it has none (it must say hello).
    pub fn renew(&mut self, now: Time, client: ClientId) -> bool {
        let until = now + LEASE;
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

    /// Recalls every token on `ino` (to nothing): an inode that lost its
    /// last name is forgotten once no client has it open, and a holder's
    /// answer tells the opens the primary does not know of.
    pub fn recall_all(&mut self, ino: Ino) {
        if let Some(s) = self.inodes.get_mut(&ino) {
            let holders: Vec<ClientId> = s.holders.keys().copied().collect();
            for c in holders {
                if !s.recalling.contains_key(&c) {
                    self.callbacks.push_back((c, Callback::Orphan { ino }));
                }
                s.recall(&mut self.callbacks, ino, c, Level::None);
            }
        }
    }

    /// Whether no client may hold unwritten changes of `ino`: every
    /// `Write` token on it is recalled to `Read` (its holder writes its
    /// changes back before it answers), and `false` is returned while one
    /// is out or the grace period lasts.  A read made for a caller that is
    /// no client (by capability) waits for this.
    pub fn writers_flushed(&mut self, ino: Ino) -> bool {
        if self.grace {
            return false;
        }
        let Some(s) = self.inodes.get_mut(&ino) else {
            return true;
        };
        let writers: Vec<ClientId> = s
            .holders
            .iter()
            .filter(|(_, l)| **l == Level::Write)
            .map(|(c, _)| *c)
            .collect();
        for c in &writers {
            s.recall(&mut self.callbacks, ino, *c, Level::Read);
        }
        writers.is_empty()
    }

    /// Whether any client holds a token on `ino` (it may have opens the
    /// primary does not know of).
    pub fn is_held(&self, ino: Ino) -> bool {
        self.inodes.get(&ino).is_some_and(|s| !s.holders.is_empty())
    }

    /// Whether `client` is the only one with anything on `ino`: the only
    /// holder of a token, with no recall out, no open known, nothing
    /// write-shared.
    pub fn only(&self, client: ClientId, ino: Ino) -> bool {
        self.inodes.get(&ino).is_some_and(|s| {
            s.holders.len() == 1
                && s.holders.contains_key(&client)
                && s.recalling.is_empty()
                && s.opens.is_empty()
                && s.closed.is_empty()
                && !s.shared
        })
    }

    /// Forgets an inode that went with its last name while only one
    /// client held it ([`Tokens::only`]), which drops its token itself on
    /// the answer.
    pub fn forget(&mut self, ino: Ino) {
        self.inodes.remove(&ino);
    }

    /// Whether any client has `ino` open, as far as the primary knows.
    pub fn is_open(&self, ino: Ino) -> bool {
        self.inodes.get(&ino).is_some_and(|s| !s.opens.is_empty())
    }

    /// Decides a request of `client` on `ino`; `have` is the opens the
    /// client has of it already and `new` the open asked for (which the
    /// primary tracks from then on if the answer is uncached: they become
    /// uncached too).  Call again, with the same arguments, when told to
    /// wait and a recall was answered or a lease ended.
    pub fn request(
        &mut self,
        client: ClientId,
        ino: Ino,
        want: Want,
        have: &[(OpenId, bool)],
        new: Option<OpenId>,
    ) -> Decision {
        let have_writers = have.iter().any(|(_, w)| *w);
        if let Err(d) = self.begin(client, ino) {
            return d;
        }
        let s = self.inodes.entry(ino).or_default();
        let others_hold = s.holders.keys().any(|c| *c != client);
        let asked = match want {
            // A client that writes through a file it has open already
            // cannot keep a read cache of it: it needs Write or nothing.
            Want::Look | Want::OpenRead if have_writers => Level::Write,
            Want::Look | Want::OpenRead => Level::Read,
            Want::Change if others_hold => Level::Read,
            Want::OpenWrite | Want::Change => Level::Write,
        };
        // Write-sharing, as far as the known opens tell: then nobody else
        // may keep any token.
        let opening = matches!(want, Want::OpenRead | Want::OpenWrite);
        let others_open = s.counts().any(|(c, o)| c != client && !o.is_empty());
        let others_write = s.counts().any(|(c, o)| c != client && o.writers > 0);
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
                s.recall(&mut self.callbacks, ino, *c, to);
            }
            return Decision::Wait {
                recalled: conflicting,
            };
        }
        if sharing {
            if !s.shared {
                s.shared = true;
                for (c, o) in s.counts() {
                    if c != client && !o.is_empty() {
                        self.callbacks.push_back((
                            c,
                            Callback::StopCaching {
                                ino,
                                grant: self.next_grant,
                            },
                        ));
                    }
                }
            }
            s.holders.remove(&client);
            s.grants.remove(&client);
            if opening {
                s.learn(client, have);
                if let Some(id) = new {
                    s.learn(client, &[(id, want == Want::OpenWrite)]);
                }
            }
            self.next_grant += 1;
            return Decision::Grant {
                level: Level::None,
                uncached: true,
                grant: self.next_grant,
            };
        }
        let level = s
            .holders
            .get(&client)
            .copied()
            .unwrap_or(Level::None)
            .max(asked);
        s.holders.insert(client, level);
        self.next_grant += 1;
        s.grants.insert(client, self.next_grant);
        // An open the primary already tracks for this client stays tracked:
        // its close will be reported.
        Decision::Grant {
            level,
            uncached: false,
            grant: self.next_grant,
        }
    }

    /// What a request of `client` on `ino` gets before anything is
    /// decided: nothing without a session, and a wait while a recall to
    /// it is out (a grant must not cross its answer to the recall).
    fn begin(&self, client: ClientId, ino: Ino) -> Result<(), Decision> {
        if !self.clients.contains_key(&client) {
            return Err(Decision::NoSession);
        }
        if self.grace {
            return Err(Decision::Wait {
                recalled: Vec::new(),
            });
        }
        if self
            .inodes
            .get(&ino)
            .is_some_and(|s| s.recalling.contains_key(&client))
        {
            return Err(Decision::Wait {
                recalled: Vec::new(),
            });
        }
        Ok(())
    }

    /// A write that a client sends through the primary (it holds no
    /// `Write` token: the file is write-shared, or its token went):
    /// nobody may cache the file while it is made, the writer included.
    /// Waits for the recalls of every other token.
    pub fn write_through(&mut self, client: ClientId, ino: Ino) -> Decision {
        if let Err(d) = self.begin(client, ino) {
            return d;
        }
        let s = self.inodes.entry(ino).or_default();
        s.holders.remove(&client);
        s.grants.remove(&client);
        let others: Vec<ClientId> = s.holders.keys().copied().collect();
        if !others.is_empty() {
            for c in &others {
                s.recall(&mut self.callbacks, ino, *c, Level::None);
            }
            return Decision::Wait { recalled: others };
        }
        self.next_grant += 1;
        Decision::Grant {
            level: Level::None,
            uncached: true,
            grant: self.next_grant,
        }
    }

    /// A change of `ino`'s attributes (its mode, owner, times, link
    /// count, extended attributes or contents) that `client` asks the
    /// primary to make: every other client's token on it is recalled
    /// first, so no cache elsewhere keeps the old attributes.  The
    /// client's own token stays (the answer brings it the new
    /// attributes).
    pub fn exclusive(&mut self, client: ClientId, ino: Ino) -> Decision {
        if let Err(d) = self.begin(client, ino) {
            return d;
        }
        let (level, grant) = match self.inodes.get_mut(&ino) {
            None => (Level::None, 0),
            Some(s) => {
                let others: Vec<ClientId> = s
                    .holders
                    .keys()
                    .filter(|c| **c != client)
                    .copied()
                    .collect();
                if !others.is_empty() {
                    for c in &others {
                        s.recall(&mut self.callbacks, ino, *c, Level::None);
                    }
                    return Decision::Wait { recalled: others };
                }
                (
                    s.holders.get(&client).copied().unwrap_or(Level::None),
                    s.grants.get(&client).copied().unwrap_or(0),
                )
            }
        };
        Decision::Grant {
            level,
            uncached: false,
            grant,
        }
    }

    /// The number of `client`'s grant on `ino` (0: none).
    pub fn grant_of(&self, client: ClientId, ino: Ino) -> u64 {
        self.inodes
            .get(&ino)
            .and_then(|s| s.grants.get(&client).copied())
            .unwrap_or(0)
    }

    /// `client` answered the recall of its grant `grant` on `ino`: it
    /// keeps `kept` (at most what the recall asked) and has `opens` of the
    /// inode, which the primary now tracks until they close.  An answer
    /// about another grant than the client's current one is ignored; an
    /// answer to a weaker recall than the one out now counts for what it
    /// kept, and the stronger recall stays out.
    pub fn returned(
        &mut self,
        client: ClientId,
        ino: Ino,
        grant: u64,
        kept: Level,
        opens: &[(OpenId, bool)],
    ) {
        let Some(s) = self.inodes.get_mut(&ino) else {
            return;
        };
        // What it has open is true whatever grant it answers about.
        s.learn(client, opens);
        if s.grants.get(&client).copied().unwrap_or(0) != grant {
            self.tidy(ino);
            return;
        }
        // An answer to an earlier, weaker recall (a stronger one went out
        // meanwhile, and will be answered too) leaves the stronger one out.
        if s.recalling.get(&client).is_some_and(|to| kept <= *to) {
            s.recalling.remove(&client);
        }
        if kept == Level::None {
            s.holders.remove(&client);
            s.grants.remove(&client);
        } else if s.holders.contains_key(&client) {
            s.holders.insert(client, kept);
        }
        self.tidy(ino);
    }

    /// A close of open `id`, which the client told the primary of (or
    /// may have: a report may still be on its way, and then the close
    /// waits for it).  Returns true when the file stopped being
    /// write-shared.
    pub fn close(&mut self, client: ClientId, ino: Ino, id: OpenId) -> bool {
        let s = self.inodes.entry(ino).or_default();
        let known = s
            .opens
            .get_mut(&client)
            .is_some_and(|o| o.remove(&id).is_some());
        if known {
            if s.opens.get(&client).is_some_and(BTreeMap::is_empty) {
                s.opens.remove(&client);
            }
        } else {
            s.closed.entry(client).or_default().insert(id);
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
        let open: Vec<Opens> = s
            .counts()
            .map(|(_, o)| o)
            .filter(|o| !o.is_empty())
            .collect();
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
    pub fn notify(&mut self, client: ClientId, dir: Ino, name: &[u8]) -> Option<u64> {
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
            self.callbacks.push_back((
                *c,
                Callback::Notice {
                    id,
                    dir,
                    name: name.to_vec(),
                },
            ));
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
    pub fn expire(&mut self, now: Time, end: Option<ClientId>) -> (Vec<ClientId>, Vec<Ino>) {
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
                s.grants.remove(c);
                s.opens.remove(c);
                s.closed.remove(c);
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
    pub fn next_expiry(&self) -> Option<Time> {
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
