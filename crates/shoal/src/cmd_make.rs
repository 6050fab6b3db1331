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
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use parking_lot::Mutex;
use shoal_node::{NodeRequest, NodeStatus, ask};
use shoal_pool::ProcId;
use shoal_pool::exec::{Ended, ExecReply, ExecRequest, ShellEvent, StartSpec};
use shoal_rpc::{Client, Context, HomeLink};

use crate::Failure;
use crate::cmd_run::{self, Outcome, RunArgs, Shared, Sink};

/// The make shell: a program of its own, next to this one.
const SHELL_NAME: &str = "shoal-make-shell";
/// Where the make shell finds this process.
const SOCKET_ENV: &str = "SHOAL_MAKE_SOCKET";
/// The real shell, for the lines the make shell runs itself.
const SHELL_ENV: &str = "SHOAL_MAKE_SHELL";
/// The largest line description the make shell may hand over.
const MAX_LINE: usize = 64 << 20;
/// How often a job's input forwarder looks whether its job ended.
const INPUT_POLL_MS: i32 = 200;

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
    let ctx = Context::from_env().map_err(|e| Failure::unreachable(format!("no node: {e}")))?;
    let jobs = match args.jobs.or(jobs) {
        Some(j) => j,
        None => cluster_cores(&ctx)?,
    };
    let dir = SocketDir::new()?;
    let listener = UnixListener::bind(&dir.socket)
        .map_err(|e| Failure::failed(format!("cannot listen on {}: {e}", dir.socket.display())))?;
    let lines = Arc::new(Lines {
        ctx,
        shell: args.shell.clone(),
        retry: args.retry,
        runners: Mutex::new(Vec::new()),
        clients: Mutex::new(Vec::new()),
        jobs: Mutex::new(HashMap::new()),
    });
    {
        let lines = lines.clone();
        std::thread::spawn(move || lines.serve(listener));
    }
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
    /// The lines running, by process id.
    jobs: Mutex<HashMap<ProcId, Arc<Shared>>>,
}

/// A link to the home and a client to run one line at a time.
struct Runner {
    home: HomeLink,
    client: Client,
}

impl Lines {
    /// Serves the make shells: each connection hands over one line (with
    /// its standard streams) or one signal for a running line.
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
            let Ok(conn) = conn else { continue };
            let lines = self.clone();
            std::thread::spawn(move || lines.connection(conn));
        }
    }

    fn connection(&self, conn: UnixStream) {
        let Some((body, fds)) = shoal_node::fdpass::receive(conn.as_raw_fd(), MAX_LINE) else {
            return;
        };
        // SAFETY: the fds came with the message and are ours alone.
        let fds: Vec<OwnedFd> = fds
            .into_iter()
            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
            .collect();
        match (ExecRequest::decode(&body), <[OwnedFd; 3]>::try_from(fds)) {
            (Ok(ExecRequest::Start { spec, .. }), Ok(stdio)) => self.line(conn, spec, stdio),
            (Ok(ExecRequest::Signal { id, signal }), _) => self.signal(id, signal),
            _ => {}
        }
    }

    /// Runs one recipe line on the cluster, as `shoal run --any --wait`
    /// would, its streams being the make shell's.
    fn line(&self, mut conn: UnixStream, mut spec: StartSpec, stdio: [OwnedFd; 3]) {
        let [stdin, stdout, stderr] = stdio;
        let mut stderr = File::from(stderr);
        spec.argv = recipe_command(std::mem::take(&mut spec.argv), &self.shell);
        let args = RunArgs {
            on: None,
            any: true,
            mem_mib: 0,
            allow_owner_active: false,
            wait: true,
            retry: self.retry,
            tty: false,
            command: spec.argv.clone(),
        };
        let mut tell = |event: ShellEvent| {
            let _ = conn.write_all(&frame(&event.encode()));
        };
        let not_started = |stderr: &mut File, message: String| {
            let _ = writeln!(stderr, "shoal make: {message}");
            ShellEvent::Ended(Ended::Exited(i32::from(cmd_run::NOT_STARTED)))
        };
        let mut runner = match self.runner() {
            Ok(r) => r,
            Err(e) => return tell(not_started(&mut stderr, e)),
        };
        let (id, node) = match cmd_run::spawn(&mut runner.home, &args) {
            Ok(spawned) => spawned,
            Err(e) => return tell(not_started(&mut stderr, e)),
        };
        tell(ShellEvent::Started(id));
        let shared = Arc::new(Shared::new(&self.ctx, id, &node));
        self.jobs.lock().insert(id, shared.clone());
        let done = Arc::new(AtomicBool::new(false));
        let mut stdin = Some(stdin);
        let mut sink = FileSink {
            out: File::from(stdout),
            err: stderr.try_clone().ok(),
            closed: false,
        };
        let outcome = cmd_run::supervise(
            &self.ctx,
            &mut runner.home,
            &mut runner.client,
            &shared,
            &args,
            &spec,
            node,
            &mut |client| match stdin.take() {
                Some(fd) => self.input(client, &shared, fd, &done),
                None => Ok(()),
            },
            &mut sink,
        );
        done.store(true, Ordering::Release);
        self.jobs.lock().remove(&id);
        let home_told = runner.home.ended(&id.to_string(), outcome.end());
        let program = &args.command[0];
        let ended = match outcome {
            Outcome::Ended(ended) => ended,
            Outcome::NotStarted(e) => {
                let _ = writeln!(stderr, "shoal make: {program} on {e}");
                Ended::Exited(i32::from(cmd_run::NOT_STARTED))
            }
            Outcome::Lost(e) => {
                let _ = writeln!(stderr, "shoal make: {e}");
                Ended::Exited(i32::from(cmd_run::NODE_LOST))
            }
        };
        tell(ShellEvent::Ended(ended));
        if home_told.is_ok() {
            self.runners.lock().push(runner);
        }
    }

    /// A runner kept from an earlier line, or a new one.
    fn runner(&self) -> Result<Runner, String> {
        if let Some(r) = self.runners.lock().pop() {
            return Ok(r);
        }
        let no_node = |e: shoal_rpc::Error| format!("no node: {e}");
        Ok(Runner {
            home: self.ctx.home().map_err(no_node)?,
            client: self.ctx.client().map_err(no_node)?,
        })
    }

    fn with_client<T>(&self, f: impl FnOnce(&mut Client) -> T) -> Option<T> {
        let popped = self.clients.lock().pop();
        let mut client = match popped {
            Some(c) => c,
            None => self.ctx.client().ok()?,
        };
        let result = f(&mut client);
        self.clients.lock().push(client);
        Some(result)
    }

    /// Passes signal `sig` on to line `id`, if it runs.
    fn signal(&self, id: ProcId, sig: i32) {
        let Some(shared) = self.jobs.lock().get(&id).cloned() else {
            return;
        };
        let port = *shared.port.lock();
        self.with_client(|c| cmd_run::call(c, &port, &cmd_run::signal(id, sig)));
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
        if readable(stdin.as_raw_fd(), 0) {
            let mut probe = [0u8; 1];
            if let Ok(0) = std::io::Read::read(&mut stdin, &mut probe) {
                let port = *shared.port.lock();
                let close = ExecRequest::Write {
                    id: shared.id,
                    data: Vec::new(),
                    close: true,
                };
                return cmd_run::call(client, &port, &close).map(|_| ());
            }
            // A byte was read: it goes first.
            return self.copy_input(shared, stdin, probe.to_vec(), done);
        }
        self.copy_input(shared, stdin, Vec::new(), done)
    }

    fn copy_input(
        &self,
        shared: &Arc<Shared>,
        mut stdin: File,
        first: Vec<u8>,
        done: &Arc<AtomicBool>,
    ) -> Result<(), String> {
        let mut client = match self.clients.lock().pop() {
            Some(c) => c,
            None => self.ctx.client().map_err(|e| e.to_string())?,
        };
        let (shared, done) = (shared.clone(), done.clone());
        std::thread::spawn(move || {
            let mut data = first;
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let close = data.is_empty() && {
                    // Wait for input while the line runs.
                    while !readable(stdin.as_raw_fd(), INPUT_POLL_MS) {
                        if done.load(Ordering::Acquire) {
                            return;
                        }
                    }
                    let n = std::io::Read::read(&mut stdin, &mut buf).unwrap_or(0);
                    data.extend_from_slice(&buf[..n]);
                    n == 0
                };
                let write = ExecRequest::Write {
                    id: shared.id,
                    data: std::mem::take(&mut data),
                    close,
                };
                let port = *shared.port.lock();
                if cmd_run::call(&mut client, &port, &write).is_err() || close {
                    return;
                }
            }
        });
        Ok(())
    }

    /// Signals to this process: a stop (Ctrl-Z at make's terminal) stops
    /// the running lines and then this process, and a continue continues
    /// both; an interrupt or end goes to make, which passes it on to its
    /// lines' shells and ends as it would.
    fn follow_signals(self: &Arc<Self>, make: libc::pid_t) -> Result<(), Failure> {
        let mut signals = signal_hook::iterator::Signals::new([
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGTSTP,
            libc::SIGCONT,
        ])
        .map_err(|e| Failure::failed(format!("cannot handle signals: {e}")))?;
        let lines = self.clone();
        std::thread::spawn(move || {
            for sig in signals.forever() {
                match sig {
                    libc::SIGTSTP | libc::SIGCONT => {
                        let running: Vec<ProcId> = lines.jobs.lock().keys().copied().collect();
                        for id in running {
                            lines.signal(id, sig);
                        }
                        if sig == libc::SIGTSTP {
                            // SAFETY: kill(2) of ourselves.
                            unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
                        }
                    }
                    // SAFETY: kill(2) of our child.
                    _ => unsafe {
                        libc::kill(make, sig);
                    },
                }
            }
        });
        Ok(())
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

/// Whether `fd` has input (or its end) within `ms` milliseconds.
fn readable(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll over one live pollfd.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

/// `body` with its length first.
fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(4 + body.len());
    f.extend_from_slice(&(body.len() as u32).to_le_bytes());
    f.extend_from_slice(body);
    f
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
fn cluster_cores(ctx: &Context) -> Result<u32, Failure> {
    let Some((_, name)) = ctx.config().node.clone() else {
        return Err(Failure::unreachable("the local node did not say who it is"));
    };
    let status: NodeStatus = ask(ctx, &name, &NodeRequest::Status, Duration::from_secs(2))
        .map_err(|e| Failure::unreachable(format!("the local node {name}: {e}")))?;
    let cores: u32 = status
        .members
        .iter()
        .filter(|m| m.alive)
        .filter_map(|m| m.load.as_ref().map(|l| u32::from(l.cores)))
        .sum();
    Ok(cores.max(1))
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
