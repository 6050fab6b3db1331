//! A sparse file of 1 TiB on the cluster (`docs/fs.md`, "Sparse files"):
//! written at three offsets, read from other nodes, copied with
//! `cp --sparse=always`, its holes found with `SEEK_DATA`/`SEEK_HOLE`,
//! while the mounts, the metadata replicas and the file servers hold
//! what it holds, not what its size says.

use shoal_cluster::Cluster;

use super::common;

const TIB: u64 = 1 << 40;
/// Where the middle write goes (300 GiB), and the last (4 bytes before
/// the end).
const MID: u64 = 300 << 30;
const END: u64 = TIB - 4;

/// More than any of the mounts or replicas ever holds here; a tenth of a
/// thousandth of the file's size.
const MEMORY_BOUND_KIB: u64 = 256 << 10;
/// More than the file servers store for the file and its copy.
const STORED_BOUND: u64 = 64 << 20;

/// `lseek(path, offset, SEEK_DATA or SEEK_HOLE)` on `node`, by perl (an
/// essential Debian package): the offset, or `None` for `ENXIO`.
fn seek(c: &Cluster, node: &str, path: &str, offset: u64, hole: bool) -> Option<u64> {
    let whence = if hole {
        libc::SEEK_HOLE
    } else {
        libc::SEEK_DATA
    };
    let out = common::ok(
        c,
        node,
        &format!(
            "perl -e 'open(F, \"<\", $ARGV[0]) or die \"$!\"; \
             my $p = sysseek(F, $ARGV[1], $ARGV[2]); \
             print defined $p ? $p + 0 : ($!{{ENXIO}} ? \"ENXIO\" : die \"$!\")' \
             {path} {offset} {whence}"
        ),
    );
    match out.trim() {
        "ENXIO" => None,
        n => Some(n.parse().unwrap_or_else(|_| panic!("lseek: {out}"))),
    }
}

/// The bytes the file servers store (`shoal file servers`), summed.
fn stored(c: &Cluster) -> u64 {
    common::ok(c, "n1", "$SHOAL file servers")
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("bytes_stored="))
        .map(|n| n.parse::<u64>().unwrap())
        .sum()
}

/// The peak resident memory (KiB) of service `name` on `node`.
fn peak_kib(c: &Cluster, node: &str, name: &str) -> u64 {
    let (pid, _) = common::service(c, node, name);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM for {name} on {node}"))
}

/// Where data and holes are in `path` (seen from `node`): the three
/// writes, each rounded out to the kernel's pages at most, and holes
/// between.
fn check_map(c: &Cluster, node: &str, path: &str) {
    let page = 4096;
    assert_eq!(seek(c, node, path, 0, false), Some(0), "{path}: data at 0");
    let hole = seek(c, node, path, 0, true).unwrap();
    assert!(
        (4..=1 << 20).contains(&hole),
        "{path}: a hole after the head at {hole}"
    );
    let data = seek(c, node, path, hole, false).unwrap();
    assert!(
        (MID - page..=MID).contains(&data),
        "{path}: the middle's data at {data}"
    );
    let hole = seek(c, node, path, MID, true).unwrap();
    assert!(
        (MID + 6..=MID + (1 << 20)).contains(&hole),
        "{path}: the middle ends at {hole}"
    );
    let data = seek(c, node, path, hole, false).unwrap();
    assert!(
        (END - page..=END).contains(&data),
        "{path}: the tail's data at {data}"
    );
    assert_eq!(
        seek(c, node, path, END, true),
        Some(TIB),
        "{path}: the end is a hole"
    );
    assert_eq!(
        seek(c, node, path, TIB, false),
        None,
        "{path}: ENXIO at the end"
    );
}

/// The three writes' bytes, read on `node`.
fn check_bytes(c: &Cluster, node: &str, path: &str) {
    let read = |offset: u64, n: u64| {
        common::ok(
            c,
            node,
            &format!(
                "dd if={path} bs={n} count=1 iflag=skip_bytes skip={offset} status=none | od -An -c | tr -d ' \\n'"
            ),
        )
    };
    assert_eq!(read(0, 6), "head\\0\\0");
    assert_eq!(read(MID - 2, 10), "\\0\\0middle\\0\\0");
    assert_eq!(read(END - 2, 6), "\\0\\0tail");
    assert_eq!(
        read(MID + (77 << 30), 8),
        "\\0".repeat(8),
        "a hole reads as zeros"
    );
    let size = common::ok(c, node, &format!("stat -c %s {path}"));
    assert_eq!(size.trim(), TIB.to_string());
}

pub fn a_terabyte_sparse_file_costs_what_it_holds(c: &Cluster) {
    let before = stored(c);
    common::ok(
        c,
        "n1",
        &format!(
            "mkdir /shoal/sparse && cd /shoal/sparse && truncate -s 1T big && \
             printf head | dd of=big conv=notrunc status=none && \
             printf middle | dd of=big bs=1M oflag=seek_bytes seek={MID} conv=notrunc status=none && \
             printf tail | dd of=big bs=1M oflag=seek_bytes seek={END} conv=notrunc,fsync status=none"
        ),
    );
    let big = "/shoal/sparse/big";
    // Read where it was not written, then elsewhere.
    check_bytes(c, "n2", big);
    check_map(c, "n2", big);
    // Its blocks are what it holds: so cp finds its data by SEEK_DATA.
    let blocks: u64 = common::ok(c, "n2", &format!("stat -c %b {big}"))
        .trim()
        .parse()
        .unwrap();
    assert!(blocks * 512 < 1 << 20, "a sparse file of {blocks} blocks");
    common::ok(
        c,
        "n3",
        "cd /shoal/sparse && cp --sparse=always big copy && sync copy",
    );
    check_bytes(c, "n1", "/shoal/sparse/copy");
    check_map(c, "n1", "/shoal/sparse/copy");
    // Grown by fallocate: a hole again, the data kept.
    common::ok(c, "n2", &format!("fallocate -l {} {big}", 2 * TIB));
    let size = common::ok(c, "n1", &format!("stat -c %s {big}"));
    assert_eq!(size.trim(), (2 * TIB).to_string());
    assert_eq!(
        seek(c, "n1", big, END, true),
        Some(TIB),
        "the growth is a hole"
    );
    let grown = stored(c) - before;
    assert!(
        grown < STORED_BOUND,
        "the file servers store {grown} bytes for it"
    );
    eprintln!("[sparse] the file servers store {grown} bytes for two files of 1 and 2 TiB");
    for node in ["n1", "n2", "n3"] {
        for name in ["fs-mount", "file"] {
            let kib = peak_kib(c, node, name);
            eprintln!("[sparse] {name} on {node} peaked at {kib} KiB");
            assert!(
                kib < MEMORY_BOUND_KIB,
                "{name} on {node} peaked at {kib} KiB"
            );
        }
    }
    for (node, name) in [("n1", "fs-r0"), ("n2", "fs-r1"), ("n3", "fs-r2")] {
        let kib = peak_kib(c, node, name);
        eprintln!("[sparse] {name} on {node} peaked at {kib} KiB");
        assert!(
            kib < MEMORY_BOUND_KIB,
            "{name} on {node} peaked at {kib} KiB"
        );
    }
}
