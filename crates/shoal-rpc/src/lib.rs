//! shoal's user-level RPC, for programs and daemons alike.
//!
//! A server holds a secret [`GetPort`] and serves its public [`PutPort`]
//! (the node computes one from the other, so only the holder of the
//! get-port can serve); a client calls the put-port and never needs to know
//! where the server runs: the library locates it (broadcast on the cluster
//! network, or by asking every node), caches the answer, and finds the
//! server again if it moves.  Requests and replies are byte strings of any
//! size.  A request runs at most once, whatever the network loses or
//! duplicates and whatever crashes; when the library cannot know whether a
//! request ran, it says so ([`TransError`]).
//!
//! ```no_run
//! use shoal_rpc::{Context, GetPort};
//!
//! # fn main() -> Result<(), shoal_rpc::Error> {
//! let ctx = Context::from_env()?;            // attach to this machine's node
//! let get = GetPort::random();
//! let server = ctx.serve(get)?;               // register the port
//! std::thread::spawn(move || loop {
//!     let req = server.getreq().unwrap();     // next request
//!     let reply = req.body().to_ascii_uppercase();
//!     server.putrep(&req, reply).unwrap();    // its reply
//! });
//! let mut client = ctx.client()?;
//! let reply = client.trans(&get.put_port(), b"hello".to_vec())?;
//! assert_eq!(reply, b"HELLO");
//! # Ok(()) }
//! ```
//!
//! Each call to [`Client::trans`] runs on the calling thread, on the
//! client's own sockets: there is no hidden I/O thread, so a call costs one
//! wake-up, as a plain UDP exchange does.  A [`Server`] may be shared by any
//! number of threads calling [`Server::getreq`]; whichever thread is
//! reading the socket when a request completes takes it.
//!
//! **Architecture invariant:** this crate is an I/O shell around the
//! protocol cores of `shoal-proto`; it decides nothing about the protocol.

mod client;
pub mod clock;
mod context;
mod error;
mod keys;
pub mod link;
pub mod secrets;
pub mod served_by;
mod server;
pub mod service;
pub mod socket;
pub mod spin;

pub use client::{CallOptions, CancelToken, Client};
pub use context::{Context, ContextConfig, DEFAULT_SPIN, HomeLink};
pub use error::Error;
pub use server::{Request, Server};
pub use service::{Service, system_port};
pub use shoal_cap::{GetPort, PutPort};
pub use shoal_proto::{Caller, Rope, TransError};

/// Hands a reply buffer you are done with back to shoal, so the next large
/// body reuses its memory instead of faulting in fresh pages.  Optional.
pub fn recycle(buffer: Vec<u8>) {
    shoal_proto::pool::give(buffer);
}

/// An empty buffer with room for `capacity` bytes, reusing a recycled one
/// if there is one: build a large request or reply in it to skip the page
/// faults of fresh memory.
pub fn buffer(capacity: usize) -> Vec<u8> {
    shoal_proto::pool::with_capacity(capacity)
}

/// Where programs find their node when `SHOAL_NODE` is not set.
pub const DEFAULT_NODE_SOCKET: &str = "/run/shoal/node.sock";
