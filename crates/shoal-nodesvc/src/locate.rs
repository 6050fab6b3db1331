//! Locate through the node, and the keys of endpoint channels
//! (`docs/security.md`, "Endpoint channels").
//!
//! A program's client asks its own node over the link where a port is
//! served.  The node answers from its registry and asks the other nodes in
//! their node sessions (one `NodeMsg::Locate` each, or one to the node named);
//! each answers with a `NodeMsg::Here` listing its endpoints, and speaks only
//! for itself.  The node hands the client, with each endpoint, the key of
//! the channel from this client to it:
//!
//! ```text
//! T(i) = keyed_blake3(endpoint root of this node and the server's, "to" || server node || port || i)
//! K    = keyed_blake3(T(i), "from" || this node || uid || client)
//! ```
//!
//! where the uid is the link's, from the kernel, and the client id one
//! this node gave that link.  A server endpoint asks its own node for
//! `T(i)` per session (`server_key`), for the port it registered `i` for
//! on that link, and derives `K` from each datagram's header, so each end
//! holds keys for its own channels only.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use shoal_cap::PutPort;
use shoal_rpc::link::{Answer, Found, Grant, LinkResponse};
use shoal_session::Root;
use shoal_session::kdf::{channel_key, server_secret};
use shoal_session::table::Output;
use shoal_wire::{
    ClientId, Here, Instance, Locate, NodeId, NodeMsg, Packet, decode_plain, encode_plain,
};

use crate::daemon::{Shared, now};

/// A client's key is handed out for this much less than its session has
/// left, so it is replaced while the server's side still opens it.
const MARGIN: Duration = Duration::from_secs(10);
/// Locates waiting for answers at once, over all links.
const MAX_PENDING: usize = 1024;
/// Locates one uid other than root may have waiting at once.
pub(crate) const MAX_PENDING_PER_UID: usize = 64;

/// Answers gathered for the locates under way, by nonce: the uid asking,
/// and for each answer the node that gave it, its address, and the answer.
pub(crate) type Pending = std::collections::HashMap<u64, (u32, Vec<(NodeId, SocketAddr, Here)>)>;

/// Where `locate.port` is served, for client `client` of `uid`: see the
/// module documentation.
pub(crate) fn locate(
    shared: &Shared,
    uid: u32,
    client: ClientId,
    locate: Locate,
    wait: Duration,
    all: bool,
) -> Result<Vec<Answer>, String> {
    let me = shared.node;
    // A node's own system services are answered for by that node alone,
    // and a service the map names by the nodes it names: another's
    // answer neither ends the wait nor reaches the client.
    let servers: Option<Vec<NodeId>> = own_service_of(shared, &locate.port)
        .map(|owner| vec![owner])
        .or_else(|| crate::service_map::servers(shared, &locate.port));
    let may_serve = |node: &NodeId| servers.as_ref().is_none_or(|s| s.contains(node));
    let mut answers: Vec<(NodeId, Option<SocketAddr>, Here)> = Vec::new();
    let targets: Vec<SocketAddr> = {
        let state = shared.state.lock();
        if locate.node == NodeId(0) || locate.node == me {
            answers.extend(state.registry.handle_locate(&locate).map(|h| (me, None, h)));
        }
        state
            .membership
            .view(now())
            .into_iter()
            .skip(1)
            .filter(|m| m.alive && (locate.node == NodeId(0) || locate.node == m.node))
            .map(|m| m.addr)
            .collect()
    };
    let useful = |node: &NodeId, h: &Here| {
        (!h.endpoints.is_empty() && may_serve(node)) || locate.instance != Instance(0)
    };
    if !(targets.is_empty() || (!all && answers.iter().any(|a| useful(&a.0, &a.2)))) {
        let nonce = locate.nonce.0;
        {
            let mut pending = shared.locating.lock();
            if pending.len() >= MAX_PENDING {
                return Err("this node is answering too many locates; try again".into());
            }
            if uid != 0 && pending.values().filter(|p| p.0 == uid).count() >= MAX_PENDING_PER_UID {
                return Err(format!(
                    "uid {uid} has {MAX_PENDING_PER_UID} locates waiting on this node; try again"
                ));
            }
            pending.insert(nonce, (uid, Vec::new()));
        }
        let mut plain = Vec::new();
        encode_plain(&Packet::Locate(locate), &mut plain);
        send(shared, &targets, &NodeMsg::Locate.with(&plain));
        let until = Instant::now() + wait;
        let mut pending = shared.locating.lock();
        loop {
            let heard = pending.get(&nonce).map_or(&[][..], |p| p.1.as_slice());
            let done =
                heard.len() >= targets.len() || (!all && heard.iter().any(|a| useful(&a.0, &a.2)));
            if done || shared.located.wait_until(&mut pending, until).timed_out() {
                let heard = pending.remove(&nonce).map(|p| p.1).unwrap_or_default();
                answers.extend(heard.into_iter().map(|(n, a, h)| (n, Some(a), h)));
                break;
            }
        }
    }
    let mut out = Vec::new();
    for (node, addr, here) in answers {
        if !may_serve(&node) && !here.endpoints.is_empty() {
            shared
                .refused_system_answers
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(%node, port = %locate.port, "a node answered for a service it may not serve");
            continue;
        }
        let root = shared.sessions.lock().root_to(now(), addr);
        let Some(root) = root else { continue };
        let endpoints = here
            .endpoints
            .iter()
            .map(|e| Found {
                addr: e.addr,
                instance: e.instance.to_string(),
                uid: e.uid,
                system: e.system,
                grant: grant(&root, node, &locate.port, e.instance, me, uid, client),
            })
            .collect();
        out.push(Answer {
            node: node.to_string(),
            fate: here.fate as u8,
            endpoints,
        });
    }
    Ok(out)
}

/// The node whose own system service `port` is (its node service or its
/// exec service), among the nodes this one knows: only that node may
/// serve it, whatever another node's root registers there.
fn own_service_of(shared: &Shared, port: &PutPort) -> Option<NodeId> {
    let cluster = &shared.identity.trust.cluster.0;
    let view = shared.state.lock().membership.view(now());
    view.into_iter()
        .find(|m| {
            shoal_poolsvc::exec_service(cluster, &m.name).put_port() == *port
                || crate::service::node_port(cluster, &m.name).put_port() == *port
        })
        .map(|m| m.node)
}

/// A fresh key for `client`'s channel to `instance` of `port` on `node`.
pub(crate) fn channel(
    shared: &Shared,
    uid: u32,
    client: ClientId,
    node: NodeId,
    port: PutPort,
    instance: Instance,
) -> Result<Grant, String> {
    let root = root_for(shared, node)?;
    Ok(grant(
        &root,
        node,
        &port,
        instance,
        shared.node,
        uid,
        client,
    ))
}

/// The endpoint root of this node's current session with `node` (its own
/// local session if `node` is this one); if there is none yet, one is
/// started and an error says to try again.
pub(crate) fn root_for(shared: &Shared, node: NodeId) -> Result<Root, String> {
    let addr = if node == shared.node {
        None
    } else {
        let state = shared.state.lock();
        let view = state.membership.view(now());
        match view.iter().find(|m| m.node == node) {
            Some(m) => Some(m.addr),
            None => return Err(format!("no node {node} in this node's view")),
        }
    };
    let root = shared.sessions.lock().root_to(now(), addr);
    match root {
        Some(root) => Ok(root),
        None => {
            // No session: start one, so that the next ask finds it.
            if let Some(addr) = addr {
                send(shared, &[addr], &[]);
            }
            Err(format!("no session with node {node} yet; try again"))
        }
    }
}

/// The secret server endpoint `instance` of `port` derives its callers'
/// keys from, for the session this node knows as `index`.
pub(crate) fn server_key(
    shared: &Shared,
    port: PutPort,
    instance: Instance,
    index: u32,
) -> LinkResponse {
    let now = now();
    let sessions = shared.sessions.lock();
    let Some((peer, root)) = sessions.root_at(now, index) else {
        return LinkResponse::Error {
            message: format!("no session {index:08x} on this node"),
        };
    };
    let node = peer.map_or(shared.node, |cert| {
        crate::identity::node_id(&cert.static_key)
    });
    let secret = server_secret(&root.secret, shared.node.0, port.as_bytes(), instance.0);
    LinkResponse::ServerKey {
        secret: hex::encode(secret),
        node: node.to_string(),
        aes: root.algorithm == shoal_session::Algorithm::Aes256Gcm,
        // Rounded up: the server's end never expires before this node's.
        valid_ms: (root.expires.saturating_since(now).as_micros() as u64).div_ceil(1000),
    }
}

/// `client`'s key for its channel to `instance` of `port` on `node`,
/// through the session whose root is `root`.
fn grant(
    root: &Root,
    node: NodeId,
    port: &PutPort,
    instance: Instance,
    me: NodeId,
    uid: u32,
    client: ClientId,
) -> Grant {
    let t = server_secret(&root.secret, node.0, port.as_bytes(), instance.0);
    let key = channel_key(&t, me.0, uid, client.0);
    let left = root.expires.saturating_since(now());
    let valid = left
        .saturating_sub(MARGIN)
        .max(Duration::from_secs(1))
        .min(left);
    Grant {
        key: hex::encode(key),
        index: root.index,
        aes: root.algorithm == shoal_session::Algorithm::Aes256Gcm,
        valid_ms: valid.as_millis() as u64,
    }
}

/// Seals `message` for each node in `to` and sends it from a link thread
/// (an empty one only makes sure a session is being made).
fn send(shared: &Shared, to: &[SocketAddr], message: &[u8]) {
    let mut outputs = Vec::new();
    {
        let mut sessions = shared.sessions.lock();
        for addr in to {
            sessions.send(now(), *addr, message, &mut outputs);
        }
    }
    for o in outputs {
        if let Output::Send { to, datagram } = o {
            let _ = shared.socket.send_to(&datagram, to);
        }
    }
}

/// A peer's locate question: the answer to seal back, if this node has
/// one.
pub(crate) fn answer(registry: &shoal_proto::Registry, plain: &[u8]) -> Option<Vec<u8>> {
    let Ok(Packet::Locate(l)) = decode_plain(plain) else {
        return None;
    };
    let here = registry.handle_locate(&l)?;
    let mut plain = Vec::new();
    encode_plain(&Packet::Here(here), &mut plain);
    Some(NodeMsg::Here.with(&plain))
}

/// A peer's answer to one of this node's locates: kept if a locate waits
/// for it and the peer speaks for itself.
pub(crate) fn heard(shared: &Shared, node: NodeId, addr: SocketAddr, plain: &[u8]) -> bool {
    let Ok(Packet::Here(here)) = decode_plain(plain) else {
        return false;
    };
    if here.node != node {
        return false;
    }
    let mut pending = shared.locating.lock();
    match pending.get_mut(&here.nonce.0) {
        Some((_, answers)) if answers.len() < shoal_wire::MAX_MEMBERS => {
            answers.push((node, addr, here));
            shared.located.notify_all();
            true
        }
        _ => false,
    }
}
