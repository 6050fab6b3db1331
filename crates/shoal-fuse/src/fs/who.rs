//! Who makes a request: the uid and gid the kernel gives it, and the
//! caller's supplementary groups, which only `/proc/PID/status` tells.
//!
//! Reading that file costs more than answering most requests from the
//! mount's caches (the kernel formats the whole status for each read), so
//! the groups are kept for [`KEPT`] per (pid, uid, gid).  They only restate
//! checks the kernel has made already: the mount runs with
//! `default_permissions`, so the kernel checks every access with the
//! caller's current credentials before the request reaches the mount, and
//! kept groups, even a second out of date, cannot let a request through
//! that the kernel refused.  The one decision the kernel does not make
//! first, which rights a minted `user.shoal.cap` carries, is made with
//! groups read afresh ([`now`]).

use rustc_hash::FxHashMap as HashMap;
use std::time::{Duration, Instant};

use fuser::Request;
use parking_lot::Mutex;
use shoal_fs::model::Identity;

/// How long a caller's groups are kept.
pub(super) const KEPT: Duration = Duration::from_secs(1);

/// Callers kept at most; past it, all are forgotten.
const MOST: usize = 4096;

/// A caller: pid, uid, gid.
type Caller = (u32, u32, u32);

/// The groups of recent callers, and when they were read.
#[derive(Default)]
pub(super) struct Callers {
    kept: Mutex<HashMap<Caller, (Vec<u32>, Instant)>>,
}

impl Callers {
    /// The caller of `req`, with groups at most [`KEPT`] old.
    pub(super) fn of(&self, req: &Request) -> Identity {
        let key = (req.pid(), req.uid(), req.gid());
        let at = Instant::now();
        if let Some((groups, read)) = self.kept.lock().get(&key)
            && at.saturating_duration_since(*read) < KEPT
        {
            let mut id = Identity::user(req.uid(), req.gid());
            id.groups = groups.clone();
            return id;
        }
        let id = now(req);
        let mut kept = self.kept.lock();
        if kept.len() >= MOST {
            kept.clear();
        }
        kept.insert(key, (id.groups.clone(), at));
        id
    }
}

/// The caller of `req`, with its groups as they are now: read from its
/// process, and only if that process's file system ids are still the
/// request's (a pid reused since lends no groups); none otherwise.
pub(super) fn now(req: &Request) -> Identity {
    let mut id = Identity::user(req.uid(), req.gid());
    if let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", req.pid()))
        && fs_id(&status, "Uid:") == Some(req.uid())
        && fs_id(&status, "Gid:") == Some(req.gid())
        && let Some(line) = status.lines().find(|l| l.starts_with("Groups:"))
    {
        id.groups = groups(&line[7..]);
    }
    id
}

/// The file system id (the fourth) of a status file's `Uid:` or `Gid:`
/// line.
fn fs_id(status: &str, key: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix(key))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// The groups of a status file's `Groups:` line.
fn groups(line: &str) -> Vec<u32> {
    line.split_whitespace()
        .filter_map(|g| g.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_groups_line_is_read_as_numbers() {
        assert_eq!(groups("\t4 24 27 1000 \n"), vec![4, 24, 27, 1000]);
        assert!(groups("").is_empty());
    }

    #[test]
    fn the_file_system_ids_are_the_fourth() {
        let status = "Name:\tx\nUid:\t1000\t1001\t1002\t1003\nGid:\t5\t6\t7\t8\n";
        assert_eq!(fs_id(status, "Uid:"), Some(1003));
        assert_eq!(fs_id(status, "Gid:"), Some(8));
        assert_eq!(fs_id("Uid:\t1\n", "Uid:"), None);
    }
}
