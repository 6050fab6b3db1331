//! Secrets at rest (`docs/security.md`, "Secrets at rest"): directories
//! only their owner can enter, files only their owner can read, and a
//! check at start-up that refuses what someone else could have planted or
//! read.
//!
//! Files are written whole under a temporary name (`O_EXCL`, mode 0600),
//! synced, renamed into place, and the directory synced, so a crash leaves
//! the old contents or the new, never a torn or empty file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Makes `dir` (and its missing parents, 0755 as usual) and checks it is
/// private: a directory owned by this process's user with no access for
/// group or others.  A directory made here is made 0700; an existing one
/// that is this user's but open to others is closed (0700) only when
/// `tighten`, else refused.
pub fn dir(dir: &Path, tighten: bool) -> Result<(), String> {
    if !dir.exists() {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        match fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
        }
    }
    let meta =
        fs::symlink_metadata(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    check_owner(dir, &meta)?;
    if meta.mode() & 0o077 != 0 {
        if !tighten {
            return Err(format!(
                "{} is open to other users (mode {:o}); it holds secrets: chmod 700 it",
                dir.display(),
                meta.mode() & 0o777
            ));
        }
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot chmod {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// Checks that the existing file `path` is a regular file of this user's
/// that nobody else can read or write.
pub fn check_file(path: &Path) -> Result<(), String> {
    let meta =
        fs::symlink_metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    check_meta(path, &meta)
}

/// Opens the secret file `path` (never through a symbolic link) and checks
/// what was opened, so nothing can be swapped in between.
fn open_checked(path: &Path, write: bool) -> Result<File, String> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    check_meta(path, &meta)?;
    Ok(file)
}

fn check_meta(path: &Path, meta: &fs::Metadata) -> Result<(), String> {
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    check_owner(path, meta)?;
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{} is readable or writable by other users (mode {:o}); it holds secrets: chmod 600 it",
            path.display(),
            meta.mode() & 0o777
        ));
    }
    Ok(())
}

/// Reads the secret file `path`, checked as [`check_file`] does on the
/// file opened.
pub fn read(path: &Path) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut open_checked(path, false)?, &mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(bytes)
}

/// Writes `bytes` to `path` (in a private directory) as a 0600 file,
/// replacing it atomically and durably.
pub fn write(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let fail = |e: io::Error| format!("cannot write {}: {e}", path.display());
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| fail(io::ErrorKind::InvalidInput.into()))?;
    let tmp = parent.join(format!(".{}.tmp", name.to_string_lossy()));
    // A leftover from a crash is ours to replace (the directory is ours).
    let _ = fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(fail)?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(fail)?;
    fs::rename(&tmp, path).map_err(fail)?;
    sync_dir(parent).map_err(fail)
}

/// Creates the file `path` new (0600, `O_EXCL`) and syncs its directory,
/// for files a store then writes in place.  An existing file is checked
/// with [`check_file`] and opened as it is.
pub fn create_or_open(path: &Path) -> Result<File, String> {
    let fail = |e: io::Error| format!("cannot open {}: {e}", path.display());
    match OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(f) => {
            let parent = path.parent().unwrap_or(Path::new("."));
            sync_dir(parent).map_err(fail)?;
            Ok(f)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => open_checked(path, true),
        Err(e) => Err(fail(e)),
    }
}

/// Syncs directory `dir`, making the names created or renamed in it durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn check_owner(path: &Path, meta: &fs::Metadata) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(format!(
            "{} belongs to uid {}, not to this user (uid {me}); refusing to trust it",
            path.display(),
            meta.uid()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_private_and_planted_ones_refused() {
        let root = tempfile::tempdir().unwrap();
        let d = root.path().join("a/secrets");
        dir(&d, false).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&d), 0o700);
        let f = d.join("key");
        write(&f, b"one").unwrap();
        assert_eq!(mode(&f), 0o600);
        write(&f, b"two").unwrap();
        assert_eq!(read(&f).unwrap(), b"two");
        fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read(&f).unwrap_err().contains("chmod 600"));
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(dir(&d, false).unwrap_err().contains("chmod 700"));
        dir(&d, true).unwrap();
        assert_eq!(mode(&d), 0o700);
        let g = d.join("meta.0");
        drop(create_or_open(&g).unwrap());
        assert_eq!(mode(&g), 0o600);
        drop(create_or_open(&g).unwrap());
        std::os::unix::fs::symlink(&g, d.join("link")).unwrap();
        assert!(check_file(&d.join("link")).is_err(), "a symlink is refused");
        assert!(read(&d.join("link")).is_err(), "not read through a symlink");
        assert!(create_or_open(&d.join("link")).is_err(), "nor opened");
    }
}
