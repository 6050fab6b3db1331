//! The mount's threads yield their CPU to programs (`SCHED_IDLE`), so that
//! a program woken by a reply resumes on the CPU it ran on.
//!
//! Through FUSE over io_uring a request is served on its caller's CPU, and
//! the worker that answers it wakes the caller there.  At that moment the
//! worker still runs, so the scheduler sees that CPU busy and the other one
//! idle, and moves the caller: on the virtual machines shoal runs on, a
//! wake-up on an idle CPU costs several microseconds more than one on the
//! CPU at hand, for every request (a temporary file is eight).  The
//! scheduler counts a CPU running only `SCHED_IDLE` threads as idle, and
//! lets the woken program preempt them: with the mount's threads
//! `SCHED_IDLE`, the caller stays where it was and runs at once.
//!
//! `SCHED_IDLE` threads get almost nothing while ordinary threads of the
//! same scheduling group want the CPU.  So the mount yields only where its
//! threads are a group to themselves: the kernel groups processes by
//! session (`sched_autogroup_enabled`), no CPU cgroup regroups them, and
//! the mount's session holds nothing but the mount and the processes that
//! started it (as a node daemon's service runs it).  Against the rest of
//! the machine the group weighs what any session does; within it, the
//! mount's threads share alike.

#![allow(unsafe_code)]

use std::collections::HashSet;
use std::path::Path;

/// Why this process may not yield, if it may not.
pub fn may_yield() -> Result<(), String> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    if read("/proc/sys/kernel/sched_autogroup_enabled").trim() != "1" {
        return Err("the kernel does not group processes by session \
                    (kernel.sched_autogroup_enabled is not 1)"
            .into());
    }
    cpu_cgroup_is_root(&read("/proc/self/cgroup"), |dir| {
        read(&format!("/sys/fs/cgroup{dir}/cgroup.controllers"))
    })?;
    let me = std::process::id();
    let mut procs = Vec::new();
    // state ppid pgrp session tty_nr ...
    shoal_nodesvc::procfs::each_process(|pid, f| {
        let field = |i: usize| f[i].parse::<i64>().ok();
        if let (Ok(pid), Some(ppid), Some(session), Some(tty)) =
            (u32::try_from(pid), field(1), field(3), field(4))
        {
            procs.push(Stat {
                pid,
                ppid: ppid as u32,
                session: session as u32,
                tty: tty as u32,
            });
        }
    });
    alone_in_session(me, &procs)
}

/// Makes every thread of this process `SCHED_IDLE` (threads started
/// later inherit it from the thread that starts them); how many it set.
pub fn yield_cpu() -> Result<usize, String> {
    let mut done = HashSet::new();
    // A thread started while the list is read may be missed once: read
    // it until a pass finds nothing new.
    for _ in 0..4 {
        let mut new = 0;
        let tasks = Path::new("/proc/self/task");
        for entry in std::fs::read_dir(tasks).map_err(|e| format!("{}: {e}", tasks.display()))? {
            let Some(tid) = entry
                .ok()
                .and_then(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
            else {
                continue;
            };
            if !done.insert(tid) {
                continue;
            }
            new += 1;
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: a valid sched_param; `tid` names a thread of this
            // process (or one that ended, which fails with ESRCH).
            if unsafe { libc::sched_setscheduler(tid, libc::SCHED_IDLE, &param) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::ESRCH) {
                    return Err(format!("cannot make thread {tid} SCHED_IDLE: {e}"));
                }
            }
        }
        if new == 0 {
            break;
        }
    }
    Ok(done.len())
}

/// Whether the CPU controller leaves this process in the root group
/// (where the kernel's session groups apply), from `/proc/self/cgroup` and
/// a reader of a cgroup v2 directory's `cgroup.controllers`.
fn cpu_cgroup_is_root(cgroups: &str, controllers: impl Fn(&str) -> String) -> Result<(), String> {
    let mut v2 = None;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(names), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if names.is_empty() {
            v2 = Some(path);
        } else if names.split(',').any(|n| n == "cpu") {
            return if path == "/" {
                Ok(())
            } else {
                Err(format!(
                    "the CPU controller groups this process with cgroup {path}"
                ))
            };
        }
    }
    match v2 {
        Some(path) if path != "/" && controllers(path).split_whitespace().any(|c| c == "cpu") => {
            Err(format!(
                "the CPU controller groups this process with cgroup {path}"
            ))
        }
        _ => Ok(()),
    }
}

/// What `/proc/PID/stat` says of a process's place among sessions
/// (`shoal_nodesvc::procfs::each_process`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    pid: u32,
    ppid: u32,
    session: u32,
    tty: u32,
}

/// Whether process `me` shares its session only with its own ancestors,
/// in a session without a terminal (where no shell starts jobs).
fn alone_in_session(me: u32, procs: &[Stat]) -> Result<(), String> {
    let Some(mine) = procs.iter().find(|p| p.pid == me) else {
        return Err("this process is not in /proc".into());
    };
    if mine.tty != 0 {
        return Err(
            "the mount's session has a terminal, whose other jobs would share its \
                    scheduling group"
                .into(),
        );
    }
    let mut ancestors = HashSet::new();
    let mut at = mine.ppid;
    while at > 1 && ancestors.insert(at) {
        at = procs.iter().find(|p| p.pid == at).map_or(0, |p| p.ppid);
    }
    match procs
        .iter()
        .find(|p| p.session == mine.session && p.pid != me && !ancestors.contains(&p.pid))
    {
        Some(other) => Err(format!(
            "process {} shares the mount's session, and with it its scheduling group",
            other.pid
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: u32, ppid: u32, session: u32, tty: u32) -> Stat {
        Stat {
            pid,
            ppid,
            session,
            tty,
        }
    }

    #[test]
    fn a_service_alone_in_its_session_may_yield() {
        // daemon 10 (session 10); the service's session process 20, its
        // watcher 21, the mount 22; a program of another session.
        let procs = [
            stat(10, 1, 10, 0),
            stat(20, 10, 20, 0),
            stat(21, 20, 20, 0),
            stat(22, 21, 20, 0),
            stat(30, 10, 30, 0),
        ];
        assert_eq!(alone_in_session(22, &procs), Ok(()));
    }

    #[test]
    fn a_session_shared_with_others_or_a_terminal_may_not() {
        let shared = [stat(20, 1, 20, 0), stat(22, 20, 20, 0), stat(23, 20, 20, 0)];
        let e = alone_in_session(22, &shared).unwrap_err();
        assert!(e.contains("process 23"), "{e}");
        let terminal = [stat(20, 1, 20, 34816), stat(22, 20, 20, 34816)];
        let e = alone_in_session(22, &terminal).unwrap_err();
        assert!(e.contains("terminal"), "{e}");
    }

    #[test]
    fn only_a_cpu_cgroup_other_than_the_root_regroups() {
        let none = |_: &str| String::new();
        let v1_root = "4:memory:/x\n1:cpu,cpuacct:/\n0::/";
        assert_eq!(cpu_cgroup_is_root(v1_root, none), Ok(()));
        let v1_grouped = "1:cpu,cpuacct:/system.slice/shoal.service\n0::/";
        assert!(cpu_cgroup_is_root(v1_grouped, none).is_err());
        // cpuacct alone is not the CPU controller.
        assert_eq!(cpu_cgroup_is_root("2:cpuacct:/x\n0::/y", none), Ok(()));
        let v2 = "0::/system.slice/shoal.service";
        assert_eq!(cpu_cgroup_is_root(v2, |_| "memory pids".into()), Ok(()));
        assert!(cpu_cgroup_is_root(v2, |_| "cpu memory".into()).is_err());
        assert_eq!(cpu_cgroup_is_root("0::/", |_| "cpu".into()), Ok(()));
    }
}
