//! The node service: each daemon serves its status over shoal RPC, on a
//! port derived from the cluster key and the node's name, so anyone holding
//! the key can ask any node by name.
//!
//! Requests and replies are JSON: `{"op":"status"}` → [`NodeStatus`].

use serde::{Deserialize, Serialize};
use shoal_cap::GetPort;
use shoal_wire::ClusterKey;

/// The get-port of node `name`'s service.
pub fn node_port(key: &ClusterKey, name: &str) -> GetPort {
    GetPort::derive(key.as_bytes(), &format!("shoal node service {name}"))
}

/// A request to the node service.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum NodeRequest {
    Status,
}

/// One member as a node sees it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MemberStatus {
    pub name: String,
    pub node: String,
    pub addr: String,
    pub alive: bool,
    /// Milliseconds since last heard, if ever.
    pub silent_ms: Option<u64>,
    /// Its last load report.
    #[serde(default)]
    pub load: Option<MemberLoad>,
}

/// A member's load, as it last reported it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MemberLoad {
    pub cores: u16,
    /// One-minute load average.
    pub run_queue: f64,
    /// Cores' worth of processor time used by programs not shoal's.
    pub foreign_cpu: f64,
    pub mem_free_mib: u32,
    pub shoal_procs: u32,
    pub owner_active: bool,
}

/// A node's answer to `status`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NodeStatus {
    pub name: String,
    pub node: String,
    pub addr: String,
    pub uptime_s: f64,
    /// Ports with at least one server endpoint on this node.
    pub ports: usize,
    /// Programs linked to the node right now.
    pub links: u64,
    pub members: Vec<MemberStatus>,
    pub counters: std::collections::BTreeMap<String, u64>,
}
