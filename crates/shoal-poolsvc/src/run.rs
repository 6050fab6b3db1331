//! A program run on another node as if here: numbered by its home,
//! started, followed to its end (on another node after a lost one, while
//! retries allow), with this process's signals and input passed on.

use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use shoal_pool::ProcId;
use shoal_pool::exec::{Ended, ExecReply, ExecRequest, StartSpec, WinSize};
use shoal_rpc::link::ProcEnd;
use shoal_rpc::{CallOptions, Client, Context, HomeLink, PutPort};

use crate::settings::FORWARDED;
use crate::terminal::Terminal;

/// Where and how to run a program.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The node to run on (its name), whatever its load or owner.
    pub on: Option<String>,
    /// Let the pool choose the node.
    pub any: bool,
    /// With `any`: memory the program needs, in MiB.
    pub mem_mib: u32,
    /// With `any`: nodes whose owner is active may be chosen too.
    pub allow_owner_active: bool,
    /// With `any`: when no node is eligible, wait for one.
    pub wait: bool,
    /// The program is idempotent: if its node is lost, start it again on
    /// another node, up to this many times.
    pub retry: u32,
    /// Run the program on a pseudo-terminal.
    pub tty: bool,
    /// The program and its arguments.
    pub command: Vec<String>,
}

/// Exit status when the program could not be started.
pub const NOT_STARTED: u8 = 125;
/// Exit status when the node running the program became unreachable.
pub const NODE_LOST: u8 = 255;
/// Bytes of output asked for per read, per stream.
const READ_MAX: u32 = 4 << 20;
/// How long a start may take, finding the node included.
const START_DEADLINE: Duration = Duration::from_secs(5);
/// How often `--any` chooses again when a start reaches no node.
const UNDELIVERED_REPLACEMENTS: u32 = 2;
/// How often an input copier that may be told to stop looks whether it
/// is.
const INPUT_POLL_MS: i32 = 200;
/// How often a queued `--wait` asks again for a node.
const WAIT_RETRY: Duration = Duration::from_millis(500);

/// How a run ended, from the home's side.
pub enum Outcome {
    Ended(Ended),
    NotStarted(String),
    Lost(String),
}

impl Outcome {
    /// What the home records.
    pub fn end(&self) -> ProcEnd {
        match self {
            Outcome::Ended(Ended::Exited(c)) => ProcEnd::Exited(*c),
            Outcome::Ended(Ended::Killed(s)) => ProcEnd::Killed(*s),
            Outcome::NotStarted(_) => ProcEnd::NotStarted,
            Outcome::Lost(_) => ProcEnd::Lost,
        }
    }
}

/// A running program, as the threads that serve it share it.
pub struct Shared {
    pub id: ProcId,
    /// The command that runs it, for its messages.
    who: &'static str,
    /// The exec service of the node the program runs on now.
    pub port: Mutex<PutPort>,
    /// The start grant the home gave for that node.
    pub grant: Mutex<Vec<u8>>,
    /// The home's terminal, in raw mode while the program has a pty.
    terminal: Option<Terminal>,
    tty: bool,
}

impl Shared {
    /// Program `id` on `node` (started with `grant`), without a terminal,
    /// run by `who`.
    pub fn new(
        ctx: &Context,
        id: ProcId,
        (node, grant): (&str, Vec<u8>),
        who: &'static str,
    ) -> Shared {
        Shared {
            id,
            who,
            port: Mutex::new(exec_port(ctx, node)),
            grant: Mutex::new(grant),
            terminal: None,
            tty: false,
        }
    }
}

impl Shared {
    /// The same, on a pseudo-terminal: this process's terminal, if it
    /// has one, is raw while the program runs.
    pub fn on_terminal(mut self) -> Shared {
        self.terminal = Terminal::raw();
        self.tty = true;
        self
    }

    /// Gives this process's terminal back as it was found.
    pub fn restore_terminal(&self) {
        if let Some(t) = &self.terminal {
            t.restore();
        }
    }
}

/// Where a program's output goes.
pub trait Sink {
    /// One output reply, as read (an [`ExecReply::Output`]).
    fn deliver(&mut self, reply: Vec<u8>);
    /// Whether the reader of the program's stdout went away.
    fn closed(&self) -> bool;
}

/// A process id and a node from the home, waiting for an eligible node
/// with `--wait` (while `stop` says not to give up; `who` names the
/// waiting command in the message).
pub fn spawn(
    home: &mut HomeLink,
    args: &RunOptions,
    who: &str,
    stop: &dyn Fn() -> bool,
) -> Result<(ProcId, String, Vec<u8>), String> {
    let command = args.command.join(" ");
    let mut told = false;
    loop {
        match home.spawn(
            &command,
            args.on.as_deref(),
            args.mem_mib,
            args.allow_owner_active,
        ) {
            Ok((id, node, grant)) => {
                let id = id
                    .parse()
                    .map_err(|e| format!("the node's process id: {e}"))?;
                return Ok((id, node, grant));
            }
            // The home's refusal (no eligible node) is waited out; a lost
            // link is not.
            Err(e @ shoal_rpc::Error::Node(_)) if args.wait && !stop() => {
                if !told {
                    eprintln!("{who}: waiting for a node: {e}");
                    told = true;
                }
                std::thread::sleep(WAIT_RETRY);
            }
            Err(e) => return Err(format!("no node for {}: {e}", args.command[0])),
        }
    }
}

/// Starts the program and follows it to its end, on another node after a
/// lost one while `--retry` allows.  `started` runs once, when the program
/// first started; its output goes to `sink`.
#[allow(clippy::too_many_arguments)]
pub fn supervise(
    ctx: &Context,
    home: &mut HomeLink,
    client: &mut Client,
    shared: &Arc<Shared>,
    args: &RunOptions,
    spec: &StartSpec,
    mut node: String,
    started: &mut dyn FnMut(&mut Client) -> Result<(), String>,
    sink: &mut dyn Sink,
) -> Outcome {
    let id = shared.id;
    let mut retries = args.retry;
    // A start that reached no node ran nowhere: with --any the pool may
    // choose again, retries or not.
    let mut replacements = if args.any {
        UNDELIVERED_REPLACEMENTS
    } else {
        0
    };
    let mut helpers = false;
    loop {
        let lost = match start(client, shared, spec) {
            Err(Start::Refused(e)) => return Outcome::NotStarted(format!("{node}: {e}")),
            Err(Start::Undelivered(e)) if replacements > 0 => {
                replacements -= 1;
                retries += 1;
                e
            }
            Err(Start::Lost(e) | Start::Undelivered(e)) => e,
            Ok(()) => {
                if !helpers {
                    helpers = true;
                    if let Err(e) = started(client) {
                        return Outcome::Lost(e);
                    }
                }
                match follow(client, shared, sink) {
                    Ok(ended) => return Outcome::Ended(ended),
                    Err(e) => e,
                }
            }
        };
        if retries == 0 {
            return Outcome::Lost(format!("node {node} is unreachable: {lost}"));
        }
        retries -= 1;
        match home.respawn(
            &id.to_string(),
            &node,
            args.mem_mib,
            args.allow_owner_active,
        ) {
            Ok((next, grant)) => {
                *shared.grant.lock() = grant;
                eprintln!(
                    "{}: node {node} is unreachable ({lost}); starting {} again on {next}",
                    shared.who, args.command[0]
                );
                node = next;
                *shared.port.lock() = exec_port(ctx, &node);
            }
            Err(e) => {
                return Outcome::Lost(format!(
                    "node {node} is unreachable ({lost}), and no other node: {e}"
                ));
            }
        }
    }
}

/// Why a start failed.
enum Start {
    /// The node refused it (the reason in one line).
    Refused(String),
    /// No server of the node's exec service could be found: the request
    /// went nowhere, and the program did not start.
    Undelivered(String),
    /// The node did not answer.
    Lost(String),
}

/// Starts the program on the node the program's port names.
fn start(client: &mut Client, shared: &Shared, spec: &StartSpec) -> Result<(), Start> {
    let port = *shared.port.lock();
    let start = ExecRequest::Start {
        id: shared.id,
        spec: spec.clone(),
        grant: shared.grant.lock().clone(),
    };
    let opts = CallOptions {
        deadline: Some(START_DEADLINE),
        cancel: None,
    };
    match client.trans_with(&port, start.encode(), &opts) {
        Ok(reply) => match ExecReply::decode(&reply) {
            Ok(ExecReply::Started { .. }) => Ok(()),
            Ok(ExecReply::Error(e)) => Err(Start::Refused(e)),
            Ok(_) => Err(Start::Refused("an unexpected answer".into())),
            Err(e) => Err(Start::Refused(e.to_string())),
        },
        Err(e @ shoal_rpc::Error::Trans(shoal_rpc::TransError::NotFound { .. })) => {
            Err(Start::Undelivered(e.to_string()))
        }
        Err(e) => Err(Start::Lost(e.to_string())),
    }
}

/// Follows the started program: its output to `sink`, its stops to ours,
/// until its end; an error if its node is lost.
fn follow(client: &mut Client, shared: &Shared, sink: &mut dyn Sink) -> Result<Ended, String> {
    let port = *shared.port.lock();
    let mut was_stopped = None;
    let mut piped = false;
    loop {
        let read = ExecRequest::Read {
            id: shared.id,
            max: READ_MAX,
            wait_ms: 1000,
        };
        let reply = call_raw(client, &port, &read)?;
        let (stopped, ended) = match ExecReply::decode_output(&reply) {
            Ok(Some(o)) => (o.stopped, o.ended),
            other => {
                return Err(match other.map(|_| ExecReply::decode(&reply)) {
                    Ok(Ok(ExecReply::Error(e))) => e,
                    Ok(Ok(_)) => "an unexpected answer".to_string(),
                    Ok(Err(e)) | Err(e) => e.to_string(),
                });
            }
        };
        sink.deliver(reply);
        // A closed output of ours (a pipe whose reader left) ends the
        // program as it would have ended it here.
        if !piped && sink.closed() {
            piped = true;
            let _ = call(client, &port, &signal(shared.id, libc::SIGPIPE));
        }
        if let Some(ended) = ended {
            return Ok(ended);
        }
        // On a pty, a stop typed at the terminal stops the program there;
        // this process stops with it, giving the terminal back to the
        // home's shell (its SIGCONT continues both).
        if shared.tty
            && was_stopped.is_none()
            && matches!(stopped, Some(libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU))
        {
            stop_here(shared);
        }
        was_stopped = stopped;
    }
}

/// Stops this process (its terminal as it found it); SIGCONT resumes it.
fn stop_here(shared: &Shared) {
    if let Some(t) = &shared.terminal {
        t.restore();
    }
    // SAFETY: kill(2) of ourselves.
    unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
}

/// The threads that pass signals, input and window sizes on.
pub fn start_helpers(ctx: &Context, shared: &Arc<Shared>) -> Result<(), String> {
    forward_signals(ctx, shared.clone())?;
    forward_input(ctx, shared.clone())
}

/// Node `node`'s exec service, as this program calls it.
pub fn exec_port(ctx: &Context, node: &str) -> PutPort {
    exec_service(&ctx.config().cluster, node).put_port()
}

/// Node `name`'s exec service, a system service of cluster `cluster`.
pub fn exec_service(cluster: &[u8; 16], name: &str) -> shoal_rpc::Service {
    shoal_rpc::system_port(cluster, &format!("exec {name}"))
}

/// What the program runs with: this process's own settings.
pub fn start_spec(args: &RunOptions) -> Result<StartSpec, String> {
    let tty = args
        .tty
        .then(|| Terminal::size().unwrap_or(WinSize { rows: 24, cols: 80 }));
    crate::settings::start_spec(args.command.clone(), tty)
}

/// The request that sends `signal` to program `id`.
pub fn signal(id: ProcId, signal: i32) -> ExecRequest {
    ExecRequest::Signal { id, signal }
}

/// One exec call, decoded.
pub fn call(
    client: &mut Client,
    port: &PutPort,
    request: &ExecRequest,
) -> Result<ExecReply, String> {
    let reply = call_raw(client, port, request)?;
    ExecReply::decode(&reply).map_err(|e| e.to_string())
}

/// One exec call: the reply's bytes.
fn call_raw(client: &mut Client, port: &PutPort, request: &ExecRequest) -> Result<Vec<u8>, String> {
    let opts = CallOptions {
        deadline: Some(Duration::from_secs(10)),
        cancel: None,
    };
    client
        .trans_with(port, request.encode(), &opts)
        .map_err(|e| e.to_string())
}

/// Passes the signals `shoal run` gets on to the program: the forwarded
/// ones as they are; a stop (SIGTSTP) stops the program and then this
/// process, and SIGCONT continues both; a change of the terminal's size
/// reaches the program's pty.
fn forward_signals(ctx: &Context, shared: Arc<Shared>) -> Result<(), String> {
    let mut wanted = FORWARDED.to_vec();
    wanted.extend([libc::SIGTSTP, libc::SIGCONT, libc::SIGWINCH]);
    let mut signals = signal_hook::iterator::Signals::new(wanted)
        .map_err(|e| format!("cannot handle signals: {e}"))?;
    let mut client = ctx.client().map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        for s in signals.forever() {
            let port = *shared.port.lock();
            match s {
                libc::SIGWINCH => {
                    if let Some(size) = shared.tty.then(Terminal::size).flatten() {
                        let resize = ExecRequest::Resize {
                            id: shared.id,
                            size,
                        };
                        let _ = call(&mut client, &port, &resize);
                    }
                }
                libc::SIGTSTP => {
                    let _ = call(&mut client, &port, &signal(shared.id, s));
                    // On a pty the program's stop, once reported, stops
                    // this process; without one, it stops now.
                    if !shared.tty {
                        stop_here(&shared);
                    }
                }
                libc::SIGCONT => {
                    if let Some(t) = &shared.terminal {
                        t.make_raw();
                    }
                    let _ = call(&mut client, &port, &signal(shared.id, s));
                }
                _ => {
                    let _ = call(&mut client, &port, &signal(shared.id, s));
                }
            }
        }
    });
    Ok(())
}

/// Copies standard input to the program until it ends.
fn forward_input(ctx: &Context, shared: Arc<Shared>) -> Result<(), String> {
    let client = ctx.client().map_err(|e| e.to_string())?;
    copy_input(client, shared, std::io::stdin(), Vec::new(), None);
    Ok(())
}

/// Copies `input` (`first` first) to the program, from a thread of its
/// own, until the input ends; with `done`, also until that is set (the
/// program ended), the input being polled meanwhile.  A chunk that cannot
/// be delivered (the node is lost) waits for the program's next node, if
/// `--retry` gives it one.
pub fn copy_input<R: Read + AsRawFd + Send + 'static>(
    mut client: Client,
    shared: Arc<Shared>,
    mut input: R,
    first: Vec<u8>,
    done: Option<Arc<AtomicBool>>,
) {
    std::thread::spawn(move || {
        let finished = || done.as_ref().is_some_and(|d| d.load(Ordering::Acquire));
        // Grown while reads fill it, up to a megabyte: most programs get
        // little input, and a megabyte zeroed costs 256 page faults.
        let mut buf = vec![0u8; 64 << 10];
        let mut data = first;
        loop {
            let close = data.is_empty() && {
                if done.is_some() {
                    while !readable(input.as_raw_fd(), INPUT_POLL_MS) {
                        if finished() {
                            return;
                        }
                    }
                }
                let n = input.read(&mut buf).unwrap_or(0);
                data.extend_from_slice(&buf[..n]);
                if n == buf.len() && buf.len() < 1 << 20 {
                    buf.resize(buf.len() * 2, 0);
                }
                n == 0
            };
            let write = ExecRequest::Write {
                id: shared.id,
                data: std::mem::take(&mut data),
                close,
            };
            loop {
                let port = *shared.port.lock();
                match call(&mut client, &port, &write) {
                    Ok(ExecReply::Done) if !close => break,
                    Err(_) if !finished() => std::thread::sleep(Duration::from_millis(200)),
                    _ => return,
                }
            }
        }
    });
}

/// Whether `fd` has input (or its end) within `ms` milliseconds.
pub fn readable(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll over one live pollfd.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}
