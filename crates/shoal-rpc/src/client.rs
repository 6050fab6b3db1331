//! The client endpoint: [`Client::trans`] runs one transaction on the
//! calling thread.
//!
//! One socket, connected to the current server (so the kernel reports a
//! closed port as `ECONNREFUSED`, which the core needs to notice a
//! departed server at once).  Locate goes through the local node over the
//! link, which hands back, with each server endpoint, this client's key
//! for its channel to it: every datagram to a server is sealed with it,
//! and only what opens with it reaches the core.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use shoal_cap::PutPort;
use shoal_proto::{ClientConfig, ClientCore, Dest, Phase, Stats, Time, Transmit, Via, pool};
use shoal_session::SessionError;
use shoal_wire::{
    ClientId, Endpoint, Fate, Here, Instance, Locate, MAX_DATAGRAM, NodeId, Packet, decode_plain,
};

use crate::clock;
use crate::context::ContextConfig;
use crate::error::Error;
use crate::keys::{ClientKeys, Sealed};
use crate::link::{LinkRequest, LinkResponse};
use crate::socket;
use crate::spin::{SpinPolicy, Waiting};

/// Cancels a call in progress from another thread.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token not yet cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels the call that holds this token.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`CancelToken::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Options of one call.
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// Give up after this long (default: the context's deadline).
    pub deadline: Option<Duration>,
    /// Cancel from another thread.
    pub cancel: Option<CancelToken>,
}

/// Longest a cancellable call sleeps before it looks at its token.
const CANCEL_POLL: Duration = Duration::from_millis(20);

/// A call started and not yet finished.
struct Call {
    /// Whether the request went in one fragment (its round trip then
    /// teaches the spin policy, if the reply does too).
    small: bool,
    /// A large request's buffer, recycled once the core is done with it.
    keep: Option<Bytes>,
    started: Time,
    cancel: Option<CancelToken>,
}

/// A client endpoint.
pub struct Client {
    config: Arc<ContextConfig>,
    core: ClientCore,
    keys: ClientKeys,
    uid: u32,
    /// Believe only server endpoints registered by this uid.
    only_uid: Option<u32>,
    server_sock: UdpSocket,
    connected: Option<SocketAddr>,
    timeout: socket::Timeout,
    spin: SpinPolicy,
    /// The latest clock read of the call under way.
    last: Time,
    /// The call under way, between [`Client::start`] and
    /// [`Client::finish`].
    call: Option<Call>,
    buf: Vec<u8>,
    /// Where sealed datagrams are built.
    out: Vec<u8>,
}

impl Client {
    pub(crate) fn new(config: Arc<ContextConfig>) -> Result<Client, Error> {
        let (id, uid) = match config.call_node(&LinkRequest::Client)? {
            LinkResponse::Client { id, uid } => match u64::from_str_radix(&id, 16) {
                Ok(id) => (ClientId(id), uid),
                Err(_) => return Err(Error::Node("a client id from the node is not hex".into())),
            },
            _ => return Err(Error::Node("unexpected answer to client".into())),
        };
        let any = SocketAddr::new(config.bind_ip, 0);
        let server_sock = socket::bind(any)?;
        let spin = match config.client_spin {
            Some(d) => SpinPolicy::fixed(d),
            None => SpinPolicy::adaptive(crate::context::DEFAULT_SPIN),
        };
        let core_config = ClientConfig {
            frag_bytes: config.frag_bytes,
            window: socket::window_for(&server_sock, config.frag_bytes),
            max_reply_bytes: config.max_body_bytes,
            ..ClientConfig::default()
        };
        Ok(Client {
            core: ClientCore::new(id, core_config),
            keys: ClientKeys::default(),
            uid,
            only_uid: None,
            server_sock,
            config,
            connected: None,
            timeout: socket::Timeout::default(),
            spin,
            last: clock::now(),
            call: None,
            buf: vec![0; MAX_DATAGRAM],
            out: Vec::with_capacity(MAX_DATAGRAM),
        })
    }

    /// Sends `request` to a server of `port` and returns its reply.
    pub fn trans(&mut self, port: &PutPort, request: impl Into<Bytes>) -> Result<Vec<u8>, Error> {
        self.trans_with(port, request, &CallOptions::default())
    }

    /// [`Client::trans`] with a deadline and cancellation.
    pub fn trans_with(
        &mut self,
        port: &PutPort,
        request: impl Into<Bytes>,
        options: &CallOptions,
    ) -> Result<Vec<u8>, Error> {
        self.start(port, request, options)?;
        self.finish()
    }

    /// Sends `request` to a server of `port` (as much of it as may go
    /// before an acknowledgement) and returns: [`Client::finish`] waits
    /// for the reply.  So one thread may have a call under way at each of
    /// several servers at once, a client each, with no thread of its own
    /// for any.  A call already under way is abandoned.
    pub fn start(
        &mut self,
        port: &PutPort,
        request: impl Into<Bytes>,
        options: &CallOptions,
    ) -> Result<(), Error> {
        if self.call.take().is_some() {
            self.core.cancel();
            let _ = self.core.poll_outcome();
        }
        let deadline = options.deadline.unwrap_or(self.config.deadline);
        let request = request.into();
        let small = request.len() <= self.config.frag_bytes;
        let started = clock::now();
        self.last = started;
        self.call = Some(Call {
            small,
            keep: (!small).then(|| request.clone()),
            started,
            cancel: options.cancel.clone(),
        });
        self.core.start(started, *port, request, started + deadline);
        self.flush().map_err(|e| {
            self.call = None;
            self.abandon(e)
        })
    }

    /// The reply to the call [`Client::start`]ed.
    pub fn finish(&mut self) -> Result<Vec<u8>, Error> {
        let Some(call) = self.call.take() else {
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no call was started",
            )));
        };
        loop {
            if let Err(e) = self.flush() {
                return Err(self.abandon(e));
            }
            if let Some(outcome) = self.core.poll_outcome() {
                if let Ok(reply) = &outcome
                    && call.small
                    && reply.len() <= self.config.frag_bytes
                {
                    self.spin.record(self.last.saturating_since(call.started));
                }
                if let Some(k) = call.keep {
                    shoal_proto::pool::give_bytes(k);
                }
                return outcome.map_err(Error::from);
            }
            if call.cancel.as_ref().is_some_and(CancelToken::is_cancelled) {
                self.core.cancel();
                continue;
            }
            if let Err(e) = self.wait(call.cancel.is_some()) {
                return Err(self.abandon(e));
            }
        }
    }

    /// A socket error ended the call: close the transaction, so the client
    /// stays usable, and pass the error on.  The request may have run.
    fn abandon(&mut self, e: Error) -> Error {
        self.core.cancel();
        let _ = self.core.poll_outcome();
        e
    }

    /// Counters of this endpoint.
    pub fn stats(&self) -> &Stats {
        self.core.stats()
    }

    /// Calls only server endpoints that their nodes say a program of `uid`
    /// registered (`None`: any), as a group member does to find another.
    pub fn only_uid(&mut self, uid: Option<u32>) {
        self.only_uid = uid;
    }

    /// Forgets where `port` is served; the next call locates it afresh.
    pub fn forget(&mut self, port: &PutPort) {
        self.core.forget(port);
    }

    /// Sends the next calls to `port` to endpoint `instance` on `node`, as
    /// a server of the port advised (a replicated service naming the
    /// replica that orders its writes); the endpoint is used only once
    /// that node confirms it serves the port
    /// ([`shoal_proto::ClientCore::aim`]).
    pub fn aim(&mut self, port: &PutPort, node: NodeId, instance: Instance) {
        self.core.aim(*port, node, instance);
    }

    fn flush(&mut self) -> Result<(), Error> {
        while let Some(t) = self.core.poll_transmit() {
            match (t.dest, t.via) {
                (Dest::Addr(addr), Via::Server(instance)) => self.send(addr, instance, &t)?,
                (Dest::Nodes | Dest::Node(_), _) => self.locate(&t.bytes)?,
                (dest, via) => tracing::debug!(?dest, ?via, "a client datagram with no channel"),
            }
            pool::give(t.bytes);
        }
        Ok(())
    }

    /// Seals `t` for server endpoint `instance` and sends it to `addr`.
    fn send(&mut self, addr: SocketAddr, instance: Instance, t: &Transmit) -> Result<(), Error> {
        let (id, uid) = (self.core.id(), self.uid);
        let mut now = Some(self.last);
        loop {
            let (keys, out) = (&mut self.keys, &mut self.out);
            let sealed = crate::keys::with_pieces(&t.bytes, &t.tail, |pieces| {
                keys.seal(instance, now, uid, id, pieces, out)
            });
            match sealed {
                Sealed::Done => break,
                Sealed::Stale(node, port) => {
                    self.refresh(node, port, instance)?;
                    // Renewed or not (the old key still opens for a while,
                    // and the next send asks again), seal with what is kept.
                    now = None;
                }
                Sealed::NoKey => {
                    tracing::debug!(%instance, "no channel key: not sent");
                    return Ok(());
                }
            }
        }
        if self.connected != Some(addr) {
            self.server_sock.connect(addr)?;
            self.connected = Some(addr);
        }
        match self.server_sock.send(&self.out) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                self.core.handle_unreachable(clock::now(), addr);
            }
            Err(e) => tracing::debug!("send to {addr}: {e}"),
        }
        Ok(())
    }

    /// A fresh key for the channel to `instance` of `port` on `node`.
    #[cold]
    #[inline(never)]
    fn refresh(&mut self, node: NodeId, port: PutPort, instance: Instance) -> Result<(), Error> {
        let request = LinkRequest::Channel {
            client: format!("{:016x}", self.core.id().0),
            node: node.to_string(),
            port: port.to_string(),
            instance: instance.to_string(),
        };
        match self.config.call_node(&request) {
            Ok(LinkResponse::Channel(grant)) => self.keys.insert(instance, node, port, &grant),
            Ok(_) => Err(Error::Node("unexpected answer to channel".into())),
            // The old key still opens for a while; the next send asks again.
            Err(Error::Node(e)) => {
                tracing::debug!("channel key for {instance}: {e}");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Asks the local node the core's locate question, and hands the core
    /// the answers, keeping the keys they carry.
    #[cold]
    #[inline(never)]
    fn locate(&mut self, plain: &[u8]) -> Result<(), Error> {
        let Ok(Packet::Locate(l)) = decode_plain(plain) else {
            return Ok(());
        };
        let left = self.core.poll_timeout().map_or(Duration::ZERO, |t| {
            clock::instant(t).saturating_duration_since(Instant::now())
        });
        let request = LinkRequest::Locate {
            client: format!("{:016x}", self.core.id().0),
            port: l.port.to_string(),
            instance: format!("{:016x}", l.instance.0),
            node: format!("{:016x}", l.node.0),
            wait_ms: left.as_millis().clamp(1, 5_000) as u32,
            all: false,
        };
        let LinkResponse::Located { mut answers } = self.config.call_node(&request)? else {
            return Err(Error::Node("unexpected answer to locate".into()));
        };
        if let Some(uid) = self.only_uid {
            for a in &mut answers {
                a.endpoints.retain(|e| e.uid == uid);
            }
        }
        for here in answers_to_heres(&mut self.keys, &l, &answers)? {
            let from = SocketAddr::from(([0, 0, 0, 0], 0));
            self.core
                .handle_packet(clock::now(), from, Ok(Packet::Here(here)));
        }
        Ok(())
    }

    /// Waits for the next datagram or timer, and hands it to the core.
    fn wait(&mut self, cancellable: bool) -> Result<(), Error> {
        let Some(timer) = self.core.poll_timeout() else {
            return Ok(());
        };
        let Phase::Talking(target) = self.core.phase() else {
            // Locating: the node was asked; wait for the core's timer.
            let mut left = timer.saturating_since(clock::now());
            if cancellable {
                left = left.min(CANCEL_POLL);
            }
            std::thread::sleep(left);
            let now = clock::now();
            if self.core.poll_timeout().is_some_and(|t| t <= now) {
                self.core.handle_timeout(now);
            }
            return Ok(());
        };
        let sock = &self.server_sock;
        // Measured from the call's latest clock read: a spin may pass the
        // timer by the microseconds since.
        let mut spin = self.spin.spin().min(timer.saturating_since(self.last));
        // Poll only while few threads wait (see `Waiting`).
        let waiting = Waiting::enter();
        if !waiting.may_poll() {
            spin = Duration::ZERO;
        }
        let buf = &mut self.buf;
        // The socket is connected to the target: what it receives comes
        // from there (and is checked against the target's instance).
        let received = match socket::spin_with(spin, || socket::try_recv(sock, buf)) {
            Ok(Some(n)) => Ok(Some((n, target))),
            Ok(None) => {
                let mut left = timer.saturating_since(clock::now());
                if cancellable {
                    left = left.min(CANCEL_POLL);
                }
                if left.is_zero() {
                    Ok(None)
                } else {
                    self.timeout.set(sock, left)?;
                    sock.recv(buf).map(|n| Some((n, target)))
                }
            }
            Err(e) => Err(e),
        };
        drop(waiting);
        self.last = clock::now();
        let now = self.last;
        match received {
            Ok(Some((n, from))) => match self.keys.open(&mut self.buf[..n]) {
                Ok((sender, plain)) => self.core.handle_sealed(now, from, sender, &self.buf[plain]),
                Err(SessionError::Replayed) => self.core.handle_unopened(true),
                Err(_) => self.core.handle_unopened(false),
            },
            Ok(None) => {}
            Err(e) if socket::is_timeout(&e) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                self.core.handle_unreachable(now, target);
            }
            Err(e) => return Err(e.into()),
        }
        if self.core.poll_timeout().is_some_and(|t| t <= now) {
            self.core.handle_timeout(now);
        }
        Ok(())
    }
}

/// The node's answers to locate `l` as the core takes them, keeping the
/// channel keys they carry.
fn answers_to_heres(
    keys: &mut ClientKeys,
    l: &Locate,
    answers: &[crate::link::Answer],
) -> Result<Vec<Here>, Error> {
    let mut heres = Vec::new();
    for a in answers {
        let node = u64::from_str_radix(&a.node, 16)
            .map(NodeId)
            .map_err(|_| Error::Node("a node id from the node is not hex".into()))?;
        let mut endpoints = Vec::new();
        for f in a.endpoints.iter().take(shoal_wire::MAX_HERE_ENDPOINTS) {
            let Ok(instance) = u64::from_str_radix(&f.instance, 16) else {
                continue;
            };
            let instance = Instance(instance);
            keys.insert(instance, node, l.port, &f.grant)?;
            endpoints.push(Endpoint {
                addr: f.addr,
                instance,
                uid: f.uid,
                system: f.system,
            });
        }
        let fate = match a.fate {
            1 => Fate::Serving,
            2 => Fate::Drained,
            3 => Fate::Vanished,
            _ => Fate::Unknown,
        };
        heres.push(Here {
            nonce: l.nonce,
            port: l.port,
            node,
            fate,
            endpoints,
        });
    }
    Ok(heres)
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.core.id())
            .finish()
    }
}
