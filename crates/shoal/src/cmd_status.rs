//! `shoal status`: one node's view of itself and the cluster.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use shoal_cluster::Cluster;
use shoal_nodesvc::NodeStatus;

use crate::Failure;

/// Without `--dir` or `$SHOAL_CLUSTER`, the node this program is attached
/// to (`$SHOAL_NODE`, else the default socket) is asked, as on a real
/// machine; if there is none, the local cluster in its default directory.
#[derive(Args)]
pub struct StatusArgs {
    /// The local cluster's directory (default: $SHOAL_CLUSTER, else the
    /// node this program is attached to, else /run/shoal/cluster for root
    /// and /tmp/shoal-cluster-UID for others).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The node to ask, by name (default: the local node, or a local
    /// cluster's first).
    #[arg(long)]
    pub node: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Give up on an unreachable node after this many milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub deadline_ms: u64,
}

pub fn run(args: StatusArgs) -> Result<(), Failure> {
    let deadline = Duration::from_millis(args.deadline_ms);
    let (ctx, name) = attach(args.dir, args.node)?;
    let status: NodeStatus =
        shoal_nodesvc::ask(&ctx, &name, &shoal_nodesvc::NodeRequest::Status, deadline)
            .map_err(|e| Failure::unreachable(format!("{name} is unreachable: {e}")))?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status).expect("serializes")
        );
    } else {
        print_status(&status);
    }
    Ok(())
}

/// A context to ask nodes with, and the node to ask (`node`, or the one
/// this program is attached to): the attached node's unless `dir` or
/// `$SHOAL_CLUSTER` names a local cluster or there is no node to attach
/// to, then the local cluster's (its first node by default).
pub fn attach(
    dir: Option<PathBuf>,
    node: Option<String>,
) -> Result<(shoal_rpc::Context, String), Failure> {
    let attached = (dir.is_none() && std::env::var_os("SHOAL_CLUSTER").is_none())
        .then(|| shoal_rpc::Context::from_env().ok())
        .flatten();
    match attached {
        Some(ctx) => {
            let name = match (node, &ctx.config().node) {
                (Some(n), _) => n,
                (None, Some((_, own))) => own.clone(),
                (None, None) => return Err(Failure::failed("the node did not say its name")),
            };
            Ok((ctx, name))
        }
        None => {
            let dir = dir.unwrap_or_else(shoal_cluster::default_dir);
            let cluster = Cluster::open(&dir)?;
            let name = match node {
                Some(n) => n,
                None => cluster.file().nodes[0].name.clone(),
            };
            cluster.node(&name)?;
            Ok((cluster.context(), name))
        }
    }
}

pub fn print_status(s: &NodeStatus) {
    println!("node     {} ({})", s.name, s.node);
    println!("address  {}", s.addr);
    println!("uptime   {:.1}s", s.uptime_s);
    println!("ports    {}", s.ports);
    println!("links    {}", s.links);
    println!(
        "members  {} of {} alive",
        s.members.iter().filter(|m| m.alive).count(),
        s.members.len()
    );
    for m in &s.members {
        let state = if m.alive { "alive" } else { "unreachable" };
        let silent = m
            .silent_ms
            .map_or("never heard".to_string(), |ms| format!("heard {ms} ms ago"));
        let load = m.load.as_ref().map_or(String::new(), |l| {
            format!(
                "  load {:.2}/{} cores, {:.2} cores foreign, {} MiB free, {} shoal processes, owner {}",
                l.run_queue,
                l.cores,
                l.foreign_cpu,
                l.mem_free_mib,
                l.shoal_procs,
                if l.owner_active { "active" } else { "idle" }
            )
        });
        println!(
            "  {:<8} {:<22} {:<12} {}{}",
            m.name, m.addr, state, silent, load
        );
    }
    if !s.services.is_empty() {
        println!("services {}", s.services.len());
        for v in &s.services {
            println!(
                "  {:<12} {:<9} started {} times{}",
                v.name,
                v.state,
                v.starts,
                v.last_exit
                    .as_ref()
                    .map_or(String::new(), |e| format!(", last {e}"))
            );
        }
    }
}
