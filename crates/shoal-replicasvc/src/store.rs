//! A replica's disk: one snapshot file and the logs that follow it.
//!
//! Files in the replica's data directory: `snapshot` (the state at some
//! index, in the machine's snapshot format; written as `snapshot.tmp`,
//! synced, renamed), `log.<base>` (records after the snapshot at `base`,
//! framed as `shoal_replica::frame` says, with the machine's payloads; a
//! new log starts at every snapshot) and `generation` (the replica group
//! generation, 8 bytes little-endian).  Recovery ([`Machine::recover`])
//! loads the snapshot, replays every log in base order (skipping records
//! the state already holds), and cuts off a torn tail.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use shoal_cap::PutPort;
use shoal_replica::Machine;

/// Disk counters (the benchmark checks that temporary names cost none).
#[derive(Debug, Default)]
pub struct DiskStats {
    /// write(2) calls on logs and snapshots.
    pub writes: AtomicU64,
    /// Bytes written.
    pub bytes: AtomicU64,
    /// fsync(2)/fdatasync(2) calls.
    pub syncs: AtomicU64,
    /// Snapshots written.
    pub snapshots: AtomicU64,
}

impl DiskStats {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "writes": self.writes.load(Ordering::Relaxed),
            "bytes": self.bytes.load(Ordering::Relaxed),
            "syncs": self.syncs.load(Ordering::Relaxed),
            "snapshots": self.snapshots.load(Ordering::Relaxed),
        })
    }
}

/// The open log and where the files live.
pub struct Store {
    /// The machine's log header for a base.
    header: fn(u64) -> Vec<u8>,
    dir: PathBuf,
    log: File,
    log_base: u64,
    log_len: u64,
    pub stats: Arc<DiskStats>,
}

fn log_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("log.{base:020}"))
}

/// Creates (or truncates) `path` for reading and writing, 0600 if new.
fn create_private(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Log files of `dir`, by base.
fn logs(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let Some(base) = name
            .to_str()
            .and_then(|n| n.strip_prefix("log."))
            .and_then(|b| b.parse::<u64>().ok())
        else {
            continue;
        };
        out.push((base, e.path()));
    }
    out.sort();
    Ok(out)
}

/// What [`Store::open`] found.
pub struct Recovered<M> {
    pub state: M,
    pub generation: u64,
    /// Log records replayed.
    pub replayed: usize,
    /// Bytes of torn log tail cut off.
    pub cut: u64,
}

impl Store {
    /// Opens (creating if needed) the data directory and rebuilds the state
    /// from its snapshot and logs.
    pub fn open<M: Machine>(dir: &Path, port: PutPort) -> io::Result<(Store, Recovered<M>)> {
        // Snapshots and logs hold every object's secret.
        shoal_rpc::private::dir(dir, true).map_err(io::Error::other)?;
        let snapshot = match fs::read(dir.join("snapshot")) {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let generation = match fs::read(dir.join("generation")) {
            Ok(b) if b.len() == 8 => u64::from_le_bytes(b.try_into().unwrap()),
            _ => 0,
        };
        let files = logs(dir)?;
        let contents = files
            .iter()
            .map(|(_, p)| fs::read(p))
            .collect::<io::Result<Vec<_>>>()?;
        let given: Vec<(u64, &[u8])> = files
            .iter()
            .zip(&contents)
            .map(|((b, _), c)| (*b, c.as_slice()))
            .collect();
        let rec = M::recover(port, snapshot.as_deref(), &given).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", dir.display()),
            )
        })?;
        let mut cut = 0;
        for (((base, path), bytes), keep) in files.iter().zip(&contents).zip(&rec.keep) {
            match keep {
                None => fs::remove_file(path)?,
                Some(0) => {
                    cut += bytes.len() as u64;
                    let mut f = create_private(path)?;
                    f.write_all(&M::log_header(*base))?;
                    f.sync_all()?;
                }
                Some(len) if *len < bytes.len() => {
                    cut += (bytes.len() - len) as u64;
                    let f = OpenOptions::new().write(true).open(path)?;
                    f.set_len(*len as u64)?;
                    f.sync_all()?;
                }
                Some(_) => {}
            }
        }
        // Removals and cuts are durable before anything new is written.
        sync_dir(dir)?;
        let (state, replayed) = (rec.state, rec.replayed);
        // Append to the newest log, or start one at the state's index.
        let (log_base, path) = match files.last() {
            Some((b, p)) if p.exists() => (*b, p.clone()),
            _ => {
                let p = log_path(dir, state.index());
                let mut f = create_private(&p)?;
                f.write_all(&M::log_header(state.index()))?;
                f.sync_all()?;
                sync_dir(dir)?;
                (state.index(), p)
            }
        };
        let log = OpenOptions::new().read(true).write(true).open(&path)?;
        let log_len = log.metadata()?.len();
        Ok((
            Store {
                header: M::log_header,
                dir: dir.to_path_buf(),
                log,
                log_base,
                log_len,
                stats: Arc::default(),
            },
            Recovered {
                state,
                generation,
                replayed,
                cut,
            },
        ))
    }

    /// Bytes in the current log.
    pub fn log_len(&self) -> u64 {
        self.log_len
    }

    /// Appends `bytes` to the log; with `sync`, returns once they are on
    /// disk.
    pub fn append(&mut self, bytes: &[u8], sync: bool) -> io::Result<()> {
        self.log.write_all_at(bytes, self.log_len)?;
        self.log_len += bytes.len() as u64;
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        self.stats
            .bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        if sync {
            self.log.sync_data()?;
            self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Syncs the log.
    pub fn sync(&mut self) -> io::Result<()> {
        self.log.sync_data()?;
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Starts a new log after the state at `index` (whose snapshot the
    /// caller writes next with [`Store::write_snapshot`]).
    pub fn rotate(&mut self, index: u64) -> io::Result<()> {
        if index == self.log_base {
            return Ok(());
        }
        self.log.sync_data()?;
        let path = log_path(&self.dir, index);
        let mut f = create_private(&path)?;
        let header = (self.header)(index);
        f.write_all(&header)?;
        f.sync_data()?;
        sync_dir(&self.dir)?;
        self.log = f;
        self.log_base = index;
        self.log_len = header.len() as u64;
        Ok(())
    }

    /// A handle that writes snapshots while the log goes on growing.
    pub fn snapshots(&self) -> Snapshots {
        Snapshots {
            dir: self.dir.clone(),
            stats: self.stats.clone(),
        }
    }

    /// Records the replica group generation.
    pub fn write_generation(&self, generation: u64) -> io::Result<()> {
        let tmp = self.dir.join("generation.tmp");
        let mut f = create_private(&tmp)?;
        f.write_all(&generation.to_le_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, self.dir.join("generation"))?;
        sync_dir(&self.dir)
    }
}

/// Writes snapshots.
pub struct Snapshots {
    dir: PathBuf,
    stats: Arc<DiskStats>,
}

impl Snapshots {
    /// Writes a snapshot (the encoded state at `index`) and removes the logs
    /// it covers (those that start before `index`).
    pub fn write(&self, index: u64, snapshot: &[u8]) -> io::Result<()> {
        let tmp = self.dir.join("snapshot.tmp");
        let mut f = create_private(&tmp)?;
        f.write_all(snapshot)?;
        f.sync_all()?;
        fs::rename(&tmp, self.dir.join("snapshot"))?;
        sync_dir(&self.dir)?;
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        self.stats
            .bytes
            .fetch_add(snapshot.len() as u64, Ordering::Relaxed);
        self.stats.snapshots.fetch_add(1, Ordering::Relaxed);
        for (base, path) in logs(&self.dir)? {
            if base < index {
                fs::remove_file(path)?;
            }
        }
        Ok(())
    }
}
