//! `shoal`: the node daemon and the user's interface, in one binary.
//!
//! Exit codes, for scripts: 0 success; 1 the operation failed; 2 bad
//! usage; 3 the target (node, server, port) could not be reached.

mod cli;
mod cmd_cap;
mod cmd_cluster;
mod cmd_dir;
mod cmd_file;
mod cmd_fs;
mod cmd_group;
mod cmd_init;
mod cmd_join;
mod cmd_make;
mod cmd_ps;
mod cmd_rpc;
mod cmd_run;
mod cmd_service;
mod cmd_status;
mod yielding;

use std::process::ExitCode;

use clap::Parser;

/// A failure with the exit code it deserves.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    /// The operation failed.
    pub fn failed(message: impl Into<String>) -> Failure {
        Failure {
            code: 1,
            message: message.into(),
        }
    }

    /// The command was given wrong arguments.
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: 2,
            message: message.into(),
        }
    }

    /// The target could not be reached.
    pub fn unreachable(message: impl Into<String>) -> Failure {
        Failure {
            code: 3,
            message: message.into(),
        }
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure::failed(message)
    }
}

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version: print as asked, succeed.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // `shoal dir`: what there is to choose from.
            let _ = e.print();
            return ExitCode::from(2);
        }
        Err(e) => {
            // One line: what is wrong, and where to look.
            let text = e.to_string();
            // clap puts what is missing on the lines after a colon.
            let mut lines = text
                .lines()
                .map(str::trim)
                .take_while(|l| !l.is_empty() && !l.starts_with("Usage:"));
            let mut first = lines.next().unwrap_or("bad usage").to_string();
            if first.ends_with(':') {
                first = format!("{first} {}", lines.collect::<Vec<_>>().join(", "));
            }
            let first = first.strip_prefix("error: ").unwrap_or(&first);
            eprintln!("shoal: {first} (see --help)");
            return ExitCode::from(2);
        }
    };
    if !cli.is_daemon() {
        // A command whose output pipe closes (`shoal file cat x | head`)
        // ends quietly, as Unix tools do, instead of failing its next
        // write; daemons keep Rust's default (the error, not the signal).
        // SAFETY: restoring a signal's default disposition, before any
        // thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SHOAL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(cli.default_log())),
        )
        .with_writer(std::io::stderr)
        // Colours for a person at a terminal, not for a service's log.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("shoal: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}
