//! The attack suite in the shared tree (`docs/security.md`, "How each
//! claim is tested"): real unprivileged users on a namespaced cluster
//! with the whole system, each command run with `setpriv` (its uid, its
//! gid, no other groups).

use std::process::Output;

mod common;

use common::{TestCluster, shoal};
use shoal_cluster::{Cluster, Mode};

/// Runs `script` with `sh` on `node` as the local user `user`, with its
/// node's socket.
fn as_user(c: &Cluster, node: &str, user: &str, script: &str) -> Output {
    let (uid, gid) = common::local_user(user, false);
    let socket = c.node(node).unwrap().socket.clone();
    c.command(node, "setpriv")
        .unwrap()
        .args(["--reuid", &uid.to_string(), "--regid", &gid.to_string()])
        .args(["--clear-groups", "--", "sh", "-c", script])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/")
        .env("SHOAL", shoal())
        .env("SHOAL_ATTACK", env!("CARGO_BIN_EXE_shoal-attack"))
        .env("SHOAL_NODE", socket)
        .current_dir("/")
        .output()
        .unwrap()
}

/// [`as_user`], which must succeed: its standard output.
fn ok_as(c: &Cluster, node: &str, user: &str, script: &str) -> String {
    let out = as_user(c, node, user, script);
    assert!(
        out.status.success(),
        "{script} on {node} as {user}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const OWNER: &str = "shoal-victim";
const ATTACKER: &str = "shoal-attacker";

/// Review 3, M4: a capability the attacker minted while a file was
/// readable to them reads nothing once its owner takes the right away
/// (chmod 600), nor once the owner revokes its capabilities (`shoal fs
/// revoke`), which the attacker may not do; the file's contents written
/// after never reach them.  And the capabilities of a file's contents a
/// reader gets destroy nothing on the file servers.
#[test]
fn a_capability_dies_with_the_rights_it_was_minted_from() {
    let t = TestCluster::up("um", 63, 3, Mode::Netns);
    let c = t.get();
    c.start_system(&mut |l| eprintln!("[um] {l}")).unwrap();
    common::ok(c, "n1", "mkdir /shoal/pub && chmod 1777 /shoal/pub");
    // A file of the owner's, readable to all (umask 022).
    ok_as(c, "n1", OWNER, "umask 022; echo 1 > /shoal/pub/f");
    let cap = ok_as(c, "n2", ATTACKER, "$SHOAL fs cap /shoal/pub/f");
    let cap = cap.trim();
    assert_eq!(
        ok_as(c, "n3", ATTACKER, &format!("echo {cap} | $SHOAL fs cat -")),
        "1\n"
    );
    // The owner takes the right away, then writes a secret.
    ok_as(
        c,
        "n1",
        OWNER,
        "chmod 600 /shoal/pub/f && echo secret > /shoal/pub/f",
    );
    let read = as_user(c, "n3", ATTACKER, &format!("echo {cap} | $SHOAL fs cat -"));
    assert!(!read.status.success(), "{read:?}");
    assert!(!String::from_utf8_lossy(&read.stdout).contains("secret"));
    assert!(
        String::from_utf8_lossy(&read.stderr).contains("permission denied"),
        "{read:?}"
    );
    // The owner's own capability, minted now, reads it.
    let mine = ok_as(c, "n1", OWNER, "$SHOAL fs cap /shoal/pub/f");
    assert_eq!(
        ok_as(
            c,
            "n2",
            OWNER,
            &format!("echo {} | $SHOAL fs cat -", mine.trim())
        ),
        "secret\n"
    );

    // Revoked on demand: only by the owner.
    ok_as(c, "n1", OWNER, "umask 022; echo 2 > /shoal/pub/g");
    let cap = ok_as(c, "n2", ATTACKER, "$SHOAL fs cap /shoal/pub/g");
    let cap = cap.trim();
    let refused = as_user(c, "n2", ATTACKER, "$SHOAL fs revoke /shoal/pub/g");
    assert!(!refused.status.success(), "{refused:?}");
    assert_eq!(
        ok_as(c, "n3", ATTACKER, &format!("echo {cap} | $SHOAL fs cat -")),
        "2\n"
    );
    ok_as(c, "n1", OWNER, "$SHOAL fs revoke /shoal/pub/g");
    let read = as_user(c, "n3", ATTACKER, &format!("echo {cap} | $SHOAL fs cat -"));
    assert!(!read.status.success(), "{read:?}");
    // The file is still theirs to read by its path, and by a new
    // capability.
    assert_eq!(ok_as(c, "n2", ATTACKER, "cat /shoal/pub/g"), "2\n");
    let fresh = ok_as(c, "n2", ATTACKER, "$SHOAL fs cap /shoal/pub/g");
    assert_eq!(
        ok_as(
            c,
            "n3",
            ATTACKER,
            &format!("echo {} | $SHOAL fs cat -", fresh.trim())
        ),
        "2\n"
    );

    // A reader's capabilities of the file's contents (`user.shoal.content`)
    // read them, and destroy nothing.
    let tried = as_user(
        c,
        "n2",
        ATTACKER,
        "$SHOAL_ATTACK --socket $SHOAL_NODE destroy-content --path /shoal/pub/g",
    );
    let said = String::from_utf8_lossy(&tried.stdout);
    assert_eq!(
        tried.status.code(),
        Some(1),
        "{said}{}",
        String::from_utf8_lossy(&tried.stderr)
    );
    assert!(
        said.contains("refused") && !said.contains("destroyed"),
        "{said}"
    );
    assert_eq!(ok_as(c, "n3", OWNER, "cat /shoal/pub/g"), "2\n");
}
