//! `shoal run`: runs a program on a node of the cluster as if it ran
//! here (`docs/pool.md`).  This node is its home: the program gets this
//! command's arguments, environment, working directory, user, group and
//! umask; its output comes back here as it is written, input goes to it,
//! signals sent to `shoal run` go to its process group, and its exit
//! status (or the signal that killed it) becomes `shoal run`'s own.
//!
//! Exit statuses of `shoal run` itself: 125 the program could not be
//! started there (the message says why), 255 the node became unreachable
//! while the program ran (its fate is unknown).

use std::io::{Read, Write};
use std::time::Duration;

use clap::Args;
use shoal_pool::ProcId;
use shoal_pool::exec::{Ended, ExecReply, ExecRequest, StartSpec};
use shoal_rpc::{CallOptions, Client, Context, PutPort};

use crate::Failure;

#[derive(Args)]
#[command(group(clap::ArgGroup::new("where").required(true).args(["on", "any"])))]
pub struct RunArgs {
    /// The node to run on (its name), whatever its load or owner.
    #[arg(long)]
    pub on: Option<String>,
    /// Let the processor pool choose the node (docs/pool.md).
    #[arg(long)]
    pub any: bool,
    /// With --any: memory the program needs, in MiB.
    #[arg(long, default_value_t = 0, requires = "any")]
    pub mem_mib: u32,
    /// With --any: nodes whose owner is active may be chosen too.
    #[arg(long, requires = "any")]
    pub allow_owner_active: bool,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// Exit status when the program could not be started.
const NOT_STARTED: u8 = 125;
/// Exit status when the node running the program became unreachable.
const NODE_LOST: u8 = 255;
/// Bytes of output asked for per read, per stream.
const READ_MAX: u32 = 4 << 20;
/// Signals passed on to the program.
const FORWARDED: [i32; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

pub fn run(args: RunArgs) -> Result<(), Failure> {
    // A closed output of ours is passed on to the program as SIGPIPE
    // rather than ending this process before the program.
    // SAFETY: setting a signal's disposition.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let ctx = Context::from_env().map_err(|e| Failure::unreachable(format!("no node: {e}")))?;
    let Some((home, _)) = ctx.config().node.clone() else {
        return Err(Failure::unreachable("the local node did not say who it is"));
    };
    let id = ProcId {
        home,
        seq: rand::random(),
    };
    let on = match &args.on {
        Some(name) => name.clone(),
        None => ctx
            .place(args.mem_mib, args.allow_owner_active)
            .map_err(|e| Failure {
                code: NOT_STARTED,
                message: format!("no node for {}: {e}", args.command[0]),
            })?,
    };
    let port = shoal_node::exec::exec_port(&ctx.config().key, &on).put_port();
    let cwd = std::env::current_dir()
        .map_err(|e| Failure::failed(format!("no working directory: {e}")))?;
    // SAFETY: umask(2) twice, to read it.
    let umask = unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m
    };
    let spec = StartSpec {
        argv: args.command.clone(),
        env: std::env::vars_os()
            .filter_map(|(k, v)| Some(format!("{}={}", k.to_str()?, v.to_str()?)))
            .collect(),
        cwd: cwd.to_string_lossy().into_owned(),
        // SAFETY: getuid/getgid cannot fail.
        uid: unsafe { libc::getuid() },
        gid: unsafe { libc::getgid() },
        umask: umask as u32,
    };
    let mut client = ctx
        .client()
        .map_err(|e| Failure::unreachable(e.to_string()))?;
    let lost = |e: String| Failure {
        code: NODE_LOST,
        message: format!("node {on} is unreachable: {e}"),
    };
    match call(&mut client, &port, &ExecRequest::Start { id, spec }).map_err(lost)? {
        ExecReply::Started { .. } => {}
        ExecReply::Error(e) => {
            return Err(Failure {
                code: NOT_STARTED,
                message: format!("{} on {on}: {e}", args.command[0]),
            });
        }
        other => return Err(Failure::failed(format!("unexpected answer {other:?}"))),
    }
    forward_signals(&ctx, port, id)?;
    forward_input(&ctx, port, id)?;
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
    loop {
        let read = ExecRequest::Read {
            id,
            max: READ_MAX,
            wait_ms: 1000,
        };
        match call(&mut client, &port, &read).map_err(lost)? {
            ExecReply::Output {
                stdout,
                stderr,
                ended,
            } => {
                // A closed output of ours (a pipe whose reader left) ends
                // the program as it would have ended it here.
                if out.write_all(&stdout).and_then(|()| out.flush()).is_err() {
                    let _ = call(&mut client, &port, &signal(id, libc::SIGPIPE));
                }
                let _ = err.write_all(&stderr);
                if let Some(ended) = ended {
                    let _ = out.flush();
                    end_as(ended);
                }
            }
            ExecReply::Error(e) => return Err(lost(e)),
            other => return Err(Failure::failed(format!("unexpected answer {other:?}"))),
        }
    }
}

fn signal(id: ProcId, signal: i32) -> ExecRequest {
    ExecRequest::Signal { id, signal }
}

/// One exec call, decoded.
fn call(client: &mut Client, port: &PutPort, request: &ExecRequest) -> Result<ExecReply, String> {
    let opts = CallOptions {
        deadline: Some(Duration::from_secs(10)),
        cancel: None,
    };
    let reply = client
        .trans_with(port, request.encode(), &opts)
        .map_err(|e| e.to_string())?;
    ExecReply::decode(&reply).map_err(|e| e.to_string())
}

/// Passes the signals `shoal run` gets on to the program.
fn forward_signals(ctx: &Context, port: PutPort, id: ProcId) -> Result<(), Failure> {
    let mut signals = signal_hook::iterator::Signals::new(FORWARDED)
        .map_err(|e| Failure::failed(format!("cannot handle signals: {e}")))?;
    let mut client = ctx
        .client()
        .map_err(|e| Failure::unreachable(e.to_string()))?;
    std::thread::spawn(move || {
        for s in signals.forever() {
            let _ = call(&mut client, &port, &signal(id, s));
        }
    });
    Ok(())
}

/// Copies standard input to the program until it ends.
fn forward_input(ctx: &Context, port: PutPort, id: ProcId) -> Result<(), Failure> {
    let mut client = ctx
        .client()
        .map_err(|e| Failure::unreachable(e.to_string()))?;
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = stdin.read(&mut buf).unwrap_or(0);
            let write = ExecRequest::Write {
                id,
                data: buf[..n].to_vec(),
                close: n == 0,
            };
            match call(&mut client, &port, &write) {
                Ok(ExecReply::Done) if n > 0 => {}
                _ => return,
            }
        }
    });
    Ok(())
}

/// Ends this process the way the program ended.
fn end_as(ended: Ended) -> ! {
    match ended {
        Ended::Exited(code) => std::process::exit(code),
        Ended::Killed(sig) => {
            // SAFETY: restoring the default action and raising the signal
            // ends this process as the program ended.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                libc::raise(sig);
            }
            std::process::exit(128 + sig)
        }
    }
}
