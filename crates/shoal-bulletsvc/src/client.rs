//! The client library.
//!
//! ```no_run
//! use shoal_bulletsvc::{FileClient, manager};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = shoal_rpc::Context::from_env()?;
//! // File servers are registered under fileservers/ of a root directory
//! // (`shoal init` keeps yours in ~/.config/shoal/root).
//! let root: shoal_cap::Capability = std::fs::read_to_string("root")?.trim().parse()?;
//! let mut dir = shoal_dirsvc::DirClient::new(&ctx)?;
//! let servers = manager::servers(&mut dir, &root)?;
//! let mut files = FileClient::new(&ctx)?;
//! let cap = files.create(&servers[0].1, b"hello", true)?;   // committed, on disk
//! assert_eq!(files.read_all(&[cap])?, b"hello");
//! # Ok(()) }
//! ```
//!
//! Data moves in chunks of [`CHUNK`] bytes, so files of any size stream
//! through bounded memory.  A file with several replicas is named by the
//! set of their capabilities; reads fail over from one replica to the next
//! (on an unreachable server, a missing file or a corrupted extent) and
//! carry on from the same offset, since every replica holds the same
//! immutable bytes.
//!
//! **Client cache.**  Files never change, so a copy is valid as long as
//! the file exists: with a cache directory ([`FileClient::with_cache`];
//! the command line uses one per user), a read asks a replica for the
//! file's size and digest (one small call, which also checks the
//! capability's rights and that the file still exists), then reads a
//! cached copy with that digest from the local disk's page cache.  Each
//! copy ends with the BLAKE3 of its bytes, and is handed on only after
//! they hash to it.  The cache is the user's own (a private directory,
//! files 0600), so no other user can read or plant a copy.

use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

use shoal_bullet::FileError;
use shoal_bullet::op::{
    self, AdminOp, Answer, CREATE_HEAD, Edit, FLAG_COMMIT, FLAG_SAFETY, Op, Stat,
};
use shoal_cap::Capability;
use shoal_rpc::{CallOptions, Client, Context};

/// How long one call may take before its server counts as unreachable
/// (and a read fails over to the next replica).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(3);

/// Bytes a create or append sends in one call.
pub const CHUNK: usize = 4 << 20;
/// Parts a large create keeps in flight (each on its own endpoint).
const SENDERS: usize = 2;
/// Calls a large read keeps in flight (each on its own endpoint).
const READERS: usize = 2;
/// Bytes a read asks for in one call.
pub const READ_CHUNK: usize = 8 << 20;

/// Why a file call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server refused the operation.
    #[error(transparent)]
    File(#[from] FileError),
    /// The server could not be reached (a write may or may not have run).
    #[error("file server unreachable: {0}")]
    Unreachable(String),
    /// A server's answer could not be decoded.
    #[error("bad answer from a file server: {0}")]
    BadAnswer(String),
    /// Local input or output failed.
    #[error("{0}")]
    Local(String),
    /// Every replica failed; the errors, one per replica.
    #[error("no replica could serve the file: {}", join(.0))]
    AllReplicas(Vec<ClientError>),
}

fn join(errors: &[ClientError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl ClientError {
    /// Whether another replica might do better.
    pub fn try_another(&self) -> bool {
        match self {
            ClientError::File(e) => e.try_another_replica(),
            ClientError::Unreachable(_) | ClientError::BadAnswer(_) => true,
            _ => false,
        }
    }

    /// Whether the file is gone for good: its servers answered that they
    /// hold no such file, or hold it corrupt (every replica's, for
    /// several), so trying again cannot help.  A server that does not
    /// answer may yet: that is not gone.
    pub fn is_gone(&self) -> bool {
        match self {
            ClientError::File(FileError::NotFound | FileError::Corrupt(_)) => true,
            ClientError::AllReplicas(all) => !all.is_empty() && all.iter().all(Self::is_gone),
            _ => false,
        }
    }
}

use crate::cache::{Cache, create_private, seal_cached_copy};

/// A copy of a file's new version made by one request
/// ([`FileClient::begin`]).
#[derive(Debug, Clone)]
pub enum OneCopy<'a> {
    /// A new file of `data` on `server` (less than a [`CHUNK`]).
    Create { server: Capability, data: &'a [u8] },
    /// `file` edited once.
    Edit {
        file: Capability,
        edit: Edit<&'a [u8]>,
    },
}

/// A client of the file servers.
pub struct FileClient {
    ctx: Context,
    rpc: Client,
    cache: Option<Cache>,
    deadline: Duration,
}

/// A reply decoded (its buffer recycled).
/// `op` encoded; a request carrying data into a recycled buffer.
fn encode<D: AsRef<[u8]>>(op: &Op<D>) -> Vec<u8> {
    let mut body = match op {
        Op::Create { data, .. }
        | Op::Edit {
            edit: Edit::Write { data, .. } | Edit::Insert { data, .. },
            ..
        } => shoal_rpc::buffer(data.as_ref().len() + 128),
        _ => Vec::new(),
    };
    op.encode_into(&mut body);
    body
}

/// The capability an answer carries.
fn cap_in(a: Answer) -> Result<Capability, ClientError> {
    match a {
        Answer::Cap(c) => Ok(c),
        a => Err(unexpected(a)),
    }
}

fn answer(reply: Vec<u8>) -> Result<Answer, ClientError> {
    let r = op::decode_result(&reply).map_err(|e| ClientError::BadAnswer(e.to_string()))?;
    shoal_rpc::recycle(reply);
    Ok(r?)
}

pub(crate) fn unexpected(a: Answer) -> ClientError {
    ClientError::BadAnswer(format!("unexpected answer {a:?}"))
}

impl FileClient {
    pub fn new(ctx: &Context) -> Result<FileClient, ClientError> {
        Ok(FileClient {
            ctx: ctx.clone(),
            rpc: ctx
                .client()
                .map_err(|e| ClientError::Unreachable(e.to_string()))?,
            cache: None,
            deadline: DEFAULT_DEADLINE,
        })
    }

    /// Keeps copies of files read in `cache`.
    pub fn with_cache(mut self, cache: Option<Cache>) -> Self {
        if let Some(c) = &cache {
            let _ = std::fs::create_dir_all(&c.dir);
        }
        self.cache = cache;
        self
    }

    /// How long one call may take before the server counts as unreachable.
    pub fn deadline(&mut self, d: Duration) -> &mut Self {
        self.deadline = d;
        self
    }

    /// One call to the server of `cap`.
    pub fn call(&mut self, cap: &Capability, op: &Op) -> Result<Answer, ClientError> {
        self.call_any(cap, op)
    }

    /// [`FileClient::call`] with data owned or borrowed.
    pub fn call_any<D: AsRef<[u8]>>(
        &mut self,
        cap: &Capability,
        op: &Op<D>,
    ) -> Result<Answer, ClientError> {
        answer(self.raw(cap, op)?)
    }

    /// One call with a request already encoded.
    fn call_body(&mut self, cap: &Capability, body: bytes::Bytes) -> Result<Answer, ClientError> {
        answer(self.send(cap, body)?)
    }

    /// One call, answering the raw reply.  Large requests are encoded into
    /// a recycled buffer.
    fn raw<D: AsRef<[u8]>>(
        &mut self,
        cap: &Capability,
        op: &Op<D>,
    ) -> Result<Vec<u8>, ClientError> {
        self.send(cap, encode(op).into())
    }

    /// Sends an encoded request to the server of `cap` within the
    /// deadline; the raw reply.
    fn send(&mut self, cap: &Capability, body: bytes::Bytes) -> Result<Vec<u8>, ClientError> {
        let opts = self.options();
        self.rpc
            .trans_with(&cap.port(), body, &opts)
            .map_err(|e| ClientError::Unreachable(e.to_string()))
    }

    fn options(&self) -> CallOptions {
        CallOptions {
            deadline: Some(self.deadline),
            cancel: None,
        }
    }

    fn cap_of<D: AsRef<[u8]>>(
        &mut self,
        cap: &Capability,
        op: &Op<D>,
    ) -> Result<Capability, ClientError> {
        self.call_any(cap, op).and_then(cap_in)
    }

    /// Creates a committed file from `data` on the server `server`;
    /// with `safety`, returns once it is on the server's disk.
    pub fn create(
        &mut self,
        server: &Capability,
        data: &[u8],
        safety: bool,
    ) -> Result<Capability, ClientError> {
        if data.len() < CHUNK {
            // Without create_from's chunk buffer (4 MiB to clear for every
            // small file).
            let flags = FLAG_COMMIT | if safety { FLAG_SAFETY } else { 0 };
            return Ok(self.create_whole(&[*server], flags, data)?.remove(0));
        }
        let mut caps = self.create_from(&[*server], data, safety, |_| {})?;
        Ok(caps.remove(0))
    }

    /// Creates one committed file on each of `servers` from what `input`
    /// yields (streamed in chunks, so of any size); `progress` hears the
    /// bytes sent so far.  On failure nothing is left behind (the
    /// uncommitted parts are destroyed, or expire).
    ///
    /// Input of more than one chunk goes as uncommitted parts, created by
    /// two threads at once (each with its own RPC endpoint, so the servers
    /// work on one part while the next travels), then joined on each server
    /// by one concat call that commits the whole.  With a cache, the bytes
    /// are kept locally too (write-through: immutable, so always valid).
    pub fn create_from(
        &mut self,
        servers: &[Capability],
        mut input: impl Read + Send,
        safety: bool,
        mut progress: impl FnMut(u64),
    ) -> Result<Vec<Capability>, ClientError> {
        if servers.is_empty() {
            return Err(ClientError::Local(
                "no file server to store the file on".into(),
            ));
        }
        let flags = FLAG_COMMIT | if safety { FLAG_SAFETY } else { 0 };
        let mut first = shoal_rpc::buffer(CREATE_HEAD + CHUNK);
        let n = fill_part(&mut first, &mut input)?;
        if n < CHUNK {
            let caps = self.create_whole(servers, flags, &first[CREATE_HEAD..])?;
            progress(n as u64);
            return Ok(caps);
        }
        // Parts, two at a time.
        let shared = Parts {
            input: parking_lot::Mutex::new((input, Some(first), 0usize, false)),
            parts: parking_lot::Mutex::new(Vec::new()),
            failed: parking_lot::Mutex::new(None),
            sent: std::sync::atomic::AtomicU64::new(0),
        };
        let mut others = Vec::with_capacity(SENDERS - 1);
        for _ in 1..SENDERS {
            let mut c = FileClient::new(&self.ctx)?;
            c.deadline = self.deadline;
            others.push(c);
        }
        std::thread::scope(|scope| {
            for other in &mut others {
                let shared = &shared;
                scope.spawn(move || other.send_parts(servers, shared, &mut |_| {}));
            }
            self.send_parts(servers, &shared, &mut progress);
        });
        let mut parts = shared.parts.into_inner();
        parts.sort_by_key(|p| p.0);
        let all: Vec<Capability> = parts.iter().flat_map(|p| p.1.iter().copied()).collect();
        if let Some(e) = shared.failed.into_inner() {
            self.destroy_all(&all);
            return Err(e);
        }
        let mut caps = Vec::new();
        for (i, s) in servers.iter().enumerate() {
            let op = Op::<Vec<u8>>::Concat {
                server: *s,
                flags,
                parts: parts.iter().map(|p| p.1[i]).collect(),
            };
            match self.cap_of(s, &op) {
                Ok(c) => caps.push(c),
                Err(e) => {
                    self.destroy_all(&caps);
                    self.destroy_all(&all);
                    return Err(e);
                }
            }
        }
        progress(shared.sent.into_inner());
        Ok(caps)
    }

    /// One sender of [`FileClient::create_from`]'s parts: takes the next
    /// chunk of the input, creates it as an uncommitted part on every
    /// server, until the input ends or a sender fails.
    fn send_parts<R: Read>(
        &mut self,
        servers: &[Capability],
        shared: &Parts<R>,
        progress: &mut dyn FnMut(u64),
    ) {
        // The request body, reused: the data is read in right behind the
        // header, and the body goes to every server with only the header
        // changed.
        let mut buf = shoal_rpc::buffer(CREATE_HEAD + CHUNK);
        loop {
            if shared.failed.lock().is_some() {
                return;
            }
            let (index, n) = {
                let mut g = shared.input.lock();
                let (input, first, next, eof) = &mut *g;
                let n = if let Some(f) = first.take() {
                    buf = f;
                    buf.len() - CREATE_HEAD
                } else if *eof {
                    return;
                } else {
                    match fill_part(&mut buf, input) {
                        Ok(n) => {
                            *eof = n < CHUNK;
                            n
                        }
                        Err(e) => {
                            *shared.failed.lock() = Some(e);
                            return;
                        }
                    }
                };
                if n == 0 {
                    return;
                }
                *next += 1;
                (*next - 1, n)
            };
            let mut caps = Vec::with_capacity(servers.len());
            for s in servers {
                buf[..CREATE_HEAD].copy_from_slice(&op::create_head(s, 0, n as u32));
                let body = bytes::Bytes::from(std::mem::take(&mut buf));
                let got = self.call_body(s, body.clone());
                // Back to a buffer (the RPC is done with it: no copy).
                buf = body.try_into_mut().map_or_else(|b| b.to_vec(), Vec::from);
                match got.and_then(cap_in) {
                    Ok(c) => caps.push(c),
                    Err(e) => {
                        self.destroy_all(&caps);
                        *shared.failed.lock() = Some(e);
                        return;
                    }
                }
            }
            shared.parts.lock().push((index, caps));
            let sent = n as u64
                + shared
                    .sent
                    .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            progress(sent);
        }
    }

    /// A file of at most one chunk: one create call per server (those made
    /// are destroyed if one fails), then a copy in the cache.
    fn create_whole(
        &mut self,
        servers: &[Capability],
        flags: u8,
        data: &[u8],
    ) -> Result<Vec<Capability>, ClientError> {
        let mut caps = Vec::with_capacity(servers.len());
        for s in servers {
            let op = Op::Create {
                server: *s,
                flags,
                data,
            };
            match self.cap_of(s, &op) {
                Ok(c) => caps.push(c),
                Err(e) => {
                    self.destroy_all(&caps);
                    return Err(e);
                }
            }
        }
        self.cache_write(data, &caps);
        Ok(caps)
    }

    fn destroy_all(&mut self, caps: &[Capability]) {
        for c in caps {
            let _ = self.call(c, &Op::Destroy { file: *c });
        }
    }

    /// Keeps a copy of a small new file in the cache (write-through: the
    /// file is immutable, so the copy stays valid).  Bigger files are
    /// cached when first read instead: copying them here would cost the
    /// writer a second local write of everything it sends.
    fn cache_write(&mut self, data: &[u8], caps: &[Capability]) {
        let Some(cache) = self.cache.clone() else {
            return;
        };
        let Ok((st, first)) = self.stat(&caps[..1]) else {
            return;
        };
        let path = cache.path(&first, &st);
        let tmp = path.with_extension(format!("tmp{}", rand::random::<u32>()));
        let written = create_private(&tmp).and_then(|mut f| {
            f.write_all(data)?;
            f.write_all(blake3::hash(data).as_bytes())
        });
        if written.is_ok() && std::fs::rename(&tmp, &path).is_ok() {
            cache.trim();
        } else {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    /// Applies an edit (see [`Edit`]): to an uncommitted file in place, or
    /// to a committed one, giving a new file.
    pub fn edit(
        &mut self,
        file: &Capability,
        edit: Edit,
        commit: bool,
        safety: bool,
    ) -> Result<Capability, ClientError> {
        let flags = if commit { FLAG_COMMIT } else { 0 } | if safety { FLAG_SAFETY } else { 0 };
        self.cap_of(
            file,
            &Op::Edit {
                file: *file,
                flags,
                edit,
            },
        )
    }

    /// Sends the one request that makes `copy` (committed; with `safety`,
    /// on the server's disk when answered), without waiting for its
    /// answer ([`FileClient::finish`] does): one thread may so have a
    /// copy under way at each of several servers, a client each.  A file
    /// made this way is not kept in the client's cache.
    pub fn begin(&mut self, copy: OneCopy<'_>, safety: bool) -> Result<(), ClientError> {
        let flags = FLAG_COMMIT | if safety { FLAG_SAFETY } else { 0 };
        let (cap, op) = match copy {
            OneCopy::Create { server, data } => (
                server,
                Op::Create {
                    server,
                    flags,
                    data,
                },
            ),
            OneCopy::Edit { file, edit } => (file, Op::Edit { file, flags, edit }),
        };
        let opts = self.options();
        self.rpc
            .start(&cap.port(), bytes::Bytes::from(encode(&op)), &opts)
            .map_err(|e| ClientError::Unreachable(e.to_string()))
    }

    /// The file [`FileClient::begin`] made.
    pub fn finish(&mut self) -> Result<Capability, ClientError> {
        let reply = self
            .rpc
            .finish()
            .map_err(|e| ClientError::Unreachable(e.to_string()))?;
        answer(reply).and_then(cap_in)
    }

    /// Commits an uncommitted file.
    pub fn commit(&mut self, file: &Capability, safety: bool) -> Result<(), ClientError> {
        let flags = if safety { FLAG_SAFETY } else { 0 };
        self.call(file, &Op::Commit { file: *file, flags })
            .map(|_| ())
    }

    /// Size and state of a file, from the first replica that answers.
    pub fn stat(&mut self, replicas: &[Capability]) -> Result<(Stat, Capability), ClientError> {
        let mut errors = Vec::new();
        for c in replicas {
            match self.call(c, &Op::Stat { file: *c }) {
                Ok(Answer::Stat(s)) => return Ok((s, *c)),
                Ok(a) => errors.push(unexpected(a)),
                Err(e) if e.try_another() => errors.push(e),
                Err(e) => return Err(e),
            }
        }
        Err(ClientError::AllReplicas(errors))
    }

    /// Reads `len` bytes at `offset` of one replica.
    pub fn read(
        &mut self,
        file: &Capability,
        offset: u64,
        len: u32,
    ) -> Result<Vec<u8>, ClientError> {
        match self.call(
            file,
            &Op::Read {
                file: *file,
                offset,
                len,
            },
        )? {
            Answer::Data(d) => Ok(d),
            a => Err(unexpected(a)),
        }
    }

    /// Reads a whole file into memory.
    pub fn read_all(&mut self, replicas: &[Capability]) -> Result<Vec<u8>, ClientError> {
        let mut out = Vec::new();
        self.read_with(replicas, |chunk| {
            out.extend_from_slice(chunk);
            Ok(())
        })?;
        Ok(out)
    }

    /// Writes a whole file to `w`; returns its size.
    pub fn read_to(
        &mut self,
        replicas: &[Capability],
        mut w: impl Write,
        mut progress: impl FnMut(u64),
    ) -> Result<u64, ClientError> {
        let mut done = 0u64;
        self.read_with(replicas, |chunk| {
            w.write_all(chunk)
                .map_err(|e| ClientError::Local(e.to_string()))?;
            done += chunk.len() as u64;
            progress(done);
            Ok(())
        })?;
        w.flush().map_err(|e| ClientError::Local(e.to_string()))?;
        Ok(done)
    }

    /// Hands a whole file to `sink` in order, chunk by chunk: from the
    /// cache if it holds a copy, else from the replicas, failing over.
    pub fn read_with(
        &mut self,
        replicas: &[Capability],
        mut sink: impl FnMut(&[u8]) -> Result<(), ClientError>,
    ) -> Result<u64, ClientError> {
        let (st, first) = self.stat(replicas)?;
        if !st.committed {
            return Err(FileError::NotCommitted.into());
        }
        let cached = self.cache.clone().map(|c| (c.path(&first, &st), c));
        if let Some((path, cache)) = &cached
            && let Ok(mut f) = std::fs::File::open(path)
            && f.metadata().map(|m| m.len()).ok() == Some(st.size + 32)
        {
            // A copy is used only if its bytes hash to the BLAKE3 written
            // after them: checked in full before the first byte goes on, so
            // a damaged copy is never half delivered (the second pass reads
            // from the page cache), once per process (see `Cache`).
            if cache.intact(&mut f, st.size) {
                let _ = f.set_modified(std::time::SystemTime::now());
                let mut buf = vec![0u8; 1 << 20];
                let mut left = st.size;
                while left > 0 {
                    let want = left.min(buf.len() as u64) as usize;
                    let n = f
                        .read(&mut buf[..want])
                        .map_err(|e| ClientError::Local(e.to_string()))?;
                    if n == 0 {
                        return Err(ClientError::Local("cached copy shrank".into()));
                    }
                    sink(&buf[..n])?;
                    left -= n as u64;
                }
                return Ok(st.size);
            }
            let _ = std::fs::remove_file(path);
        }
        // Tee into a new cache entry if the file fits.
        let mut tee = cached
            .as_ref()
            .filter(|(_, c)| st.size <= c.max_bytes / 2)
            .and_then(|(path, _)| {
                let tmp = path.with_extension(format!("tmp{}", rand::random::<u32>()));
                create_private(&tmp).ok().map(|f| (tmp, f))
            });
        // Two calls in flight while all goes well; then, from wherever that
        // stopped, one at a time with failover between replicas.
        let mut offset = if st.size > 2 * READ_CHUNK as u64 {
            self.read_parallel(&first, st.size, &mut sink, &mut tee)?
        } else {
            0
        };
        let mut order: Vec<Capability> = vec![first];
        order.extend(replicas.iter().filter(|c| **c != first));
        let mut at = 0;
        let mut errors = Vec::new();
        while offset < st.size {
            let want = (st.size - offset).min(READ_CHUNK as u64) as u32;
            let file = order[at];
            let got = self.raw(
                &file,
                &Op::<Vec<u8>>::Read {
                    file,
                    offset,
                    len: want,
                },
            );
            // The data is used in the reply buffer itself, then recycled.
            let got = got.and_then(|reply| match op::data_of(&reply) {
                Some(_) => Ok(reply),
                None => match op::decode_result(&reply) {
                    Ok(Ok(a)) => Err(unexpected(a)),
                    Ok(Err(e)) => Err(e.into()),
                    Err(e) => Err(ClientError::BadAnswer(e.to_string())),
                },
            });
            match got {
                Ok(reply) if op::data_of(&reply).is_some_and(|d| !d.is_empty()) => {
                    let d = op::data_of(&reply).unwrap();
                    if let Some((_, f)) = &mut tee
                        && f.write_all_at(d, offset).is_err()
                    {
                        tee = None;
                    }
                    sink(d)?;
                    offset += d.len() as u64;
                    shoal_rpc::recycle(reply);
                }
                Ok(_) => {
                    errors.push(ClientError::BadAnswer(format!(
                        "{at}: file shorter than its size"
                    )));
                    at += 1;
                }
                Err(e) if e.try_another() => {
                    errors.push(e);
                    at += 1;
                }
                Err(e) => return Err(e),
            }
            if at >= order.len() {
                if let Some((tmp, _)) = tee {
                    let _ = std::fs::remove_file(tmp);
                }
                return Err(ClientError::AllReplicas(errors));
            }
        }
        if let (Some((tmp, mut f)), Some((path, cache))) = (tee, &cached) {
            let sealed = seal_cached_copy(&mut f, st.size);
            drop(f);
            if sealed.is_ok() && std::fs::rename(&tmp, path).is_ok() {
                cache.trim();
            } else {
                let _ = std::fs::remove_file(tmp);
            }
        }
        Ok(st.size)
    }

    /// Reads `file` from the start with two calls in flight (a helper
    /// thread with its own endpoint fetches the odd chunks), handing the
    /// chunks to `sink` in order.  Returns how far it got: the whole size,
    /// or where a call failed (the caller goes on from there).
    fn read_parallel(
        &mut self,
        file: &Capability,
        size: u64,
        sink: &mut impl FnMut(&[u8]) -> Result<(), ClientError>,
        tee: &mut Option<(PathBuf, std::fs::File)>,
    ) -> Result<u64, ClientError> {
        let mut readers = Vec::with_capacity(READERS);
        for _ in 0..READERS {
            let Ok(mut c) = FileClient::new(&self.ctx) else {
                return Ok(0);
            };
            c.deadline = self.deadline;
            readers.push(c);
        }
        let chunk = READ_CHUNK as u64;
        let count = size.div_ceil(chunk);
        let fetch = |client: &mut FileClient, i: u64| -> Option<Vec<u8>> {
            let offset = i * chunk;
            let want = (size - offset).min(chunk);
            let reply = client
                .raw(
                    file,
                    &Op::<Vec<u8>>::Read {
                        file: *file,
                        offset,
                        len: want as u32,
                    },
                )
                .ok()?;
            (op::data_of(&reply)?.len() as u64 == want).then_some(reply)
        };
        let mut done = 0u64;
        std::thread::scope(|scope| -> Result<(), ClientError> {
            // Reader r fetches chunks r, r + READERS, ...; this thread hands
            // them to the sink in order.
            let mut inboxes = Vec::with_capacity(READERS);
            for (r, mut client) in readers.into_iter().enumerate() {
                let (tx, rx) = std::sync::mpsc::sync_channel::<Option<Vec<u8>>>(1);
                inboxes.push(rx);
                let fetch = &fetch;
                scope.spawn(move || {
                    for i in (r as u64..count).step_by(READERS) {
                        let got = fetch(&mut client, i);
                        let stop = got.is_none();
                        if tx.send(got).is_err() || stop {
                            return;
                        }
                    }
                });
            }
            for i in 0..count {
                let Ok(Some(reply)) = inboxes[(i % READERS as u64) as usize].recv() else {
                    return Ok(());
                };
                let d = op::data_of(&reply).expect("checked");
                if let Some((_, f)) = tee
                    && f.write_all_at(d, done).is_err()
                {
                    *tee = None;
                }
                sink(d)?;
                done += d.len() as u64;
                shoal_rpc::recycle(reply);
            }
            Ok(())
        })?;
        Ok(done)
    }

    /// A reader of a whole file (with its own endpoint), chunk by chunk,
    /// failing over between replicas: to copy a file of any size in
    /// bounded memory (the object manager re-creates replicas with it).
    pub fn reader(&mut self, replicas: &[Capability]) -> Result<FileReader, ClientError> {
        let (st, _) = self.stat(replicas)?;
        if !st.committed {
            return Err(FileError::NotCommitted.into());
        }
        let mut client = FileClient::new(&self.ctx)?;
        client.deadline = self.deadline;
        Ok(FileReader {
            client,
            replicas: replicas.to_vec(),
            at: 0,
            offset: 0,
            size: st.size,
            buf: Vec::new(),
            pos: 0,
        })
    }

    /// Destroys one replica.
    pub fn destroy(&mut self, file: &Capability) -> Result<(), ClientError> {
        self.call(file, &Op::Destroy { file: *file }).map(|_| ())
    }

    /// Resets the time-to-live of files of one server (all of `files`
    /// must name objects of that server); answers which exist.
    pub fn touch(&mut self, files: &[Capability]) -> Result<Vec<bool>, ClientError> {
        let Some(first) = files.first() else {
            return Ok(vec![]);
        };
        let mut out = Vec::with_capacity(files.len());
        for part in files.chunks(shoal_bullet::model::MAX_TOUCH) {
            match self.call(
                first,
                &Op::Touch {
                    files: part.to_vec(),
                },
            )? {
                Answer::Touched(v) => out.extend(v),
                a => return Err(unexpected(a)),
            }
        }
        Ok(out)
    }

    /// An admin operation on a server (needs its capability with ADMIN).
    pub fn admin(&mut self, server: &Capability, what: AdminOp) -> Result<Answer, ClientError> {
        let saved = self.deadline;
        // fsck and compaction take as long as the store is big.
        if matches!(what, AdminOp::Fsck | AdminOp::Compact) {
            self.deadline = Duration::from_secs(3600);
        }
        let r = self.call(
            server,
            &Op::Admin {
                server: *server,
                what,
            },
        );
        self.deadline = saved;
        r
    }
}

/// A whole file as a byte stream (see [`FileClient::reader`]).
pub struct FileReader {
    client: FileClient,
    replicas: Vec<Capability>,
    /// The replica read from.
    at: usize,
    offset: u64,
    size: u64,
    buf: Vec<u8>,
    pos: usize,
}

impl FileReader {
    /// The size of the file read.
    pub fn size(&self) -> u64 {
        self.size
    }
}

impl Read for FileReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.pos == self.buf.len() {
            if self.offset >= self.size {
                return Ok(0);
            }
            let want = (self.size - self.offset).min(READ_CHUNK as u64) as u32;
            let Some(file) = self.replicas.get(self.at).copied() else {
                return Err(std::io::Error::other("no replica could serve the file"));
            };
            match self.client.read(&file, self.offset, want) {
                Ok(d) if !d.is_empty() => {
                    self.offset += d.len() as u64;
                    self.buf = d;
                    self.pos = 0;
                }
                Ok(_) => self.at += 1,
                Err(e) if e.try_another() => self.at += 1,
                Err(e) => return Err(std::io::Error::other(e.to_string())),
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// What the senders of [`FileClient::create_from`] share: the input (and
/// its first chunk, the next chunk's number, whether it ended), the parts
/// made (chunk number, one capability per server), the first error, and
/// the bytes sent.
struct Parts<R> {
    input: parking_lot::Mutex<(R, Option<Vec<u8>>, usize, bool)>,
    parts: parking_lot::Mutex<Vec<(usize, Vec<Capability>)>>,
    failed: parking_lot::Mutex<Option<ClientError>>,
    sent: std::sync::atomic::AtomicU64,
}

/// Reads the next chunk of `input` into `buf` behind room for a create
/// request's header ([`CREATE_HEAD`] bytes, filled in by the sender);
/// returns the data bytes read (`buf` holds the header room and those).
/// The buffer keeps its earlier bytes where they are overwritten anyway,
/// so a reused one is not cleared for every chunk.
fn fill_part(buf: &mut Vec<u8>, input: &mut impl Read) -> Result<usize, ClientError> {
    buf.resize(CREATE_HEAD + CHUNK, 0);
    let n = fill(input, &mut buf[CREATE_HEAD..])?;
    buf.truncate(CREATE_HEAD + n);
    Ok(n)
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn fill(input: &mut impl Read, buf: &mut [u8]) -> Result<usize, ClientError> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ClientError::Local(e.to_string())),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_gone_only_when_every_replica_says_so() {
        let missing = || ClientError::File(FileError::NotFound);
        let away = || ClientError::Unreachable("timed out".into());
        assert!(missing().is_gone());
        assert!(ClientError::AllReplicas(vec![missing(), missing()]).is_gone());
        assert!(
            !ClientError::AllReplicas(vec![missing(), away()]).is_gone(),
            "the server away may hold it"
        );
        assert!(!ClientError::AllReplicas(vec![]).is_gone());
        assert!(!away().is_gone());
        let shown = ClientError::AllReplicas(vec![missing(), away()]).to_string();
        assert!(
            shown.contains("; file server unreachable: timed out"),
            "{shown}"
        );
    }
}
