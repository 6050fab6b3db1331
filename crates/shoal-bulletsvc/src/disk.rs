//! The store's disks on the local file system: `pread`/`pwrite` at any
//! offset from any thread, and `fdatasync` (which also makes a changed
//! length durable).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use shoal_bullet::Disk;

/// One file of a store.
pub struct FileDisk {
    file: File,
    syncs: std::sync::atomic::AtomicU64,
}

impl FileDisk {
    /// Opens `path`, creating it 0600 (its directory synced) if missing;
    /// an existing file must be this user's and private
    /// (`shoal_rpc::secrets`): the store's files hold its secrets.
    pub fn open(path: &Path) -> io::Result<FileDisk> {
        let file = shoal_rpc::secrets::create_or_open(path).map_err(io::Error::other)?;
        Ok(FileDisk {
            file,
            syncs: Default::default(),
        })
    }

    /// Syncs so far.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Disk for FileDisk {
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64)? {
                0 => {
                    buf[done..].fill(0);
                    break;
                }
                n => done += n,
            }
        }
        Ok(())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn start_writeback(&self, offset: u64, len: u64) {
        use std::os::fd::AsRawFd;
        // SAFETY: sync_file_range(2) on our own open descriptor; it only
        // starts writeback of the range and touches no memory of ours.
        #[allow(unsafe_code)]
        unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                offset as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
    }

    fn sync(&self) -> io::Result<()> {
        self.syncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.file.sync_data()
    }
}
