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
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ChildStdin, Command, Stdio};
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
    /// Streams that reached their end.
    closed: u8,
    ended: Option<Ended>,
    /// Nobody will read any more: the pumps stop.
    abandoned: bool,
}

struct Proc {
    pid: u32,
    stdin: Option<ChildStdin>,
    output: Arc<(Mutex<Output>, Condvar)>,
    last_read: Instant,
    /// When the program got SIGHUP for a home that stopped reading.
    hung_up: Option<Instant>,
}

/// The programs this node runs, by id.
#[derive(Default)]
pub struct Exec {
    procs: Mutex<HashMap<ProcId, Proc>>,
}

impl Exec {
    /// How many programs run here (for the load reports).
    pub fn count(&self) -> u32 {
        self.procs.lock().len() as u32
    }

    /// Serves `server` until it closes.
    pub fn serve(self: &Arc<Self>, server: &Server) {
        while let Ok(request) = server.getreq() {
            let reply = match ExecRequest::decode(request.body()) {
                Ok(r) => self.handle(r),
                Err(e) => ExecReply::Error(e.to_string()),
            };
            if server.putrep(&request, reply.encode()).is_err() {
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
                if !close && let Some(p) = self.procs.lock().get_mut(&id) {
                    p.stdin = Some(stdin);
                }
                ExecReply::Done
            }
            ExecRequest::Signal { id, signal } => {
                let Some(pid) = self.procs.lock().get(&id).map(|p| p.pid) else {
                    return ExecReply::Error(format!("no process {id} here"));
                };
                // SAFETY: kill(2) of the program's process group.
                if unsafe { libc::kill(-(pid as i32), signal) } != 0 {
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
    /// whose home has not read for [`LEASE`] gets SIGHUP, then SIGKILL 5 s
    /// later; an ended one nobody read to its end for [`LEASE`] (or whose
    /// home is gone) is forgotten.
    pub fn sweep(&self, alive: impl Fn(shoal_wire::NodeId) -> bool) {
        let mut procs = self.procs.lock();
        procs.retain(|id, p| {
            let home_alive = alive(id.home);
            let idle = p.last_read.elapsed() > LEASE;
            let group = -(p.pid as i32);
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
        let mut cmd = Command::new(&spec.argv[0]);
        cmd.args(&spec.argv[1..])
            .env_clear()
            .envs(spec.env.iter().filter_map(|e| e.split_once('=')))
            .current_dir(&spec.cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .uid(spec.uid)
            .gid(spec.gid);
        let umask = spec.umask;
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                libc::umask(umask as libc::mode_t);
                if libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // A daemon that dies takes its programs with it, as the
                // machine would: none is left without a home to report to.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", spec.argv[0]))?;
        let pid = child.id();
        let output = Arc::new((Mutex::new(Output::default()), Condvar::new()));
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        pump(stdout, output.clone(), |o| &mut o.stdout);
        pump(stderr, output.clone(), |o| &mut o.stderr);
        self.procs.lock().insert(
            id,
            Proc {
                pid,
                stdin: child.stdin.take(),
                output: output.clone(),
                last_read: Instant::now(),
                hung_up: None,
            },
        );
        std::thread::spawn(move || Self::reap(child, &output));
        Ok(pid)
    }

    /// Waits for the program's end and records it.
    fn reap(mut child: Child, output: &(Mutex<Output>, Condvar)) {
        let ended = match child.wait() {
            Ok(status) => match (status.code(), status.signal()) {
                (Some(c), _) => Ended::Exited(c),
                (None, Some(s)) => Ended::Killed(s),
                (None, None) => Ended::Exited(0),
            },
            Err(_) => Ended::Exited(0),
        };
        let (lock, cond) = output;
        lock.lock().ended = Some(ended);
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
        while o.stdout.is_empty() && o.stderr.is_empty() && !(o.closed == 2 && o.ended.is_some()) {
            if cond.wait_until(&mut o, until).timed_out() {
                break;
            }
        }
        let take = |v: &mut Vec<u8>| {
            let n = v.len().min(max.max(1));
            v.drain(..n).collect::<Vec<u8>>()
        };
        let stdout = take(&mut o.stdout);
        let stderr = take(&mut o.stderr);
        let done = o.stdout.is_empty() && o.stderr.is_empty() && o.closed == 2;
        let ended = if done { o.ended } else { None };
        drop(o);
        cond.notify_all();
        if ended.is_some() {
            self.procs.lock().remove(&id);
        }
        ExecReply::Output {
            stdout,
            stderr,
            ended,
        }
    }
}

/// Moves what `pipe` yields into the buffer `which` picks, waiting while
/// it is full; counts the stream closed at its end.
fn pump(
    mut pipe: impl Read + Send + 'static,
    output: Arc<(Mutex<Output>, Condvar)>,
    which: fn(&mut Output) -> &mut Vec<u8>,
) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        let (lock, cond) = &*output;
        loop {
            let n = match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
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
        lock.lock().closed += 1;
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
        let exec = Arc::new(Exec::default());
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
        let exec = Arc::new(Exec::default());
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
        let exec = Arc::new(Exec::default());
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
        let exec = Arc::new(Exec::default());
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
}
