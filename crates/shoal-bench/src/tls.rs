//! The TLS baselines of `shoal bench rpc`: what a user gets from a secure
//! stream today.  A TLS 1.3 stream over TCP (rustls, with ring: the same
//! AEAD code shoal's sessions use), carrying the same length-prefixed
//! blobs as the raw TCP baseline; gRPC over TLS is `crate::grpc` with a
//! [`Cert`].  The certificate is made for the run and trusted by name.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};

/// The name the run's certificate is made for.
pub const SERVER_NAME: &str = "shoal-bench";

/// A self-signed certificate and its key, for one run.
#[derive(Clone)]
pub struct Cert {
    pub cert_pem: String,
    pub key_pem: String,
    cert_der: Vec<u8>,
    key_der: Vec<u8>,
}

impl Cert {
    /// A new certificate for [`SERVER_NAME`].
    pub fn new() -> Result<Cert, String> {
        let c = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_string()])
            .map_err(|e| format!("cannot make a certificate: {e}"))?;
        Ok(Cert {
            cert_pem: c.cert.pem(),
            key_pem: c.signing_key.serialize_pem(),
            cert_der: c.cert.der().to_vec(),
            key_der: c.signing_key.serialize_der(),
        })
    }

    /// The certificate alone (what a client trusts), from its PEM.
    pub fn trusting(cert_pem: &str) -> Result<Cert, String> {
        use rustls::pki_types::pem::PemObject;
        let der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| format!("bad certificate: {e}"))?;
        Ok(Cert {
            cert_pem: cert_pem.to_string(),
            key_pem: String::new(),
            cert_der: der.to_vec(),
            key_der: Vec::new(),
        })
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Serves the TLS sink on `ip`: each connection reads length-prefixed
/// blobs and acknowledges each with one byte, as the raw TCP sink does.
pub fn start_sink(ip: std::net::IpAddr, cert: &Cert) -> Result<SocketAddr, String> {
    let config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.cert_der.clone())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_der.clone())),
        )
        .map_err(|e| format!("TLS server: {e}"))?;
    let config = Arc::new(config);
    let listener = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let config = config.clone();
            std::thread::spawn(move || {
                let _ = stream.set_nodelay(true);
                let Ok(conn) = ServerConnection::new(config) else {
                    return;
                };
                sink(rustls::StreamOwned::new(conn, stream));
            });
        }
    });
    Ok(addr)
}

/// Reads length-prefixed blobs from `stream` and acknowledges each with
/// one byte: the sink of both the raw TCP and the TLS baselines.
pub(crate) fn sink(mut stream: impl Read + Write) {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let mut len = [0u8; 8];
        if stream.read_exact(&mut len).is_err() {
            return;
        }
        let mut left = u64::from_le_bytes(len) as usize;
        while left > 0 {
            let want = left.min(buf.len());
            match stream.read(&mut buf[..want]) {
                Ok(0) | Err(_) => return,
                Ok(n) => left -= n,
            }
        }
        if stream
            .write_all(&[1])
            .and_then(|()| stream.flush())
            .is_err()
        {
            return;
        }
    }
}

/// A TLS 1.3 client stream to the sink at `addr`, trusting `cert`.
pub type Stream = rustls::StreamOwned<ClientConnection, TcpStream>;

/// Connects to the sink at `addr`, trusting `cert`, and completes the
/// handshake.
pub fn connect(addr: SocketAddr, cert: &Cert) -> Result<Stream, String> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from(cert.cert_der.clone()))
        .map_err(|e| format!("TLS roots: {e}"))?;
    let config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from(SERVER_NAME).map_err(|e| e.to_string())?;
    let conn = ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let tcp = TcpStream::connect(addr).map_err(|e| format!("TLS stream: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    while stream.conn.is_handshaking() {
        stream
            .conn
            .complete_io(&mut stream.sock)
            .map_err(|e| format!("TLS handshake: {e}"))?;
    }
    Ok(stream)
}

/// Sends one blob to a [`sink`] and waits for its acknowledgement.
pub fn send_blob(stream: &mut (impl Read + Write), bytes: &[u8]) -> Result<(), String> {
    stream
        .write_all(&(bytes.len() as u64).to_le_bytes())
        .and_then(|()| stream.write_all(bytes))
        .and_then(|()| stream.flush())
        .map_err(|e| e.to_string())?;
    let mut ack = [0u8; 1];
    stream.read_exact(&mut ack).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_cross_the_tls_stream() {
        let cert = Cert::new().unwrap();
        let addr = start_sink("127.0.0.1".parse().unwrap(), &cert).unwrap();
        let trusted = Cert::trusting(&cert.cert_pem).unwrap();
        let mut s = connect(addr, &trusted).unwrap();
        assert_eq!(
            s.conn.negotiated_cipher_suite().map(|c| c.version()),
            Some(&rustls::version::TLS13)
        );
        for len in [0, 1, 100_000, 3 << 20] {
            send_blob(&mut s, &vec![7u8; len]).unwrap();
        }
        // Another certificate is not trusted.
        let other = Cert::new().unwrap();
        assert!(connect(addr, &other).is_err());
    }
}
