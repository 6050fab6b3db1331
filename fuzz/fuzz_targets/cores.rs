//! The protocol cores never panic and stay bounded in memory, whatever
//! (authenticated) datagrams arrive, in whatever order and at whatever
//! times.
//!
//! A client, a server (echo) and a node's registry talk to each other over
//! an in-memory network, so transactions run on their own; the fuzz input
//! adds datagrams of its choosing, as if sent by one of the three, moves
//! the clock, and loses the cores' own datagrams.  Server and client accept
//! at most 1 MiB bodies.
//!
//! The input is a list of records: `tick, flags, len_lo, len_hi`, then
//! `len` bytes of plaintext (what a shell hands a core once a datagram
//! opened; the server takes it as from the client it names).  `tick` advances the clock by `tick` milliseconds, and an odd
//! `tick` fires the timers; an odd `flags` loses what the cores send in
//! this round, and `flags / 2 % 3` picks the sender (client, server, node).

#![no_main]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use shoal_cap::PutPort;
use shoal_proto::{
    Caller, ClientConfig, ClientCore, Dest, Registry, ServerConfig, ServerCore, Time, Transmit,
    pool,
};
use shoal_wire::{ClientId, Endpoint, Instance, NodeId, Packet, decode_plain, encode_plain};

const CLIENT: SocketAddr = addr(1);
const SERVER: SocketAddr = addr(2);
const NODE: SocketAddr = addr(3);
const PEERS: [SocketAddr; 3] = [CLIENT, SERVER, NODE];

const fn addr(last: u8) -> SocketAddr {
    SocketAddr::new(
        std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, last)),
        7000,
    )
}

struct Net {
    port: PutPort,
    client: ClientCore,
    server: ServerCore,
    registry: Registry,
    now: Time,
}

fuzz_target!(|data: &[u8]| {
    let port = PutPort::from_bytes([1; 16]);
    let instance = Instance(1);
    let mut registry = Registry::new(NodeId(1));
    let endpoint = Endpoint {
        addr: SERVER,
        instance,
        uid: 0,
        system: false,
    };
    registry
        .register(port, endpoint)
        .expect("an empty registry takes a first port");
    let server_config = ServerConfig {
        frag_bytes: 256,
        window: 4,
        max_request_bytes: 1 << 20,
        max_assembling_bytes: 4 << 20,
        max_records: 64,
        record_ttl: Duration::from_secs(2),
    };
    let client_config = ClientConfig {
        frag_bytes: 256,
        window: 4,
        max_reply_bytes: 1 << 20,
        ..ClientConfig::default()
    };
    let mut net = Net {
        server: ServerCore::new(port, instance, server_config),
        client: ClientCore::new(ClientId(1), client_config),
        registry,
        port,
        now: Time(0),
    };
    net.start();

    let mut rest = data;
    while let [tick, flags, len_lo, len_hi, tail @ ..] = rest {
        let len = usize::from(u16::from_le_bytes([*len_lo, *len_hi])).min(tail.len());
        let (datagram, next) = tail.split_at(len);
        rest = next;
        net.now = net.now + Duration::from_millis(u64::from(*tick));
        if tick % 2 == 1 {
            net.client.handle_timeout(net.now);
            net.server.handle_timeout(net.now);
        }
        let from = PEERS[usize::from(flags / 2) % PEERS.len()];
        net.client.handle_datagram(net.now, from, datagram);
        net.to_server(from, datagram);
        net.locate(datagram);
        net.pump(flags % 2 == 0);
        if net.client.poll_outcome().is_some() {
            net.start();
            net.pump(flags % 2 == 0);
        }
    }
});

impl Net {
    /// Starts a transaction on the client: a body of a few fragments.
    fn start(&mut self) {
        let deadline = self.now + Duration::from_secs(5);
        let body = Bytes::from(vec![0xab; 1000]);
        self.client.start(self.now, self.port, body, deadline);
    }

    /// The registry answers `plain` if it is a locate.
    fn locate(&mut self, plain: &[u8]) {
        if let Ok(Packet::Locate(l)) = decode_plain(plain)
            && let Some(here) = self.registry.handle_locate(&l)
        {
            let mut answer = Vec::new();
            encode_plain(&Packet::Here(here), &mut answer);
            self.client.handle_datagram(self.now, NODE, &answer);
        }
    }

    /// The server takes `plain` from the client it names (as its shell
    /// would once it opened in that client's channel).
    fn to_server(&mut self, from: SocketAddr, plain: &[u8]) {
        let packet = decode_plain(plain);
        let client = packet
            .as_ref()
            .ok()
            .and_then(Packet::client)
            .unwrap_or(ClientId(0));
        let caller = Caller {
            node: NodeId(2),
            uid: 0,
            client,
        };
        self.server.handle_packet(self.now, from, caller, 1, packet);
    }

    /// Delivers (or loses) what the cores send and serves requests (echo),
    /// until nothing moves or for a bounded number of rounds.
    fn pump(&mut self, deliver: bool) {
        for _ in 0..64 {
            let mut moved = false;
            while let Some(t) = self.client.poll_transmit() {
                moved = true;
                if deliver {
                    self.deliver(CLIENT, &t);
                }
                pool::give(t.bytes);
            }
            while let Some(t) = self.server.poll_transmit() {
                moved = true;
                if deliver {
                    self.deliver(SERVER, &t);
                }
                pool::give(t.bytes);
            }
            while let Some(req) = self.server.poll_request() {
                moved = true;
                self.server
                    .reply(self.now, req.caller, req.txn, Bytes::from(req.body));
            }
            if !moved {
                break;
            }
        }
    }

    /// Hands `t`, sent by `from`, to the core at its destination.
    fn deliver(&mut self, from: SocketAddr, t: &Transmit) {
        match t.dest {
            Dest::Addr(CLIENT) => self.client.handle_datagram(self.now, from, &t.bytes),
            Dest::Addr(SERVER) => self.to_server(from, &t.bytes),
            Dest::Addr(NODE) | Dest::Nodes | Dest::Node(_) => self.locate(&t.bytes),
            Dest::Addr(_) => {}
        }
    }
}
