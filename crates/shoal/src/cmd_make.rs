//! `shoal make`: GNU make with every recipe command placed on a node of
//! the cluster through the processor pool (Sprite's pmake).
//!
//! make runs here, as it would, with one change: its `SHELL` is shoal's
//! make shell (this binary under the name `shoal-make-shell`), so each
//! recipe, whatever it runs, goes through `shoal run --any --wait`
//! (`--retry` too: a recipe remade after its node's loss is what make
//! itself would do on a rerun).  The recipe runs under the real shell
//! (`--shell`, `/bin/sh` by default) with the flags make gives its shell
//! (`.SHELLFLAGS`, so `.ONESHELL` and `-e` keep their meaning); its exit
//! status is the recipe's, so `-k`, `-i` and errors behave as ever; make's
//! `--output-sync=target` keeps each job's output together.  A recursive
//! make (a recipe line make hands its jobserver, `$(MAKE)` or `+`) runs
//! here, sharing the jobserver, and its own recipes go to the cluster.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use clap::Args;
use shoal_node::{NodeRequest, NodeStatus, ask};
use shoal_rpc::Context;

use crate::Failure;

/// The name this binary answers to as make's shell.
const SHELL_NAME: &str = "shoal-make-shell";
/// The real shell recipes run under (for the make shell).
const SHELL_ENV: &str = "SHOAL_MAKE_SHELL";
/// `--retry` for every recipe (for the make shell).
const RETRY_ENV: &str = "SHOAL_MAKE_RETRY";

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
    let jobs = match args.jobs.or(jobs) {
        Some(0) => return Err(Failure::failed("-j takes at least 1")),
        Some(j) => j,
        None => cluster_cores()?,
    };
    let exe = std::env::current_exe().map_err(|e| Failure::failed(format!("where am I: {e}")))?;
    let dir = ShellDir::new(&exe)?;
    let mut make = Command::new(&args.make);
    make.arg(format!("-j{jobs}"));
    let synced = args
        .args
        .iter()
        .any(|a| a.starts_with("-O") || a.starts_with("--output-sync"));
    if !synced {
        make.arg("--output-sync=target");
    }
    make.arg(format!("SHELL={}", dir.shell.display()))
        .args(&args.args)
        .env(SHELL_ENV, &args.shell)
        .env(RETRY_ENV, args.retry.to_string());
    eprintln!("shoal make: {jobs} jobs at once over the cluster");
    let status = make
        .status()
        .map_err(|e| Failure::failed(format!("cannot run {}: {e}", args.make)))?;
    drop(dir);
    match status.code() {
        Some(0) => Ok(()),
        Some(code) => std::process::exit(code),
        None => Err(Failure::failed(format!(
            "{} was killed: {status}",
            args.make
        ))),
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
fn cluster_cores() -> Result<u32, Failure> {
    let ctx = Context::from_env().map_err(|e| Failure::unreachable(format!("no node: {e}")))?;
    let Some((_, name)) = ctx.config().node.clone() else {
        return Err(Failure::unreachable("the local node did not say who it is"));
    };
    let status: NodeStatus = ask(&ctx, &name, &NodeRequest::Status, Duration::from_secs(2))
        .map_err(|e| Failure::unreachable(format!("the local node {name}: {e}")))?;
    let cores: u32 = status
        .members
        .iter()
        .filter(|m| m.alive)
        .filter_map(|m| m.load.as_ref().map(|l| u32::from(l.cores)))
        .sum();
    Ok(cores.max(1))
}

/// A directory holding the make shell (a link to this binary), removed
/// when dropped.
struct ShellDir {
    dir: PathBuf,
    shell: PathBuf,
}

impl ShellDir {
    fn new(exe: &std::path::Path) -> Result<ShellDir, Failure> {
        let dir = std::env::temp_dir().join(format!(
            "shoal-make-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let shell = dir.join(SHELL_NAME);
        std::fs::create_dir(&dir)
            .and_then(|()| std::os::unix::fs::symlink(exe, &shell))
            .map_err(|e| Failure::failed(format!("cannot make {}: {e}", shell.display())))?;
        Ok(ShellDir { dir, shell })
    }
}

impl Drop for ShellDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// When this binary runs as make's shell (`shoal-make-shell FLAGS...
/// RECIPE`, as make calls `$(SHELL) $(.SHELLFLAGS) RECIPE`): runs the
/// recipe and never returns.  `None` otherwise.
pub fn as_shell() -> Option<std::convert::Infallible> {
    let mut argv = std::env::args_os();
    let name = PathBuf::from(argv.next()?);
    if name.file_name()? != SHELL_NAME {
        return None;
    }
    let args: Vec<String> = argv.map(|a| a.to_string_lossy().into_owned()).collect();
    let shell = std::env::var(SHELL_ENV).unwrap_or_else(|_| "/bin/sh".into());
    if recursive() || args.is_empty() {
        // A recursive make runs here, with the jobserver make gave it.
        let e = Command::new(&shell).args(&args).exec();
        eprintln!("shoal make: cannot run {shell}: {e}");
        std::process::exit(127);
    }
    let retry = std::env::var(RETRY_ENV)
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1);
    // A simple command (words only) runs without a shell, as make itself
    // runs such recipe lines when the shell is /bin/sh.
    let command = match simple_command(&args) {
        Some(words) if shell == "/bin/sh" => words,
        _ => {
            let mut command = vec![shell];
            command.extend(args);
            command
        }
    };
    let run = crate::cmd_run::RunArgs {
        on: None,
        any: true,
        mem_mib: 0,
        allow_owner_active: false,
        wait: true,
        retry,
        tty: false,
        command,
    };
    let code = match crate::cmd_run::run(run) {
        Ok(()) => 0,
        Err(f) => {
            eprintln!("shoal make: {}", f.message);
            i32::from(f.code)
        }
    };
    std::process::exit(code)
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

/// Whether make handed this recipe its jobserver: it does so only for a
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
