//! shoal's protocol cores.
//!
//! Each core is a state machine without I/O, in the style of quinn-proto:
//! inputs go in through `handle_*` methods (a datagram with the time it
//! arrived, a timer that fired, a call from the application), outputs come
//! out through `poll_*` methods (datagrams to send, the next timer, results
//! for the application).  No core reads a clock, opens a socket or draws
//! randomness: time is an argument ([`Time`]), identifiers are given at
//! construction.  The same code therefore runs inside the node daemon and
//! the RPC library (`shoal-rpc`, `shoal-nodesvc`) and inside the deterministic
//! simulator (`shoal-sim`), where a seed fixes every event.
//!
//! ```text
//!   application            shell (sockets, clock)            core
//!   trans(port, body) ──▶  start(now, ...)            ──▶   ClientCore
//!                          poll_transmit() ─ send ◀───       │
//!      datagram ───────▶   handle_datagram(now, ..)   ──▶    │
//!                          poll_timeout() ─ sleep ◀───       │
//!   ◀─ result ──────────   poll_outcome()             ◀──────┘
//! ```
//!
//! - [`ClientCore`]: one client endpoint: locate, send a request in
//!   fragments, collect the reply, detect dead and restarted servers.
//! - [`ServerCore`]: one server endpoint: reassemble requests, filter
//!   duplicates (at-most-once), send replies in fragments.
//! - [`Registry`]: a node's answer to locate broadcasts.
//! - [`Membership`]: node liveness by heartbeats.

mod bitset;
mod body;
mod client;
mod error;
mod membership;
pub mod pool;
mod registry;
mod server;
mod stats;
mod transmit;

pub use body::{Incoming, Outgoing, Rope};
pub use client::{ClientConfig, ClientCore, Phase};
pub use error::TransError;
pub use membership::{MemberView, Membership, MembershipConfig};
pub use registry::{MAX_ENDPOINTS_PER_UID, Refusal, Registry};
pub use server::{Delivered, Replied, ServerConfig, ServerCore};
pub use shoal_time::Time;
pub use stats::Stats;
pub use transmit::{Caller, Dest, Transmit, Via};
