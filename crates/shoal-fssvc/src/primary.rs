//! The primary: the metadata replica whose group member is the sequencer
//! answers the clients, with the soft state only it holds
//! ([`shoal_fs::primary`]: tokens, opens, recalls, locks, parked
//! `Events`, the grace period).  This is its shell: the replicated tree,
//! the ordering of updates, the file servers, the RPC requests held to be
//! answered later, and the clock.  Every other replica answers "not the
//! primary".
//!
//! One lock (`soft`) covers a request's decision and the update it
//! orders, so a token decision and the tree change it allows are one step
//! for every other client.  A request that must wait for recalls is held
//! in the soft state and answered, from whichever thread sees the recall
//! answered or the lease end.
//!
//! Who may call: a mount client is root on its node (the RPC layer tells
//! the caller's uid from its node's kernel), and claims the identity the
//! kernel gave each FUSE request; any other caller is refused.  Root is
//! squashed to `nobody` unless the service allows it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Instant, SystemTime};

use parking_lot::Mutex;
use shoal_bulletsvc::FileClient;
use shoal_cap::{Capability, PutPort};
use shoal_fs::model::{FsError, Ino, Timestamp};
use shoal_fs::op::{self, Failure, Op, Reply};
use shoal_fs::primary::{Config, Flush, Shell, Soft};
pub use shoal_fs::primary::{EVENTS_HOLD, GRACE};
use shoal_fs::replica::FsReplica;
use shoal_fs::tree::Tree;
use shoal_fs::update::{Answer, Update};
use shoal_replicasvc::{Handler, Replicated};
use shoal_rpc::{Context, Server};
use shoal_time::Time;

use crate::FsConfig;
use crate::store::Changes;

mod contents;

type Rep = Replicated<FsReplica>;

/// An RPC request held to be answered later.
pub struct Held {
    server: Arc<Server>,
    request: shoal_rpc::Request,
    /// A durable change (the end of an `fsync`): answered once the log
    /// holds every update applied, on this replica's disk.
    durable: bool,
}

/// Sends the answers a step of the soft state made, each durable one
/// after a sync of `r`'s log through what it applied (made outside the
/// soft state's lock, and shared by the answers that wait for it
/// meanwhile); without the replica (a primary stopping), a durable
/// change's answer is a failure.
fn send(r: Option<&Rep>, answers: Vec<(Held, Result<Reply, Failure>)>) {
    for (h, mut reply) in answers {
        if h.durable && reply.is_ok() {
            let synced = match r {
                Some(r) => r.sync_applied().map_err(|e| e.0),
                None => Err("the primary stopped".to_string()),
            };
            if let Err(e) = synced {
                reply = Err(Failure::Unavailable(e));
            }
        }
        let _ = h.server.putrep(&h.request, op::encode_reply(&reply));
    }
}

/// The metadata service's handler, and the primary's state.
pub struct Primary {
    ctx: Context,
    file_servers: Vec<Capability>,
    copies: usize,
    soft: Mutex<Soft<Held>>,
    files: Mutex<Option<FileClient>>,
    started: Instant,
    stopped: AtomicBool,
}

/// The primary's world, as its soft state sees it: this replica's tree,
/// its group's order, and the file servers.
struct World<'a> {
    r: &'a Rep,
    primary: &'a Primary,
}

impl Shell for World<'_> {
    fn read<T>(&self, f: impl FnOnce(&Tree) -> T) -> T {
        self.r.read(|m| f(&m.tree))
    }

    fn order(&mut self, update: &Update) -> Result<Result<Answer, FsError>, Failure> {
        self.r
            .order(&update.encode())
            .and_then(|(index, result)| {
                self.r.durable(index)?;
                self.r.still_serving()?;
                Ok(result)
            })
            .map_err(|e| Failure::Unavailable(e.0))
    }

    fn wall(&mut self) -> Timestamp {
        let d = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp::new(d.as_secs() as i64, d.subsec_nanos())
    }

    fn secret(&mut self) -> [u8; 16] {
        rand::random()
    }

    fn read_content(
        &mut self,
        content: &[Capability],
        offset: u64,
        len: u32,
    ) -> Result<Vec<u8>, Failure> {
        self.primary.with_files(|f| {
            let (stat, replica) = f.stat(content)?;
            if offset >= stat.size {
                return Ok(Vec::new());
            }
            f.read(&replica, offset, len)
        })
    }

    fn store(&mut self, ino: Ino, flush: &Flush<'_>) -> Result<(Vec<Capability>, u64), Failure> {
        let p = self.primary;
        p.with_files(|f| {
            let base_size = if flush.base.is_empty() {
                0
            } else {
                f.stat(flush.base)?.0.size
            };
            let changes = Changes {
                base: flush.base,
                base_size,
                base_held: flush.base_held,
                overlay: flush.overlay,
                size: flush.size,
            };
            let v = crate::store::store(
                std::slice::from_mut(f),
                &p.file_servers,
                p.copies,
                ino,
                &changes,
                true,
            )?;
            Ok((v.content, v.held))
        })
    }
}

impl Primary {
    pub(crate) fn new(ctx: &Context, cfg: &FsConfig, port: PutPort) -> Primary {
        let copies = cfg.copies.max(1);
        let soft = Soft::new(Config {
            port,
            servers: cfg.file_servers.clone(),
            copies,
            allow_root: cfg.allow_root,
            grace: GRACE,
        });
        Primary {
            ctx: ctx.clone(),
            file_servers: cfg.file_servers.clone(),
            copies,
            soft: Mutex::new(soft),
            files: Mutex::new(None),
            started: Instant::now(),
            stopped: AtomicBool::new(false),
        }
    }

    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let answers = {
            let mut soft = self.soft.lock();
            soft.stop();
            soft.answers()
        };
        send(None, answers);
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// The lease clock: time since this primary started.
    fn now(&self) -> Time {
        Time::ZERO + self.started.elapsed()
    }

    /// The replica's status, with the primary's figures.
    pub fn status(&self, r: &Rep, group_port: bool) -> serde_json::Value {
        let mut s = r.status(group_port);
        let f = self.soft.lock().figures();
        s["primary"] = r.is_sequencer().into();
        s["clients_parked"] = f.clients_parked.into();
        s["requests_waiting"] = f.requests_waiting.into();
        s["changes_noticing"] = f.changes_noticing.into();
        s["requests"] = f.requests.into();
        s["requests_by_kind"] = serde_json::json!(f.requests_by_kind);
        s["locks"] = f.locks.into();
        s
    }

    /// Makes the soft state the current group instance's: a replica that
    /// became the primary starts empty, numbering its grants above every
    /// earlier primary's, in its grace period.
    fn fresh(&self, r: &Rep, soft: &mut Soft<Held>) {
        let epoch = (r.index() as u32).wrapping_add(1);
        soft.start(r.group_instance(), epoch, self.now());
    }

    /// Every 100 ms: the soft state's timers (leases, parked `Events`,
    /// the grace period); a replica that is no longer the primary drops
    /// what it held.
    pub(crate) fn tick(&self, r: &Rep) {
        let answers = {
            let mut soft = self.soft.lock();
            if r.is_sequencer() {
                self.fresh(r, &mut soft);
                let mut world = World { r, primary: self };
                soft.tick(&mut world, self.now());
            } else {
                soft.stop();
            }
            soft.answers()
        };
        send(Some(r), answers);
    }

    fn with_files<T>(
        &self,
        f: impl FnOnce(&mut FileClient) -> Result<T, shoal_bulletsvc::ClientError>,
    ) -> Result<T, Failure> {
        let mut files = self.files.lock();
        if files.is_none() {
            *files = Some(
                FileClient::new(&self.ctx)
                    .map_err(|e| Failure::Unavailable(format!("file client: {e}")))?,
            );
        }
        f(files.as_mut().expect("made above")).map_err(crate::files_failure)
    }
}

fn reply_to(server: &Server, request: &shoal_rpc::Request, reply: &Result<Reply, Failure>) {
    let _ = server.putrep(request, op::encode_reply(reply));
}

impl Handler<FsReplica> for Primary {
    fn serve(&self, r: &Rep, server: &Server, request: shoal_rpc::Request) {
        let answer = |reply: &Result<Reply, Failure>| reply_to(server, &request, reply);
        let req = match op::Request::decode(request.body()) {
            Ok(q) => q,
            Err(e) => {
                tracing::debug!("undecodable request: {e}");
                return answer(&Err(Failure::Fs(FsError::Invalid("undecodable request"))));
            }
        };
        if matches!(req.op, Op::Status) {
            let peer = r.is_peer(request.caller());
            return answer(&Ok(Reply::Status(self.status(r, peer).to_string())));
        }
        if !r.is_sequencer() {
            return answer(&Err(Failure::NotPrimary));
        }
        // Only a node's root (its mount client) may claim identities; a
        // request by capability claims none.
        if request.caller().uid != 0 && !req.op.by_capability() {
            return answer(&Err(Failure::Fs(FsError::Perm)));
        }
        // The end of an fsync: what was answered goes to this replica's
        // disk (it was answered once r + 1 replicas held it in memory), so
        // that losing every replica at once loses none of it; the group
        // re-forms from the replica with the most.
        if matches!(req.op, Op::Sync) {
            let synced = r.sync_applied().map(|()| Reply::Done);
            return answer(&synced.map_err(|e| Failure::Unavailable(e.0)));
        }
        // Touching is file server I/O: made without the soft state's lock.
        if let Op::TouchContents { after } = req.op {
            return answer(&self.touch_contents(r, after));
        }
        let Some(server) = r.server() else {
            return answer(&Err(Failure::Unavailable(
                "the replica stopped serving".into(),
            )));
        };
        let durable = matches!(req.op, Op::Change { durable: true, .. });
        let held = Held {
            server,
            request,
            durable,
        };
        let answers = {
            let mut soft = self.soft.lock();
            self.fresh(r, &mut soft);
            let mut world = World { r, primary: self };
            soft.request(&mut world, self.now(), held, req);
            soft.answers()
        };
        send(Some(r), answers);
    }
}
