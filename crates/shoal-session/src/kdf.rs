//! Key derivation (`docs/security.md`): a node session's keys from Noise's
//! split, endpoint channel keys from a session's endpoint root, and group
//! members' sending keys from a group key.  Every derivation is BLAKE3, in
//! `derive_key` mode from raw secrets and keyed mode below a derived key,
//! with an input whose fields have fixed lengths, so no two distinct inputs
//! collide.

/// The three secrets a node session derives from Noise's split.
pub struct SessionSecrets {
    /// Seals what the initiator sends.
    pub i2r: [u8; 32],
    /// Seals what the responder sends.
    pub r2i: [u8; 32],
    /// What endpoint channel keys are derived from.
    pub endpoint_root: [u8; 32],
}

impl SessionSecrets {
    /// From Noise's split `(k1, k2)`.
    pub fn from_split(k1: &[u8; 32], k2: &[u8; 32]) -> Self {
        let mut both = [0u8; 64];
        both[..32].copy_from_slice(k1);
        both[32..].copy_from_slice(k2);
        Self {
            i2r: blake3::derive_key("shoal 2026 session i2r", &both),
            r2i: blake3::derive_key("shoal 2026 session r2i", &both),
            endpoint_root: blake3::derive_key("shoal 2026 endpoint root", &both),
        }
    }
}

/// `T(i)`: what server endpoint `instance` on node `server_node` holds for
/// one node session, to derive the keys of every channel to it, while it
/// serves put-port `port`.  The port is part of it because the right to
/// serve a port is what a registration proves (its get-port, or the
/// node's leave for a system port): whoever registers the same instance
/// id under another port gets another secret, which opens nothing sent to
/// this endpoint.
pub fn server_secret(
    endpoint_root: &[u8; 32],
    server_node: u64,
    port: &[u8; 16],
    instance: u64,
) -> [u8; 32] {
    let mut input = [0u8; 34];
    input[..2].copy_from_slice(b"to");
    input[2..10].copy_from_slice(&server_node.to_le_bytes());
    input[10..26].copy_from_slice(port);
    input[26..].copy_from_slice(&instance.to_le_bytes());
    *blake3::keyed_hash(endpoint_root, &input).as_bytes()
}

/// `K`: the key of the channel from client endpoint `client`, run by `uid`
/// on node `client_node`, to the server endpoint whose [`server_secret`] is
/// `server`.
pub fn channel_key(server: &[u8; 32], client_node: u64, uid: u32, client: u64) -> [u8; 32] {
    let mut input = [0u8; 24];
    input[..4].copy_from_slice(b"from");
    input[4..12].copy_from_slice(&client_node.to_le_bytes());
    input[12..16].copy_from_slice(&uid.to_le_bytes());
    input[16..].copy_from_slice(&client.to_le_bytes());
    *blake3::keyed_hash(server, &input).as_bytes()
}

/// The key group member `member` seals its datagrams with, under the
/// group key of the epoch it sends in.
pub fn member_key(group_key: &[u8; 32], member: u64) -> [u8; 32] {
    let mut input = [0u8; 14];
    input[..6].copy_from_slice(b"member");
    input[6..].copy_from_slice(&member.to_le_bytes());
    *blake3::keyed_hash(group_key, &input).as_bytes()
}

/// The key a home's daemon seals start grants with for the node at the
/// other end of the session whose endpoint root is `endpoint_root`
/// (`docs/security.md`, "Local authority").  Only the two daemons hold
/// the root, so only they hold this key.
pub fn grant_key(endpoint_root: &[u8; 32]) -> [u8; 32] {
    *blake3::keyed_hash(endpoint_root, b"start grant").as_bytes()
}
