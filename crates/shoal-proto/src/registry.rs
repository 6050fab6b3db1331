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

use std::collections::{HashMap, VecDeque};

use shoal_cap::PutPort;
use shoal_wire::{Endpoint, Fate, Here, Instance, Locate, MAX_HERE_ENDPOINTS, NodeId};

/// Tombstones kept; the oldest is forgotten first.
const MAX_TOMBSTONES: usize = 4096;

/// Registered endpoints of one node.
#[derive(Debug)]
pub struct Registry {
    node: NodeId,
    ports: HashMap<PutPort, Vec<Endpoint>>,
    tombstones: VecDeque<(Instance, Fate)>,
}

impl Registry {
    /// An empty registry for `node`.
    pub fn new(node: NodeId) -> Self {
        Self {
            node,
            ports: HashMap::new(),
            tombstones: VecDeque::new(),
        }
    }

    /// Adds an endpoint for `port`.  Returns `false` if the port already has
    /// as many endpoints here as one answer can carry.
    pub fn register(&mut self, port: PutPort, endpoint: Endpoint) -> bool {
        let eps = self.ports.entry(port).or_default();
        if eps.contains(&endpoint) {
            return true;
        }
        if eps.len() >= MAX_HERE_ENDPOINTS {
            return false;
        }
        eps.push(endpoint);
        true
    }

    /// Removes the endpoint `instance` of `port`: it stopped, or started
    /// draining.  Until [`Registry::drained`] says otherwise, it counts as
    /// [`Fate::Vanished`].
    pub fn deregister(&mut self, port: PutPort, instance: Instance) {
        if let Some(eps) = self.ports.get_mut(&port) {
            eps.retain(|e| e.instance != instance);
            if eps.is_empty() {
                self.ports.remove(&port);
            }
        }
        if self.fate(instance) == Fate::Unknown {
            if self.tombstones.len() >= MAX_TOMBSTONES {
                self.tombstones.pop_front();
            }
            self.tombstones.push_back((instance, Fate::Vanished));
        }
    }

    /// `instance` finished draining and closed.
    pub fn drained(&mut self, instance: Instance) {
        if let Some(t) = self.tombstones.iter_mut().find(|t| t.0 == instance) {
            t.1 = Fate::Drained;
        }
    }

    /// What this node knows of `instance`.
    pub fn fate(&self, instance: Instance) -> Fate {
        if self
            .ports
            .values()
            .flatten()
            .any(|e| e.instance == instance)
        {
            return Fate::Serving;
        }
        self.tombstones
            .iter()
            .rev()
            .find(|t| t.0 == instance)
            .map_or(Fate::Unknown, |t| t.1)
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
            self.fate(locate.instance)
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
        assert!(reg.register(port, ep));
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
        reg.register(port, ep);
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
    }

    #[test]
    fn registration_is_bounded_per_port_and_tombstones_are_bounded() {
        let (mut reg, port, ep, _) = setup();
        for i in 0..MAX_HERE_ENDPOINTS as u64 {
            assert!(reg.register(
                port,
                Endpoint {
                    instance: Instance(100 + i),
                    ..ep
                }
            ));
        }
        assert!(!reg.register(port, ep));
        for i in 0..(MAX_TOMBSTONES as u64 + 10) {
            reg.deregister(port, Instance(10_000 + i));
        }
        assert!(reg.tombstones.len() <= MAX_TOMBSTONES);
    }
}
