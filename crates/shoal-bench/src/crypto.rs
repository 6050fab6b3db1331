//! Figures of shoal's trust core, for `shoal bench rpc`: the node session
//! handshake (both sides' work, no network), the AEAD's seal-and-open rate
//! on datagram-sized bodies (the ceiling of any encrypted transfer on this
//! CPU), and a sealed UDP echo (the floor of any encrypted round trip).

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use shoal_session::datagram::{Header, open, seal};
use shoal_session::handshake::static_public;
use shoal_session::{
    AdminKey, Algorithm, ClusterId, Initiator, Key, NodeCert, NodeIdentity, Responder,
    RevocationList, Trust,
};

use crate::stats::{median, percentile_us};

/// Median microseconds of a whole Noise XX handshake between two nodes:
/// three messages made and checked, certificates verified, keys derived.
pub fn handshake_us(quick: bool) -> Result<f64, String> {
    let admin = AdminKey::from_seed(rand::random());
    let cluster = ClusterId(rand::random());
    let trust = Trust {
        cluster,
        admin: admin.public(),
        revoked: RevocationList::default(),
    };
    let node = |name: &str| -> Result<NodeIdentity, String> {
        let private: [u8; 32] = rand::random();
        let cert = NodeCert {
            cluster,
            serial: rand::random(),
            not_before: 0,
            not_after: u64::MAX,
            static_key: static_public(&private),
            name: name.into(),
        }
        .sign(&admin)
        .map_err(|e| e.to_string())?;
        NodeIdentity::new(private, cert, &trust, now()).map_err(|e| e.to_string())
    };
    let (a, b) = (node("n1")?, node("n2")?);
    let aes = Algorithm::cpu_has_aes();
    let rounds = if quick { 50 } else { 500 };
    let mut times = Vec::with_capacity(rounds);
    let (mut m1, mut m2, mut m3) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..rounds + 20 {
        let start = Instant::now();
        let init =
            Initiator::start(&a, &trust, 1, rand::random(), &mut m1).map_err(|e| e.to_string())?;
        let resp = Responder::answer(&m1, &b, &trust, 2, rand::random(), aes, &mut m2)
            .map_err(|e| e.to_string())?;
        init.finish(&m2, &a, &trust, now(), aes, &mut m3)
            .map_err(|e| e.to_string())?;
        resp.finish(&m3, &trust, now()).map_err(|e| e.to_string())?;
        if i >= 20 {
            times.push(start.elapsed());
        }
    }
    Ok(percentile_us(&mut times, 50))
}

/// MiB/s of sealing and opening 60,000-byte bodies (a fragment) with the
/// AEAD this CPU's sessions use.
pub fn aead_ceiling_mib_s(quick: bool) -> f64 {
    let key = Key::new(session_algorithm(), &rand::random());
    let body = vec![0x5au8; 60_000];
    let mut out = Vec::with_capacity(body.len() + 64);
    let budget = Duration::from_millis(if quick { 100 } else { 500 });
    let mut rates = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        let mut bytes = 0usize;
        let mut counter = 0u64;
        while start.elapsed() < budget {
            let header = Header::Endpoint {
                to_client: false,
                receiver: 1,
                uid: 1000,
                sender: 7,
                counter,
            };
            counter += 1;
            seal(&key, &header, &[&body], &mut out);
            let (_, plain) = open(&key, &mut out).expect("opens");
            bytes += plain.len();
        }
        rates.push(bytes as f64 / (1 << 20) as f64 / start.elapsed().as_secs_f64());
    }
    median(&mut rates)
}

/// The datagram AEAD on this CPU, as a node session between two like
/// nodes picks it.
fn session_algorithm() -> Algorithm {
    Algorithm::choose(Algorithm::cpu_has_aes(), true)
}

/// A UDP echo like the raw one (a blocking loop), except that it opens
/// each datagram with the AEAD this CPU's sessions use, and seals its
/// answer: what encryption alone adds to a round trip, with no protocol.
/// `key` is made for the run and protects nothing else.
pub fn serve_sealed_echo(socket: UdpSocket, key: [u8; 32]) {
    let key = Key::new(session_algorithm(), &key);
    let mut buf = vec![0u8; 65536];
    let mut out = Vec::with_capacity(256);
    while let Ok((n, from)) = socket.recv_from(&mut buf) {
        let Ok((Header::Endpoint { counter, .. }, plain)) = open(&key, &mut buf[..n]) else {
            continue;
        };
        let header = Header::Endpoint {
            to_client: true,
            receiver: 1,
            uid: 0,
            sender: 1,
            counter,
        };
        seal(&key, &header, &[plain], &mut out);
        let _ = socket.send_to(&out, from);
    }
}

/// The client of [`serve_sealed_echo`].
pub struct SealedEchoClient {
    socket: UdpSocket,
    key: Key,
    counter: u64,
    out: Vec<u8>,
    buf: Vec<u8>,
}

impl SealedEchoClient {
    pub fn connect(socket: UdpSocket, to: SocketAddr, key: [u8; 32]) -> Result<Self, String> {
        socket.connect(to).map_err(|e| e.to_string())?;
        socket
            .set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        Ok(Self {
            socket,
            key: Key::new(session_algorithm(), &key),
            counter: 0,
            out: Vec::with_capacity(256),
            buf: vec![0u8; 65536],
        })
    }

    /// One empty request sealed, sent, answered and opened.
    pub fn echo(&mut self) -> Result<(), String> {
        self.counter += 1;
        let header = Header::Endpoint {
            to_client: false,
            receiver: 1,
            uid: 0,
            sender: 1,
            counter: self.counter,
        };
        seal(&self.key, &header, &[], &mut self.out);
        self.socket.send(&self.out).map_err(|e| e.to_string())?;
        let n = self
            .socket
            .recv(&mut self.buf)
            .map_err(|e| format!("sealed UDP echo: {e}"))?;
        match open(&self.key, &mut self.buf[..n]) {
            Ok((Header::Endpoint { counter, .. }, _)) if counter == self.counter => Ok(()),
            _ => Err("sealed UDP echo: an answer that does not open".into()),
        }
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
