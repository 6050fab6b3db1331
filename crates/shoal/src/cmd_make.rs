//! `shoal make`: GNU make with every recipe command placed on a node of
//! the cluster through the processor pool (Sprite's pmake).
//!
//! make runs here, as it would, with one change: its `SHELL` is shoal's
//! make shell (`shoal-make-shell`, a small program next to this one), so
//! each recipe line, whatever it runs, is handed to this process, which
//! runs it as `shoal run --any --wait` would (`--retry` too: a recipe
//! remade after its node's loss is what make itself would do on a rerun),
//! keeping its links to the home and its RPC clients from line to line.
//! The line's standard streams are the make shell's own (passed over the
//! socket), and its end becomes the make shell's.  The recipe runs under
//! the real shell
//! (`--shell`, `/bin/sh` by default) with the flags make gives its shell
//! (`.SHELLFLAGS`, so `.ONESHELL` and `-e` keep their meaning); its exit
//! status is the recipe's, so `-k`, `-i` and errors behave as ever; make's
//! `--output-sync=target` keeps each job's output together.  A recursive
//! make (a recipe line make hands its jobserver, `$(MAKE)` or `+`) runs
//! here, sharing the jobserver, and its own recipes go to the cluster.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use parking_lot::Mutex;
use shoal_nodesvc::NodeStatus;
use shoal_nodesvc::fdpass::{self, frame};
use shoal_pool::ProcId;
use shoal_pool::exec::{Ended, ExecReply, ExecRequest, LineEnded, StartSpec};
use shoal_rpc::{Client, Context, HomeLink};

use crate::Failure;
use shoal_poolsvc::{self as run, Outcome, RunOptions, Shared, Sink};

/// The make shell: a program of its own, next to this one.
const SHELL_NAME: &str = "shoal-make-shell";
/// Where the make shell finds this process.
const SOCKET_ENV: &str = "SHOAL_MAKE_SOCKET";
/// The real shell, for the lines the make shell runs itself.
const SHELL_ENV: &str = "SHOAL_MAKE_SHELL";
/// The largest line description the make shell may hand over.
const MAX_LINE: usize = 64 << 20;

#[derive(Args)]
pub struct MakeArgs {
    /// Jobs at once (default: the cores of every live node together).
    #[arg(short = 'j', long = "jobs")]
    pub jobs: Option<u32>,
    /// The shell recipes run under (a makefile's own SHELL gives way to
    /// shoal's, which runs this one on the chosen node).
    #[arg(long, default_value = "/bin/sh")]
    pub shell: String,
    /// Start a recipe again on another node up to N times if its node is
    /// lost.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub retry: u32,
    /// The make program.
    #[arg(long, default_value = "make")]
    pub make: String,
    /// Arguments for make (targets, -k, -C DIR, VAR=value, ...).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

pub fn run(mut args: MakeArgs) -> Result<(), Failure> {
    // A -j among make's arguments (after one of make's own flags, clap
    // leaves it there) is ours too.
    let (jobs, rest) = take_jobs(&args.args);
    args.args = rest;
    if args.jobs.or(jobs) == Some(0) {
        return Err(Failure::failed("-j takes at least 1"));
    }
    let exe = std::env::current_exe().map_err(|e| Failure::failed(format!("where am I: {e}")))?;
    let shell = exe.with_file_name(SHELL_NAME);
    if !shell.exists() {
        return Err(Failure::failed(format!(
            "{} is missing: it is built and installed with shoal",
            shell.display()
        )));
    }
    let (ctx, jobs) = match args.jobs.or(jobs) {
        Some(j) => (
            Context::from_env().map_err(|e| Failure::unreachable(format!("no node: {e}")))?,
            j,
        ),
        None => {
            let (ctx, status) = crate::cmd_ps::local()?;
            (ctx, cluster_cores(&status))
        }
    };
    let dir = SocketDir::new()?;
    let listener = UnixListener::bind(&dir.socket)
        .map_err(|e| Failure::failed(format!("cannot listen on {}: {e}", dir.socket.display())))?;
    let (wake_r, wake_w) =
        std::io::pipe().map_err(|e| Failure::failed(format!("cannot make a pipe: {e}")))?;
    let lines = Arc::new(Lines {
        ctx,
        shell: args.shell.clone(),
        retry: args.retry,
        runners: Mutex::new(Vec::new()),
        clients: Mutex::new(Vec::new()),
        running: Mutex::new(HashMap::new()),
        watch: Mutex::new(Vec::new()),
        wake: wake_w,
    });
    let (serving, watching) = (lines.clone(), lines.clone());
    std::thread::spawn(move || serving.serve(listener));
    std::thread::spawn(move || watching.watch(wake_r));
    let mut make = Command::new(&args.make);
    make.arg(format!("-j{jobs}"));
    let synced = args
        .args
        .iter()
        .any(|a| a.starts_with("-O") || a.starts_with("--output-sync"));
    if !synced {
        make.arg("--output-sync=target");
    }
    make.arg(format!("SHELL={}", shell.display()))
        .args(&args.args)
        .env(SOCKET_ENV, &dir.socket)
        .env(SHELL_ENV, &args.shell);
    eprintln!("shoal make: {jobs} jobs at once over the cluster");
    let mut child = make
        .spawn()
        .map_err(|e| Failure::failed(format!("cannot run {}: {e}", args.make)))?;
    // Each running line holds a few descriptors here: as many as the
    // limit allows (make and its lines keep the limit they had).
    raise_open_files();
    lines.follow_signals(child.id() as libc::pid_t)?;
    let status = child
        .wait()
        .map_err(|e| Failure::failed(format!("{}: {e}", args.make)))?;
    drop(dir);
    match (status.code(), status.signal()) {
        (Some(0), _) => Ok(()),
        (Some(code), _) => std::process::exit(code),
        // make was killed (its lines with it): so is this process.
        (None, Some(sig)) => {
            let _ = signal_hook::low_level::emulate_default_handler(sig);
            std::process::exit(128 + sig)
        }
        (None, None) => Err(Failure::failed(format!("{} ended: {status}", args.make))),
    }
}

/// What this process keeps to run make's recipe lines on the cluster.
struct Lines {
    ctx: Context,
    /// The real shell.
    shell: String,
    /// `--retry` for every line (a line remade after its node's loss is
    /// what make itself would do on a rerun).
    retry: u32,
    /// Links to the home and clients, kept from line to line.
    runners: Mutex<Vec<Runner>>,
    /// Clients for signals and input.
    clients: Mutex<Vec<Client>>,
    /// The lines whose programs run, by process id.
    running: Mutex<HashMap<ProcId, Arc<Shared>>>,
    /// Connections of lines for the watcher to add.
    watch: Mutex<Vec<(UnixStream, Arc<Line>)>>,
    /// Wakes the watcher.
    wake: std::io::PipeWriter,
}

/// A link to the home and a client to run one line at a time.
struct Runner {
    home: HomeLink,
    client: Client,
}

/// One line, as its thread and the watcher of its make shell share it.
#[derive(Default)]
struct Line {
    state: Mutex<LineState>,
}

#[derive(Default)]
struct LineState {
    /// Its program, once started: signals then go to it.
    started: Option<Arc<Shared>>,
    /// Signals that came before.
    pending: Vec<i32>,
    /// The signal that ended it while it waited for a node.
    cancelled: Option<i32>,
    /// Its end was told to its make shell.
    done: bool,
}

impl Lines {
    /// Accepts the make shells: each connection hands over one line with
    /// its standard streams, then the signals for it.
    fn serve(self: Arc<Self>, listener: UnixListener) {
        // A closed output of a line (its reader left) is an error on the
        // write, passed on to the program as SIGPIPE, not the end of this
        // process; the threads started from here inherit the mask, make
        // does not.
        // SAFETY: a local sigset; pthread_sigmask on this thread.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
        for conn in listener.incoming() {
            match conn {
                Ok(conn) => {
                    let lines = self.clone();
                    std::thread::spawn(move || lines.connection(conn));
                }
                // Out of descriptors, say: the shell's connection waits in
                // the backlog meanwhile.
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    fn connection(&self, mut conn: UnixStream) {
        let Some((body, fds)) = fdpass::receive(conn.as_raw_fd(), MAX_LINE) else {
            return;
        };
        // SAFETY: the fds came with the message and are ours alone.
        let fds: Vec<OwnedFd> = fds
            .into_iter()
            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
            .collect();
        match (ExecRequest::decode(&body), <[OwnedFd; 3]>::try_from(fds)) {
            (Ok(ExecRequest::Start { spec, .. }), Ok(stdio)) => self.line(conn, spec, stdio),
            (request, stdio) => {
                let why = match request {
                    Err(e) => e.to_string(),
                    Ok(_) => "not a line with its three streams".to_string(),
                };
                if let Ok([_, _, stderr]) = stdio {
                    let _ = writeln!(File::from(stderr), "shoal make: cannot run the line: {why}");
                }
                let ended = Ended::Exited(i32::from(run::NOT_STARTED));
                let _ = conn.write_all(&frame(&LineEnded(ended).encode()));
            }
        }
    }

    /// Runs one recipe line on the cluster, as `shoal run --any --wait`
    /// would, its streams being the make shell's.
    fn line(&self, mut conn: UnixStream, mut spec: StartSpec, stdio: [OwnedFd; 3]) {
        let [stdin, stdout, stderr] = stdio;
        let mut stderr = File::from(stderr);
        spec.argv = recipe_command(std::mem::take(&mut spec.argv), &self.shell);
        let args = RunOptions {
            on: None,
            any: true,
            mem_mib: 0,
            allow_owner_active: false,
            wait: true,
            retry: self.retry,
            tty: false,
            command: spec.argv.clone(),
        };
        let line = Arc::new(Line::default());
        if let Ok(watched) = conn.try_clone() {
            // A shell sends whole frames; one that stops halfway is taken
            // for gone.
            let _ = watched.set_read_timeout(Some(Duration::from_secs(1)));
            self.watch.lock().push((watched, line.clone()));
            let _ = (&self.wake).write_all(&[1]);
        }
        let ended = self.run_line(&line, &args, &spec, stdin, stdout, &mut stderr);
        line.state.lock().done = true;
        let _ = conn.write_all(&frame(&LineEnded(ended).encode()));
    }

    /// The line's run, to its end.
    fn run_line(
        &self,
        line: &Arc<Line>,
        args: &RunOptions,
        spec: &StartSpec,
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: &mut File,
    ) -> Ended {
        let not_started = |stderr: &mut File, message: String| {
            let _ = writeln!(stderr, "shoal make: {message}");
            Ended::Exited(i32::from(run::NOT_STARTED))
        };
        let mut runner = match self.runner() {
            Ok(r) => r,
            Err(e) => return not_started(stderr, e),
        };
        let cancelled = || line.state.lock().cancelled;
        let (id, node, grant) = match run::spawn(&mut runner.home, args, "shoal make", &|| {
            cancelled().is_some()
        }) {
            Ok(spawned) => spawned,
            Err(e) => {
                return match cancelled() {
                    // A signal ended it before it ran anywhere.
                    Some(sig) => Ended::Killed(sig),
                    None => not_started(stderr, e),
                };
            }
        };
        let shared = Arc::new(Shared::new(&self.ctx, id, (&node, grant), "shoal make"));
        let done = Arc::new(AtomicBool::new(false));
        let mut stdin = Some(stdin);
        let mut sink = FileSink {
            out: File::from(stdout),
            err: stderr.try_clone().ok(),
            closed: false,
        };
        let outcome = run::supervise(
            &self.ctx,
            &mut runner.home,
            &mut runner.client,
            &shared,
            args,
            spec,
            node,
            &mut |client| {
                self.running.lock().insert(id, shared.clone());
                let pending = {
                    let mut state = line.state.lock();
                    state.started = Some(shared.clone());
                    std::mem::take(&mut state.pending)
                };
                let port = *shared.port.lock();
                for sig in pending {
                    let _ = run::call(client, &port, &run::signal(id, sig));
                }
                match stdin.take() {
                    Some(fd) => self.input(client, &shared, fd, &done),
                    None => Ok(()),
                }
            },
            &mut sink,
        );
        done.store(true, Ordering::Release);
        self.running.lock().remove(&id);
        match runner.home.ended(&id.to_string(), outcome.end()) {
            Ok(()) => self.runners.lock().push(runner),
            Err(e) => {
                let home = self
                    .ctx
                    .config()
                    .node
                    .as_ref()
                    .map(|(_, name)| name.as_str());
                let shown = id.named(home);
                tracing::warn!("cannot tell the home how {shown} ended: {e}")
            }
        }
        match outcome {
            Outcome::Ended(ended) => ended,
            Outcome::NotStarted(e) => not_started(stderr, format!("{} on {e}", args.command[0])),
            Outcome::Lost(e) => {
                let _ = writeln!(stderr, "shoal make: {e}");
                Ended::Exited(i32::from(run::NODE_LOST))
            }
        }
    }

    /// A runner kept from an earlier line (whose link the node has not
    /// closed meanwhile), or a new one.
    fn runner(&self) -> Result<Runner, String> {
        loop {
            let Some(r) = self.runners.lock().pop() else {
                break;
            };
            if !r.home.is_closed() {
                return Ok(r);
            }
        }
        let no_node = |e: shoal_rpc::Error| format!("no node: {e}");
        Ok(Runner {
            home: self.ctx.home().map_err(no_node)?,
            client: self.ctx.client().map_err(no_node)?,
        })
    }

    /// A client kept for signals and input, or a new one.
    fn client(&self) -> Result<Client, String> {
        let kept = self.clients.lock().pop();
        match kept {
            Some(c) => Ok(c),
            None => self.ctx.client().map_err(|e| e.to_string()),
        }
    }

    /// Passes signal `sig` on to a running program.
    fn signal(&self, shared: &Shared, sig: i32) {
        let Ok(mut client) = self.client() else {
            return;
        };
        let port = *shared.port.lock();
        let _ = run::call(&mut client, &port, &run::signal(shared.id, sig));
        self.clients.lock().push(client);
    }

    /// Watches the make shells of running lines: a signal one passes on
    /// goes to its line's program (or waits for it to start; a line still
    /// waiting for a node ends at once); a shell that dies (its connection
    /// closes before its line ended) has its line's program killed, as a
    /// home hangs up on the programs of a `shoal run` that died.
    fn watch(self: Arc<Self>, wake: std::io::PipeReader) {
        let mut watched: Vec<(UnixStream, Arc<Line>)> = Vec::new();
        loop {
            watched.append(&mut self.watch.lock());
            let mut fds: Vec<libc::pollfd> = watched
                .iter()
                .map(|(s, _)| s.as_raw_fd())
                .chain([wake.as_raw_fd()])
                .map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            // SAFETY: poll over live pollfds.
            if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) } < 0 {
                continue;
            }
            if fds[watched.len()].revents != 0 {
                let _ = (&wake).read(&mut [0u8; 64]);
            }
            let mut gone = Vec::new();
            for (i, f) in fds[..watched.len()].iter().enumerate() {
                if f.revents == 0 {
                    continue;
                }
                let (stream, line) = &watched[i];
                match next_signal(stream) {
                    Some(sig) => self.line_signal(line, sig),
                    None => {
                        gone.push(i);
                        self.line_signal(line, libc::SIGKILL);
                    }
                }
            }
            for i in gone.into_iter().rev() {
                watched.swap_remove(i);
            }
        }
    }

    /// Signal `sig` for `line`.
    fn line_signal(&self, line: &Line, sig: i32) {
        let mut state = line.state.lock();
        if state.done {
            return;
        }
        match state.started.clone() {
            Some(shared) => {
                drop(state);
                self.signal(&shared, sig);
            }
            None => {
                state.pending.push(sig);
                state.cancelled.get_or_insert(sig);
            }
        }
    }

    /// Passes make's standard input for a line on to it.  Most lines get
    /// an input that ends at once (make gives its input to one job at a
    /// time): that is said at once; any other is copied by a thread of
    /// its own until it ends or the line does.
    fn input(
        &self,
        client: &mut Client,
        shared: &Arc<Shared>,
        stdin: OwnedFd,
        done: &Arc<AtomicBool>,
    ) -> Result<(), String> {
        let mut stdin = File::from(stdin);
        let mut first = Vec::new();
        if run::readable(stdin.as_raw_fd(), 0) {
            let mut probe = [0u8; 1];
            if let Ok(0) = stdin.read(&mut probe) {
                let port = *shared.port.lock();
                let close = ExecRequest::Write {
                    id: shared.id,
                    data: Vec::new(),
                    close: true,
                };
                // A node lost meanwhile shows in the line's next read.
                let _ = run::call(client, &port, &close);
                return Ok(());
            }
            // A byte was read: it goes first.
            first = probe.to_vec();
        }
        let client = self.client()?;
        run::copy_input(client, shared.clone(), stdin, first, Some(done.clone()));
        Ok(())
    }

    /// Signals to this process: a stop (Ctrl-Z at make's terminal) stops
    /// the running lines and then this process, and a continue continues
    /// both; any other goes to make, which passes it on to its lines'
    /// shells and ends as it would.
    fn follow_signals(self: &Arc<Self>, make: libc::pid_t) -> Result<(), Failure> {
        let mut wanted = shoal_poolsvc::settings::FORWARDED.to_vec();
        wanted.extend([libc::SIGTSTP, libc::SIGCONT]);
        let mut signals = signal_hook::iterator::Signals::new(wanted)
            .map_err(|e| Failure::failed(format!("cannot handle signals: {e}")))?;
        let lines = self.clone();
        std::thread::spawn(move || {
            let all = |sig: i32| {
                let running: Vec<Arc<Shared>> = lines.running.lock().values().cloned().collect();
                for shared in running {
                    lines.signal(&shared, sig);
                }
            };
            loop {
                let mut got: Vec<i32> = signals.wait().collect();
                while !got.is_empty() {
                    let sig = got.remove(0);
                    match sig {
                        libc::SIGTSTP => {
                            all(libc::SIGTSTP);
                            // A continue that came meanwhile (a quick
                            // `fg`) undoes the stop instead of finding
                            // this process running.
                            got.extend(signals.pending());
                            if let Some(at) = got.iter().position(|&s| s == libc::SIGCONT) {
                                got.remove(at);
                                all(libc::SIGCONT);
                            } else {
                                // SAFETY: kill(2) of ourselves.
                                unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
                            }
                        }
                        libc::SIGCONT => all(libc::SIGCONT),
                        // SAFETY: kill(2) of our child.
                        _ => unsafe {
                            libc::kill(make, sig);
                        },
                    }
                }
            }
        });
        Ok(())
    }
}

/// The next signal a make shell passes on; `None` once it is gone (or
/// says something else).
fn next_signal(stream: &UnixStream) -> Option<i32> {
    let body = fdpass::receive_plain(stream.as_raw_fd(), 64)?;
    match ExecRequest::decode(&body) {
        Ok(ExecRequest::Signal { signal, .. }) => Some(signal),
        _ => None,
    }
}

/// Raises this process's soft limit of open files to its hard limit.
fn raise_open_files() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills `l`; setrlimit reads it.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

/// A line's output written to the make shell's stdout and stderr.
struct FileSink {
    out: File,
    err: Option<File>,
    closed: bool,
}

impl Sink for FileSink {
    fn deliver(&mut self, reply: Vec<u8>) {
        let Ok(Some(o)) = ExecReply::decode_output(&reply) else {
            return;
        };
        if !o.stdout.is_empty() && self.out.write_all(o.stdout).is_err() {
            self.closed = true;
        }
        if let Some(err) = &mut self.err
            && !o.stderr.is_empty()
        {
            let _ = err.write_all(o.stderr);
        }
    }

    fn closed(&self) -> bool {
        self.closed
    }
}

/// What runs for a line the make shell got as `FLAGS... LINE`: the line's
/// words alone when it needs no shell (as make itself runs such lines
/// when its shell is /bin/sh), the real shell with them otherwise.
fn recipe_command(args: Vec<String>, shell: &str) -> Vec<String> {
    match simple_command(&args) {
        Some(words) if shell == "/bin/sh" => words,
        _ => {
            let mut command = vec![shell.to_string()];
            command.extend(args);
            command
        }
    }
}

/// `-jN`, `-j N`, `--jobs=N` or `--jobs N` taken out of make's
/// arguments (the last one counts), and the rest.
fn take_jobs(args: &[String]) -> (Option<u32>, Vec<String>) {
    let mut jobs = None;
    let mut rest = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let next = args.get(i + 1).and_then(|n| n.parse::<u32>().ok());
        let inline = a
            .strip_prefix("-j")
            .or_else(|| a.strip_prefix("--jobs="))
            .filter(|n| !n.is_empty())
            .and_then(|n| n.parse::<u32>().ok());
        if let Some(n) = inline {
            jobs = Some(n);
        } else if (a == "-j" || a == "--jobs") && next.is_some() {
            jobs = next;
            i += 1;
        } else {
            rest.push(a.clone());
        }
        i += 1;
    }
    (jobs, rest)
}

/// The cores of every live node that reported its load.
fn cluster_cores(status: &NodeStatus) -> u32 {
    let cores: u32 = status
        .members
        .iter()
        .filter(|m| m.alive)
        .filter_map(|m| m.load.as_ref().map(|l| u32::from(l.cores)))
        .sum();
    cores.max(1)
}

/// A private directory holding this process's socket, removed when
/// dropped.
struct SocketDir {
    dir: PathBuf,
    socket: PathBuf,
}

impl SocketDir {
    fn new() -> Result<SocketDir, Failure> {
        let dir = std::env::temp_dir().join(format!(
            "shoal-make-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir(&dir)
            .and_then(|()| {
                std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            })
            .map_err(|e| Failure::failed(format!("cannot make {}: {e}", dir.display())))?;
        let socket = dir.join("make.sock");
        Ok(SocketDir { dir, socket })
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The words of `-c COMMAND` when COMMAND needs no shell: nothing but
/// words of plain characters (no quoting, expansion, redirection, globbing
/// or separators).
fn simple_command(args: &[String]) -> Option<Vec<String>> {
    let [flag, command] = args else { return None };
    if flag != "-c" {
        return None;
    }
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./,+:@".contains(c) || c == ' ';
    if !command.chars().all(plain) {
        return None;
    }
    let words: Vec<String> = command
        .split(' ')
        .filter(|w| !w.is_empty())
        .map(String::from)
        .collect();
    // A word that is a shell keyword or assignment needs the shell too.
    let first = words.first()?;
    if [
        "if", "for", "while", "case", "until", "exec", "cd", "export", "set", "exit", ".", "eval",
    ]
    .contains(&first.as_str())
    {
        return None;
    }
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_words_skip_the_shell() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            simple_command(&v(&["-c", "cc -O2 -c lapi.c -o lapi.o"])),
            Some(v(&["cc", "-O2", "-c", "lapi.c", "-o", "lapi.o"]))
        );
        for needs_shell in [
            "echo $HOME",
            "a && b",
            "x > y",
            "echo 'q'",
            "ls *.c",
            "cd sub",
            "A=1 cc",
            "",
        ] {
            assert_eq!(
                simple_command(&v(&["-c", needs_shell])),
                None,
                "{needs_shell}"
            );
        }
        assert_eq!(simple_command(&v(&["-ec", "cc x.c"])), None);
        assert_eq!(
            recipe_command(v(&["-c", "cc -c x.c"]), "/bin/sh"),
            v(&["cc", "-c", "x.c"])
        );
        assert_eq!(
            recipe_command(v(&["-c", "cc -c x.c"]), "/bin/bash"),
            v(&["/bin/bash", "-c", "cc -c x.c"])
        );
        assert_eq!(
            recipe_command(v(&["-ec", "a && b"]), "/bin/sh"),
            v(&["/bin/sh", "-ec", "a && b"])
        );
    }

    #[test]
    fn jobs_are_found_among_make_s_arguments() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            take_jobs(&v(&["-k", "-j3", "all"])),
            (Some(3), v(&["-k", "all"]))
        );
        assert_eq!(take_jobs(&v(&["-j", "4", "x"])), (Some(4), v(&["x"])));
        assert_eq!(take_jobs(&v(&["--jobs=5"])), (Some(5), v(&[])));
        assert_eq!(take_jobs(&v(&["--jobs", "6", "-j2"])), (Some(2), v(&[])));
        // make's unlimited -j, and targets that look like numbers, stay.
        assert_eq!(take_jobs(&v(&["-j", "all"])), (None, v(&["-j", "all"])));
        assert_eq!(take_jobs(&v(&["7"])), (None, v(&["7"])));
    }
}
