//! What a program started from this process gets of it, wherever it runs
//! (`docs/pool.md`, "What is forwarded"): the environment, working
//! directory, user, groups, umask, resource limits and host name; the
//! signals passed on to it; and how this process ends as it ended.

use shoal_pool::exec::{Ended, Rlimit, StartSpec, WinSize};

/// Signals a program started from here gets when this process gets them.
pub const FORWARDED: [i32; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Resource limits forwarded: Linux's `RLIMIT_CPU` (0) to `RLIMIT_RTTIME`
/// (15).
const RESOURCES: u32 = 16;

/// This process's umask, read from `/proc/self/status` without setting it
/// (umask(2) can only read it by changing it, process-wide, for a moment);
/// umask(2) only where `/proc` does not say.
fn umask() -> libc::mode_t {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let said = status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .and_then(|m| libc::mode_t::from_str_radix(m.trim(), 8).ok());
    said.unwrap_or_else(|| {
        // SAFETY: umask(2) twice, to read it.
        unsafe {
            let m = libc::umask(0o022);
            libc::umask(m);
            m
        }
    })
}

/// The start description of `argv` as this process would run it (on a
/// terminal of `tty`'s size if given).  An error if it has no working
/// directory.
pub fn start_spec(argv: Vec<String>, tty: Option<WinSize>) -> Result<StartSpec, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("no working directory: {e}"))?;
    let umask = umask();
    let mut rlimits = Vec::new();
    for resource in 0..RESOURCES {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit fills `l`.
        if unsafe { libc::getrlimit(resource as _, &mut l) } == 0 {
            rlimits.push(Rlimit {
                resource,
                soft: l.rlim_cur,
                hard: l.rlim_max,
            });
        }
    }
    // SAFETY: with no room, getgroups counts the groups.
    let count = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    let mut groups = vec![0 as libc::gid_t; count.max(0) as usize];
    // SAFETY: getgroups writes at most `groups.len()` ids.
    let n = unsafe { libc::getgroups(groups.len() as i32, groups.as_mut_ptr()) };
    groups.truncate(n.max(0) as usize);
    Ok(StartSpec {
        argv,
        env: std::env::vars_os()
            .filter_map(|(k, v)| Some(format!("{}={}", k.to_str()?, v.to_str()?)))
            .collect(),
        cwd: cwd.to_string_lossy().into_owned(),
        // SAFETY: getuid/getgid cannot fail.
        uid: unsafe { libc::getuid() },
        gid: unsafe { libc::getgid() },
        groups,
        umask: umask as u32,
        rlimits,
        hostname: hostname(),
        tty,
    })
}

/// This machine's host name (its UTS namespace's).
fn hostname() -> String {
    // SAFETY: uname fills `u`.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::new();
    }
    let name: Vec<u8> = u
        .nodename
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&name).into_owned()
}

/// Ends this process the way its program ended: with its exit status, or
/// killed by the same signal (its default action restored and the signal
/// unblocked first).
pub fn end_as(ended: Ended) -> ! {
    match ended {
        Ended::Exited(code) => std::process::exit(code),
        Ended::Killed(sig) => {
            // SAFETY: the default action, unblocked, then the signal: this
            // process ends as the program ended.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, sig);
                libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                libc::raise(sig);
            }
            std::process::exit(128 + sig)
        }
    }
}

#[cfg(test)]
mod tests {
    /// Review 3, L14: the umask is read without being changed.
    #[test]
    fn the_umask_is_read_as_it_is() {
        // SAFETY: umask(2) twice, to read it, in this test alone.
        let set = unsafe {
            let m = libc::umask(0o022);
            libc::umask(m);
            m
        };
        assert_eq!(super::umask(), set);
    }
}
