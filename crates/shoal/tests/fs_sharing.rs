//! The shared tree under sharing (`docs/fs.md`): several nodes working on
//! the same names and files at the same moment, on a namespaced cluster
//! with the whole system.

use std::process::Stdio;

mod common;
#[path = "fs_sharing/sparse.rs"]
mod sparse;

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

/// Three nodes sharing names and files at once, on one cluster: creates
/// of one name, appends to one log, overwrites of one file's blocks; and
/// a sparse file of 1 TiB that several nodes write, read and copy.
#[test]
fn nodes_sharing_names_and_files_lose_nothing() {
    let t = TestCluster::up("sa", 64, 3, Mode::Netns);
    let c = t.get();
    c.start_system(&mut |l| eprintln!("[sa] {l}")).unwrap();
    common::ok(c, "n3", "mkdir /shoal/race && chmod 1777 /shoal/race");
    creating_one_name_at_once_all_open_it(c);
    appending_to_one_log_at_once_keeps_every_line(c);
    overwriting_blocks_at_once_leaves_a_serial_order(c);
    sparse::a_terabyte_sparse_file_costs_what_it_holds(c);
}

/// Each node's output is empty and its script succeeded.
fn all_quiet(nodes: &[&str], outs: Vec<std::process::Output>) {
    for (node, out) in nodes.iter().zip(outs) {
        assert!(
            out.status.success() && out.stdout.is_empty(),
            "{node}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `open(O_CREAT)` without `O_EXCL`, as a shell's `>>` makes it, of one
/// new name from two and then three nodes at once, in a sticky directory
/// another node made: every open opens the file, whichever node made it.
/// (Before: `sh: cannot create /shoal/race/three1: File exists`.)
fn creating_one_name_at_once_all_open_it(c: &Cluster) {
    for (nodes, prefix) in [
        (&["n1", "n2"][..], "two"),
        (&["n1", "n2", "n3"][..], "three"),
    ] {
        let script = format!(
            "for i in $(seq 150); do : >> /shoal/race/{prefix}$i || echo \"$NODE failed $i\"; done"
        );
        all_quiet(nodes, at_once(c, nodes, &script));
        let listed = common::ok(c, "n1", &format!("ls /shoal/race | grep -c '^{prefix}'"));
        assert_eq!(listed.trim(), "150");
    }
}

/// Lines each node appends.
const LINES: usize = 3000;

/// Three programs on three nodes appending 3,000 lines each to one file
/// through one `O_APPEND` open each, as jobs writing one log do: every
/// line is there exactly once, each node's in the order it wrote them,
/// and no write fails.  (Before: lines lost in most tries, the writer's
/// mount logging "answering a recall with changes not written back".)
fn appending_to_one_log_at_once_keeps_every_line(c: &Cluster) {
    let nodes = ["n1", "n2", "n3"];
    let script = format!(
        "exec 3>>/shoal/race/log && i=0 && while [ $i -lt {LINES} ]; do \
         i=$((i+1)); echo \"$NODE $i\" >&3 || echo \"$NODE failed $i\"; done"
    );
    all_quiet(&nodes, at_once(c, &nodes, &script));
    for reader in nodes {
        let log = common::ok(c, reader, "cat /shoal/race/log");
        let mut next = std::collections::BTreeMap::new();
        for line in log.lines() {
            let (node, n) = line
                .split_once(' ')
                .unwrap_or_else(|| panic!("a torn line {line:?}"));
            let n: usize = n.parse().unwrap_or_else(|_| panic!("a torn line {line:?}"));
            let want = next.entry(node.to_string()).or_insert(1);
            assert_eq!(
                n, *want,
                "{reader} reads {node}'s line {n} where {want} was due"
            );
            *want += 1;
        }
        for node in nodes {
            assert_eq!(
                next.get(node),
                Some(&(LINES + 1)),
                "{reader}: {node}'s lines"
            );
        }
    }
}

/// Blocks of the shared file, and rounds each node writes them all in.
const BLOCKS: usize = 24;
const ROUNDS: usize = 3;

/// A block as `node` writes it in `round`: its name and the round,
/// repeated.
fn block(node: &str, round: usize) -> Vec<u8> {
    format!("{node}{round}")
        .bytes()
        .cycle()
        .take(4096)
        .collect()
}

/// Three nodes overwriting the same 4 KiB blocks of one file at once,
/// each in its own order (one ascending, one descending, one odd blocks
/// first), every block in every round: each block ends as one write left
/// it whole, the last round's of one of the nodes, as some serial order
/// of the writes would leave it.
fn overwriting_blocks_at_once_leaves_a_serial_order(c: &Cluster) {
    let nodes = ["n1", "n2", "n3"];
    common::ok(
        c,
        "n1",
        "touch /shoal/race/blocks && chmod 666 /shoal/race/blocks",
    );
    let order = |node: &str| -> Vec<usize> {
        match node {
            "n1" => (0..BLOCKS).collect(),
            "n2" => (0..BLOCKS).rev().collect(),
            _ => (1..BLOCKS)
                .step_by(2)
                .chain((0..BLOCKS).step_by(2))
                .collect(),
        }
    };
    let scripts: Vec<_> = nodes
        .iter()
        .map(|node| {
            let mut script = String::new();
            for round in 0..ROUNDS {
                for b in order(node) {
                    script.push_str(&format!(
                        "yes {node}{round} | tr -d '\\n' | head -c 4096 | \
                         dd of=/shoal/race/blocks bs=4096 seek={b} conv=notrunc status=none \
                         || echo \"$NODE failed {round} {b}\"\n"
                    ));
                }
            }
            script
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    for (node, script) in nodes.iter().zip(&scripts) {
        std::fs::write(dir.path().join(node), script).unwrap();
    }
    let outs = at_once(c, &nodes, &format!("sh {}/$NODE", dir.path().display()));
    all_quiet(&nodes, outs);
    for reader in nodes {
        let out = c
            .command(reader, "cat")
            .unwrap()
            .arg("/shoal/race/blocks")
            .output()
            .unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout.len(), BLOCKS * 4096, "{reader}: the file's size");
        for (b, got) in out.stdout.chunks(4096).enumerate() {
            assert!(
                nodes.iter().any(|n| got == block(n, ROUNDS - 1)),
                "{reader}: block {b} begins {:?}",
                String::from_utf8_lossy(&got[..16])
            );
        }
    }
}
