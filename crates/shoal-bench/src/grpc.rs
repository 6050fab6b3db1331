//! gRPC echo baseline: the peer a user would otherwise pick.
//!
//! A unary echo service, `/shoal.bench.Echo/Call`, served and called with
//! tonic (HTTP/2 over TCP, `TCP_NODELAY` on both ends) and the prost codec,
//! so that shoal's RPC latency can be compared against a well-configured
//! gRPC rather than a strawman. The service is written by hand in the shape
//! `tonic-build` would generate, for the one-message schema
//!
//! ```proto
//! package shoal.bench;
//! message Echo { bytes payload = 1; }
//! service Echo { rpc Call(Echo) returns (Echo); }
//! ```
//!
//! so no `protoc` or build script is needed. The API is blocking: each side
//! runs its own tokio runtime.  With a [`Cert`], the same service runs over
//! TLS (rustls with ring), as gRPC deployments do.
//!
//! Both sides use a *current_thread* runtime: with one call outstanding at a
//! time there is nothing to parallelise, and a single-threaded runtime avoids
//! cross-thread wake-ups (the hyper connection task, tonic's channel buffer
//! worker and the caller all run on one thread), which gives the lowest
//! round-trip latency tonic can offer.

use std::convert::Infallible;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::runtime::{Builder, Runtime};
use tokio::sync::oneshot;
use tonic::client::Grpc;
use tonic::codegen::{Body, BoxFuture, Service, StdError, http};
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{
    Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig,
};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

use crate::tls::Cert;

/// Full path of the echo method.
const CALL_PATH: &str = "/shoal.bench.Echo/Call";

/// `message Echo { bytes payload = 1; }`, carried as `Bytes` to avoid copies.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Echo {
    #[prost(bytes = "bytes", tag = "1")]
    pub payload: Bytes,
}

/// The server half of `service Echo`, as `tonic-build` would generate it.
#[derive(Clone, Copy, Debug, Default)]
struct EchoServer;

impl NamedService for EchoServer {
    const NAME: &'static str = "shoal.bench.Echo";
}

impl<B> Service<http::Request<B>> for EchoServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != CALL_PATH {
            let status = Status::unimplemented(req.uri().path().to_owned());
            return Box::pin(async move { Ok(status.into_http()) });
        }
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<Echo, Echo>::default());
            Ok(grpc.unary(CallSvc, req).await)
        })
    }
}

/// The `Call` method handler: returns the request message unchanged.
struct CallSvc;

impl tonic::server::UnaryService<Echo> for CallSvc {
    type Response = Echo;
    type Future = std::future::Ready<Result<Response<Echo>, Status>>;

    fn call(&mut self, request: Request<Echo>) -> Self::Future {
        std::future::ready(Ok(Response::new(request.into_inner())))
    }
}

/// A running gRPC echo server on its own thread; dropping it stops it.
pub struct GrpcServer {
    local_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl GrpcServer {
    /// Binds `addr` (e.g. "0.0.0.0:0" or "10.1.2.3:0") and serves the echo;
    /// over TLS with `tls`'s certificate.
    pub fn start(addr: SocketAddr, tls: Option<&Cert>) -> io::Result<GrpcServer> {
        let tls = tls
            .map(|c| ServerTlsConfig::new().identity(Identity::from_pem(&c.cert_pem, &c.key_pem)));
        // Bind here so bind errors and the chosen port reach the caller.
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let rt = current_thread_runtime()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("grpc-echo".into())
            .spawn(move || {
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => return eprintln!("grpc echo: {e}"),
                    };
                    // `serve_with_incoming` ignores the builder's TCP options,
                    // so set TCP_NODELAY on the incoming stream itself.
                    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                    let mut builder = Server::builder();
                    if let Some(tls) = tls {
                        builder = match builder.tls_config(tls) {
                            Ok(b) => b,
                            Err(e) => return eprintln!("grpc echo: {e}"),
                        };
                    }
                    let serve = builder
                        .add_service(EchoServer)
                        .serve_with_incoming(incoming);
                    tokio::select! {
                        res = serve => if let Err(e) = res { eprintln!("grpc echo: {e}") },
                        _ = stopped => {}
                    }
                });
                // Dropping the runtime here aborts any open connections.
            })?;
        Ok(GrpcServer {
            local_addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A unary echo client kept across rounds, so that its samples can be
/// interleaved with those of what it is compared against.
pub struct EchoClient(Client);

impl EchoClient {
    /// A client of the echo at `addr`; over TLS, trusting `tls`.
    pub fn connect(addr: SocketAddr, tls: Option<&Cert>) -> io::Result<EchoClient> {
        Client::connect(addr, tls).map(EchoClient)
    }

    /// Makes `n` unary echo calls with a `payload_len`-byte payload, one at
    /// a time; each one's round-trip time.
    pub fn rtts(&mut self, payload_len: usize, n: usize) -> io::Result<Vec<Duration>> {
        let payload = Bytes::from(vec![0xa5; payload_len]);
        let grpc = &mut self.0.grpc;
        self.0.rt.block_on(async move {
            let mut rtts = Vec::with_capacity(n);
            for _ in 0..n {
                let start = Instant::now();
                let reply = call(grpc, payload.clone()).await?;
                rtts.push(start.elapsed());
                if reply.len() != payload_len {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "short echo"));
                }
            }
            Ok(rtts)
        })
    }
}

/// A blocking echo client: a tonic channel plus the runtime that drives it.
struct Client {
    rt: Runtime,
    grpc: Grpc<Channel>,
}

impl Client {
    /// A client of the echo at `addr`; over TLS, trusting `tls`.
    fn connect(addr: SocketAddr, tls: Option<&Cert>) -> io::Result<Client> {
        let rt = current_thread_runtime()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(io::Error::other)?
            .tcp_nodelay(true);
        if let Some(cert) = tls {
            endpoint = endpoint
                .tls_config(
                    ClientTlsConfig::new()
                        .ca_certificate(Certificate::from_pem(&cert.cert_pem))
                        .domain_name(crate::tls::SERVER_NAME),
                )
                .map_err(io::Error::other)?;
        }
        let channel = rt.block_on(endpoint.connect()).map_err(io::Error::other)?;
        Ok(Client {
            rt,
            grpc: Grpc::new(channel),
        })
    }

    /// One echo call, blocking; returns the reply payload.
    #[cfg_attr(not(test), allow(dead_code))]
    fn call_once(&mut self, payload: Bytes) -> io::Result<Bytes> {
        self.rt.block_on(call(&mut self.grpc, payload))
    }
}

/// One unary `Call`, as a generated client stub would make it.
async fn call(grpc: &mut Grpc<Channel>, payload: Bytes) -> io::Result<Bytes> {
    grpc.ready().await.map_err(io::Error::other)?;
    let path = http::uri::PathAndQuery::from_static(CALL_PATH);
    let reply = grpc
        .unary(
            Request::new(Echo { payload }),
            path,
            ProstCodec::<Echo, Echo>::default(),
        )
        .await
        .map_err(io::Error::other)?;
    Ok(reply.into_inner().payload)
}

fn current_thread_runtime() -> io::Result<Runtime> {
    Builder::new_current_thread().enable_all().build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local_server() -> GrpcServer {
        GrpcServer::start("127.0.0.1:0".parse().unwrap(), None).unwrap()
    }

    #[test]
    fn an_echo_client_returns_n_samples_round_after_round() {
        let server = local_server();
        let mut client = EchoClient::connect(server.local_addr(), None).unwrap();
        assert_eq!(client.rtts(100, 20).unwrap().len(), 20);
        assert_eq!(client.rtts(0, 5).unwrap().len(), 5);
        // And over TLS.
        let cert = Cert::new().unwrap();
        let tls = GrpcServer::start("127.0.0.1:0".parse().unwrap(), Some(&cert)).unwrap();
        let trusted = Cert::trusting(&cert.cert_pem).unwrap();
        let mut client = EchoClient::connect(tls.local_addr(), Some(&trusted)).unwrap();
        assert_eq!(client.rtts(100, 20).unwrap().len(), 20);
        // Not trusting the server's certificate: no echo.
        let refused = EchoClient::connect(tls.local_addr(), None).and_then(|mut c| c.rtts(100, 1));
        assert!(refused.is_err());
    }

    #[test]
    fn echo_echoes() {
        let server = local_server();
        let mut client = Client::connect(server.local_addr(), None).unwrap();
        for len in [0, 1, 100, 70_000] {
            let payload: Bytes = (0..len).map(|i| (i * 7) as u8).collect();
            assert_eq!(client.call_once(payload.clone()).unwrap(), payload);
        }
    }

    #[test]
    fn unknown_method_is_unimplemented() {
        let server = local_server();
        let Client { rt, mut grpc } = Client::connect(server.local_addr(), None).unwrap();
        let err = rt
            .block_on(async {
                grpc.ready().await.unwrap();
                let path = http::uri::PathAndQuery::from_static("/shoal.bench.Echo/Nope");
                let codec = ProstCodec::<Echo, Echo>::default();
                grpc.unary(Request::new(Echo::default()), path, codec).await
            })
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unimplemented);
    }
}
