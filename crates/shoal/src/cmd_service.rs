//! `shoal service`: the services the node daemons keep
//! (`docs/services.md`), from any node for any node.  Anyone may list
//! them; root starts, stops and restarts them; their logs are root's and
//! their own user's.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use shoal_nodesvc::{NodeRequest, ServiceAction, ServiceAnswer, ServiceStatus, ask};
use shoal_rpc::Context;

use crate::Failure;

/// How long a node has to answer.
const DEADLINE: Duration = Duration::from_secs(3);
/// How long `start`, `stop` and `restart` watch for the state they asked.
const SETTLE: Duration = Duration::from_secs(15);
/// How often `logs -f` asks for more.
const FOLLOW_EVERY: Duration = Duration::from_millis(500);

#[derive(Subcommand)]
pub enum ServiceCommand {
    /// List a node's services: state, pid, user, starts, last exit.
    Ls(LsArgs),
    /// Start a stopped service (root's).
    Start(CtlArgs),
    /// Stop a service: SIGTERM, then SIGKILL after its stop timeout; it
    /// stays stopped until started (root's).
    Stop(CtlArgs),
    /// Stop a service and start it again, whatever its restart policy
    /// (root's).
    Restart(CtlArgs),
    /// Print a service's log (root's, and the service's own user's).
    Logs(LogsArgs),
}

/// Which node to ask.
#[derive(Args)]
pub struct Target {
    /// The node, by name (default: the node this program is attached to,
    /// or a local cluster's first).
    #[arg(long)]
    pub node: Option<String>,
    /// A local cluster's directory, to reach it from outside its nodes.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

#[derive(Args)]
pub struct LsArgs {
    #[command(flatten)]
    pub target: Target,
    /// Every node's services.
    #[arg(long, conflicts_with = "node")]
    pub all: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct CtlArgs {
    /// The service's name.
    pub name: String,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Args)]
pub struct LogsArgs {
    /// The service's name.
    pub name: String,
    #[command(flatten)]
    pub target: Target,
    /// How many of the last lines to print.
    #[arg(short = 'n', long, default_value_t = 50)]
    pub lines: u32,
    /// Keep printing what the service writes, until interrupted.
    #[arg(short, long)]
    pub follow: bool,
}

pub fn run(command: ServiceCommand) -> Result<(), Failure> {
    match command {
        ServiceCommand::Ls(args) => ls(args),
        ServiceCommand::Start(args) => control(args, ServiceAction::Start),
        ServiceCommand::Stop(args) => control(args, ServiceAction::Stop),
        ServiceCommand::Restart(args) => control(args, ServiceAction::Restart),
        ServiceCommand::Logs(args) => logs(args),
    }
}

/// One row of `shoal service ls`.
#[derive(serde::Serialize)]
struct Row {
    node: String,
    #[serde(flatten)]
    service: ServiceStatus,
}

fn ls(args: LsArgs) -> Result<(), Failure> {
    let (ctx, name) = crate::cmd_status::attach(args.target.dir, args.target.node)?;
    let nodes = if args.all {
        let status: shoal_nodesvc::NodeStatus = ask(&ctx, &name, &NodeRequest::Status, DEADLINE)
            .map_err(|e| Failure::unreachable(format!("{name} is unreachable: {e}")))?;
        let mut names: Vec<String> = status
            .members
            .into_iter()
            .filter(|m| m.alive)
            .map(|m| m.name)
            .collect();
        // n2 before n10.
        names.sort_by(|a, b| (a.len(), a).cmp(&(b.len(), b)));
        names
    } else {
        vec![name]
    };
    let mut rows = Vec::new();
    let mut unreachable = Vec::new();
    for node in nodes {
        match services(&ctx, &node) {
            Ok(list) => rows.extend(list.into_iter().map(|service| Row {
                node: node.clone(),
                service,
            })),
            Err(e) if args.all => unreachable.push(e.message),
            Err(e) => return Err(e),
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("serializes")
        );
    } else {
        println!(
            "{:<8} {:<14} {:<9} {:>8} {:<10} {:>6} {:>9}  LAST EXIT",
            "NODE", "SERVICE", "STATE", "PID", "USER", "STARTS", "FOR"
        );
        for r in &rows {
            let s = &r.service;
            println!(
                "{:<8} {:<14} {:<9} {:>8} {:<10} {:>6} {:>9}  {}",
                r.node,
                s.name,
                s.state,
                s.pid.map_or("-".into(), |p| p.to_string()),
                s.user,
                s.starts,
                s.for_s.map_or("-".into(), |f| format!("{f:.0}s")),
                s.error
                    .clone()
                    .or_else(|| s.last_exit.clone())
                    .unwrap_or_else(|| "-".into())
            );
        }
    }
    for e in &unreachable {
        eprintln!("shoal: {e}");
    }
    if unreachable.is_empty() {
        Ok(())
    } else {
        Err(Failure::unreachable(format!(
            "{} node(s) did not answer",
            unreachable.len()
        )))
    }
}

/// Node `node`'s services.
fn services(ctx: &Context, node: &str) -> Result<Vec<ServiceStatus>, Failure> {
    match ask(ctx, node, &NodeRequest::Services, DEADLINE)
        .map_err(|e| Failure::unreachable(format!("{node} is unreachable: {e}")))?
    {
        ServiceAnswer::Services { services } => Ok(services),
        ServiceAnswer::Error { message } => Err(Failure::failed(message)),
        _ => Err(Failure::failed(format!("{node} gave an unexpected answer"))),
    }
}

fn control(args: CtlArgs, action: ServiceAction) -> Result<(), Failure> {
    let (ctx, node) = crate::cmd_status::attach(args.target.dir, args.target.node)?;
    let name = &args.name;
    let find = |ctx: &Context| -> Result<ServiceStatus, Failure> {
        services(ctx, &node)?
            .into_iter()
            .find(|s| &s.name == name)
            .ok_or_else(|| Failure::failed(format!("no service named {name:?} on {node}")))
    };
    let before = find(&ctx)?;
    let request = NodeRequest::ServiceCtl {
        name: name.clone(),
        action,
    };
    match ask(&ctx, &node, &request, DEADLINE)
        .map_err(|e| Failure::unreachable(format!("{node} is unreachable: {e}")))?
    {
        ServiceAnswer::Done => {}
        ServiceAnswer::Error { message } => return Err(Failure::failed(message)),
        _ => return Err(Failure::failed(format!("{node} gave an unexpected answer"))),
    }
    // Watch until it is where it was asked to be.
    let settled = |s: &ServiceStatus| match action {
        ServiceAction::Stop => s.state == "stopped",
        ServiceAction::Start => s.state == "running" || s.starts > before.starts,
        ServiceAction::Restart => s.state == "running" && s.starts > before.starts,
    };
    let started = Instant::now();
    loop {
        let now = find(&ctx)?;
        if settled(&now) {
            let pid = now.pid.map_or(String::new(), |p| format!(", pid {p}"));
            eprintln!("{name} on {node}: {}{pid}", now.state);
            return Ok(());
        }
        if started.elapsed() > SETTLE {
            return Err(Failure::failed(format!(
                "{name} on {node} is {} after {} s{}",
                now.state,
                SETTLE.as_secs(),
                now.error.map_or(String::new(), |e| format!(": {e}"))
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn logs(args: LogsArgs) -> Result<(), Failure> {
    let (ctx, node) = crate::cmd_status::attach(args.target.dir, args.target.node)?;
    let mut from = None;
    loop {
        let request = NodeRequest::ServiceLogs {
            name: args.name.clone(),
            lines: args.lines,
            from,
        };
        match ask(&ctx, &node, &request, DEADLINE)
            .map_err(|e| Failure::unreachable(format!("{node} is unreachable: {e}")))?
        {
            ServiceAnswer::Logs { text, end } => {
                print!("{text}");
                use std::io::Write;
                let _ = std::io::stdout().flush();
                from = Some(end);
            }
            ServiceAnswer::Error { message } => return Err(Failure::failed(message)),
            _ => return Err(Failure::failed(format!("{node} gave an unexpected answer"))),
        }
        if !args.follow {
            return Ok(());
        }
        std::thread::sleep(FOLLOW_EVERY);
    }
}
