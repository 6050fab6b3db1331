//! What a mount asks of the kernel: the FUSE session's settings and the
//! capabilities it agrees at `INIT`.  The benchmarks' null file system
//! (`shoal bench fs`) mounts with the same two, so that the floor it
//! measures is that of the mount's own requests.

use fuser::{Config, InitFlags, KernelConfig, MountOption, SessionACL};

use crate::{THREADS, URING_THREADS, transport};

/// The session settings of a mount named `fsname` (its subtype "shoal"):
/// every user may enter it and the kernel checks permissions against the
/// attributes (`default_permissions`); no device node or set-id bit in it
/// works (`nodev`, `nosuid`); [`THREADS`] readers of cloned
/// `/dev/fuse` descriptors, or [`URING_THREADS`] io_uring workers per CPU
/// when `uring` is asked and the kernel has FUSE over io_uring (turned on
/// here if it is off).
pub fn session_config(fsname: &str, uring: bool) -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(fsname.to_string()),
        MountOption::Subtype("shoal".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
        // Device nodes and set-id bits in the tree mean nothing here.
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    config.acl = SessionACL::All;
    config.n_threads = Some(THREADS);
    config.clone_fd = true;
    config.uring = uring
        && transport::enable_uring()
            .map_err(|e| tracing::warn!("{e}: the mount is served through /dev/fuse"))
            .is_ok();
    config.uring_threads = URING_THREADS;
    config
}

/// Agrees the mount's capabilities with the kernel at `INIT`: writes of
/// up to a megabyte, locks through the mount, and cached pages checked
/// against the attributes.  Whether opens for writing only may skip the
/// page cache (see `fs::open`).
pub fn negotiate(config: &mut KernelConfig) -> std::io::Result<bool> {
    let _ = config.set_max_write(shoal_fs::op::IO_MAX as u32);
    // fcntl locks through the mount, for the whole cluster (`lock`).
    if let Err(missing) = config.add_capabilities(InitFlags::FUSE_POSIX_LOCKS) {
        tracing::warn!(
            "the kernel keeps locks itself (no {missing:?}): they hold on this node only"
        );
    }
    // Pages kept through an open that began cached are checked against
    // the file's attributes at each read, which the kernel asks for
    // whenever they expired: never while the mount holds a token (a
    // day's timeout, invalidated by recalls), every time without one.
    if let Err(missing) = config.add_capabilities(InitFlags::FUSE_AUTO_INVAL_DATA) {
        return Err(std::io::Error::other(format!(
            "the kernel lacks {missing:?}, which the mount needs"
        )));
    }
    // From FUSE 7.39 (Linux 6.6) a direct write first drops the pages
    // the kernel caches of its range, so other opens stay coherent.
    let abi = config.kernel_abi();
    let direct = (abi.0, abi.1) >= (7, 39);
    if !direct {
        tracing::info!(
            "FUSE {}.{}: opens for writing only go through the kernel's page cache",
            abi.0,
            abi.1
        );
    }
    Ok(direct)
}
