//! A mount's connection to the metadata service: one session, shared by
//! the FUSE threads (its calls are serialized, so request numbers grow in
//! the order the primary sees them, as exactly-once needs), inode numbers
//! handed out in ranges, the opens this mount has of each inode (which a
//! recall's answer reports), and the thread that keeps the session's
//! `Events` request parked at the primary and answers its callbacks.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use shoal_fs::model::{Identity, Ino};
use shoal_fs::op::{Failure, Op, Reply};
use shoal_fs::tokens::{Callback, Level, OpenId};
use shoal_fs::update::{Answer, UpdateOp};
use shoal_fssvc::FsClient;
use shoal_rpc::Context;

/// Inode numbers asked for at a time.
const RANGE: u32 = 1024;

/// The session and what the mount knows of its own opens.
pub(crate) struct Conn {
    client: Mutex<FsClient>,
    node: String,
    /// Inode numbers handed to this mount and not yet used: next, end.
    range: Mutex<(Ino, Ino)>,
    opens: Mutex<HashMap<Ino, Vec<(OpenId, bool)>>>,
    next_open: Mutex<OpenId>,
}

impl Conn {
    /// A session with file system `name`, said hello to.
    pub(crate) fn open(ctx: &Context, name: &str, node: &str) -> Result<Conn, Failure> {
        let mut client = FsClient::new(ctx, name)?;
        client.hello(node)?;
        Ok(Conn {
            client: Mutex::new(client),
            node: node.to_string(),
            range: Mutex::new((0, 0)),
            opens: Mutex::new(HashMap::new()),
            next_open: Mutex::new(0),
        })
    }

    pub(crate) fn session(&self) -> u64 {
        self.client.lock().session()
    }

    /// One call as `who`; a session the primary no longer knows (its lease
    /// ended, or the primary changed) says hello again and the call is
    /// made once more.
    pub(crate) fn call(&self, who: &Identity, op: Op) -> Result<Reply, Failure> {
        let mut c = self.client.lock();
        match c.call(who, op.clone()) {
            Err(Failure::NoSession) => {
                self.again(&mut c)?;
                c.call(who, op)
            }
            other => other,
        }
    }

    /// Starts the session again after the primary forgot it (its lease
    /// ended, or the primary changed): hello, then reclaim every open of
    /// this mount, so the new primary knows who has each file open.
    pub(crate) fn recover(&self) -> Result<(), Failure> {
        self.again(&mut self.client.lock())
    }

    fn again(&self, c: &mut FsClient) -> Result<(), Failure> {
        tracing::info!("the metadata service forgot this mount's session: hello again");
        c.hello(&self.node)?;
        let opens: Vec<(Ino, Vec<(OpenId, bool)>)> = self
            .opens
            .lock()
            .iter()
            .map(|(i, o)| (*i, o.clone()))
            .collect();
        for (ino, opens) in opens {
            let op = Op::Reclaim {
                ino,
                level: Level::None,
                version: None,
                opens,
            };
            match c.call(&Identity::root(), op) {
                Ok(_) | Err(Failure::Fs(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// A change to the tree; its answer, or the tree's refusal.
    pub(crate) fn change(&self, who: &Identity, op: UpdateOp) -> Result<Answer, Failure> {
        match self.call(who, Op::Change { op })? {
            Reply::Updated(result) => result.map_err(Failure::Fs),
            other => Err(shoal_fssvc::client::unexpected(&other)),
        }
    }

    /// A fresh inode number for a new inode.
    pub(crate) fn new_ino(&self) -> Result<Ino, Failure> {
        let mut r = self.range.lock();
        if r.0 >= r.1 {
            match self.change(&Identity::root(), UpdateOp::Range { count: RANGE })? {
                Answer::Range { first, count } => *r = (first, first + u64::from(count)),
                other => {
                    return Err(Failure::Unavailable(format!(
                        "unexpected answer to a range: {other:?}"
                    )));
                }
            }
        }
        r.0 += 1;
        Ok(r.0 - 1)
    }

    /// Numbers a new open of `ino` (not yet recorded).
    pub(crate) fn next_open(&self) -> OpenId {
        let mut n = self.next_open.lock();
        *n += 1;
        *n
    }

    /// This mount's opens of `ino`.
    pub(crate) fn opens_of(&self, ino: Ino) -> Vec<(OpenId, bool)> {
        self.opens.lock().get(&ino).cloned().unwrap_or_default()
    }

    pub(crate) fn record_open(&self, ino: Ino, id: OpenId, write: bool) {
        self.opens.lock().entry(ino).or_default().push((id, write));
    }

    pub(crate) fn forget_open(&self, ino: Ino, id: OpenId) {
        let mut opens = self.opens.lock();
        if let Some(list) = opens.get_mut(&ino) {
            list.retain(|(i, _)| *i != id);
            if list.is_empty() {
                opens.remove(&ino);
            }
        }
    }
}

/// The thread that keeps the session's `Events` request parked at the
/// primary: a recall is answered at once, from this thread's own client
/// (this client keeps no cache yet, so it gives every token up, reporting
/// its opens), a notice confirmed with the next request.
pub(crate) struct Events {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Events {
    pub(crate) fn start(ctx: &Context, name: &str, conn: Arc<Conn>) -> Result<Events, Failure> {
        let mut poller = FsClient::for_session(ctx, name, conn.session())?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("fs-events".into())
            .spawn(move || {
                let mut confirm = Vec::new();
                while !flag.load(Ordering::Relaxed) {
                    let op = Op::Events {
                        confirm: std::mem::take(&mut confirm),
                    };
                    let list =
                        match poller.call_within(&Identity::root(), op, Duration::from_secs(5)) {
                            Ok(Reply::Events(list)) => list,
                            Err(Failure::NoSession) => {
                                if let Err(e) = conn.recover() {
                                    tracing::warn!("starting the session again failed: {e}");
                                }
                                continue;
                            }
                            _ => {
                                std::thread::sleep(Duration::from_millis(200));
                                continue;
                            }
                        };
                    for cb in list {
                        match cb {
                            Callback::Recall { ino, grant, .. } => {
                                let back = Op::Return {
                                    ino,
                                    grant,
                                    kept: Level::None,
                                    opens: conn.opens_of(ino),
                                };
                                // On this thread's own client: a FUSE thread
                                // may hold the session's, waiting at the
                                // primary for this very recall's answer.
                                if let Err(e) = poller.call(&Identity::root(), back) {
                                    tracing::warn!("answering a recall of {ino} failed: {e}");
                                }
                            }
                            Callback::Notice { id, .. } => confirm.push(id),
                            Callback::StopCaching { .. } => {}
                        }
                    }
                }
            })
            .map_err(|e| Failure::Unavailable(format!("cannot start a thread: {e}")))?;
        Ok(Events {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
