//! `shoal run`: runs a program on a node of the cluster as if it ran
//! here (`docs/pool.md`).  This node is its home: it numbers the process,
//! chooses its node (`--any`), and the program gets this command's
//! arguments, environment, working directory, user, groups, umask,
//! resource limits and host name; its output comes back here as it is
//! written, input goes to it, signals sent to `shoal run` go to its
//! process group, and its exit status (or the signal that killed it)
//! becomes `shoal run`'s own.
//!
//! Exit statuses of `shoal run` itself: 125 the program could not be
//! started there (the message says why), 255 the node became unreachable
//! while the program ran (its fate is unknown).

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Args;
use shoal_pool::exec::ExecReply;
use shoal_poolsvc::settings::end_as;
use shoal_poolsvc::{
    NODE_LOST, NOT_STARTED, Outcome, RunOptions, Shared, Sink, spawn, start_helpers, start_spec,
    supervise,
};
use shoal_rpc::Context;

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
    /// With --any: when no node is eligible, wait for one instead of
    /// failing.
    #[arg(long, requires = "any")]
    pub wait: bool,
    /// The program is idempotent: if its node is lost, start it again on
    /// another node, up to N times (input already sent and output already
    /// written are not replayed).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub retry: u32,
    /// Run the program on a pseudo-terminal (interactive programs, job
    /// control; stdout and stderr become one stream).
    #[arg(short = 't', long)]
    pub tty: bool,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

impl RunArgs {
    /// The library's options from the flags.
    pub fn options(&self) -> RunOptions {
        RunOptions {
            on: self.on.clone(),
            any: self.any,
            mem_mib: self.mem_mib,
            allow_owner_active: self.allow_owner_active,
            wait: self.wait,
            retry: self.retry,
            tty: self.tty,
            command: self.command.clone(),
        }
    }
}

pub fn run(args: RunArgs) -> Result<(), Failure> {
    // A closed output of ours is passed on to the program as SIGPIPE
    // rather than ending this process before the program.
    // SAFETY: setting a signal's disposition.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let ctx = Context::from_env().map_err(|e| Failure::unreachable(format!("no node: {e}")))?;
    let mut home = ctx
        .home()
        .map_err(|e| Failure::unreachable(format!("no node: {e}")))?;
    let program = args.command[0].clone();
    let opts = args.options();
    let not_started = |message: String| Failure {
        code: NOT_STARTED,
        message,
    };
    // What it runs with first: a home that cannot say (its directory is
    // gone) numbers no process.
    let spec = start_spec(&opts).map_err(&not_started)?;
    let (id, node, grant) =
        spawn(&mut home, &opts, "shoal run", &|| false).map_err(&not_started)?;
    let shared = Shared::new(&ctx, id, (&node, grant), "shoal run");
    let shared = Arc::new(if opts.tty {
        shared.on_terminal()
    } else {
        shared
    });
    let mut writer = Writer::start();
    let outcome = match ctx.client() {
        Ok(mut client) => supervise(
            &ctx,
            &mut home,
            &mut client,
            &shared,
            &opts,
            &spec,
            node,
            &mut |_| start_helpers(&ctx, &shared),
            &mut writer,
        ),
        Err(e) => Outcome::NotStarted(format!("{node}: {e}")),
    };
    writer.finish();
    shared.restore_terminal();
    if let Err(e) = home.ended(&id.to_string(), outcome.end()) {
        let home = ctx.config().node.as_ref().map(|(_, name)| name.as_str());
        let shown = id.named(home);
        tracing::warn!("cannot tell the home how {shown} ended: {e}");
    }
    match outcome {
        Outcome::Ended(ended) => end_as(ended),
        Outcome::NotStarted(e) => Err(not_started(format!("{program} on {e}"))),
        Outcome::Lost(e) => Err(Failure {
            code: NODE_LOST,
            message: e,
        }),
    }
}

/// Output written to this process's stdout and stderr by a thread of its
/// own, so that the next read travels while the last one's bytes are
/// written.
struct Writer {
    tx: Option<std::sync::mpsc::SyncSender<Vec<u8>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    closed: Arc<AtomicBool>,
}

impl Writer {
    fn start() -> Writer {
        // Output into a pipe: a megabyte of it, so that the reader wakes
        // once a megabyte, not once a page run (refused quietly where not
        // allowed).
        // SAFETY: F_SETPIPE_SZ on our stdout; an fd that is no pipe
        // refuses.
        unsafe { libc::fcntl(1, libc::F_SETPIPE_SZ, 1 << 20) };
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(1);
        let closed = Arc::new(AtomicBool::new(false));
        let thread = {
            let closed = closed.clone();
            std::thread::spawn(move || {
                // Locked reply by reply: this process writes its own
                // messages meanwhile (a retry on another node).
                for reply in rx {
                    let Ok(Some(o)) = ExecReply::decode_output(&reply) else {
                        continue;
                    };
                    let mut out = std::io::stdout().lock();
                    if out.write_all(o.stdout).and_then(|()| out.flush()).is_err() {
                        closed.store(true, Ordering::Release);
                    }
                    drop(out);
                    let _ = std::io::stderr().lock().write_all(o.stderr);
                }
            })
        };
        Writer {
            tx: Some(tx),
            thread: Some(thread),
            closed,
        }
    }

    /// Waits until everything delivered is written.
    fn finish(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Sink for Writer {
    fn deliver(&mut self, reply: Vec<u8>) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(reply);
        }
    }

    fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}
