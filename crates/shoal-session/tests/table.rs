//! Node session tables over a simulated network that loses, duplicates and
//! reorders datagrams, with an attacker who records everything and replays
//! it later: every plaintext delivered was sent, none twice, sessions come
//! up and rekey, erased keys open nothing, and a revoked node is cut off.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_session::handshake::static_public;
use shoal_session::table::{Config, Output};
use shoal_session::{
    AdminKey, ClusterId, NodeCert, NodeIdentity, RevocationList, SessionError, Sessions, Trust,
};
use shoal_time::Time;

const WALL: u64 = 1_800_000_000;
const CLUSTER: ClusterId = ClusterId([3; 16]);
const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

/// `d` after the start.
fn at(d: Duration) -> Time {
    Time::ZERO + d
}

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i as u8 + 1], 7700))
}

struct Net {
    admin: AdminKey,
    nodes: Vec<Sessions>,
    rng: ChaCha8Rng,
    /// (arrival time, sequence, from, to, bytes)
    flight: BTreeMap<(Time, u64), (usize, usize, Vec<u8>)>,
    seq: u64,
    now: Time,
    loss: f64,
    /// Everything ever sent, for the attacker.
    captured: Vec<(usize, usize, Vec<u8>)>,
    /// Plaintexts sent, per (from, to).
    sent: BTreeSet<(usize, usize, Vec<u8>)>,
    /// Plaintexts delivered, per (from, to).
    delivered: Vec<(usize, usize, Vec<u8>)>,
    ups: usize,
}

impl Net {
    fn new(n: usize, seed: u64, loss: f64) -> Net {
        let admin = AdminKey::from_seed([9; 32]);
        let trust = Trust {
            cluster: CLUSTER,
            admin: admin.public(),
            revoked: RevocationList::default(),
        };
        let nodes = (0..n)
            .map(|i| {
                let private = [i as u8 + 1; 32];
                let cert = NodeCert {
                    cluster: CLUSTER,
                    serial: i as u64 + 1,
                    not_before: 0,
                    not_after: u64::MAX,
                    static_key: static_public(&private),
                    name: format!("n{}", i + 1),
                }
                .sign(&admin)
                .unwrap();
                let me = NodeIdentity::new(private, cert, &trust, WALL).unwrap();
                let mut node_seed = [0u8; 32];
                node_seed[0] = i as u8;
                node_seed[1..9].copy_from_slice(&seed.to_le_bytes());
                Sessions::new(Config::default(), me, trust.clone(), i % 2 == 0, node_seed)
            })
            .collect();
        Net {
            admin,
            nodes,
            rng: ChaCha8Rng::seed_from_u64(seed),
            flight: BTreeMap::new(),
            seq: 0,
            now: Time::ZERO,
            loss,
            captured: Vec::new(),
            sent: BTreeSet::new(),
            delivered: Vec::new(),
            ups: 0,
        }
    }

    fn route(&mut self, from: usize, out: Vec<Output>) {
        for o in out {
            match o {
                Output::Send { to, datagram } => {
                    let to = (0..self.nodes.len()).find(|&i| addr(i) == to).unwrap();
                    self.captured.push((from, to, datagram.clone()));
                    self.transmit(from, to, datagram);
                }
                Output::Up { .. } => self.ups += 1,
                Output::Refused { .. } => {}
                // The peer whose serial is i + 1 is node i.
                Output::Deliver {
                    serial, plaintext, ..
                } => self.delivered.push((serial as usize - 1, from, plaintext)),
            }
        }
    }

    fn transmit(&mut self, from: usize, to: usize, datagram: Vec<u8>) {
        let copies = if self.rng.random_bool(self.loss) {
            0
        } else if self.rng.random_bool(0.05) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = Duration::from_micros(self.rng.random_range(100..5_000u64));
            self.seq += 1;
            self.flight
                .insert((self.now + delay, self.seq), (from, to, datagram.clone()));
        }
    }

    fn send(&mut self, from: usize, to: usize, text: &[u8]) {
        self.sent.insert((from, to, text.to_vec()));
        let mut out = Vec::new();
        self.nodes[from].send(self.now, addr(to), text, &mut out);
        self.route(from, out);
    }

    /// Delivers what arrives until `until`, polling each node every 100 ms.
    fn run(&mut self, until: Time) {
        let mut next_poll = self.now;
        while self.now < until {
            let next_arrival = self
                .flight
                .keys()
                .next()
                .map(|k| k.0)
                .unwrap_or(Time(u64::MAX));
            if next_poll <= next_arrival {
                self.now = next_poll.min(until);
                for i in 0..self.nodes.len() {
                    let mut out = Vec::new();
                    self.nodes[i].poll(self.now, &mut out);
                    self.route(i, out);
                }
                next_poll += 100 * MS;
                continue;
            }
            let ((at, _), (from, to, mut bytes)) = self.flight.pop_first().unwrap();
            self.now = at;
            let _ = self.arrive(from, to, &mut bytes);
        }
    }

    fn arrive(&mut self, from: usize, to: usize, bytes: &mut [u8]) -> Result<(), SessionError> {
        let mut out = Vec::new();
        let got = self.nodes[to].handle(self.now, WALL, addr(from), bytes, &mut out);
        let result = match got {
            Ok(Some(o)) => {
                self.delivered.push((from, to, o.plaintext.to_vec()));
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        self.route(to, out);
        result
    }

    fn check_delivered_once(&self) {
        let mut seen = BTreeSet::new();
        for d in &self.delivered {
            assert!(self.sent.contains(d), "delivered what nobody sent: {d:?}");
            assert!(seen.insert(d.clone()), "delivered twice: {d:?}");
        }
    }
}

fn text(i: u64) -> Vec<u8> {
    format!("message {i}").into_bytes()
}

#[test]
fn sessions_come_up_over_a_bad_network_and_nothing_is_delivered_twice() {
    for seed in 0..20 {
        let mut net = Net::new(3, seed, 0.2);
        let mut n = 0;
        // Every node sends to every other, every 50 ms, for 30 s.
        while net.now < at(30 * SEC) {
            for from in 0..3 {
                for to in 0..3 {
                    if from != to {
                        n += 1;
                        net.send(from, to, &text(n));
                    }
                }
            }
            let until = net.now + 50 * MS;
            net.run(until);
        }
        net.run(net.now + SEC);
        net.check_delivered_once();
        // With 20% loss most of the traffic still arrives.
        assert!(
            net.delivered.len() * 2 > net.sent.len(),
            "seed {seed}: {} of {}",
            net.delivered.len(),
            net.sent.len()
        );
        // The attacker replays everything ever sent, twice: what the
        // network had lost may now arrive, but nothing arrives twice.
        let captured = std::mem::take(&mut net.captured);
        for (from, to, bytes) in &captured {
            let _ = net.arrive(*from, *to, &mut bytes.clone());
        }
        net.check_delivered_once();
        let before = net.delivered.len();
        for (from, to, bytes) in &captured {
            let _ = net.arrive(*from, *to, &mut bytes.clone());
        }
        assert_eq!(net.delivered.len(), before, "seed {seed}");
        assert!(net.nodes.iter().all(|n| n.stats().replays > 0));
    }
}

#[test]
fn sessions_rekey_and_erased_keys_open_nothing() {
    let mut net = Net::new(2, 7, 0.0);
    let mut n = 0;
    let mut first_index = None;
    while net.now < at(400 * SEC) {
        n += 1;
        net.send(0, 1, &text(n));
        n += 1;
        net.send(1, 0, &text(n));
        let until = net.now + SEC;
        net.run(until);
        if first_index.is_none() {
            first_index = net.nodes[0].current(addr(1));
        }
    }
    let early: Vec<_> = net.captured.iter().take(20).cloned().collect();
    net.run(net.now + SEC);
    net.check_delivered_once();
    let got: BTreeSet<_> = net.delivered.iter().cloned().collect();
    let missing: Vec<_> = net.sent.difference(&got).collect();
    assert!(missing.is_empty(), "lost with no loss: {missing:?}");
    // Several sessions were made (a rekey every 120 to 150 s).
    assert!(net.ups >= 6, "{} sessions", net.ups);
    assert_ne!(net.nodes[0].current(addr(1)), first_index);
    // The first session's datagrams find no session any more.
    for (from, to, mut bytes) in early {
        if bytes[3] == 4 {
            assert_eq!(
                net.arrive(from, to, &mut bytes),
                Err(SessionError::UnknownIndex)
            );
        }
    }
}

#[test]
fn a_revoked_node_is_cut_off_and_cannot_come_back() {
    // (Also: a peer that stops answering in a session makes the sender
    // start another within `stale_after`.)
    let mut net = Net::new(3, 11, 0.0);
    for i in 0..10 {
        net.send(0, 2, &text(i));
        net.send(1, 2, &text(100 + i));
        let until = net.now + 100 * MS;
        net.run(until);
    }
    let delivered = |net: &Net, from: usize| net.delivered.iter().filter(|d| d.0 == from).count();
    assert_eq!((delivered(&net, 0), delivered(&net, 1)), (10, 10));
    let list = RevocationList {
        version: 1,
        issued: WALL,
        serials: vec![1],
    };
    let bytes = list.sign(CLUSTER, &net.admin).unwrap();
    let admin = net.admin.public();
    let list = RevocationList::verify(&bytes, CLUSTER, &admin).unwrap();
    assert!(net.nodes[2].revoke(list.clone()));
    assert!(!net.nodes[2].revoke(list), "only a newer list counts");
    for i in 0..40 {
        net.send(0, 2, &text(200 + i));
        net.send(1, 2, &text(300 + i));
        let until = net.now + SEC;
        net.run(until);
    }
    net.run(net.now + 20 * SEC);
    assert_eq!(delivered(&net, 0), 10, "n1 is revoked at n3");
    assert_eq!(delivered(&net, 1), 50, "n2 is not");
    // n1's old session is gone at n3; n1 tries a new one, and is refused.
    let s = net.nodes[2].stats();
    assert!(s.unknown_index > 0 && s.handshake_failures > 0, "{s:?}");
    net.check_delivered_once();
}

#[test]
fn the_same_seeds_replay_exactly() {
    let transcript = |seed| {
        let mut net = Net::new(3, seed, 0.3);
        for i in 0..50 {
            net.send((i % 3) as usize, ((i + 1) % 3) as usize, &text(i));
            let until = net.now + 20 * MS;
            net.run(until);
        }
        net.run(net.now + 5 * SEC);
        net.captured
    };
    assert_eq!(transcript(5), transcript(5));
    assert_ne!(transcript(5), transcript(6));
}

#[test]
fn forged_and_altered_datagrams_are_counted_and_dropped() {
    let mut net = Net::new(2, 3, 0.0);
    net.send(0, 1, b"hello");
    net.run(at(SEC));
    assert_eq!(net.delivered.len(), 1);
    let (_, _, good) = net
        .captured
        .iter()
        .rev()
        .find(|c| c.0 == 0 && c.2[3] == 4)
        .cloned()
        .unwrap();
    let mut bad = good.clone();
    *bad.last_mut().unwrap() ^= 1;
    // A fresh counter so the window does not refuse it first.
    bad[8] = bad[8].wrapping_add(100);
    assert_eq!(net.arrive(0, 1, &mut bad), Err(SessionError::BadTag));
    let mut replay = good.clone();
    assert_eq!(net.arrive(0, 1, &mut replay), Err(SessionError::Replayed));
    let mut junk = vec![0x53, 0x48, 2, 4, 1, 2, 3, 4];
    junk.extend_from_slice(&[0; 24]);
    assert_eq!(net.arrive(0, 1, &mut junk), Err(SessionError::UnknownIndex));
    let s = net.nodes[1].stats();
    assert_eq!((s.bad_tags, s.replays, s.unknown_index), (1, 1, 1));
}

#[test]
fn a_restarted_peer_is_reached_again_at_once() {
    let mut net = Net::new(2, 21, 0.0);
    for i in 0..5 {
        net.send(0, 1, &text(i));
        net.send(1, 0, &text(100 + i));
        let until = net.now + SEC;
        net.run(until);
    }
    // n2 restarts: same identity, no sessions.
    let fresh = Net::new(2, 99, 0.0);
    net.nodes[1] = fresh.nodes.into_iter().nth(1).unwrap();
    let before = net.delivered.len();
    for i in 0..30 {
        net.send(0, 1, &text(200 + i));
        let until = net.now + SEC;
        net.run(until);
    }
    let late: Vec<_> = net.delivered[before..]
        .iter()
        .filter(|d| d.0 == 0)
        .collect();
    // The restarted n2 answers the first datagram it cannot open with a
    // new session: at most the first is lost.
    assert!(
        late.len() >= 29,
        "{} delivered after the restart",
        late.len()
    );
    assert!(late.iter().any(|d| d.2 == text(229)));
    net.check_delivered_once();
}

/// Datagrams naming unknown sessions, forged from many addresses, start
/// at most `max_reconnects` handshakes a second, and the table forgets
/// the addresses again.
#[test]
fn forged_unknown_sessions_buy_an_attacker_little() {
    let mut net = Net::new(1, 4, 0.0);
    let mut out = Vec::new();
    for i in 0..1000u32 {
        let mut forged = vec![0x53, 0x48, 2, 4];
        forged.extend_from_slice(&(i + 1).to_le_bytes());
        forged.extend_from_slice(&[0; 8 + 16]);
        let from = SocketAddr::from(([192, 0, 2, (i % 250) as u8], 1000 + i as u16));
        let _ = net.nodes[0].handle(Time::ZERO, WALL, from, &mut forged, &mut out);
    }
    let starts = out
        .iter()
        .filter(|o| matches!(o, Output::Send { datagram, .. } if datagram[3] == 1))
        .count();
    assert_eq!(starts, Config::default().max_reconnects);
    // Given up and forgotten after `give_up`: nothing more is sent.
    out.clear();
    net.nodes[0].poll(at(11 * SEC), &mut out);
    out.clear();
    net.nodes[0].poll(at(12 * SEC), &mut out);
    assert!(out.is_empty(), "{out:?}");
}

/// A client endpoint on node 0 and a server endpoint on node 1 derive the
/// same channel key from their own tables, and so do two endpoints of one
/// node through its session with itself; a rekey gives a new root, and an
/// expired one gives none.
#[test]
fn both_ends_of_an_endpoint_channel_derive_one_key() {
    use shoal_session::kdf::{channel_key, server_secret};
    let mut net = Net::new(2, 7, 0.0);
    net.send(0, 1, &text(1));
    net.run(at(SEC));
    let client_root = net.nodes[0].root_to(net.now, Some(addr(1))).unwrap();
    let (peer, server_root) = net.nodes[1].root_at(net.now, client_root.index).unwrap();
    assert_eq!(peer.unwrap().name, "n1");
    assert_eq!(client_root.secret, server_root.secret);
    assert_eq!(client_root.algorithm, server_root.algorithm);
    let k = |root: &[u8; 32]| channel_key(&server_secret(root, 2, &[3; 16], 77), 1, 1000, 5);
    assert_eq!(k(&client_root.secret), k(&server_root.secret));
    // Its own node: the same root either way, no peer.
    let local = net.nodes[0].root_to(net.now, None).unwrap();
    let (peer, again) = net.nodes[0].root_at(net.now, local.index).unwrap();
    assert!(peer.is_none());
    assert_eq!(again.secret, local.secret);
    assert!(net.nodes[1].root_at(net.now, local.index).is_none());
    // After the rekey time, a new local root; the old one still opens
    // until it expires, then nothing does.
    let later = net.now + Config::default().rekey_after;
    let newer = net.nodes[0].root_to(later, None).unwrap();
    assert_ne!(newer.index, local.index);
    assert!(net.nodes[0].root_at(later, local.index).is_some());
    assert!(net.nodes[0].root_at(local.expires, local.index).is_none());
    assert!(
        net.nodes[1]
            .root_at(server_root.expires, server_root.index)
            .is_none()
    );
}

/// Review 3, M1: initiations flooded at a node, from one address or from
/// many it has no session with, keep neither a node it never spoke to nor
/// a peer it has a session with from making one.
#[test]
fn a_flood_of_initiations_locks_no_node_out() {
    for many in [false, true] {
        let mut net = Net::new(3, 11, 0.0);
        // Node 1 and node 0 have a session; node 2 has none yet.
        net.send(1, 0, &text(1));
        net.run(at(SEC));
        let genuine = net
            .captured
            .iter()
            .find(|(_, _, d)| d.len() > 8 && d[3] == 1)
            .expect("an initiation was sent")
            .2
            .clone();
        // An attacker replays it under fresh indexes, 600 times a
        // second for 3 s: from one address, or from 600.
        let mut forged = 0u32;
        let flood = |net: &mut Net, forged: &mut u32| {
            for _ in 0..60 {
                *forged += 1;
                let mut d = genuine.clone();
                d[4..8].copy_from_slice(&(0x7000_0000 + *forged).to_le_bytes());
                let octet = if many { (*forged % 600) as u16 } else { 0 };
                let from = SocketAddr::from(([192, 0, (octet >> 8) as u8, octet as u8], 9999));
                let mut out = Vec::new();
                let _ = net.nodes[0].handle(net.now, WALL, from, &mut d, &mut out);
            }
        };
        for _ in 0..10 {
            flood(&mut net, &mut forged);
            let until = net.now + 100 * MS;
            net.run(until);
        }
        // Node 2 makes its first session, and node 1 a new one (as after
        // a restart, it lost its keys), all while the flood goes on.
        net.nodes[1] = Net::new(3, 12, 0.0).nodes.remove(1);
        net.send(2, 0, &text(2));
        net.send(1, 0, &text(3));
        for _ in 0..20 {
            flood(&mut net, &mut forged);
            let until = net.now + 100 * MS;
            net.run(until);
        }
        for (from, t) in [(2, text(2)), (1, text(3))] {
            assert!(
                net.delivered.contains(&(from, 0, t.clone())),
                "many addresses {many}: node {from} was locked out"
            );
        }
    }
}
