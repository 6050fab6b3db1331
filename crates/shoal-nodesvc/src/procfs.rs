//! Process groups as `/proc` shows them: their members and what they use;
//! and pidfds, through which a process is named and signalled without its
//! pid being reused under it.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `pidfd_send_signal`'s flag: to the process group the pidfd's process
/// leads (Linux 6.9).
const PIDFD_SIGNAL_PROCESS_GROUP: libc::c_uint = 1 << 2;

/// A pidfd of process `pid`, if it exists.
pub fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: the kernel just gave us this descriptor.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sends `signal` through `pidfd`, to its process or, with `group`, to
/// the process group it leads.  A process that was reaped is `ESRCH`,
/// whatever now has its pid.
pub fn pidfd_signal(pidfd: &OwnedFd, signal: i32, group: bool) -> std::io::Result<()> {
    let flags = if group { PIDFD_SIGNAL_PROCESS_GROUP } else { 0 };
    // SAFETY: pidfd_send_signal with a live fd, no siginfo.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Sends `signal` to each process of group `group` but its leader: each
/// through a pidfd taken first, and only if, once taken, the process is
/// still of the group (so no pid reused meanwhile is signalled).
pub fn signal_members(group: i32, signal: i32) {
    for pid in group_members(group) {
        let Some(pidfd) = pidfd_open(pid) else {
            continue;
        };
        if process_group(pid) == Some(group) {
            let _ = pidfd_signal(&pidfd, signal, false);
        }
    }
}

/// The process group of process `pid`, if it exists.
fn process_group(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    after_command(&stat).get(2)?.parse().ok()
}

/// What a process group uses.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub cpu_s: f64,
    pub rss_kib: u64,
}

/// The use of every process group on this machine, by group id, from
/// `/proc/PID/stat` (processor time and resident pages summed over the
/// group's processes).
pub fn group_usage() -> HashMap<u32, Usage> {
    // SAFETY: sysconf has no preconditions.
    let (tick, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK).max(1) as f64,
            libc::sysconf(libc::_SC_PAGESIZE).max(1) as u64,
        )
    };
    let mut groups: HashMap<u32, Usage> = HashMap::new();
    each_process(|_, f| {
        let num = |i: usize| f[i].parse::<u64>().unwrap_or(0);
        let u = groups.entry(num(2) as u32).or_default();
        u.cpu_s += (num(11) + num(12)) as f64 / tick;
        u.rss_kib += num(21) * page / 1024;
    });
    groups
}

/// The processes of process group `group` but its leader.
pub fn group_members(group: i32) -> Vec<i32> {
    let mut members = Vec::new();
    each_process(|pid, f| {
        if f[2].parse::<i32>() == Ok(group) && pid != group {
            members.push(pid);
        }
    });
    members
}

/// Calls `f` with each process's pid and the fields of its
/// `/proc/PID/stat` after the command (state first), 22 at least.
pub fn each_process(mut f: impl FnMut(i32, &[&str])) {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let fields = after_command(&stat);
        if fields.len() >= 22 {
            f(pid, &fields);
        }
    }
}

/// The parent of process `pid`, if it exists.
pub fn parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    after_command(&stat).get(1)?.parse().ok()
}

/// The fields of a `/proc/PID/stat` after the command (state first). The
/// command is in parentheses and may hold anything, parentheses too.
fn after_command(stat: &str) -> Vec<&str> {
    stat.rsplit_once(')').map_or_else(Vec::new, |(_, rest)| {
        rest.split_ascii_whitespace().collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_past_its_command_name() {
        let s = "42 (a (b) c) S 7 40 39 0 -1 4194560 ...";
        assert_eq!(after_command(s)[..5], ["S", "7", "40", "39", "0"]);
        assert!(after_command("42 (x").is_empty());
    }
}
