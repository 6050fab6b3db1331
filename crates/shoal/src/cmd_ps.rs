//! `shoal ps`, `shoal kill` and `shoal wait`: the cluster's processes,
//! from any node.  Each process is answered for by its home (the node its
//! id names), wherever it runs: `ps` asks every node for the processes it
//! is the home of and for those it runs; `kill` and `wait` go to the home.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use clap::Args;
use shoal_nodesvc::{MemberStatus, NodeRequest, NodeStatus, ProcAnswer, RunningProc, ask};
use shoal_pool::ProcId;
use shoal_rpc::Context;
use shoal_rpc::link::ProcEnd;

use crate::Failure;

/// How long a node has to answer.
const DEADLINE: Duration = Duration::from_secs(2);
/// Exit status of `shoal wait` for a process its home does not know.
const NO_SUCH_PROCESS: u8 = 127;
/// Exit status of `shoal wait` when the process's fate is unknown.
const FATE_UNKNOWN: u8 = 255;

#[derive(Args)]
pub struct PsArgs {
    /// Also list the ended processes the homes still remember.
    #[arg(long, short)]
    pub all: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct KillArgs {
    /// The signal, by name or number (default TERM); also `-SIGNAL`
    /// before the ids, as kill(1) takes it.
    #[arg(long, short = 's')]
    pub signal: Option<String>,
    /// [-SIGNAL] ID...: the processes (HOME.NUMBER, HOME a node id or name).
    #[arg(required = true, allow_hyphen_values = true, value_name = "ID")]
    pub ids: Vec<String>,
}

#[derive(Args)]
pub struct WaitArgs {
    /// The process (HOME.NUMBER, HOME a node id or name).  `shoal wait`
    /// ends as it ended: its exit status, or 128 + the signal that killed
    /// it.
    pub id: String,
}

/// One row of `shoal ps`.
#[derive(serde::Serialize)]
struct Row {
    id: String,
    home: String,
    node: String,
    /// Who started it, named as this node names the uid.
    user: String,
    state: String,
    cpu_s: Option<f64>,
    rss_kib: Option<u64>,
    age_s: Option<f64>,
    command: String,
}

pub fn ps(args: PsArgs) -> Result<(), Failure> {
    let (ctx, status) = local()?;
    let alive: Vec<&MemberStatus> = status.members.iter().filter(|m| m.alive).collect();
    // Every node at once: a slow one costs one deadline, not one each.
    let answers: Vec<(String, Result<ProcAnswer, String>)> = std::thread::scope(|s| {
        let asks: Vec<_> = alive
            .iter()
            .map(|m| {
                let ctx = &ctx;
                let request = NodeRequest::Procs { ended: args.all };
                let name = m.name.clone();
                s.spawn(move || {
                    let answer = ask(ctx, &name, &request, DEADLINE);
                    (name, answer)
                })
            })
            .collect();
        asks.into_iter()
            .map(|h| h.join().expect("ask thread"))
            .collect()
    });
    let names: HashMap<String, String> = status
        .members
        .iter()
        .map(|m| (m.node.clone(), m.name.clone()))
        .collect();
    let mut homed = Vec::new();
    let mut running: HashMap<String, (String, RunningProc)> = HashMap::new();
    for (name, answer) in answers {
        match answer {
            Ok(ProcAnswer::Procs {
                homed: h,
                running: r,
            }) => {
                homed.extend(h.into_iter().map(|p| (name.clone(), p)));
                running.extend(r.into_iter().map(|p| (p.id.clone(), (name.clone(), p))));
            }
            Ok(_) => eprintln!("shoal ps: {name} gave an unexpected answer"),
            Err(e) => eprintln!("shoal ps: node {name} did not answer: {e}"),
        }
    }
    let mut rows = Vec::new();
    for (home, p) in homed {
        let here = running.remove(&p.id).map(|(_, r)| r);
        let state = match (&p.end, &here) {
            (Some(end), _) => describe(*end),
            (None, Some(r)) if r.stopped => "stopped".into(),
            (None, _) => "running".into(),
        };
        rows.push(Row {
            id: readable(&p.id, Some(&home)),
            home,
            node: p.node,
            user: shoal_nodesvc::account::user_name(p.uid),
            state,
            cpu_s: here.as_ref().map(|r| r.cpu_s),
            rss_kib: here.as_ref().map(|r| r.rss_kib),
            age_s: Some(p.age_s),
            command: p.command,
        });
    }
    // Processes whose home did not answer still show where they run.
    for (id, (node, r)) in running {
        let home = ProcId::from_str(&id)
            .ok()
            .and_then(|i| names.get(&i.home.to_string()).cloned());
        rows.push(Row {
            id: readable(&id, home.as_deref()),
            home: home.unwrap_or_else(|| "?".into()),
            node,
            user: "?".into(),
            state: "running (home silent)".into(),
            cpu_s: Some(r.cpu_s),
            rss_kib: Some(r.rss_kib),
            age_s: None,
            command: String::new(),
        });
    }
    // n1.9 before n1.10, n2 before n10.
    rows.sort_by_key(|r| {
        let seq: u64 =
            r.id.rsplit('.')
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
        (r.home.len(), r.home.clone(), seq)
    });
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("serializes")
        );
        return Ok(());
    }
    // Columns as wide as their longest entry, as ps(1) does for names.
    let width =
        |f: &dyn Fn(&Row) -> usize, least: usize| rows.iter().map(f).fold(least, usize::max);
    let id = width(&|r| r.id.len(), 8);
    let home = width(&|r| r.home.len(), 8);
    let node = width(&|r| r.node.len(), 8);
    let user = width(&|r| r.user.len(), 8);
    println!(
        "{:<id$} {:<home$} {:<node$} {:<user$} {:<22} {:>8} {:>9} {:>8}  COMMAND",
        "ID", "HOME", "NODE", "USER", "STATE", "CPU", "RSS", "AGE"
    );
    for r in rows {
        println!(
            "{:<id$} {:<home$} {:<node$} {:<user$} {:<22} {:>8} {:>9} {:>8}  {}",
            r.id,
            r.home,
            r.node,
            r.user,
            r.state,
            r.cpu_s.map_or("-".into(), |c| format!("{c:.2}s")),
            r.rss_kib
                .map_or("-".into(), |k| format!("{:.1}M", k as f64 / 1024.0)),
            r.age_s.map_or("-".into(), |a| format!("{a:.0}s")),
            r.command
        );
    }
    Ok(())
}

pub fn kill(args: KillArgs) -> Result<(), Failure> {
    let mut ids = args.ids.as_slice();
    let mut signal = args.signal.clone();
    if let Some(first) = ids.first().and_then(|a| a.strip_prefix('-')) {
        if signal.is_some() {
            return Err(usage("give the signal once"));
        }
        signal = Some(first.to_string());
        ids = &ids[1..];
    }
    if ids.is_empty() {
        return Err(usage("name a process to signal"));
    }
    let signal = match signal {
        None => libc::SIGTERM,
        Some(s) => signal_number(&s).ok_or_else(|| usage(&format!("no signal {s:?}")))?,
    };
    let (ctx, status) = local()?;
    let mut failures: Vec<Failure> = Vec::new();
    for text in ids {
        let result = resolve(text, &status.members).and_then(|(id, home)| {
            let request = NodeRequest::Kill {
                id: id.to_string(),
                signal,
            };
            match ask(&ctx, &home, &request, DEADLINE) {
                Ok(ProcAnswer::Done) => Ok(()),
                Ok(ProcAnswer::Error { message }) => Err(Failure::failed(message)),
                Ok(_) => Err(Failure::failed("the home gave an unexpected answer")),
                Err(e) => Err(Failure::unreachable(format!(
                    "the home {home} of {id} is unreachable: {e}"
                ))),
            }
        });
        if let Err(f) = result {
            failures.push(f);
        }
    }
    if failures.len() > 1 {
        for f in &failures {
            eprintln!("shoal kill: {}", f.message);
        }
        return Err(Failure {
            code: failures[0].code,
            message: format!(
                "{} of {} processes were not signalled",
                failures.len(),
                ids.len()
            ),
        });
    }
    match failures.pop() {
        None => Ok(()),
        Some(f) => Err(f),
    }
}

pub fn wait(args: WaitArgs) -> Result<(), Failure> {
    let (ctx, status) = local()?;
    let (id, home) = resolve(&args.id, &status.members)?;
    let request = NodeRequest::Wait {
        id: id.to_string(),
        wait_ms: 1000,
    };
    loop {
        match ask(&ctx, &home, &request, DEADLINE + Duration::from_secs(1)) {
            Ok(ProcAnswer::Waited { end: None }) => continue,
            Ok(ProcAnswer::Waited { end: Some(end) }) => {
                return match end {
                    ProcEnd::Exited(0) => Ok(()),
                    ProcEnd::Exited(c) => std::process::exit(c),
                    ProcEnd::Killed(s) => std::process::exit(128 + s),
                    ProcEnd::Lost | ProcEnd::NotStarted => Err(Failure {
                        code: FATE_UNKNOWN,
                        message: format!("the fate of {} is unknown: {}", args.id, describe(end)),
                    }),
                };
            }
            Ok(ProcAnswer::Error { message }) => {
                return Err(Failure {
                    code: NO_SUCH_PROCESS,
                    message,
                });
            }
            Ok(_) => return Err(Failure::failed("the home gave an unexpected answer")),
            Err(e) => {
                return Err(Failure::unreachable(format!(
                    "the home {home} of {} is unreachable: {e}",
                    args.id
                )));
            }
        }
    }
}

/// The local node and its view of the cluster.
pub fn local() -> Result<(Context, NodeStatus), Failure> {
    let ctx = Context::from_env().map_err(|e| Failure::unreachable(format!("no node: {e}")))?;
    let Some((_, name)) = ctx.config().node.clone() else {
        return Err(Failure::unreachable("the local node did not say who it is"));
    };
    let status = ask(&ctx, &name, &NodeRequest::Status, DEADLINE)
        .map_err(|e| Failure::unreachable(format!("the local node {name}: {e}")))?;
    Ok((ctx, status))
}

/// A process id as typed (its home a node id or name): the id and the
/// home's name.
fn resolve(text: &str, members: &[MemberStatus]) -> Result<(ProcId, String), Failure> {
    let (home, seq) = text.split_once('.').ok_or_else(|| {
        usage(&format!(
            "a process id is HOME.NUMBER (for example n1.42), not {text:?}"
        ))
    })?;
    let member = members
        .iter()
        .find(|m| m.name == home || m.node == home)
        .ok_or_else(|| Failure::failed(format!("no node {home} in the cluster (in id {text})")))?;
    let id = format!("{}.{seq}", member.node)
        .parse::<ProcId>()
        .map_err(|e| usage(&e.to_string()))?;
    if !member.alive {
        return Err(Failure::unreachable(format!(
            "the home {} of {} is down",
            member.name,
            id.named(Some(&member.name))
        )));
    }
    Ok((id, member.name.clone()))
}

fn usage(message: &str) -> Failure {
    Failure {
        code: 2,
        message: message.to_string(),
    }
}

/// A process id as a person types it: its home's name and its number
/// (`n1.42`), which `kill` and `wait` take as they take the node id's
/// form.
fn readable(id: &str, home: Option<&str>) -> String {
    id.parse::<ProcId>()
        .map_or_else(|_| id.to_string(), |id| id.named(home))
}

/// How a process ended, in words.
fn describe(end: ProcEnd) -> String {
    match end {
        ProcEnd::Exited(c) => format!("exited {c}"),
        ProcEnd::Killed(s) => format!("killed by {}", signal_name(s)),
        ProcEnd::NotStarted => "not started".into(),
        ProcEnd::Lost => "lost".into(),
    }
}

const SIGNALS: [(&str, i32); 31] = [
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("ILL", libc::SIGILL),
    ("TRAP", libc::SIGTRAP),
    ("ABRT", libc::SIGABRT),
    ("BUS", libc::SIGBUS),
    ("FPE", libc::SIGFPE),
    ("KILL", libc::SIGKILL),
    ("USR1", libc::SIGUSR1),
    ("SEGV", libc::SIGSEGV),
    ("USR2", libc::SIGUSR2),
    ("PIPE", libc::SIGPIPE),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("STKFLT", libc::SIGSTKFLT),
    ("CHLD", libc::SIGCHLD),
    ("CONT", libc::SIGCONT),
    ("STOP", libc::SIGSTOP),
    ("TSTP", libc::SIGTSTP),
    ("TTIN", libc::SIGTTIN),
    ("TTOU", libc::SIGTTOU),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("XFSZ", libc::SIGXFSZ),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("IO", libc::SIGIO),
    ("PWR", libc::SIGPWR),
    ("SYS", libc::SIGSYS),
];

/// A signal by number or name (`TERM`, `SIGTERM`, any case).
fn signal_number(text: &str) -> Option<i32> {
    if let Ok(n) = text.parse::<i32>() {
        return (0..65).contains(&n).then_some(n);
    }
    let upper = text.to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    SIGNALS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

fn signal_name(signal: i32) -> String {
    SIGNALS
        .iter()
        .find(|(_, s)| *s == signal)
        .map_or(format!("signal {signal}"), |(n, _)| format!("SIG{n}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_wire::NodeId;

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(signal_number("9"), Some(9));
        assert_eq!(signal_number("kill"), Some(libc::SIGKILL));
        assert_eq!(signal_number("SIGTERM"), Some(libc::SIGTERM));
        assert_eq!(signal_number("TSTP"), Some(libc::SIGTSTP));
        assert_eq!(signal_number("NOPE"), None);
        assert_eq!(signal_number("99"), None);
        assert_eq!(signal_name(libc::SIGINT), "SIGINT");
        assert_eq!(signal_name(40), "signal 40");
    }

    #[test]
    fn ids_resolve_by_node_name_or_id() {
        let member = |name: &str, node: &str, alive: bool| MemberStatus {
            name: name.into(),
            node: node.into(),
            addr: "10.0.0.1:1".into(),
            alive,
            silent_ms: None,
            load: None,
        };
        let members = [
            member("n1", "00000000000000a1", true),
            member("n2", "00000000000000b2", false),
        ];
        let (id, home) = resolve("n1.42", &members).unwrap();
        assert_eq!((id.home, id.seq, home.as_str()), (NodeId(0xa1), 42, "n1"));
        let (id, _) = resolve("00000000000000a1.7", &members).unwrap();
        assert_eq!(id.seq, 7);
        assert_eq!(resolve("n2.1", &members).unwrap_err().code, 3);
        assert!(
            resolve("n9.1", &members)
                .unwrap_err()
                .message
                .contains("no node n9")
        );
        assert_eq!(resolve("n1", &members).unwrap_err().code, 2);
        assert_eq!(resolve("n1.x", &members).unwrap_err().code, 2);
    }
}
