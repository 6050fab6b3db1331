//! The link between a program and its node daemon: a Unix stream socket
//! carrying one JSON object per line, request then response.
//!
//! A program says [`LinkRequest::Hello`] to learn how to reach the cluster
//! and [`LinkRequest::Register`] to serve a port.  Its client endpoints
//! get their ids ([`LinkRequest::Client`]) and find servers
//! ([`LinkRequest::Locate`]) through the link, and the node hands each
//! end of an endpoint channel its key (`docs/security.md`): a client the
//! key of its channel to each server it located, a server the secret it
//! derives its callers' keys from ([`LinkRequest::ServerKey`]).  The node
//! knows who is at the other end of the link from the kernel
//! (`SO_PEERCRED`), never from the program, and derives every key for
//! that uid only.  The
//! node ties each registration to the connection that made it: when the
//! program exits, however it exits, the kernel closes the connection and the
//! node withdraws the registration at once (the instance's fate becomes
//! `Vanished`).  A server that stops on purpose says
//! [`LinkRequest::Drain`] first, then [`LinkRequest::Drained`] when its
//! drain period is over.
//!
//! A group's keys do not come from the node: members hand them to each
//! other over endpoint channels (`shoal_groupsvc::keys`).  No answer carries a key shared with other users or nodes, so the socket
//! is open to every local user.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// A program's request to its node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum LinkRequest {
    /// Who are you, and how do I reach the cluster?
    Hello,
    /// Serve the put-port of `get_port` (hex) at `addr` as `instance` (hex).
    Register {
        get_port: String,
        addr: SocketAddr,
        instance: String,
    },
    /// Serve system service `put_port` (hex) at `addr` as `instance`: only
    /// the node's own daemon and the services its configuration marks
    /// `system = true` may, and root where it says `system_ports = "root"`
    /// (see `crate::service`).
    RegisterSystem {
        put_port: String,
        addr: SocketAddr,
        instance: String,
    },
    /// `instance` stops taking new requests: withdraw it from locate.
    Drain { instance: String },
    /// `instance` finished draining and closes.
    Drained { instance: String },
    /// The machine's owner says they are active (`Some(true)`) or idle
    /// (`Some(false)`), or leaves it to the node to detect (`None`):
    /// foreign programs are placed elsewhere while active.  Kept across
    /// restarts.
    Owner { active: Option<bool> },
    /// A revocation list from the administrator (hex, as `shoal cluster
    /// revoke` prints it): the node checks it, keeps it if newer, and
    /// passes it on to every node it has a session with.  Root only.
    Revocations { list: String },
    /// A service map from the administrator (hex, as `shoal cluster
    /// services` prints it): the node checks it, keeps it if newer, and
    /// passes it on as it does revocation lists.  Root only.
    Services { map: String },
    /// Which nodes may serve system port `port` (hex), as the service map
    /// this node holds says: none if it does not name the port.
    Servers { port: String },
    /// Start a process from this node, its home: a new process id, and
    /// the node to run it on, `on` or the one the placement rule chooses
    /// for a program needing `mem_mib` MiB (the node counts it against the
    /// chosen node until that node's load report does).  The process is
    /// tied to this link: if the link closes before [`LinkRequest::Ended`],
    /// the home hangs up on it.
    Spawn {
        command: String,
        on: Option<String>,
        mem_mib: u32,
        allow_owner_active: bool,
    },
    /// Process `id` (spawned on this link) lost its node `lost`: a node to
    /// start it again on, chosen as for `Spawn` among the others.
    Respawn {
        id: String,
        lost: String,
        mem_mib: u32,
        allow_owner_active: bool,
    },
    /// Process `id` (spawned on this link) ended so.
    Ended { id: String, end: ProcEnd },
    /// A new client endpoint: an id bound to this link and its uid.
    Client,
    /// Where `port` (hex) is served, for client `client` (hex, from
    /// [`LinkRequest::Client`]): this node's endpoints, and the other
    /// nodes' (or, with `node` not zero, that node's only), waiting up to
    /// `wait_ms` for the first answer with endpoints (with `all`, for
    /// every answer).  With `instance` (hex, not zero), what became of
    /// that instance.  Each endpoint comes with the client's channel key.
    Locate {
        client: String,
        port: String,
        instance: String,
        node: String,
        wait_ms: u32,
        all: bool,
    },
    /// A fresh key for client `client`'s channel to server endpoint
    /// `instance` of `port` on node `node` (hex each): the previous one
    /// expires.
    Channel {
        client: String,
        node: String,
        port: String,
        instance: String,
    },
    /// The secret server endpoint `instance` (registered on this link)
    /// derives its callers' channel keys from, for the node session this
    /// node knows as `index`, and the node at its other end.  The secret
    /// is the port's the instance was registered for on this link: no
    /// other registration of the same id can yield it.
    ServerKey { instance: String, index: u32 },
}

/// The node's answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum LinkResponse {
    Hello(Hello),
    Registered {
        put_port: String,
    },
    /// A new process: its id and the node it is to run on.
    Spawned {
        id: String,
        node: String,
        /// The start grant for that node (hex), sealed for its exec
        /// service: the program's start request carries it.
        #[serde(default)]
        grant: String,
    },
    /// A client endpoint's id (hex) and the uid it runs as.
    Client {
        id: String,
        uid: u32,
    },
    /// Answers to a locate, one per node that answered.
    Located {
        answers: Vec<Answer>,
    },
    Channel(Grant),
    /// A server endpoint's secret for one node session (hex), the node
    /// at the session's other end (hex id), and the AEAD.
    ServerKey {
        secret: String,
        node: String,
        aes: bool,
        valid_ms: u64,
    },
    /// The nodes (hex ids) the service map names for a port, if it names
    /// it.
    Servers {
        nodes: Option<Vec<String>>,
    },
    Ok,
    Error {
        message: String,
    },
}

/// One node's answer to a locate.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Answer {
    /// The node's id (hex).
    pub node: String,
    /// What became of the instance asked about: 0 unknown, 1 serving,
    /// 2 drained, 3 vanished.
    pub fate: u8,
    pub endpoints: Vec<Found>,
}

/// A server endpoint found, with the asking client's key for it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Found {
    pub addr: SocketAddr,
    /// Its instance (hex).
    pub instance: String,
    /// The uid that registered it.
    pub uid: u32,
    /// A system service (its node daemon's own).
    pub system: bool,
    pub grant: Grant,
}

/// A client's key for its channel to one server endpoint.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Grant {
    /// The channel key (hex).
    pub key: String,
    /// The session index to name in the datagrams' headers.
    pub index: u32,
    /// AES-256-GCM (else ChaCha20-Poly1305).
    pub aes: bool,
    /// How long the key may be used.
    pub valid_ms: u64,
}

/// How a process ended, as its home records it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ProcEnd {
    /// It exited with this status.
    Exited(i32),
    /// This signal killed it.
    Killed(i32),
    /// It could not be started: it leaves no trace.
    NotStarted,
    /// Its node became unreachable: how it ended is unknown.
    Lost,
}

/// What a program needs to take part in the cluster.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Hello {
    /// The uid the node knows this program by.
    #[serde(default)]
    pub uid: u32,
    /// The cluster's id (hex): system services' ports derive from it.
    #[serde(default)]
    pub cluster: String,
    /// The node's id, hex.
    pub node: String,
    /// The node's name.
    pub name: String,
    /// The node daemon's address.
    pub node_addr: SocketAddr,
    /// Where locate requests go: the cluster's broadcast address, or every
    /// known node.
    pub locate: Vec<SocketAddr>,
    /// Body bytes per datagram on this cluster's network.
    pub frag_bytes: usize,
}

/// Longest a program waits for its node to answer.
const LINK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Who is on the other end of a Unix socket, as the kernel says
/// (`SO_PEERCRED`): pid, uid, gid.  Nothing the peer says can change it.
pub fn peer(socket: &impl std::os::fd::AsRawFd) -> Option<(i32, u32, u32)> {
    // SAFETY: an all-zero ucred is a valid value to be filled in.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some((cred.pid, cred.uid, cred.gid))
}

/// Whether `uid`, as this process sees a peer's, is the overflow uid of a
/// user namespace this process is in (`unshare -r`): the peer's own uid
/// is not mapped here, so it cannot be told apart (the node itself then
/// still knows who this process is).
fn unmapped(uid: u32) -> bool {
    let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    let initial = map.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"];
    let overflow = std::fs::read_to_string("/proc/sys/kernel/overflowuid")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(65534);
    !initial && uid == overflow
}

/// An open link to the node.
#[derive(Debug)]
pub struct Link {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Link {
    /// Connects to the node's socket at `path`.
    pub fn connect(path: &Path) -> Result<Link, Error> {
        let no_node = |source| Error::NoNode {
            path: path.to_path_buf(),
            source,
        };
        let stream = UnixStream::connect(path).map_err(no_node)?;
        // The node is root's, or this user's own: a socket another user
        // answers (planted where a configuration put it) is no node, and
        // would collect what this program registers.
        let (_, peer, _) = peer(&stream).ok_or_else(|| {
            no_node(std::io::Error::other(
                "the kernel does not say who serves it",
            ))
        })?;
        // SAFETY: getuid cannot fail.
        let me = unsafe { libc::getuid() };
        if peer != 0 && peer != me && !unmapped(peer) {
            return Err(no_node(std::io::Error::other(format!(
                "the socket is served by uid {peer}, neither root nor this user"
            ))));
        }
        // A node that hangs must not hang its programs.
        stream
            .set_read_timeout(Some(LINK_TIMEOUT))
            .map_err(no_node)?;
        stream
            .set_write_timeout(Some(LINK_TIMEOUT))
            .map_err(no_node)?;
        Ok(Link {
            path: path.to_path_buf(),
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    /// Whether the node closed the link (it stopped or restarted).  Does
    /// not block.
    pub fn is_closed(&self) -> bool {
        use std::os::fd::AsRawFd;
        let mut byte = 0u8;
        // SAFETY: a valid fd and a one-byte buffer.
        let n = unsafe {
            libc::recv(
                self.writer.as_raw_fd(),
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n == 0
            || (n < 0
                && !matches!(
                    std::io::Error::last_os_error().kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ))
    }

    /// The socket this link was opened on.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends one request and waits for its response.
    pub fn call(&mut self, request: &LinkRequest) -> Result<LinkResponse, Error> {
        let no_node = |source| Error::NoNode {
            path: self.path.clone(),
            source,
        };
        let mut line = serde_json::to_string(request).expect("link requests serialize");
        line.push('\n');
        // A node that refused the link (too many of this user's) said why
        // and closed it: the reason is still there to read.
        let written = self.writer.write_all(line.as_bytes());
        let mut answer = String::new();
        let n = match (self.reader.read_line(&mut answer), written) {
            (Ok(n), _) if n > 0 => n,
            (Ok(n), Ok(())) => n,
            (Err(e), Ok(())) | (_, Err(e)) => return Err(no_node(e)),
        };
        if n == 0 {
            return Err(no_node(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the node closed the link",
            )));
        }
        match serde_json::from_str(&answer) {
            Ok(LinkResponse::Error { message }) => Err(Error::Node(message)),
            Ok(r) => Ok(r),
            Err(e) => Err(Error::Node(format!("unreadable answer from the node: {e}"))),
        }
    }
}
