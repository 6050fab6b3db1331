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
//!
//! The newest log is made ahead of its records: its file grows in steps
//! of [`AHEAD`] zero bytes, written with the records that first need
//! them, so that a later sync writes records alone and never the file's
//! length or its blocks (on ext4 an append and `fdatasync` took twice the
//! time and twice the CPU of the same write over zeros already on disk).
//! Zeros end a log as a torn record does, so recovery cuts them off with
//! any torn tail, and a log is cut to its records before the next one
//! starts (an older log is whole).

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

/// The step in which the newest log's file is made ahead of its records.
pub const AHEAD: u64 = 1 << 20;

/// The open log and where the files live.
pub struct Store {
    /// The machine's log header for a base.
    header: fn(u64) -> Vec<u8>,
    dir: PathBuf,
    log: File,
    log_base: u64,
    /// Where the next record goes.
    log_len: u64,
    /// The log file's length: zeros from `log_len` on.
    made: u64,
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
        shoal_rpc::secrets::dir(dir, true).map_err(io::Error::other)?;
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
                    // Zeros made ahead are no torn tail.
                    let tail = &bytes[*len..];
                    if tail.iter().any(|b| *b != 0) {
                        cut += tail.len() as u64;
                    }
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
                made: log_len,
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
        let end = self.log_len + bytes.len() as u64;
        if end > self.made {
            // Zeros up to the next step past the records, then the records
            // over their start: one sync makes both durable.
            let made = end.next_multiple_of(AHEAD);
            let zeros = vec![0u8; (made - end) as usize];
            self.log.write_all_at(&zeros, end)?;
            self.made = made;
        }
        self.log.write_all_at(bytes, self.log_len)?;
        self.log_len = end;
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
        // The log ends at its last record before the next one starts:
        // recovery wants every older log whole.
        if self.made > self.log_len {
            self.log.set_len(self.log_len)?;
            self.log.sync_all()?;
        } else {
            self.log.sync_data()?;
        }
        let path = log_path(&self.dir, index);
        let mut f = create_private(&path)?;
        let header = (self.header)(index);
        f.write_all(&header)?;
        f.sync_data()?;
        sync_dir(&self.dir)?;
        self.log = f;
        self.log_base = index;
        self.log_len = header.len() as u64;
        self.made = self.log_len;
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

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_replica::frame;

    const MAGIC: &[u8; 8] = b"TESTLOG1";

    /// A machine that counts its messages and logs each one.
    struct Count {
        index: u64,
        log: Vec<u8>,
    }

    impl Machine for Count {
        type Output = u64;
        fn index(&self) -> u64 {
            self.index
        }
        fn deliver(&mut self, message: &[u8]) -> Option<u64> {
            self.index += 1;
            frame::record(&mut self.log, 1, self.index, message);
            Some(self.index)
        }
        fn take_log(&mut self, _mark: bool) -> Option<Vec<u8>> {
            Some(std::mem::take(&mut self.log))
        }
        fn logged_index(&self) -> u64 {
            self.index
        }
        fn log_header(base: u64) -> Vec<u8> {
            frame::header(MAGIC, base).to_vec()
        }
        fn encode_snapshot(&self) -> Vec<u8> {
            self.index.to_le_bytes().to_vec()
        }
        fn decode_snapshot(bytes: &[u8]) -> Result<Self, String> {
            let index = u64::from_le_bytes(bytes.try_into().map_err(|_| "short")?);
            Ok(Count {
                index,
                log: Vec::new(),
            })
        }
        fn recover(
            _port: PutPort,
            snapshot: Option<&[u8]>,
            logs: &[(u64, &[u8])],
        ) -> Result<shoal_replica::Recovery<Self>, String> {
            let mut state = match snapshot {
                Some(s) => Count::decode_snapshot(s)?,
                None => Count {
                    index: 0,
                    log: Vec::new(),
                },
            };
            let (mut replayed, mut keep) = (0, Vec::new());
            let bases: Vec<u64> = logs.iter().map(|l| l.0).collect();
            for ((_, bytes), plan) in logs.iter().zip(frame::plan(&bases, state.index)) {
                let Some(older) = plan else {
                    keep.push(None);
                    continue;
                };
                let f = frame::frames(MAGIC, bytes).ok_or("no header")?;
                if older && f.valid_len != bytes.len() {
                    return Err(frame::OLDER_LOG_CORRUPT.into());
                }
                for r in &f.records {
                    if r.index > state.index {
                        state.index = r.index;
                        replayed += 1;
                    }
                }
                keep.push(Some(f.valid_len));
            }
            Ok(shoal_replica::Recovery {
                state,
                replayed,
                keep,
            })
        }
        fn counts(&self) -> Vec<(&'static str, u64)> {
            Vec::new()
        }
    }

    fn port() -> PutPort {
        PutPort::from_bytes([7; 16])
    }

    fn log_files(dir: &Path) -> Vec<(u64, u64)> {
        logs(dir)
            .unwrap()
            .into_iter()
            .map(|(base, p)| (base, fs::metadata(p).unwrap().len()))
            .collect()
    }

    /// `n` messages of 40 bytes delivered to `m` and appended, every
    /// `sync_every`-th synced.
    fn deliver(store: &mut Store, m: &mut Count, n: u8, sync_every: u8) {
        for i in 0..n {
            m.deliver(&[i; 40]);
            store
                .append(&m.take_log(false).unwrap(), i % sync_every == 0)
                .unwrap();
        }
    }

    #[test]
    fn the_log_is_made_ahead_in_zeros_that_recovery_cuts_and_calls_no_tear() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, rec) = Store::open::<Count>(dir.path(), port()).unwrap();
        let mut m = rec.state;
        deliver(&mut store, &mut m, 100, 10);
        store.sync().unwrap();
        let written = store.log_len();
        assert_eq!(
            log_files(dir.path()),
            vec![(0, AHEAD)],
            "one step made ahead"
        );
        drop(store);

        let (store, rec) = Store::open::<Count>(dir.path(), port()).unwrap();
        assert_eq!((rec.state.index, rec.replayed, rec.cut), (100, 100, 0));
        assert_eq!(store.log_len(), written);
        assert_eq!(log_files(dir.path()), vec![(0, written)], "zeros cut");
        drop(store);

        // A torn record past the last whole one is cut, and counted.
        let path = log_path(dir.path(), 0);
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0xAB; 30], written).unwrap();
        f.set_len(AHEAD).unwrap();
        drop(f);
        let (_, rec) = Store::open::<Count>(dir.path(), port()).unwrap();
        assert_eq!((rec.state.index, rec.cut), (100, AHEAD - written));
    }

    #[test]
    fn an_older_log_is_whole_when_the_next_one_starts() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, rec) = Store::open::<Count>(dir.path(), port()).unwrap();
        let mut m = rec.state;
        deliver(&mut store, &mut m, 10, 1);
        let first = store.log_len();
        store.rotate(m.index).unwrap();
        deliver(&mut store, &mut m, 5, 1);
        assert_eq!(log_files(dir.path()), vec![(0, first), (10, AHEAD)]);
        drop(store);
        // No snapshot: both logs are replayed, the older one whole.
        let (_, rec) = Store::open::<Count>(dir.path(), port()).unwrap();
        assert_eq!((rec.state.index, rec.replayed, rec.cut), (15, 15, 0));
    }
}
