//! The node's side of the program link (see `shoal_rpc::link`): one thread
//! per connected program; registrations die with their connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use shoal_cap::{GetPort, PutPort};
use shoal_pool::ProcId;
use shoal_rpc::link::{Hello, LinkRequest, LinkResponse};
use shoal_wire::{ClientId, Endpoint, Instance};

use crate::daemon::Shared;

/// Binds the link socket (replacing a stale one) and serves it.
pub fn start(shared: Arc<Shared>) -> Result<(), String> {
    let path = &shared.config.socket;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        // Nobody else may put a socket where this one goes.
        use std::os::unix::fs::MetadataExt;
        let meta =
            std::fs::metadata(dir).map_err(|e| format!("cannot look at {}: {e}", dir.display()))?;
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        if (meta.uid() != 0 && meta.uid() != me) || meta.mode() & 0o022 != 0 {
            return Err(format!(
                "{} is writable by others or not this node's: the node's socket \
                 must be in a directory only root (or the node's user) may write",
                dir.display()
            ));
        }
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(format!(
                "another node is already running on {}",
                path.display()
            ));
        }
        let _ = std::fs::remove_file(path);
    }
    let listener =
        UnixListener::bind(path).map_err(|e| format!("cannot bind {}: {e}", path.display()))?;
    // Open to every local user, or to one group's: the daemon learns who
    // each is from the kernel, and hands out no key shared with other
    // users or nodes.
    match &shared.config.socket_group {
        None => std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)),
        Some(group) => {
            let gid = crate::account::group_by_name(group)
                .ok_or_else(|| format!("socket_group: no group named {group}"))?;
            std::os::unix::fs::chown(path, None, Some(gid)).and_then(|()| {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
            })
        }
    }
    .map_err(|e| format!("cannot open {} to its users: {e}", path.display()))?;
    std::thread::Builder::new()
        .name("link-accept".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                if shared.stop.load(Ordering::Acquire) {
                    break;
                }
                let Some(peer) = open(&shared, &stream) else {
                    continue;
                };
                let uid = peer.0.uid;
                let spawned = std::thread::Builder::new().name("link".into()).spawn({
                    let shared = shared.clone();
                    move || serve(shared, stream, peer)
                });
                if spawned.is_err() {
                    close(&shared, uid);
                }
            }
        })
        .map_err(|e| format!("cannot start link thread: {e}"))?;
    Ok(())
}

/// Who is at the other end of a link, as the kernel said when it was
/// opened.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer {
    pub uid: u32,
    /// The daemon itself: what it registers is a system service.
    pub daemon: bool,
    pub pid: i32,
    /// A pidfd of that process (-1 if the kernel gave none), open while
    /// the link is: what start grants are checked against.
    pub pidfd: std::os::fd::RawFd,
}

/// Client endpoints one link keeps ids for; beyond them, the oldest id is
/// forgotten (its client can no longer locate or renew its keys).
const MAX_CLIENTS: usize = 4096;
/// Links a uid other than root may have open at once (each is a thread
/// of the daemon's).
pub(crate) const MAX_LINKS_PER_UID: usize = 256;
/// Processes one link may have spawned that have not ended.
pub(crate) const MAX_SPAWNED_PER_LINK: usize = 256;

/// Who opened `stream`, and a pidfd of that process (kept open as long as
/// the link: `Peer::pidfd` borrows it); `None`, and the stream answered
/// with one line saying why, if the kernel does not say or the uid has
/// as many links as it may.
fn open(shared: &Shared, stream: &UnixStream) -> Option<(Peer, Option<std::os::fd::OwnedFd>)> {
    let (pid, uid, _) = crate::account::peer(stream)?;
    {
        let mut state = shared.state.lock();
        let count = state.links_by_uid.entry(uid).or_default();
        if uid != 0 && *count >= MAX_LINKS_PER_UID {
            drop(state);
            let refusal = LinkResponse::Error {
                message: format!(
                    "uid {uid} has {MAX_LINKS_PER_UID} links to this node open already"
                ),
            };
            let mut line = serde_json::to_string(&refusal).expect("responses serialize");
            line.push('\n');
            let _ = (&*stream).write_all(line.as_bytes());
            return None;
        }
        *count += 1;
        state.links += 1;
    }
    let pidfd = crate::credentials::pidfd(stream, pid);
    let peer = Peer {
        uid,
        daemon: pid as u32 == std::process::id(),
        pid,
        pidfd: pidfd.as_ref().map_or(-1, std::os::fd::AsRawFd::as_raw_fd),
    };
    Some((peer, pidfd))
}

/// A link of `uid` closed.
fn close(shared: &Shared, uid: u32) {
    let mut state = shared.state.lock();
    state.links -= 1;
    if let Some(count) = state.links_by_uid.get_mut(&uid) {
        *count -= 1;
        if *count == 0 {
            state.links_by_uid.remove(&uid);
        }
    }
}

fn serve(
    shared: Arc<Shared>,
    stream: UnixStream,
    (peer, _pidfd): (Peer, Option<std::os::fd::OwnedFd>),
) {
    let mut link = Link {
        shared: &shared,
        peer,
        clients: Default::default(),
        registered: Vec::new(),
        spawned: Vec::new(),
    };
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return close(&shared, peer.uid),
    };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        // Bounded: a line longer than 64 KiB is not a link request.
        match (&mut reader).take(64 * 1024).read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let response = match serde_json::from_str::<LinkRequest>(&line) {
            Ok(request) => link.handle(request),
            Err(e) => LinkResponse::Error {
                message: format!("bad link request: {e}"),
            },
        };
        let mut out = serde_json::to_string(&response).expect("responses serialize");
        out.push('\n');
        if writer.write_all(out.as_bytes()).is_err() {
            break;
        }
    }
    // The program is gone: so are its endpoints, and the processes it
    // watched are hung up on.
    let Link {
        registered,
        spawned,
        ..
    } = link;
    if !spawned.is_empty() {
        crate::home::hang_up(&shared, &spawned);
    }
    {
        let mut state = shared.state.lock();
        for (port, instance) in registered {
            tracing::info!(%port, %instance, "server endpoint gone with its program");
            state.registry.deregister(port, instance);
        }
    }
    close(&shared, peer.uid);
}

/// One program's link: who it is, and what it holds.  Each request kind
/// has a handler of its own.
struct Link<'a> {
    shared: &'a Shared,
    peer: Peer,
    /// Client ids given to this link: keys are derived for these only.
    clients: std::collections::VecDeque<ClientId>,
    registered: Vec<(PutPort, Instance)>,
    /// Processes this link spawned that have not ended yet.
    spawned: Vec<ProcId>,
}

fn error(message: String) -> LinkResponse {
    LinkResponse::Error { message }
}

impl Link<'_> {
    fn handle(&mut self, request: LinkRequest) -> LinkResponse {
        match request {
            LinkRequest::Client => self.client(),
            LinkRequest::Locate {
                client,
                port,
                instance,
                node,
                wait_ms,
                all,
            } => self.locate(&client, &port, &instance, &node, wait_ms, all),
            LinkRequest::Channel {
                client,
                node,
                port,
                instance,
            } => self.channel(&client, &node, &port, &instance),
            LinkRequest::ServerKey { instance, index } => self.server_key(&instance, index),
            LinkRequest::Hello => self.hello(),
            LinkRequest::Spawn {
                command,
                on,
                mem_mib,
                allow_owner_active,
            } => self.spawn(&command, on.as_deref(), mem_mib, allow_owner_active),
            LinkRequest::Respawn {
                id,
                lost,
                mem_mib,
                allow_owner_active,
            } => self.respawn(&id, &lost, mem_mib, allow_owner_active),
            LinkRequest::Ended { id, end } => self.ended(&id, end),
            LinkRequest::Revocations { list } => self.revocations(&list),
            LinkRequest::Services { map } => self.services(&map),
            LinkRequest::Servers { port } => self.servers(&port),
            LinkRequest::Owner { active } => self.owner(active),
            LinkRequest::Register {
                get_port,
                addr,
                instance,
            } => self.register(&get_port, addr, &instance),
            LinkRequest::RegisterSystem {
                put_port,
                addr,
                instance,
            } => self.register_system(&put_port, addr, &instance),
            LinkRequest::Drain { instance } => self.drain(&instance),
            LinkRequest::Drained { instance } => self.drained(&instance),
        }
    }

    /// A client id of this link's, from its hex text.
    fn client_of(&self, text: &str) -> Result<ClientId, String> {
        u64::from_str_radix(text, 16)
            .ok()
            .map(ClientId)
            .filter(|c| self.clients.contains(c))
            .ok_or_else(|| format!("no client {text} on this link"))
    }

    fn client(&mut self) -> LinkResponse {
        if self.clients.len() >= MAX_CLIENTS {
            self.clients.pop_front();
        }
        let id = ClientId::random();
        self.clients.push_back(id);
        LinkResponse::Client {
            id: format!("{:016x}", id.0),
            uid: self.peer.uid,
        }
    }

    fn locate(
        &self,
        client: &str,
        port: &str,
        instance: &str,
        node: &str,
        wait_ms: u32,
        all: bool,
    ) -> LinkResponse {
        let client = match self.client_of(client) {
            Ok(c) => c,
            Err(e) => return error(e),
        };
        let (Ok(port), Ok(instance), Ok(node)) = (
            PutPort::from_str(port),
            u64::from_str_radix(instance, 16),
            u64::from_str_radix(node, 16),
        ) else {
            return error("locate: port, instance and node are hex".into());
        };
        let locate = shoal_wire::Locate {
            nonce: shoal_wire::Nonce::random(),
            port,
            instance: Instance(instance),
            node: shoal_wire::NodeId(node),
        };
        let wait = std::time::Duration::from_millis(wait_ms.min(5_000) as u64);
        match crate::locate::locate(self.shared, self.peer.uid, client, locate, wait, all) {
            Ok(answers) => LinkResponse::Located { answers },
            Err(e) => error(e),
        }
    }

    fn channel(&self, client: &str, node: &str, port: &str, instance: &str) -> LinkResponse {
        let client = match self.client_of(client) {
            Ok(c) => c,
            Err(e) => return error(e),
        };
        let (Ok(node), Ok(port), Some(instance)) = (
            u64::from_str_radix(node, 16),
            PutPort::from_str(port),
            parse_instance(instance),
        ) else {
            return error("channel: node, port and instance are hex".into());
        };
        let node = shoal_wire::NodeId(node);
        match crate::locate::channel(self.shared, self.peer.uid, client, node, port, instance) {
            Ok(grant) => LinkResponse::Channel(grant),
            Err(e) => error(e),
        }
    }

    fn server_key(&self, instance: &str, index: u32) -> LinkResponse {
        let Some(instance) = parse_instance(instance) else {
            return error("instance must be 16 hex digits, not zero".into());
        };
        // The secret of the port this link registered the instance for,
        // and of no other (`docs/security.md`).
        let Some(&(port, _)) = self.registered.iter().find(|r| r.1 == instance) else {
            return error("no such endpoint registered on this link".into());
        };
        crate::locate::server_key(self.shared, port, instance, index)
    }

    fn hello(&self) -> LinkResponse {
        let shared = self.shared;
        let locate = match shared.config.broadcast {
            Some(b) => vec![b],
            None => {
                let state = shared.state.lock();
                let mut addrs = vec![shared.config.addr];
                addrs.extend(
                    state
                        .membership
                        .view(crate::daemon::now())
                        .into_iter()
                        .skip(1)
                        .map(|m| m.addr),
                );
                for s in &shared.config.seeds {
                    if !addrs.contains(s) {
                        addrs.push(*s);
                    }
                }
                addrs
            }
        };
        LinkResponse::Hello(Hello {
            uid: self.peer.uid,
            cluster: shared.identity.trust.cluster.to_hex(),
            node: shared.node.to_string(),
            name: shared.config.name.clone(),
            node_addr: shared.config.addr,
            locate,
            frag_bytes: shared.config.frag_bytes,
        })
    }

    fn spawn(
        &mut self,
        command: &str,
        on: Option<&str>,
        mem_mib: u32,
        allow_owner_active: bool,
    ) -> LinkResponse {
        if self.spawned.len() >= MAX_SPAWNED_PER_LINK {
            return error(format!(
                "this link has {MAX_SPAWNED_PER_LINK} processes that have not ended; \
                 open another link to start more"
            ));
        }
        let (shared, peer) = (self.shared, self.peer);
        match crate::home::spawn(shared, peer, command, on, mem_mib, allow_owner_active) {
            Ok((id, node)) => match crate::home::grant(shared, peer, id, &node) {
                Ok(grant) => {
                    self.spawned.push(id);
                    LinkResponse::Spawned {
                        id: id.to_string(),
                        node,
                        grant,
                    }
                }
                Err(e) => {
                    crate::home::ended(shared, id, shoal_rpc::link::ProcEnd::NotStarted);
                    error(e)
                }
            },
            Err(e) => error(e),
        }
    }

    fn respawn(
        &self,
        id: &str,
        lost: &str,
        mem_mib: u32,
        allow_owner_active: bool,
    ) -> LinkResponse {
        let (shared, peer) = (self.shared, self.peer);
        let Some(id) = spawned_id(id, &self.spawned) else {
            return error(format!("no process {id} spawned on this link"));
        };
        match crate::home::respawn(shared, id, lost, mem_mib, allow_owner_active)
            .and_then(|node| Ok((crate::home::grant(shared, peer, id, &node)?, node)))
        {
            Ok((grant, node)) => LinkResponse::Spawned {
                id: id.to_string(),
                node,
                grant,
            },
            Err(e) => error(e),
        }
    }

    fn ended(&mut self, id: &str, end: shoal_rpc::link::ProcEnd) -> LinkResponse {
        let Some(id) = spawned_id(id, &self.spawned) else {
            return error(format!("no process {id} spawned on this link"));
        };
        crate::home::ended(self.shared, id, end);
        self.spawned.retain(|&s| s != id);
        LinkResponse::Ok
    }

    fn revocations(&self, list: &str) -> LinkResponse {
        if self.peer.uid != 0 {
            return error("only root may hand this node a revocation list".into());
        }
        match hex::decode(list.trim()) {
            Err(_) => error("a revocation list is hex, as `shoal cluster revoke` prints it".into()),
            Ok(bytes) => match crate::revocation::take(self.shared, &bytes) {
                Ok(()) => LinkResponse::Ok,
                Err(e) => error(e),
            },
        }
    }

    fn services(&self, map: &str) -> LinkResponse {
        // Root (or the daemon's own user, where it does not run as root).
        // SAFETY: geteuid cannot fail.
        if self.peer.uid != 0 && self.peer.uid != unsafe { libc::geteuid() } {
            return error("only root may hand this node a service map".into());
        }
        match hex::decode(map.trim()) {
            Err(_) => error("a service map is hex, as `shoal cluster services` prints it".into()),
            Ok(bytes) => match crate::service_map::take(self.shared, &bytes) {
                Ok(()) => LinkResponse::Ok,
                Err(e) => error(e),
            },
        }
    }

    fn servers(&self, port: &str) -> LinkResponse {
        match PutPort::from_str(port) {
            Ok(port) => LinkResponse::Servers {
                nodes: crate::service_map::servers(self.shared, &port)
                    .map(|nodes| nodes.iter().map(|n| n.to_string()).collect()),
            },
            Err(_) => error("port must be 32 hex characters".into()),
        }
    }

    fn owner(&self, active: Option<bool>) -> LinkResponse {
        if self.peer.uid != 0 {
            return error("only root may say whether this machine's owner is using it".into());
        }
        let owner = active.map(|a| {
            if a {
                shoal_wire::Owner::Active
            } else {
                shoal_wire::Owner::Idle
            }
        });
        let mut load = self.shared.load.lock();
        match load.sampler.set_owner(owner) {
            Ok(()) => {
                // The next heartbeats say so at once.
                load.at = None;
                LinkResponse::Ok
            }
            Err(e) => error(e),
        }
    }

    fn register(
        &mut self,
        get_port: &str,
        addr: std::net::SocketAddr,
        instance: &str,
    ) -> LinkResponse {
        match GetPort::from_str(get_port) {
            // The F-box: the node, not the program, turns get into put.
            Ok(get) => register(
                self.shared,
                self.peer,
                get.put_port(),
                addr,
                instance,
                false,
                &mut self.registered,
            ),
            Err(_) => error("get_port must be 32 hex characters".into()),
        }
    }

    fn register_system(
        &mut self,
        put_port: &str,
        addr: std::net::SocketAddr,
        instance: &str,
    ) -> LinkResponse {
        let shared = self.shared;
        if !may_serve_system(shared, &self.peer) {
            shared
                .refused_system
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return error(format!(
                "only the node's daemon and the services its configuration marks system = true \
                 may serve a system service here{}",
                if self.peer.uid == 0 {
                    " (run it as a [[service]] with system = true)"
                } else {
                    ""
                }
            ));
        }
        match PutPort::from_str(put_port) {
            Ok(port) => match crate::service_map::servers(shared, &port) {
                Some(nodes) if !nodes.contains(&shared.node) => {
                    shared
                        .refused_system
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    error(format!(
                        "the service map names other nodes ({}) as the servers of {port}",
                        nodes
                            .iter()
                            .map(|n| n.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                }
                _ => register(
                    shared,
                    self.peer,
                    port,
                    addr,
                    instance,
                    true,
                    &mut self.registered,
                ),
            },
            Err(_) => error("put_port must be 32 hex characters".into()),
        }
    }

    fn drain(&self, instance: &str) -> LinkResponse {
        let Some(instance) = parse_instance(instance) else {
            return error("instance must be 16 hex digits, not zero".into());
        };
        let Some(&(port, _)) = self.registered.iter().find(|r| r.1 == instance) else {
            return error("no such endpoint registered on this link".into());
        };
        self.shared.state.lock().registry.deregister(port, instance);
        tracing::info!(%port, %instance, "server endpoint draining");
        LinkResponse::Ok
    }

    fn drained(&mut self, instance: &str) -> LinkResponse {
        let Some(instance) = parse_instance(instance) else {
            return error("instance must be 16 hex digits, not zero".into());
        };
        let Some(i) = self.registered.iter().position(|r| r.1 == instance) else {
            return error("no such endpoint registered on this link".into());
        };
        self.registered.remove(i);
        self.shared.state.lock().registry.drained(instance);
        LinkResponse::Ok
    }
}

/// Registers the endpoint `instance` (hex) at `addr` for `port` on this
/// link; `system`: as a system service.
fn register(
    shared: &Shared,
    peer: Peer,
    port: PutPort,
    addr: std::net::SocketAddr,
    instance: &str,
    system: bool,
    registered: &mut Vec<(PutPort, Instance)>,
) -> LinkResponse {
    let Some(instance) = parse_instance(instance) else {
        return LinkResponse::Error {
            message: "instance must be 16 hex digits, not zero".into(),
        };
    };
    if registered.contains(&(port, instance)) {
        // Asked again on the same link: nothing changes.
        return LinkResponse::Registered {
            put_port: port.to_string(),
        };
    }
    let endpoint = Endpoint {
        addr,
        instance,
        uid: peer.uid,
        system: system || peer.daemon,
    };
    if let Err(refusal) = shared.state.lock().registry.register(port, endpoint) {
        return LinkResponse::Error {
            message: format!("cannot serve port {port}: {refusal}"),
        };
    }
    registered.push((port, instance));
    tracing::info!(%port, %addr, %instance, system, "server endpoint registered");
    LinkResponse::Registered {
        put_port: port.to_string(),
    }
}

/// `text` as the id of a process spawned on this link.
fn spawned_id(text: &str, spawned: &[ProcId]) -> Option<ProcId> {
    let id = text.parse().ok()?;
    spawned.contains(&id).then_some(id)
}

fn parse_instance(text: &str) -> Option<Instance> {
    match u64::from_str_radix(text, 16) {
        Ok(0) | Err(_) => None,
        Ok(v) => Some(Instance(v)),
    }
}

/// Whether `peer` may serve a system port: the daemon, a running service
/// configured `system = true`, and root's programs where the configuration
/// says `system_ports = "root"`.  A service is known by its pid's parent,
/// read now: it counts only if the link's process is still alive after
/// the read (its pidfd says so), so the pid was not another's meanwhile.
fn may_serve_system(shared: &Shared, peer: &Peer) -> bool {
    peer.daemon
        || (peer.uid == 0 && shared.config.system_ports == crate::config::SystemPorts::Root)
        || (shared.services.is_system(peer.pid) && crate::credentials::alive(peer.pidfd))
}
