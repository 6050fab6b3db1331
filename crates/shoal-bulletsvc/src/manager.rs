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

use shoal_bullet::manage::{Ask, Heard, Listing, Pass};
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

pub use shoal_bullet::manage::{PassOptions, PassReport};

/// Has file system `name` touch the contents its tree holds: how many
/// its file servers had and had not.
pub type TouchTree<'a> = dyn FnMut(&str) -> Result<(u64, u64), String> + 'a;

/// One pass of the object manager from `root`: the pass's core
/// (`shoal_bullet::manage::Pass`) driven against the directory service,
/// the file servers and the file systems.
pub fn pass(
    dir: &mut DirClient,
    files: &mut FileClient,
    root: &Capability,
    opts: &PassOptions,
    touch_tree: &mut TouchTree,
) -> Result<PassReport, String> {
    let mut pass = Pass::new(*root, servers(dir, root)?, opts.clone());
    loop {
        let heard = match pass.ask() {
            Ask::Done(report) => return Ok(report),
            Ask::List { dir: d } => Heard::Listed(list(dir, &d)),
            Ask::Touch { files: caps } => Heard::Touched(files.touch(&caps).map_err(line)),
            Ask::Verify { file } => Heard::Verified(
                match files.call(&file, &shoal_bullet::Op::Verify { file }) {
                    Err(ClientError::File(FileError::Corrupt(_))) => Ok(false),
                    Err(e) => Err(e.to_string()),
                    Ok(_) => Ok(true),
                },
            ),
            Ask::Destroy { file } => Heard::Done(files.destroy(&file).map_err(line)),
            Ask::Copy { from, to } => Heard::Copied(copies(files, &from, &to).map_err(line)),
            Ask::Replace {
                dir: d,
                name,
                old,
                new,
            } => Heard::Done(
                dir.replace(&d, &name, &old, &new)
                    .map_err(|e| e.to_string()),
            ),
            Ask::Trees => Heard::Trees(trees(dir, root)),
            Ask::TouchTree { name } => Heard::TreeTouched(touch_tree(&name)),
            Ask::Age { server } => Heard::Aged(match files.admin(&server, AdminOp::Age) {
                Ok(Answer::Report { figures, .. }) => {
                    let figure = |n: &str| figures.iter().find(|f| f.0 == n).map_or(0, |f| f.1);
                    Ok((figure("aged") != 0, figure("destroyed")))
                }
                Ok(other) => Err(format!("a file server answered an ageing with {other:?}")),
                Err(e) => Err(e.to_string()),
            }),
        };
        pass.heard(heard);
    }
}

fn line(e: ClientError) -> String {
    e.to_string()
}

/// Every name in directory `d` and what each names.
fn list(dir: &mut DirClient, d: &Capability) -> Result<Listing, String> {
    let names: Vec<String> = dir
        .list(d)
        .map_err(|e| e.to_string())?
        .rows
        .into_iter()
        .map(|r| r.0)
        .collect();
    let mut out = Vec::with_capacity(names.len());
    for part in names.chunks(shoal_dir::model::MAX_BATCH) {
        let refs: Vec<&str> = part.iter().map(String::as_str).collect();
        let found = dir.lookup_many(d, &refs).map_err(dir_err)?;
        for (name, r) in part.iter().zip(found) {
            match r {
                Ok(caps) => out.push((name.clone(), Ok(caps))),
                // Removed since the listing: nothing to touch.
                Err(DirError::NotFound(_)) => {}
                Err(e) => out.push((name.clone(), Err(e.to_string()))),
            }
        }
    }
    Ok(out)
}

/// Copies of the file of replicas `from` on each of `to`: streamed from
/// the live replicas (with failover), chunk by chunk, a copy of any size
/// in bounded memory; a file with holes copied by its data ranges, so its
/// holes stay holes.
fn copies(
    files: &mut FileClient,
    from: &[Capability],
    to: &[Capability],
) -> Result<Vec<Capability>, ClientError> {
    let source = files.reader(from)?;
    let size = source.size();
    if files.has_holes(from, size)? {
        return sparse_copies(files, from, size, to);
    }
    files.create_from(to, source, true, |_| {})
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
