//! The command line: clap definitions and dispatch.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::Failure;

/// shoal turns a set of Linux machines into one system.
#[derive(Parser)]
#[command(name = "shoal", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node daemon (one per machine).
    Node(NodeArgs),
    /// Show one node's status.
    Status(crate::cmd_status::StatusArgs),
    /// Run a program on a node of the cluster as if it ran here: same
    /// arguments, environment, directory, user, groups, umask, limits and
    /// host name; its output, input, signals and exit status pass through.
    Run(crate::cmd_run::RunArgs),
    /// GNU make with every recipe placed on a node of the cluster.
    Make(crate::cmd_make::MakeArgs),
    /// List the cluster's processes: id, home, node, state, CPU, memory.
    Ps(crate::cmd_ps::PsArgs),
    /// Send a signal to processes of the cluster (through their homes).
    Kill(crate::cmd_ps::KillArgs),
    /// Wait for a process of the cluster to end; end as it ended.
    Wait(crate::cmd_ps::WaitArgs),
    /// The services node daemons keep (directory replicas, file
    /// servers, ...): list, start, stop, restart, logs.
    #[command(subcommand)]
    Service(crate::cmd_service::ServiceCommand),
    /// Manage a local cluster of nodes on this machine.
    #[command(subcommand)]
    Cluster(crate::cmd_cluster::ClusterCommand),
    /// Call and serve ports from the command line.
    #[command(subcommand)]
    Rpc(crate::cmd_rpc::RpcCommand),
    /// Process groups: reliable, totally ordered broadcast.
    #[command(subcommand)]
    Group(crate::cmd_group::GroupCommand),
    /// The directory service: names to capabilities.
    #[command(subcommand)]
    Dir(crate::cmd_dir::DirCommand),
    /// The immutable file service: files stored on k servers, named in
    /// the directory.
    #[command(subcommand)]
    File(crate::cmd_file::FileCommand),
    /// The shared file system: one tree mounted on every node.
    #[command(subcommand)]
    Fs(crate::cmd_fs::FsCommand),
    /// Create your root directory (its capability goes to
    /// $SHOAL_CONFIG_DIR/root, by default ~/.config/shoal/root).
    Init(crate::cmd_init::InitArgs),
    /// Inspect and restrict capabilities (offline: no server needed).
    #[command(subcommand)]
    Cap(crate::cmd_cap::CapCommand),
    /// Run benchmarks side by side with their baselines (`shoal bench
    /// --help`; runs shoal-bench, the benchmark suite, installed beside
    /// shoal).
    #[command(disable_help_flag = true)]
    Bench(BenchArgs),
    /// Print a completion script for SHELL (for example:
    /// `shoal completions bash > /etc/bash_completion.d/shoal`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Flags of `shoal node`; each overrides the config file.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
struct NodeArgs {
    #[command(subcommand)]
    command: Option<NodeCommand>,
    /// TOML configuration file.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Node name, unique in the cluster.
    #[arg(long)]
    name: Option<String>,
    /// Directory for the node's identity and link socket.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Address other nodes and programs reach this node at.
    #[arg(long)]
    addr: Option<SocketAddr>,
    /// Address to bind, if not --addr (0.0.0.0:PORT also hears broadcasts).
    #[arg(long)]
    bind: Option<SocketAddr>,
    /// The cluster network's broadcast address, for locate.
    #[arg(long)]
    broadcast: Option<SocketAddr>,
    /// A node to join through (repeatable).
    #[arg(long = "seed")]
    seeds: Vec<SocketAddr>,
    /// File holding an old shared cluster key, only to count heartbeats
    /// forged under it (nodes need none).
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Serve Prometheus metrics on this address.
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// Body bytes per datagram.
    #[arg(long)]
    frag_bytes: Option<usize>,
}

#[derive(Subcommand)]
enum NodeCommand {
    /// Say whether this machine's owner is using it (or let the node
    /// detect it): while active, the processor pool places no foreign
    /// program here unless asked to.
    Owner {
        #[arg(value_enum)]
        state: OwnerState,
    },
    /// Hand this node a revocation list, as `shoal cluster revoke` prints
    /// it (or `-` to read it from standard input): the node checks it,
    /// keeps it, and passes it on to every other node.  Root only.
    Revoke {
        /// The list, hex, or `-`.
        list: String,
    },
    /// Hand this node a service map, as `shoal cluster services` prints it
    /// (or `-` to read it from standard input): the node checks it, keeps
    /// it, and passes it on to every other node; from then on only the
    /// nodes it names serve the system services it names.  Root only.
    Services {
        /// The map, hex, or `-`.
        map: String,
    },
    /// Write this machine's node configuration and certificate from what
    /// the administrator's `shoal cluster admit` printed (it prints this
    /// command, to run here as root).
    Join(Box<crate::cmd_join::JoinArgs>),
    /// Print this node's static public key (made on first use), for the
    /// administrator's `shoal cluster admit`.  Without --state-dir or
    /// --config: /etc/shoal/node.toml's state directory, else
    /// /var/lib/shoal.
    Key {
        /// The node's state directory.
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Or its configuration file, which names it.
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum OwnerState {
    /// The owner is using the machine.
    Active,
    /// The owner gives the machine to the pool.
    Idle,
    /// Let the node detect it (terminal input in the last 5 minutes, or
    /// half a core of load from programs that are not shoal's).
    Auto,
}

/// `shoal bench`'s arguments, handed to shoal-bench as they are.
#[derive(Args)]
struct BenchArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<std::ffi::OsString>,
}

impl Cli {
    /// The log filter when SHOAL_LOG is unset: daemons (the node, a
    /// directory replica) log their life, commands stay quiet.
    pub fn default_log(&self) -> &'static str {
        if self.is_daemon() { "info" } else { "warn" }
    }

    /// Whether this runs a daemon (the node, a directory replica, a file
    /// server).
    pub fn is_daemon(&self) -> bool {
        matches!(
            self.command,
            Command::Node(_)
                | Command::Dir(crate::cmd_dir::DirCommand::Serve(_))
                | Command::File(crate::cmd_file::FileCommand::Serve(_))
                | Command::Fs(crate::cmd_fs::FsCommand::Serve(_))
        )
    }

    pub fn run(self) -> Result<(), Failure> {
        match self.command {
            Command::Node(args) => run_node(args),
            Command::Status(args) => crate::cmd_status::run(args),
            Command::Run(args) => crate::cmd_run::run(args),
            Command::Make(args) => crate::cmd_make::run(args),
            Command::Ps(args) => crate::cmd_ps::ps(args),
            Command::Service(c) => crate::cmd_service::run(c),
            Command::Kill(args) => crate::cmd_ps::kill(args),
            Command::Wait(args) => crate::cmd_ps::wait(args),
            Command::Cluster(c) => crate::cmd_cluster::run(c),
            Command::Rpc(c) => crate::cmd_rpc::run(c),
            Command::Cap(c) => crate::cmd_cap::run(c),
            Command::Group(c) => crate::cmd_group::run(c),
            Command::Dir(c) => crate::cmd_dir::run(c),
            Command::File(c) => crate::cmd_file::run(c),
            Command::Fs(c) => crate::cmd_fs::run(c),
            Command::Init(args) => crate::cmd_init::run(args),
            Command::Bench(args) => bench(args),
            Command::Completions { shell } => {
                use clap::CommandFactory;
                clap_complete::generate(
                    shell,
                    &mut Cli::command(),
                    "shoal",
                    &mut std::io::stdout(),
                );
                Ok(())
            }
        }
    }
}

/// Runs shoal-bench, the benchmark suite: a program of its own, so that
/// the `shoal` users run links none of the peers it measures against.
fn bench(args: BenchArgs) -> Result<(), Failure> {
    use std::os::unix::process::CommandExt;
    let Some(program) = shoal_cluster::program_beside("shoal-bench") else {
        return Err(Failure::usage(
            "the benchmarks are a program of their own, shoal-bench, which is neither beside shoal nor on PATH: build it with `cargo build --profile product -p shoal-bench` (it is installed beside shoal)",
        ));
    };
    let e = std::process::Command::new(&program).args(&args.args).exec();
    Err(Failure::failed(format!(
        "cannot run {}: {e}",
        program.display()
    )))
}

fn run_node(args: NodeArgs) -> Result<(), Failure> {
    use shoal_nodesvc::{NodeConfig, NodeConfigFile};
    if let Some(NodeCommand::Owner { state }) = args.command {
        let ctx = shoal_rpc::Context::from_env()
            .map_err(|e| Failure::unreachable(format!("no node to tell: {e}")))?;
        let active = match state {
            OwnerState::Active => Some(true),
            OwnerState::Idle => Some(false),
            OwnerState::Auto => None,
        };
        ctx.set_owner(active)
            .map_err(|e| Failure::failed(e.to_string()))?;
        return Ok(());
    }
    if let Some(NodeCommand::Revoke { list } | NodeCommand::Services { map: list }) = &args.command
    {
        let services = matches!(args.command, Some(NodeCommand::Services { .. }));
        let list = if list == "-" {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .map_err(|e| Failure::failed(format!("cannot read standard input: {e}")))?;
            text
        } else {
            list.clone()
        };
        let ctx = shoal_rpc::Context::from_env()
            .map_err(|e| Failure::unreachable(format!("no node to tell: {e}")))?;
        if services {
            ctx.set_services(list.trim())
        } else {
            ctx.revoke(list.trim())
        }
        .map_err(|e| Failure::failed(e.to_string()))?;
        eprintln!(
            "{} taken; it spreads to every node",
            if services {
                "service map"
            } else {
                "revocation list"
            }
        );
        return Ok(());
    }
    if let Some(NodeCommand::Key { state_dir, config }) = args.command {
        let dir = match (state_dir, config) {
            (Some(d), _) => d,
            (None, Some(c)) => NodeConfigFile::load(&c)?
                .state_dir
                .ok_or_else(|| Failure::usage(format!("{} names no state_dir", c.display())))?,
            (None, None) => {
                let installed = std::path::Path::new(crate::cmd_join::DEFAULT_CONFIG);
                installed
                    .exists()
                    .then(|| NodeConfigFile::load(installed))
                    .transpose()?
                    .and_then(|c| c.state_dir)
                    .unwrap_or_else(|| PathBuf::from(crate::cmd_join::DEFAULT_STATE))
            }
        };
        println!(
            "{}",
            hex::encode(shoal_nodesvc::identity::static_public_key(&dir)?)
        );
        return Ok(());
    }
    if let Some(NodeCommand::Join(join)) = args.command {
        return crate::cmd_join::join(*join);
    }
    let file = match &args.config {
        Some(path) => {
            crate::cmd_join::check_config_file(path)?;
            NodeConfigFile::load(path)?
        }
        None => NodeConfigFile::default(),
    };
    let flags = NodeConfigFile {
        name: args.name,
        state_dir: args.state_dir,
        addr: args.addr,
        bind: args.bind,
        broadcast: args.broadcast,
        seeds: (!args.seeds.is_empty()).then_some(args.seeds),
        key_file: args.key_file,
        cluster_id: None,
        admin_key: None,
        cert_file: None,
        metrics: args.metrics,
        frag_bytes: args.frag_bytes,
        socket: None,
        owner_detect: None,
        remote_root: None,
        socket_group: None,
        system_ports: None,
        services: None,
    };
    let config = NodeConfig::resolve(file.merge(flags))?;
    let path = args.config.clone();
    shoal_nodesvc::run(config, move || match &path {
        Some(path) => {
            let services = NodeConfigFile::load(path)?.services.unwrap_or_default();
            shoal_nodesvc::check_services(&services)?;
            Ok(services)
        }
        None => Ok(Vec::new()),
    })?;
    Ok(())
}

/// A secret argument (a capability or a get-port): given as itself, or as
/// `-` (a line read from standard input) or `@FILE` (the file's first
/// line), so that it need not be on a command line other users can read
/// (`/proc/PID/cmdline`).
pub fn secret<T>(text: &str) -> Result<T, String>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    let given = match text {
        "-" => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .map_err(|e| format!("cannot read standard input: {e}"))?;
            line
        }
        _ => match text.strip_prefix('@') {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {path}: {e}"))?
                .lines()
                .next()
                .unwrap_or_default()
                .to_string(),
            None => text.to_string(),
        },
    };
    given.trim().parse().map_err(|e: T::Err| e.to_string())
}

#[cfg(test)]
mod tests {
    /// Review 3, L10: a secret is taken from a file as from the command
    /// line, and a bad one is one line.
    #[test]
    fn a_secret_is_read_from_a_file() {
        let port = shoal_rpc::GetPort::random();
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), format!("{}\n", port.to_hex())).unwrap();
        let at = format!("@{}", file.path().display());
        let read: shoal_rpc::GetPort = super::secret(&at).unwrap();
        assert_eq!(read.to_hex(), port.to_hex());
        let given: shoal_rpc::GetPort = super::secret(&port.to_hex()).unwrap();
        assert_eq!(given.to_hex(), port.to_hex());
        assert!(super::secret::<shoal_rpc::GetPort>("@/nonexistent").is_err());
    }
}
