//! The server endpoint: one socket and one protocol core, shared by every
//! thread that calls [`Server::getreq`].
//!
//! Every datagram is opened with its caller's channel key before the core
//! sees it: the key is derived from the secret the node gave this
//! endpoint for the caller's node session (asked once per session) and
//! from the caller's uid and client id in the header, so what opens is
//! authenticated as coming from that (node, uid, client), which
//! [`Request::caller`] tells.  Replies are sealed in the same channel.
//!
//! Threads take turns reading the socket (leader/followers): the thread
//! holding the reader lock receives datagrams and feeds them to the core;
//! when a request completes it returns it to its own caller and another
//! waiting thread takes over the socket.  With one server thread, a request
//! goes from the socket to the application without any thread hand-off.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use shoal_cap::PutPort;
use shoal_proto::{
    Caller, Delivered, Dest, Replied, Rope, ServerConfig, ServerCore, Stats, Time, Transmit, Via,
    pool,
};
use shoal_wire::{Instance, MAX_DATAGRAM, TxnId, decode_plain};

use crate::clock;
use crate::context::{ContextConfig, DEFAULT_SPIN};
use crate::error::Error;
use crate::keys::{Refused, ServerKeys};
use crate::link::{Link, LinkRequest, LinkResponse};
use crate::service::Service;
use crate::socket;
use crate::spin::Window;

/// Longest a reading thread sleeps before it checks for shutdown.
const POLL: Duration = Duration::from_millis(100);

/// A request received by a server.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    txn: TxnId,
    caller: Caller,
    from: SocketAddr,
    body: Vec<u8>,
}

impl Request {
    /// The request body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// Takes the body out.
    pub fn into_body(mut self) -> Vec<u8> {
        std::mem::take(&mut self.body)
    }

    /// Takes the body out, keeping the request to reply to (its body is
    /// then empty).
    pub fn take_body(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.body)
    }

    /// Where the request came from.
    pub fn from(&self) -> SocketAddr {
        self.from
    }

    /// Who sent it: the node it came from, the uid that node vouches for
    /// (from the kernel, on that node), and the client endpoint.  Only
    /// that node could have made the key the request opened with.
    pub fn caller(&self) -> Caller {
        self.caller
    }

    /// The transaction's id.
    pub fn txn(&self) -> TxnId {
        self.txn
    }
}

/// What the reading thread owns: the receive buffer, the socket's
/// timeout setting and how long to poll before sleeping, for a new
/// request (`window`) and for the rest of one part-way in (`parts`).
/// The two are learned apart: a request's fragments come back to back,
/// requests may come a millisecond apart, and one window learning from
/// both would poll between requests for the fragments' sake.
struct Reader {
    buf: Vec<u8>,
    timeout: socket::Timeout,
    window: Window,
    parts: Window,
}

struct Shared {
    socket: UdpSocket,
    /// The channels of this endpoint's callers, opened before the core's
    /// lock is taken.
    keys: Mutex<ServerKeys>,
    /// This program's uid, as its node knows it.
    uid: u32,
    core: Mutex<ServerCore>,
    reader: Mutex<Reader>,
    /// The reader's poll window, for threads waiting to become the reader.
    reader_window_us: AtomicU64,
    link: Mutex<Option<Link>>,
    /// When the link was last checked, on the protocol clock, in
    /// microseconds (see [`Shared::keep_registered`]): an atomic, because
    /// every `getreq` looks at it.
    link_checked: AtomicU64,
    service: Service,
    addr: SocketAddr,
    closed: AtomicBool,
    instance: Instance,
    drain: Duration,
}

thread_local! {
    /// A thread's buffers for a small reply: its plaintext and the sealed
    /// datagram (see [`Server::putrep`]).
    static REPLY: std::cell::RefCell<(Vec<u8>, Vec<u8>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// How often an idle server checks that its node still knows it.
const LINK_CHECK: Duration = Duration::from_secs(1);

impl Shared {
    /// Becomes the thread that reads the socket.  A thread that comes back
    /// for a request while another reads polls the lock for the reader's
    /// window before it sleeps on it: the reader hands over the moment a
    /// request comes, and a sleeping thread would have to be woken for it
    /// on that request's critical path.
    fn reader(&self) -> parking_lot::MutexGuard<'_, Reader> {
        if let Some(r) = self.reader.try_lock() {
            return r;
        }
        let spin = Duration::from_micros(self.reader_window_us.load(Ordering::Relaxed));
        match socket::spin_with(spin, || Ok(self.reader.try_lock())) {
            Ok(Some(r)) => r,
            _ => self.reader.lock(),
        }
    }

    /// If the node restarted (the link closed), registers again with the
    /// new daemon, as the same instance: clients that cached this endpoint
    /// are unaffected, and new ones can locate it again.
    fn keep_registered(&self, now: Time) {
        let now = now.0;
        let last = self.link_checked.load(Ordering::Relaxed);
        if now.saturating_sub(last) < LINK_CHECK.as_micros() as u64
            || self
                .link_checked
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        self.register_again();
    }

    /// The rare part of [`Shared::keep_registered`], out of the request
    /// path's code.
    #[cold]
    #[inline(never)]
    fn register_again(&self) {
        let mut link = self.link.lock();
        let Some(current) = link.as_ref() else {
            return; // shut down
        };
        if !current.is_closed() {
            return;
        }
        let path = current.path().to_path_buf();
        let registered = Link::connect(&path).and_then(|mut fresh| {
            fresh.call(&register(self.service, self.addr, self.instance))?;
            Ok(fresh)
        });
        match registered {
            Ok(fresh) => {
                tracing::info!(port = %self.service.put_port(), "registered again with a restarted node");
                *link = Some(fresh);
            }
            Err(e) => tracing::debug!("node not back yet: {e}"),
        }
    }
}

/// A server endpoint serving one put-port.  Clone it to share it between
/// threads.
#[derive(Clone)]
pub struct Server {
    shared: Arc<Shared>,
    addr: SocketAddr,
    port: PutPort,
}

impl Server {
    pub(crate) fn new(config: Arc<ContextConfig>, service: Service) -> Result<Server, Error> {
        let Some(path) = &config.node_socket else {
            return Err(Error::Node(
                "serving needs a link to the local node (attach with Context::from_env)".into(),
            ));
        };
        let socket = socket::bind(SocketAddr::new(config.bind_ip, 0))?;
        let addr = socket.local_addr()?;
        let instance = Instance::random();
        let mut link = Link::connect(path)?;
        let LinkResponse::Registered { put_port } =
            link.call(&register(service, addr, instance))?
        else {
            return Err(Error::Node("unexpected answer to register".into()));
        };
        let port = service.put_port();
        if put_port != port.to_string() {
            return Err(Error::Node("the node computed a different put-port".into()));
        }
        let core_config = ServerConfig {
            frag_bytes: config.frag_bytes,
            window: socket::window_for(&socket, config.frag_bytes),
            max_request_bytes: config.max_body_bytes,
            max_assembling_bytes: config.max_body_bytes.saturating_mul(2),
            record_ttl: config.record_ttl,
            ..ServerConfig::default()
        };
        let core = ServerCore::new(port, instance, core_config);
        let uid = config.uid;
        Ok(Server {
            shared: Arc::new(Shared {
                socket,
                keys: Mutex::new(ServerKeys::default()),
                uid,
                core: Mutex::new(core),
                reader: Mutex::new(Reader {
                    buf: vec![0; MAX_DATAGRAM],
                    timeout: socket::Timeout::default(),
                    window: Window::from_setting(config.server_spin, DEFAULT_SPIN),
                    parts: Window::from_setting(config.server_spin, DEFAULT_SPIN),
                }),
                reader_window_us: AtomicU64::new(DEFAULT_SPIN.as_micros() as u64),
                link: Mutex::new(Some(link)),
                link_checked: AtomicU64::new(clock::now().0),
                service,
                addr,
                closed: AtomicBool::new(false),
                instance,
                drain: config.drain,
            }),
            addr,
            port,
        })
    }

    /// The put-port served.
    pub fn port(&self) -> PutPort {
        self.port
    }

    /// The address the endpoint listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// This incarnation's id.
    pub fn instance(&self) -> Instance {
        self.shared.instance
    }

    /// Counters of this endpoint.
    pub fn stats(&self) -> Stats {
        self.shared.core.lock().stats().clone()
    }

    /// Waits for the next request.
    ///
    /// A receive that timed out keeps the reader: a quiet endpoint's
    /// reader sleeps again at once, without polling and without handing
    /// the socket to a sibling (which would wake it to poll in turn).
    /// After a datagram the reader gives the socket up, so under traffic
    /// the threads still take turns at it.
    pub fn getreq(&self) -> Result<Request, Error> {
        let shared = &*self.shared;
        loop {
            if let Some(d) = shared.core.lock().poll_request() {
                return Ok(request(d));
            }
            if shared.closed.load(Ordering::Acquire) {
                return Err(Error::Closed);
            }
            let mut reader = shared.reader();
            if let Some(d) = self.read(&mut reader)? {
                return Ok(request(d));
            }
        }
    }

    /// Reads the socket as the reader until a request completes (`Some`)
    /// or a datagram came that completed none (`None`).
    fn read(&self, reader: &mut Reader) -> Result<Option<Delivered>, Error> {
        let shared = &*self.shared;
        let Reader {
            buf,
            timeout,
            window,
            parts,
        } = reader;
        // The latest receive timed out: the endpoint is quiet, and the
        // next wait sleeps without polling first.
        let mut quiet = false;
        loop {
            // Another reader may have queued a request meanwhile.
            let assembling = {
                let mut core = shared.core.lock();
                if let Some(d) = core.poll_request() {
                    return Ok(Some(d));
                }
                core.is_assembling()
            };
            if shared.closed.load(Ordering::Acquire) {
                return Err(Error::Closed);
            }
            let learning = if assembling {
                &mut *parts
            } else {
                &mut *window
            };
            let spin = if quiet {
                Duration::ZERO
            } else {
                learning.get()
            };
            let waiting = clock::now();
            let received = match socket::spin_recv(&shared.socket, buf, spin) {
                Ok(Some(got)) => Ok(got),
                Ok(None) => {
                    let timer = shared.core.lock().poll_timeout();
                    let left = timer
                        .saturating_since(clock::now())
                        .clamp(Duration::from_millis(1), POLL);
                    timeout.set(&shared.socket, left)?;
                    shared.socket.recv_from(buf)
                }
                Err(e) => Err(e),
            };
            // One clock read per datagram serves the keys, the link check,
            // the poll window and the core.
            let now = clock::now();
            quiet = matches!(&received, Err(e) if socket::is_timeout(e));
            match &received {
                Ok(_) => learning.saw(now.saturating_since(waiting)),
                Err(_) => learning.saw_nothing(),
            }
            shared
                .reader_window_us
                .store(window.get().as_micros() as u64, Ordering::Relaxed);
            shared.keep_registered(now);
            // Datagrams are opened, and the replies sealed and sent,
            // outside the core's lock: a thread replying meanwhile is not
            // held up by them.
            let received = received.map(|(n, from)| (from, shared.open(&mut buf[..n], now)));
            let mut core = shared.core.lock();
            match received {
                Ok((from, Ok((caller, channel, plain)))) => {
                    core.handle_packet(now, from, caller, channel, decode_plain(&buf[plain]))
                }
                Ok((_, Err(replayed))) => core.handle_unopened(replayed),
                Err(e) if socket::is_timeout(&e) => {}
                // An ICMP error for an earlier reply: nothing to do.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(e.into()),
            }
            if core.poll_timeout() <= now {
                core.handle_timeout(now);
            }
            let out = outbox(&mut core);
            let delivered = core.poll_request();
            drop(core);
            shared.send_all(out);
            if delivered.is_some() || !quiet {
                return Ok(delivered);
            }
        }
    }

    /// Sends the reply to `request`: bytes, or a [`Rope`] of pieces sent
    /// as they are, without being copied into one buffer.  A reply to a
    /// client that gave up meanwhile is dropped silently.
    pub fn putrep(&self, request: &Request, reply: impl Into<Rope>) -> Result<(), Error> {
        let shared = &*self.shared;
        REPLY.with_borrow_mut(|(plain, sealed)| {
            let (replied, out) = {
                let mut core = shared.core.lock();
                let replied =
                    core.reply_into(clock::now(), request.caller, request.txn, reply, plain);
                (replied, outbox(&mut core))
            };
            // A small reply goes at once, sealed in this thread's buffer.
            if let Replied::Encoded {
                to,
                via: Via::Client { caller, channel },
            } = replied
            {
                shared.seal_and_send(to, caller, channel, &[plain], sealed);
            }
            shared.send_all(out);
        });
        Ok(())
    }

    /// Stops serving at once, without a drain: withdraws the port from
    /// locate (by closing the registration's link) and makes
    /// [`Server::getreq`] fail with [`Error::Closed`] within its poll.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        drop(self.shared.link.lock().take());
    }

    /// Stops serving on purpose: withdraws the port from locate, refuses new
    /// requests for the drain period (answering those already begun), then
    /// closes.  Clients move to other servers without losing a request.
    /// Some thread must be in [`Server::getreq`] meanwhile, or the drain
    /// answers nothing; this call keeps the socket served itself.
    pub fn shutdown(&self) -> Result<(), Error> {
        let shared = &*self.shared;
        let instance = shared.instance.to_string();
        // Withdraw from locate; if the node is gone, drain and close all
        // the same, and report the node's error at the end.
        let withdrawn = match shared.link.lock().as_mut() {
            Some(link) => link
                .call(&LinkRequest::Drain {
                    instance: instance.clone(),
                })
                .map(drop),
            None => Ok(()),
        };
        shared.core.lock().drain();
        let until = Instant::now() + shared.drain;
        // Serve the drain ourselves, in case no thread is in getreq.
        while Instant::now() < until {
            let Some(mut reader) = shared.reader.try_lock_for(Duration::from_millis(5)) else {
                continue;
            };
            let Reader { buf, timeout, .. } = &mut *reader;
            let left = until.saturating_duration_since(Instant::now());
            timeout.set(&shared.socket, left.min(Duration::from_millis(10)))?;
            if let Ok((n, from)) = shared.socket.recv_from(buf) {
                let now = clock::now();
                let opened = shared.open(&mut buf[..n], now);
                let out = {
                    let mut core = shared.core.lock();
                    match opened {
                        Ok((caller, channel, plain)) => {
                            core.handle_datagram(now, from, caller, channel, &buf[plain])
                        }
                        Err(replayed) => core.handle_unopened(replayed),
                    }
                    outbox(&mut core)
                };
                shared.send_all(out);
            }
        }
        shared.closed.store(true, Ordering::Release);
        let drained = match shared.link.lock().take() {
            Some(mut link) if withdrawn.is_ok() => {
                link.call(&LinkRequest::Drained { instance }).map(drop)
            }
            _ => Ok(()),
        };
        withdrawn.and(drained)
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("port", &self.port)
            .field("addr", &self.addr)
            .finish()
    }
}

impl Drop for Request {
    /// A large body's memory goes back to the pool for the next request.
    fn drop(&mut self) {
        pool::give(std::mem::take(&mut self.body));
    }
}

/// The link request that registers `service` at `addr` as `instance`.
fn register(service: Service, addr: SocketAddr, instance: Instance) -> LinkRequest {
    match service {
        Service::Port(get) => LinkRequest::Register {
            get_port: get.to_hex(),
            addr,
            instance: instance.to_string(),
        },
        Service::System(put) => LinkRequest::RegisterSystem {
            put_port: put.to_string(),
            addr,
            instance: instance.to_string(),
        },
    }
}

fn request(d: Delivered) -> Request {
    Request {
        txn: d.txn,
        caller: d.caller,
        from: d.from,
        body: d.body,
    }
}

/// The datagrams the core has queued, taken under its lock to be sent
/// after it is released.
fn outbox(core: &mut ServerCore) -> Outbox {
    let first = core.poll_transmit();
    let rest = match first {
        Some(_) => std::iter::from_fn(|| core.poll_transmit()).collect(),
        None => Vec::new(),
    };
    Outbox { first, rest }
}

/// What one turn of the core sends: mostly nothing, or one datagram (a
/// reply), kept without an allocation.
struct Outbox {
    first: Option<Transmit>,
    rest: Vec<Transmit>,
}

impl Shared {
    /// Opens a datagram from a caller in place: who, through which
    /// session, and where the plaintext is; or whether it was a replay.
    /// The secret of a session not seen yet is asked of the node.
    fn open(
        &self,
        datagram: &mut [u8],
        now: Time,
    ) -> Result<(Caller, u32, std::ops::Range<usize>), bool> {
        let opened = self.keys.lock().open(datagram, now);
        match opened {
            Ok(o) => Ok(o),
            Err(Refused::NeedRoot(index)) => {
                self.fetch_root(index);
                match self.keys.lock().open(datagram, clock::now()) {
                    Ok(o) => Ok(o),
                    Err(Refused::Replayed) => Err(true),
                    Err(_) => Err(false),
                }
            }
            Err(Refused::Replayed) => Err(true),
            Err(Refused::Bad) => Err(false),
        }
    }

    /// Asks the node for this endpoint's secret in session `index`.
    #[cold]
    #[inline(never)]
    fn fetch_root(&self, index: u32) {
        let answer = match self.link.lock().as_mut() {
            Some(link) => link.call(&LinkRequest::ServerKey {
                instance: self.instance.to_string(),
                index,
            }),
            None => return,
        };
        let mut keys = self.keys.lock();
        match answer {
            Ok(LinkResponse::ServerKey {
                secret,
                node,
                aes,
                valid_ms,
            }) => {
                if let Err(e) = keys.insert_root(index, &secret, &node, aes, valid_ms) {
                    tracing::debug!("session {index:08x}: {e}");
                    keys.unknown(index);
                }
            }
            Ok(_) | Err(_) => keys.unknown(index),
        }
    }

    /// Seals and sends what the core queued.
    fn send_all(&self, out: Outbox) {
        let Some(first) = out.first else {
            return;
        };
        let mut sealed = pool::datagram();
        for t in std::iter::once(first).chain(out.rest) {
            let (Dest::Addr(addr), Via::Client { caller, channel }) = (t.dest, t.via) else {
                pool::give(t.bytes);
                continue;
            };
            crate::keys::with_pieces(&t.bytes, &t.tail, |pieces| {
                self.seal_and_send(addr, caller, channel, pieces, &mut sealed)
            });
            pool::give(t.bytes);
        }
        pool::give(sealed);
    }

    /// Seals the plaintext `pieces` for `caller` in session `channel`,
    /// into `sealed`, and sends it to `addr`; nothing if that channel is
    /// gone.
    fn seal_and_send(
        &self,
        addr: SocketAddr,
        caller: Caller,
        channel: u32,
        pieces: &[&[u8]],
        sealed: &mut Vec<u8>,
    ) {
        let ok = self
            .keys
            .lock()
            .seal(channel, caller, self.uid, self.instance, pieces, sealed);
        if ok && let Err(e) = self.socket.send_to(sealed, addr) {
            tracing::debug!("reply to {addr}: {e}");
        }
    }
}
