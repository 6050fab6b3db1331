//! Node configuration: a TOML file, overridden by command-line flags.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shoal_session::{AdminPublic, ClusterId};

/// The configuration file's contents; every field optional.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NodeConfigFile {
    /// Node name, unique in the cluster.
    pub name: Option<String>,
    /// Where the node keeps its identity and link socket.
    pub state_dir: Option<PathBuf>,
    /// The address other nodes and programs reach this node at.
    pub addr: Option<SocketAddr>,
    /// The address to bind (default: `addr`); `0.0.0.0:PORT` also receives
    /// broadcasts.
    pub bind: Option<SocketAddr>,
    /// The cluster network's broadcast address, if it has one.
    pub broadcast: Option<SocketAddr>,
    /// Nodes to join through.
    pub seeds: Option<Vec<SocketAddr>>,
    /// File holding the cluster key (64 hex characters).
    pub key_file: Option<PathBuf>,
    /// The cluster's id (32 hex digits, from `shoal cluster init`).
    pub cluster_id: Option<String>,
    /// The admin key's public half (64 hex digits): what admits nodes.
    pub admin_key: Option<String>,
    /// This node's certificate (default: `STATE_DIR/node.cert`).
    pub cert_file: Option<PathBuf>,
    /// Where to serve Prometheus metrics.
    pub metrics: Option<SocketAddr>,
    /// Body bytes per datagram.
    pub frag_bytes: Option<usize>,
    /// The link socket (default: `STATE_DIR/node.sock`).
    pub socket: Option<PathBuf>,
    /// Whether the node detects its owner's activity (terminal input,
    /// foreground load) when the owner has not said (default true; local
    /// clusters, whose nodes share one machine and console, turn it off).
    pub owner_detect: Option<bool>,
    /// What a program that root on another node starts here runs as
    /// (default `squash`: as `nobody`; `allow`: as root).
    pub remote_root: Option<RemoteRoot>,
    /// Open the link socket only to this group's members (mode 0660)
    /// instead of every local user (0666).
    pub socket_group: Option<String>,
}

/// Whether root on another node is root here (`docs/security.md`,
/// "Principals").
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RemoteRoot {
    /// A remote root's programs run as `nobody`, with its group and no
    /// others.
    #[default]
    Squash,
    /// A remote root's programs run as root (nodes whose roots trust each
    /// other, such as a local cluster's, which share one machine).
    Allow,
}

impl NodeConfigFile {
    /// Reads and parses a configuration file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("bad config {}: {}", path.display(), e.message()))
    }

    /// Fields set in `over` replace those here.
    pub fn merge(self, over: NodeConfigFile) -> NodeConfigFile {
        NodeConfigFile {
            name: over.name.or(self.name),
            state_dir: over.state_dir.or(self.state_dir),
            addr: over.addr.or(self.addr),
            bind: over.bind.or(self.bind),
            broadcast: over.broadcast.or(self.broadcast),
            seeds: over.seeds.or(self.seeds),
            key_file: over.key_file.or(self.key_file),
            cluster_id: over.cluster_id.or(self.cluster_id),
            admin_key: over.admin_key.or(self.admin_key),
            cert_file: over.cert_file.or(self.cert_file),
            metrics: over.metrics.or(self.metrics),
            frag_bytes: over.frag_bytes.or(self.frag_bytes),
            socket: over.socket.or(self.socket),
            owner_detect: over.owner_detect.or(self.owner_detect),
            remote_root: over.remote_root.or(self.remote_root),
            socket_group: over.socket_group.or(self.socket_group),
        }
    }
}

/// A complete node configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    pub name: String,
    pub state_dir: PathBuf,
    pub addr: SocketAddr,
    pub bind: SocketAddr,
    pub broadcast: Option<SocketAddr>,
    pub seeds: Vec<SocketAddr>,
    pub key_file: PathBuf,
    pub cluster: ClusterId,
    pub admin: AdminPublic,
    pub cert_file: PathBuf,
    pub metrics: Option<SocketAddr>,
    pub frag_bytes: usize,
    pub socket: PathBuf,
    pub owner_detect: bool,
    pub remote_root: RemoteRoot,
    /// The group the link socket is open to, if not every user.
    pub socket_group: Option<String>,
}

impl NodeConfig {
    /// Fills defaults and checks that nothing required is missing.
    pub fn resolve(file: NodeConfigFile) -> Result<NodeConfig, String> {
        let state_dir = file
            .state_dir
            .ok_or("no state directory: set state_dir in the config or pass --state-dir")?;
        let addr = file
            .addr
            .ok_or("no node address: set addr in the config or pass --addr")?;
        let key_file = file
            .key_file
            .ok_or("no cluster key: set key_file in the config or pass --key-file")?;
        let cluster = ClusterId::from_hex(file.cluster_id.as_deref().ok_or(
            "no cluster id: set cluster_id in the config (`shoal cluster init` prints it)",
        )?)
        .map_err(|_| "cluster_id must be 32 hex digits")?;
        let admin =
            AdminPublic::from_hex(file.admin_key.as_deref().ok_or(
                "no admin key: set admin_key in the config (`shoal cluster init` prints it)",
            )?)
            .map_err(|_| "admin_key must be 64 hex digits")?;
        let name = file.name.unwrap_or_else(|| addr.to_string());
        if name.is_empty() || name.len() > shoal_wire::MAX_NAME_BYTES {
            return Err(format!(
                "node name must be 1 to {} bytes",
                shoal_wire::MAX_NAME_BYTES
            ));
        }
        let frag_bytes = file.frag_bytes.unwrap_or(60_000);
        if !(512..=shoal_wire::MAX_DATAGRAM - 128).contains(&frag_bytes) {
            return Err(format!(
                "frag_bytes must be between 512 and {}",
                shoal_wire::MAX_DATAGRAM - 128
            ));
        }
        Ok(NodeConfig {
            socket: file.socket.unwrap_or_else(|| state_dir.join("node.sock")),
            cert_file: file
                .cert_file
                .unwrap_or_else(|| state_dir.join(crate::identity::NODE_CERT)),
            cluster,
            admin,
            name,
            bind: file.bind.unwrap_or(addr),
            addr,
            broadcast: file.broadcast,
            seeds: file.seeds.unwrap_or_default(),
            key_file,
            metrics: file.metrics,
            frag_bytes,
            owner_detect: file.owner_detect.unwrap_or(true),
            remote_root: file.remote_root.unwrap_or_default(),
            socket_group: file.socket_group,
            state_dir,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file_and_defaults_fill_the_rest() {
        let file: NodeConfigFile = toml::from_str(
            r#"
            name = "a"
            state_dir = "/tmp/a"
            addr = "127.0.0.1:7701"
            key_file = "/tmp/key"
            cluster_id = "00112233445566778899aabbccddeeff"
            admin_key = "0011223344556677889900112233445566778899001122334455667788990011"
            "#,
        )
        .unwrap();
        let flags = NodeConfigFile {
            name: Some("b".into()),
            ..Default::default()
        };
        let c = NodeConfig::resolve(file.merge(flags)).unwrap();
        assert_eq!(c.name, "b");
        assert_eq!(c.bind, c.addr);
        assert_eq!(c.socket, PathBuf::from("/tmp/a/node.sock"));
        assert_eq!(c.cert_file, PathBuf::from("/tmp/a/node.cert"));
        assert_eq!(c.remote_root, RemoteRoot::Squash);
        let allow: NodeConfigFile = toml::from_str("remote_root = 'allow'").unwrap();
        assert_eq!(allow.remote_root, Some(RemoteRoot::Allow));
        assert!(toml::from_str::<NodeConfigFile>("remote_root = 'yes'").is_err());
    }

    #[test]
    fn unknown_keys_and_missing_fields_are_clear_errors() {
        assert!(toml::from_str::<NodeConfigFile>("nmae = 'x'").is_err());
        let e = NodeConfig::resolve(NodeConfigFile::default()).unwrap_err();
        assert!(e.contains("state"), "{e}");
    }
}
