//! The file server: a [`Store`] on three files of a data directory, served
//! on the server's own port by a pool of threads, with a housekeeping
//! thread that flushes commits made without the safety flag, expires
//! uncommitted files (ageing passes run only when a manager asks, at most
//! one per `age_gap`).
//!
//! Directory layout: `data` (extents), `meta.0` and `meta.1` (metadata,
//! see `shoal_bullet::meta`).  A new directory is formatted with a fresh
//! random port; the port is part of the metadata, so the server's and its
//! files' capabilities stay valid across restarts.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use shoal_bullet::op::{self, Op};
use shoal_bullet::{Disk, Disks, FileError, Store, StoreConfig};
use shoal_cap::{Capability, GetPort};
use shoal_rpc::{Context, Rope, Server};
use shoal_time::Time;

use crate::disk::FileDisk;

/// How a file server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub store: StoreConfig,
    /// RPC server threads.
    pub threads: usize,
    /// Commits without the safety flag are durable within this long.
    pub flush_every: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            store: StoreConfig::default(),
            threads: 2,
            flush_every: Duration::from_millis(200),
        }
    }
}

/// Opens the store in `dir` (made private: only this user may enter it),
/// formatting it if the directory holds none.
pub fn open_store(dir: &Path, cfg: StoreConfig) -> Result<Store<FileDisk>, String> {
    // The metadata holds the server's get-port and every file's secret.
    shoal_rpc::secrets::dir(dir, true)?;
    let f = |n: &str| FileDisk::open(&dir.join(n)).map_err(|e| e.to_string());
    let disks = Disks {
        data: f("data")?,
        meta: [f("meta.0")?, f("meta.1")?],
    };
    let fresh = disks.meta[0].len().map_err(|e| e.to_string())? == 0
        && disks.meta[1].len().map_err(|e| e.to_string())? == 0
        && disks.data.len().map_err(|e| e.to_string())? == 0;
    let store = if fresh {
        Store::format(disks, GetPort::random(), cfg)
    } else {
        Store::open(disks, cfg)
    };
    store.map_err(|e| format!("{}: {e}", dir.display()))
}

/// A running file server.
pub struct FileServer {
    store: Arc<Store<FileDisk>>,
    server: Arc<Server>,
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    dir: PathBuf,
}

impl FileServer {
    /// Opens (or formats) the store in `dir` and serves it.
    pub fn start(ctx: &Context, dir: &Path, cfg: ServerConfig) -> Result<FileServer, String> {
        let store = Arc::new(open_store(dir, cfg.store.clone())?);
        let server = Arc::new(ctx.serve(store.port()).map_err(|e| e.to_string())?);
        let stop = Arc::new(AtomicBool::new(false));
        let epoch = Instant::now();
        let mut threads = Vec::new();
        for i in 0..cfg.threads.max(1) {
            let (store, server) = (store.clone(), server.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("file-{i}"))
                    .spawn(move || serve(&store, &server, epoch))
                    .map_err(|e| e.to_string())?,
            );
        }
        {
            let (store, stop) = (store.clone(), stop.clone());
            threads.push(
                std::thread::Builder::new()
                    .name("file-housekeeping".into())
                    .spawn(move || housekeeping(&store, &stop, &cfg, epoch))
                    .map_err(|e| e.to_string())?,
            );
        }
        Ok(FileServer {
            store,
            server,
            threads,
            stop,
            dir: dir.to_path_buf(),
        })
    }

    /// The server's capability (create and admin rights).
    pub fn cap(&self) -> Capability {
        self.store.server_cap()
    }

    /// The store (for status and tests).
    pub fn store(&self) -> &Store<FileDisk> {
        &self.store
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops serving, then makes everything committed durable.
    pub fn stop(mut self) -> Result<(), FileError> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.server.shutdown();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.store.flush()
    }
}

/// Reads at least this big are answered from the extents in place.
const GATHER_READ: usize = 64 << 10;

/// Requests at least this big lend their buffer to the store's cache (a
/// new file's extents stay in it), instead of the cache copying them.
const SHARE_REQUEST: usize = 1 << 20;

/// A request's buffer, shared by the extents cached from it; back to the
/// RPC layer's pool when the last of them is dropped.
struct Pooled(Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        shoal_rpc::recycle(std::mem::take(&mut self.0));
    }
}

fn serve(store: &Store<FileDisk>, server: &Server, epoch: Instant) {
    while let Ok(mut req) = server.getreq() {
        let now = Time::ZERO + epoch.elapsed();
        // The request's data is used where it lies (no copy); a large
        // request's buffer is shared, so that a create's extents stay
        // cached in it.  A large read's reply is the verified extents
        // themselves behind a small prefix, sent without being copied
        // together; a small one is built in one recycled buffer.
        let shared =
            (req.body().len() >= SHARE_REQUEST).then(|| Bytes::from_owner(Pooled(req.take_body())));
        let body = shared.as_deref().unwrap_or(req.body());
        let op = Op::decode_ref(body);
        if !matches!(op, Ok(Op::Admin { .. })) {
            store.count_request(body.len());
        }
        let reply: Rope = match op {
            Ok(Op::Read { file, offset, len }) if len as usize >= GATHER_READ => {
                match store.read_pieces(&file, offset, len) {
                    Ok(pieces) => {
                        let n = pieces.iter().map(|(_, r)| r.len()).sum();
                        let head = Bytes::copy_from_slice(&op::data_head(n));
                        let data = pieces.into_iter().map(|(extent, r)| extent.slice(r));
                        Rope::from_pieces(std::iter::once(head).chain(data))
                    }
                    Err(e) => op::encode_result(&Err(e)).into(),
                }
            }
            Ok(Op::Read { file, offset, len }) => {
                let mut buf = shoal_rpc::buffer(6 + len as usize);
                buf.extend_from_slice(&op::data_prefix(0));
                match store.read_into(&file, offset, len, &mut buf) {
                    Ok(()) => {
                        op::finish_data(&mut buf);
                        buf.into()
                    }
                    Err(e) => op::encode_result(&Err(e)).into(),
                }
            }
            Ok(Op::Create {
                server,
                flags,
                data,
            }) if let Some(shared) = &shared => {
                let data = shared.slice_ref(data);
                let op = Op::Create {
                    server,
                    flags,
                    data,
                };
                op::encode_result(&store.execute(op, now)).into()
            }
            Ok(op) => op::encode_result(&store.execute(op, now)).into(),
            Err(e) => op::encode_result(&Err(FileError::BadRequest(e.to_string()))).into(),
        };
        if server.putrep(&req, reply).is_err() {
            break;
        }
    }
}

fn housekeeping(store: &Store<FileDisk>, stop: &AtomicBool, cfg: &ServerConfig, epoch: Instant) {
    let mut last_expire = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(cfg.flush_every);
        if let Err(e) = store.flush() {
            tracing::warn!("file store flush failed: {e}");
        }
        if last_expire.elapsed() > Duration::from_secs(1) {
            last_expire = Instant::now();
            let n = store.expire(Time::ZERO + epoch.elapsed());
            if n > 0 {
                tracing::info!("{n} uncommitted files expired");
            }
        }
    }
}
