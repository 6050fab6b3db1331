//! The attack suite's signals (moved from `attack.rs`): a user's
//! `shoal kill` of a program that ended reaches no process that took its
//! process group's id since.

use std::process::Command;

use super::become_attacker;
use super::common::{TestCluster, open_path_to, shoal};
use shoal_cluster::Mode;

/// The process group id of the host process whose command line is `sh`
/// with `mark` among its arguments, once one is.
fn group_of(mark: &str) -> i32 {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if !cmdline.starts_with(b"sh\0")
                || !cmdline.windows(mark.len()).any(|w| w == mark.as_bytes())
            {
                continue;
            }
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map_or(vec![], |(_, r)| r.split_whitespace().collect());
            if let Some(group) = fields.get(2).and_then(|g| g.parse().ok()) {
                return group;
            }
        }
        assert!(std::time::Instant::now() < until, "{mark} never started");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A root process that leads a process group of its own whose id is
/// `group`, made by having the kernel hand out that pid next.
fn group_leader_with_id(group: i32) -> std::process::Child {
    for _ in 0..50 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (group - 1).to_string()).unwrap();
        let child = Command::new("setsid")
            .args(["sleep", "600"])
            .spawn()
            .unwrap();
        if child.id() as i32 == group {
            return child;
        }
        let mut child = child;
        child.kill().unwrap();
        child.wait().unwrap();
    }
    panic!("pid {group} could not be had");
}

/// Review 3, M7: a user's program that ended, though its end was not read
/// yet, is not signalled any more: its process group's id may be another
/// process's by then.  Here a root process takes that id, and the user's
/// `shoal kill -KILL` of the ended program does not touch it.
#[test]
fn a_signal_to_an_ended_program_reaches_no_process_that_took_its_group_id() {
    use std::time::{Duration, Instant};

    let t = TestCluster::up("ui", 53, 2, Mode::Netns);
    let c = t.get();
    open_path_to(c.dir());
    open_path_to(shoal().parent().unwrap());
    let shoal = shoal();
    let mark = format!("shoal-m7-{:016x}", rand::random::<u64>());
    let mut run = c
        .command("n1", "setpriv")
        .unwrap()
        .args(become_attacker())
        .arg(&shoal)
        .args(["run", "--on", "n2", "--", "sh", "-c", "sleep 2", &mark])
        .current_dir("/tmp")
        .spawn()
        .unwrap();
    let group = group_of(&mark);
    // Its home stops reading (the user's own `shoal run`, stopped), so its
    // end stays unread.
    // SAFETY: kill(2) of our child.
    assert_eq!(unsafe { libc::kill(run.id() as i32, libc::SIGSTOP) }, 0);
    let until = Instant::now() + Duration::from_secs(30);
    while std::path::Path::new(&format!("/proc/{group}")).exists() {
        assert!(Instant::now() < until, "the program's group never ended");
        std::thread::sleep(Duration::from_millis(50));
    }
    let ps = c
        .command("n1", "setpriv")
        .unwrap()
        .args(become_attacker())
        .arg(&shoal)
        .args(["ps", "--json"])
        .current_dir("/tmp")
        .output()
        .unwrap();
    let rows: serde_json::Value = serde_json::from_slice(&ps.stdout).unwrap();
    let id = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["command"].as_str().is_some_and(|s| s.contains(&mark)))
        .and_then(|r| r["id"].as_str())
        .unwrap_or_else(|| panic!("the program is not in ps: {rows}"))
        .to_string();
    let mut decoy = group_leader_with_id(group);
    let out = c
        .command("n1", "setpriv")
        .unwrap()
        .args(become_attacker())
        .arg(&shoal)
        .args(["kill", "-s", "KILL", &id])
        .current_dir("/tmp")
        .output()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let alive = decoy.try_wait().unwrap().is_none();
    decoy.kill().ok();
    decoy.wait().unwrap();
    // SAFETY: kill(2) of our child.
    unsafe { libc::kill(run.id() as i32, libc::SIGKILL) };
    run.wait().unwrap();
    assert!(
        alive,
        "root's process that took the group id was killed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "the kill of an ended program worked");
}
