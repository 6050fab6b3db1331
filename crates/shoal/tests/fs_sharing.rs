//! The shared tree under sharing (`docs/fs.md`): several nodes working on
//! the same names and files at the same moment, on a namespaced cluster
//! with the whole system.

use std::process::Stdio;

mod common;

use common::{TestCluster, shoal};
use shoal_cluster::{Cluster, Mode};

/// Runs `script` with `sh` on each of `nodes` at the same moment (each
/// waits for a file of the host's, outside the tree, to appear), and
/// returns each one's output.
fn at_once(c: &Cluster, nodes: &[&str], script: &str) -> Vec<std::process::Output> {
    let go = tempfile::tempdir().unwrap();
    let flag = go.path().join("go");
    let children: Vec<_> = nodes
        .iter()
        .map(|node| {
            c.command(node, "sh")
                .unwrap()
                .args([
                    "-c",
                    &format!(
                        "while [ ! -e {} ]; do sleep 0.01; done; {script}",
                        flag.display()
                    ),
                ])
                .env("SHOAL", shoal())
                .env("NODE", node)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    std::fs::write(&flag, b"").unwrap();
    children
        .into_iter()
        .map(|child| child.wait_with_output().unwrap())
        .collect()
}

/// `open(O_CREAT)` without `O_EXCL`, as a shell's `>>` makes it, of one
/// new name from two and then three nodes at once, in a sticky directory
/// another node made: every open opens the file, whichever node made it.
#[test]
fn nodes_creating_one_name_at_once_all_open_it() {
    let t = TestCluster::up("sa", 64, 3, Mode::Netns);
    let c = t.get();
    c.start_system(&mut |l| eprintln!("[sa] {l}")).unwrap();
    common::ok(c, "n3", "mkdir /shoal/race && chmod 1777 /shoal/race");
    for (nodes, prefix) in [
        (&["n1", "n2"][..], "two"),
        (&["n1", "n2", "n3"][..], "three"),
    ] {
        let script = format!(
            "for i in $(seq 150); do : >> /shoal/race/{prefix}$i || echo \"$NODE failed $i\"; done"
        );
        for (node, out) in nodes.iter().zip(at_once(c, nodes, &script)) {
            assert!(
                out.status.success() && out.stdout.is_empty(),
                "{node}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let listed = common::ok(c, "n1", &format!("ls /shoal/race | grep -c '^{prefix}'"));
        assert_eq!(listed.trim(), "150");
    }
}
