//! The shared file system on a real namespaced cluster, as `shoal cluster
//! up` makes it (`docs/fs.md`): the tree mounted at /shoal on every node,
//! each in its node's own mount namespace; a file written on one node
//! read at once on another; a program run remotely by `shoal run` working
//! in the shared tree; a file read by an ordinary user on another node
//! through a capability found by path (and refused by path, and forged);
//! a metadata replica and a mount killed (SIGKILL) and restarted by their
//! daemons, nothing lost; every metadata replica killed at once right
//! after an `fsync`, nothing `fsync`ed lost.

mod common;

use common::{TestCluster, kill_and_wait, ok, services, sh, shoal};
use shoal_cluster::{Cluster, Mode};

/// Runs `script` on `node` until it succeeds (a restarted mount or primary
/// takes a moment); its output.
fn until_ok(c: &Cluster, node: &str, script: &str) -> String {
    let out = common::until_ok(
        script,
        || sh(c, node, script),
        || format!("{:?}", services(c)),
    );
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn the_tree_is_shared_by_every_node_and_survives_its_servers_crashes() {
    let tc = TestCluster::up("fs", 60, 4, Mode::Netns);
    let c = tc.get();
    c.start_system(&mut |l| eprintln!("[fs] {l}")).unwrap();

    // Mounted on every node, each in its own mount namespace.
    for node in ["n1", "n2", "n3", "n4"] {
        ok(c, node, "mountpoint -q /shoal");
    }

    // A mount kept by its daemon is alone in its session: every one of its
    // threads yields the CPU to programs (SCHED_IDLE, policy 5), so a
    // program woken by an answer stays on its CPU.
    let (pid, _) = common::service(c, "n2", "fs-mount");
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    let mut threads = 0;
    for task in tasks {
        let stat = std::fs::read_to_string(task.unwrap().path().join("stat")).unwrap();
        let policy = stat[stat.rfind(')').unwrap() + 1..]
            .split_whitespace()
            .nth(38)
            .unwrap()
            .to_string();
        assert_eq!(policy, "5", "a thread of the mount: {stat}");
        threads += 1;
    }
    assert!(threads > 4, "the mount has {threads} threads");

    // Written on n1, read at once on n4.
    ok(
        c,
        "n1",
        "mkdir -p /shoal/work && echo hello from n1 > /shoal/work/a",
    );
    assert_eq!(ok(c, "n4", "cat /shoal/work/a"), "hello from n1\n");

    // A program run remotely works in the shared tree: its working
    // directory exists there, and what it writes is seen at home.
    let out = ok(
        c,
        "n1",
        "cd /shoal/work && $SHOAL run --on n3 -- sh -c 'pwd; cat a; echo from n3 > b'",
    );
    assert_eq!(out, "/shoal/work\nhello from n1\n");
    assert_eq!(ok(c, "n2", "cat /shoal/work/b"), "from n3\n");

    // A file only root may read, handed as a read-only capability to an
    // ordinary user (nobody) on another node: the user reads it by the
    // capability, though not by its path, and a forged one is refused.
    ok(
        c,
        "n1",
        "echo for root alone > /shoal/work/private && chmod 600 /shoal/work/private",
    );
    let cap = ok(
        c,
        "n1",
        "$SHOAL cap restrict --rights r------- $($SHOAL fs cap /shoal/work/private)",
    );
    let cap = cap.trim();
    let nobody = |script: &str| {
        let socket = c.node("n3").unwrap().socket.clone();
        c.command("n3", "setpriv")
            .unwrap()
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .args(["--", "sh", "-c", script])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", "/")
            .env("SHOAL", shoal())
            .env("SHOAL_NODE", socket)
            .output()
            .unwrap()
    };
    let by_path = nobody("cat /shoal/work/private");
    assert!(!by_path.status.success(), "{by_path:?}");
    // Given on standard input, off the command line (review 3, L10).
    let by_cap = nobody(&format!("echo {cap} | $SHOAL fs cat -"));
    assert_eq!(
        String::from_utf8_lossy(&by_cap.stdout),
        "for root alone\n",
        "{by_cap:?}"
    );
    let stat = nobody(&format!("$SHOAL fs stat {cap}"));
    assert!(
        String::from_utf8_lossy(&stat.stdout).contains("size     15\n"),
        "{stat:?}"
    );
    let forged = format!("{}0", &cap[..cap.len() - 1]);
    let forged = if forged == cap {
        format!("{}1", &cap[..cap.len() - 1])
    } else {
        forged
    };
    let refused = nobody(&format!("$SHOAL fs cat {forged}"));
    assert!(!refused.status.success(), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("permission denied"),
        "{refused:?}"
    );

    // A metadata replica is killed (the primary, if n1's is): its daemon
    // restarts it, the others serve meanwhile, and the tree is whole.
    kill_and_wait(c, "n1", "fs-r0");
    assert_eq!(until_ok(c, "n2", "cat /shoal/work/a"), "hello from n1\n");
    ok(c, "n2", "echo after the crash >> /shoal/work/a");

    // A node's mount is killed: its daemon mounts the tree again.
    kill_and_wait(c, "n4", "fs-mount");
    assert_eq!(
        until_ok(c, "n4", "cat /shoal/work/a"),
        "hello from n1\nafter the crash\n"
    );

    every_replica_killed_at_once_keeps_what_was_fsynced(c);
}

/// A file made and `fsync`ed on n2 (`sync FILE`), and a file rewritten and
/// `fsync`ed; in a directory n2 made (private to it), a file made and
/// `fsync`ed (its commit pushed with its name) and a directory made and
/// its parent `fsync`ed (a push alone); then every metadata replica
/// killed at once, before their logs' next timed flush: the tree comes
/// back from the logs with all of them.
fn every_replica_killed_at_once_keeps_what_was_fsynced(c: &Cluster) {
    let replicas = [("n1", "fs-r0"), ("n2", "fs-r1"), ("n3", "fs-r2")];
    let before: Vec<(i64, u64)> = replicas
        .iter()
        .map(|(node, name)| common::service(c, node, name))
        .collect();
    ok(
        c,
        "n2",
        "echo made and synced > /shoal/work/synced && sync /shoal/work/synced \
         && echo rewritten and synced > /shoal/work/a && sync /shoal/work/a \
         && mkdir /shoal/work/n2 && echo private and synced > /shoal/work/n2/f \
         && sync /shoal/work/n2/f && mkdir /shoal/work/n2/sub && sync /shoal/work/n2",
    );
    for (pid, _) in &before {
        assert!(*pid > 0, "a metadata replica is not running: {before:?}");
        // SAFETY: kill has no memory effects.
        assert_eq!(unsafe { libc::kill(*pid as i32, libc::SIGKILL) }, 0);
    }
    let restarted = |((node, name), (_, starts)): (&(&str, &str), &(i64, u64))| {
        let (pid, s) = common::service(c, node, name);
        s > *starts && pid > 0
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !replicas.iter().zip(&before).all(restarted) {
        assert!(
            std::time::Instant::now() < until,
            "the metadata replicas were not all restarted: {:?}",
            services(c)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(
        until_ok(c, "n4", "cat /shoal/work/synced"),
        "made and synced\n"
    );
    assert_eq!(
        until_ok(c, "n3", "cat /shoal/work/a"),
        "rewritten and synced\n"
    );
    assert_eq!(
        until_ok(c, "n4", "cat /shoal/work/n2/f"),
        "private and synced\n"
    );
    assert_eq!(until_ok(c, "n3", "ls /shoal/work/n2"), "f\nsub\n");
}
