//! `shoal cluster ...`: local clusters for development, demos and tests;
//! and the administrator's commands for real ones (`init`, `admit`,
//! `revoke`, `services`).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use shoal_cluster::{Cluster, Mode, Spec};
use shoal_nodesvc::identity::Admin;

use crate::Failure;

#[derive(Args, Clone)]
pub struct DirArg {
    /// The cluster's directory (default: $SHOAL_CLUSTER, else /run/shoal/cluster for root and /tmp/shoal-cluster-UID for others).
    #[arg(long, global = true)]
    pub dir: Option<PathBuf>,
}

impl DirArg {
    fn dir(&self) -> PathBuf {
        self.dir.clone().unwrap_or_else(shoal_cluster::default_dir)
    }
}

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Start N nodes on this machine (namespaces as root, loopback
    /// otherwise) with the whole system: a directory service of up to
    /// three replicas, a file server on every node, the cluster's root
    /// directory and (namespaced) the shared file system mounted at /shoal
    /// on every node, kept by the node daemons as services (--bare: nodes
    /// only).
    Up {
        /// How many nodes.
        #[arg(long, default_value_t = 4)]
        nodes: usize,
        /// Short name used in namespace and interface names (1-4 characters).
        #[arg(long, default_value = "c")]
        name: String,
        /// Subnet 10.77.SUBNET.0/24 (or port block on loopback), 1-250.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=250))]
        subnet: u8,
        /// Share loopback instead of namespaces, even as root.
        #[arg(long)]
        loopback: bool,
        /// Only the nodes: no directory service, file servers or root.
        #[arg(long)]
        bare: bool,
        #[command(flatten)]
        dir: DirArg,
    },
    /// Stop every node and remove the cluster.
    Down {
        #[command(flatten)]
        dir: DirArg,
    },
    /// Every node's state, as seen from this machine.
    Status {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Wait this long for each node before calling it unreachable.
        #[arg(long, default_value_t = 1000)]
        deadline_ms: u64,
        #[command(flatten)]
        dir: DirArg,
    },
    /// Run a program on a node (in its namespace, attached to it).
    Exec {
        /// The node, e.g. n2.
        #[arg(long)]
        node: String,
        /// The program and its arguments.
        #[arg(required = true, last = true)]
        command: Vec<String>,
        #[command(flatten)]
        dir: DirArg,
    },
    /// Start a node's daemon again (after kill or stop).
    Start(NodeArg),
    /// Stop a node's daemon cleanly (SIGTERM).
    Stop(NodeArg),
    /// Kill a node's daemon (SIGKILL), as a crash would.
    Kill(NodeArg),
    /// Cut a node off the cluster network (iptables in its namespace).
    Partition(NodeArg),
    /// Drop a share of a node's packets at random, each way.
    Loss {
        #[command(flatten)]
        node: NodeArg,
        /// Percentage of packets dropped.
        #[arg(long)]
        percent: f64,
    },
    /// Undo partition and loss on a node.
    Heal(NodeArg),
    /// Make a new cluster's admin key and id (for real machines): prints
    /// the lines every node's configuration needs.
    Init(AdminArg),
    /// Admit a node: print a certificate for its name and key (from
    /// `shoal node key` on that machine), to save as its node.cert.
    Admit {
        /// The node's name.
        name: String,
        /// The node's static public key, 64 hex digits.
        key: String,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = shoal_nodesvc::identity::CERT_DAYS)]
        days: u64,
        /// The node's address (IP:PORT): with --seed, print the whole
        /// `shoal node join` command to run on it instead of the
        /// certificate alone.
        #[arg(long, requires = "seeds")]
        addr: Option<std::net::SocketAddr>,
        /// A node already in the cluster, for the join command
        /// (repeatable).
        #[arg(long = "seed", requires = "addr")]
        seeds: Vec<std::net::SocketAddr>,
        #[command(flatten)]
        admin: AdminArg,
    },
    /// Revoke a node's certificates (by name or serial): print the new
    /// revocation list, to hand to any node with `shoal node revoke`.
    Revoke {
        /// The node's name, or a certificate serial.
        node: String,
        #[command(flatten)]
        admin: AdminArg,
    },
    /// Sign a new service map: which nodes serve each system service
    /// (`docs/security.md`, "Which nodes serve the system"); print it, to
    /// hand to any node with `shoal node services`.  Every system service
    /// the map names is served by the nodes it names alone; services it
    /// does not name are not limited.
    Services {
        /// A service and its nodes, as `NAME=NODE,NODE...`, e.g.
        /// "directory service dir=n1,n2,n3" (repeatable; the whole map,
        /// replacing the last one).
        #[arg(required = true)]
        services: Vec<String>,
        #[command(flatten)]
        admin: AdminArg,
    },
}

#[derive(Args, Clone)]
pub struct AdminArg {
    /// Where the admin key lives (default: $SHOAL_ADMIN_DIR, else
    /// ~/.config/shoal/admin); a directory only its owner may enter.
    #[arg(long)]
    pub admin_dir: Option<PathBuf>,
}

impl AdminArg {
    fn dir(&self) -> PathBuf {
        self.admin_dir
            .clone()
            .or_else(|| std::env::var_os("SHOAL_ADMIN_DIR").map(PathBuf::from))
            .unwrap_or_else(|| crate::cmd_dir::config_dir().join("admin"))
    }
}

#[derive(Args)]
pub struct NodeArg {
    /// The node, e.g. n2.
    pub node: String,
    #[command(flatten)]
    pub dir: DirArg,
}

fn progress(line: &str) {
    eprintln!("  {line}");
}

pub fn run(command: ClusterCommand) -> Result<(), Failure> {
    match command {
        ClusterCommand::Up {
            nodes,
            name,
            subnet,
            loopback,
            bare,
            dir,
        } => {
            let mode = if loopback || !shoal_cluster::is_root() {
                Mode::Loopback
            } else {
                Mode::Netns
            };
            let shoal = std::env::current_exe().map_err(|e| e.to_string())?;
            let spec = Spec {
                dir: dir.dir(),
                nodes,
                name,
                subnet,
                mode,
                shoal,
            };
            eprintln!(
                "starting {nodes} nodes ({}) in {}",
                match mode {
                    Mode::Netns => "each in its own network namespace",
                    Mode::Loopback => "on loopback",
                },
                spec.dir.display()
            );
            let cluster = Cluster::up(&spec, &mut progress)?;
            if bare {
                eprintln!("cluster up: {} nodes", cluster.file().nodes.len());
                return Ok(());
            }
            if let Err(e) = cluster.start_system(&mut progress) {
                return Err(Failure::failed(format!(
                    "{e}\nthe nodes run; `shoal cluster down` removes them"
                )));
            }
            let n = cluster.file().nodes.len();
            let s = if n == 1 { "" } else { "s" };
            eprintln!(
                "cluster up: {n} node{s}, a directory service, {n} file server{s}; \
                 `shoal service ls --all` lists the services"
            );
            Ok(())
        }
        ClusterCommand::Down { dir } => {
            let cluster = Cluster::open(&dir.dir())?;
            cluster.down(&mut progress)?;
            Ok(())
        }
        ClusterCommand::Status {
            json,
            deadline_ms,
            dir,
        } => status(&dir.dir(), json, Duration::from_millis(deadline_ms)),
        ClusterCommand::Exec { node, command, dir } => {
            use std::os::unix::process::CommandExt;
            let cluster = Cluster::open(&dir.dir())?;
            let mut cmd = cluster.command(&node, &command[0])?;
            cmd.args(&command[1..]);
            // Become the program, so signals and the exit code are its own.
            let e = cmd.exec();
            Err(Failure::failed(format!("cannot run {}: {e}", command[0])))
        }
        ClusterCommand::Start(n) => {
            let cluster = Cluster::open(&n.dir.dir())?;
            cluster.start_node(&n.node)?;
            eprintln!("{} started", n.node);
            Ok(())
        }
        ClusterCommand::Stop(n) => Ok(Cluster::open(&n.dir.dir())?.stop(&n.node)?),
        ClusterCommand::Kill(n) => Ok(Cluster::open(&n.dir.dir())?.kill(&n.node)?),
        ClusterCommand::Partition(n) => Ok(Cluster::open(&n.dir.dir())?.partition(&n.node)?),
        ClusterCommand::Loss { node, percent } => {
            Ok(Cluster::open(&node.dir.dir())?.loss(&node.node, percent)?)
        }
        ClusterCommand::Heal(n) => Ok(Cluster::open(&n.dir.dir())?.heal(&n.node)?),
        ClusterCommand::Init(admin) => {
            let a = Admin::create(&admin.dir())?;
            eprintln!("admin key made in {} (keep it safe)", admin.dir().display());
            eprintln!("every node's configuration needs:");
            println!("cluster_id = \"{}\"", a.cluster().to_hex());
            println!("admin_key = \"{}\"", a.public().to_hex());
            eprintln!(
                "to join a host: run `shoal node key` on it, then here \
                 `shoal cluster admit NAME KEY --addr ITS_IP:7700 --seed FIRST_IP:7700`, \
                 and run the command that prints on it (docs/operations.md)"
            );
            Ok(())
        }
        ClusterCommand::Admit {
            name,
            key,
            days,
            addr,
            seeds,
            admin,
        } => {
            let key: [u8; 32] = hex::decode(key.trim())
                .ok()
                .and_then(|k| k.try_into().ok())
                .ok_or_else(|| Failure::usage("the node's key must be 64 hex digits"))?;
            let admin = Admin::open(&admin.dir())?;
            let cert = hex::encode(admin.admit(&name, key, days)?);
            let Some(addr) = addr else {
                println!("{cert}");
                eprintln!(
                    "save it as {name}'s STATE_DIR/node.cert, or give --addr and --seed for the \
                     `shoal node join` command to run on {name}"
                );
                return Ok(());
            };
            let seeds: String = seeds.iter().map(|s| format!(" --seed {s}")).collect();
            eprintln!("on {name}, as root:");
            println!(
                "shoal node join --name {name} --addr {addr}{seeds} --cluster-id {} --admin-key {} --cert {cert}",
                admin.cluster().to_hex(),
                admin.public().to_hex()
            );
            Ok(())
        }
        ClusterCommand::Revoke { node, admin } => {
            let list = Admin::open(&admin.dir())?.revoke(&node)?;
            println!("{}", hex::encode(list));
            Ok(())
        }
        ClusterCommand::Services { services, admin } => {
            let mut parsed = Vec::new();
            for given in &services {
                let Some((name, nodes)) = given.split_once('=') else {
                    return Err(Failure::usage(format!(
                        "{given:?}: give a service as NAME=NODE,NODE..."
                    )));
                };
                let nodes: Vec<String> = nodes
                    .split(',')
                    .map(|n| n.trim().to_string())
                    .filter(|n| !n.is_empty())
                    .collect();
                if name.trim().is_empty() || nodes.is_empty() {
                    return Err(Failure::usage(format!(
                        "{given:?}: a service needs a name and at least one node"
                    )));
                }
                parsed.push((name.trim().to_string(), nodes));
            }
            let map = Admin::open(&admin.dir())?.services(&parsed)?;
            println!("{}", hex::encode(map));
            eprintln!("hand it to any node with `shoal node services -`");
            Ok(())
        }
    }
}

fn status(dir: &std::path::Path, json: bool, deadline: Duration) -> Result<(), Failure> {
    let cluster = Cluster::open(dir)?;
    let ctx = cluster.context();
    let mut rows = Vec::new();
    let mut unreachable = 0;
    for node in &cluster.file().nodes {
        let pid = cluster.pid(&node.name);
        let status = cluster.status(&ctx, &node.name, deadline);
        if status.is_err() {
            unreachable += 1;
        }
        rows.push((node.clone(), pid, status));
    }
    if json {
        let v: Vec<_> = rows
            .iter()
            .map(|(n, pid, s)| match s {
                Ok(s) => serde_json::json!({"name": n.name, "addr": n.addr, "pid": pid, "state": "up", "status": s}),
                Err(e) => serde_json::json!({"name": n.name, "addr": n.addr, "pid": pid, "state": "unreachable", "error": e}),
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v).expect("serializes"));
    } else {
        println!(
            "{:<6} {:<20} {:<12} {:>8} {:>8} {:>6} {:>6}",
            "NODE", "ADDRESS", "STATE", "PID", "UPTIME", "SEES", "PORTS"
        );
        for (n, pid, s) in &rows {
            let pid = pid.map_or("-".to_string(), |p| p.to_string());
            match s {
                Ok(s) => println!(
                    "{:<6} {:<20} {:<12} {:>8} {:>7.1}s {:>6} {:>6}",
                    n.name,
                    n.addr.to_string(),
                    "up",
                    pid,
                    s.uptime_s,
                    format!(
                        "{}/{}",
                        s.members.iter().filter(|m| m.alive).count(),
                        s.members.len()
                    ),
                    s.ports
                ),
                Err(e) => println!(
                    "{:<6} {:<20} {:<12} {:>8}        -      -      -   {e}",
                    n.name,
                    n.addr.to_string(),
                    "unreachable",
                    pid
                ),
            }
        }
    }
    if unreachable > 0 {
        return Err(Failure::unreachable(format!(
            "{unreachable} of {} nodes unreachable",
            rows.len()
        )));
    }
    Ok(())
}
