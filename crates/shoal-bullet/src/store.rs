//! The extent store: one file server's files, on three [`Disk`]s.
//!
//! - **data**: extents, each up to [`MAX_EXTENT`] contiguous bytes with a
//!   BLAKE3 checksum, in space handed out by the [`Allocator`];
//! - **meta.0 / meta.1**: the metadata ([`crate::meta`]): a snapshot of
//!   every committed file and extent, then a log of changes.  A checkpoint
//!   writes a new snapshot into the *other* file under the next
//!   generation; recovery takes the highest generation whose snapshot
//!   verifies and replays its records up to the first that does not.
//!
//! A file's bytes are a list of *pieces*, ranges of extents.  Files never
//! change once committed; an edit makes a new file whose piece list shares
//! every unchanged extent with the old one, so appending 4 KiB to a
//! 100 MiB file writes 4 KiB and a short record, not 100 MiB.
//!
//! **Crash rules.**
//! 1. Data before metadata: a flush syncs the data disk, then writes and
//!    syncs the records that name the new extents; or, when those extents
//!    are small, writes their bytes in records before the ones naming
//!    them and syncs the metadata alone (one sync, not two), and recovery
//!    writes such bytes where their extent lies if a crash lost them
//!    there.  A commit with the safety flag returns only after such a
//!    flush covered it.
//! 2. No reuse before forgetting: space of an extent that a record ever
//!    named goes back to the allocator only once the record that dropped
//!    it (destroy, move) is durable, so no crash can bring back a file
//!    whose bytes were overwritten.  Space that no record named (the
//!    extents of uncommitted files) is reused at once.
//! 3. Extents are written only into free space, never over live data.
//! 4. Recovery cuts the metadata file at the end of its valid records, so
//!    a stale record beyond a torn one can never become valid later.
//!
//! **Concurrency.**  Metadata lives under one mutex; extent bytes are
//! read and written outside it at offsets taken under it.  A read whose
//! checksum fails looks the extent up again (compaction may have moved it,
//! or the file may be gone) before it reports corruption.
//!
//! Time-to-live counters are kept in memory; recovery starts every file at
//! the full TTL, so a restart can delay garbage collection, never hasten it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use rand::{RngCore, SeedableRng};
use shoal_cap::{Capability, GetPort, ObjectId, ObjectSecret, PutPort, Rights};
use shoal_time::Time;

use crate::alloc::Allocator;
use crate::disk::Disk;
use crate::meta::{ExtentRec, FileRec, Piece, Record, Snapshot};
use crate::model::*;
use crate::op::{AdminOp, Answer, Edit, FLAG_COMMIT, FLAG_SAFETY, Op, OpData, Stat};

mod read;
mod upkeep;
mod write;

/// A flush whose commits introduce at most this many bytes of extents
/// writes them into its records and syncs the metadata disk alone.
const INLINE_BYTES: u64 = 128 << 10;

/// The active metadata file grows in steps of this many zero bytes,
/// written with the records that first need them, so that most flushes
/// sync records alone and not the file's length or blocks (on ext4 an
/// append and `fdatasync` take twice the time and CPU of the same write
/// over zeros on disk).  Zeros end the records as a torn one does, and
/// recovery cuts them off (rule 4).
const META_AHEAD: u64 = 1 << 20;

/// Tunables of a store.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Bytes of verified extents kept in memory.
    pub cache_bytes: u64,
    /// Time-to-live given to files by a touch, in ageing passes.
    pub ttl: u8,
    /// Life of an uncommitted file nobody touches.
    pub uncommitted_life: Duration,
    /// The least time between two ageing passes: an
    /// object manager's pass asks for one after touching every file
    /// something names, and several managers, or a pass run by hand, do
    /// not age files faster than this.
    pub age_gap: Duration,
    /// The data disk grows in steps of this many bytes.
    pub grow_step: u64,
    /// A checkpoint is written when the metadata log passes this length.
    pub checkpoint_after: u64,
    /// Seed for object secrets (`None`: the operating system's).
    pub seed: Option<u64>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            cache_bytes: 256 << 20,
            ttl: DEFAULT_TTL,
            uncommitted_life: Duration::from_secs(DEFAULT_UNCOMMITTED_SECS),
            age_gap: Duration::from_secs(DEFAULT_AGE_GAP_SECS),
            grow_step: 64 << 20,
            checkpoint_after: 64 << 20,
            seed: None,
        }
    }
}

/// The disks of one store.
pub struct Disks<D> {
    pub data: D,
    pub meta: [D; 2],
}

#[derive(Debug, Clone)]
struct File {
    secret: [u8; 32],
    size: u64,
    pieces: Vec<Piece>,
    committed: bool,
    digest: [u8; 32],
    ttl: u8,
    touched: Time,
}

#[derive(Debug, Clone)]
struct Extent {
    off: u64,
    len: u32,
    hash: [u8; 32],
    /// Pieces (of any file) that refer to it.
    refs: u32,
    /// Named by a record (so its space is freed only once a later record
    /// dropping it is durable).
    logged: bool,
}

struct Inner {
    next_object: u64,
    next_extent: u64,
    files: HashMap<u64, File>,
    extents: HashMap<u64, Extent>,
    alloc: Allocator,
    /// Records appended but not yet written.
    log: Vec<Record>,
    /// Number of the last record appended / made durable.
    appended: u64,
    durable: u64,
    /// Space to free once record number `.0` is durable.
    pending_free: Vec<(u64, u64, u64)>,
    active: usize,
    generation: u64,
    /// Where the active metadata file's next record goes, and its length
    /// (zeros from `tail` on: [`META_AHEAD`]).
    tail: u64,
    made: u64,
    rng: rand_chacha::ChaCha8Rng,
    destroyed_by_age: u64,
    /// When the last ageing pass a manager asked for ran.
    aged: Option<Time>,
}

#[derive(Default)]
struct Cache {
    map: HashMap<u64, (Bytes, u64)>,
    lru: BTreeMap<u64, u64>,
    tick: u64,
    bytes: u64,
    hits: u64,
    misses: u64,
    /// Buffers of evicted extents nobody else holds, for the next miss
    /// (fresh memory costs a page fault per 4 KiB).
    spare: Vec<Vec<u8>>,
}

/// Most spare buffers kept.
const SPARE: usize = 16;
/// Object numbers each start of a store may hand out before the next
/// start's (2^30 starts fit below the numbers' limit).
const OBJECT_ERA: u64 = 1 << 32;

impl Cache {
    /// A buffer of `len` bytes whose contents the caller overwrites.
    fn buffer(&mut self, len: usize) -> Vec<u8> {
        match self.spare.pop() {
            Some(mut b) => {
                b.resize(len, 0);
                b
            }
            None => vec![0; len],
        }
    }

    /// Inserts verified bytes, evicting the least recently used beyond
    /// `max` bytes.
    fn put(&mut self, id: u64, bytes: Bytes, max: u64) {
        if (bytes.len() as u64) > max {
            return;
        }
        self.tick += 1;
        let tick = self.tick;
        let len = bytes.len() as u64;
        if let Some((_, old)) = self.map.insert(id, (bytes, tick)) {
            self.lru.remove(&old);
        } else {
            self.bytes += len;
        }
        self.lru.insert(tick, id);
        while self.bytes > max {
            let Some((_, victim)) = self.lru.pop_first() else {
                break;
            };
            if let Some((b, _)) = self.map.remove(&victim) {
                self.bytes -= b.len() as u64;
                if self.spare.len() < SPARE
                    && let Ok(v) = b.try_into_mut()
                {
                    self.spare.push(v.into());
                }
            }
        }
    }
}

/// One file server's store.
pub struct Store<D: Disk> {
    cfg: StoreConfig,
    disks: Disks<D>,
    port: GetPort,
    put_port: PutPort,
    server_secret: ObjectSecret,
    inner: Mutex<Inner>,
    /// Held by whoever writes metadata (flush, checkpoint).
    flushing: Mutex<()>,
    /// Held by compaction and fsck (one at a time).
    maintenance: Mutex<()>,
    cache: Mutex<Cache>,
    /// Requests served other than administration, and their bytes
    /// (`count_request`).
    requests: AtomicU64,
    request_bytes: AtomicU64,
}

/// Why a store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(
        "no valid metadata in either metadata file (not a shoal file store, or both copies damaged)"
    )]
    NoMetadata,
    #[error("the metadata is inconsistent: {0}")]
    Inconsistent(String),
    #[error("storage error: {0}")]
    Io(#[from] std::io::Error),
}

fn digest_of(pieces: &[Piece], extents: &HashMap<u64, Extent>) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for p in pieces {
        if let Some(e) = extents.get(&p.extent) {
            h.update(&e.hash);
        }
        h.update(&p.off.to_le_bytes());
        h.update(&p.len.to_le_bytes());
    }
    *h.finalize().as_bytes()
}

/// The pieces covering bytes `[from, to)` of a piece list.
fn slice(pieces: &[Piece], from: u64, to: u64) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut at = 0u64;
    for p in pieces {
        let (s, e) = (at, at + p.len as u64);
        at = e;
        if e <= from {
            continue;
        }
        if s >= to {
            break;
        }
        let a = from.max(s);
        let b = to.min(e);
        out.push(Piece {
            extent: p.extent,
            off: p.off + (a - s) as u32,
            len: (b - a) as u32,
        });
    }
    out
}

/// Joins neighbouring pieces that are contiguous in one extent.
fn normalize(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::with_capacity(pieces.len());
    for p in pieces.into_iter().filter(|p| p.len > 0) {
        if let Some(last) = out.last_mut() {
            // Holes join while the length fits a piece; extents where
            // they are contiguous.
            if last.extent == HOLE && p.extent == HOLE {
                if let Some(len) = last.len.checked_add(p.len) {
                    (last.off, last.len) = (0, len);
                    continue;
                }
            } else if last.extent == p.extent && last.off + last.len == p.off {
                last.len += p.len;
                continue;
            }
        }
        out.push(p);
    }
    out
}

impl Inner {
    fn check(
        &self,
        put_port: PutPort,
        cap: &Capability,
        need: Rights,
    ) -> Result<(u64, Rights), FileError> {
        if cap.port() != put_port {
            return Err(FileError::NotFound);
        }
        let obj = cap.object().get();
        let f = self.files.get(&obj).ok_or(FileError::NotFound)?;
        let have = cap
            .verify(&ObjectSecret::from_bytes(f.secret))
            .map_err(|_| FileError::BadCapability)?;
        if !have.contains(need) {
            return Err(FileError::Denied { have, need });
        }
        Ok((obj, have))
    }

    fn append(&mut self, r: Record) -> u64 {
        self.log.push(r);
        self.appended += 1;
        self.appended
    }

    fn add_refs(&mut self, pieces: &[Piece]) {
        for p in pieces {
            if let Some(e) = self.extents.get_mut(&p.extent) {
                e.refs += 1;
            }
        }
    }

    /// Drops the references of `pieces`; extents nobody refers to any more
    /// are forgotten and their space freed (at once, or once record `lsn`
    /// is durable if a record ever named them).
    fn drop_refs(&mut self, pieces: &[Piece], lsn: u64) {
        for p in pieces {
            let gone = match self.extents.get_mut(&p.extent) {
                Some(e) => {
                    e.refs -= 1;
                    e.refs == 0
                }
                None => false,
            };
            if gone {
                let e = self.extents.remove(&p.extent).unwrap();
                if e.logged {
                    self.pending_free.push((lsn, e.off, e.len as u64));
                } else {
                    self.alloc.free(e.off, e.len as u64);
                }
            }
        }
    }

    fn release(&mut self, durable: u64) {
        self.durable = self.durable.max(durable);
        let d = self.durable;
        let mut keep = Vec::new();
        for (lsn, off, len) in std::mem::take(&mut self.pending_free) {
            if lsn <= d {
                self.alloc.free(off, len);
            } else {
                keep.push((lsn, off, len));
            }
        }
        self.pending_free = keep;
    }

    /// A new uncommitted file of `pieces` (whose references the caller
    /// already counted): its object number and secret.
    fn new_file(&mut self, size: u64, pieces: Vec<Piece>, ttl: u8, now: Time) -> (u64, [u8; 32]) {
        let obj = self.next_object;
        self.next_object += 1;
        let secret = self.new_secret();
        self.files.insert(
            obj,
            File {
                secret,
                size,
                pieces,
                committed: false,
                digest: [0; 32],
                ttl,
                touched: now,
            },
        );
        (obj, secret)
    }

    fn new_secret(&mut self) -> [u8; 32] {
        let mut s = [0u8; 32];
        self.rng.fill_bytes(&mut s);
        s
    }

    /// Commits file `obj`: appends its record, naming the extents no
    /// record named yet.  Returns the record's number.
    fn commit(&mut self, obj: u64) -> u64 {
        let f = self.files.get_mut(&obj).unwrap();
        f.committed = true;
        let pieces = f.pieces.clone();
        let digest = digest_of(&pieces, &self.extents);
        let f = self.files.get_mut(&obj).unwrap();
        f.digest = digest;
        let rec_file = FileRec {
            object: obj,
            secret: f.secret,
            size: f.size,
            digest,
            pieces: pieces.clone(),
        };
        let mut new = Vec::new();
        for p in pieces.iter().filter(|p| p.extent != HOLE) {
            let e = self.extents.get_mut(&p.extent).unwrap();
            if !e.logged {
                e.logged = true;
                new.push(ExtentRec {
                    id: p.extent,
                    off: e.off,
                    len: e.len,
                    hash: e.hash,
                });
            }
        }
        self.append(Record::Commit {
            file: rec_file,
            extents: new,
        })
    }

    fn destroy(&mut self, obj: u64) {
        let f = self.files.remove(&obj).unwrap();
        let lsn = if f.committed {
            self.append(Record::Destroy { object: obj })
        } else {
            self.appended
        };
        self.drop_refs(&f.pieces, lsn);
    }

    fn snapshot(&self, port: &GetPort, server_secret: &ObjectSecret) -> Snapshot {
        let mut files: Vec<FileRec> = self
            .files
            .iter()
            .filter(|(_, f)| f.committed)
            .map(|(&object, f)| FileRec {
                object,
                secret: f.secret,
                size: f.size,
                digest: f.digest,
                pieces: f.pieces.clone(),
            })
            .collect();
        files.sort_by_key(|f| f.object);
        let mut extents: Vec<ExtentRec> = self
            .extents
            .iter()
            .filter(|(_, e)| e.logged)
            .map(|(&id, e)| ExtentRec {
                id,
                off: e.off,
                len: e.len,
                hash: e.hash,
            })
            .collect();
        extents.sort_by_key(|e| e.id);
        Snapshot {
            port: *port.as_bytes(),
            server_secret: *server_secret.as_bytes(),
            next_object: self.next_object,
            next_extent: self.next_extent,
            extents,
            files,
        }
    }
}

/// A verified extent and the range of it a read takes.
pub type ExtentSlice = (Bytes, std::ops::Range<usize>);

/// What a read needs of one piece: where its extent is and which part.
#[derive(Clone, Copy)]
struct ReadPart {
    extent: u64,
    off: u64,
    len: u32,
    hash: [u8; 32],
    from: u32,
    take: u32,
}

impl<D: Disk> Store<D> {
    /// Formats a new, empty store on `disks` for a server with get-port
    /// `port` (whatever they held is overwritten).
    pub fn format(disks: Disks<D>, port: GetPort, cfg: StoreConfig) -> Result<Self, OpenError> {
        let mut rng = match cfg.seed {
            Some(s) => rand_chacha::ChaCha8Rng::seed_from_u64(s),
            None => rand_chacha::ChaCha8Rng::from_os_rng(),
        };
        let mut secret = [0u8; 32];
        rng.fill_bytes(&mut secret);
        let snap = Snapshot {
            port: *port.as_bytes(),
            server_secret: secret,
            next_object: 1,
            next_extent: 1,
            ..Snapshot::default()
        };
        disks.data.set_len(0)?;
        disks.data.sync()?;
        disks.meta[1].set_len(0)?;
        disks.meta[1].sync()?;
        let bytes = snap.encode(1);
        disks.meta[0].write_at(&bytes, 0)?;
        disks.meta[0].set_len(bytes.len() as u64)?;
        disks.meta[0].sync()?;
        Store::open(disks, cfg)
    }

    /// Opens a store after a clean stop or a crash.
    pub fn open(disks: Disks<D>, cfg: StoreConfig) -> Result<Self, OpenError> {
        let mut best: Option<(u64, usize, Snapshot, Vec<u8>, usize)> = None;
        for (i, d) in disks.meta.iter().enumerate() {
            let len = d.len()? as usize;
            let mut buf = vec![0u8; len];
            d.read_at(&mut buf, 0)?;
            if let Ok((generation, snap, start)) = Snapshot::decode(&buf)
                && best.as_ref().is_none_or(|b| generation > b.0)
            {
                best = Some((generation, i, snap, buf, start));
            }
        }
        let (generation, active, snap, buf, start) = best.ok_or(OpenError::NoMetadata)?;
        let (records, log_end) = Record::replay(&buf, generation, start);
        // Rule 4: nothing past the valid records may turn valid later.
        if log_end < buf.len() {
            disks.meta[active].set_len(log_end as u64)?;
            disks.meta[active].sync()?;
        }
        // Bounds no real store comes near; beyond them arithmetic could
        // overflow, so such metadata is refused as inconsistent.
        const LIMIT: u64 = 1 << 62;
        let bad_extent =
            |e: &ExtentRec| e.id >= LIMIT || e.off >= LIMIT || e.len as u64 > MAX_EXTENT;
        let bad_file = |f: &FileRec| f.object == SERVER_OBJECT || f.object >= LIMIT;
        let inconsistent = || {
            OpenError::Inconsistent(
                "an object number, extent number, offset or extent length is out of range".into(),
            )
        };
        if snap.next_object >= LIMIT || snap.next_extent >= LIMIT {
            return Err(inconsistent());
        }
        if snap.extents.iter().any(bad_extent) || snap.files.iter().any(bad_file) {
            return Err(inconsistent());
        }
        for r in &records {
            let bad = match r {
                Record::Commit { file, extents } => {
                    bad_file(file) || extents.iter().any(bad_extent)
                }
                Record::Move { off, .. } => *off >= LIMIT,
                Record::Destroy { .. } | Record::Bytes { .. } => false,
            };
            if bad {
                return Err(inconsistent());
            }
        }
        let mut extents: HashMap<u64, Extent> = HashMap::new();
        let mut files: HashMap<u64, FileRec> = HashMap::new();
        let mut next_object = snap.next_object;
        let mut next_extent = snap.next_extent;
        let add_extent = |extents: &mut HashMap<u64, Extent>, e: &ExtentRec| {
            extents.insert(
                e.id,
                Extent {
                    off: e.off,
                    len: e.len,
                    hash: e.hash,
                    refs: 0,
                    logged: true,
                },
            );
        };
        for e in &snap.extents {
            add_extent(&mut extents, e);
            next_extent = next_extent.max(e.id + 1);
        }
        for f in snap.files {
            next_object = next_object.max(f.object + 1);
            files.insert(f.object, f);
        }
        // Bytes of extents written with the records, by extent.
        let mut written: HashMap<u64, Vec<u8>> = HashMap::new();
        for r in records {
            match r {
                Record::Bytes { extent, data } => {
                    written.insert(extent, data);
                }
                Record::Commit { file, extents: new } => {
                    for e in &new {
                        add_extent(&mut extents, e);
                        next_extent = next_extent.max(e.id + 1);
                    }
                    next_object = next_object.max(file.object + 1);
                    files.insert(file.object, file);
                }
                Record::Destroy { object } => {
                    files.remove(&object);
                }
                Record::Move { extent, off } => {
                    if let Some(e) = extents.get_mut(&extent) {
                        e.off = off;
                    }
                }
            }
        }
        for f in files.values() {
            for p in f.pieces.iter().filter(|p| p.extent != HOLE) {
                let e = extents.get_mut(&p.extent).ok_or_else(|| {
                    OpenError::Inconsistent(format!(
                        "file {} refers to unknown extent {}",
                        f.object, p.extent
                    ))
                })?;
                if p.off as u64 + p.len as u64 > e.len as u64 {
                    return Err(OpenError::Inconsistent(format!(
                        "file {} reads past the end of extent {}",
                        f.object, p.extent
                    )));
                }
                e.refs += 1;
            }
        }
        extents.retain(|_, e| e.refs > 0);
        // Rule 1: a live extent whose bytes the log holds gets them back
        // if a crash lost them on the data disk (its space is its own: no
        // other extent was written there since).  The checkpoint below
        // syncs them.
        for (id, data) in written {
            let Some(e) = extents.get(&id) else { continue };
            if data.len() != e.len as usize || *blake3::hash(&data).as_bytes() != e.hash {
                return Err(OpenError::Inconsistent(format!(
                    "the bytes logged for extent {id} are not the extent's"
                )));
            }
            let mut now = vec![0u8; data.len()];
            disks.data.read_at(&mut now, e.off)?;
            if now != data {
                disks.data.write_at(&data, e.off)?;
            }
        }
        // Numbers handed out since the last durable record (uncommitted
        // files, commits not yet flushed) are not known: each start takes
        // the next era of object numbers, made durable by the checkpoint
        // below, so no number is ever given to two files and a capability
        // of a file lost at a crash is answered "not found".
        let next_object = (next_object / OBJECT_ERA + 1) * OBJECT_ERA;
        if next_object >= LIMIT {
            return Err(inconsistent());
        }
        let data_len = disks.data.len()?;
        let used: Vec<(u64, u64)> = extents.values().map(|e| (e.off, e.len as u64)).collect();
        let data_end = used
            .iter()
            .map(|&(o, l)| o + l)
            .max()
            .unwrap_or(0)
            .max(data_len);
        {
            let mut sorted = used.clone();
            sorted.sort_unstable();
            for w in sorted.windows(2) {
                if w[0].0 + w[0].1 > w[1].0 {
                    return Err(OpenError::Inconsistent(format!(
                        "extents at {} and {} overlap",
                        w[0].0, w[1].0
                    )));
                }
            }
        }
        let alloc = Allocator::with_used(data_end, used);
        let ttl = cfg.ttl;
        let files = files
            .into_iter()
            .map(|(k, f)| {
                (
                    k,
                    File {
                        secret: f.secret,
                        size: f.size,
                        pieces: f.pieces,
                        committed: true,
                        digest: f.digest,
                        ttl,
                        touched: Time::ZERO,
                    },
                )
            })
            .collect();
        let rng = match cfg.seed {
            Some(s) => {
                rand_chacha::ChaCha8Rng::seed_from_u64(s ^ generation.rotate_left(17) ^ data_end)
            }
            None => rand_chacha::ChaCha8Rng::from_os_rng(),
        };
        let port = GetPort::from_bytes(snap.port);
        let store = Store {
            put_port: port.put_port(),
            port,
            server_secret: ObjectSecret::from_bytes(snap.server_secret),
            inner: Mutex::new(Inner {
                next_object,
                next_extent,
                files,
                extents,
                alloc,
                log: Vec::new(),
                appended: 0,
                durable: 0,
                pending_free: Vec::new(),
                active,
                generation,
                tail: log_end as u64,
                made: log_end as u64,
                rng,
                destroyed_by_age: 0,
                aged: None,
            }),
            cfg,
            disks,
            flushing: Mutex::new(()),
            maintenance: Mutex::new(()),
            cache: Mutex::new(Cache::default()),
            requests: AtomicU64::new(0),
            request_bytes: AtomicU64::new(0),
        };
        store
            .checkpoint()
            .map_err(|e| OpenError::Io(std::io::Error::other(e.to_string())))?;
        Ok(store)
    }

    /// The server's get-port (its identity, kept in the store).
    pub fn port(&self) -> GetPort {
        self.port
    }

    /// The server's own capability (object 0, every right).
    pub fn server_cap(&self) -> Capability {
        Capability::mint(
            self.put_port,
            ObjectId::new(SERVER_OBJECT),
            Rights::ALL,
            &self.server_secret,
        )
    }

    fn file_cap(&self, obj: u64, secret: &[u8; 32]) -> Capability {
        Capability::mint(
            self.put_port,
            ObjectId::new(obj),
            Rights::ALL,
            &ObjectSecret::from_bytes(*secret),
        )
    }

    fn check_server(&self, cap: &Capability, need: Rights) -> Result<(), FileError> {
        if cap.port() != self.put_port || cap.object().get() != SERVER_OBJECT {
            return Err(FileError::NotFound);
        }
        let have = cap
            .verify(&self.server_secret)
            .map_err(|_| FileError::BadCapability)?;
        if !have.contains(need) {
            return Err(FileError::Denied { have, need });
        }
        Ok(())
    }

    /// Runs one operation (reads too, though a server answers reads with
    /// [`Store::read_into`] to build the reply without a copy).
    pub fn execute<B: OpData>(&self, op: Op<B>, now: Time) -> Result<Answer, FileError> {
        match op {
            Op::Create {
                server,
                flags,
                data,
            } => self
                .create_shared(&server, flags, data.as_ref(), data.shared(), now)
                .map(Answer::Cap),
            Op::Edit { file, flags, edit } => self.edit(&file, flags, edit, now).map(Answer::Cap),
            Op::Commit { file, flags } => self.commit(&file, flags, now).map(|_| Answer::Done),
            Op::Concat {
                server,
                flags,
                parts,
            } => self.concat(&server, flags, &parts, now).map(Answer::Cap),
            Op::Read { file, offset, len } => {
                let mut out = Vec::new();
                self.read_into(&file, offset, len, &mut out)?;
                Ok(Answer::Data(out))
            }
            Op::Stat { file } => self.stat(&file).map(Answer::Stat),
            Op::Map { file, offset } => self.map(&file, offset).map(Answer::Map),
            Op::Destroy { file } => self.destroy(&file).map(|_| Answer::Done),
            Op::Verify { file } => self.verify(&file).map(|_| Answer::Done),
            Op::Touch { files } => Ok(Answer::Touched(self.touch(&files, now))),
            Op::Admin { server, what } => {
                // A server's figures are for everyone it serves (choosing
                // servers needs them); the rest is the administrator's.
                let need = match what {
                    AdminOp::Stats => READ,
                    _ => ADMIN,
                };
                self.check_server(&server, need)?;
                match what {
                    AdminOp::Sync => self.flush().map(|_| Answer::Done),
                    AdminOp::Fsck => Ok(self.fsck()),
                    AdminOp::Compact => self.compact(),
                    AdminOp::Age => {
                        let n = self.age_when_due(now);
                        Ok(Answer::Report {
                            figures: vec![
                                ("aged".into(), u64::from(n.is_some())),
                                ("destroyed".into(), n.unwrap_or(0) as u64),
                            ],
                            problems: vec![],
                        })
                    }
                    AdminOp::Stats => Ok(self.stats_at(now)),
                }
            }
        }
    }

    /// Commits an uncommitted file (needs MODIFY).
    pub fn commit(&self, cap: &Capability, flags: u8, now: Time) -> Result<(), FileError> {
        let lsn = {
            let mut g = self.inner.lock();
            let (obj, _) = g.check(self.put_port, cap, MODIFY)?;
            let f = g.files.get_mut(&obj).unwrap();
            if f.committed {
                // Committing twice is harmless (a retried commit).
                None
            } else {
                f.touched = now;
                Some(g.commit(obj))
            }
        };
        if flags & FLAG_SAFETY != 0 {
            let lsn = lsn.unwrap_or_else(|| self.inner.lock().appended);
            self.sync_to(lsn)?;
        }
        Ok(())
    }

    /// Size and state of a file (needs READ).
    pub fn stat(&self, cap: &Capability) -> Result<Stat, FileError> {
        let g = self.inner.lock();
        let (obj, _) = g.check(self.put_port, cap, READ)?;
        let f = &g.files[&obj];
        Ok(Stat {
            size: f.size,
            committed: f.committed,
            pieces: f.pieces.len() as u32,
            ttl: f.ttl,
            hash: f.digest,
        })
    }

    /// Where a committed file holds data from `offset` on (needs READ):
    /// its data ranges, merged across pieces, at most [`MAX_MAP`] of them
    /// (ask again from the last one's end for more).
    pub fn map(&self, cap: &Capability, offset: u64) -> Result<Vec<(u64, u64)>, FileError> {
        let g = self.inner.lock();
        let (obj, _) = g.check(self.put_port, cap, READ)?;
        let f = &g.files[&obj];
        if !f.committed {
            return Err(FileError::NotCommitted);
        }
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut at = 0u64;
        for p in &f.pieces {
            let (start, end) = (at.max(offset), at + p.len as u64);
            at = end;
            if p.extent == HOLE || end <= start {
                continue;
            }
            let full = out.len() == MAX_MAP;
            match out.last_mut() {
                Some(last) if last.1 == start => last.1 = end,
                _ if full => break,
                _ => out.push((start, end)),
            }
        }
        Ok(out)
    }

    /// Destroys a file (needs DESTROY).
    pub fn destroy(&self, cap: &Capability) -> Result<(), FileError> {
        let mut g = self.inner.lock();
        let (obj, _) = g.check(self.put_port, cap, DESTROY)?;
        g.destroy(obj);
        Ok(())
    }

    /// Resets the time-to-live of every object a capability names (any
    /// right will do); answers which exist.
    pub fn touch(&self, caps: &[Capability], now: Time) -> Vec<bool> {
        let mut g = self.inner.lock();
        caps.iter()
            .map(|c| {
                if c.port() == self.put_port && c.object().get() == SERVER_OBJECT {
                    return c.verify(&self.server_secret).is_ok();
                }
                match g.check(self.put_port, c, Rights::NONE) {
                    Ok((obj, _)) => {
                        let f = g.files.get_mut(&obj).unwrap();
                        f.ttl = self.cfg.ttl;
                        f.touched = now;
                        true
                    }
                    Err(_) => false,
                }
            })
            .collect()
    }

    /// Destroys uncommitted files nobody touched for the configured life.
    pub fn expire(&self, now: Time) -> usize {
        let mut g = self.inner.lock();
        let life = self.cfg.uncommitted_life;
        let old: Vec<u64> = g
            .files
            .iter()
            .filter(|(_, f)| !f.committed && now.saturating_since(f.touched) > life)
            .map(|(&k, _)| k)
            .collect();
        for &obj in &old {
            g.destroy(obj);
        }
        old.len()
    }
}
