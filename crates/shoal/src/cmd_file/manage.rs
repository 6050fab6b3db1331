//! The object manager as a service (`shoal file manage`, `docs/files.md`,
//! "Replication and garbage collection"), and the pass `shoal file gc`
//! makes once.
//!
//! Every node with a file server runs a manager. Each round (`--every`)
//! it asks the servers when they last aged: if one did within the
//! round, another manager made this round's pass, and it waits for the
//! next; otherwise it makes the pass. Two managers that start a round at
//! once both pass, which is harmless: touches are idempotent, a repair
//! swaps an entry only if it did not change, and a server ages at most
//! once per its gap. So the passes go on while any node with a manager
//! lives, and no election is needed.

use std::time::{Duration, Instant};

use shoal_bullet::Answer;
use shoal_bullet::op::AdminOp;
use shoal_bulletsvc::FileClient;
use shoal_bulletsvc::manager::{self, PassOptions, PassReport};
use shoal_rpc::Context;

use super::{file_client, open_all};
use crate::Failure;
use crate::cmd_dir::{Common, Session, attach, until_signalled};

/// One pass from the session's root, touching every registered file
/// system's tree through its metadata service.
pub(super) fn pass(
    ctx: &Context,
    s: &mut Session,
    files: &mut FileClient,
    opts: &PassOptions,
) -> Result<PassReport, Failure> {
    let root = s.root;
    let mut touch_tree = |name: &str| {
        shoal_fssvc::FsClient::new(ctx, name)
            .and_then(|mut c| c.touch_contents())
            .map_err(|e| e.to_string())
    };
    Ok(manager::pass(
        &mut s.dir,
        files,
        &root,
        opts,
        &mut touch_tree,
    )?)
}

/// A pass's report, on one line.
pub(super) fn show(r: &PassReport) -> String {
    let trees: Vec<String> = r
        .trees
        .iter()
        .map(|(n, t, m)| format!("{n}:{t}/{m}"))
        .collect();
    format!(
        "directories={} files={} touched={} missing={} corrupt={} recreated={} trees={:?} servers_aged={} destroyed_by_age={} unreachable_servers={:?}",
        r.directories,
        r.files,
        r.replicas_touched,
        r.replicas_missing,
        r.replicas_corrupt,
        r.replicas_recreated,
        trees,
        r.servers_aged,
        r.destroyed_by_age,
        r.servers_unreachable,
    )
}

/// `shoal file manage`: a round every `every` until signalled.
pub(super) fn run(every: Duration, k: usize, common: Common) -> Result<(), Failure> {
    let ctx = attach()?;
    // Checked once here, so a bad configuration fails the service at once.
    drop(open_all(&common)?);
    let opts = PassOptions {
        k,
        verify: false,
        age: true,
    };
    std::thread::Builder::new()
        .name("manager".into())
        .spawn(move || {
            loop {
                // Rounds start at a spread: managers that started together
                // do not pass together.
                let wait = every.mul_f64(0.9 + rand::random::<f64>() * 0.2);
                std::thread::sleep(wait);
                if let Err(e) = round(&ctx, &common, every, &opts) {
                    eprintln!("object manager pass: {}", e.message);
                }
            }
        })
        .map_err(|e| Failure::failed(format!("cannot start the manager's thread: {e}")))?;
    eprintln!("object manager: a pass every {every:?} unless another manager made it");
    until_signalled(|| true, ("managing", ""))
}

/// One round: a pass, unless a server aged less than `every` ago.
fn round(
    ctx: &Context,
    common: &Common,
    every: Duration,
    opts: &PassOptions,
) -> Result<(), Failure> {
    let mut s = Session::open(common)?;
    let mut files = file_client(ctx)?;
    let servers = manager::servers(&mut s.dir, &s.root)?;
    let since = servers
        .iter()
        .filter_map(|(_, cap)| match files.admin(cap, AdminOp::Stats) {
            Ok(Answer::Report { figures, .. }) => {
                figures.iter().find(|f| f.0 == "since_aged_us").map(|f| f.1)
            }
            _ => None,
        })
        .min();
    if since.is_some_and(|us| us < every.as_micros() as u64) {
        tracing::debug!("a server aged {since:?} µs ago: another manager made this round's pass");
        return Ok(());
    }
    let started = Instant::now();
    let r = pass(ctx, &mut s, &mut files, opts)?;
    eprintln!(
        "object manager pass: {} in {:.1?}",
        show(&r),
        started.elapsed()
    );
    for p in &r.problems {
        eprintln!("object manager problem: {p}");
    }
    Ok(())
}
