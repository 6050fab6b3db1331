//! Process groups as `/proc` shows them: their members and what they use.

use std::collections::HashMap;

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
