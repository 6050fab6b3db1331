//! The client endpoint: [`Client::trans`] runs one transaction on the
//! calling thread.
//!
//! Two sockets: one connected to the current server (so the kernel reports
//! a closed port as `ECONNREFUSED`, which the core needs to notice a
//! departed server at once), and one unconnected for locate traffic with
//! the nodes.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use shoal_cap::PutPort;
use shoal_proto::{ClientConfig, ClientCore, Dest, Phase, Stats, pool};
use shoal_wire::{ClientId, MAX_DATAGRAM, REPLY_HEAD};

use crate::clock;
use crate::context::ContextConfig;
use crate::error::Error;
use crate::socket;
use crate::spin::SpinPolicy;

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

/// A client endpoint.
pub struct Client {
    config: Arc<ContextConfig>,
    core: ClientCore,
    server_sock: UdpSocket,
    locate_sock: UdpSocket,
    connected: Option<SocketAddr>,
    /// Read timeouts of `server_sock` and `locate_sock`, each socket its own.
    timeouts: [socket::Timeout; 2],
    spin: SpinPolicy,
    buf: Vec<u8>,
}

impl Client {
    pub(crate) fn new(config: Arc<ContextConfig>) -> Result<Client, Error> {
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
            core: ClientCore::new(ClientId::random(), config.key.clone(), core_config),
            server_sock,
            locate_sock: socket::bind(any)?,
            config,
            connected: None,
            timeouts: Default::default(),
            spin,
            buf: vec![0; MAX_DATAGRAM],
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
        let deadline = options.deadline.unwrap_or(self.config.deadline);
        let request = request.into();
        let small = request.len() <= self.config.frag_bytes;
        // Kept to recycle the buffer once the core is done with it.
        let keep = (!small).then(|| request.clone());
        let started = Instant::now();
        let now = clock::now();
        self.core.start(now, *port, request, now + deadline);
        loop {
            if let Err(e) = self.flush() {
                return Err(self.abandon(e));
            }
            if let Some(outcome) = self.core.poll_outcome() {
                if let Ok(reply) = &outcome
                    && small
                    && reply.len() <= self.config.frag_bytes
                {
                    self.spin.record(started.elapsed());
                }
                if let Some(k) = keep {
                    shoal_proto::pool::give_bytes(k);
                }
                return outcome.map_err(Error::from);
            }
            if options
                .cancel
                .as_ref()
                .is_some_and(CancelToken::is_cancelled)
            {
                self.core.cancel();
                continue;
            }
            if let Err(e) = self.wait(options.cancel.is_some()) {
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

    /// Forgets where `port` is served; the next call locates it afresh.
    pub fn forget(&mut self, port: &PutPort) {
        self.core.forget(port);
    }

    fn flush(&mut self) -> Result<(), Error> {
        while let Some(mut t) = self.core.poll_transmit() {
            t.seal(&self.config.key);
            match t.dest {
                Dest::Addr(addr) if self.core.phase() == Phase::Talking(addr) => {
                    if self.connected != Some(addr) {
                        self.server_sock.connect(addr)?;
                        self.connected = Some(addr);
                    }
                    match crate::socket::send_parts(&self.server_sock, &t.bytes, &t.tail, None) {
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                            self.core.handle_unreachable(clock::now(), addr);
                        }
                        Err(e) => tracing::debug!("send to {addr}: {e}"),
                    }
                }
                Dest::Addr(addr) => {
                    if let Err(e) =
                        crate::socket::send_parts(&self.locate_sock, &t.bytes, &t.tail, Some(addr))
                    {
                        tracing::debug!("send to {addr}: {e}");
                    }
                }
                Dest::Nodes => {
                    for addr in &self.config.locate {
                        if let Err(e) = self.locate_sock.send_to(&t.bytes, addr) {
                            tracing::debug!("locate to {addr}: {e}");
                        }
                    }
                }
            }
            pool::give(t.bytes);
        }
        Ok(())
    }

    /// Waits for the next datagram or timer, and hands it to the core.
    fn wait(&mut self, cancellable: bool) -> Result<(), Error> {
        let Some(timer) = self.core.poll_timeout() else {
            return Ok(());
        };
        let (sock, timeout, target) = match self.core.phase() {
            Phase::Talking(addr) => (&self.server_sock, &mut self.timeouts[0], Some(addr)),
            _ => (&self.locate_sock, &mut self.timeouts[1], None),
        };
        let until = clock::instant(timer);
        let spin = if target.is_some() {
            self.spin
                .spin()
                .min(until.saturating_duration_since(Instant::now()))
        } else {
            Duration::ZERO
        };
        // While a reply arrives, its next fragment is received straight
        // into its place in the body: the header in `head`, the payload in
        // the slot, anything longer than expected in `buf`.
        let mut head = [0u8; REPLY_HEAD];
        let mut slot = target.and_then(|_| self.core.reply_slot());
        let placed = slot.as_ref().map(|(index, s)| (*index, s.len()));
        let buf = &mut self.buf;
        let mut recv = |wait: bool| match &mut slot {
            Some((_, s)) => socket::recv_scatter(sock, &mut [&mut head, s, buf], wait),
            None if wait => sock.recv_from(buf).map(Some),
            None => socket::try_recv_from(sock, buf),
        };
        let received = match socket::spin_with(spin, || recv(false)) {
            Ok(Some(got)) => Ok(Some(got)),
            Ok(None) => {
                let mut left = until.saturating_duration_since(Instant::now());
                if cancellable {
                    left = left.min(CANCEL_POLL);
                }
                if left.is_zero() {
                    Ok(None)
                } else {
                    timeout.set(sock, left)?;
                    recv(true)
                }
            }
            Err(e) => Err(e),
        };
        let now = clock::now();
        match (received, placed) {
            (Ok(Some((n, from))), Some(_)) if n <= REPLY_HEAD => {
                self.core.handle_datagram(now, from, &head[..n]);
            }
            (Ok(Some((n, from))), Some((index, room))) => {
                let len = (n - REPLY_HEAD).min(room);
                let spill = &self.buf[..n - REPLY_HEAD - len];
                self.core
                    .handle_placed(now, from, &head, (index, len), spill);
            }
            (received, _) => self.on_received(now, target, received)?,
        }
        if self.core.poll_timeout().is_some_and(|t| t <= now) {
            self.core.handle_timeout(now);
        }
        Ok(())
    }

    /// What a plain receive into `buf` got.
    fn on_received(
        &mut self,
        now: shoal_proto::Time,
        target: Option<SocketAddr>,
        received: io::Result<Option<(usize, SocketAddr)>>,
    ) -> Result<(), Error> {
        match received {
            Ok(Some((n, from))) => self.core.handle_datagram(now, from, &self.buf[..n]),
            Ok(None) => {}
            Err(e) if socket::is_timeout(&e) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                if let Some(addr) = target {
                    self.core.handle_unreachable(now, addr);
                }
            }
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.core.id())
            .finish()
    }
}
