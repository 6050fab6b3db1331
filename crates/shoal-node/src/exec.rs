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
use shoal_cap::GetPort;
use shoal_pool::ProcId;
use shoal_pool::exec::{Ended, ExecReply, ExecRequest, StartSpec};
use shoal_rpc::Server;
use shoal_wire::ClusterKey;

/// The get-port of node `name`'s exec service.
pub fn exec_port(key: &ClusterKey, name: &str) -> GetPort {
    GetPort::derive(key.as_bytes(), &format!("shoal node exec {name}"))
}

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
}

struct Proc {
    /// The process group signals go to (see `crate::spawn`).
    group: i32,
    /// The program's input: a pipe, or the terminal's master side.
    stdin: Option<File>,
    /// The terminal's master side, if it has one.
    tty: Option<File>,
    output: Arc<(Mutex<Output>, Condvar)>,
    last_read: Instant,
    /// When the program got SIGHUP for a home that stopped reading.
    hung_up: Option<Instant>,
}

/// The programs this node runs, by id.
pub struct Exec {
    procs: Mutex<HashMap<ProcId, Proc>>,
    /// Run programs in PID, UTS and mount namespaces of their own (needs
    /// root; see `crate::spawn`).
    namespaces: bool,
    spawner: crate::spawn::Spawner,
}

impl Exec {
    /// An exec service; `namespaces` as in [`crate::spawn::Spawner::spawn`].
    /// Forks its spawner: make it while the process is small.
    pub fn new(namespaces: bool) -> Result<Exec, String> {
        Ok(Exec {
            procs: Mutex::default(),
            namespaces,
            spawner: crate::spawn::Spawner::start()
                .map_err(|e| format!("cannot start the exec service's spawner: {e}"))?,
        })
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
            group_usage()
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
        let usage = group_usage();
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

    /// Serves `server` until it closes.
    pub fn serve(self: &Arc<Self>, server: &Server) {
        while let Ok(request) = server.getreq() {
            let reply = match ExecRequest::decode(request.body()) {
                Ok(r) => self.handle(r),
                Err(e) => ExecReply::Error(e.to_string()),
            };
            // Output leaves as it is, behind its header: no copy.
            let pieces: Vec<bytes::Bytes> = reply
                .into_pieces()
                .into_iter()
                .map(bytes::Bytes::from)
                .collect();
            if server.putrep(&request, pieces).is_err() {
                break;
            }
        }
    }

    fn handle(self: &Arc<Self>, request: ExecRequest) -> ExecReply {
        match request {
            ExecRequest::Start { id, spec } => match self.start(id, spec) {
                Ok(pid) => ExecReply::Started { pid },
                Err(e) => ExecReply::Error(e),
            },
            ExecRequest::Read { id, max, wait_ms } => self.read(id, max as usize, wait_ms),
            ExecRequest::Write { id, data, close } => {
                // Taken out of the table while it blocks on a full pipe.
                let stdin = match self.procs.lock().get_mut(&id) {
                    Some(p) => p.stdin.take(),
                    None => return ExecReply::Error(format!("no process {id} here")),
                };
                let Some(mut stdin) = stdin else {
                    return ExecReply::Error(format!("the input of {id} is closed"));
                };
                // A program that exited closed its end: what it did not
                // read is dropped, as a pipe would.
                let _ = stdin.write_all(&data);
                let tty = self.procs.lock().get(&id).is_some_and(|p| p.tty.is_some());
                if close && tty {
                    // A terminal's end of input is its EOF character.
                    let _ = stdin.write_all(&[4]);
                }
                if !close && let Some(p) = self.procs.lock().get_mut(&id) {
                    p.stdin = Some(stdin);
                }
                ExecReply::Done
            }
            ExecRequest::Resize { id, size } => {
                let procs = self.procs.lock();
                let Some(p) = procs.get(&id) else {
                    return ExecReply::Error(format!("no process {id} here"));
                };
                let Some(tty) = &p.tty else {
                    return ExecReply::Error(format!("process {id} has no terminal"));
                };
                match crate::spawn::resize(tty, size) {
                    Ok(()) => ExecReply::Done,
                    Err(e) => ExecReply::Error(format!("cannot resize the terminal of {id}: {e}")),
                }
            }
            ExecRequest::Signal { id, signal } => {
                let Some(group) = self.procs.lock().get(&id).map(|p| p.group) else {
                    return ExecReply::Error(format!("no process {id} here"));
                };
                if signal == libc::SIGSTOP {
                    // SIGSTOP cannot be ignored, not even by the watcher
                    // that leads the group: stop the others one by one,
                    // so that the watcher can report the stop.
                    for pid in group_members(group) {
                        // SAFETY: kill(2) of a process of the group.
                        unsafe { libc::kill(pid, signal) };
                    }
                    return ExecReply::Done;
                }
                // SAFETY: kill(2) of the program's process group.
                if unsafe { libc::kill(-group, signal) } != 0 {
                    return ExecReply::Error(format!(
                        "cannot signal {id}: {}",
                        std::io::Error::last_os_error()
                    ));
                }
                ExecReply::Done
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
                    p.output.0.lock().abandoned = true;
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
    }

    fn start(self: &Arc<Self>, id: ProcId, spec: StartSpec) -> Result<u32, String> {
        if self.procs.lock().contains_key(&id) {
            return Err(format!("process {id} is already running here"));
        }
        if !std::path::Path::new(&spec.cwd).is_dir() {
            return Err(format!(
                "the working directory {} does not exist on this node",
                spec.cwd
            ));
        }
        let (spawned, io) = self.spawner.spawn(&spec, self.namespaces)?;
        let output = Arc::new((Mutex::new(Output::default()), Condvar::new()));
        let (stdin, tty) = match io {
            crate::spawn::Io::Pipes {
                stdin,
                stdout,
                stderr,
            } => {
                pump(stdout, output.clone(), 1, |o| &mut o.stdout);
                pump(stderr, output.clone(), 1, |o| &mut o.stderr);
                (stdin, None)
            }
            crate::spawn::Io::Tty { master } => {
                let reader = master.try_clone().map_err(|e| format!("dup: {e}"))?;
                let writer = master.try_clone().map_err(|e| format!("dup: {e}"))?;
                pump(reader, output.clone(), 2, |o| &mut o.stdout);
                (writer, Some(master))
            }
        };
        let group = spawned.group;
        self.procs.lock().insert(
            id,
            Proc {
                group,
                stdin: Some(stdin),
                tty,
                output: output.clone(),
                last_read: Instant::now(),
                hung_up: None,
            },
        );
        std::thread::spawn(move || Self::watch(spawned, &output));
        Ok(group as u32)
    }

    /// Follows the program's changes of state until its end.
    fn watch(mut spawned: crate::spawn::Spawned, output: &(Mutex<Output>, Condvar)) {
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
        };
        {
            let mut o = lock.lock();
            o.stopped = None;
            o.ended = Some(ended);
        }
        cond.notify_all();
    }

    fn read(&self, id: ProcId, max: usize, wait_ms: u32) -> ExecReply {
        let output = match self.procs.lock().get_mut(&id) {
            Some(p) => {
                p.last_read = Instant::now();
                p.output.clone()
            }
            None => return ExecReply::Error(format!("no process {id} here")),
        };
        let (lock, cond) = &*output;
        let until = Instant::now() + Duration::from_millis(wait_ms as u64).min(MAX_WAIT);
        let mut o = lock.lock();
        while o.stdout.is_empty()
            && o.stderr.is_empty()
            && o.stopped == o.stop_told
            && !(o.closed == 2 && o.ended.is_some())
        {
            if cond.wait_until(&mut o, until).timed_out() {
                break;
            }
        }
        let take = |v: &mut Vec<u8>| {
            let n = v.len().min(max.max(1));
            if n == v.len() {
                // All of it: no copy (the pump starts a new buffer).
                std::mem::take(v)
            } else {
                v.drain(..n).collect::<Vec<u8>>()
            }
        };
        let stdout = take(&mut o.stdout);
        let stderr = take(&mut o.stderr);
        let done = o.stdout.is_empty() && o.stderr.is_empty() && o.closed == 2;
        let ended = if done { o.ended } else { None };
        o.stop_told = o.stopped;
        let stopped = o.stopped;
        drop(o);
        cond.notify_all();
        if ended.is_some() {
            self.procs.lock().remove(&id);
        }
        ExecReply::Output {
            stdout,
            stderr,
            stopped,
            ended,
        }
    }
}

/// What a process group uses.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    cpu_s: f64,
    rss_kib: u64,
}

/// The use of every process group on this machine, by group id, from
/// `/proc/PID/stat` (processor time and resident pages summed over the
/// group's processes).
fn group_usage() -> HashMap<u32, Usage> {
    // SAFETY: sysconf has no preconditions.
    let (tick, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK).max(1) as f64,
            libc::sysconf(libc::_SC_PAGESIZE).max(1) as u64,
        )
    };
    let mut groups: HashMap<u32, Usage> = HashMap::new();
    each_process(|_, f| {
        let num = |i: usize| f[i].parse::<u64>().unwrap_or(0);
        let u = groups.entry(num(2) as u32).or_default();
        u.cpu_s += (num(11) + num(12)) as f64 / tick;
        u.rss_kib += num(21) * page / 1024;
    });
    groups
}

/// The processes of process group `group` but its leader.
fn group_members(group: i32) -> Vec<i32> {
    let mut members = Vec::new();
    each_process(|pid, f| {
        if f[2].parse::<i32>() == Ok(group) && pid != group {
            members.push(pid);
        }
    });
    members
}

/// Calls `f` with each process's pid and the fields of its
/// `/proc/PID/stat` after the command (state first), 22 at least.
fn each_process(mut f: impl FnMut(i32, &[&str])) {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // The command is in parentheses and may hold anything,
        // parentheses too.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
        if fields.len() >= 22 {
            f(pid, &fields);
        }
    }
}

/// Moves what `pipe` yields into the buffer `which` picks, waiting while
/// it is full; counts `streams` closed at its end (a terminal's end,
/// EIO once no process holds it, closes both).
fn pump(
    mut pipe: impl Read + Send + 'static,
    output: Arc<(Mutex<Output>, Condvar)>,
    streams: u8,
    which: fn(&mut Output) -> &mut Vec<u8>,
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
            cond.notify_all();
        }
        lock.lock().closed += streams;
        cond.notify_all();
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_wire::NodeId;

    fn id(seq: u64) -> ProcId {
        ProcId {
            home: NodeId(1),
            seq,
        }
    }

    fn spec(argv: &[&str], cwd: &str) -> StartSpec {
        StartSpec {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: vec!["PATH=/usr/bin:/bin".into()],
            cwd: cwd.into(),
            // SAFETY: getuid/getgid cannot fail.
            uid: unsafe { libc::getuid() },
            gid: unsafe { libc::getgid() },
            umask: 0o022,
            ..StartSpec::default()
        }
    }

    fn root() -> bool {
        // SAFETY: geteuid cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    /// An exec service as the daemon makes it: namespaces when root.
    fn exec() -> Arc<Exec> {
        Arc::new(Exec::new(root()).unwrap())
    }

    fn start(exec: &Arc<Exec>, id: ProcId, spec: StartSpec) {
        match exec.handle(ExecRequest::Start { id, spec }) {
            ExecReply::Started { .. } => {}
            other => panic!("{other:?}"),
        }
    }

    /// Reads until the end: both streams and how the program ended.
    fn drain(exec: &Arc<Exec>, id: ProcId) -> (Vec<u8>, Vec<u8>, Ended) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        loop {
            match exec.handle(ExecRequest::Read {
                id,
                max: 1 << 20,
                wait_ms: 500,
            }) {
                ExecReply::Output {
                    stdout,
                    stderr,
                    ended,
                    ..
                } => {
                    out.extend(stdout);
                    err.extend(stderr);
                    if let Some(e) = ended {
                        return (out, err, e);
                    }
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_program_runs_with_its_home_s_settings_and_ends() {
        let exec = exec();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        let start = ExecRequest::Start {
            id: id(1),
            spec: spec(&["sh", "-c", "pwd; read x; echo got $x >&2; exit 7"], d),
        };
        assert!(matches!(exec.handle(start), ExecReply::Started { .. }));
        assert_eq!(exec.count(), 1);
        let write = ExecRequest::Write {
            id: id(1),
            data: b"line\n".to_vec(),
            close: true,
        };
        assert_eq!(exec.handle(write), ExecReply::Done);
        let (out, err, ended) = drain(&exec, id(1));
        assert_eq!(out, format!("{d}\n").into_bytes());
        assert_eq!(err, b"got line\n");
        assert_eq!(ended, Ended::Exited(7));
        assert_eq!(
            exec.count(),
            0,
            "an ended program read to its end is forgotten"
        );
    }

    #[test]
    fn what_cannot_start_is_refused_with_the_reason() {
        let exec = exec();
        let refused = |r: ExecReply| match r {
            ExecReply::Error(e) => e,
            other => panic!("{other:?}"),
        };
        let e = refused(exec.handle(ExecRequest::Start {
            id: id(2),
            spec: spec(&["true"], "/no/such/dir"),
        }));
        assert!(
            e.contains("/no/such/dir does not exist on this node"),
            "{e}"
        );
        let e = refused(exec.handle(ExecRequest::Start {
            id: id(3),
            spec: spec(&["no-such-program-anywhere"], "/"),
        }));
        assert!(e.contains("cannot start no-such-program-anywhere"), "{e}");
        let e = refused(exec.handle(ExecRequest::Signal {
            id: id(4),
            signal: 15,
        }));
        assert!(e.contains("no process"), "{e}");
    }

    #[test]
    fn a_program_whose_home_is_gone_is_killed_and_forgotten() {
        let exec = exec();
        let start = ExecRequest::Start {
            id: id(6),
            spec: spec(&["sleep", "30"], "/"),
        };
        assert!(matches!(exec.handle(start), ExecReply::Started { .. }));
        exec.sweep(|_| true);
        assert_eq!(exec.count(), 1, "a live home's program stays");
        exec.sweep(|home| home != NodeId(1));
        let until = Instant::now() + Duration::from_secs(5);
        while exec.count() > 0 {
            assert!(Instant::now() < until, "the program was not forgotten");
            std::thread::sleep(Duration::from_millis(20));
            exec.sweep(|home| home != NodeId(1));
        }
    }

    #[test]
    fn a_signal_reaches_the_program_s_group() {
        let exec = exec();
        let start = ExecRequest::Start {
            id: id(5),
            spec: spec(&["sh", "-c", "sleep 30 & wait"], "/"),
        };
        assert!(matches!(exec.handle(start), ExecReply::Started { .. }));
        let signal = ExecRequest::Signal {
            id: id(5),
            signal: libc::SIGTERM,
        };
        assert_eq!(exec.handle(signal), ExecReply::Done);
        let (_, _, ended) = drain(&exec, id(5));
        assert_eq!(ended, Ended::Killed(libc::SIGTERM));
    }

    #[test]
    fn a_program_gets_its_home_s_host_name_limits_and_a_pid_namespace() {
        let exec = exec();
        let mut spec = spec(
            &[
                "sh",
                "-c",
                "echo $$; hostname; ulimit -n; ulimit -Hn; ps -e -o pid= | wc -l",
            ],
            "/",
        );
        spec.hostname = "home-of-the-test".into();
        spec.rlimits = vec![shoal_pool::exec::Rlimit {
            resource: libc::RLIMIT_NOFILE,
            soft: 77,
            hard: 99,
        }];
        start(&exec, id(7), spec);
        let (out, err, ended) = drain(&exec, id(7));
        assert_eq!(ended, Ended::Exited(0), "{}", String::from_utf8_lossy(&err));
        let out = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(&lines[2..4], ["77", "99"], "limits forwarded: {out}");
        if root() {
            // The watcher is pid 1; the program is 2; ps sees only these
            // two and itself (and the pipe's wc).
            assert_eq!(lines[0], "2", "{out}");
            assert_eq!(lines[1], "home-of-the-test", "{out}");
            assert!(lines[4].trim().parse::<u32>().unwrap() <= 4, "{out}");
        } else {
            assert_ne!(lines[0], "2", "{out}");
            assert_ne!(lines[1], "home-of-the-test", "{out}");
        }
    }

    #[test]
    fn a_program_on_a_terminal_sees_one_and_its_size_changes() {
        let exec = exec();
        let mut spec = spec(
            &[
                "sh",
                "-c",
                "test -t 0 && test -t 1 && echo tty; stty size; read x; stty size; echo got $x",
            ],
            "/",
        );
        spec.tty = Some(shoal_pool::exec::WinSize {
            rows: 30,
            cols: 100,
        });
        start(&exec, id(8), spec);
        // Wait for the first size before changing it.
        let mut out = Vec::new();
        while !String::from_utf8_lossy(&out).contains("30 100") {
            match exec.handle(ExecRequest::Read {
                id: id(8),
                max: 1 << 20,
                wait_ms: 500,
            }) {
                ExecReply::Output { stdout, .. } => out.extend(stdout),
                other => panic!("{other:?}"),
            }
        }
        let resize = ExecRequest::Resize {
            id: id(8),
            size: shoal_pool::exec::WinSize {
                rows: 40,
                cols: 120,
            },
        };
        assert_eq!(exec.handle(resize), ExecReply::Done);
        let write = ExecRequest::Write {
            id: id(8),
            data: b"word\n".to_vec(),
            close: false,
        };
        assert_eq!(exec.handle(write), ExecReply::Done);
        let (rest, err, ended) = drain(&exec, id(8));
        out.extend(rest);
        let out = String::from_utf8_lossy(&out);
        assert!(err.is_empty(), "a terminal is one stream");
        assert_eq!(ended, Ended::Exited(0), "{out}");
        assert!(out.contains("tty\r\n30 100\r\n"), "{out:?}");
        // The terminal echoes the input, then the program's output.
        assert!(out.contains("40 120\r\ngot word\r\n"), "{out:?}");
    }

    #[test]
    fn a_stop_typed_at_the_terminal_is_reported_and_undone() {
        let exec = exec();
        // The stop comes while the shell reads (a stop typed while a shell
        // forks stops the child before its exec, and the shell, blocked in
        // vfork, cannot stop: the same on a local terminal).
        let mut spec = spec(&["sh", "-c", "echo ready; read x; echo done $x"], "/");
        spec.tty = Some(shoal_pool::exec::WinSize { rows: 24, cols: 80 });
        start(&exec, id(9), spec);
        let read = || match exec.handle(ExecRequest::Read {
            id: id(9),
            max: 1 << 20,
            wait_ms: 500,
        }) {
            ExecReply::Output {
                stdout, stopped, ..
            } => (stdout, stopped),
            other => panic!("{other:?}"),
        };
        let mut out = Vec::new();
        while !String::from_utf8_lossy(&out).contains("ready") {
            out.extend(read().0);
        }
        // Ctrl-Z, as a terminal's user types it.
        let ctrl_z = ExecRequest::Write {
            id: id(9),
            data: vec![0x1a],
            close: false,
        };
        assert_eq!(exec.handle(ctrl_z), ExecReply::Done);
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(Instant::now() < until, "the stop was not reported");
            let (o, st) = read();
            out.extend(o);
            if st == Some(libc::SIGTSTP) {
                break;
            }
        }
        let cont = ExecRequest::Signal {
            id: id(9),
            signal: libc::SIGCONT,
        };
        assert_eq!(exec.handle(cont), ExecReply::Done);
        let write = ExecRequest::Write {
            id: id(9),
            data: b"go\n".to_vec(),
            close: false,
        };
        assert_eq!(exec.handle(write), ExecReply::Done);
        let (rest, _, ended) = drain(&exec, id(9));
        assert!(String::from_utf8_lossy(&rest).contains("done go"));
        assert_eq!(ended, Ended::Exited(0));
    }

    #[test]
    fn a_stopped_program_is_not_hung_up_for_its_silent_home() {
        let exec = exec();
        start(&exec, id(10), spec(&["sleep", "30"], "/"));
        let signal = |s| {
            exec.handle(ExecRequest::Signal {
                id: id(10),
                signal: s,
            })
        };
        let stopped = || exec.procs.lock()[&id(10)].output.0.lock().stopped;
        let age = |p: &mut Proc| p.last_read = Instant::now() - 2 * LEASE;
        assert_eq!(signal(libc::SIGSTOP), ExecReply::Done);
        let until = Instant::now() + Duration::from_secs(5);
        while stopped().is_none() {
            assert!(Instant::now() < until, "the stop was not seen");
            std::thread::sleep(Duration::from_millis(10));
        }
        age(exec.procs.lock().get_mut(&id(10)).unwrap());
        exec.sweep(|_| true);
        assert!(
            exec.procs.lock()[&id(10)].hung_up.is_none(),
            "hung up while stopped"
        );
        assert_eq!(signal(libc::SIGCONT), ExecReply::Done);
        while stopped().is_some() {
            assert!(Instant::now() < until, "the continue was not seen");
            std::thread::sleep(Duration::from_millis(10));
        }
        age(exec.procs.lock().get_mut(&id(10)).unwrap());
        exec.sweep(|_| true);
        assert!(
            exec.procs.lock()[&id(10)].hung_up.is_some(),
            "a silent home hangs up"
        );
        let (_, _, ended) = drain(&exec, id(10));
        assert_eq!(ended, Ended::Killed(libc::SIGHUP));
    }
}
