//! A client's local cache of immutable files (`docs/files.md`): one copy
//! per file version, in a directory only its user can enter, each copy
//! followed by the BLAKE3 of its bytes, and the least recently used copies
//! dropped when the cache is over its size.

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use shoal_cap::Capability;

use shoal_bullet::op::Stat;

/// A new cache file only its owner can read.
pub(crate) fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// Whether the first `size` bytes of `f` hash to the BLAKE3 that follows
/// them; leaves `f` at its start.
fn cached_copy_intact(f: &mut std::fs::File, size: u64) -> bool {
    use std::io::Seek;
    let mut hasher = blake3::Hasher::new();
    if std::io::copy(&mut (&mut *f).take(size), &mut hasher).ok() != Some(size) {
        return false;
    }
    let mut trailer = [0u8; 32];
    f.read_exact(&mut trailer).is_ok()
        && hasher.finalize().as_bytes() == &trailer
        && f.rewind().is_ok()
}

/// Ends a cache copy of `size` bytes in `f` with their BLAKE3.
pub(crate) fn seal_cached_copy(f: &mut std::fs::File, size: u64) -> std::io::Result<()> {
    use std::io::Seek;
    f.rewind()?;
    let mut hasher = blake3::Hasher::new();
    if std::io::copy(&mut (&mut *f).take(size), &mut hasher)? != size {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    f.write_all_at(hasher.finalize().as_bytes(), size)
}

/// A local cache of immutable files.
///
/// A copy is checked against its digest before its first use in a
/// process; after that, while the same file (inode) stays in place, it is
/// used without hashing it again.  Copies are never changed in place (a
/// new one is written aside and renamed over), and the cache directory is
/// its user's alone, so only that user or root could alter one meanwhile.
#[derive(Debug, Clone)]
pub struct Cache {
    pub(crate) dir: PathBuf,
    pub(crate) max_bytes: u64,
    /// Copies checked in this process: (inode, length).
    verified: std::sync::Arc<parking_lot::Mutex<std::collections::HashSet<(u64, u64)>>>,
}

impl Cache {
    pub fn new(dir: &Path, max_bytes: u64) -> Cache {
        Cache {
            dir: dir.to_path_buf(),
            max_bytes,
            verified: Default::default(),
        }
    }

    /// Whether the copy open as `f`, of a file of `size` bytes, is intact:
    /// hashed in full the first time this process uses it.
    pub(crate) fn intact(&self, f: &mut std::fs::File, size: u64) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Ok(m) = f.metadata() else { return false };
        let id = (m.ino(), m.len());
        if self.verified.lock().contains(&id) {
            return true;
        }
        let ok = cached_copy_intact(f, size);
        if ok {
            let mut verified = self.verified.lock();
            if verified.len() >= 4096 {
                verified.clear();
            }
            verified.insert(id);
        }
        ok
    }

    pub(crate) fn path(&self, cap: &Capability, st: &Stat) -> PathBuf {
        let mut h = blake3::Hasher::new();
        h.update(cap.port().as_bytes());
        h.update(&cap.object().get().to_le_bytes());
        h.update(&st.hash);
        h.update(&st.size.to_le_bytes());
        self.dir.join(&h.finalize().to_hex()[..32])
    }

    /// Drops the least recently used copies until the cache fits.
    pub(crate) fn trim(&self) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = rd
            .flatten()
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, len, path) in files {
            if total <= self.max_bytes {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A sealed copy of `bytes` at `path`, put in place as the client does
    /// (written aside, renamed over).
    fn put(path: &Path, bytes: &[u8]) {
        let tmp = path.with_extension("tmp");
        let mut f = create_private(&tmp).unwrap();
        f.write_all(bytes).unwrap();
        seal_cached_copy(&mut f, bytes.len() as u64).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn a_damaged_copy_is_refused_and_a_checked_one_is_not_hashed_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("copy");
        put(&path, b"hello, cache");
        let cache = Cache::new(dir.path(), 1 << 20);
        let open = || std::fs::File::open(&path).unwrap();
        assert!(cache.intact(&mut open(), 12));
        // Damaged in place: this process checked it already and trusts it
        // (only its user could have done this); a new process does not.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .write_all_at(b"J", 0)
            .unwrap();
        assert!(cache.intact(&mut open(), 12));
        assert!(!Cache::new(dir.path(), 1 << 20).intact(&mut open(), 12));
        // A copy put in place anew (a new file) is checked again.
        put(&path, b"hello, cache");
        let mut f = open();
        assert!(cache.intact(&mut f, 12));
        let mut back = [0u8; 12];
        f.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"hello, cache", "left at its start");
    }
}
