//! What the kernel says about the program at the other end of a link, for
//! the start grants its home makes (`docs/security.md`, "Local
//! authority"): its gid, supplementary groups and hard resource limits.
//!
//! The link's pid comes from `SO_PEERCRED`, and a pidfd of the same
//! process is taken when the link opens (`SO_PEERPIDFD`, or `pidfd_open`
//! on kernels without it).  The credentials are read from `/proc/PID`
//! and `prlimit`, and then the pidfd is asked whether the process is
//! still alive: if it is, the pid still named it while they were read,
//! so they cannot be another process's that reused the pid.  The uid the
//! process has now must also be the link's.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Linux's `SO_PEERPIDFD` (6.5 and later).
const SO_PEERPIDFD: libc::c_int = 77;

/// Resource limits granted: `RLIMIT_CPU` (0) to `RLIMIT_RTTIME` (15).
const RESOURCES: u32 = 16;

/// A pidfd of the process that opened a link, if the kernel gives one.
pub(crate) fn pidfd(socket: &impl AsRawFd, pid: i32) -> Option<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `fd`.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 && fd >= 0 {
        // SAFETY: the kernel just gave us this descriptor.
        return Some(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    crate::procfs::pidfd_open(pid)
}

/// A process's credentials, as a start grant carries them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub gid: u32,
    pub groups: Vec<u32>,
    pub hard: Vec<(u32, u64)>,
}

/// The credentials of process `pid` (whose pidfd is `pidfd`), which must
/// be running as `uid`; or why they cannot be vouched for.
pub(crate) fn read(pid: i32, pidfd: RawFd, uid: u32) -> Result<Credentials, String> {
    let gone = || "the program that opened this link is gone or changed user".to_string();
    if pidfd < 0 {
        return Err("this node cannot vouch for the program (no pidfd)".into());
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|_| gone())?;
    let ids = |key: &str| -> Vec<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|rest| {
                rest.split_whitespace()
                    .filter_map(|v| v.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    let uids = ids("Uid:");
    if uids.len() != 4 || uids.iter().any(|&u| u != uid) {
        return Err(gone());
    }
    let gid = *ids("Gid:").first().ok_or_else(gone)?;
    let groups = ids("Groups:");
    let mut hard = Vec::new();
    for resource in 0..RESOURCES {
        // SAFETY: an all-zero rlimit is a valid value to be filled in.
        let mut l: libc::rlimit64 = unsafe { std::mem::zeroed() };
        // SAFETY: prlimit64 with no new limit only writes the old one.
        let rc = unsafe { libc::prlimit64(pid, resource as _, std::ptr::null(), &mut l) };
        if rc == 0 {
            hard.push((resource, l.rlim_max));
        }
    }
    // Still alive: so the pid named this process while it was read.
    if !alive(pidfd) {
        return Err(gone());
    }
    Ok(Credentials { gid, groups, hard })
}

/// Whether the process of `pidfd` (-1: none) is still alive: asked after
/// reading anything of `/proc/PID`, it says the pid named that process
/// all along, and no other that took its pid.
pub(crate) fn alive(pidfd: RawFd) -> bool {
    // SAFETY: signal 0 checks the process exists; no signal is sent.
    pidfd >= 0
        && unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd,
                0,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        } == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_process_s_own_credentials_are_what_it_has() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (pid, uid, gid) = crate::account::peer(&a).unwrap();
        let fd = super::pidfd(&a, pid).expect("a pidfd of this process");
        let c = super::read(pid, std::os::fd::AsRawFd::as_raw_fd(&fd), uid).unwrap();
        assert_eq!(c.gid, gid);
        let mut nofile = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit fills `nofile`.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut nofile) };
        assert!(c.hard.contains(&(libc::RLIMIT_NOFILE, nofile.rlim_max)));
        // Another uid's claim on this process is refused.
        assert!(super::read(pid, std::os::fd::AsRawFd::as_raw_fd(&fd), uid + 1).is_err());
        assert!(super::read(pid, -1, uid).is_err());
    }

    /// Review 3, M8: what `alive` says after a read of `/proc/PID` is what
    /// trusting that read rests on: a process that ended is not alive
    /// through its pidfd, whoever has its pid now.
    #[test]
    fn a_pidfd_of_a_process_that_ended_is_not_alive() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let fd = crate::procfs::pidfd_open(child.id() as i32).unwrap();
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        assert!(super::alive(raw));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!super::alive(raw));
        assert!(!super::alive(-1));
    }
}
