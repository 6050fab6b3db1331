//! The shoal node daemon, one per machine.
//!
//! ```text
//!            programs on this machine                 other nodes
//!   ┌──────────────┐  ┌──────────────┐
//!   │ client (lib) │  │ server (lib) │               ┌───────────┐
//!   └──────┬───────┘  └──┬────────┬──┘               │  daemon   │
//!          │ hello       │register│  RPC datagrams   └─────┬─────┘
//!          ▼             ▼        └──────────────────────── │ ─ ─ ▶ clients
//!   ┌────────────────────────────┐  locate, heartbeats      │
//!   │ link (Unix socket, JSON)   │◀────── UDP ─────────────▶│
//!   │ registry │ membership      │
//!   │ node service (RPC: status) │   metrics (HTTP, Prometheus text)
//!   └────────────────────────────┘
//! ```
//!
//! The daemon is not on the RPC data path: clients and servers exchange
//! datagrams directly.  It answers locate questions from its registry,
//! keeps the membership view, gives each program (known from the kernel)
//! the keys of its channels over the link socket, serves its own status over shoal RPC (it is a client of its
//! own link, like any server), and exports counters for Prometheus.  For
//! the processor pool it is a home (it numbers the processes started on
//! this machine, places them and answers for them: `home`) and an exec
//! service (it runs the programs homes place here: `exec`; the programs
//! that start them use `shoal-poolsvc`).  `fdpass` carries messages with
//! file descriptors attached.

pub mod account;
mod config;
mod credentials;
mod daemon;
pub mod exec;
pub mod fdpass;
mod home;
pub mod identity;
mod link_server;
mod load;
mod locate;
mod metrics;
mod names;
pub mod procfs;
mod revocation;
pub mod service;
mod service_log;
mod service_map;
mod spawn;
mod supervise_io;

pub use config::{
    NodeConfig, NodeConfigFile, RemoteRoot, ServiceConfig, SystemPorts, check_services,
};
pub use daemon::{Daemon, run};
pub use service::{
    HomedProc, MemberLoad, MemberStatus, NodeRequest, NodeStatus, ProcAnswer, RunningProc,
    ServiceAction, ServiceAnswer, ServiceStatus, ask, node_port,
};
