//! shoal's shared file system client (`docs/fs.md`): the FUSE mount of a
//! file system's tree, over the metadata service's client
//! (`shoal_fssvc::FsClient`).
//!
//! [`Mount::start`] mounts the tree at a directory (as root, with
//! `allow_other` and `default_permissions`: the kernel checks permissions
//! against the attributes, and the primary checks them again) and serves
//! it from FUSE threads of its own until [`Mount::stop`] or the process
//! ends.  [`conn`] is the session with the metadata service; [`fs`] turns
//! kernel requests into its calls.

#![deny(unsafe_code)]

mod callbacks;
mod conn;
pub mod fs;
pub mod kernel;
mod locks;
mod memory;
mod private;
mod transport;
mod writeback;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fuser::BackgroundSession;
use shoal_fs::op::Failure;
use shoal_rpc::Context;

pub use memory::{RETAIN, keep_freed_buffers};
pub use transport::Transport;

/// FUSE threads serving a mount (one per CPU of the machines shoal runs
/// on; each reads its own cloned `/dev/fuse` descriptor).
pub const THREADS: usize = 2;

/// Workers per CPU when the kernel serves the mount through io_uring: one
/// may wait for a server while the other answers from the caches.
pub const URING_THREADS: usize = 2;

/// How a mount holds dirty data (`shoal fs mount --write-back-secs
/// --dirty-mib`).
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// How long a file's oldest dirty change waits before the file is
    /// written back.
    pub write_back_after: Duration,
    /// Dirty bytes, in all files, past which a write waits for its file's
    /// write-back.
    pub dirty_max: u64,
    /// Be served through FUSE over io_uring where the kernel has it.
    pub uring: bool,
}

/// How long dirty data waits by default before it is written back (s).
pub const WRITE_BACK_SECS: u64 = 30;

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            write_back_after: Duration::from_secs(WRITE_BACK_SECS),
            dirty_max: default_dirty_max(),
            uring: true,
        }
    }
}

/// The default dirty limit: an eighth of the node's memory (the kernel
/// keeps its own copy of the pages for reading), at least 64 MiB.
pub fn default_dirty_max() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib << 10)
        })
        .unwrap_or(2 << 30);
    (total / 8).max(64 << 20)
}

/// A mounted tree.
pub struct Mount {
    session: Option<BackgroundSession>,
    conn: Arc<conn::Conn>,
    _callbacks: callbacks::Callbacks,
    at: PathBuf,
    transport: Transport,
    direct_writes: Arc<AtomicBool>,
}

impl Mount {
    /// Mounts file system `name` of the context's cluster at `at`, as
    /// node `node`.
    pub fn start(
        ctx: &Context,
        name: &str,
        node: &str,
        at: &Path,
        tuning: Tuning,
    ) -> Result<Mount, String> {
        let conn = Arc::new(
            conn::Conn::open(ctx, name, node, tuning)
                .map_err(|e: Failure| format!("cannot reach file system {name}: {e}"))?,
        );
        let config = kernel::session_config(&format!("shoal:{name}"), tuning.uring);
        let direct_writes = Arc::new(AtomicBool::new(false));
        let fs = fs::ShoalFs::new(conn.clone(), direct_writes.clone());
        let session = fuser::Session::new(fs, at, &config)
            .map_err(|e| format!("cannot mount {}: {e}", at.display()))?;
        let transport = if session.uses_uring() {
            Transport::Uring
        } else {
            Transport::Device
        };
        conn.kernel.set(session.notifier());
        let callbacks =
            callbacks::Callbacks::start(ctx, name, conn.clone()).map_err(|e| e.to_string())?;
        let session = session
            .spawn()
            .map_err(|e| format!("cannot serve {}: {e}", at.display()))?;
        Ok(Mount {
            session: Some(session),
            conn,
            _callbacks: callbacks,
            at: at.to_path_buf(),
            transport,
            direct_writes,
        })
    }

    /// Where the tree is mounted.
    pub fn path(&self) -> &Path {
        &self.at
    }

    /// How the kernel hands this mount its requests.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// Whether opens for writing only skip the kernel's page cache (the
    /// kernel drops its cached pages of a direct write's range from FUSE
    /// 7.39, Linux 6.6, on); known once the kernel has answered the mount.
    pub fn direct_writes(&self) -> bool {
        self.direct_writes.load(Ordering::Relaxed)
    }

    /// Unmounts, waits for the FUSE threads, and writes every dirty file
    /// back.
    pub fn stop(mut self) -> Result<(), String> {
        self.finish()
    }

    fn finish(&mut self) -> Result<(), String> {
        let Some(s) = self.session.take() else {
            return Ok(());
        };
        self.conn.locks.stop();
        let unmounted = s
            .umount_and_join()
            .map_err(|e| format!("cannot unmount {}: {e}", self.at.display()));
        self.conn
            .push()
            .map_err(|e| format!("pushing the private directories' changes: {e}"))?;
        self.conn
            .flush(None, true)
            .map_err(|e| format!("writing dirty files back: {e}"))?;
        unmounted
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            tracing::warn!("{e}");
        }
    }
}
