//! A program's membership of a cluster: its link to the local node (which
//! locates servers and hands out the keys of its endpoint channels; a
//! group's keys come from its members, `shoal_groupsvc::keys`), and
//! how to reach the nodes.  A program holds no key shared with other users
//! or nodes.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use shoal_cap::PutPort;
use shoal_proto::ServerConfig;
use shoal_wire::NodeId;

use crate::client::Client;
use crate::error::Error;
use crate::link::{Link, LinkRequest, LinkResponse, ProcEnd};
use crate::server::Server;
use crate::service::Service;

/// Everything a context needs.
#[derive(Debug, Clone)]
pub struct ContextConfig {
    /// Where locate requests go: a broadcast address, or every node.
    pub locate: Vec<SocketAddr>,
    /// The address servers and clients bind to (port chosen by the kernel).
    pub bind_ip: IpAddr,
    /// The local node's link socket; servers need it to register.
    pub node_socket: Option<PathBuf>,
    /// The open link to the local node, shared by this context's client
    /// endpoints (locate, channel keys).
    pub link: Option<Arc<Mutex<Link>>>,
    /// The cluster's id (system services' ports derive from it).
    pub cluster: [u8; 16],
    /// This program's uid, as its node knows it (from the kernel).
    pub uid: u32,
    /// The local node's id and name, when attached to one.
    pub node: Option<(shoal_wire::NodeId, String)>,
    /// Body bytes per datagram.
    pub frag_bytes: usize,
    /// Largest request a server accepts and largest reply a client
    /// accepts, in bytes (bodies beyond a fragment are reassembled in
    /// memory).
    pub max_body_bytes: u64,
    /// Deadline of a call when the caller gives none.
    pub deadline: Duration,
    /// How long a server thread waiting for requests polls before it
    /// sleeps (spin-then-block): polling saves the wake-up of a sleeping
    /// thread, which on some machines costs more than the network.
    /// `None` (the default) adapts: at least [`DEFAULT_SPIN`], and about
    /// twice the recent waits while that is at most 500 µs; `Some(d)`
    /// always polls for `d` (zero: sleeps at once).  `SHOAL_SPIN_US` sets
    /// a fixed value.  A group member's threads wait for its datagrams
    /// the same way.
    pub server_spin: Option<Duration>,
    /// The same for a client waiting for its reply: `None` (the default)
    /// adapts, polling (for an adaptive window, as above) only while that
    /// proves faster (it is when the server runs on another core, and is
    /// not when they share one); `Some(d)` always polls for `d` (zero:
    /// never).  `SHOAL_CLIENT_SPIN_US` sets a fixed value.
    pub client_spin: Option<Duration>,
    /// How long a server that shuts down refuses new requests before it
    /// closes; longer than a client's first retransmission interval plus
    /// the network's delay (see `shoal-proto`'s client).
    pub drain: Duration,
    /// How long a server remembers a caller after its last datagram
    /// (its at-most-once record; replays are refused for as long as the
    /// caller's channel lives, whatever this is).
    pub record_ttl: Duration,
}

impl ContextConfig {
    /// A configuration with defaults for everything but the locate
    /// targets.
    pub fn new(locate: Vec<SocketAddr>) -> Self {
        Self {
            locate,
            bind_ip: IpAddr::from([0, 0, 0, 0]),
            node_socket: None,
            link: None,
            cluster: [0; 16],
            uid: 0,
            node: None,
            frag_bytes: 60_000,
            max_body_bytes: 1 << 30,
            deadline: Duration::from_secs(5),
            server_spin: micros_from_env("SHOAL_SPIN_US"),
            client_spin: micros_from_env("SHOAL_CLIENT_SPIN_US"),
            drain: Duration::from_millis(250),
            record_ttl: ServerConfig::default().record_ttl,
        }
    }
}

/// How long a waiting thread polls at least before it sleeps: a little
/// longer than a small RPC's round trip on a local network, so a busy
/// server rarely sleeps, and an idle one wastes at most this much CPU per
/// request.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

impl ContextConfig {
    /// One request to the local node on the context's link; its refusal
    /// as an error.
    pub fn call_node(&self, request: &LinkRequest) -> Result<LinkResponse, Error> {
        let Some(link) = &self.link else {
            return Err(Error::Node(
                "this needs a link to the local node (attach with Context::from_env)".into(),
            ));
        };
        match link.lock().call(request)? {
            LinkResponse::Error { message } => Err(Error::Node(message)),
            answer => Ok(answer),
        }
    }
}

fn micros_from_env(name: &str) -> Option<Duration> {
    let us: u64 = std::env::var(name).ok()?.parse().ok()?;
    Some(Duration::from_micros(us))
}

/// A program's handle on the cluster; cheap to clone.
#[derive(Debug, Clone)]
pub struct Context {
    config: Arc<ContextConfig>,
}

impl Context {
    /// A context from explicit settings.
    pub fn new(config: ContextConfig) -> Context {
        Context {
            config: Arc::new(config),
        }
    }

    /// Attaches to the node whose link socket `SHOAL_NODE` names (default
    /// [`crate::DEFAULT_NODE_SOCKET`]).
    pub fn from_env() -> Result<Context, Error> {
        let path = std::env::var_os("SHOAL_NODE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(crate::DEFAULT_NODE_SOCKET));
        Context::attach(&path)
    }

    /// Attaches to the node listening on `path`.
    pub fn attach(path: &Path) -> Result<Context, Error> {
        let mut link = Link::connect(path)?;
        let LinkResponse::Hello(hello) = link.call(&LinkRequest::Hello)? else {
            return Err(Error::Node("unexpected answer to hello".into()));
        };
        let mut config = ContextConfig::new(hello.locate);
        config.bind_ip = hello.node_addr.ip();
        config.node_socket = Some(path.to_path_buf());
        config.frag_bytes = hello.frag_bytes;
        config.node = u64::from_str_radix(&hello.node, 16)
            .ok()
            .map(|id| (shoal_wire::NodeId(id), hello.name.clone()));
        config.link = Some(Arc::new(Mutex::new(link)));
        config.uid = hello.uid;
        if let Some(cluster) = hex::decode(&hello.cluster)
            .ok()
            .and_then(|b| <[u8; 16]>::try_from(b).ok())
        {
            config.cluster = cluster;
        }
        Ok(Context::new(config))
    }

    /// The settings in force.
    pub fn config(&self) -> &ContextConfig {
        &self.config
    }

    /// A new client endpoint (one call at a time; open one per thread).
    pub fn client(&self) -> Result<Client, Error> {
        Client::new(self.config.clone())
    }

    /// Serves `service` from this process: the put-port of a get-port,
    /// or (for the node's daemon and root only) a system service.
    pub fn serve(&self, service: impl Into<Service>) -> Result<Server, Error> {
        Server::new(self.config.clone(), service.into())
    }

    /// System service `name` of this cluster (see [`crate::system_port`]).
    pub fn system(&self, name: &str) -> Service {
        crate::service::system_port(&self.config.cluster, name)
    }

    /// A link to this machine's node as the home of processes.
    pub fn home(&self) -> Result<HomeLink, Error> {
        let Some(path) = &self.config.node_socket else {
            return Err(Error::Node("this needs a link to the local node".into()));
        };
        Ok(HomeLink {
            link: Link::connect(path)?,
        })
    }

    /// Tells this machine's node whether its owner is using it (the
    /// processor pool keeps foreign programs off while active).
    /// `None` leaves it to the node to detect.
    pub fn set_owner(&self, active: Option<bool>) -> Result<(), Error> {
        match self.ask_node(&LinkRequest::Owner { active })? {
            LinkResponse::Ok => Ok(()),
            _ => Err(Error::Node("unexpected answer to owner".into())),
        }
    }

    /// Hands the local node a revocation list (hex), which it checks, keeps
    /// and passes on; refused if it is not newer than the node's.
    pub fn revoke(&self, list: &str) -> Result<(), Error> {
        match self.ask_node(&LinkRequest::Revocations {
            list: list.to_string(),
        })? {
            LinkResponse::Ok => Ok(()),
            _ => Err(Error::Node("unexpected answer to revocations".into())),
        }
    }

    /// Hands the local node a service map (hex), which it checks, keeps
    /// and passes on; refused if it is not newer than the node's.
    pub fn set_services(&self, map: &str) -> Result<(), Error> {
        match self.ask_node(&LinkRequest::Services {
            map: map.to_string(),
        })? {
            LinkResponse::Ok => Ok(()),
            _ => Err(Error::Node("unexpected answer to services".into())),
        }
    }

    /// The nodes the local node's service map names as the servers of
    /// `port`, if it names it (`docs/security.md`, "Which nodes serve the
    /// system").  Without a node there is no map: none.
    pub fn servers(&self, port: &PutPort) -> Result<Option<Vec<NodeId>>, Error> {
        if self.config.node_socket.is_none() {
            return Ok(None);
        }
        let request = LinkRequest::Servers {
            port: port.to_string(),
        };
        match self.ask_node(&request)? {
            LinkResponse::Servers { nodes: None } => Ok(None),
            LinkResponse::Servers { nodes: Some(nodes) } => nodes
                .iter()
                .map(|n| u64::from_str_radix(n, 16).map(NodeId))
                .collect::<Result<Vec<_>, _>>()
                .map(Some)
                .map_err(|_| Error::Node("the node's servers are not hex ids".into())),
            _ => Err(Error::Node("unexpected answer to servers".into())),
        }
    }

    /// One request to the local node over a fresh link; its refusal as an
    /// error.
    fn ask_node(&self, request: &LinkRequest) -> Result<LinkResponse, Error> {
        let Some(path) = &self.config.node_socket else {
            return Err(Error::Node("this needs a link to the local node".into()));
        };
        match Link::connect(path)?.call(request)? {
            LinkResponse::Error { message } => Err(Error::Node(message)),
            answer => Ok(answer),
        }
    }
}

fn unhex_grant(text: &str) -> Result<Vec<u8>, Error> {
    hex::decode(text).map_err(|_| Error::Node("the node's start grant is not hex".into()))
}

/// A link to the local node as the home of the processes started on it
/// (see [`LinkRequest::Spawn`]): they are tied to it, and the home hangs
/// up on those still running when it closes.
pub struct HomeLink {
    link: Link,
}

impl HomeLink {
    /// Whether the node closed the link (it stopped or restarted).  Does
    /// not block.
    pub fn is_closed(&self) -> bool {
        self.link.is_closed()
    }

    /// A new process running `command`, on node `on` or where placement
    /// puts a program needing `mem_mib` MiB: its id, its node's name, and
    /// the start grant its start request carries there.
    pub fn spawn(
        &mut self,
        command: &str,
        on: Option<&str>,
        mem_mib: u32,
        allow_owner_active: bool,
    ) -> Result<(String, String, Vec<u8>), Error> {
        let request = LinkRequest::Spawn {
            command: command.to_string(),
            on: on.map(str::to_string),
            mem_mib,
            allow_owner_active,
        };
        match self.link.call(&request)? {
            LinkResponse::Spawned { id, node, grant } => Ok((id, node, unhex_grant(&grant)?)),
            _ => Err(Error::Node("unexpected answer to spawn".into())),
        }
    }

    /// Process `id` lost its node `lost`: the node to start it again on,
    /// and the start grant for it.
    pub fn respawn(
        &mut self,
        id: &str,
        lost: &str,
        mem_mib: u32,
        allow_owner_active: bool,
    ) -> Result<(String, Vec<u8>), Error> {
        let request = LinkRequest::Respawn {
            id: id.to_string(),
            lost: lost.to_string(),
            mem_mib,
            allow_owner_active,
        };
        match self.link.call(&request)? {
            LinkResponse::Spawned { node, grant, .. } => Ok((node, unhex_grant(&grant)?)),
            _ => Err(Error::Node("unexpected answer to respawn".into())),
        }
    }

    /// Process `id` ended so.
    pub fn ended(&mut self, id: &str, end: ProcEnd) -> Result<(), Error> {
        let request = LinkRequest::Ended {
            id: id.to_string(),
            end,
        };
        match self.link.call(&request)? {
            LinkResponse::Ok => Ok(()),
            _ => Err(Error::Node("unexpected answer to ended".into())),
        }
    }
}
