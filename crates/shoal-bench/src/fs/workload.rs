//! The workload section of `shoal bench fs` (issue 55): real programs on
//! each file system, measured in the same run.  On ext4 (`/var/tmp`),
//! tmpfs (`/dev/shm`), bindfs (Debian's FUSE passthrough onto ext4, the
//! fair floor of a FUSE file system that does real work, mounted on n1 by
//! the bench), sshfs and /shoal, each in its own directory on n1:
//!
//! 1. `dbench` (the NetBench mix, `/usr/share/dbench/client.txt`) with 1
//!    and with 4 clients: throughput and each operation's mean latency;
//! 2. untar of a source tree of 5,000 files (the first files, in order,
//!    of the crates in cargo's registry, each at most 256 KiB: the
//!    sources shoal itself is built from);
//! 3. a clone of shoal's own repository, then `git status` and
//!    `git log -p | wc -c` in it;
//! 4. `find` over the directory, then `rm -rf` of it.
//!
//! On /shoal also the CPU the metadata primary and n1's mount spent per
//! operation (`/proc`'s counts of their processes), and the same work on
//! two nodes at once: n1 and n2 each in a directory of its own (`dbench`
//! with 4 clients, untar), and both in one (untar into one directory,
//! `git status` in one clone, `find` over one tree); and, as the floor of
//! that, the same two at once on the disk (both "nodes" share this
//! machine's two cores and its disk).
//!
//! Beside bindfs, bindfs forwarding `fcntl` locks (`--enable-lock-forwarding`,
//! multithreaded as it then must be) runs `dbench` only: it sees every
//! lock, unlock and close, as a file system whose locks hold across nodes
//! must, so its `Close`, `LockX` and `UnlockX` are the floor of those
//! (plain bindfs leaves locks to the kernel and asks for no flush).  And
//! the disk's floor under `Flush`: one `fsync` of a new 64 KiB file on
//! ext4 alone, beside the least disk work of one `fsync` on shoal here
//! (two 64 KiB appends synced at once, the copies on two file servers
//! that share this disk, then two small ones, the group entry at two
//! replicas on it too).
//!
//! The null FUSE file system (`crate::fusenull`), mounted and answering as
//! the shoal mount does from a private directory but keeping no bytes,
//! runs `dbench` only: what the kernel, FUSE and the scheduler cost this
//! workload before any file system does any work, the ceiling of every
//! FUSE file system here (`dbenchC_null_vs_ext4`); and the same doing at
//! each `fsync` the least disk work a shoal `fsync` does on this machine
//! (`null_disk`: two appends synced at once, then two more), the ceiling
//! of a FUSE file system keeping shoal's promise of `fsync` here
//! (`dbenchC_null_disk_vs_ext4`).  A twin that cannot run a program
//! (sshfs has no `fcntl` locks for `dbench`) has the error in the metrics
//! in place of the figure.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{Map, Value, json};
use shoal_cluster::Cluster;

use crate::agent::{Agent, arg, num};
use crate::sshd::Daemon;

/// bindfs forwarding locks, which runs `dbench` only: the floor of what a
/// file system that sees every lock and close pays for them.
const LOCKS_TWIN: &str = "bindfs_locks";

/// The null FUSE file system: `dbench` only, the floor of FUSE under it.
const NULL_TWIN: &str = "null";

/// The same doing at each `fsync` the least disk work a shoal `fsync`
/// does here (`fusenull::ShoalDisk`): the floor of a FUSE file system
/// keeping shoal's promise of `fsync` on this machine.
const NULL_DISK_TWIN: &str = "null_disk";

/// The twins that run `dbench` and nothing else.
const DBENCH_ONLY: &[&str] = &[LOCKS_TWIN, NULL_TWIN, NULL_DISK_TWIN];

/// Every file system of the workload table, in its columns' order; how
/// `dbench` scales from one client to four is told for all but the last,
/// sshfs.
const COLUMNS: [&str; 8] = [
    "fs",
    "bindfs",
    LOCKS_TWIN,
    NULL_TWIN,
    NULL_DISK_TWIN,
    "ext4",
    "tmpfs",
    "sshfs",
];

/// The files of the source tree untarred.
const TREE_FILES: usize = 5_000;

/// The largest file taken into the tree.
const TREE_FILE_MAX: u64 = 256 << 10;

/// `dbench`'s operations, as it names them and as the metrics do.
const DBENCH_OPS: &[(&str, &str)] = &[
    ("NTCreateX", "create"),
    ("Close", "close"),
    ("Rename", "rename"),
    ("Unlink", "unlink"),
    ("Qpathinfo", "stat"),
    ("Qfileinfo", "fstat"),
    ("Qfsinfo", "statfs"),
    ("Sfileinfo", "setattr"),
    ("Find", "find"),
    ("WriteX", "write"),
    ("ReadX", "read"),
    ("LockX", "lock"),
    ("UnlockX", "unlock"),
    ("Flush", "flush"),
];

/// The agent's commands of this section, if `w` is one.
pub(super) fn command(w: &[&str]) -> Option<Result<Value, String>> {
    Some(match w[0] {
        "dbench" => (|| dbench(Path::new(arg(w, 1)?), num(w, 2)?, num(w, 3)?))(),
        "untar" => (|| {
            let dir = Path::new(arg(w, 2)?);
            fs::create_dir_all(dir).map_err(|e| format!("make {}: {e}", dir.display()))?;
            let mut tar = Command::new("tar");
            tar.arg("-xf").arg(arg(w, 1)?).arg("-C").arg(dir);
            if let Some(prefix) = w.get(3) {
                tar.arg(format!("--transform=s,^,{prefix},"));
            }
            timed(&mut tar)
        })(),
        "clone" => (|| {
            timed(
                Command::new("git")
                    .args(["clone", "-q"])
                    .arg(arg(w, 1)?)
                    .arg(arg(w, 2)?),
            )
        })(),
        "status" => (|| timed(Command::new("git").arg("-C").arg(arg(w, 1)?).arg("status")))(),
        "log" => (|| {
            timed(
                Command::new("sh")
                    .arg("-c")
                    .arg("git -C \"$0\" log -p | wc -c")
                    .arg(arg(w, 1)?),
            )
        })(),
        "find" => (|| timed(Command::new("find").arg(arg(w, 1)?)))(),
        "rmrf" => (|| timed(Command::new("rm").arg("-rf").arg(arg(w, 1)?)))(),
        "syncs" => (|| syncs(Path::new(arg(w, 1)?), num(w, 2)?))(),
        _ => return None,
    })
}

/// Runs `cmd` to its end, its output dropped: the seconds it took.
fn timed(cmd: &mut Command) -> Result<Value, String> {
    let t = Instant::now();
    let out = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    let s = t.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(json!({ "s": s }))
}

/// The disk's floor under a `Flush`, `rounds` times in `dir` (on the
/// disk): the median milliseconds of one `fsync` of a new 64 KiB file,
/// and of what one `fsync` on shoal waits for here at the least (two
/// 64 KiB writes synced at once, then two of 512 bytes, into logs made
/// ahead as shoal's are: [`crate::fusenull::ShoalDisk`]).
fn syncs(dir: &Path, rounds: usize) -> Result<Value, String> {
    use std::io::Write;
    if rounds == 0 {
        return Err("syncs needs at least one round".into());
    }
    fs::create_dir_all(dir).map_err(|e| format!("make {}: {e}", dir.display()))?;
    let block = vec![0x5a_u8; 64 << 10];
    // What the null file system's shoal-disk twin does at each fsync.
    let logs = crate::fusenull::ShoalDisk::open(&dir.join("logs"))
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let (mut local, mut replicated) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let path = dir.join(format!("new-{i}"));
        let t = Instant::now();
        let mut f = fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        f.write_all(&block)
            .and_then(|()| f.sync_all())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        local.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        logs.sync(block.len() as u64)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        replicated.push(t.elapsed().as_secs_f64() * 1e3);
    }
    fs::remove_dir_all(dir).map_err(|e| format!("remove {}: {e}", dir.display()))?;
    Ok(json!({
        "local_ms": crate::stats::median(&mut local),
        "replicated_ms": crate::stats::median(&mut replicated),
    }))
}

/// `dbench` with `clients` clients for `secs` seconds in `dir`: its
/// throughput, and each operation's count and mean latency.
fn dbench(dir: &Path, clients: usize, secs: usize) -> Result<Value, String> {
    fs::create_dir_all(dir).map_err(|e| format!("make {}: {e}", dir.display()))?;
    let out = Command::new("dbench")
        .args(["-c", "/usr/share/dbench/client.txt", "-D"])
        .arg(dir)
        .args(["-t", &secs.to_string(), &clients.to_string()])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("dbench: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let parsed = parse_dbench(&text);
    match parsed {
        Some(v) if out.status.success() => Ok(v),
        _ => {
            let err = String::from_utf8_lossy(&out.stderr);
            let said: Vec<&str> = text
                .lines()
                .chain(err.lines())
                .filter(|l| !l.trim().is_empty())
                .collect();
            let tail = said[said.len().saturating_sub(3)..].join(" / ");
            Err(format!("dbench in {} failed: {tail}", dir.display()))
        }
    }
}

/// The throughput (MB/s) and each operation's count and mean latency (ms)
/// from `dbench`'s report.
fn parse_dbench(text: &str) -> Option<Value> {
    let mut ops = Map::new();
    let mut count = 0u64;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if let [name, n, avg, _max] = f[..]
            && let Some((_, key)) = DBENCH_OPS.iter().find(|(op, _)| *op == name)
            && let (Ok(n), Ok(avg)) = (n.parse::<u64>(), avg.parse::<f64>())
        {
            ops.insert((*key).into(), json!({ "n": n, "ms": avg }));
            count += n;
        }
    }
    let mb_s = text.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("Throughput ")?;
        rest.split_whitespace().next()?.parse::<f64>().ok()
    })?;
    Some(json!({ "mb_s": mb_s, "ops": ops, "count": count }))
}

/// A bindfs mount on a node, of a directory on its disk.
struct Bindfs {
    unmount: Command,
    _daemon: Daemon,
}

impl Bindfs {
    fn start(
        c: &Cluster,
        node: &str,
        (from, at): (&Path, &Path),
        options: &[&str],
    ) -> Result<Bindfs, String> {
        for d in [from, at] {
            fs::create_dir_all(d).map_err(|e| format!("make {}: {e}", d.display()))?;
        }
        let daemon = Daemon::spawn(
            c.command(node, "bindfs")?
                .arg("-f")
                .args(options)
                .arg(from)
                .arg(at)
                .stdin(Stdio::null())
                .stdout(Stdio::null()),
            &format!("bindfs on {node}"),
        )?;
        let mut unmount = c.command(node, "fusermount3")?;
        unmount.args(["-u", "-z"]).arg(at);
        let until = Instant::now() + std::time::Duration::from_secs(15);
        while !c
            .command(node, "mountpoint")?
            .arg("-q")
            .arg(at)
            .status()
            .is_ok_and(|s| s.success())
        {
            if Instant::now() > until {
                return Err(format!("bindfs did not mount {} on {node}", at.display()));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(Bindfs {
            unmount,
            _daemon: daemon,
        })
    }
}

impl Drop for Bindfs {
    fn drop(&mut self) {
        let _ = self.unmount.status();
    }
}

/// The source tree (`TREE_FILES` files, a tenth with `quick`) as a tar
/// file in `work`, and a bare clone of shoal's repository there.
fn inputs(work: &Path, quick: bool) -> Result<(PathBuf, PathBuf), String> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set: cargo's registry is not found")?;
    let index = home.join("registry").join("src");
    let registry = fs::read_dir(&index)
        .map_err(|e| format!("cargo's registry sources {}: {e}", index.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .min()
        .ok_or_else(|| format!("{} holds no registry", index.display()))?;
    let want = if quick { TREE_FILES / 10 } else { TREE_FILES };
    let mut files = Vec::new();
    walk(&registry, &registry, want, &mut files)?;
    if files.len() < want {
        return Err(format!(
            "cargo's registry {} holds {} files, fewer than the {want} of the tree",
            registry.display(),
            files.len()
        ));
    }
    let list = work.join("tree.list");
    fs::write(&list, files.join("\n") + "\n").map_err(|e| format!("{}: {e}", list.display()))?;
    let tar = work.join("tree.tar");
    crate::sshd::run_ok(
        Command::new("tar")
            .arg("-cf")
            .arg(&tar)
            .arg("-C")
            .arg(&registry)
            .arg("--files-from")
            .arg(&list),
    )?;
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let repo = work.join("repo.git");
    crate::sshd::run_ok(
        Command::new("git")
            .args(["clone", "-q", "--bare", "--no-local"])
            .arg(&here)
            .arg(&repo),
    )
    .map_err(|e| {
        format!(
            "the repository to clone (shoal's own, {}): {e}",
            here.display()
        )
    })?;
    Ok((tar, repo))
}

/// The regular files under `dir` (at most `TREE_FILE_MAX` bytes each),
/// in order, as paths relative to `root`, until there are `want`.
fn walk(root: &Path, dir: &Path, want: usize, out: &mut Vec<String>) -> Result<(), String> {
    let mut entries: Vec<fs::DirEntry> = fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        if out.len() >= want {
            return Ok(());
        }
        let Ok(t) = e.file_type() else { continue };
        let p = e.path();
        if t.is_dir() {
            walk(root, &p, want, out)?;
        } else if t.is_file()
            && e.metadata().is_ok_and(|m| m.len() <= TREE_FILE_MAX)
            && let Some(rel) = p.strip_prefix(root).ok().and_then(Path::to_str)
            && !rel.contains('\n')
        {
            out.push(rel.to_string());
        }
    }
    Ok(())
}

/// CPU seconds (user and system) `pid` has used.
fn cpu_s(pid: u32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command's name, which is in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| f.get(*i)?.parse::<f64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// The processes of the metadata primary and of n1's mount.
fn shoal_processes(c: &Cluster) -> Result<(u32, u32), String> {
    let v = super::fs_status(c)?;
    let replica = v["replica"]
        .as_u64()
        .ok_or("shoal fs status names no replica")?;
    if v["primary"] != true {
        return Err("n1's metadata replica is not the primary".into());
    }
    let n1 = c.pid("n1").ok_or("n1 is not running")? as u32;
    let (mut primary, mut mount) = (None, None);
    for e in fs::read_dir("/proc")
        .map_err(|e| format!("/proc: {e}"))?
        .flatten()
    {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmd) = fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let words: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        let has = |seq: &[&str]| {
            words
                .windows(seq.len())
                .any(|w| w.iter().zip(seq).all(|(a, b)| *a == b.as_bytes()))
        };
        if has(&["fs", "serve", "--replica", &replica.to_string()]) {
            primary = Some(pid);
        } else if has(&["fs", "mount"]) && descends(pid, n1) {
            mount = Some(pid);
        }
    }
    Ok((
        primary.ok_or("the metadata primary's process is not found")?,
        mount.ok_or("n1's mount process is not found")?,
    ))
}

/// Whether `pid` descends from `ancestor`.
fn descends(mut pid: u32, ancestor: u32) -> bool {
    for _ in 0..32 {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok());
        match ppid {
            Some(p) if p == ancestor => return true,
            Some(p) if p > 1 => pid = p,
            _ => return false,
        }
    }
    false
}

/// One file system the workloads run on: its name in the metrics and
/// its directory on n1.
pub(super) struct Place {
    pub name: &'static str,
    pub dir: PathBuf,
}

/// Where the workloads run: the bench's own directory on the disk, and
/// shoal's directory of the run (the same on every node).
pub(super) struct Dirs<'a> {
    pub work: &'a Path,
    pub shared: &'a Path,
}

/// Runs the workloads on `places` (shoal first, named `fs`) and on two
/// nodes at once on shoal, into `m`.
pub(super) fn measure(
    c: &Cluster,
    (a, b): (&mut Agent, &mut Agent),
    dirs: Dirs<'_>,
    mut places: Vec<Place>,
    quick: bool,
    m: &mut Map<String, Value>,
) -> Result<(), String> {
    let Dirs { work, shared } = dirs;
    crate::peers::ensure(
        &[
            ("dbench", "dbench"),
            ("bindfs", "bindfs"),
            ("git", "git"),
            ("tar", "tar"),
        ],
        "the fs benchmark's workloads run dbench, tar and git on each file system, bindfs among them",
    )?;
    let (tar, repo) = inputs(work, quick)?;
    let bind_from = work.join("bindfs-from");
    let bind_at = work.join("bindfs");
    let _bindfs = Bindfs::start(c, "n1", (&bind_from, &bind_at), &[])?;
    places.push(Place {
        name: "bindfs",
        dir: bind_at.join("w"),
    });
    let (locks_from, locks_at) = (work.join("bindfs-locks-from"), work.join("bindfs-locks"));
    let locks = ["--multithreaded", "--enable-lock-forwarding"];
    let _bindfs_locks = Bindfs::start(c, "n1", (&locks_from, &locks_at), &locks)?;
    places.push(Place {
        name: LOCKS_TWIN,
        dir: locks_at.join("w"),
    });
    let secs = if quick { 3 } else { 20 };
    let (primary, mount) = shoal_processes(c)?;
    for p in places.iter() {
        let dir = p.dir.display().to_string();
        let on_fs = p.name == "fs";
        eprintln!("bench: workloads on {} in {dir}", p.name);
        a.call(&format!("clean {dir}"))?;
        let pids = on_fs.then_some((primary, mount));
        for clients in [1, 4] {
            let key = format!("dbench{clients}");
            let line = format!("dbench {dir}/dbench{clients} {clients} {secs}");
            if let Some(v) = phase(a, m, p.name, pids, &key, &line)? {
                m.insert(format!("{key}_mb_s_{}", p.name), v["mb_s"].clone());
                if let Some(ops) = v["ops"].as_object() {
                    for (op, o) in ops {
                        m.insert(format!("{key}_{op}_ms_{}", p.name), o["ms"].clone());
                    }
                }
                if on_fs && let Some(n) = v["count"].as_f64().filter(|n| *n > 0.0) {
                    for who in ["primary", "mount"] {
                        let k = format!("{key}_{who}_cpu_s_fs");
                        if let Some(s) = m.get(&k).and_then(Value::as_f64) {
                            m.insert(format!("{key}_{who}_cpu_us_per_op_fs"), json!(s * 1e6 / n));
                        }
                    }
                }
            }
            a.call(&format!("remove {dir}/dbench{clients}"))?;
        }
        if DBENCH_ONLY.contains(&p.name) {
            continue;
        }
        let steps = [
            ("untar", format!("untar {} {dir}/src", tar.display())),
            ("clone", format!("clone {} {dir}/repo", repo.display())),
            ("git_status", format!("status {dir}/repo")),
            ("git_log", format!("log {dir}/repo")),
            ("find", format!("find {dir}")),
            ("rmrf", format!("rmrf {dir}")),
        ];
        for (key, line) in steps {
            if let Some(v) = phase(a, m, p.name, pids, key, &line)? {
                m.insert(format!("{key}_s_{}", p.name), v["s"].clone());
            }
        }
    }
    let disk = places
        .iter()
        .find(|p| p.name == "ext4")
        .map(|p| p.dir.clone())
        .ok_or("no place on the disk")?;
    eprintln!(
        "bench: the disk's floor under a flush, in {}",
        disk.display()
    );
    let v = a.call(&format!(
        "syncs {} {}",
        disk.join("syncs").display(),
        if quick { 20 } else { 100 }
    ))?;
    for key in ["local_ms", "replicated_ms"] {
        m.insert(format!("flush_floor_{key}_ext4"), v[key].clone());
    }
    two_nodes((a, b), (shared, &disk), (&tar, &repo), secs, m)
}

/// One step of a workload on file system `name`: its answer.  On shoal
/// (`pids`: the primary's and the mount's processes) with the CPU they
/// spent on it, and a failure is the bench's; a twin's failure is kept in
/// the metrics in place of its figure.
fn phase(
    a: &mut Agent,
    m: &mut Map<String, Value>,
    name: &str,
    pids: Option<(u32, u32)>,
    key: &str,
    line: &str,
) -> Result<Option<Value>, String> {
    let before = pids.map(|(p, n)| (cpu_s(p), cpu_s(n)));
    match a.call(line) {
        Ok(v) => {
            if let (Some((p, n)), Some((bp, bn))) = (pids, before) {
                m.insert(format!("{key}_primary_cpu_s_fs"), json!(cpu_s(p) - bp));
                m.insert(format!("{key}_mount_cpu_s_fs"), json!(cpu_s(n) - bn));
            }
            Ok(Some(v))
        }
        Err(e) if pids.is_none() => {
            eprintln!("bench: {key} on {name}: {e}");
            m.insert(format!("{key}_error_{name}"), json!(e));
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The same work on n1 and n2 at once: in /shoal each in a directory of
/// its own, and then both in one; each in its own on the disk too, the
/// floor (both "nodes" share this machine's cores and disk).
fn two_nodes(
    (a, b): (&mut Agent, &mut Agent),
    (shared, disk): (&Path, &Path),
    (tar, repo): (&Path, &Path),
    secs: usize,
    m: &mut Map<String, Value>,
) -> Result<(), String> {
    let both =
        |a: &mut Agent, b: &mut Agent, la: &str, lb: &str| -> Result<(Value, Value), String> {
            a.write(la)?;
            b.write(lb)?;
            let va = a.answer();
            let vb = b.answer();
            Ok((va?, vb?))
        };
    let s = |v: &Value| v["s"].as_f64().unwrap_or(f64::NAN);
    let mb_s = |v: &Value| v["mb_s"].as_f64().unwrap_or(0.0);
    for (name, dir) in [("fs", shared), ("ext4", disk)] {
        let d = dir.join("two");
        let d = d.display();
        eprintln!(
            "bench: workloads on {name} from n1 and n2 at once in {d}, each in its own directory"
        );
        a.call(&format!("clean {d}"))?;
        let (x, y) = both(
            a,
            b,
            &format!("dbench {d}/n1 4 {secs}"),
            &format!("dbench {d}/n2 4 {secs}"),
        )?;
        m.insert(
            format!("dbench4_two_mb_s_{name}"),
            json!(mb_s(&x).min(mb_s(&y))),
        );
        let (x, y) = both(
            a,
            b,
            &format!("untar {} {d}/n1/src", tar.display()),
            &format!("untar {} {d}/n2/src", tar.display()),
        )?;
        m.insert(format!("untar_two_s_{name}"), json!(s(&x).max(s(&y))));
        if name != "fs" {
            a.call(&format!("remove {}", dir.display()))?;
            continue;
        }
        eprintln!("bench: workloads on shoal from n1 and n2 at once in {d}/one");
        let (x, y) = both(
            a,
            b,
            &format!("untar {} {d}/one a-", tar.display()),
            &format!("untar {} {d}/one b-", tar.display()),
        )?;
        m.insert("untar_one_dir_s_fs".into(), json!(s(&x).max(s(&y))));
        a.call(&format!("clone {} {d}/repo", repo.display()))?;
        let (x, y) = both(
            a,
            b,
            &format!("status {d}/repo"),
            &format!("status {d}/repo"),
        )?;
        m.insert("git_status_one_dir_s_fs".into(), json!(s(&x).max(s(&y))));
        let (x, y) = both(a, b, &format!("find {d}/one"), &format!("find {d}/one"))?;
        m.insert("find_one_dir_s_fs".into(), json!(s(&x).max(s(&y))));
        a.call(&format!("remove {}", dir.display()))?;
    }
    Ok(())
}

/// The ratios the targets are stated in.
pub(super) fn ratios(m: &mut Map<String, Value>) {
    let get = |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_f64);
    let put = |m: &mut Map<String, Value>, k: String, a: Option<f64>, b: Option<f64>| {
        if let (Some(a), Some(b)) = (a, b)
            && b > 0.0
        {
            m.insert(k, json!(a / b));
        }
    };
    for twin in ["bindfs", "ext4"] {
        for clients in [1, 4] {
            let k = format!("dbench{clients}_mb_s");
            let (a, b) = (get(m, &format!("{k}_fs")), get(m, &format!("{k}_{twin}")));
            put(m, format!("dbench{clients}_fs_vs_{twin}"), a, b);
        }
        for key in ["untar", "git_status", "git_log", "find", "rmrf"] {
            let (a, b) = (
                get(m, &format!("{key}_s_fs")),
                get(m, &format!("{key}_s_{twin}")),
            );
            put(m, format!("{key}_fs_vs_{twin}"), a, b);
        }
    }
    for clients in [1, 4] {
        let k = format!("dbench{clients}_mb_s");
        for twin in [NULL_TWIN, NULL_DISK_TWIN] {
            let null = get(m, &format!("{k}_{twin}"));
            let fs = get(m, &format!("{k}_fs"));
            put(m, format!("dbench{clients}_fs_vs_{twin}"), fs, null);
            let ext4 = get(m, &format!("{k}_ext4"));
            put(m, format!("dbench{clients}_{twin}_vs_ext4"), null, ext4);
        }
    }
    // How each scales from one client to four on this machine's cores.
    for name in &COLUMNS[..COLUMNS.len() - 1] {
        let four = get(m, &format!("dbench4_mb_s_{name}"));
        let one = get(m, &format!("dbench1_mb_s_{name}"));
        put(m, format!("dbench4_vs_dbench1_{name}"), four, one);
    }
    for name in ["fs", "ext4"] {
        let (two, alone) = (
            get(m, &format!("dbench4_two_mb_s_{name}")),
            get(m, &format!("dbench4_mb_s_{name}")),
        );
        put(m, format!("dbench4_two_vs_one_{name}"), two, alone);
        let (alone, two) = (
            get(m, &format!("untar_s_{name}")),
            get(m, &format!("untar_two_s_{name}")),
        );
        put(m, format!("untar_two_vs_one_{name}"), alone, two);
    }
    for (_, op) in DBENCH_OPS {
        for twin in ["bindfs", LOCKS_TWIN, NULL_TWIN, NULL_DISK_TWIN] {
            let (a, b) = (
                get(m, &format!("dbench4_{op}_ms_fs")),
                get(m, &format!("dbench4_{op}_ms_{twin}")),
            );
            put(m, format!("dbench4_{op}_fs_vs_{twin}"), a, b);
        }
    }
    let (a, b) = (
        get(m, "flush_floor_replicated_ms_ext4"),
        get(m, "flush_floor_local_ms_ext4"),
    );
    put(m, "flush_floor_replicated_vs_local".into(), a, b);
    let (a, b) = (
        get(m, "dbench4_flush_ms_fs"),
        get(m, "dbench4_flush_ms_ext4"),
    );
    put(m, "dbench4_flush_fs_vs_ext4".into(), a, b);
}

/// The workloads beside their targets.
pub(super) fn table(m: &Map<String, Value>) -> String {
    let f = |k: &str| {
        m.get(k)
            .and_then(Value::as_f64)
            .map_or("-".into(), |v| format!("{v:.3}"))
    };
    let mut t = String::from(
        "\n| workload | shoal fs | bindfs | bindfs, locks forwarded | null FUSE | null FUSE, shoal's disk work | ext4 | tmpfs | sshfs | target |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut row = |what: &str, key: &str, target: &str| {
        let cells: Vec<String> = COLUMNS.iter().map(|n| f(&format!("{key}_{n}"))).collect();
        t += &format!("| {what} | {} | {target} |\n", cells.join(" | "));
    };
    row("dbench, 1 client (MB/s)", "dbench1_mb_s", "≥ 1.0 × bindfs");
    row(
        "dbench, 4 clients (MB/s)",
        "dbench4_mb_s",
        "≥ 1.0 × bindfs, ≥ 0.25 × ext4, ≥ 1.5 × 1 client",
    );
    row("dbench, 4 clients over 1", "dbench4_vs_dbench1", "≥ 1.5");
    for (op, key) in DBENCH_OPS {
        let target = match *key {
            "flush" => "≤ 1.5 × bindfs, ≤ 2 × ext4",
            "close" | "lock" | "unlock" => {
                "≤ 1.5 × bindfs (its floor: bindfs with locks forwarded)"
            }
            _ => "≤ 1.5 × bindfs",
        };
        row(
            &format!("dbench, 4 clients: {op} (ms)"),
            &format!("dbench4_{key}_ms"),
            target,
        );
    }
    for (what, key) in [
        ("untar, 5,000 files (s)", "untar_s"),
        ("git clone (s)", "clone_s"),
        ("git status (s)", "git_status_s"),
        ("git log -p \\| wc (s)", "git_log_s"),
        ("find (s)", "find_s"),
        ("rm -rf (s)", "rmrf_s"),
    ] {
        let target = if key == "clone_s" || key == "git_log_s" {
            ""
        } else {
            "≤ 1.5 × bindfs, ≤ 4 × ext4"
        };
        row(what, key, target);
    }
    t += &format!(
        "| the disk's floor under a flush: one `fsync` of a new 64 KiB file · a replicated one's least disk work (ms) | | | | | | {} · {} | | | |\n",
        f("flush_floor_local_ms_ext4"),
        f("flush_floor_replicated_ms_ext4"),
    );
    t += &format!(
        "| two nodes, each its own directory: dbench 4 clients (MB/s, the slower) · untar (s) | {} · {} | | | | | {} · {} | | | each ≥ 0.8 × one node alone |\n",
        f("dbench4_two_mb_s_fs"),
        f("untar_two_s_fs"),
        f("dbench4_two_mb_s_ext4"),
        f("untar_two_s_ext4"),
    );
    t += &format!(
        "| two nodes, each its own directory, over one node alone: dbench · untar | {} · {} | | | | | {} · {} | | | ≥ 0.8 |\n",
        f("dbench4_two_vs_one_fs"),
        f("untar_two_vs_one_fs"),
        f("dbench4_two_vs_one_ext4"),
        f("untar_two_vs_one_ext4"),
    );
    t += &format!(
        "| two nodes in one directory: untar · git status · find (s) | {} · {} · {} | | | | | | | | |\n",
        f("untar_one_dir_s_fs"),
        f("git_status_one_dir_s_fs"),
        f("find_one_dir_s_fs"),
    );
    t += &format!(
        "| primary's · mount's CPU per dbench operation, 4 clients (µs) | {} · {} | | | | | | | | |\n",
        f("dbench4_primary_cpu_us_per_op_fs"),
        f("dbench4_mount_cpu_us_per_op_fs"),
    );
    t += &format!(
        "| primary's · mount's CPU for the untar (s) | {} · {} | | | | | | | | |\n",
        f("untar_primary_cpu_s_fs"),
        f("untar_mount_cpu_s_fs"),
    );
    t
}
