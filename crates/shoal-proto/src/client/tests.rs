//! Tests of the client core against the real server core: fragments
//! reordered and repeated, a call moved to an advised endpoint, and a
//! server that tries to answer for another.

use super::*;
use crate::{Caller, Registry, ServerConfig, ServerCore};
use shoal_cap::GetPort;

/// A reply in fragments, with the server's datagrams delivered out of
/// order and some twice: the body still comes out whole.
#[test]
fn reordered_and_repeated_fragments_make_the_same_reply() {
    proptest::proptest!(|(len in 0usize..2000, frag in 1usize..300, order in proptest::collection::vec(0usize..8, 0..64))| {
        let body: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
        proptest::prop_assert_eq!(exchange(&body, frag, &order), body);
    });
}

/// A port served on two nodes: a call goes where the first locate
/// answer points; after `aim`, to the advised endpoint, located at its
/// node alone; an advised node that no longer serves the port, or does
/// not answer, sends the client back to locating everywhere.
#[test]
fn aim_moves_calls_to_the_advised_endpoint_as_its_node_confirms() {
    let port = GetPort::from_bytes([4; 16]).put_port();
    let endpoint = |i: u64| Endpoint {
        addr: SocketAddr::from(([10, 0, 0, i as u8], 9000)),
        instance: Instance(i),
        uid: 0,
        system: false,
    };
    let mut nodes: Vec<(NodeId, Registry, bool)> = (1..=3u64)
        .map(|n| (NodeId(n), Registry::new(NodeId(n)), true))
        .collect();
    nodes[0].1.register(port, endpoint(1)).unwrap();
    nodes[1].1.register(port, endpoint(2)).unwrap();
    let mut servers: Vec<ServerCore> = (1..=2u64)
        .map(|i| ServerCore::new(port, Instance(i), ServerConfig::default()))
        .collect();
    let mut client = ClientCore::new(ClientId(5), ClientConfig::default());
    let mut now = Time(0);
    let mut call = |client: &mut ClientCore, nodes: &[(NodeId, Registry, bool)]| {
        client.start(now, port, Bytes::new(), now + Duration::from_secs(60));
        let mut asked = Vec::new();
        loop {
            now += Duration::from_millis(1);
            while let Some(t) = client.poll_transmit() {
                let dest = t.dest;
                let bytes = t.into_plain();
                match (dest, decode_plain(&bytes)) {
                    (Dest::Nodes | Dest::Node(_), Ok(Packet::Locate(l))) => {
                        asked.push(dest);
                        for (id, reg, answers) in nodes {
                            let wanted = dest == Dest::Nodes || dest == Dest::Node(*id);
                            if let (true, true, Some(here)) =
                                (wanted, *answers, reg.handle_locate(&l))
                            {
                                let mut plain = Vec::new();
                                encode_plain(&Packet::Here(here), &mut plain);
                                client.handle_datagram(
                                    now,
                                    SocketAddr::from(([10, 9, 9, id.0 as u8], 7700)),
                                    &plain,
                                );
                            }
                        }
                    }
                    (Dest::Addr(a), _) => {
                        // Endpoint i listens at 10.0.0.i.
                        let who = u64::from(a.ip().to_string().ends_with(".2")) + 1;
                        let s = &mut servers[who as usize - 1];
                        let caller = Caller {
                            node: NodeId(9),
                            uid: 0,
                            client: ClientId(5),
                        };
                        s.handle_datagram(now, "10.0.0.9:9000".parse().unwrap(), caller, 1, &bytes);
                        while let Some(req) = s.poll_request() {
                            s.reply(now, req.caller, req.txn, who.to_le_bytes().to_vec());
                        }
                        let out: Vec<Vec<u8>> = std::iter::from_fn(|| s.poll_transmit())
                            .map(Transmit::into_plain)
                            .collect();
                        for d in out {
                            client.handle_datagram(now, a, &d);
                        }
                    }
                    _ => {}
                }
            }
            if let Some(r) = client.poll_outcome() {
                let body = r.unwrap();
                return (u64::from_le_bytes(body[..8].try_into().unwrap()), asked);
            }
            if client.poll_timeout().is_some_and(|t| t <= now) {
                client.handle_timeout(now);
            }
        }
    };
    let (first, asked) = call(&mut client, &nodes);
    assert_eq!(
        (first, asked),
        (1, vec![Dest::Nodes]),
        "the first answer (node 1's)"
    );
    client.aim(port, NodeId(2), Instance(2));
    let (second, asked) = call(&mut client, &nodes);
    assert_eq!(
        (second, asked),
        (2, vec![Dest::Node(NodeId(2))]),
        "located at node 2 alone"
    );
    assert_eq!(call(&mut client, &nodes), (2, vec![]), "and cached there");
    // Advised to node 3, which serves nothing of the port.
    client.aim(port, NodeId(3), Instance(3));
    let (third, asked) = call(&mut client, &nodes);
    assert_eq!(
        (third, asked),
        (1, vec![Dest::Node(NodeId(3)), Dest::Nodes])
    );
    // Advised to node 2, which does not answer.
    nodes[1].2 = false;
    client.aim(port, NodeId(2), Instance(2));
    let (fourth, asked) = call(&mut client, &nodes);
    assert_eq!(
        (fourth, asked),
        (1, vec![Dest::Node(NodeId(2)), Dest::Nodes])
    );
    // Node 2 answers again.
    nodes[1].2 = true;
    client.aim(port, NodeId(2), Instance(2));
    assert_eq!(call(&mut client, &nodes), (2, vec![Dest::Node(NodeId(2))]));
    // Advised to the endpoint in use: nothing changes.
    client.aim(port, NodeId(2), Instance(2));
    assert_eq!(call(&mut client, &nodes), (2, vec![]));
    // Node 2's answer cached its endpoints alone: advised to node 1's,
    // the client asks node 1.
    client.aim(port, NodeId(1), Instance(1));
    assert_eq!(call(&mut client, &nodes), (1, vec![Dest::Node(NodeId(1))]));
}

/// A reply opened with one server's key but naming another server is
/// dropped: a server this client has a channel with cannot answer in
/// the name of the one the call went to.  The real server's reply is
/// still taken.
#[test]
fn a_server_cannot_answer_for_another() {
    let port = GetPort::from_bytes([8; 16]).put_port();
    let server_addr: SocketAddr = "10.0.0.2:9000".parse().unwrap();
    let node_addr: SocketAddr = "10.0.0.2:7700".parse().unwrap();
    let mut registry = Registry::new(NodeId(1));
    let (target, other) = (Instance(77), Instance(78));
    let endpoint = Endpoint {
        addr: server_addr,
        instance: target,
        uid: 1000,
        system: false,
    };
    registry.register(port, endpoint).unwrap();
    let mut client = ClientCore::new(ClientId(5), ClientConfig::default());
    let now = Time(0);
    let txn = client.start(now, port, Bytes::new(), now + Duration::from_secs(60));
    while let Some(t) = client.poll_transmit() {
        if let Ok(Packet::Locate(l)) = decode_plain(&t.into_plain())
            && let Some(here) = registry.handle_locate(&l)
        {
            let mut plain = Vec::new();
            encode_plain(&Packet::Here(here), &mut plain);
            client.handle_datagram(now, node_addr, &plain);
        }
    }
    let mut reply = Vec::new();
    encode_plain(
        &Packet::Reply(shoal_wire::Reply {
            txn,
            instance: target,
            status: ReplyStatus::Ok,
            frag: shoal_wire::Frag { index: 0, count: 1 },
            total_len: 2,
            payload: b"ok",
        }),
        &mut reply,
    );
    client.handle_sealed(now, server_addr, other, &reply);
    assert!(client.poll_outcome().is_none(), "taken from another server");
    assert_eq!(client.stats().dropped_malformed, 1);
    client.handle_sealed(now, server_addr, target, &reply);
    assert_eq!(client.poll_outcome(), Some(Ok(b"ok".to_vec())));
}

/// One call carrying `reply` back in fragments of `frag` bytes; `order`
/// shuffles (and duplicates) the server's datagrams.
fn exchange(reply: &[u8], frag: usize, order: &[usize]) -> Vec<u8> {
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
                uid: 1000,
                system: false,
            },
        )
        .unwrap();
    let config = ServerConfig {
        frag_bytes: frag,
        window: 8,
        ..ServerConfig::default()
    };
    let mut server = ServerCore::new(port, instance, config);
    let config = ClientConfig {
        frag_bytes: frag,
        window: 8,
        ..ClientConfig::default()
    };
    let mut client = ClientCore::new(ClientId(5), config);
    let caller = Caller {
        node: NodeId(2),
        uid: 1000,
        client: ClientId(5),
    };
    let mut now = Time(0);
    client.start(
        now,
        port,
        Bytes::from_static(b"ask"),
        now + Duration::from_secs(60),
    );
    let mut turn = 0;
    loop {
        now += Duration::from_millis(1);
        while let Some(t) = client.poll_transmit() {
            let dest = t.dest;
            let bytes = t.into_plain();
            match dest {
                Dest::Nodes | Dest::Node(_) => {
                    if let Ok(Packet::Locate(l)) = decode_plain(&bytes)
                        && let Some(here) = registry.handle_locate(&l)
                    {
                        let mut plain = Vec::new();
                        encode_plain(&Packet::Here(here), &mut plain);
                        client.handle_datagram(now, node_addr, &plain);
                    }
                }
                Dest::Addr(_) => server.handle_datagram(now, client_addr, caller, 1, &bytes),
            }
        }
        while let Some(req) = server.poll_request() {
            server.reply(now, req.caller, req.txn, reply.to_vec());
        }
        let mut out: Vec<Vec<u8>> = std::iter::from_fn(|| server.poll_transmit())
            .map(Transmit::into_plain)
            .collect();
        // Reorder: each datagram moves back by up to `order[turn]`
        // places, and one in three turns repeats the first.
        for i in 0..out.len() {
            let back = order.get(turn + i).copied().unwrap_or(0).min(i);
            out[i - back..=i].rotate_right(1);
        }
        if turn % 3 == 1
            && let Some(first) = out.first().cloned()
        {
            out.push(first);
        }
        turn += 1;
        for d in out {
            client.handle_datagram(now, server_addr, &d);
        }
        if let Some(r) = client.poll_outcome() {
            return r.unwrap();
        }
        if client.poll_timeout().is_some_and(|t| t <= now) {
            client.handle_timeout(now);
        }
        if server.poll_timeout() <= now {
            server.handle_timeout(now);
        }
        assert!(turn < 10_000, "the call did not finish");
    }
}
