//! The node service: each daemon serves its status over shoal RPC, on a
//! port derived from the cluster key and the node's name, so anyone holding
//! the key can ask any node by name.
//!
//! Requests and replies are JSON: `{"op":"status"}` → [`NodeStatus`];
//! the processor pool's requests (`procs`, `kill`, `wait`) → a
//! [`ProcAnswer`].  A node answers `kill` and `wait` for the processes it
//! is the home of: they go through the home, wherever the process runs.

use serde::{Deserialize, Serialize};
use shoal_rpc::link::ProcEnd;

/// Node `name`'s service, a system service of cluster `cluster`: anyone
/// can call it, only that node's daemon can serve it.
pub fn node_port(cluster: &[u8; 16], name: &str) -> shoal_rpc::Service {
    shoal_rpc::system_port(cluster, &format!("node {name}"))
}

/// A request to the node service.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum NodeRequest {
    Status,
    /// The processes this node is the home of (the running ones, and with
    /// `ended` the ended ones it remembers) and those running here.
    Procs {
        #[serde(default)]
        ended: bool,
    },
    /// Deliver `signal` to process `id`, of which this node is the home.
    Kill {
        id: String,
        signal: i32,
    },
    /// How process `id` (this node its home) ended, waiting up to
    /// `wait_ms` for its end.
    Wait {
        id: String,
        wait_ms: u32,
    },
    /// The services this node's daemon keeps (anyone may ask).
    Services,
    /// Start, stop or restart service `name` (root's).
    ServiceCtl {
        name: String,
        action: ServiceAction,
    },
    /// Service `name`'s log: its last `lines` lines, or with `from` what
    /// was written since that position (root's and the service user's).
    ServiceLogs {
        name: String,
        #[serde(default)]
        lines: u32,
        #[serde(default)]
        from: Option<u64>,
    },
}

/// What an operator asks of a service.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ServiceAction {
    Start,
    Stop,
    Restart,
}

/// The answer to the service requests.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum ServiceAnswer {
    Services {
        services: Vec<ServiceStatus>,
    },
    Done,
    /// Log text (whole lines) and the log's position after it.
    Logs {
        text: String,
        end: u64,
    },
    Error {
        message: String,
    },
}

/// A service as `shoal service ls` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ServiceStatus {
    pub name: String,
    /// `running`, `starting`, `backoff`, `stopping` or `stopped`.
    pub state: String,
    /// The running program's pid on its node.
    pub pid: Option<u32>,
    pub user: String,
    /// Whether it may serve system ports.
    pub system: bool,
    /// The program (not its arguments, which may hold secrets).
    pub command: String,
    /// How many times it was started.
    pub starts: u64,
    /// How it last ended.
    pub last_exit: Option<String>,
    /// Why its last start failed, if it did.
    pub error: Option<String>,
    /// Running: seconds since it started; in back-off: seconds until
    /// the next start.
    pub for_s: Option<f64>,
    /// Ends by kind (`exited`, `failed`, `killed`).
    #[serde(default)]
    pub exits: std::collections::BTreeMap<String, u64>,
}

/// The answer to the processor pool's requests.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum ProcAnswer {
    Procs {
        homed: Vec<HomedProc>,
        running: Vec<RunningProc>,
    },
    Done,
    /// The process's end, or none yet.
    Waited {
        end: Option<ProcEnd>,
    },
    Error {
        message: String,
    },
}

/// A process as its home knows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HomedProc {
    pub id: String,
    pub command: String,
    /// The node it runs (or ran) on.
    pub node: String,
    /// Who started it (a uid of its home).
    #[serde(default)]
    pub uid: u32,
    /// Seconds since it started.
    pub age_s: f64,
    /// How it ended; none while it runs.
    pub end: Option<ProcEnd>,
}

/// A process as the node it runs on sees it: its process group's use.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunningProc {
    pub id: String,
    /// Its pid on this node.
    pub pid: u32,
    /// Processor time of its process group, seconds.
    pub cpu_s: f64,
    /// Resident memory of its process group, KiB.
    pub rss_kib: u64,
    /// Stopped (by SIGSTOP or SIGTSTP).
    pub stopped: bool,
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
    /// The cluster this node belongs to (hex id).
    #[serde(default)]
    pub cluster: String,
    /// Its certificate's serial.
    #[serde(default)]
    pub cert_serial: u64,
    /// The version of the newest revocation list it holds.
    #[serde(default)]
    pub revocations: u64,
    /// The version of the newest service map it holds (0: none).
    #[serde(default)]
    pub service_map: u64,
    /// The services its daemon keeps.
    #[serde(default)]
    pub services: Vec<ServiceStatus>,
}

/// Asks node `name`'s service `request`; its answer, decoded.
pub fn ask<T: serde::de::DeserializeOwned>(
    ctx: &shoal_rpc::Context,
    name: &str,
    request: &NodeRequest,
    deadline: std::time::Duration,
) -> Result<T, String> {
    let port = node_port(&ctx.config().cluster, name).put_port();
    let mut client = ctx.client().map_err(|e| e.to_string())?;
    let options = shoal_rpc::CallOptions {
        deadline: Some(deadline),
        cancel: None,
    };
    let body = serde_json::to_vec(request).expect("requests serialize");
    let reply = client
        .trans_with(&port, body, &options)
        .map_err(|e| e.to_string())?;
    serde_json::from_slice(&reply).map_err(|e| format!("unreadable answer from {name}: {e}"))
}
