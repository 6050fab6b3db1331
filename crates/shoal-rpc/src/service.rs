//! What a server endpoint serves: an ordinary port, or a system service.
//!
//! An ordinary port is served by whoever holds its get-port: the node
//! computes the put-port from it (Amoeba's F-box), so nobody else can
//! serve it.  A **system service** (a node's own services, a directory
//! service) has a public put-port, derived from the cluster's id and the
//! service's name, that anyone can compute to call it; no get-port maps to
//! it, and a node registers it only for its own daemon and for root
//! (`docs/security.md`, "System ports").  So no user program can serve a
//! system port, however much it knows.

use shoal_cap::{GetPort, PutPort};

/// A port to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// An ordinary port: its get-port.
    Port(GetPort),
    /// A system service: its public put-port.
    System(PutPort),
}

impl Service {
    /// The put-port clients call.
    pub fn put_port(&self) -> PutPort {
        match self {
            Service::Port(get) => get.put_port(),
            Service::System(put) => *put,
        }
    }
}

impl From<GetPort> for Service {
    fn from(get: GetPort) -> Self {
        Service::Port(get)
    }
}

/// The put-port of system service `name` in cluster `cluster` (its id).
pub fn system_port(cluster: &[u8; 16], name: &str) -> Service {
    let mut h = blake3::Hasher::new_derive_key("shoal 2026 system port v1");
    h.update(cluster);
    h.update(name.as_bytes());
    let mut port = [0u8; 16];
    port.copy_from_slice(&h.finalize().as_bytes()[..16]);
    Service::System(PutPort::from_bytes(port))
}
