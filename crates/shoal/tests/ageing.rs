//! Garbage collection keeps what anything names (`docs/files.md`,
//! "Replication and garbage collection"): on a namespaced cluster with the
//! whole system, its file servers' time-to-live cut to 4 passes and no gap
//! between ageing passes, and its supervised object managers (one beside
//! each file server) making a round every 2 s, the managers alone reclaim
//! a file nothing names, and go on doing so with one node's manager
//! stopped; then 50 more passes by hand, while the managers go on, keep
//! every byte of the files the directory names and of the shared tree
//! (whose contents no directory names). Last, contents no server holds
//! any more fail a read with `EIO` at once.

use std::time::{Duration, Instant};

mod common;

use common::{TestCluster, ok_with};
use shoal_cluster::{Cluster, Mode, SystemOptions};

/// `shoal ARGS` as the administrator on `node`: its output.
fn admin(c: &Cluster, node: &str, script: &str) -> String {
    let config = c.admin_config();
    let env = [
        ("SHOAL_CONFIG_DIR", config.as_os_str()),
        ("SHOAL_FILE_CACHE", "off".as_ref()),
    ];
    ok_with(c, node, script, &env)
}

/// The sum of `name=N` over the lines of a pass's report.
fn figure(report: &str, name: &str) -> u64 {
    report
        .split_whitespace()
        .filter_map(|w| w.strip_prefix(&format!("{name}=")))
        .filter_map(|v| v.parse::<u64>().ok())
        .sum()
}

/// Waits (up to a minute) until the file servers destroyed `n` files by
/// age in all.
fn reclaimed_by_the_managers(c: &Cluster, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let servers = admin(c, "n3", "$SHOAL file servers");
        let destroyed = figure(&servers, "destroyed_by_age");
        if destroyed >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the managers destroyed {destroyed} files by age, not {n}: {servers}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn managers_and_fifty_passes_keep_what_is_named_and_reclaim_the_rest() {
    let t = TestCluster::up("ag", 66, 3, Mode::Netns);
    let c = t.get();
    let opts = SystemOptions {
        // With no gap between ageings, every pass running at once may age
        // a file after the last touch of it: up to three here (two
        // managers and the passes by hand), so a named file needs a
        // time-to-live of four to outlive them (with three it could reach
        // zero, and did once in CI).
        file_server_args: ["--ttl", "4", "--age-secs", "0"].map(String::from).to_vec(),
        manager_args: ["--every", "2"].map(String::from).to_vec(),
    };
    c.start_system_with(&opts, &mut |l| eprintln!("[ag] {l}"))
        .unwrap();
    // The directory: two named files; one more, named and then not.
    admin(
        c,
        "n1",
        "head -c 300000 /dev/urandom > /tmp/ag-a && head -c 5000 /dev/urandom > /tmp/ag-b \
         && $SHOAL file put kept-a /tmp/ag-a && $SHOAL file put kept-b /tmp/ag-b \
         && $SHOAL file put gone /tmp/ag-b && $SHOAL dir rm gone",
    );
    let named = admin(
        c,
        "n1",
        "$SHOAL file cat kept-a | md5sum; $SHOAL file cat kept-b | md5sum",
    );
    // The tree: files of many sizes, written back (fsync) from n1.
    let before = common::ok(
        c,
        "n1",
        "mkdir /shoal/ag && for i in $(seq 30); do head -c $((i * 7000)) /dev/urandom > /shoal/ag/f$i; done \
         && sync /shoal/ag/* && md5sum /shoal/ag/*",
    );
    // The managers reclaim the unnamed file's two replicas by themselves,
    // and, with n1's stopped, another's.
    reclaimed_by_the_managers(c, 2);
    admin(c, "n1", "$SHOAL service stop file-manager");
    admin(
        c,
        "n1",
        "$SHOAL file put gone2 /tmp/ag-b && $SHOAL dir rm gone2",
    );
    reclaimed_by_the_managers(c, 4);
    for pass in 0..50 {
        let report = admin(c, "n2", "$SHOAL file gc");
        assert_eq!(figure(&report, "servers_aged"), 3, "pass {pass}: {report}");
        assert!(report.contains("trees=[\"fs:"), "pass {pass}: {report}");
    }
    assert_eq!(
        admin(
            c,
            "n3",
            "$SHOAL file cat kept-a | md5sum; $SHOAL file cat kept-b | md5sum"
        ),
        named
    );
    // Read from a node that never read them: from the file servers.
    let after = common::ok(c, "n3", "timeout 60 md5sum /shoal/ag/*");
    assert_eq!(after, before);
    contents_no_server_holds_fail_with_eio(c);
}

/// With the file system taken out of `filesystems/` (an operator's
/// mistake), passes no longer touch its tree, and its contents age away:
/// a read of one, on a node that never read it, then fails with `EIO`
/// at once rather than waiting for ever, and the metadata service's log
/// says why.
fn contents_no_server_holds_fail_with_eio(c: &Cluster) {
    for node in ["n1", "n2", "n3"] {
        admin(c, node, "$SHOAL service stop file-manager || true");
    }
    admin(c, "n1", "$SHOAL dir rm filesystems/fs");
    for _ in 0..4 {
        admin(c, "n1", "$SHOAL file gc");
    }
    let started = Instant::now();
    let out = c
        .command("n2", "sh")
        .unwrap()
        .args(["-c", "timeout 60 cat /shoal/ag/f7 > /dev/null"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("Input/output error"),
        "{:?}: {err}",
        out.status
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
    let logs: String = ["n1", "n2", "n3"]
        .iter()
        .enumerate()
        .map(|(i, n)| admin(c, n, &format!("$SHOAL service logs fs-r{i}")))
        .collect();
    assert!(logs.contains("on no file server"), "{logs}");
}
