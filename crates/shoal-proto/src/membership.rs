//! Node liveness: every node sends a [`Heartbeat`] to every member it knows
//! (and to its seeds) each interval; a member not heard from for
//! `dead_after` is reported unreachable.  Heartbeats carry the sender's
//! member list, so a node that joined through one seed soon knows all.
//!
//! This is a failure *detector* for operators and placement, not a
//! consensus: two nodes may briefly disagree about a third.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use shoal_wire::{Heartbeat, Load, MAX_MEMBERS, Member, NodeId, Packet, encode_plain};

use crate::transmit::{Dest, Transmit, Via};
use shoal_time::Time;

/// A member silent for this many `dead_after` periods is forgotten.
const FORGET_FACTOR: u32 = 40;

/// Heartbeat timing.
#[derive(Debug, Clone)]
pub struct MembershipConfig {
    pub interval: Duration,
    pub dead_after: Duration,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(250),
            dead_after: Duration::from_millis(1500),
        }
    }
}

#[derive(Debug, Clone)]
struct Peer {
    /// When this node first learned of the peer.
    added: Time,
    addr: SocketAddr,
    name: String,
    incarnation: u64,
    last_heard: Option<Time>,
    /// The peer's last load report, and when it arrived.
    load: Option<(Load, Time)>,
}

/// One member as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub node: NodeId,
    pub name: String,
    pub addr: SocketAddr,
    pub incarnation: u64,
    /// Heard from within `dead_after` (always true for this node itself).
    pub alive: bool,
    /// Time since last heard, if ever.
    pub silent_for: Option<Duration>,
    /// The member's last load report (this node's own, for itself), and
    /// when it arrived.
    pub load: Option<(Load, Time)>,
}

/// Membership state of one node.
#[derive(Debug)]
pub struct Membership {
    me: NodeId,
    name: String,
    addr: SocketAddr,
    incarnation: u64,
    seeds: Vec<SocketAddr>,
    peers: BTreeMap<NodeId, Peer>,
    config: MembershipConfig,
    next_beat: Time,
    transmits: Vec<Transmit>,
    /// This node's load, sent in its heartbeats, and when it was measured.
    load: Option<(Load, Time)>,
}

impl Membership {
    /// Membership for node `me`, reachable at `addr`, joining through `seeds`.
    pub fn new(
        me: NodeId,
        name: String,
        addr: SocketAddr,
        incarnation: u64,
        seeds: Vec<SocketAddr>,
        config: MembershipConfig,
    ) -> Self {
        Self {
            me,
            name,
            addr,
            incarnation,
            seeds,
            peers: BTreeMap::new(),
            config,
            next_beat: Time(0),
            transmits: Vec::new(),
            load: None,
        }
    }

    /// This node's load, measured at `now`: its next heartbeats carry it.
    pub fn set_load(&mut self, now: Time, load: Load) {
        self.load = Some((load, now));
    }

    /// A heartbeat arrived.
    pub fn handle_heartbeat(&mut self, now: Time, hb: &Heartbeat) {
        if hb.node == self.me {
            return;
        }
        if !self.peers.contains_key(&hb.node) && self.peers.len() >= MAX_MEMBERS - 1 {
            return;
        }
        let peer = self.peers.entry(hb.node).or_insert_with(|| Peer {
            added: now,
            addr: hb.addr,
            name: hb.name.clone(),
            incarnation: hb.incarnation,
            last_heard: None,
            load: None,
        });
        if let Some(load) = hb.load {
            peer.load = Some((load, now));
        }
        peer.addr = hb.addr;
        peer.name.clone_from(&hb.name);
        peer.incarnation = hb.incarnation;
        peer.last_heard = Some(now);
        for m in &hb.members {
            if m.node != self.me
                && !self.peers.contains_key(&m.node)
                && self.peers.len() < MAX_MEMBERS - 1
            {
                self.peers.insert(
                    m.node,
                    Peer {
                        added: now,
                        addr: m.addr,
                        name: String::new(),
                        incarnation: 0,
                        last_heard: None,
                        load: None,
                    },
                );
            }
        }
    }

    /// Sends heartbeats when due.
    pub fn handle_timeout(&mut self, now: Time) {
        if now < self.next_beat {
            return;
        }
        self.next_beat = now + self.config.interval;
        // Forget members silent for long (a node that left, or an identity
        // that never existed): they would cost a datagram every interval.
        let forget_after = self.config.dead_after * FORGET_FACTOR;
        self.peers
            .retain(|_, p| now.saturating_since(p.last_heard.unwrap_or(p.added)) < forget_after);
        let mut members = vec![Member {
            node: self.me,
            addr: self.addr,
        }];
        members.extend(
            self.peers
                .iter()
                .take(MAX_MEMBERS - 1)
                .map(|(node, p)| Member {
                    node: *node,
                    addr: p.addr,
                }),
        );
        let mut bytes = Vec::new();
        encode_plain(
            &Packet::Heartbeat(Heartbeat {
                node: self.me,
                incarnation: self.incarnation,
                name: self.name.clone(),
                addr: self.addr,
                members,
                load: self.load.map(|(l, _)| l),
            }),
            &mut bytes,
        );
        let mut dests: Vec<SocketAddr> = self.peers.values().map(|p| p.addr).collect();
        for s in &self.seeds {
            if !dests.contains(s) && *s != self.addr {
                dests.push(*s);
            }
        }
        for addr in dests {
            self.transmits
                .push(Transmit::whole(Dest::Addr(addr), Via::Node, bytes.clone()));
        }
    }

    /// The next heartbeat to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop()
    }

    /// When heartbeats are next due.
    pub fn poll_timeout(&self) -> Time {
        self.next_beat
    }

    /// Every member known, this node first.
    pub fn view(&self, now: Time) -> Vec<MemberView> {
        let mut out = vec![MemberView {
            node: self.me,
            name: self.name.clone(),
            addr: self.addr,
            incarnation: self.incarnation,
            alive: true,
            silent_for: Some(Duration::ZERO),
            load: self.load,
        }];
        out.extend(self.peers.iter().map(|(node, p)| {
            let silent_for = p.last_heard.map(|t| now.saturating_since(t));
            MemberView {
                node: *node,
                name: p.name.clone(),
                addr: p.addr,
                incarnation: p.incarnation,
                alive: silent_for.is_some_and(|d| d < self.config.dead_after),
                silent_for,
                load: p.load,
            }
        }));
        out
    }

    /// Addresses of members currently alive, this node excluded.
    pub fn alive_addrs(&self, now: Time) -> Vec<SocketAddr> {
        self.view(now)
            .into_iter()
            .skip(1)
            .filter(|m| m.alive)
            .map(|m| m.addr)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_wire::decode_plain;

    fn node(i: u8, seeds: Vec<SocketAddr>) -> Membership {
        Membership::new(
            NodeId(i as u64),
            format!("n{i}"),
            SocketAddr::from(([10, 0, 0, i], 7700)),
            1,
            seeds,
            MembershipConfig::default(),
        )
    }

    /// Delivers every pending heartbeat between the nodes.
    fn exchange(nodes: &mut [Membership], now: Time) {
        let mut mail = Vec::new();
        for n in nodes.iter_mut() {
            n.handle_timeout(now);
            while let Some(t) = n.poll_transmit() {
                mail.push(t);
            }
        }
        for t in mail {
            let Dest::Addr(to) = t.dest else { continue };
            let Ok(Packet::Heartbeat(hb)) = decode_plain(&t.bytes) else {
                panic!("not a heartbeat")
            };
            if let Some(n) = nodes.iter_mut().find(|n| n.addr == to) {
                n.handle_heartbeat(now, &hb);
            }
        }
    }

    #[test]
    fn nodes_joining_through_one_seed_learn_of_each_other() {
        let seed = SocketAddr::from(([10, 0, 0, 1], 7700));
        let mut nodes = vec![node(1, vec![]), node(2, vec![seed]), node(3, vec![seed])];
        let mut now = Time(0);
        for _ in 0..4 {
            exchange(&mut nodes, now);
            now += Duration::from_millis(250);
        }
        for n in &nodes {
            let view = n.view(now);
            assert_eq!(view.len(), 3, "{view:?}");
            assert!(view.iter().all(|m| m.alive), "{view:?}");
        }
        // Node 3 goes silent: the others notice after dead_after.
        let mut two = nodes.drain(..2).collect::<Vec<_>>();
        for _ in 0..8 {
            exchange(&mut two, now);
            now += Duration::from_millis(250);
        }
        let view = two[0].view(now);
        let n3 = view.iter().find(|m| m.node == NodeId(3)).unwrap();
        assert!(!n3.alive);
        assert_eq!(
            two[0].alive_addrs(now),
            vec![SocketAddr::from(([10, 0, 0, 2], 7700))]
        );
    }
}
