//! Storing a file's new version, as the mount does for its write-backs,
//! the primary for the bytes written through it, and both for changes
//! kept in `/.lost` (`docs/fs.md`, "Sparse files"): the changes made as
//! edits of each replica of the version they were made over, so the file
//! servers share every unchanged extent; or, for a new file, a file
//! streamed from the changes or made of their pieces.  Where a replica
//! cannot be edited (its server away), the version is copied to another
//! server first, its data ranges only.  Holes stay holes, and memory
//! stays a window's whatever the file's size: nothing here holds a whole
//! file.

use std::io::Read;

use shoal_bullet::op::Edit;
use shoal_bulletsvc::{ClientError, FileClient, OneCopy};
use shoal_cap::Capability;
use shoal_fs::edits::{Layout, PIECE_MAX, Piece, pieces};
use shoal_fs::model::Ino;
use shoal_fs::tree::{OverlayEntry, overlaid_window};

/// A file's new version as changes: the version they were made over (its
/// replicas, none for a new file, its size and the bytes of data it
/// holds) and the changes, which leave the file `size` bytes long.
#[derive(Debug, Clone, Copy)]
pub struct Changes<'a> {
    pub base: &'a [Capability],
    pub base_size: u64,
    pub base_held: u64,
    pub overlay: &'a [OverlayEntry],
    pub size: u64,
}

/// A version stored: its replicas, and the bytes of data it holds
/// (`Attr::held`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub content: Vec<Capability>,
    pub held: u64,
}

impl Changes<'_> {
    /// The file's `len` bytes at `offset` with the changes made, where no
    /// byte of the base shows (a write's).
    fn window(&self, offset: u64, len: usize) -> Vec<u8> {
        overlaid_window(&[], offset, len, self.overlay, self.size)
    }
}

/// Stores the version `changes` make for inode `ino` as `copies`
/// replicas: each replica of the base edited, then, for as many as are
/// missing, the base copied to one of `servers` (in an order that starts
/// at a place moving with the inode, so versions spread) and edited; with
/// `safety`, each is on its server's disk first.  The first `copies` are
/// made at once, one of `files` each (an `fsync` costs one round of
/// parallel writes): from this thread when each is one request (a request
/// at every server before any answer is waited for), else a thread each
/// (as many as there are clients); those
/// that failed are made again elsewhere one after another.  Fewer copies
/// than asked is an error (every replica failing:
/// [`ClientError::AllReplicas`], so [`ClientError::is_gone`] tells a base
/// no server holds), and the copies made are destroyed.
pub fn store(
    files: &mut [FileClient],
    servers: &[Capability],
    copies: usize,
    ino: Ino,
    changes: &Changes<'_>,
    safety: bool,
) -> Result<Version, ClientError> {
    if servers.is_empty() {
        return Err(ClientError::Local(
            "no file servers are configured for file contents".into(),
        ));
    }
    if files.is_empty() {
        return Err(ClientError::Local("no file service client".into()));
    }
    // A version of which no byte shows (truncated to nothing, then
    // written) shares nothing with its base: it is made as a new file, in
    // one request to each server.
    let shows = changes.base_size > 0
        && Layout::of(changes.base_size, changes.overlay, changes.size).keep > 0;
    let base = if changes.base.is_empty() || !shows {
        Changes {
            base: &[],
            base_size: 0,
            base_held: 0,
            ..*changes
        }
    } else {
        *changes
    };
    let mut plan = pieces(base.base_size, base.overlay, base.size);
    if plan.is_empty() {
        // The same bytes, as a new version all the same.
        plan.push(Piece::Write { offset: 0, len: 0 });
    }
    // Every way of making a copy, in the order they are tried: the base's
    // replicas edited, then the servers in turn.
    let n = servers.len();
    let mut ways: Vec<Way> = base.base.iter().map(|r| Way::Edit(*r)).collect();
    ways.extend((0..n).map(|k| Way::On(servers[(ino.0 as usize + k) % n])));
    let mut ways = ways.into_iter();
    let mut made: Vec<Capability> = Vec::new();
    let mut errors = Vec::new();
    let run = |f: &mut FileClient, way: Way| match way {
        Way::Edit(replica) => edited(f, replica, false, &plan, &base, safety),
        Way::On(server) if base.base.is_empty() => new_file(f, &server, &plan, &base, safety),
        Way::On(server) => f
            .copy_uncommitted(base.base, base.base_size, &server)
            .and_then(|copy| edited(f, copy, true, &plan, &base, safety)),
    };
    // The first round at once: the first `copies` ways on distinct
    // servers.
    let mut first: Vec<Way> = Vec::new();
    for way in ways.by_ref() {
        if first.len() == copies {
            break;
        }
        if !first.iter().any(|w| w.port() == way.port()) {
            first.push(way);
        }
    }
    let results = match one_request_each(&first, &plan, &base) {
        Some(request) if files.len() >= first.len() => {
            begun_at_once(files, &first, &request, safety)
        }
        _ => at_once(files, &first, &run),
    };
    for r in results {
        match r {
            Ok(c) => made.push(c),
            Err(e) => errors.push(e),
        }
    }
    // The rest one after another, on servers not holding a copy yet.
    for way in ways {
        if made.len() == copies {
            break;
        }
        if made.iter().any(|c| c.port() == way.port()) || first.contains(&way) {
            continue;
        }
        match run(&mut files[0], way) {
            Ok(c) => made.push(c),
            Err(e) => errors.push(e),
        }
    }
    if made.len() == copies {
        let held = held(&mut files[0], &made, &base);
        return Ok(Version {
            content: made,
            held,
        });
    }
    for c in &made {
        let _ = files[0].destroy(c);
    }
    Err(if made.is_empty() {
        ClientError::AllReplicas(errors)
    } else {
        let why: Vec<String> = errors.iter().map(ToString::to_string).collect();
        ClientError::Local(format!(
            "{} of {copies} copies of a file's contents stored: {}",
            made.len(),
            why.join("; ")
        ))
    })
}

/// One way of making a copy of a new version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// A replica of the base, edited.
    Edit(Capability),
    /// A new file on this server (the base copied there first, if any).
    On(Capability),
}

impl Way {
    fn port(&self) -> shoal_cap::PutPort {
        match self {
            Way::Edit(c) | Way::On(c) => c.port(),
        }
    }
}

/// The bytes of the one request that makes each of `ways`' copies, if
/// each is made by one (the common `fsync`: a new small file, or one edit
/// of each replica of the base).
enum OneRequest {
    Create(Vec<u8>),
    Edit(Edit),
}

fn one_request_each(ways: &[Way], plan: &[Piece], changes: &Changes<'_>) -> Option<OneRequest> {
    if ways.iter().all(|w| matches!(w, Way::Edit(_))) {
        return match plan {
            [only] => Some(OneRequest::Edit(edit(only, changes))),
            _ => None,
        };
    }
    let small = changes.size < shoal_bulletsvc::client::CHUNK as u64;
    let whole = !plan.iter().any(|p| matches!(p, Piece::Hole { .. }));
    (changes.base.is_empty() && small && whole && ways.iter().all(|w| matches!(w, Way::On(_))))
        .then(|| OneRequest::Create(changes.window(0, changes.size as usize)))
}

/// `ways` made by `request` (committed; with `safety`, on the servers'
/// disks), sent to every server before any answer is waited for, from
/// this thread, a client of `files` each (as many as `ways`): no thread
/// is started, and no answer waits for one.
fn begun_at_once(
    files: &mut [FileClient],
    ways: &[Way],
    request: &OneRequest,
    safety: bool,
) -> Vec<Result<Capability, ClientError>> {
    let begun: Vec<Result<(), ClientError>> = files
        .iter_mut()
        .zip(ways)
        .map(|(f, way)| {
            f.begin(
                match (way, request) {
                    (Way::On(server), OneRequest::Create(data)) => OneCopy::Create {
                        server: *server,
                        data,
                    },
                    (Way::Edit(file), OneRequest::Edit(e)) => OneCopy::Edit {
                        file: *file,
                        edit: e.as_ref(),
                    },
                    _ => unreachable!("one_request_each matched the ways"),
                },
                safety,
            )
        })
        .collect();
    files
        .iter_mut()
        .zip(begun)
        .map(|(f, begun)| begun.and_then(|()| f.finish()))
        .collect()
}

/// `ways` carried out at once, one thread and one of `files` each (the
/// last on this thread); with fewer clients than ways, a client carries
/// out several in turn.  Their results, in order.
fn at_once<T: Send>(
    files: &mut [FileClient],
    ways: &[Way],
    run: &(impl Fn(&mut FileClient, Way) -> Result<T, ClientError> + Sync),
) -> Vec<Result<T, ClientError>> {
    let lanes = files.len().min(ways.len()).max(1);
    if lanes == 1 {
        return ways.iter().map(|w| run(&mut files[0], *w)).collect();
    }
    let mut out: Vec<Option<Result<T, ClientError>>> = (0..ways.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let mut lanes_out = Vec::new();
        let (here, others) = files[..lanes].split_last_mut().expect("lanes");
        for (lane, f) in others.iter_mut().enumerate() {
            let mine: Vec<(usize, Way)> = ways
                .iter()
                .enumerate()
                .filter(|(k, _)| k % lanes == lane)
                .map(|(k, w)| (k, *w))
                .collect();
            lanes_out.push(s.spawn(move || {
                mine.into_iter()
                    .map(|(k, w)| (k, run(f, w)))
                    .collect::<Vec<_>>()
            }));
        }
        for (k, w) in ways
            .iter()
            .enumerate()
            .filter(|(k, _)| k % lanes == lanes - 1)
        {
            out[k] = Some(run(here, *w));
        }
        for lane in lanes_out {
            for (k, r) in lane.join().expect("a store lane panicked") {
                out[k] = Some(r);
            }
        }
    });
    out.into_iter().map(|r| r.expect("every way run")).collect()
}

/// The bytes of data a version made by `changes` holds: at most the
/// base's that still show and the ranges written; asked of a file server
/// only when that says the file has holes (a dense file costs no
/// message), and that bound if it cannot answer.
fn held(files: &mut FileClient, made: &[Capability], changes: &Changes<'_>) -> u64 {
    let layout = Layout::of(changes.base_size, changes.overlay, changes.size);
    let written: u64 = layout.written.iter().map(|(s, e)| e - s).sum();
    let bound = (changes.base_held.min(layout.keep) + written).min(changes.size);
    if bound >= changes.size || made.is_empty() {
        return bound;
    }
    let mut held = 0;
    let mut from = 0;
    loop {
        match files.map(made, from) {
            Ok(ranges) => {
                held += ranges.iter().map(|(s, e)| e - s).sum::<u64>();
                match ranges.last() {
                    Some(&(_, end)) if ranges.len() == shoal_bullet::model::MAX_MAP => from = end,
                    _ => return held,
                }
            }
            Err(e) => {
                tracing::debug!("mapping a version just stored: {e}");
                return bound;
            }
        }
    }
}

/// `plan` applied to `file` (a committed version, which gives a new file
/// at the first edit; or an uncommitted file of our `own`, edited in
/// place), then committed.  On failure the file made is destroyed.
fn edited(
    files: &mut FileClient,
    file: Capability,
    own: bool,
    plan: &[Piece],
    changes: &Changes<'_>,
    safety: bool,
) -> Result<Capability, ClientError> {
    let mut at = file;
    let mut made = None;
    let result = (|| {
        let Some((last, rest)) = plan.split_last() else {
            return files.commit(&at, safety);
        };
        for piece in rest {
            at = files.edit(&at, edit(piece, changes), false, false)?;
            made = Some(at);
        }
        // The last edit commits, in the same request.
        at = files.edit(&at, edit(last, changes), true, safety)?;
        made = Some(at);
        Ok(())
    })();
    match result {
        Ok(()) => Ok(at),
        Err(e) => {
            if let Some(m) = made.filter(|m| *m != file) {
                let _ = files.destroy(&m);
            }
            if own {
                let _ = files.destroy(&file);
            }
            Err(e)
        }
    }
}

/// The file service's edit for one piece of a plan.
fn edit(piece: &Piece, changes: &Changes<'_>) -> Edit {
    match *piece {
        Piece::Cut { at } => Edit::Delete {
            offset: at,
            len: changes.base_size - at,
        },
        Piece::Write { offset, .. } => Edit::Write {
            offset,
            data: piece.bytes(changes.overlay, changes.size),
        },
        Piece::Hole { offset, len } => Edit::Hole { offset, len },
    }
}

/// A new file on `server`: streamed from the changes when they hold
/// every byte (no hole), else an empty file with the plan's pieces.
fn new_file(
    files: &mut FileClient,
    server: &Capability,
    plan: &[Piece],
    changes: &Changes<'_>,
    safety: bool,
) -> Result<Capability, ClientError> {
    if !plan.iter().any(|p| matches!(p, Piece::Hole { .. })) {
        if changes.size < shoal_bulletsvc::client::CHUNK as u64 {
            // In one request, without a stream's chunk buffer.
            let bytes = changes.window(0, changes.size as usize);
            return files.create(server, &bytes, safety);
        }
        let bytes = Window {
            changes,
            at: 0,
            end: changes.size,
        };
        return files
            .create_from(&[*server], bytes, safety, |_| {})
            .map(|mut c| c.remove(0));
    }
    let empty = files.create_uncommitted(server)?;
    edited(files, empty, true, plan, changes, safety)
}

/// The changes' bytes `[at, end)` as a stream, a window at a time.
struct Window<'a> {
    changes: &'a Changes<'a>,
    at: u64,
    end: u64,
}

impl Read for Window<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = ((self.end - self.at) as usize)
            .min(buf.len())
            .min(PIECE_MAX);
        let w = self.changes.window(self.at, n);
        buf[..w.len()].copy_from_slice(&w);
        self.at += w.len() as u64;
        Ok(w.len())
    }
}
