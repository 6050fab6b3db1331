//! The disk interface the store runs on, and a simulated disk that loses
//! and tears whatever was not synced when it "crashes".
//!
//! The store touches storage only through [`Disk`], so the same code runs
//! on files (the file server's shell implements it with `pread`/`pwrite`/
//! `fdatasync`) and on [`SimDisk`] in tests and the simulator.

use std::io;
use std::sync::Arc;

use parking_lot::Mutex;
use rand::Rng;

/// A byte-addressed store with explicit durability.  Methods take `&self`:
/// the store reads and writes different ranges from several threads.
#[allow(clippy::len_without_is_empty)] // a disk of length 0 is not "empty" in any useful sense
pub trait Disk: Send + Sync {
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Reads exactly `buf.len()` bytes at `offset` (zeros past the end).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes `data` at `offset`, growing the disk if it runs past the end.
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()>;
    /// Sets the length (growing with zeros or cutting).
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes every earlier write and length change durable.
    fn sync(&self) -> io::Result<()>;
    /// A hint that `[offset, offset+len)` will be synced soon: start
    /// writing it back now, so the sync has less left to do.  Durability
    /// still comes only from [`Disk::sync`].
    fn start_writeback(&self, _offset: u64, _len: u64) {}
}

/// Unit of tearing: a crash keeps or loses each sector of an unsynced
/// write independently.
pub const SECTOR: usize = 512;

#[derive(Default)]
struct SimInner {
    /// What survives a crash.
    durable: Vec<u8>,
    /// What reads see.
    now: Vec<u8>,
    /// Writes and length changes since the last sync, in order.
    pending: Vec<Pending>,
    syncs: u64,
    writes: u64,
    /// Fail every operation (a dead disk).
    failed: bool,
}

enum Pending {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

/// An in-memory disk.  Clones share the same bytes, so a test can keep a
/// handle, "crash" the disk under a running store and open a new store on
/// what survived.
#[derive(Clone, Default)]
pub struct SimDisk(Arc<Mutex<SimInner>>);

impl SimDisk {
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    /// A power loss: every unsynced write is kept, lost, or torn (each
    /// sector kept or lost on its own), and unsynced length changes are
    /// kept or lost; reads then see only what survived.
    pub fn crash(&self, rng: &mut impl Rng) {
        let mut d = self.0.lock();
        let pending = std::mem::take(&mut d.pending);
        let mut img = std::mem::take(&mut d.durable);
        for p in pending {
            match p {
                Pending::SetLen(len) => {
                    if rng.random_bool(0.5) {
                        img.resize(len as usize, 0);
                    }
                }
                Pending::Write(off, data) => match rng.random_range(0..3) {
                    0 => {}
                    1 => put(&mut img, off, &data),
                    _ => {
                        for (i, sector) in data.chunks(SECTOR).enumerate() {
                            if rng.random_bool(0.5) {
                                put(&mut img, off + (i * SECTOR) as u64, sector);
                            }
                        }
                    }
                },
            }
        }
        d.now = img.clone();
        d.durable = img;
    }

    /// A clean stop: nothing is lost (the page cache survives a process
    /// kill; only a power loss loses unsynced data).
    pub fn kill(&self) {}

    /// Flips one bit of the durable and visible image (bit rot).
    pub fn corrupt(&self, offset: u64) {
        let mut d = self.0.lock();
        let i = offset as usize;
        if i < d.now.len() {
            d.now[i] ^= 0x10;
        }
        if i < d.durable.len() {
            d.durable[i] ^= 0x10;
        }
    }

    /// Makes every later operation fail (or work again).
    pub fn set_failed(&self, failed: bool) {
        self.0.lock().failed = failed;
    }

    /// Syncs and writes so far.
    pub fn counts(&self) -> (u64, u64) {
        let d = self.0.lock();
        (d.syncs, d.writes)
    }

    fn check(d: &SimInner) -> io::Result<()> {
        if d.failed {
            Err(io::Error::other("simulated disk failure"))
        } else {
            Ok(())
        }
    }
}

fn put(img: &mut Vec<u8>, off: u64, data: &[u8]) {
    let end = off as usize + data.len();
    if img.len() < end {
        img.resize(end, 0);
    }
    img[off as usize..end].copy_from_slice(data);
}

impl Disk for SimDisk {
    fn len(&self) -> io::Result<u64> {
        let d = self.0.lock();
        SimDisk::check(&d)?;
        Ok(d.now.len() as u64)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let d = self.0.lock();
        SimDisk::check(&d)?;
        let start = (offset as usize).min(d.now.len());
        let end = (offset as usize + buf.len()).min(d.now.len());
        let n = end - start;
        buf[..n].copy_from_slice(&d.now[start..end]);
        buf[n..].fill(0);
        Ok(())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut d = self.0.lock();
        SimDisk::check(&d)?;
        put(&mut d.now, offset, data);
        d.pending.push(Pending::Write(offset, data.to_vec()));
        d.writes += 1;
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut d = self.0.lock();
        SimDisk::check(&d)?;
        d.now.resize(len as usize, 0);
        d.pending.push(Pending::SetLen(len));
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut d = self.0.lock();
        SimDisk::check(&d)?;
        let pending = std::mem::take(&mut d.pending);
        for p in pending {
            match p {
                Pending::Write(off, data) => put(&mut d.durable, off, &data),
                Pending::SetLen(len) => d.durable.resize(len as usize, 0),
            }
        }
        d.syncs += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn synced_writes_survive_and_unsynced_ones_may_not() {
        let disk = SimDisk::new();
        disk.write_at(b"hello", 0).unwrap();
        disk.sync().unwrap();
        disk.write_at(&[9u8; 4096], 5).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        disk.crash(&mut rng);
        let mut buf = [0u8; 5];
        disk.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"hello");
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..64 {
            let disk = SimDisk::new();
            disk.write_at(&[1u8; 2048], 0).unwrap();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            disk.crash(&mut rng);
            let mut b = [0u8; 2048];
            disk.read_at(&mut b, 0).unwrap();
            seen.insert(b.iter().filter(|&&x| x == 1).count());
        }
        assert!(seen.contains(&0) && seen.contains(&2048));
        assert!(seen.len() > 2, "some writes are torn: {seen:?}");
    }
}
