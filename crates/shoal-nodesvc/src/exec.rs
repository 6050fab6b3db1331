//! The exec service: runs programs that homes place on this node
//! (`shoal_pool::exec` is the protocol, `docs/pool.md` the model).
//!
//! Each program runs in its own process group, with the environment,
//! working directory, user, group and umask its home sent, and dies with
//! the daemon (`PR_SET_PDEATHSIG`).  Two pump
//! threads move its standard output and error into bounded buffers and
//! stop reading its pipes while a buffer is full, so a program that
//! writes faster than its home reads waits on its pipe; a third waits for
//! its end.  The daemon's periodic [`Exec::sweep`] does the rest: a home
//! that membership reports dead takes its programs with it, and one that
//! stops reading for [`LEASE`] has its program hung up on (SIGHUP, then
//! SIGKILL), as a terminal's hangup would do.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use shoal_pool::ProcId;
use shoal_pool::exec::{Ended, ExecReply, ExecRequest, StartSpec};
use shoal_rpc::Server;

/// Output held per stream before the pipe is left to fill.
const BUFFER: usize = 4 << 20;
/// Longest a read waits for output.
const MAX_WAIT: Duration = Duration::from_secs(2);
/// A program whose home has not read for this long is hung up on.
pub const LEASE: Duration = Duration::from_secs(15);
/// How long a hung-up program has to end before it is killed.
const HANGUP_GRACE: Duration = Duration::from_secs(5);

/// One program's output and end, shared with its pump threads.
#[derive(Default)]
struct Output {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// Streams that reached their end (a terminal counts as both).
    closed: u8,
    /// Stopped by this signal.
    stopped: Option<i32>,
    /// What the last read said of `stopped`.
    stop_told: Option<i32>,
    ended: Option<Ended>,
    /// Nobody will read any more: the pumps stop.
    abandoned: bool,
    /// Reads waiting for something to say, oldest first.
    readers: Vec<Parked>,
}

/// How an answer leaves: back to the request's client (or, in tests, to a
/// channel), from whichever thread has it.
pub type Answer = Box<dyn FnOnce(ExecReply) + Send>;

/// A read with nothing to say yet: answered when output, a stop or the
/// end comes, or empty at `until`.
struct Parked {
    answer: Answer,
    max: usize,
    until: Instant,
}

/// Reads parked per program: more get an empty answer at once.
const MAX_PARKED: usize = 4;
/// Writes queued per program behind the one being written.
const MAX_QUEUED_WRITES: usize = 4;

/// A write for a program's writer thread.
struct Input {
    data: Vec<u8>,
    close: bool,
    answer: Answer,
}

struct Proc {
    /// Its owner, who may read, write and signal it from its home: the uid
    /// it runs as, but root for a remote root's program squashed to
    /// `nobody` (whom it does not belong to).
    uid: u32,
    /// The process group signals go to (see `crate::spawn`).
    group: i32,
    /// A pidfd of the group's leader (the watcher), taken as it started:
    /// signals go through it, so never to a group whose id was reused.
    leader: Option<std::os::fd::OwnedFd>,
    /// Writes go to the thread that owns the program's input (a pipe, or
    /// the terminal's master side); `None` once it was closed.
    input: Option<std::sync::mpsc::SyncSender<Input>>,
    output: Arc<(Mutex<Output>, Condvar)>,
    last_read: Instant,
    /// When the program got SIGHUP for a home that stopped reading.
    hung_up: Option<Instant>,
}

/// Opens a sealed start grant: the node at the other end of the session
/// it names, and its plaintext; or why not.
pub type GrantOpener = dyn Fn(&[u8]) -> Result<(shoal_wire::NodeId, Vec<u8>), String> + Sync;

/// The programs this node runs, by id.
pub struct Exec {
    procs: Mutex<HashMap<ProcId, Proc>>,
    /// This node.
    node: shoal_wire::NodeId,
    /// What root on another node runs as here.
    remote_root: crate::RemoteRoot,
    /// Run programs in PID, UTS and mount namespaces of their own (needs
    /// root; see `crate::spawn`).
    namespaces: bool,
    spawner: Arc<crate::spawn::Spawner>,
    /// Starts the thread that answers parked reads whose wait is over.
    timer: std::sync::Once,
    /// The terminals' master sides, of the programs that have one.
    ttys: Mutex<HashMap<ProcId, File>>,
    /// Ids whose start is under way.
    starting: Mutex<std::collections::HashSet<ProcId>>,
    /// Starts authorized as a remote root squashed to `nobody`, not begun
    /// yet: root of the home owns them, not every `nobody`.
    squashed: Mutex<std::collections::HashSet<ProcId>>,
    /// Requests refused for want of authority.
    refused: std::sync::atomic::AtomicU64,
    /// The nodes' names, to show process ids with.
    names: Arc<crate::names::Names>,
}

/// How often parked reads are checked for the end of their wait.
const TICK: Duration = Duration::from_millis(50);

impl Exec {
    /// An exec service; `namespaces` as in [`crate::spawn::Spawner::spawn`].
    /// Forks its spawner: make it while the process is small.
    pub(crate) fn new(
        namespaces: bool,
        node: shoal_wire::NodeId,
        remote_root: crate::RemoteRoot,
        names: Arc<crate::names::Names>,
    ) -> Result<Exec, String> {
        Ok(Exec {
            procs: Mutex::default(),
            node,
            remote_root,
            namespaces,
            spawner: Arc::new(
                crate::spawn::Spawner::start()
                    .map_err(|e| format!("cannot start the exec service's spawner: {e}"))?,
            ),
            timer: std::sync::Once::new(),
            ttys: Mutex::default(),
            starting: Mutex::default(),
            squashed: Mutex::default(),
            refused: Default::default(),
            names,
        })
    }

    /// The spawner, which the node's services are started through too.
    pub(crate) fn spawner(&self) -> Arc<crate::spawn::Spawner> {
        self.spawner.clone()
    }

    /// How many programs run here (for the load reports).
    pub fn count(&self) -> u32 {
        self.procs.lock().len() as u32
    }

    /// Processor time used so far by this daemon and the programs running
    /// here, in clock ticks (for the load report's foreign share).
    pub fn cpu_jiffies(&self) -> u64 {
        let groups: Vec<u32> = self.procs.lock().values().map(|p| p.group as u32).collect();
        let usage = if groups.is_empty() {
            HashMap::new()
        } else {
            crate::procfs::group_usage()
        };
        // SAFETY: sysconf has no preconditions.
        let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let programs: f64 = groups
            .iter()
            .filter_map(|g| usage.get(g))
            .map(|u| u.cpu_s * tick)
            .sum();
        let own = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| {
                let f: Vec<u64> = s
                    .rsplit_once(')')?
                    .1
                    .split_ascii_whitespace()
                    .skip(11)
                    .take(2)
                    .map(|v| v.parse().ok())
                    .collect::<Option<_>>()?;
                Some(f.iter().sum::<u64>())
            })
            .unwrap_or(0);
        own + programs as u64
    }

    /// The programs running here: id, pid and their process group's use.
    pub fn list(&self) -> Vec<crate::service::RunningProc> {
        let procs: Vec<(ProcId, i32, bool)> = self
            .procs
            .lock()
            .iter()
            .filter_map(|(id, p)| {
                let o = p.output.0.lock();
                o.ended
                    .is_none()
                    .then_some((*id, p.group, o.stopped.is_some()))
            })
            .collect();
        let usage = crate::procfs::group_usage();
        procs
            .into_iter()
            .map(|(id, group, stopped)| {
                let u = usage.get(&(group as u32)).copied().unwrap_or_default();
                crate::service::RunningProc {
                    id: id.to_string(),
                    pid: group as u32,
                    cpu_s: u.cpu_s,
                    rss_kib: u.rss_kib,
                    stopped,
                }
            })
            .collect()
    }

    /// Serves `server` until it closes.  No request holds the thread: a
    /// read with nothing to say waits parked with its program, and a write
    /// waits in its program's writer thread, so programs that never write
    /// or never read cannot starve the service of threads.
    pub fn serve(self: &Arc<Self>, server: &Server, grants: &GrantOpener) {
        while let Ok(request) = server.getreq() {
            let server = server.clone();
            let decoded = ExecRequest::decode(request.body());
            let caller = request.caller();
            let answer: Answer = Box::new(move |reply: ExecReply| {
                // Output leaves as it is, behind its header: no copy.
                let pieces: Vec<bytes::Bytes> = reply
                    .into_pieces()
                    .into_iter()
                    .map(bytes::Bytes::from)
                    .collect();
                let _ = server.putrep(&request, pieces);
            });
            match decoded.map_err(|e| e.to_string()).and_then(|mut r| {
                self.authorize(caller, &mut r, grants)?;
                Ok(r)
            }) {
                Ok(r) => self.dispatch(r, answer),
                Err(e) => answer(ExecReply::Error(e)),
            }
        }
    }

    /// Whether `caller` may ask `request`: only from the process's home,
    /// as its owner or as root there.  A start names its owner, so a user
    /// starts programs only as themselves; everything else is checked
    /// against the owner the start named.  A start runs only with the
    /// start grant its home sealed for this node, and is clamped to it:
    /// the groups and hard limits the program that asked has; a remote
    /// root's start is squashed to `nobody` unless this node allows it.
    /// Refusals are counted.
    pub fn authorize(
        &self,
        caller: shoal_rpc::Caller,
        request: &mut ExecRequest,
        grants: &GrantOpener,
    ) -> Result<(), String> {
        let id = request.id();
        let owner = match request {
            ExecRequest::Start { spec, .. } => Some(spec.uid),
            _ => self.procs.lock().get(&id).map(|p| p.uid),
        };
        let refuse = |why: String| {
            self.refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(why)
        };
        if caller.node != id.home {
            return refuse(format!(
                "process {shown} is run for its home {}; node {} may not ask",
                id.home,
                caller.node,
                shown = self.names.show(id)
            ));
        }
        match owner {
            Some(uid) if caller.uid != 0 && caller.uid != uid => {
                return refuse(format!(
                    "process {shown} is uid {uid}'s; uid {} may not {}",
                    caller.uid,
                    match request {
                        ExecRequest::Start { .. } => "start it",
                        _ => "touch it",
                    },
                    shown = self.names.show(id)
                ));
            }
            // Unknown processes get their own error later.
            _ => {}
        }
        let ExecRequest::Start { spec, grant, .. } = request else {
            return Ok(());
        };
        let (from, plain) = match grants(grant) {
            Ok(opened) => opened,
            Err(e) => {
                return refuse(format!(
                    "process {shown}: its start grant is refused: {e}",
                    shown = self.names.show(id)
                ));
            }
        };
        if from != caller.node {
            return refuse(format!(
                "process {shown}: its start grant is node {from}'s, not its home's",
                shown = self.names.show(id)
            ));
        }
        let checked = shoal_pool::exec::Grant::decode(&plain)
            .map_err(|e| e.to_string())
            .and_then(|g| g.clamp(id, spec));
        if let Err(e) = checked {
            return refuse(format!("process {shown}: {e}", shown = self.names.show(id)));
        }
        if spec.uid == 0
            && caller.node != self.node
            && self.remote_root == crate::RemoteRoot::Squash
        {
            let (uid, gid) = crate::account::nobody();
            spec.uid = uid;
            spec.gid = gid;
            spec.groups = vec![gid];
            self.squashed.lock().insert(id);
        }
        Ok(())
    }

    /// Requests refused by [`Exec::authorize`].
    pub fn refused(&self) -> u64 {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Carries out `request`; its reply goes to `answer`, now or later.
    pub fn dispatch(self: &Arc<Self>, request: ExecRequest, answer: Answer) {
        self.timer.call_once(|| {
            // Holds the service only weakly: it ends with it.
            let exec = Arc::downgrade(self);
            let _ = std::thread::Builder::new()
                .name("exec-timer".into())
                .spawn(move || {
                    while let Some(exec) = exec.upgrade() {
                        exec.expire_reads();
                        drop(exec);
                        std::thread::sleep(TICK);
                    }
                });
        });
        match request {
            ExecRequest::Read { id, max, wait_ms } => self.read(id, max as usize, wait_ms, answer),
            ExecRequest::Write { id, data, close } => self.write(id, data, close, answer),
            other => answer(self.handle(other)),
        }
    }

    /// Hands a write to the program's writer thread, which answers once
    /// the bytes are in the pipe.
    fn write(&self, id: ProcId, data: Vec<u8>, close: bool, answer: Answer) {
        use std::sync::mpsc::TrySendError;
        let mut procs = self.procs.lock();
        let Some(p) = procs.get_mut(&id) else {
            drop(procs);
            return answer(ExecReply::Error(format!(
                "no process {shown} here",
                shown = self.names.show(id)
            )));
        };
        let Some(input) = &p.input else {
            drop(procs);
            return answer(ExecReply::Error(format!(
                "the input of {shown} is closed",
                shown = self.names.show(id)
            )));
        };
        let queued = input.try_send(Input {
            data,
            close,
            answer,
        });
        if close && queued.is_ok() {
            p.input = None;
        }
        drop(procs);
        match queued {
            Ok(()) => {}
            Err(TrySendError::Full(i)) => (i.answer)(ExecReply::Error(format!(
                "the input of {shown} is busy: {MAX_QUEUED_WRITES} writes wait already",
                shown = self.names.show(id)
            ))),
            // The writer ended with the program's input.
            Err(TrySendError::Disconnected(i)) => (i.answer)(ExecReply::Done),
        }
    }

    /// Carries out what never waits: start, resize, signal.
    fn handle(self: &Arc<Self>, request: ExecRequest) -> ExecReply {
        match request {
            ExecRequest::Start { id, spec, .. } => match self.start(id, spec) {
                Ok(pid) => ExecReply::Started { pid },
                Err(e) => ExecReply::Error(e),
            },
            ExecRequest::Read { .. } | ExecRequest::Write { .. } => {
                ExecReply::Error("reads and writes go through dispatch".into())
            }
            ExecRequest::Resize { id, size } => {
                if !self.procs.lock().contains_key(&id) {
                    return ExecReply::Error(format!(
                        "no process {shown} here",
                        shown = self.names.show(id)
                    ));
                }
                let ttys = self.ttys.lock();
                let Some(tty) = ttys.get(&id) else {
                    return ExecReply::Error(format!(
                        "process {shown} has no terminal",
                        shown = self.names.show(id)
                    ));
                };
                match crate::spawn::resize(tty, size) {
                    Ok(()) => ExecReply::Done,
                    Err(e) => ExecReply::Error(format!(
                        "cannot resize the terminal of {shown}: {e}",
                        shown = self.names.show(id)
                    )),
                }
            }
            ExecRequest::Signal { id, signal } => {
                let procs = self.procs.lock();
                let Some(p) = procs.get(&id) else {
                    return ExecReply::Error(format!(
                        "no process {shown} here",
                        shown = self.names.show(id)
                    ));
                };
                // An ended program's group id is free for another's.
                if p.output.0.lock().ended.is_some() {
                    return ExecReply::Error(format!(
                        "process {shown} has ended",
                        shown = self.names.show(id)
                    ));
                }
                let Some(leader) = &p.leader else {
                    return ExecReply::Error(format!(
                        "cannot signal {shown}: it has no pidfd",
                        shown = self.names.show(id)
                    ));
                };
                if signal == libc::SIGSTOP {
                    // SIGSTOP cannot be ignored, not even by the watcher
                    // that leads the group: stop the others one by one,
                    // so that the watcher can report the stop.  Only while
                    // the leader lives: the group is the program's.
                    if crate::procfs::pidfd_signal(leader, 0, false).is_ok() {
                        crate::procfs::signal_members(p.group, signal);
                    }
                    return ExecReply::Done;
                }
                match crate::procfs::pidfd_signal(leader, signal, true) {
                    Ok(()) => ExecReply::Done,
                    Err(e) => ExecReply::Error(format!(
                        "cannot signal {shown}: {e}",
                        shown = self.names.show(id)
                    )),
                }
            }
        }
    }

    /// The periodic check of every program (the daemon runs it every
    /// half second): a program whose home `alive` says is gone is killed,
    /// as nobody is left to read its output, wait for it or signal it; one
    /// whose home has not read for [`LEASE`] (while it was not stopped)
    /// gets SIGHUP, then SIGKILL 5 s later; an ended one nobody read to its end for [`LEASE`] (or whose
    /// home is gone) is forgotten.
    pub fn sweep(&self, alive: impl Fn(shoal_wire::NodeId) -> bool) {
        let mut forgotten: Vec<(ProcId, Vec<Parked>)> = Vec::new();
        let mut procs = self.procs.lock();
        procs.retain(|id, p| {
            let home_alive = alive(id.home);
            // A stopped program's home stops reading too (job control):
            // that is not a hang-up.
            if p.output.0.lock().stopped.is_some() {
                p.last_read = Instant::now();
            }
            let idle = p.last_read.elapsed() > LEASE;
            let group = -p.group;
            if p.output.0.lock().ended.is_some() {
                if !home_alive || idle {
                    let mut o = p.output.0.lock();
                    o.abandoned = true;
                    forgotten.push((*id, std::mem::take(&mut o.readers)));
                    drop(o);
                    p.output.1.notify_all();
                    return false;
                }
                return true;
            }
            if !home_alive {
                tracing::info!(%id, "home gone: killing its program");
                // SAFETY: kill(2) of the program's process group.
                unsafe { libc::kill(group, libc::SIGKILL) };
            } else if idle {
                match p.hung_up {
                    None => {
                        // SAFETY: as above.
                        unsafe { libc::kill(group, libc::SIGHUP) };
                        p.hung_up = Some(Instant::now());
                    }
                    Some(t) if t.elapsed() > HANGUP_GRACE => {
                        // SAFETY: as above.
                        unsafe { libc::kill(group, libc::SIGKILL) };
                    }
                    Some(_) => {}
                }
            }
            true
        });
        drop(procs);
        for (id, readers) in forgotten {
            self.ttys.lock().remove(&id);
            for p in readers {
                (p.answer)(ExecReply::Error(format!(
                    "process {shown} was forgotten",
                    shown = self.names.show(id)
                )));
            }
        }
    }

    fn start(self: &Arc<Self>, id: ProcId, spec: StartSpec) -> Result<u32, String> {
        // The id is taken before anything starts, so two starts of one id
        // at once start one program.
        let owner = if self.squashed.lock().remove(&id) {
            0
        } else {
            spec.uid
        };
        if self.procs.lock().contains_key(&id) || !self.starting.lock().insert(id) {
            return Err(format!(
                "process {shown} is already running here",
                shown = self.names.show(id)
            ));
        }
        let started = self.start_reserved(id, spec, owner);
        self.starting.lock().remove(&id);
        started
    }

    fn start_reserved(
        self: &Arc<Self>,
        id: ProcId,
        spec: StartSpec,
        owner: u32,
    ) -> Result<u32, String> {
        // The working directory is entered (or not) by the program's own
        // process, as the user: no error here tells of a place they cannot
        // see.
        let (spawned, io) = self.spawner.spawn(&spec, self.namespaces)?;
        let output = Arc::new((Mutex::new(Output::default()), Condvar::new()));
        let wake = {
            let (exec, output) = (Arc::downgrade(self), output.clone());
            move || {
                if let Some(exec) = exec.upgrade() {
                    exec.wake(id, &output);
                }
            }
        };
        let (stdin, tty) = match io {
            crate::spawn::Io::Pipes {
                stdin,
                stdout,
                stderr,
            } => {
                pump(stdout, output.clone(), 1, |o| &mut o.stdout, wake.clone());
                pump(stderr, output.clone(), 1, |o| &mut o.stderr, wake.clone());
                (stdin, false)
            }
            crate::spawn::Io::Tty { master } => {
                let reader = master.try_clone().map_err(|e| format!("dup: {e}"))?;
                let writer = master.try_clone().map_err(|e| format!("dup: {e}"))?;
                pump(reader, output.clone(), 2, |o| &mut o.stdout, wake.clone());
                self.ttys.lock().insert(id, master);
                (writer, true)
            }
        };
        let group = spawned.group;
        // The watcher is not reaped before its program ends, which is
        // long after this: the pid is still its own.
        let leader = crate::procfs::pidfd_open(group);
        self.procs.lock().insert(
            id,
            Proc {
                uid: owner,
                group,
                leader,
                input: Some(writer(stdin, tty)),
                output: output.clone(),
                last_read: Instant::now(),
                hung_up: None,
            },
        );
        std::thread::spawn(move || Self::watch(spawned, &output, wake));
        Ok(group as u32)
    }

    /// Follows the program's changes of state until its end.
    fn watch(
        mut spawned: crate::spawn::Spawned,
        output: &(Mutex<Output>, Condvar),
        wake: impl Fn(),
    ) {
        use crate::spawn::Change;
        let (lock, cond) = output;
        let ended = loop {
            match spawned.next_change() {
                Some(Change::Stopped(s)) => lock.lock().stopped = Some(s),
                Some(Change::Continued) => lock.lock().stopped = None,
                Some(Change::Exited(c)) => break Ended::Exited(c),
                Some(Change::Killed(s)) => break Ended::Killed(s),
                // The watcher itself was killed (SIGKILL to the group).
                None => break Ended::Killed(libc::SIGKILL),
            }
            cond.notify_all();
            wake();
        };
        {
            let mut o = lock.lock();
            o.stopped = None;
            o.ended = Some(ended);
        }
        cond.notify_all();
        wake();
    }

    /// Answers a read at once if there is something to say (or it may not
    /// wait), else parks it with the program until there is, or until its
    /// wait is over.
    fn read(&self, id: ProcId, max: usize, wait_ms: u32, answer: Answer) {
        let output = match self.procs.lock().get_mut(&id) {
            Some(p) => {
                p.last_read = Instant::now();
                p.output.clone()
            }
            None => {
                return answer(ExecReply::Error(format!(
                    "no process {shown} here",
                    shown = self.names.show(id)
                )));
            }
        };
        let (lock, cond) = &*output;
        let mut o = lock.lock();
        if wait_ms > 0 && !has_news(&o) && o.readers.len() < MAX_PARKED {
            let wait = Duration::from_millis(wait_ms as u64).min(MAX_WAIT);
            o.readers.push(Parked {
                answer,
                max,
                until: Instant::now() + wait,
            });
            return;
        }
        let reply = take_news(&mut o, max);
        drop(o);
        cond.notify_all();
        self.answered(id, &reply);
        answer(reply);
    }

    /// Something changed for program `id`: its oldest parked read, if any,
    /// is answered now.
    fn wake(&self, id: ProcId, output: &(Mutex<Output>, Condvar)) {
        let (lock, cond) = output;
        let mut o = lock.lock();
        if !has_news(&o) || o.readers.is_empty() {
            return;
        }
        let parked = o.readers.remove(0);
        let reply = take_news(&mut o, parked.max);
        drop(o);
        cond.notify_all();
        self.answered(id, &reply);
        (parked.answer)(reply);
    }

    /// Answers, with nothing, the parked reads whose wait is over.
    fn expire_reads(&self) {
        let now = Instant::now();
        let outputs: Vec<Arc<(Mutex<Output>, Condvar)>> = self
            .procs
            .lock()
            .values()
            .map(|p| p.output.clone())
            .collect();
        for output in outputs {
            let expired: Vec<Parked> = {
                let mut o = output.0.lock();
                let (gone, kept) = std::mem::take(&mut o.readers)
                    .into_iter()
                    .partition(|p| p.until <= now);
                o.readers = kept;
                gone
            };
            for p in expired {
                (p.answer)(ExecReply::Output {
                    stdout: Vec::new(),
                    stderr: Vec::new(),
                    stopped: None,
                    ended: None,
                });
            }
        }
    }

    /// A program whose end was just read to its home is forgotten.
    fn answered(&self, id: ProcId, reply: &ExecReply) {
        if let ExecReply::Output { ended: Some(_), .. } = reply {
            let gone = self.procs.lock().remove(&id);
            self.ttys.lock().remove(&id);
            // Other reads parked on it learn it is gone.
            let others = gone.map_or(Vec::new(), |p| {
                std::mem::take(&mut p.output.0.lock().readers)
            });
            for p in others {
                (p.answer)(ExecReply::Error(format!(
                    "no process {shown} here: its end was read",
                    shown = self.names.show(id)
                )));
            }
        }
    }
}

/// Whether a read has something to say: output, a stop it has not told,
/// or the end once every byte is out.
fn has_news(o: &Output) -> bool {
    !o.stdout.is_empty()
        || !o.stderr.is_empty()
        || o.stopped != o.stop_told
        || (o.closed == 2 && o.ended.is_some())
}

/// What a read answers: up to `max` bytes of each stream, the stop state,
/// and the end once every byte has been read.
fn take_news(o: &mut Output, max: usize) -> ExecReply {
    let take = |v: &mut Vec<u8>| {
        let n = v.len().min(max.max(1));
        if n == v.len() {
            // All of it: no copy (the pump starts a new buffer).
            std::mem::take(v)
        } else {
            // One copy out and one move down, not a byte at a time.
            let head = v[..n].to_vec();
            v.drain(..n);
            head
        }
    };
    let stdout = take(&mut o.stdout);
    let stderr = take(&mut o.stderr);
    let done = o.stdout.is_empty() && o.stderr.is_empty() && o.closed == 2;
    let ended = if done { o.ended } else { None };
    o.stop_told = o.stopped;
    ExecReply::Output {
        stdout,
        stderr,
        stopped: o.stopped,
        ended,
    }
}

/// The thread that owns a program's input: writes what it is handed, in
/// order, and answers each once its bytes are in the pipe (a program that
/// exited closed its end: what it did not read is dropped, as a pipe
/// would).  It ends with the input, closed by a write or by the program's
/// end.
fn writer(mut stdin: File, tty: bool) -> std::sync::mpsc::SyncSender<Input> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Input>(MAX_QUEUED_WRITES);
    std::thread::spawn(move || {
        while let Ok(input) = rx.recv() {
            let _ = stdin.write_all(&input.data);
            if input.close && tty {
                // A terminal's end of input is its EOF character.
                let _ = stdin.write_all(&[4]);
            }
            (input.answer)(ExecReply::Done);
            if input.close {
                break;
            }
        }
    });
    tx
}

/// Moves what `pipe` yields into the buffer `which` picks, waiting while
/// it is full; counts `streams` closed at its end (a terminal's end,
/// EIO once no process holds it, closes both).
fn pump(
    mut pipe: impl Read + Send + 'static,
    output: Arc<(Mutex<Output>, Condvar)>,
    streams: u8,
    which: fn(&mut Output) -> &mut Vec<u8>,
    wake: impl Fn() + Send + 'static,
) {
    std::thread::spawn(move || {
        // Small at first (most programs write little: a megabyte zeroed
        // per stream would cost every program 256 page faults), doubled
        // while reads fill it, up to the pipe's megabyte.
        let mut buf = vec![0u8; 64 << 10];
        let (lock, cond) = &*output;
        loop {
            let n = match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if n == buf.len() && buf.len() < 1 << 20 {
                buf.resize(buf.len() * 2, 0);
            }
            let mut o = lock.lock();
            while which(&mut o).len() >= BUFFER && !o.abandoned {
                cond.wait(&mut o);
            }
            if o.abandoned {
                break;
            }
            which(&mut o).extend_from_slice(&buf[..n]);
            drop(o);
            cond.notify_all();
            wake();
        }
        lock.lock().closed += streams;
        cond.notify_all();
        wake();
    });
}

#[cfg(test)]
mod tests;
