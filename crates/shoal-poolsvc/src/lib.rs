//! shoal's processor pool for programs (`docs/pool.md`): run a program on
//! a node of the pool as if it ran here.  The program's home (this
//! program's node) numbers it and chooses its node ([`spawn`]); the
//! program gets this process's arguments, environment, working
//! directory, user, groups, umask, resource limits and host name
//! ([`settings`]); [`supervise`] starts it there and follows it to its
//! end, on another node after a lost one while retries allow, its output
//! going to a [`Sink`]; signals and input are passed on
//! ([`start_helpers`], [`copy_input`]).  `shoal run` and `shoal make` are
//! built on it, and so will migration be.
//!
//! **Architecture invariant:** the client side only: the exec service
//! that runs programs is the daemon's (`shoal-nodesvc`), the messages
//! and the decisions are `shoal-pool`'s.

mod run;
pub mod settings;
mod terminal;

pub use run::*;
