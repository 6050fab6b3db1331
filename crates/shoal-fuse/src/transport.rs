//! How the kernel hands the mount its requests: FUSE over io_uring where
//! the kernel has it (one queue per CPU, served on that CPU), `/dev/fuse`
//! otherwise.
//!
//! Linux 6.14+ has FUSE over io_uring behind the `fuse` module's
//! `enable_uring` parameter, off by default.  The parameter only lets FUSE
//! servers that ask for it use it; a mount running as root turns it on.

use std::path::Path;

/// The `fuse` module's switch.
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// How a mount's requests reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// FUSE over io_uring: a queue per CPU, served by workers on that CPU.
    Uring,
    /// `read` and `write` on `/dev/fuse`, by any thread on any CPU.
    Device,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Uring => "FUSE over io_uring, served on the caller's CPU",
            Transport::Device => "/dev/fuse",
        })
    }
}

/// Makes sure the kernel offers FUSE over io_uring, turning it on if this
/// process may; says why not otherwise.
pub fn enable_uring() -> Result<(), String> {
    enable_at(Path::new(ENABLE_URING))
}

fn enable_at(switch: &Path) -> Result<(), String> {
    let Ok(now) = std::fs::read_to_string(switch) else {
        return Err(
            "this kernel has no FUSE over io_uring (Linux 6.14+ built with \
                    CONFIG_FUSE_IO_URING)"
                .into(),
        );
    };
    if now.trim() == "Y" {
        return Ok(());
    }
    std::fs::write(switch, "Y").map_err(|e| {
        format!(
            "FUSE over io_uring is off in this kernel and this process cannot turn it on \
             ({e}; as root: echo Y > {})",
            switch.display()
        )
    })?;
    tracing::info!(
        "turned on FUSE over io_uring in the kernel ({})",
        switch.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_is_turned_on_once_and_left_on() {
        let dir = tempfile::tempdir().unwrap();
        let switch = dir.path().join("enable_uring");
        std::fs::write(&switch, "N\n").unwrap();
        enable_at(&switch).unwrap();
        assert_eq!(std::fs::read_to_string(&switch).unwrap(), "Y");
        enable_at(&switch).unwrap();
        assert_eq!(std::fs::read_to_string(&switch).unwrap(), "Y");
    }

    #[test]
    fn a_kernel_without_the_switch_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let e = enable_at(&dir.path().join("absent")).unwrap_err();
        assert!(e.contains("no FUSE over io_uring"), "{e}");
    }
}
