//! The attack suite against pids (`docs/security.md`, "How each claim is
//! tested"): a check that trusts a process id must not be passed by
//! another process that took the id after the first ended.  The attacker
//! is a real unprivileged user, `shoal-attacker`, run with `setpriv`; the
//! test gives a chosen pid to a chosen process through
//! `/proc/sys/kernel/ns_last_pid`.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::TestCluster;
use shoal_cluster::Mode;

/// The pid of the host process running `sh` whose arguments hold
/// `mark`, if one does.
fn pid_of(mark: &str) -> Option<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .find_map(|entry| {
            let pid = entry.file_name().to_string_lossy().parse::<i32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            (cmdline.starts_with(b"sh\0")
                && cmdline.windows(mark.len()).any(|w| w == mark.as_bytes()))
            .then_some(pid)
        })
}

/// Waits until `done` holds (20 s at most).
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Review 3, M8: a user's link whose process ended registers no system
/// port, even when the process that took its pid is a system service's
/// program (the daemon asks the link's pidfd, taken when the link
/// opened, whether the process it was opened by still lives).
#[test]
fn a_link_whose_process_ended_cannot_pass_for_the_service_that_took_its_pid() {
    let t = TestCluster::up("un", 65, 2, Mode::Netns);
    let c = t.get();
    let (uid, gid) = common::local_user("shoal-attacker", false);
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    common::open_path_to(dir.path());
    let (go, out) = (dir.path().join("go"), dir.path().join("out"));
    let cluster = c.context().config().cluster;
    let port = shoal_rpc::system_port(&cluster, "review 3 m8").put_port();
    // The attacker's link, left to a child by the process that opened it.
    let opener = Command::new("setpriv")
        .args(["--reuid", &uid.to_string(), "--regid", &gid.to_string()])
        .args([
            "--clear-groups",
            env!("CARGO_BIN_EXE_shoal-attack"),
            "--socket",
        ])
        .arg(&c.node("n1").unwrap().socket)
        .arg("orphan-register")
        .arg("--go")
        .arg(&go)
        .arg("--out")
        .arg(&out)
        .args(["--port", &port.to_string()])
        .current_dir("/tmp")
        .spawn()
        .unwrap();
    let pid = opener.id() as i32;
    let mut opener = opener;
    assert!(opener.wait().unwrap().success());
    // A system service whose program takes that pid: the daemon's
    // spawner forks a session, a watcher and the program, so the kernel
    // is told to hand out the pid three forks on; tried until it does.
    let mark = format!("shoal-m8-{:016x}", rand::random::<u64>());
    let mut holder =
        shoal_nodesvc::ServiceConfig::new("holder", &["sh", "-c", &format!("sleep 600; : {mark}")]);
    holder.system = true;
    let mut took = false;
    for _ in 0..40 {
        c.set_services("n1", Vec::new()).unwrap();
        until("the holder stopped", || pid_of(&mark).is_none());
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 3).to_string()).unwrap();
        c.set_services("n1", vec![holder.clone()]).unwrap();
        until("the holder started", || pid_of(&mark).is_some());
        if pid_of(&mark) == Some(pid) {
            took = true;
            break;
        }
    }
    assert!(
        took,
        "pid {pid} could not be given to the service's program"
    );
    std::fs::write(&go, b"").unwrap();
    until("the attacker's answer", || out.exists());
    let answer = std::fs::read_to_string(&out).unwrap();
    assert!(
        answer.contains("may serve a system service"),
        "the node answered {answer}"
    );
    c.set_services("n1", Vec::new()).unwrap();
}
