//! A node's locate responder: which server endpoints on this node serve
//! which put-ports.
//!
//! Servers register through their node (which computes the put-port from
//! the get-port the server presents, Amoeba's F-box, so only a holder of the
//! get-port can be registered for a put-port).  A [`Locate`] for a port with
//! endpoints here is answered with all of them; a port not served here is
//! not answered at all, so a broadcast draws answers only from nodes that
//! can help.
//!
//! The registry also remembers what became of instances that left (a
//! bounded list of tombstones): a client whose request was refused at a
//! departed instance's address asks the instance's node, and may send the
//! request elsewhere only if the instance left by draining ([`Fate`]).
//!
//! An instance id is registered once in a registry's life: never for a
//! second port or endpoint, and never again after it left.  So nobody can
//! pass for an endpoint registered before them (whose instance every
//! locate answer shows), nor bring a departed one back to `Serving`.  A
//! uid registers a bounded number of endpoints.

use std::collections::{HashMap, VecDeque};

use shoal_cap::PutPort;
use shoal_wire::{Endpoint, Fate, Here, Instance, Locate, MAX_HERE_ENDPOINTS, NodeId};

/// Tombstones kept; the oldest is forgotten first.
const MAX_TOMBSTONES: usize = 4096;
/// Endpoints one uid may have registered at once.
pub const MAX_ENDPOINTS_PER_UID: usize = 4096;

/// Registered endpoints of one node.
#[derive(Debug)]
pub struct Registry {
    node: NodeId,
    ports: HashMap<PutPort, Vec<Endpoint>>,
    /// The port each registered instance serves.
    serving: HashMap<Instance, PutPort>,
    /// Endpoints registered, by uid.
    per_uid: HashMap<u32, usize>,
    /// Departed instances: the port each served, and how it left.
    tombstones: VecDeque<(PutPort, Instance, Fate)>,
}

/// Why [`Registry::register`] refused an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the port already has as many endpoints on this node as one answer can carry")]
    PortFull,
    #[error("instance {0} is registered on this node already, or was")]
    Taken(Instance),
    #[error("uid {0} has {MAX_ENDPOINTS_PER_UID} endpoints registered on this node already")]
    Quota(u32),
}

impl Registry {
    /// An empty registry for `node`.
    pub fn new(node: NodeId) -> Self {
        Self {
            node,
            ports: HashMap::new(),
            serving: HashMap::new(),
            per_uid: HashMap::new(),
            tombstones: VecDeque::new(),
        }
    }

    /// Adds an endpoint for `port`, unless its instance was ever
    /// registered here, its uid has its quota, or the port is full.
    pub fn register(&mut self, port: PutPort, endpoint: Endpoint) -> Result<(), Refusal> {
        let instance = endpoint.instance;
        if self.fate(instance) != Fate::Unknown {
            return Err(Refusal::Taken(instance));
        }
        let count = self.per_uid.entry(endpoint.uid).or_default();
        if *count >= MAX_ENDPOINTS_PER_UID {
            return Err(Refusal::Quota(endpoint.uid));
        }
        let eps = self.ports.entry(port).or_default();
        if eps.len() >= MAX_HERE_ENDPOINTS {
            return Err(Refusal::PortFull);
        }
        eps.push(endpoint);
        *count += 1;
        self.serving.insert(instance, port);
        Ok(())
    }

    /// Removes the endpoint `instance` of `port`: it stopped, or started
    /// draining.  Until [`Registry::drained`] says otherwise, it counts as
    /// [`Fate::Vanished`].
    pub fn deregister(&mut self, port: PutPort, instance: Instance) {
        if self.serving.get(&instance) != Some(&port) {
            return;
        }
        self.serving.remove(&instance);
        if let Some(eps) = self.ports.get_mut(&port) {
            if let Some(i) = eps.iter().position(|e| e.instance == instance) {
                let gone = eps.remove(i);
                if let Some(count) = self.per_uid.get_mut(&gone.uid) {
                    *count -= 1;
                    if *count == 0 {
                        self.per_uid.remove(&gone.uid);
                    }
                }
            }
            if eps.is_empty() {
                self.ports.remove(&port);
            }
        }
        if self.fate(instance) == Fate::Unknown {
            if self.tombstones.len() >= MAX_TOMBSTONES {
                self.tombstones.pop_front();
            }
            self.tombstones.push_back((port, instance, Fate::Vanished));
        }
    }

    /// `instance` finished draining and closed.
    pub fn drained(&mut self, instance: Instance) {
        if let Some(t) = self.tombstones.iter_mut().find(|t| t.1 == instance) {
            t.2 = Fate::Drained;
        }
    }

    /// What this node knows of `instance`, under any port.
    pub fn fate(&self, instance: Instance) -> Fate {
        if self.serving.contains_key(&instance) {
            return Fate::Serving;
        }
        self.tombstones
            .iter()
            .rev()
            .find(|t| t.1 == instance)
            .map_or(Fate::Unknown, |t| t.2)
    }

    /// What this node knows of `instance` as a server of `port`: an
    /// instance of another port says nothing of this one's.
    pub fn fate_at(&self, port: PutPort, instance: Instance) -> Fate {
        if self.serving.get(&instance) == Some(&port) {
            return Fate::Serving;
        }
        self.tombstones
            .iter()
            .rev()
            .find(|t| t.1 == instance && t.0 == port)
            .map_or(Fate::Unknown, |t| t.2)
    }

    /// The port `instance` is registered for, while it is.
    pub fn port_of(&self, instance: Instance) -> Option<PutPort> {
        self.serving.get(&instance).copied()
    }

    /// The endpoints registered for `port`.
    pub fn lookup(&self, port: &PutPort) -> &[Endpoint] {
        self.ports.get(port).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Ports with at least one endpoint.
    pub fn len(&self) -> usize {
        self.ports.len()
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty()
    }

    /// The answer to a locate: always when it asks about an instance,
    /// otherwise only if this node serves the port.
    pub fn handle_locate(&self, locate: &Locate) -> Option<Here> {
        let endpoints = self.ports.get(&locate.port);
        let fate = if locate.instance == Instance(0) {
            endpoints?;
            Fate::Unknown
        } else {
            self.fate_at(locate.port, locate.instance)
        };
        Some(Here {
            nonce: locate.nonce,
            port: locate.port,
            node: self.node,
            fate,
            endpoints: endpoints.cloned().unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_cap::GetPort;
    use shoal_wire::Nonce;

    fn setup() -> (Registry, PutPort, Endpoint, ()) {
        let reg = Registry::new(NodeId(7));
        let port = GetPort::from_bytes([2; 16]).put_port();
        let ep = Endpoint {
            addr: "10.0.0.1:4000".parse().unwrap(),
            instance: Instance(9),
            uid: 1000,
            system: false,
        };
        (reg, port, ep, ())
    }

    fn ask(reg: &Registry, _: &(), port: PutPort, instance: Instance) -> Option<Here> {
        reg.handle_locate(&Locate {
            nonce: Nonce(3),
            port,
            instance,
            node: NodeId(0),
        })
    }

    #[test]
    fn broadcast_locates_are_answered_only_where_the_port_is_served() {
        let (mut reg, port, ep, key) = setup();
        assert!(ask(&reg, &key, port, Instance(0)).is_none());
        reg.register(port, ep).unwrap();
        let here = ask(&reg, &key, port, Instance(0)).unwrap();
        assert_eq!(here.endpoints, vec![ep]);
        assert_eq!(here.node, NodeId(7));
        assert_eq!(here.fate, Fate::Unknown);
    }

    #[test]
    fn an_instance_is_serving_then_vanished_then_drained() {
        let (mut reg, port, ep, key) = setup();
        assert_eq!(
            ask(&reg, &key, port, ep.instance).unwrap().fate,
            Fate::Unknown
        );
        reg.register(port, ep).unwrap();
        assert_eq!(reg.fate(ep.instance), Fate::Serving);
        reg.deregister(port, ep.instance);
        assert_eq!(reg.fate(ep.instance), Fate::Vanished);
        assert!(reg.lookup(&port).is_empty());
        // A question about a departed instance is answered even though the
        // port has no endpoint here any more.
        assert_eq!(
            ask(&reg, &key, port, ep.instance).unwrap().fate,
            Fate::Vanished
        );
        reg.drained(ep.instance);
        assert_eq!(reg.fate(ep.instance), Fate::Drained);
        // Nobody brings it back, under its port or another.
        assert_eq!(reg.register(port, ep), Err(Refusal::Taken(ep.instance)));
        let other = GetPort::from_bytes([3; 16]).put_port();
        assert_eq!(reg.register(other, ep), Err(Refusal::Taken(ep.instance)));
        assert_eq!(reg.fate(ep.instance), Fate::Drained);
    }

    /// An instance serving one port cannot be registered again, for that
    /// port or another, by anyone: whoever did would pass for it.
    #[test]
    fn an_instance_is_registered_once() {
        let (mut reg, port, ep, _) = setup();
        reg.register(port, ep).unwrap();
        let other = GetPort::from_bytes([3; 16]).put_port();
        let theirs = Endpoint {
            addr: "10.0.0.2:9".parse().unwrap(),
            uid: 1001,
            ..ep
        };
        for p in [port, other] {
            assert_eq!(reg.register(p, theirs), Err(Refusal::Taken(ep.instance)));
            assert_eq!(reg.register(p, ep), Err(Refusal::Taken(ep.instance)));
        }
        assert_eq!(reg.lookup(&port), &[ep]);
        assert!(reg.lookup(&other).is_empty());
        assert_eq!(reg.port_of(ep.instance), Some(port));
        // Deregistering it under the wrong port changes nothing.
        reg.deregister(other, ep.instance);
        assert_eq!(reg.fate(ep.instance), Fate::Serving);
    }

    #[test]
    fn a_uid_registers_a_bounded_number_of_endpoints() {
        let (mut reg, _, ep, _) = setup();
        let ports: Vec<PutPort> = (0..MAX_ENDPOINTS_PER_UID as u64 + 1)
            .map(|i| {
                let mut b = [0u8; 16];
                b[..8].copy_from_slice(&i.to_le_bytes());
                GetPort::from_bytes(b).put_port()
            })
            .collect();
        for (i, p) in ports.iter().enumerate().take(MAX_ENDPOINTS_PER_UID) {
            let e = Endpoint {
                instance: Instance(1000 + i as u64),
                ..ep
            };
            reg.register(*p, e).unwrap();
        }
        let last = Endpoint {
            instance: Instance(1),
            ..ep
        };
        let full = ports[MAX_ENDPOINTS_PER_UID];
        assert_eq!(reg.register(full, last), Err(Refusal::Quota(ep.uid)));
        // Another uid is not held back, and one leaving makes room.
        let other = Endpoint { uid: 1001, ..last };
        reg.register(full, other).unwrap();
        reg.deregister(ports[0], Instance(1000));
        let again = Endpoint {
            instance: Instance(2),
            ..ep
        };
        reg.register(full, again).unwrap();
    }

    #[test]
    fn registration_is_bounded_per_port_and_tombstones_are_bounded() {
        let (mut reg, port, ep, _) = setup();
        for i in 0..MAX_HERE_ENDPOINTS as u64 {
            reg.register(
                port,
                Endpoint {
                    instance: Instance(100 + i),
                    ..ep
                },
            )
            .unwrap();
        }
        assert_eq!(reg.register(port, ep), Err(Refusal::PortFull));
        let other = GetPort::from_bytes([3; 16]).put_port();
        for i in 0..(MAX_TOMBSTONES as u64 + 10) {
            let e = Endpoint {
                instance: Instance(10_000 + i),
                ..ep
            };
            reg.register(other, e).unwrap();
            reg.deregister(other, e.instance);
        }
        assert!(reg.tombstones.len() <= MAX_TOMBSTONES);
    }
}
