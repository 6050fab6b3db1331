//! Node configuration: a TOML file, overridden by command-line flags.

use std::collections::BTreeMap;
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
    /// File holding an old shared cluster key (64 hex characters), only
    /// to count heartbeats forged under it; nodes need none.
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
    /// The link socket (default: `STATE_DIR/node.sock`), in a directory
    /// nobody but root (or the node's own user) may write.
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
    /// Who besides the daemon may serve system ports (default
    /// `services`: the services configured with `system = true`; `root`:
    /// also root's programs, as local clusters allow).
    pub system_ports: Option<SystemPorts>,
    /// The services the daemon keeps running (`[[service]]` tables;
    /// `docs/services.md`).
    #[serde(default, rename = "service", skip_serializing_if = "Option::is_none")]
    pub services: Option<Vec<ServiceConfig>>,
}

/// Who besides the daemon may serve system ports (`docs/services.md`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SystemPorts {
    /// The services configured with `system = true`.
    #[default]
    Services,
    /// Those, and root's programs (local clusters, whose tests and
    /// benchmarks start servers by hand and whose nodes share one root).
    Root,
}

/// One service the node daemon keeps running: a `[[service]]` table.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// Unique on the node: `a-z`, `0-9` and `-`, 1 to 32 bytes.
    pub name: String,
    /// The program and its arguments; a program without a slash is looked
    /// up beside the daemon's own binary first, then on `PATH`.
    pub command: Vec<String>,
    /// The account it runs as (default: the daemon's, root for an
    /// installed node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Whether it may serve system ports.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub system: bool,
    /// Added to its otherwise clean environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub restart: shoal_node::supervise::Restart,
    /// Seconds between SIGTERM and SIGKILL when it is stopped.
    #[serde(default = "default_stop_timeout")]
    pub stop_timeout_s: u64,
    /// Its log is rotated when it reaches this many bytes ...
    #[serde(default = "default_log_bytes")]
    pub log_bytes: u64,
    /// ... and this many old logs are kept.
    #[serde(default = "default_log_keep")]
    pub log_keep: u32,
}

fn default_stop_timeout() -> u64 {
    10
}

fn default_log_bytes() -> u64 {
    8 << 20
}

fn default_log_keep() -> u32 {
    4
}

impl ServiceConfig {
    /// A service of `name` running `command` as root, every other field
    /// its default.
    pub fn new(name: &str, command: &[&str]) -> ServiceConfig {
        ServiceConfig {
            name: name.to_string(),
            command: command.iter().map(|s| s.to_string()).collect(),
            user: None,
            system: false,
            env: BTreeMap::new(),
            restart: Default::default(),
            stop_timeout_s: default_stop_timeout(),
            log_bytes: default_log_bytes(),
            log_keep: default_log_keep(),
        }
    }

    /// The supervisor's policy for it.
    pub fn policy(&self) -> shoal_node::supervise::Policy {
        shoal_node::supervise::Policy {
            restart: self.restart,
            stop_timeout: std::time::Duration::from_secs(self.stop_timeout_s),
        }
    }
}

/// Whether a service name is well formed.
pub fn valid_service_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Checks a node's services: one-line errors naming the service and field.
pub fn check_services(services: &[ServiceConfig]) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for s in services {
        if !valid_service_name(&s.name) {
            return Err(format!(
                "service {:?}: name must be 1 to 32 of a-z, 0-9 and -",
                s.name
            ));
        }
        if !seen.insert(&s.name) {
            return Err(format!("service {}: named twice", s.name));
        }
        let bad = |field: &str, why: &str| Err(format!("service {}: {field} {why}", s.name));
        if s.command.is_empty() || s.command[0].is_empty() {
            return bad("command", "must name a program");
        }
        if s.command
            .iter()
            .chain(s.env.values())
            .any(|a| a.contains('\0'))
        {
            return bad("command", "must not contain NUL");
        }
        if s.env
            .keys()
            .any(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
        {
            return bad("env", "names must be non-empty, without = or NUL");
        }
        if s.user.as_deref().is_some_and(str::is_empty) {
            return bad("user", "must not be empty");
        }
        if !(1..=300).contains(&s.stop_timeout_s) {
            return bad("stop_timeout_s", "must be between 1 and 300");
        }
        if s.log_bytes < 64 << 10 {
            return bad("log_bytes", "must be at least 65536");
        }
        if !(1..=32).contains(&s.log_keep) {
            return bad("log_keep", "must be between 1 and 32");
        }
    }
    Ok(())
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

    /// Writes the configuration to `path` (0644: it holds no secret, and
    /// only its owner may change it).
    pub fn save(&self, path: &Path) -> Result<(), String> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let text = toml::to_string(self).map_err(|e| format!("config: {e}"))?;
        let tmp = path.with_extension("toml.new");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)
            .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        f.write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, path).map_err(|e| format!("cannot write {}: {e}", path.display()))
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
            system_ports: over.system_ports.or(self.system_ports),
            services: over.services.or(self.services),
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
    pub key_file: Option<PathBuf>,
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
    pub system_ports: SystemPorts,
    /// The services the daemon keeps running.
    pub services: Vec<ServiceConfig>,
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
        let services = file.services.unwrap_or_default();
        check_services(&services)?;
        Ok(NodeConfig {
            system_ports: file.system_ports.unwrap_or_default(),
            services,
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
            key_file: file.key_file,
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

    #[test]
    fn services_are_tables_checked_field_by_field() {
        let file: NodeConfigFile = toml::from_str(
            r#"
            [[service]]
            name = "dir-r0"
            command = ["shoal", "dir", "serve"]
            system = true
            restart = "on-failure"
            env = { SHOAL_LOG = "info" }

            [[service]]
            name = "echo"
            command = ["sh", "-c", "echo hi"]
            user = "nobody"
            "#,
        )
        .unwrap();
        let services = file.services.unwrap();
        assert_eq!(services.len(), 2);
        assert_eq!(
            services[0].restart,
            shoal_node::supervise::Restart::OnFailure
        );
        assert!(services[0].system && !services[1].system);
        assert_eq!(services[1].stop_timeout_s, 10);
        check_services(&services).unwrap();
        let mut twice = services.clone();
        twice[1].name = "dir-r0".into();
        assert!(check_services(&twice).unwrap_err().contains("twice"));
        let mut bad = services.clone();
        bad[0].name = "Dir".into();
        assert!(check_services(&bad).unwrap_err().contains("name"));
        let mut bad = services.clone();
        bad[1].command.clear();
        assert!(check_services(&bad).unwrap_err().contains("echo: command"));
        let mut bad = services;
        bad[1].stop_timeout_s = 0;
        assert!(check_services(&bad).unwrap_err().contains("stop_timeout_s"));
        assert!(
            toml::from_str::<NodeConfigFile>(
                "[[service]]\nname = 'a'\ncommand = ['x']\nrestrat = 'never'"
            )
            .is_err()
        );
        // Written back, the tables survive (`shoal cluster up` writes them).
        let file = NodeConfigFile {
            services: Some(vec![ServiceConfig::new(
                "file",
                &["shoal", "file", "serve"],
            )]),
            ..Default::default()
        };
        let text = toml::to_string(&file).unwrap();
        assert_eq!(toml::from_str::<NodeConfigFile>(&text).unwrap(), file);
    }
}
