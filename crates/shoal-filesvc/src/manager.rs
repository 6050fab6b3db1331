//! The object manager: replication and garbage collection through the
//! directory graph (Amoeba's way).
//!
//! File servers register their capability under `fileservers/NAME` of the
//! root directory.  A file is named in a directory by the *set* of its
//! replicas' capabilities, each on a different server.  One pass of the
//! manager:
//!
//! 1. walks every directory reachable from the root (a capability of the
//!    root's directory service names a directory; one of a registered file
//!    server names a file replica) and touches every replica it finds, one
//!    batch per server, which resets its time-to-live;
//! 2. for every file with fewer than k replicas alive (missing on its
//!    server, the server unreachable, or, with `verify`, a replica whose
//!    extents fail their checksums when its server reads them from disk), copies it from a live replica to servers that
//!    hold none and swaps the entry's capability set for the new one
//!    (compare-and-swap, so a concurrent change wins and the copy ages
//!    away);
//! 3. has every file system registered under `filesystems/NAME` touch the
//!    contents its tree holds (no directory names them);
//! 4. with `age`, and only if every directory was listed and every file
//!    system's tree touched, asks every server it touched to run an ageing
//!    pass, which destroys what no pass touched for the time-to-live:
//!    files that nothing names disappear.
//!
//! Servers age only when a pass asks, at most once per their gap: a file
//! something names is never destroyed while passes cannot touch it.

use std::collections::{BTreeMap, HashSet, VecDeque};

use shoal_bullet::op::AdminOp;
use shoal_bullet::{Answer, FileError};
use shoal_cap::{Capability, PutPort, Rights};
use shoal_dir::DirError;
use shoal_dirsvc::DirClient;

use crate::client::{ClientError, FileClient};

/// The root's directory of file servers.
pub const SERVERS_DIR: &str = "fileservers";

/// The root's directory of file systems, whose trees name contents no
/// directory does.
pub const TREES_DIR: &str = "filesystems";

/// Default number of replicas of a file.
pub const DEFAULT_REPLICAS: usize = 2;

fn dir_err(e: shoal_dirsvc::ClientError) -> String {
    e.to_string()
}

/// What each column of `fileservers` gets of a server's capability: its
/// owner (the administrator) everything; the other columns, which users'
/// roots reach it through (`shoal init --user`), reading its figures and
/// creating files, but none of its administration.
fn server_masks(columns: usize) -> Vec<Rights> {
    (0..columns)
        .map(|i| {
            if i == 0 {
                Rights::ALL
            } else {
                shoal_bullet::model::READ | shoal_bullet::model::CREATE
            }
        })
        .collect()
}

/// Names the file server `name` under the root's `fileservers` directory
/// (creating it if need be); a restarted server with the same store keeps
/// its entry.
pub fn register(
    dir: &mut DirClient,
    root: &Capability,
    name: &str,
    server: &Capability,
) -> Result<(), String> {
    let servers = servers_dir(dir, root, true)?;
    let masks = server_masks(dir.list(&servers).map_err(dir_err)?.columns.len());
    match dir.lookup(&servers, name) {
        Ok(caps) => {
            if caps != [*server] {
                dir.replace(&servers, name, &caps, &[*server])
                    .map_err(dir_err)?;
            }
            if dir.get_masks(&servers, name).map_err(dir_err)? != masks {
                dir.chmod(&servers, name, &masks).map_err(dir_err)?;
            }
            Ok(())
        }
        Err(shoal_dirsvc::ClientError::Dir(DirError::NotFound(_))) => {
            match dir.append(&servers, name, &[*server], Some(&masks)) {
                Ok(()) | Err(shoal_dirsvc::ClientError::Dir(DirError::Exists(_))) => Ok(()),
                Err(e) => Err(dir_err(e)),
            }
        }
        Err(e) => Err(dir_err(e)),
    }
}

/// The `fileservers` directory of `root` as a user reached through it
/// sees it: only its `other` column (the last one), so its servers'
/// capabilities come restricted to reading figures and creating files.
/// `None` if no server has registered yet.
pub fn servers_for_users(dir: &mut DirClient, root: &Capability) -> Result<Capability, String> {
    let servers = servers_dir(dir, root, false)?;
    let columns = dir.list(&servers).map_err(dir_err)?.columns.len();
    let last = shoal_dir::model::column(columns.saturating_sub(1));
    servers
        .restrict(last)
        .map_err(|e| format!("cannot restrict the file servers' directory: {e}"))
}

fn servers_dir(dir: &mut DirClient, root: &Capability, create: bool) -> Result<Capability, String> {
    named_dir(dir, root, SERVERS_DIR, create)?.ok_or_else(|| {
        format!(
            "no file servers are registered (no {SERVERS_DIR:?} directory in the root); start one with `shoal file serve`"
        )
    })
}

/// Registers file system `name`, whose metadata service answers on
/// `port`, under `filesystems` (the administrator's alone): from then on
/// every manager pass has its tree touched before it ages anything.
pub fn register_tree(
    dir: &mut DirClient,
    root: &Capability,
    name: &str,
    port: PutPort,
) -> Result<(), String> {
    let trees = named_dir(dir, root, TREES_DIR, true)?.expect("made if missing");
    // The entry only names the service: a capability of no rights.
    let cap = Capability::mint(
        port,
        shoal_cap::ObjectId::new(0),
        Rights::NONE,
        &shoal_cap::ObjectSecret::from_bytes([0; 32]),
    );
    let columns = dir.list(&trees).map_err(dir_err)?.columns.len();
    let masks: Vec<Rights> = (0..columns)
        .map(|i| if i == 0 { Rights::ALL } else { Rights::NONE })
        .collect();
    match dir.lookup(&trees, name) {
        Ok(caps) if caps == [cap] => Ok(()),
        Ok(caps) => dir.replace(&trees, name, &caps, &[cap]).map_err(dir_err),
        Err(shoal_dirsvc::ClientError::Dir(DirError::NotFound(_))) => {
            match dir.append(&trees, name, &[cap], Some(&masks)) {
                Ok(()) | Err(shoal_dirsvc::ClientError::Dir(DirError::Exists(_))) => Ok(()),
                Err(e) => Err(dir_err(e)),
            }
        }
        Err(e) => Err(dir_err(e)),
    }
}

/// The registered file systems' names.
pub fn trees(dir: &mut DirClient, root: &Capability) -> Result<Vec<String>, String> {
    let Some(trees) = named_dir(dir, root, TREES_DIR, false)? else {
        return Ok(Vec::new());
    };
    Ok(dir
        .list(&trees)
        .map_err(dir_err)?
        .rows
        .into_iter()
        .map(|r| r.0)
        .collect())
}

/// The root's directory `name` (made if `create` and missing).
fn named_dir(
    dir: &mut DirClient,
    root: &Capability,
    name: &str,
    create: bool,
) -> Result<Option<Capability>, String> {
    let found = |dir: &mut DirClient| -> Result<Option<Capability>, String> {
        match dir.lookup(root, name) {
            Ok(caps) => Ok(caps.into_iter().find(|c| c.port() == root.port())),
            Err(shoal_dirsvc::ClientError::Dir(DirError::NotFound(_))) => Ok(None),
            Err(e) => Err(dir_err(e)),
        }
    };
    if let Some(c) = found(dir)? {
        return Ok(Some(c));
    }
    if !create {
        return Ok(None);
    }
    let new = dir
        .create_dir(&["owner", "group", "other"])
        .map_err(dir_err)?;
    let masks = shoal_dir::model::directory_masks(dir.list(root).map_err(dir_err)?.columns.len());
    match dir.append(root, name, &[new], Some(&masks)) {
        Ok(()) => Ok(Some(new)),
        Err(shoal_dirsvc::ClientError::Dir(DirError::Exists(_))) => {
            // Another server made it first.
            let _ = dir.delete_dir(&new);
            Ok(Some(
                found(dir)?.ok_or_else(|| format!("{name} is not a directory"))?,
            ))
        }
        Err(e) => Err(dir_err(e)),
    }
}

/// The registered file servers, by name.
pub fn servers(
    dir: &mut DirClient,
    root: &Capability,
) -> Result<Vec<(String, Capability)>, String> {
    let sd = servers_dir(dir, root, false)?;
    let names: Vec<String> = dir
        .list(&sd)
        .map_err(dir_err)?
        .rows
        .into_iter()
        .map(|r| r.0)
        .collect();
    let mut out = Vec::new();
    for part in names.chunks(shoal_dir::model::MAX_BATCH) {
        let refs: Vec<&str> = part.iter().map(String::as_str).collect();
        for (name, r) in part
            .iter()
            .zip(dir.lookup_many(&sd, &refs).map_err(dir_err)?)
        {
            if let Ok(caps) = r
                && let Some(c) = caps.first()
            {
                out.push((name.clone(), *c));
            }
        }
    }
    Ok(out)
}

/// Picks `k` servers for a new file: those that answer, the emptiest
/// first (ties broken at random, so a burst of files spreads).
pub fn choose_servers(
    files: &mut FileClient,
    servers: &[(String, Capability)],
    k: usize,
) -> Result<Vec<(String, Capability)>, String> {
    let mut live: Vec<(u64, u32, (String, Capability))> = Vec::new();
    for s in servers {
        if let Ok(Answer::Report { figures, .. }) = files.admin(&s.1, AdminOp::Stats) {
            let stored = figures
                .iter()
                .find(|f| f.0 == "bytes_stored")
                .map_or(0, |f| f.1);
            live.push((stored >> 26, rand::random(), s.clone()));
        }
    }
    if live.len() < k {
        return Err(format!(
            "{k} replicas wanted but only {} of {} registered file servers answer",
            live.len(),
            servers.len()
        ));
    }
    live.sort_by_key(|l| (l.0, l.1));
    Ok(live.into_iter().take(k).map(|l| l.2).collect())
}

/// What a pass found and did.
#[derive(Debug, Default, Clone)]
pub struct PassReport {
    pub directories: u64,
    pub files: u64,
    pub replicas_touched: u64,
    pub replicas_missing: u64,
    pub replicas_recreated: u64,
    pub replicas_corrupt: u64,
    pub servers_unreachable: Vec<String>,
    /// Each registered file system's tree: contents touched and missing.
    pub trees: Vec<(String, u64, u64)>,
    /// Servers that ran an ageing pass (others ran one too lately, or the
    /// pass did not age: see `problems`).
    pub servers_aged: u64,
    pub destroyed_by_age: u64,
    /// Files that could not be brought back to k replicas, and why.
    pub problems: Vec<String>,
}

/// Options of a pass.
#[derive(Debug, Clone)]
pub struct PassOptions {
    /// Replicas each file should have.
    pub k: usize,
    /// Read every replica in full (the servers verify checksums).
    pub verify: bool,
    /// Ask every server for an ageing pass afterwards.
    pub age: bool,
}

/// Has file system `name` touch the contents its tree holds: how many
/// its file servers had and had not.
pub type TouchTree<'a> = dyn FnMut(&str) -> Result<(u64, u64), String> + 'a;

struct Row {
    dir: Capability,
    name: String,
    caps: Vec<Capability>,
}

/// One pass of the object manager from `root`.
pub fn pass(
    dir: &mut DirClient,
    files: &mut FileClient,
    root: &Capability,
    opts: &PassOptions,
    touch_tree: &mut TouchTree,
) -> Result<PassReport, String> {
    let mut report = PassReport::default();
    // Whether everything named was touched: only then may servers age.
    let mut complete = true;
    let servers = servers(dir, root)?;
    let by_port: BTreeMap<PutPort, (String, Capability)> = servers
        .iter()
        .map(|(n, c)| (c.port(), (n.clone(), *c)))
        .collect();
    // 1. Walk the graph, collecting the rows that name files.
    let mut rows: Vec<Row> = Vec::new();
    let mut seen: HashSet<u64> = HashSet::new();
    let mut queue = VecDeque::from([*root]);
    seen.insert(root.object().get());
    while let Some(d) = queue.pop_front() {
        report.directories += 1;
        let names: Vec<String> = match dir.list(&d) {
            Ok(l) => l.rows.into_iter().map(|r| r.0).collect(),
            Err(e) => {
                report
                    .problems
                    .push(format!("a directory could not be listed: {e}"));
                complete = false;
                continue;
            }
        };
        for part in names.chunks(shoal_dir::model::MAX_BATCH) {
            let refs: Vec<&str> = part.iter().map(String::as_str).collect();
            let found = dir.lookup_many(&d, &refs).map_err(dir_err)?;
            for (name, r) in part.iter().zip(found) {
                let Ok(caps) = r else { continue };
                for c in &caps {
                    if c.port() == root.port() && seen.insert(c.object().get()) {
                        queue.push_back(*c);
                    }
                }
                let file_caps: Vec<Capability> = caps
                    .iter()
                    .filter(|c| by_port.contains_key(&c.port()) && c.object().get() != 0)
                    .copied()
                    .collect();
                if !file_caps.is_empty() && file_caps.len() == caps.len() {
                    rows.push(Row {
                        dir: d,
                        name: name.clone(),
                        caps: file_caps,
                    });
                }
            }
        }
    }
    report.files = rows.len() as u64;
    // 2. Touch, one batch per server.
    let mut alive: BTreeMap<(PutPort, u64), bool> = BTreeMap::new();
    let mut per_server: BTreeMap<PutPort, Vec<Capability>> = BTreeMap::new();
    for r in &rows {
        for c in &r.caps {
            per_server.entry(c.port()).or_default().push(*c);
        }
    }
    for (port, caps) in &per_server {
        match files.touch(caps) {
            Ok(flags) => {
                for (c, ok) in caps.iter().zip(flags) {
                    alive.insert((*port, c.object().get()), ok);
                    if ok {
                        report.replicas_touched += 1;
                    } else {
                        report.replicas_missing += 1;
                    }
                }
            }
            Err(_) => report.servers_unreachable.push(by_port[port].0.clone()),
        }
    }
    // Servers that answer, for new replicas.
    let reachable: Vec<(String, Capability)> = servers
        .iter()
        .filter(|(n, _)| !report.servers_unreachable.contains(n))
        .cloned()
        .collect();
    // 3. Repair.
    for r in rows {
        let mut live: Vec<Capability> = r
            .caps
            .iter()
            .filter(|c| alive.get(&(c.port(), c.object().get())) == Some(&true))
            .copied()
            .collect();
        if opts.verify {
            let mut good = Vec::new();
            for c in live {
                match files.call(&c, &shoal_bullet::Op::Verify { file: c }) {
                    Ok(_) => good.push(c),
                    Err(ClientError::File(FileError::Corrupt(_))) => {
                        report.replicas_corrupt += 1;
                        let _ = files.destroy(&c);
                    }
                    Err(_) => good.push(c),
                }
            }
            live = good;
        }
        if live.len() >= opts.k && live.len() == r.caps.len() {
            continue;
        }
        if live.is_empty() {
            report
                .problems
                .push(format!("{}: no replica is reachable or intact", r.name));
            continue;
        }
        let used: HashSet<PutPort> = r.caps.iter().map(|c| c.port()).collect();
        let want = opts.k.saturating_sub(live.len());
        let targets: Vec<&(String, Capability)> = reachable
            .iter()
            .filter(|(_, c)| !used.contains(&c.port()))
            .take(want)
            .collect();
        let mut new_set = live.clone();
        if want > 0 {
            if targets.len() < want {
                report.problems.push(format!(
                    "{}: {} replicas alive, {} wanted, and only {} other servers answer",
                    r.name,
                    live.len(),
                    opts.k,
                    targets.len()
                ));
            }
            if !targets.is_empty() {
                // Streamed from the live replicas (with failover), chunk by
                // chunk: a copy of any size in bounded memory; a file with
                // holes copied by its data ranges, so its holes stay holes.
                let to: Vec<Capability> = targets.iter().map(|t| t.1).collect();
                let copied = match files.stat(&live) {
                    Ok((st, _)) => match files.has_holes(&live, st.size) {
                        Ok(true) => sparse_copies(files, &live, st.size, &to),
                        Ok(false) => files
                            .reader(&live)
                            .and_then(|source| files.create_from(&to, source, true, |_| {})),
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                };
                match copied {
                    Ok(caps) => {
                        report.replicas_recreated += caps.len() as u64;
                        new_set.extend(caps);
                    }
                    Err(e) => {
                        report
                            .problems
                            .push(format!("{}: copy failed: {e}", r.name));
                        continue;
                    }
                }
            }
        }
        if new_set != r.caps
            && let Err(e) = dir.replace(&r.dir, &r.name, &r.caps, &new_set)
        {
            report.problems.push(format!(
                "{}: entry changed meanwhile ({e}); will retry next pass",
                r.name
            ));
        }
    }
    // 4. The trees' contents.
    for name in trees(dir, root)? {
        match touch_tree(&name) {
            Ok((touched, missing)) => report.trees.push((name, touched, missing)),
            Err(e) => {
                report.problems.push(format!(
                    "file system {name}: its tree's contents could not be touched ({e})"
                ));
                complete = false;
            }
        }
    }
    // 5. Age, if nothing named went untouched.
    if opts.age && !complete {
        report
            .problems
            .push("no ageing this pass: not everything named was touched".into());
    } else if opts.age {
        for (name, cap) in &reachable {
            match files.admin(cap, AdminOp::Age) {
                Ok(Answer::Report { figures, .. }) => {
                    let figure = |n: &str| figures.iter().find(|f| f.0 == n).map_or(0, |f| f.1);
                    report.servers_aged += figure("aged");
                    report.destroyed_by_age += figure("destroyed");
                }
                _ => report.servers_unreachable.push(name.clone()),
            }
        }
    }
    Ok(report)
}

/// Committed copies, holes kept, of a file of `size` bytes on each of
/// `servers` (none left behind on failure).
fn sparse_copies(
    files: &mut FileClient,
    replicas: &[Capability],
    size: u64,
    servers: &[Capability],
) -> Result<Vec<Capability>, ClientError> {
    let mut made = Vec::new();
    for server in servers {
        let copy = files
            .copy_uncommitted(replicas, size, server)
            .and_then(|c| files.commit(&c, true).map(|()| c));
        match copy {
            Ok(c) => made.push(c),
            Err(e) => {
                for c in &made {
                    let _ = files.destroy(c);
                }
                return Err(e);
            }
        }
    }
    Ok(made)
}
