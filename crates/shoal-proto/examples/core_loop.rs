//! Cost of the protocol cores alone: a client core and a server core
//! exchange null RPCs in memory, no sockets.  Prints nanoseconds per call.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use shoal_cap::GetPort;
use shoal_proto::{
    Caller, ClientConfig, ClientCore, Dest, Registry, ServerConfig, ServerCore, Time, pool,
};
use shoal_wire::{ClientId, Endpoint, Instance, NodeId, Packet, decode_plain, encode_plain};

fn main() {
    let port = GetPort::from_bytes([9; 16]).put_port();
    let server_addr: SocketAddr = "10.0.0.2:9000".parse().unwrap();
    let client_addr: SocketAddr = "10.0.0.1:9000".parse().unwrap();
    let node_addr: SocketAddr = "10.0.0.2:7700".parse().unwrap();
    let mut registry = Registry::new(NodeId(1));
    let instance = Instance(77);
    registry
        .register(
            port,
            Endpoint {
                addr: server_addr,
                instance,
                uid: 0,
                system: false,
            },
        )
        .expect("a fresh registry takes the endpoint");
    let mut server = ServerCore::new(port, instance, ServerConfig::default());
    let mut client = ClientCore::new(ClientId(5), ClientConfig::default());
    let caller = Caller {
        node: NodeId(2),
        uid: 0,
        client: ClientId(5),
    };
    let mut here = Vec::new();
    let n = 1_000_000;
    let mut now = Time(0);
    let start = Instant::now();
    for _ in 0..n {
        now += Duration::from_micros(1);
        client.start(now, port, Bytes::new(), now + Duration::from_secs(1));
        loop {
            while let Some(t) = client.poll_transmit() {
                match t.dest {
                    Dest::Nodes | Dest::Node(_) => {
                        if let Ok(Packet::Locate(l)) = decode_plain(&t.bytes)
                            && let Some(a) = registry.handle_locate(&l)
                        {
                            encode_plain(&Packet::Here(a), &mut here);
                            client.handle_datagram(now, node_addr, &here);
                        }
                    }
                    Dest::Addr(_) => server.handle_datagram(now, client_addr, caller, 1, &t.bytes),
                }
                pool::give(t.bytes);
            }
            while let Some(req) = server.poll_request() {
                server.reply(now, req.caller, req.txn, Bytes::new());
            }
            while let Some(t) = server.poll_transmit() {
                client.handle_datagram(now, server_addr, &t.bytes);
                pool::give(t.bytes);
            }
            if let Some(r) = client.poll_outcome() {
                r.unwrap();
                break;
            }
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / n as f64;
    println!("{ns:.0} ns per null RPC through both cores (plaintexts: sealing is the shells')");
}
