//! The directory state machine: every replica applies the same ordered
//! writes to a [`DirState`] and so holds the same directories.  Applying
//! is deterministic (a new directory's secret travels in the request), so
//! the state depends only on the order of writes.
//!
//! The state also keeps one *session* per client: the number and answer of
//! its latest write, so a write retried at another replica after a failure
//! is answered, not applied twice.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use shoal_cap::{CapError, Capability, ObjectId, ObjectSecret, PutPort, Rights};

use crate::model::*;
use crate::op::{Answer, Expect, InstallItem, Op, Request, Response};
use shoal_cap::codec::{DecodeError, Reader, Writer, bad};

/// Most client sessions kept; the least recently used is forgotten first.
pub const MAX_SESSIONS: usize = 65_536;

/// One directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directory {
    pub secret: ObjectSecret,
    pub columns: Vec<String>,
    pub rows: BTreeMap<String, Row>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Session {
    seq: u64,
    index: u64,
    response: Response,
}

/// What [`DirState::apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// A new write: applied (or refused) now.
    New(Response),
    /// A write this client already made: its earlier answer.
    Duplicate(Response),
}

impl Applied {
    pub fn response(&self) -> &Response {
        match self {
            Applied::New(r) | Applied::Duplicate(r) => r,
        }
    }
}

/// Every directory of one directory service, and the client sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirState {
    port: PutPort,
    index: u64,
    next_id: u64,
    dirs: BTreeMap<u64, Directory>,
    sessions: HashMap<u64, Session>,
    lru: BTreeSet<(u64, u64)>,
}

const SNAPSHOT_MAGIC: &[u8; 8] = b"SHOALDS1";

impl DirState {
    /// An empty state for the service at `port`.
    pub fn new(port: PutPort) -> DirState {
        DirState {
            port,
            index: 0,
            next_id: 1,
            dirs: BTreeMap::new(),
            sessions: HashMap::new(),
            lru: BTreeSet::new(),
        }
    }

    /// The service's port.
    pub fn port(&self) -> PutPort {
        self.port
    }

    /// How many writes have been applied.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Raises the index to `index` (replaying a log whose last records
    /// cancelled out).
    pub fn raise_index(&mut self, index: u64) {
        self.index = self.index.max(index);
    }

    /// Number of directories.
    pub fn dir_count(&self) -> usize {
        self.dirs.len()
    }

    /// Number of rows over all directories.
    pub fn row_count(&self) -> usize {
        self.dirs.values().map(|d| d.rows.len()).sum()
    }

    /// One directory, by object number.
    pub fn dir(&self, id: u64) -> Option<&Directory> {
        self.dirs.get(&id)
    }

    /// Checks `cap` against its directory and `need`.
    fn open(&self, cap: &Capability, need: Rights) -> Result<(&Directory, Rights), DirError> {
        if cap.port() != self.port {
            return Err(DirError::UnknownDirectory);
        }
        let dir = self
            .dirs
            .get(&cap.object().get())
            .ok_or(DirError::UnknownDirectory)?;
        let have = cap
            .verify(&dir.secret)
            .map_err(|_| DirError::BadCapability)?;
        if !have.contains(need) {
            return Err(DirError::Denied { have, need });
        }
        Ok((dir, have))
    }

    /// The columns `cap`'s holder may read in `dir`, as a bit set; fails if
    /// none.
    fn columns(dir: &Directory, have: Rights) -> Result<u8, DirError> {
        let all = (1u8 << dir.columns.len()) - 1;
        let usable = have.bits() & all;
        if usable == 0 {
            return Err(DirError::Denied {
                have,
                need: Rights::from_bits(all),
            });
        }
        Ok(usable)
    }

    /// The row's capabilities restricted to the union of the usable
    /// columns' masks.
    fn restricted(row: &Row, usable: u8) -> Result<Vec<Capability>, DirError> {
        let mask = row
            .masks
            .iter()
            .enumerate()
            .filter(|(i, _)| usable & (1 << i) != 0)
            .fold(Rights::NONE, |acc, (_, m)| acc.union(*m));
        row.caps
            .iter()
            .map(|c| {
                c.restrict(mask).map_err(|e| match e {
                    CapError::ChainFull => DirError::TooLarge(
                        "the stored capability was already restricted 7 times".into(),
                    ),
                    _ => DirError::BadCapability,
                })
            })
            .collect()
    }

    fn lookup_in(&self, cap: &Capability, name: &[u8]) -> Result<Vec<Capability>, DirError> {
        let (dir, have) = self.open(cap, Rights::NONE)?;
        let usable = Self::columns(dir, have)?;
        let name = check_name(name)?;
        let row = dir
            .rows
            .get(name)
            .ok_or_else(|| DirError::NotFound(name.into()))?;
        Self::restricted(row, usable)
    }

    /// Serves a read-only operation.
    pub fn read(&self, op: &Op) -> Result<Answer, DirError> {
        match op {
            Op::List { dir } => {
                let (d, have) = self.open(dir, Rights::NONE)?;
                Self::columns(d, have)?;
                Ok(Answer::Listing {
                    columns: d.columns.clone(),
                    rows: d
                        .rows
                        .iter()
                        .map(|(n, r)| (n.clone(), r.masks.clone()))
                        .collect(),
                })
            }
            Op::Lookup { dir, name } => self.lookup_in(dir, name).map(Answer::Caps),
            Op::GetMasks { dir, name } => {
                let (d, have) = self.open(dir, Rights::NONE)?;
                Self::columns(d, have)?;
                let name = check_name(name)?;
                let row = d
                    .rows
                    .get(name)
                    .ok_or_else(|| DirError::NotFound(name.into()))?;
                Ok(Answer::Masks(row.masks.clone()))
            }
            Op::LookupMany { dir, names } => {
                if names.len() > MAX_BATCH {
                    return Err(DirError::TooLarge("more than 1024 names".into()));
                }
                let (d, have) = self.open(dir, Rights::NONE)?;
                Self::columns(d, have)?;
                Ok(Answer::Many(
                    names.iter().map(|n| self.lookup_in(dir, n)).collect(),
                ))
            }
            Op::PathLookup { dir, path } => self.path_lookup(dir, path).map(Answer::Caps),
            _ => Err(DirError::BadRequest(format!("{} is not a read", op.name()))),
        }
    }

    fn path_lookup(&self, dir: &Capability, path: &[u8]) -> Result<Vec<Capability>, DirError> {
        if path.len() > MAX_PATH {
            return Err(DirError::NameTooLong {
                len: path.len(),
                max: MAX_PATH,
            });
        }
        let parts: Vec<&[u8]> = path
            .split(|&b| b == b'/')
            .filter(|p| !p.is_empty())
            .collect();
        let Some((last, inner)) = parts.split_last() else {
            return Err(DirError::BadName("empty path".into()));
        };
        let mut cur = *dir;
        for part in inner {
            let caps = self.lookup_in(&cur, part)?;
            cur = caps
                .into_iter()
                .find(|c| c.port() == self.port && self.dirs.contains_key(&c.object().get()))
                .ok_or_else(|| DirError::NotADirectory(String::from_utf8_lossy(part).into()))?;
        }
        self.lookup_in(&cur, last)
    }

    /// Applies one ordered write.  Deterministic: every replica that
    /// applies the same requests in the same order reaches the same state
    /// and the same answers.
    pub fn apply(&mut self, req: &Request) -> Applied {
        if req.client != 0
            && let Some(s) = self.sessions.get(&req.client)
        {
            if req.seq == s.seq {
                return Applied::Duplicate(s.response.clone());
            }
            if req.seq < s.seq {
                return Applied::Duplicate(Response {
                    index: s.index,
                    result: Err(DirError::Superseded(req.seq)),
                });
            }
        }
        if matches!(req.op, Op::Sync) || !req.op.is_write() {
            return Applied::New(Response {
                index: self.index,
                result: Ok(Answer::Done),
            });
        }
        self.index += 1;
        let result = self.write(&req.op);
        let response = Response {
            index: self.index,
            result,
        };
        if req.client != 0 {
            self.remember(req.client, req.seq, response.clone());
        }
        Applied::New(response)
    }

    /// Applies a write read back from the log at `index` (records of
    /// refused writes are not logged, so indexes may skip).
    pub fn replay(&mut self, index: u64, req: &Request) {
        let before = self.index;
        self.apply(req);
        self.index = before.max(index);
    }

    /// Restores the session of a successful write that left no log record
    /// of its own (it cancelled out).
    pub fn remember_done(&mut self, client: u64, seq: u64, index: u64) {
        if self.sessions.get(&client).is_none_or(|s| s.seq < seq) {
            self.remember(
                client,
                seq,
                Response {
                    index,
                    result: Ok(Answer::Done),
                },
            );
        }
    }

    fn remember(&mut self, client: u64, seq: u64, response: Response) {
        let index = response.index;
        if let Some(old) = self.sessions.insert(
            client,
            Session {
                seq,
                index,
                response,
            },
        ) {
            self.lru.remove(&(old.index, client));
        }
        self.lru.insert((index, client));
        while self.sessions.len() > MAX_SESSIONS {
            let Some((_, c)) = self.lru.pop_first() else {
                break;
            };
            self.sessions.remove(&c);
        }
    }

    fn write(&mut self, op: &Op) -> Result<Answer, DirError> {
        match op {
            Op::CreateDir { columns, secret } => {
                let columns = check_columns(columns)?;
                let id = self.next_id;
                self.next_id += 1;
                let secret = ObjectSecret::from_bytes(*secret);
                let cap = Capability::mint(self.port, ObjectId::new(id), Rights::ALL, &secret);
                self.dirs.insert(
                    id,
                    Directory {
                        secret,
                        columns,
                        rows: BTreeMap::new(),
                    },
                );
                Ok(Answer::Cap(cap))
            }
            Op::DeleteDir { dir } => {
                let (d, _) = self.open(dir, DESTROY)?;
                if !d.rows.is_empty() {
                    return Err(DirError::NotEmpty(d.rows.len()));
                }
                self.dirs.remove(&dir.object().get());
                Ok(Answer::Done)
            }
            Op::Append {
                dir,
                name,
                caps,
                masks,
            } => self.install(&[InstallItem {
                dir: *dir,
                name: name.clone(),
                expect: Expect::Absent,
                new: Some((caps.clone(), masks.clone())),
            }]),
            Op::Delete { dir, name } => self.install(&[InstallItem {
                dir: *dir,
                name: name.clone(),
                expect: Expect::Present,
                new: None,
            }]),
            Op::Replace {
                dir,
                name,
                expect,
                caps,
            } => {
                // Keep the row's masks: read them under the same checks.
                let masks = self.current(dir, name)?.masks.clone();
                self.install(&[InstallItem {
                    dir: *dir,
                    name: name.clone(),
                    expect: Expect::Caps(expect.clone()),
                    new: Some((caps.clone(), masks)),
                }])
            }
            Op::Chmod { dir, name, masks } => {
                let caps = self.current(dir, name)?.caps.clone();
                self.install(&[InstallItem {
                    dir: *dir,
                    name: name.clone(),
                    expect: Expect::Caps(caps.clone()),
                    new: Some((caps, masks.clone())),
                }])
            }
            Op::Install { items } => self.install(items),
            _ => Err(DirError::BadRequest(format!(
                "{} is not a write",
                op.name()
            ))),
        }
    }

    fn current(&self, dir: &Capability, name: &[u8]) -> Result<&Row, DirError> {
        let (d, _) = self.open(dir, MODIFY)?;
        let name = check_name(name)?;
        d.rows
            .get(name)
            .ok_or_else(|| DirError::NotFound(name.into()))
    }

    /// Checks every item against the state before the install, then applies
    /// them all: all or nothing.
    fn install(&mut self, items: &[InstallItem]) -> Result<Answer, DirError> {
        if items.is_empty() {
            return Err(DirError::BadRequest("install of no rows".into()));
        }
        if items.len() > MAX_BATCH {
            return Err(DirError::TooLarge(
                "more than 1024 rows in one install".into(),
            ));
        }
        let mut plan: Vec<(u64, String, Option<Row>)> = Vec::with_capacity(items.len());
        let mut seen = BTreeSet::new();
        let mut growth: BTreeMap<u64, isize> = BTreeMap::new();
        for it in items {
            let (d, _) = self.open(&it.dir, MODIFY)?;
            let id = it.dir.object().get();
            let name = check_name(&it.name)?;
            if !seen.insert((id, name)) {
                return Err(DirError::BadRequest(format!(
                    "install names {name:?} twice in one directory"
                )));
            }
            let cur = d.rows.get(name);
            match (&it.expect, cur) {
                (Expect::Any, _) | (Expect::Absent, None) | (Expect::Present, Some(_)) => {}
                (Expect::Absent, Some(_)) => return Err(DirError::Exists(name.into())),
                (Expect::Present | Expect::Caps(_), None) => {
                    return Err(DirError::NotFound(name.into()));
                }
                (Expect::Caps(want), Some(row)) => {
                    if &row.caps != want {
                        return Err(DirError::Conflict(name.into()));
                    }
                }
            }
            let new = match &it.new {
                None => {
                    if cur.is_none() {
                        return Err(DirError::NotFound(name.into()));
                    }
                    *growth.entry(id).or_default() -= 1;
                    None
                }
                Some((caps, masks)) => {
                    check_caps(caps)?;
                    if masks.len() != d.columns.len() {
                        return Err(DirError::BadRequest(format!(
                            "{} masks given for a directory of {} columns",
                            masks.len(),
                            d.columns.len()
                        )));
                    }
                    if cur.is_none() {
                        *growth.entry(id).or_default() += 1;
                    }
                    Some(Row {
                        caps: caps.clone(),
                        masks: masks.clone(),
                    })
                }
            };
            plan.push((id, name.to_string(), new));
        }
        for (id, g) in &growth {
            if (self.dirs[id].rows.len() as isize + g) as usize > MAX_ROWS {
                return Err(DirError::TooLarge(
                    "directory would exceed 1,000,000 rows".into(),
                ));
            }
        }
        for (id, name, new) in plan {
            let rows = &mut self.dirs.get_mut(&id).expect("checked above").rows;
            match new {
                Some(row) => {
                    rows.insert(name, row);
                }
                None => {
                    rows.remove(&name);
                }
            }
        }
        Ok(Answer::Done)
    }

    /// Encodes the whole state (snapshot file, state transfer).
    pub fn encode_snapshot(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.row_count() * 96);
        let mut w = Writer(&mut out);
        w.raw(SNAPSHOT_MAGIC);
        w.raw(self.port.as_bytes());
        w.u64(self.index);
        w.u64(self.next_id);
        w.u64(self.dirs.len() as u64);
        for (id, d) in &self.dirs {
            w.u64(*id);
            w.raw(d.secret.as_bytes());
            w.u8(d.columns.len() as u8);
            for c in &d.columns {
                w.str16(c.as_bytes());
            }
            w.u32(d.rows.len() as u32);
            for (name, row) in &d.rows {
                w.str16(name.as_bytes());
                w.caps(&row.caps);
                for m in &row.masks {
                    w.u8(m.bits());
                }
            }
        }
        let mut sessions: Vec<_> = self.sessions.iter().collect();
        sessions.sort_by_key(|(c, _)| **c);
        w.u32(sessions.len() as u32);
        for (client, s) in sessions {
            w.u64(*client);
            w.u64(s.seq);
            w.u64(s.index);
            w.bytes32(&s.response.encode());
        }
        let hash = blake3::hash(&out);
        out.extend_from_slice(hash.as_bytes());
        out
    }

    /// Decodes a snapshot, checking its hash first.
    pub fn decode_snapshot(buf: &[u8]) -> Result<DirState, DecodeError> {
        const WHAT: &str = "directory snapshot";
        if buf.len() < SNAPSHOT_MAGIC.len() + 32 {
            return Err(bad(WHAT, "truncated"));
        }
        let (body, hash) = buf.split_at(buf.len() - 32);
        if blake3::hash(body).as_bytes() != hash {
            return Err(bad(WHAT, "checksum mismatch"));
        }
        let mut r = Reader::new(body, WHAT);
        if r.take(8)? != SNAPSHOT_MAGIC {
            return Err(bad(WHAT, "not a shoal directory snapshot"));
        }
        let port = PutPort::from_bytes(r.array()?);
        let index = r.u64()?;
        let next_id = r.u64()?;
        let ndirs = r.u64()? as usize;
        r.count(ndirs, 8 + 32 + 1 + 4)?;
        let mut dirs = BTreeMap::new();
        for _ in 0..ndirs {
            let id = r.u64()?;
            let secret = ObjectSecret::from_bytes(r.array()?);
            let ncols = r.u8()? as usize;
            if ncols == 0 || ncols > MAX_COLUMNS {
                return Err(bad(WHAT, "bad column count"));
            }
            let columns = (0..ncols)
                .map(|_| {
                    String::from_utf8(r.str16()?.to_vec())
                        .map_err(|_| bad(WHAT, "column not UTF-8"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let nrows = r.u32()? as usize;
            r.count(nrows, 2 + 1 + ncols)?;
            let mut rows = BTreeMap::new();
            for _ in 0..nrows {
                let name = String::from_utf8(r.str16()?.to_vec())
                    .map_err(|_| bad(WHAT, "name not UTF-8"))?;
                let caps = r.caps()?;
                let masks = r
                    .take(ncols)?
                    .iter()
                    .map(|&b| Rights::from_bits(b))
                    .collect();
                rows.insert(name, Row { caps, masks });
            }
            dirs.insert(
                id,
                Directory {
                    secret,
                    columns,
                    rows,
                },
            );
        }
        let nsessions = r.u32()? as usize;
        r.count(nsessions, 28)?;
        let mut state = DirState {
            port,
            index,
            next_id,
            dirs,
            sessions: HashMap::with_capacity(nsessions),
            lru: BTreeSet::new(),
        };
        for _ in 0..nsessions {
            let client = r.u64()?;
            let seq = r.u64()?;
            let sindex = r.u64()?;
            let response = Response::decode(r.bytes32()?)?;
            state.sessions.insert(
                client,
                Session {
                    seq,
                    index: sindex,
                    response,
                },
            );
            state.lru.insert((sindex, client));
        }
        r.end()?;
        Ok(state)
    }
}
