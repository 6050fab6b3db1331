//! The node handshake (`docs/security.md`, "Node sessions: the
//! handshake"): Noise XX through `snow`, with each side's certificate in
//! its encrypted payload, as a state machine without I/O.
//!
//! ```text
//!   initiator                               responder
//!   Initiator::start ── class 1: -> e ────▶ Responder::answer
//!                    ◀─ class 2: <- e, ee, s, es, hello ──
//!   Initiator::finish ─ class 3: -> s, se, hello ───────▶ Responder::finish
//!   = Established                                      = Established
//! ```
//!
//! Randomness (the ephemeral keys) comes from a seed the caller passes,
//! and time from an argument, so the simulator runs this same code
//! deterministically.  Each side checks the other's certificate
//! ([`Trust::admit`]) and that its key is the static key Noise
//! authenticated.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use snow::params::{CipherChoice, DHChoice, HashChoice, NoiseParams};
use snow::resolvers::{BoxedCryptoResolver, CryptoResolver, DefaultResolver, FallbackResolver};
use snow::types::{Cipher, Dh, Hash, Random};

use crate::SessionError;
use crate::aead::{Algorithm, Key};
use crate::cert::{NodeCert, Trust, reader};
use crate::datagram::{Class, MAGIC, VERSION, class};
use crate::kdf::SessionSecrets;
use crate::x25519::Dh25519;

const PATTERN: &str = "Noise_XX_25519_ChaChaPoly_BLAKE2s";
const PROLOGUE: &[u8] = b"shoal 2026 node session v1";
/// Longest handshake datagram this side accepts.
pub const MAX_HANDSHAKE: usize = 1024;
const MAX_CERT: usize = 256;

/// A node's long-term identity: its static key and its certificate.
#[derive(Clone)]
pub struct NodeIdentity {
    private: [u8; 32],
    public: [u8; 32],
    cert_bytes: Vec<u8>,
    cert: NodeCert,
}

impl std::fmt::Debug for NodeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NodeIdentity({}, serial {})",
            self.cert.name, self.cert.serial
        )
    }
}

/// The public key of the static private key `private`.
pub fn static_public(private: &[u8; 32]) -> [u8; 32] {
    let mut dh = Dh25519::default();
    dh.set(private);
    dh.pubkey().try_into().expect("32-byte public key")
}

impl NodeIdentity {
    /// The identity of static key `private` with certificate `cert_bytes`,
    /// checked against `trust` at `now`: the certificate must be admitted
    /// and name this key.
    pub fn new(
        private: [u8; 32],
        cert_bytes: Vec<u8>,
        trust: &Trust,
        now: u64,
    ) -> Result<Self, SessionError> {
        let cert = trust.admit(&cert_bytes, now)?;
        let public = static_public(&private);
        if cert.static_key != public {
            return Err(SessionError::KeyMismatch);
        }
        Ok(Self {
            private,
            public,
            cert_bytes,
            cert,
        })
    }

    pub fn cert(&self) -> &NodeCert {
        &self.cert
    }

    pub fn public(&self) -> &[u8; 32] {
        &self.public
    }
}

/// A session both sides agreed on.
#[derive(Debug)]
pub struct Established {
    /// This side's index: the one the peer names in what it sends.
    pub local_index: u32,
    /// The peer's index: the one this side names in what it sends.
    pub remote_index: u32,
    /// The peer's certificate, admitted.
    pub peer: NodeCert,
    /// Whether this side started the handshake.
    pub initiator: bool,
    /// Seals what this side sends.
    pub send: Key,
    /// Opens what the peer sends.
    pub recv: Key,
    /// What endpoint channel keys derive from.
    pub endpoint_root: [u8; 32],
}

/// The first half of a handshake this side started.
pub struct Initiator {
    hs: snow::HandshakeState,
    index: u32,
}

/// A handshake another node started, waiting for its third message.
pub struct Responder {
    hs: snow::HandshakeState,
    index: u32,
    remote_index: u32,
    aes: bool,
}

impl Initiator {
    /// Starts a handshake under local `index` (nonzero), with ephemeral
    /// randomness from `seed`; writes the initiation datagram to `out`.
    pub fn start(
        me: &NodeIdentity,
        trust: &Trust,
        index: u32,
        seed: [u8; 32],
        out: &mut Vec<u8>,
    ) -> Result<Self, SessionError> {
        if index == 0 {
            return Err(SessionError::Malformed("index zero"));
        }
        let mut hs = build(me, trust, seed, true)?;
        out.clear();
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(Class::Initiation as u8);
        out.extend_from_slice(&index.to_le_bytes());
        write_noise(&mut hs, &[], out)?;
        Ok(Self { hs, index })
    }

    /// The local index this handshake was started under.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Handles the response: checks the responder's certificate at `now`,
    /// writes the finishing datagram to `out`, and returns the session.
    /// `aes` says whether this node has AES instructions.
    pub fn finish(
        mut self,
        response: &[u8],
        me: &NodeIdentity,
        trust: &Trust,
        now: u64,
        aes: bool,
        out: &mut Vec<u8>,
    ) -> Result<Established, SessionError> {
        expect_class(response, Class::Response)?;
        let mut r = reader(&response[4..]);
        let remote_index = r.u32()?;
        let receiver = r.u32()?;
        if receiver != self.index || remote_index == 0 {
            return Err(SessionError::UnknownIndex);
        }
        let hello = read_noise(&mut self.hs, r.rest())?;
        let (remote_aes, peer) = check_hello(&self.hs, &hello, trust, now)?;
        out.clear();
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(Class::Finish as u8);
        out.extend_from_slice(&self.index.to_le_bytes());
        out.extend_from_slice(&remote_index.to_le_bytes());
        write_noise(&mut self.hs, &hello_bytes(me, aes), out)?;
        let algorithm = Algorithm::choose(aes, remote_aes);
        Ok(establish(
            self.hs,
            self.index,
            remote_index,
            peer,
            true,
            algorithm,
        ))
    }
}

impl Responder {
    /// Answers an initiation under local `index` (nonzero), with ephemeral
    /// randomness from `seed`; writes the response datagram to `out`.
    /// `aes` says whether this node has AES instructions.
    pub fn answer(
        initiation: &[u8],
        me: &NodeIdentity,
        trust: &Trust,
        index: u32,
        seed: [u8; 32],
        aes: bool,
        out: &mut Vec<u8>,
    ) -> Result<Self, SessionError> {
        if index == 0 {
            return Err(SessionError::Malformed("index zero"));
        }
        expect_class(initiation, Class::Initiation)?;
        let mut r = reader(&initiation[4..]);
        let remote_index = r.u32()?;
        if remote_index == 0 {
            return Err(SessionError::Malformed("index zero"));
        }
        let mut hs = build(me, trust, seed, false)?;
        let payload = read_noise(&mut hs, r.rest())?;
        if !payload.is_empty() {
            return Err(SessionError::Malformed("initiation payload"));
        }
        out.clear();
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(Class::Response as u8);
        out.extend_from_slice(&index.to_le_bytes());
        out.extend_from_slice(&remote_index.to_le_bytes());
        write_noise(&mut hs, &hello_bytes(me, aes), out)?;
        Ok(Self {
            hs,
            index,
            remote_index,
            aes,
        })
    }

    /// This side's index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Handles the finishing datagram: checks the initiator's certificate
    /// at `now` and returns the session.
    pub fn finish(
        mut self,
        finish: &[u8],
        trust: &Trust,
        now: u64,
    ) -> Result<Established, SessionError> {
        expect_class(finish, Class::Finish)?;
        let mut r = reader(&finish[4..]);
        let sender = r.u32()?;
        let receiver = r.u32()?;
        if sender != self.remote_index || receiver != self.index {
            return Err(SessionError::UnknownIndex);
        }
        let hello = read_noise(&mut self.hs, r.rest())?;
        let (remote_aes, peer) = check_hello(&self.hs, &hello, trust, now)?;
        let algorithm = Algorithm::choose(self.aes, remote_aes);
        Ok(establish(
            self.hs,
            self.index,
            self.remote_index,
            peer,
            false,
            algorithm,
        ))
    }
}

/// The index named by a response or finish datagram as its receiver: which
/// pending handshake it belongs to.
pub fn handshake_receiver(datagram: &[u8]) -> Result<u32, SessionError> {
    match class(datagram)? {
        Class::Response | Class::Finish => {
            let mut r = reader(&datagram[4..]);
            r.u32()?;
            Ok(r.u32()?)
        }
        _ => Err(SessionError::Malformed("not a response or finish")),
    }
}

fn expect_class(datagram: &[u8], want: Class) -> Result<(), SessionError> {
    if datagram.len() > MAX_HANDSHAKE {
        return Err(SessionError::Malformed("handshake too long"));
    }
    if class(datagram)? != want {
        return Err(SessionError::Malformed("handshake message out of order"));
    }
    Ok(())
}

/// A snow handshake for `me` in `trust`'s cluster, with ephemeral
/// randomness from `seed`.
fn build(
    me: &NodeIdentity,
    trust: &Trust,
    seed: [u8; 32],
    initiator: bool,
) -> Result<snow::HandshakeState, SessionError> {
    let params: NoiseParams = PATTERN.parse().expect("a valid pattern");
    let resolver: BoxedCryptoResolver = Box::new(FallbackResolver::new(
        Box::new(Resolver {
            seed,
            static_pair: (me.private, me.public),
        }),
        Box::new(DefaultResolver),
    ));
    let mut prologue = PROLOGUE.to_vec();
    prologue.extend_from_slice(&trust.cluster.0);
    let builder = snow::Builder::with_resolver(params, resolver)
        .local_private_key(&me.private)
        .map_err(noise)?
        .prologue(&prologue)
        .map_err(noise)?;
    if initiator {
        builder.build_initiator()
    } else {
        builder.build_responder()
    }
    .map_err(noise)
}

fn write_noise(
    hs: &mut snow::HandshakeState,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), SessionError> {
    let start = out.len();
    out.resize(start + MAX_HANDSHAKE, 0);
    let n = hs
        .write_message(payload, &mut out[start..])
        .map_err(noise)?;
    out.truncate(start + n);
    Ok(())
}

fn read_noise(hs: &mut snow::HandshakeState, message: &[u8]) -> Result<Vec<u8>, SessionError> {
    let mut payload = vec![0u8; MAX_HANDSHAKE];
    let n = hs
        .read_message(message, &mut payload)
        .map_err(|_| SessionError::HandshakeFailed)?;
    payload.truncate(n);
    Ok(payload)
}

/// A hello: flags, then the certificate.
fn hello_bytes(me: &NodeIdentity, aes: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(3 + me.cert_bytes.len());
    out.push(aes as u8);
    out.extend_from_slice(&(me.cert_bytes.len() as u16).to_le_bytes());
    out.extend_from_slice(&me.cert_bytes);
    out
}

/// Decodes a hello: (peer has AES, certificate bytes).
pub fn decode_hello(hello: &[u8]) -> Result<(bool, &[u8]), SessionError> {
    let mut r = reader(hello);
    let flags = r.u8()?;
    if flags > 1 {
        return Err(SessionError::Malformed("hello flags"));
    }
    let n = r.u16()? as usize;
    if n > MAX_CERT {
        return Err(SessionError::Malformed("certificate too long"));
    }
    let cert = r.take(n)?;
    if r.remaining() != 0 {
        return Err(SessionError::Malformed("hello length"));
    }
    Ok((flags == 1, cert))
}

fn check_hello(
    hs: &snow::HandshakeState,
    hello: &[u8],
    trust: &Trust,
    now: u64,
) -> Result<(bool, NodeCert), SessionError> {
    let (aes, cert) = decode_hello(hello)?;
    let cert = trust.admit(cert, now)?;
    let remote = hs
        .get_remote_static()
        .ok_or(SessionError::HandshakeFailed)?;
    if remote != cert.static_key {
        return Err(SessionError::KeyMismatch);
    }
    Ok((aes, cert))
}

fn establish(
    mut hs: snow::HandshakeState,
    local_index: u32,
    remote_index: u32,
    peer: NodeCert,
    initiator: bool,
    algorithm: Algorithm,
) -> Established {
    let (k1, k2) = hs.dangerously_get_raw_split();
    let secrets = SessionSecrets::from_split(&k1, &k2);
    let (send, recv) = if initiator {
        (secrets.i2r, secrets.r2i)
    } else {
        (secrets.r2i, secrets.i2r)
    };
    Established {
        local_index,
        remote_index,
        peer,
        initiator,
        send: Key::new(algorithm, &send),
        recv: Key::new(algorithm, &recv),
        endpoint_root: secrets.endpoint_root,
    }
}

fn noise(e: snow::Error) -> SessionError {
    SessionError::Noise(e.to_string())
}

/// What shoal gives snow itself: randomness from the caller's seed, and
/// Curve25519 (`x25519.rs`) knowing the node's static key pair.
struct Resolver {
    seed: [u8; 32],
    static_pair: ([u8; 32], [u8; 32]),
}

impl Drop for Resolver {
    fn drop(&mut self) {
        // The seed makes the ephemeral key (best effort, as in `Dh25519`).
        self.seed = [0; 32];
        self.static_pair.0 = [0; 32];
    }
}

struct SeededRandom(ChaCha20Rng);

impl Random for SeededRandom {
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), snow::Error> {
        self.0.fill_bytes(dest);
        Ok(())
    }
}

impl CryptoResolver for Resolver {
    fn resolve_rng(&self) -> Option<Box<dyn Random>> {
        Some(Box::new(SeededRandom(ChaCha20Rng::from_seed(self.seed))))
    }

    fn resolve_dh(&self, choice: &DHChoice) -> Option<Box<dyn Dh>> {
        match choice {
            DHChoice::Curve25519 => {
                let (private, public) = self.static_pair;
                Some(Box::new(Dh25519::knowing(private, public)))
            }
            _ => None,
        }
    }

    fn resolve_hash(&self, _: &HashChoice) -> Option<Box<dyn Hash>> {
        None
    }

    fn resolve_cipher(&self, _: &CipherChoice) -> Option<Box<dyn Cipher>> {
        None
    }
}
