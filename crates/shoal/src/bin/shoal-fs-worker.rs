//! `shoal-fs-worker`: one program of the cluster-wide fsx-style test
//! (`crates/shoal/tests/fsx.rs`).  It reads one JSON request per line on
//! standard input, does it with plain system calls on the files named
//! (through a descriptor it keeps open across requests, or a fresh one),
//! and writes one JSON answer per line: `{"ok":…}` or `{"err":ERRNO}`.
//! The test runs one on each node, in the node's namespaces, and checks
//! the answers against its model.  A program of its own, which the
//! packages do not install: what users run carries no test machinery.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, Write};
use std::os::unix::fs::FileExt;

use serde::Deserialize;
use serde_json::{Value, json};

/// One request.  `held`: through the descriptor kept for `path` (opened
/// read-write if there is none yet), else through a fresh one.
#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request {
    /// Writes `data` (hex) at `off`.
    Write {
        path: String,
        held: bool,
        off: u64,
        data: String,
    },
    /// Appends `data` (hex) through a fresh `O_APPEND` descriptor.
    Append {
        path: String,
        data: String,
    },
    /// Reads up to `len` bytes at `off` (to the end, or `len`).
    Read {
        path: String,
        held: bool,
        off: u64,
        len: usize,
    },
    Truncate {
        path: String,
        held: bool,
        size: u64,
    },
    Fsync {
        path: String,
        held: bool,
    },
    /// The size `stat` gives.
    Size {
        path: String,
    },
    /// The whole file, through a fresh descriptor.
    Cat {
        path: String,
    },
    /// Creates or replaces `path` with `data` (hex).
    Put {
        path: String,
        data: String,
    },
    Rename {
        from: String,
        to: String,
    },
    Remove {
        path: String,
    },
    /// The names in directory `path`, sorted.
    List {
        path: String,
    },
    /// Closes the descriptor kept for `path`, if any.
    Close {
        path: String,
    },
    /// Closes every kept descriptor.
    CloseAll,
}

fn main() {
    let mut held: HashMap<String, File> = HashMap::new();
    let stdin = io::stdin();
    let mut out = io::stdout().lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let answer = match serde_json::from_str::<Request>(&line) {
            Ok(request) => match serve(&mut held, request) {
                Ok(v) => json!({ "ok": v }),
                Err(e) => json!({ "err": e.raw_os_error().unwrap_or(0), "what": e.to_string() }),
            },
            Err(e) => {
                eprintln!("shoal-fs-worker: bad request: {e}");
                std::process::exit(2);
            }
        };
        if writeln!(out, "{answer}").and_then(|_| out.flush()).is_err() {
            break;
        }
    }
}

fn serve(held: &mut HashMap<String, File>, request: Request) -> io::Result<Value> {
    match request {
        Request::Write {
            path,
            held: h,
            off,
            data,
        } => {
            let data = unhex(&data)?;
            with(held, &path, h, |f| f.write_all_at(&data, off))?;
        }
        Request::Append { path, data } => {
            let data = unhex(&data)?;
            OpenOptions::new()
                .append(true)
                .open(&path)?
                .write_all(&data)?;
        }
        Request::Read {
            path,
            held: h,
            off,
            len,
        } => {
            let got = with(held, &path, h, |f| {
                let mut got = vec![0u8; len];
                let mut done = 0;
                while done < len {
                    match f.read_at(&mut got[done..], off + done as u64)? {
                        0 => break,
                        k => done += k,
                    }
                }
                got.truncate(done);
                Ok(got)
            })?;
            return Ok(json!(hex::encode(got)));
        }
        Request::Truncate {
            path,
            held: h,
            size,
        } => with(held, &path, h, |f| f.set_len(size))?,
        Request::Fsync { path, held: h } => with(held, &path, h, |f| f.sync_all())?,
        Request::Size { path } => return Ok(json!(fs::metadata(path)?.len())),
        Request::Cat { path } => return Ok(json!(hex::encode(fs::read(path)?))),
        Request::Put { path, data } => fs::write(path, unhex(&data)?)?,
        Request::Rename { from, to } => fs::rename(from, to)?,
        Request::Remove { path } => fs::remove_file(path)?,
        Request::List { path } => {
            let mut names = Vec::new();
            for e in fs::read_dir(path)? {
                names.push(e?.file_name().to_string_lossy().into_owned());
            }
            names.sort();
            return Ok(json!(names));
        }
        Request::Close { path } => {
            held.remove(&path);
        }
        Request::CloseAll => held.clear(),
    }
    Ok(Value::Null)
}

/// `op` on `path`'s kept descriptor (`keep`) or a fresh one.
fn with<T>(
    held: &mut HashMap<String, File>,
    path: &str,
    keep: bool,
    op: impl FnOnce(&File) -> io::Result<T>,
) -> io::Result<T> {
    let open = || OpenOptions::new().read(true).write(true).open(path);
    if !keep {
        return op(&open()?);
    }
    if !held.contains_key(path) {
        held.insert(path.to_owned(), open()?);
    }
    op(&held[path])
}

fn unhex(s: &str) -> io::Result<Vec<u8>> {
    hex::decode(s).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}
