//! `shoal-make-shell`: the shell `shoal make` gives GNU make.
//!
//! make starts it for every recipe line as `$(SHELL) $(.SHELLFLAGS)
//! LINE`.  It hands the line, with what the line would run with here
//! (environment, working directory, user, groups, umask, resource limits,
//! host name) and its standard streams, to the `shoal make` that started
//! make, over the socket `SHOAL_MAKE_SOCKET` names; `shoal make` runs it
//! on a node of the cluster through the processor pool.  This program
//! then waits for the line's end and ends the same way, and passes on
//! the signals it gets meanwhile (SIGINT, SIGTERM, SIGHUP, SIGQUIT,
//! SIGUSR1, SIGUSR2) over the same connection; if it dies, `shoal make`
//! sees the connection close and kills the line.  A stop (SIGTSTP) stops
//! it as it would stop a shell; `shoal make` itself stops and continues
//! the programs.
//!
//! A recursive make's line (make hands it the jobserver: `$(MAKE)` or a
//! `+` line) runs here, under the real shell (`SHOAL_MAKE_SHELL`).
//!
//! It is a program of its own, without an argument parser or an RPC
//! client, because make starts one per recipe line: its start-up is paid
//! once per line.
//!
//! Exit statuses of its own: 125 the line could not be handed over (the
//! message says why), 255 `shoal make` went away while the line ran.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;

use shoal_nodesvc::fdpass::{self, frame};
use shoal_pool::ProcId;
use shoal_pool::exec::{Ended, ExecRequest, LineEnded};
use shoal_poolsvc::settings::{FORWARDED, end_as};

/// The socket of the `shoal make` this line belongs to.
const SOCKET_ENV: &str = "SHOAL_MAKE_SOCKET";
/// The real shell.
const SHELL_ENV: &str = "SHOAL_MAKE_SHELL";
/// Exit status when the line could not be handed over.
const NOT_STARTED: i32 = 125;
/// Exit status when `shoal make` went away.
const LOST: i32 = 255;

fn main() {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let shell = std::env::var(SHELL_ENV).unwrap_or_else(|_| "/bin/sh".into());
    let Some(socket) = std::env::var_os(SOCKET_ENV) else {
        die(
            NOT_STARTED,
            &format!("{SOCKET_ENV} is not set: this is the shell of `shoal make` only"),
        );
    };
    if args.is_empty() || recursive() {
        let e = std::process::Command::new(&shell).args(&args).exec();
        die(127, &format!("cannot run {shell}: {e}"));
    }
    // Signals are read from a signalfd, to be passed on.
    let signals = SignalFd::new(&FORWARDED);
    let spec =
        shoal_poolsvc::settings::start_spec(args, None).unwrap_or_else(|e| die(NOT_STARTED, &e));
    // The id is the home's to give.
    let unset = ProcId::from_bytes(&[0; ProcId::LEN]);
    // The grant too: `shoal make` gets it from its home.
    let start = ExecRequest::Start {
        id: unset,
        spec,
        grant: Vec::new(),
    };
    let mut stream = UnixStream::connect(&socket).unwrap_or_else(|e| {
        die(
            NOT_STARTED,
            &format!(
                "cannot reach shoal make at {}: {e}",
                socket.to_string_lossy()
            ),
        )
    });
    fdpass::send_with_fds(stream.as_raw_fd(), &start.encode(), &[0, 1, 2]).unwrap_or_else(|e| {
        die(
            NOT_STARTED,
            &format!("cannot hand the line to shoal make: {e}"),
        )
    });
    loop {
        let mut fds = [
            libc::pollfd {
                fd: stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: signals.fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll over two live pollfds.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            continue;
        }
        if fds[1].revents != 0
            && let Some(signal) = signals.next()
        {
            let pass = ExecRequest::Signal { id: unset, signal };
            let _ = stream.write_all(&frame(&pass.encode()));
        }
        if fds[0].revents != 0 {
            match line_end(&stream) {
                Some(ended) => end_as(ended),
                None => die(LOST, "shoal make went away while the line ran"),
            }
        }
    }
}

/// How the line ended, from `shoal make`; `None` if it went away.
fn line_end(stream: &UnixStream) -> Option<Ended> {
    let body = fdpass::receive_plain(stream.as_raw_fd(), 64)?;
    LineEnded::decode(&body).ok().map(|e| e.0)
}

/// Whether make handed this line its jobserver: it does so only for a
/// recursive make (`$(MAKE)` or a `+` line), and closes it on the others.
fn recursive() -> bool {
    let flags = std::env::var("MAKEFLAGS").unwrap_or_default();
    let Some(auth) = flags.split_ascii_whitespace().find_map(|f| {
        f.strip_prefix("--jobserver-auth=")
            .or(f.strip_prefix("--jobserver-fds="))
    }) else {
        return false;
    };
    let open = |fd: &str| {
        fd.parse::<i32>()
            // SAFETY: F_GETFD only reads the descriptor's flags.
            .is_ok_and(|fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0)
    };
    match auth.split_once(',') {
        Some((r, w)) => open(r) && open(w),
        // A named jobserver (make 4.4's fifo:PATH) cannot be told apart
        // so: such a make's recursive lines run on the cluster too.
        None => false,
    }
}

/// Signals blocked and read from a signalfd.
struct SignalFd {
    fd: i32,
}

impl SignalFd {
    fn new(signals: &[i32]) -> SignalFd {
        // SAFETY: a local sigset; sigprocmask and signalfd over it.
        let fd = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for &s in signals {
                libc::sigaddset(&mut set, s);
            }
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC);
            if fd < 0 {
                // Without a signalfd the signals act as they would.
                libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            }
            fd
        };
        SignalFd { fd }
    }

    /// The next signal that arrived.
    fn next(&self) -> Option<i32> {
        // SAFETY: reading one siginfo record into a zeroed one.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        let n = unsafe { libc::read(self.fd, (&raw mut info).cast(), size) };
        (n as usize == size).then_some(info.ssi_signo as i32)
    }
}

/// One line on stderr, and the exit status.
fn die(code: i32, message: &str) -> ! {
    eprintln!("shoal make: {message}");
    std::process::exit(code)
}
