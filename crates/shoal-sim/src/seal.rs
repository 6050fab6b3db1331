//! Endpoint channels in the RPC simulation: every datagram between a
//! client and a server is sealed and opened by the real session code
//! (`shoal_session::Channel`, its keys from `shoal_session::kdf`), so the
//! simulated network's duplicates, delays and replays meet the real replay
//! windows.  Locate and heartbeats stay plaintexts: they stand for node
//! sessions, whose table is simulated on its own
//! (`shoal-session/tests/table.rs`).
//!
//! One endpoint root stands for every node session.  A client names its
//! own node's index in the header where the real one names the session,
//! and the server derives the caller's key from it, as a real server
//! derives it from the session's peer.

use std::collections::HashMap;

use shoal_cap::PutPort;
use shoal_proto::Caller;
use shoal_session::kdf::{channel_key, server_secret};
use shoal_session::{Algorithm, Channel, Header, SessionError};
use shoal_wire::{ClientId, Instance, NodeId};

/// The AEAD of the simulation's channels.
const ALGORITHM: Algorithm = Algorithm::ChaCha20Poly1305;

/// Every channel of the simulation, both ends.
pub(crate) struct Seals {
    root: [u8; 32],
    /// The one port the simulation's servers serve.
    port: PutPort,
    clients: HashMap<(ClientId, Instance), Channel>,
    servers: HashMap<(Instance, u32, ClientId), Channel>,
    /// Datagrams refused as replays, and datagrams that did not open.
    pub replays: usize,
    pub bad: usize,
}

/// Why a datagram did not reach a core.
pub(crate) enum Unopened {
    Replayed,
    Bad,
}

impl Seals {
    /// Channels to servers of `port`, under a root made from `seed`.
    pub fn new(seed: u64, port: PutPort) -> Self {
        Self {
            root: blake3::derive_key("shoal sim endpoint root", &seed.to_le_bytes()),
            port,
            clients: HashMap::new(),
            servers: HashMap::new(),
            replays: 0,
            bad: 0,
        }
    }

    fn key(&self, instance: Instance, node: u32, client: ClientId) -> [u8; 32] {
        let t = server_secret(&self.root, 0, self.port.as_bytes(), instance.0);
        channel_key(&t, node as u64, 0, client.0)
    }

    /// Client `client`, on node index `node`, seals `plain` for server
    /// endpoint `instance`.
    pub fn seal_to_server(
        &mut self,
        client: ClientId,
        node: u32,
        instance: Instance,
        plain: &[u8],
    ) -> Vec<u8> {
        let key = self.key(instance, node, client);
        let channel = self
            .clients
            .entry((client, instance))
            .or_insert_with(|| Channel::client(ALGORITHM, &key));
        let mut out = Vec::new();
        channel.seal(node, 0, client.0, &[plain], &mut out);
        out
    }

    /// Server endpoint `instance` opens a datagram: its caller (with the
    /// caller's node index) and plaintext.
    pub fn open_at_server(
        &mut self,
        instance: Instance,
        nodes: &[NodeId],
        datagram: &[u8],
    ) -> Result<(Caller, u32, Vec<u8>), Unopened> {
        let Ok(Header::Endpoint {
            to_client: false,
            receiver,
            sender,
            ..
        }) = Header::peek(datagram)
        else {
            self.bad += 1;
            return Err(Unopened::Bad);
        };
        let Some(&node) = nodes.get(receiver as usize) else {
            self.bad += 1;
            return Err(Unopened::Bad);
        };
        let client = ClientId(sender);
        let key = self.key(instance, receiver, client);
        let channel = self
            .servers
            .entry((instance, receiver, client))
            .or_insert_with(|| Channel::server(ALGORITHM, &key));
        let opened = open(channel, datagram);
        let plain = self.count(opened)?;
        let caller = Caller {
            node,
            uid: 0,
            client,
        };
        Ok((caller, receiver, plain))
    }

    /// Server endpoint `instance` seals `plain` for `caller`, whose
    /// datagrams came from node index `node`.
    pub fn seal_to_client(
        &mut self,
        instance: Instance,
        node: u32,
        caller: Caller,
        plain: &[u8],
    ) -> Option<Vec<u8>> {
        let channel = self.servers.get_mut(&(instance, node, caller.client))?;
        let mut out = Vec::new();
        channel.seal(node, 0, instance.0, &[plain], &mut out);
        Some(out)
    }

    /// Client `client` opens a server's datagram: the server endpoint
    /// whose key opened it, and its plaintext.
    pub fn open_at_client(
        &mut self,
        client: ClientId,
        datagram: &[u8],
    ) -> Result<(Instance, Vec<u8>), Unopened> {
        let Ok(Header::Endpoint {
            to_client: true,
            sender,
            ..
        }) = Header::peek(datagram)
        else {
            self.bad += 1;
            return Err(Unopened::Bad);
        };
        let Some(channel) = self.clients.get_mut(&(client, Instance(sender))) else {
            self.bad += 1;
            return Err(Unopened::Bad);
        };
        let opened = open(channel, datagram);
        self.count(opened).map(|plain| (Instance(sender), plain))
    }

    /// Counts a datagram that did not open.
    fn count(&mut self, opened: Result<Vec<u8>, SessionError>) -> Result<Vec<u8>, Unopened> {
        match opened {
            Ok(plain) => Ok(plain),
            Err(SessionError::Replayed) => {
                self.replays += 1;
                Err(Unopened::Replayed)
            }
            Err(_) => {
                self.bad += 1;
                Err(Unopened::Bad)
            }
        }
    }
}

/// Opens a copy of `datagram` in `channel`: its plaintext.
fn open(channel: &mut Channel, datagram: &[u8]) -> Result<Vec<u8>, SessionError> {
    let mut bytes = datagram.to_vec();
    channel.open(&mut bytes).map(|(_, plain)| plain.to_vec())
}
