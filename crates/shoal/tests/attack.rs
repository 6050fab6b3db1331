//! The attack suite (`docs/security.md`, "How each claim is tested"): what
//! the security review found, tried as an attacker would.  Each attack
//! must fail with a clear error and change nothing.  The suite runs as
//! root and makes a real unprivileged user, `shoal-attacker`, whose
//! commands run with `setpriv` (its uid, its gid, no other groups).
//!
//! This file grows with the trust work: attacks through the node's socket
//! and on the wire join it as the daemon and the library move onto
//! sessions.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

mod common;

use common::{TestCluster, shoal};
use shoal_cluster::Mode;

/// The attacker's uid and gid, making the user on first use.
fn attacker() -> (u32, u32) {
    let id = |flag: &str| {
        Command::new("id")
            .args([flag, "shoal-attacker"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
    };
    if id("-u").is_none() {
        let made = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                "shoal-attacker",
            ])
            .status()
            .unwrap();
        // Another test binary may have made it meanwhile.
        assert!(made.success() || id("-u").is_some(), "useradd failed");
    }
    (id("-u").unwrap(), id("-g").unwrap())
}

/// Runs `program ARGS` as the attacker.
fn as_attacker(program: &str, args: &[&str]) -> Output {
    let (uid, gid) = attacker();
    Command::new("setpriv")
        .args([
            "--reuid",
            &uid.to_string(),
            "--regid",
            &gid.to_string(),
            "--clear-groups",
            "--",
            program,
        ])
        .args(args)
        .output()
        .unwrap()
}

fn denied(out: &Output) -> bool {
    !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Permission denied")
}

/// Opens the way to `dir` for everyone (the test's temporary directory is
/// root's alone), so that only the cluster's own modes protect it.
fn open_path_to(dir: &Path) {
    let mut p = dir;
    while let Some(parent) = p.parent() {
        if parent == Path::new("/") || parent == Path::new("/tmp") {
            break;
        }
        p = parent;
        let mode = std::fs::metadata(p).unwrap().permissions().mode();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode | 0o011)).unwrap();
    }
}

/// Secrets on disk (review M2): the cluster key, the admin key, a node's
/// static key and state are not readable by another local user, although
/// the way to them is open and the cluster's public files are readable.
#[test]
fn a_local_user_cannot_read_the_cluster_s_secrets() {
    let t = TestCluster::up("tx", 42, 2, Mode::Netns);
    let c = t.get();
    let dir = c.dir().to_path_buf();
    open_path_to(&dir);
    let path = |p: &str| dir.join(p).display().to_string();
    // The way is open: the public description of the cluster reads.
    let public = as_attacker("cat", &[&path("cluster.toml")]);
    assert!(
        public.status.success(),
        "{}",
        String::from_utf8_lossy(&public.stderr)
    );
    for secret in [
        "cluster.key",
        "admin/admin.key",
        "n1/state/node.key",
        "n2/state/node.key",
    ] {
        let out = as_attacker("cat", &[&path(secret)]);
        assert!(denied(&out), "{secret}: {out:?}");
    }
    let out = as_attacker("ls", &[&path("n1/state")]);
    assert!(denied(&out), "{out:?}");
    // Nor can it plant anything where the cluster keeps its files.
    for planted in [
        "planted",
        "n1/planted",
        "n1/state/node.pid",
        "admin/admin.key",
    ] {
        let out = as_attacker("touch", &[&path(planted)]);
        assert!(denied(&out), "{planted}: {out:?}");
    }
    assert!(!dir.join("planted").exists() && !dir.join("n1/planted").exists());
}

/// Root's cluster directory cannot be prepared by someone else (review
/// M4): a directory another user owns, or one anybody may write to, is
/// refused with a clear error, and nothing is written into it.
#[test]
fn root_refuses_a_cluster_directory_someone_else_could_plant() {
    let (uid, gid) = attacker();
    let tmp = tempfile::tempdir().unwrap();
    open_path_to(&tmp.path().join("x"));
    let theirs = tmp.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(uid), Some(gid)).unwrap();
    let planted_key = theirs.join("cluster.key");
    let out = as_attacker("touch", &[planted_key.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    for dir in [&theirs, &open] {
        let out = Command::new(shoal())
            .args([
                "cluster", "up", "--nodes", "1", "--name", "ty", "--subnet", "43",
            ])
            .arg("--dir")
            .arg(dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains("refusing to use it"), "{err}");
        assert!(!dir.join("cluster.toml").exists());
        assert!(!dir.join("admin").exists());
    }
    assert_eq!(std::fs::metadata(&planted_key).unwrap().len(), 0);
}
