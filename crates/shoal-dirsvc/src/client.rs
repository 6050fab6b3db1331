//! The client library.
//!
//! ```no_run
//! use shoal_dirsvc::DirClient;
//! let ctx = shoal_rpc::Context::from_env()?;
//! let mut dir = DirClient::new(&ctx)?;            // the cluster's default service
//! let root = dir.create_dir(&["owner", "group", "other"])?;
//! dir.append(&root, "hello", &[root], None)?;
//! let caps = dir.lookup(&root, "hello")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Every call goes to whichever replica answers; a write that may not have
//! reached the service (the replica crashed, left its group, or the call
//! timed out) is retried, at another replica if need be, with the same
//! request number, so it is applied at most once.  The client remembers the
//! highest state index it has seen and replicas answer only once they have
//! applied that much (read-your-writes); with [`DirClient::linearizable`]
//! reads are linearizable too.

use std::time::{Duration, Instant};

use shoal_cap::{Capability, PutPort, Rights};
use shoal_dir::op::FLAG_LINEARIZABLE;
use shoal_dir::{Answer, DirError, Expect, InstallItem, Op, Request, Response};
use shoal_replicasvc::client::{self, Tries, Verdict};
use shoal_rpc::{Client, Context};

/// Why a directory call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The service refused the operation.
    #[error(transparent)]
    Dir(#[from] DirError),
    /// No replica could be reached in time; a write may or may not have
    /// been applied.
    #[error("directory service unreachable: {0}")]
    Unreachable(String),
    /// A replica's answer could not be decoded.
    #[error("bad answer from the directory service: {0}")]
    BadAnswer(String),
}

/// A directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    pub columns: Vec<String>,
    /// Names and their masks, sorted by name.
    pub rows: Vec<(String, Vec<Rights>)>,
}

/// A client of one directory service.
pub struct DirClient {
    rpc: Client,
    port: PutPort,
    id: u64,
    seq: u64,
    seen: u64,
    linearizable: bool,
    retry_for: Duration,
    /// When the client last asked where writes go (`None`: since it last
    /// moved to another replica, never).
    aimed: Option<Instant>,
}

/// How often a client that writes asks again where writes go (the
/// sequencer may have moved while its replica lives on).
const AIM_EVERY: Duration = Duration::from_secs(10);

impl DirClient {
    /// A client of the cluster's default directory service.
    pub fn new(ctx: &Context) -> Result<DirClient, ClientError> {
        let port = crate::service_port(&ctx.config().cluster, crate::DEFAULT_SERVICE).put_port();
        DirClient::with_port(ctx, port)
    }

    /// A client of the directory service at `port` (a directory
    /// capability's port names its service).
    pub fn with_port(ctx: &Context, port: PutPort) -> Result<DirClient, ClientError> {
        Ok(DirClient {
            rpc: ctx
                .client()
                .map_err(|e| ClientError::Unreachable(e.to_string()))?,
            port,
            id: rand::random::<u64>() | 1,
            seq: 0,
            seen: 0,
            linearizable: false,
            retry_for: Duration::from_secs(15),
            aimed: None,
        })
    }

    /// Makes reads linearizable (each costs a group message) or not.
    pub fn linearizable(&mut self, on: bool) -> &mut Self {
        self.linearizable = on;
        self
    }

    /// How long a call keeps retrying at other replicas.
    pub fn retry_for(&mut self, d: Duration) -> &mut Self {
        self.retry_for = d;
        self
    }

    /// The service's port.
    pub fn port(&self) -> PutPort {
        self.port
    }

    /// The highest state index this client has seen.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Sends one operation, retrying where it is safe.
    pub fn call(&mut self, op: Op) -> Result<Answer, ClientError> {
        let write = op.is_write();
        if write {
            self.seq += 1;
            // From its second write on (`seq` counts them), a client sends
            // its calls to the replica that orders writes
            // (`crate::writes_at`): a client that writes once does not pay
            // the question.
            if self.seq >= 2 && self.aimed.is_none_or(|t| t.elapsed() >= AIM_EVERY) {
                self.aim_writes();
            }
        }
        let req = Request {
            client: self.id,
            seq: self.seq,
            min_index: self.seen,
            flags: if self.linearizable && !write {
                FLAG_LINEARIZABLE
            } else {
                0
            },
            op,
        };
        let body = req.encode();
        let tries = Tries {
            patience: self.retry_for,
            each: Duration::from_secs(5),
            each_within_patience: true,
            pause: Duration::from_millis(20),
        };
        let (seen, aimed) = (&mut self.seen, &mut self.aimed);
        let mut behind: Option<(u64, u64)> = None;
        let outcome = client::call(&mut self.rpc, &self.port, &body, &tries, |_, sent| {
            let why = match sent {
                Err(e) => e.to_string(),
                Ok(reply) => {
                    let r = match Response::decode(&reply) {
                        Ok(r) => r,
                        Err(e) => return Verdict::Done(Err(ClientError::BadAnswer(e.to_string()))),
                    };
                    match r.result {
                        Err(DirError::Behind { have, want }) => {
                            behind = Some((have, want));
                            format!("replica behind: has {have}, needs {want}")
                        }
                        Err(e) if e.is_retryable() => e.to_string(),
                        other => {
                            *seen = (*seen).max(r.index);
                            return Verdict::Done(other.map_err(ClientError::from));
                        }
                    }
                }
            };
            // Try another replica.
            *aimed = None;
            Verdict::Again {
                why,
                elsewhere: true,
            }
        });
        match (outcome, behind) {
            (Ok(result), _) => result,
            (Err(_), Some((have, want))) => Err(DirError::Behind { have, want }.into()),
            (Err(last), None) => Err(ClientError::Unreachable(last.unwrap_or_default())),
        }
    }

    /// Asks the replica at hand where the service's writes go and aims the
    /// client's calls there (`crate::writes_at`); a replica that does not
    /// say (an rpc2pc one, or one between groups) changes nothing.
    fn aim_writes(&mut self) {
        self.aimed = Some(Instant::now());
        crate::writes_at::follow(&mut self.rpc, &self.port);
    }

    /// Creates a directory with these column names (1–4; normally
    /// owner, group, other) and returns its all-rights capability.
    pub fn create_dir(&mut self, columns: &[&str]) -> Result<Capability, ClientError> {
        match self.call(Op::CreateDir {
            columns: columns.iter().map(|c| c.as_bytes().to_vec()).collect(),
            secret: [0; 32],
        })? {
            Answer::Cap(c) => Ok(c),
            a => Err(unexpected(a)),
        }
    }

    /// Deletes an empty directory (needs the DESTROY right).
    pub fn delete_dir(&mut self, dir: &Capability) -> Result<(), ClientError> {
        self.done(Op::DeleteDir { dir: *dir })
    }

    /// Lists a directory's names and masks.
    pub fn list(&mut self, dir: &Capability) -> Result<Listing, ClientError> {
        match self.call(Op::List { dir: *dir })? {
            Answer::Listing { columns, rows } => Ok(Listing { columns, rows }),
            a => Err(unexpected(a)),
        }
    }

    /// Looks one name up: its capabilities, restricted to what the columns
    /// `dir` may use allow.
    pub fn lookup(&mut self, dir: &Capability, name: &str) -> Result<Vec<Capability>, ClientError> {
        self.lookup_bytes(dir, name.as_bytes())
    }

    /// [`DirClient::lookup`] with a raw name (the service rejects names that
    /// are not UTF-8).
    pub fn lookup_bytes(
        &mut self,
        dir: &Capability,
        name: &[u8],
    ) -> Result<Vec<Capability>, ClientError> {
        self.caps(Op::Lookup {
            dir: *dir,
            name: name.to_vec(),
        })
    }

    /// Looks up `a/b/c` in one call, restricting rights at every step.
    pub fn path_lookup(
        &mut self,
        dir: &Capability,
        path: &str,
    ) -> Result<Vec<Capability>, ClientError> {
        self.caps(Op::PathLookup {
            dir: *dir,
            path: path.as_bytes().to_vec(),
        })
    }

    /// Looks many names up at once; one result per name.
    pub fn lookup_many(
        &mut self,
        dir: &Capability,
        names: &[&str],
    ) -> Result<Vec<Result<Vec<Capability>, DirError>>, ClientError> {
        match self.call(Op::LookupMany {
            dir: *dir,
            names: names.iter().map(|n| n.as_bytes().to_vec()).collect(),
        })? {
            Answer::Many(r) => Ok(r),
            a => Err(unexpected(a)),
        }
    }

    /// Adds a row; `masks` defaults to all rights for the first column and
    /// read for the others.
    pub fn append(
        &mut self,
        dir: &Capability,
        name: &str,
        caps: &[Capability],
        masks: Option<&[Rights]>,
    ) -> Result<(), ClientError> {
        self.append_bytes(dir, name.as_bytes(), caps, masks)
    }

    /// [`DirClient::append`] with a raw name.
    pub fn append_bytes(
        &mut self,
        dir: &Capability,
        name: &[u8],
        caps: &[Capability],
        masks: Option<&[Rights]>,
    ) -> Result<(), ClientError> {
        let masks = match masks {
            Some(m) => m.to_vec(),
            None => {
                let n = self.list(dir)?.columns.len();
                shoal_dir::model::default_masks(n)
            }
        };
        self.done(Op::Append {
            dir: *dir,
            name: name.to_vec(),
            caps: caps.to_vec(),
            masks,
        })
    }

    /// Removes a row.
    pub fn delete(&mut self, dir: &Capability, name: impl AsRef<[u8]>) -> Result<(), ClientError> {
        self.done(Op::Delete {
            dir: *dir,
            name: name.as_ref().to_vec(),
        })
    }

    /// Replaces a row's capabilities if they are still `expect`
    /// (compare-and-swap); fails with [`DirError::Conflict`] otherwise.
    pub fn replace(
        &mut self,
        dir: &Capability,
        name: &str,
        expect: &[Capability],
        caps: &[Capability],
    ) -> Result<(), ClientError> {
        self.done(Op::Replace {
            dir: *dir,
            name: name.as_bytes().to_vec(),
            expect: expect.to_vec(),
            caps: caps.to_vec(),
        })
    }

    /// Sets a row's column masks.
    pub fn chmod(
        &mut self,
        dir: &Capability,
        name: impl AsRef<[u8]>,
        masks: &[Rights],
    ) -> Result<(), ClientError> {
        self.done(Op::Chmod {
            dir: *dir,
            name: name.as_ref().to_vec(),
            masks: masks.to_vec(),
        })
    }

    /// A row's column masks.
    pub fn get_masks(
        &mut self,
        dir: &Capability,
        name: impl AsRef<[u8]>,
    ) -> Result<Vec<Rights>, ClientError> {
        match self.call(Op::GetMasks {
            dir: *dir,
            name: name.as_ref().to_vec(),
        })? {
            Answer::Masks(m) => Ok(m),
            a => Err(unexpected(a)),
        }
    }

    /// Updates several rows of several directories atomically.
    pub fn install(&mut self, items: Vec<InstallItem>) -> Result<(), ClientError> {
        self.done(Op::Install { items })
    }

    /// Moves `from_name` in `from` to `to_name` in `to` atomically (an
    /// install that deletes the old row if it still holds what the lookup
    /// returned and adds the new one if the name is free).  The row moves
    /// as this capability's columns show it: if their masks hide rights of
    /// the stored capabilities, the install fails with
    /// [`DirError::Conflict`] and nothing moves.
    pub fn rename(
        &mut self,
        from: &Capability,
        from_name: impl AsRef<[u8]>,
        to: &Capability,
        to_name: impl AsRef<[u8]>,
    ) -> Result<(), ClientError> {
        let (from_name, to_name) = (from_name.as_ref(), to_name.as_ref());
        let caps = self.lookup_bytes(from, from_name)?;
        let masks = self.get_masks(from, from_name)?;
        self.install(vec![
            InstallItem {
                dir: *from,
                name: from_name.to_vec(),
                expect: Expect::Caps(caps.clone()),
                new: None,
            },
            InstallItem {
                dir: *to,
                name: to_name.to_vec(),
                expect: Expect::Absent,
                new: Some((caps, masks)),
            },
        ])
    }

    /// The replica's status (JSON) — whichever replica answers.
    pub fn status(&mut self) -> Result<serde_json::Value, ClientError> {
        match self.call(Op::Status)? {
            Answer::Status(s) => {
                serde_json::from_str(&s).map_err(|e| ClientError::BadAnswer(e.to_string()))
            }
            a => Err(unexpected(a)),
        }
    }

    fn caps(&mut self, op: Op) -> Result<Vec<Capability>, ClientError> {
        match self.call(op)? {
            Answer::Caps(c) => Ok(c),
            a => Err(unexpected(a)),
        }
    }

    fn done(&mut self, op: Op) -> Result<(), ClientError> {
        match self.call(op)? {
            Answer::Done => Ok(()),
            a => Err(unexpected(a)),
        }
    }
}

fn unexpected(a: Answer) -> ClientError {
    ClientError::BadAnswer(format!("unexpected answer {a:?}"))
}
