//! The node as a home (`docs/pool.md`): it numbers the processes started
//! from it, chooses their nodes, keeps its process table
//! (`shoal_pool::ProcTable`) and answers for its processes wherever they
//! run: `shoal ps`, `shoal kill` and `shoal wait` come here.
//!
//! A process is tied to the link of the `shoal run` that spawned it: when
//! that link closes with the process still running (its `shoal run` was
//! killed), the home hangs up on it, as a terminal's hangup would.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use shoal_pool::exec::{Ended, ExecReply, ExecRequest};
use shoal_pool::{ProcId, ProcState};
use shoal_rpc::CallOptions;
use shoal_rpc::link::ProcEnd;

use crate::daemon::{Shared, now};
use crate::service::{HomedProc, ProcAnswer};

/// Longest one `wait` request waits.
const MAX_WAIT: Duration = Duration::from_secs(2);
/// Longest a start grant waits for a session with its node.
const SESSION_WAIT: Duration = Duration::from_secs(2);
/// Deadline of a signal sent to a process's node.
const SIGNAL_DEADLINE: Duration = Duration::from_secs(5);

/// A new process running `command`: its id and the name of its node, `on`
/// if named (it must be a live member), else the placement rule's choice.
pub(crate) fn spawn(
    shared: &Shared,
    peer: crate::link_server::Peer,
    command: &str,
    on: Option<&str>,
    mem_mib: u32,
    allow_owner_active: bool,
) -> Result<(ProcId, String), String> {
    let node = match on {
        Some(name) => {
            let state = shared.state.lock();
            match state.membership.view(now()).iter().find(|m| m.name == name) {
                Some(m) if m.alive => name.to_string(),
                Some(_) => return Err(format!("node {name} is down")),
                None => return Err(format!("no node named {name} in the cluster")),
            }
        }
        None => place(shared, mem_mib, allow_owner_active, None)?,
    };
    let id = {
        let mut procs = shared.procs.lock();
        let id = procs.spawn(now(), command, &node, peer.uid);
        let reserved = shared.procs_reserved.load(Ordering::Acquire);
        if id.seq + 1 >= reserved {
            let next = reserve(&shared.config.state_dir, reserved)?;
            shared.procs_reserved.store(next, Ordering::Release);
        }
        id
    };
    Ok((id, node))
}

/// Process numbers are taken in blocks of this many: small numbers, never
/// reused by a later incarnation of this home.
const NUMBERS_BLOCK: u64 = 1000;
/// The file that says where the next block starts.
const NUMBERS_FILE: &str = "procs.next";

/// The first process number this incarnation may use, with the block it
/// starts reserved: `(first, end of the reservation)`.
pub(crate) fn first_number(state_dir: &std::path::Path) -> Result<(u64, u64), String> {
    let path = state_dir.join(NUMBERS_FILE);
    let first = match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("{}: not a number", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 1,
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    Ok((first, reserve(state_dir, first)?))
}

/// Reserves the numbers from `from` on (a block), durably, before any is
/// used: the end of the reservation.
fn reserve(state_dir: &std::path::Path, from: u64) -> Result<u64, String> {
    let end = from + NUMBERS_BLOCK;
    shoal_rpc::secrets::write(&state_dir.join(NUMBERS_FILE), format!("{end}\n").as_bytes())?;
    Ok(end)
}

/// The start grant of process `id` for node `node` (hex): what the
/// kernel says of the program that asked for it (`peer`), sealed for that
/// node's exec service under this node's session with it
/// (`docs/security.md`, "Local authority").
pub(crate) fn grant(
    shared: &Shared,
    peer: crate::link_server::Peer,
    id: ProcId,
    node: &str,
) -> Result<String, String> {
    let credentials = crate::credentials::read(peer.pid, peer.pidfd, peer.uid)?;
    let target = {
        let state = shared.state.lock();
        let view = state.membership.view(now());
        view.iter()
            .find(|m| m.name == node)
            .map(|m| m.node)
            .ok_or_else(|| format!("no node named {node} in the cluster"))?
    };
    // A session is normally up with every member; a new one takes a
    // round trip.
    let until = Instant::now() + SESSION_WAIT;
    let root = loop {
        match crate::locate::root_for(shared, target) {
            Ok(root) => break root,
            Err(e) if Instant::now() >= until => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let grant = shoal_pool::exec::Grant {
        id,
        uid: peer.uid,
        gid: credentials.gid,
        groups: credentials.groups,
        hard: credentials.hard,
    };
    let sealed = shoal_session::grant::seal(&root, rand::random(), &grant.encode());
    Ok(hex::encode(sealed))
}

/// Process `id` lost its node `lost`: the node it is to run on now.
pub(crate) fn respawn(
    shared: &Shared,
    id: ProcId,
    lost: &str,
    mem_mib: u32,
    allow_owner_active: bool,
) -> Result<String, String> {
    let node = place(shared, mem_mib, allow_owner_active, Some(lost))?;
    if !shared.procs.lock().moved(id, &node) {
        return Err(format!(
            "process {shown} is not running",
            shown = shared.names.show(id)
        ));
    }
    Ok(node)
}

/// The placement rule's choice among the live members but `avoid`.
fn place(
    shared: &Shared,
    mem_mib: u32,
    allow_owner_active: bool,
    avoid: Option<&str>,
) -> Result<String, String> {
    let now = now();
    let mut state = shared.state.lock();
    let view = state.membership.view(now);
    let candidates: Vec<shoal_pool::Candidate> = view
        .iter()
        .filter(|m| m.alive && Some(m.name.as_str()) != avoid)
        .filter_map(|m| {
            let (load, at) = m.load?;
            Some(shoal_pool::Candidate {
                node: m.node,
                load,
                reported: at,
            })
        })
        .collect();
    let request = shoal_pool::Request {
        mem_mib,
        allow_owner_active,
    };
    let node = state
        .placer
        .place(now, &candidates, &request)
        .map_err(|e| e.to_string())?;
    Ok(view
        .iter()
        .find(|m| m.node == node)
        .map(|m| m.name.clone())
        .unwrap_or_default())
}

/// Process `id` ended so (or never started).
pub(crate) fn ended(shared: &Shared, id: ProcId, end: ProcEnd) {
    let mut procs = shared.procs.lock();
    let how = match end {
        ProcEnd::NotStarted => {
            procs.forget(id);
            None
        }
        ProcEnd::Exited(c) => Some(Some(Ended::Exited(c))),
        ProcEnd::Killed(s) => Some(Some(Ended::Killed(s))),
        ProcEnd::Lost => Some(None),
    };
    if let Some(how) = how {
        procs.end(id, now(), how);
    }
    drop(procs);
    shared.procs_changed.notify_all();
}

/// The link that spawned `ids` closed: those still running are hung up on
/// and recorded as lost (their end will never be reported).
pub(crate) fn hang_up(shared: &Shared, ids: &[ProcId]) {
    let mut nodes = Vec::new();
    {
        let mut procs = shared.procs.lock();
        for &id in ids {
            if let Some(p) = procs.get(id)
                && p.state == ProcState::Running
            {
                nodes.push((id, p.node.clone()));
                procs.end(id, now(), None);
            }
        }
    }
    shared.procs_changed.notify_all();
    for (id, node) in nodes {
        tracing::info!(%id, %node, "its shoal run went away: hanging up");
        if let Err(e) = signal(shared, id, &node, libc::SIGHUP) {
            tracing::info!(%id, "cannot hang up: {e}");
        }
    }
}

/// Sends `signal` to process `id` on `node`'s exec service.
fn signal(shared: &Shared, id: ProcId, node: &str, signal: i32) -> Result<(), String> {
    let ctx = shared
        .rpc
        .get()
        .ok_or("the node is not serving yet".to_string())?;
    let mut client = ctx.client().map_err(|e| e.to_string())?;
    let port = shoal_poolsvc::exec_service(&shared.identity.trust.cluster.0, node).put_port();
    let opts = CallOptions {
        deadline: Some(SIGNAL_DEADLINE),
        cancel: None,
    };
    let reply = client
        .trans_with(&port, ExecRequest::Signal { id, signal }.encode(), &opts)
        .map_err(|e| format!("node {node}: {e}"))?;
    match ExecReply::decode(&reply).map_err(|e| e.to_string())? {
        ExecReply::Done => Ok(()),
        ExecReply::Error(e) => Err(e),
        other => Err(format!("unexpected answer {other:?}")),
    }
}

/// The home's processes, and those running on this node, as `caller`
/// may see them: everyone's, but another user's with its program's name
/// only, not its arguments (`docs/security.md`, "Local authority").
pub(crate) fn procs(shared: &Shared, with_ended: bool, caller: shoal_rpc::Caller) -> ProcAnswer {
    let now = now();
    let procs = shared.procs.lock();
    let ended = with_ended.then(|| procs.ended()).into_iter().flatten();
    let homed = procs
        .running()
        .chain(ended)
        .map(|p| HomedProc {
            id: p.id.to_string(),
            command: if caller.uid == 0 || caller.uid == p.uid {
                p.command.clone()
            } else {
                p.command.split(' ').next().unwrap_or_default().to_string()
            },
            node: p.node.clone(),
            uid: p.uid,
            age_s: now.saturating_since(p.started).as_secs_f64(),
            end: end_of(p.state),
        })
        .collect();
    drop(procs);
    ProcAnswer::Procs {
        homed,
        running: shared.exec.list(),
    }
}

/// Delivers `signal` to process `id`, whose home this node is, on the
/// node it runs on.
pub(crate) fn kill(shared: &Shared, id: &str, sig: i32) -> ProcAnswer {
    let id = match home_id(shared, id) {
        Ok(id) => id,
        Err(message) => return ProcAnswer::Error { message },
    };
    let node = match shared.procs.lock().get(id) {
        Some(p) if p.state == ProcState::Running => p.node.clone(),
        Some(_) => {
            return ProcAnswer::Error {
                message: format!("process {shown} has ended", shown = shared.names.show(id)),
            };
        }
        None => {
            return ProcAnswer::Error {
                message: format!("no process {shown}", shown = shared.names.show(id)),
            };
        }
    };
    match signal(shared, id, &node, sig) {
        Ok(()) => ProcAnswer::Done,
        Err(message) => ProcAnswer::Error { message },
    }
}

/// How process `id` ended, waiting up to `wait_ms` for it.
pub(crate) fn wait(shared: &Shared, id: &str, wait_ms: u32) -> ProcAnswer {
    let id = match home_id(shared, id) {
        Ok(id) => id,
        Err(message) => return ProcAnswer::Error { message },
    };
    let until = Instant::now() + Duration::from_millis(wait_ms as u64).min(MAX_WAIT);
    let mut procs = shared.procs.lock();
    loop {
        let Some(p) = procs.get(id) else {
            return ProcAnswer::Error {
                message: format!("no process {shown}", shown = shared.names.show(id)),
            };
        };
        if let Some(end) = end_of(p.state) {
            return ProcAnswer::Waited { end: Some(end) };
        }
        if shared
            .procs_changed
            .wait_until(&mut procs, until)
            .timed_out()
        {
            return ProcAnswer::Waited { end: None };
        }
    }
}

/// `text` as the id of a process of this home.
/// Whether `caller` may kill or wait for process `id` of this home: its
/// owner's uid, or root, from any node of the cluster (one cluster has
/// one uid namespace, as its users' accounts do).  Refusals are counted.
pub(crate) fn may(shared: &Shared, caller: shoal_rpc::Caller, id: &str) -> Result<(), String> {
    let Ok(id) = home_id(shared, id) else {
        // Its own error comes with the answer.
        return Ok(());
    };
    let owner = shared.procs.lock().get(id).map(|p| p.uid);
    match owner {
        Some(uid) if caller.uid != 0 && caller.uid != uid => {
            shared
                .refused_procs
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(format!(
                "process {shown} is uid {uid}'s; uid {} may not touch it",
                caller.uid,
                shown = shared.names.show(id)
            ))
        }
        _ => Ok(()),
    }
}

fn home_id(shared: &Shared, text: &str) -> Result<ProcId, String> {
    let id: ProcId = text.parse().map_err(|e| format!("{e}"))?;
    if id.home != shared.node {
        return Err(format!(
            "process {shown} is not homed on node {}",
            shared.config.name,
            shown = shared.names.show(id)
        ));
    }
    Ok(id)
}

fn end_of(state: ProcState) -> Option<ProcEnd> {
    match state {
        ProcState::Running => None,
        ProcState::Ended {
            how: Ended::Exited(c),
            ..
        } => Some(ProcEnd::Exited(c)),
        ProcState::Ended {
            how: Ended::Killed(s),
            ..
        } => Some(ProcEnd::Killed(s)),
        ProcState::Lost { .. } => Some(ProcEnd::Lost),
    }
}
