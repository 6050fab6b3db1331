//! shoal's group communication core: reliable, totally ordered broadcast
//! with a resilience degree, after Kaashoek's sequencer protocol as Amoeba
//! shipped it.  A state machine without I/O, like the RPC cores in
//! `shoal-proto`: datagrams, timer expiries and application calls go in
//! with the current time; datagrams to send, the next timer and events for
//! the application come out.
//!
//! ```text
//!  PB (small messages):  sender ──Data──▶ sequencer ══Order══▶ all
//!  BB (large messages):  sender ══Data══▶ all;  sequencer ══Order(accept)══▶ all
//!  resilience r > 0:     sequencer ══Order(tentative)══▶ all
//!                        r members ──Ack──▶ sequencer ══Sync(commit)══▶ all
//!  (──▶ one datagram, ══▶ one broadcast: IP multicast, or one per member)
//! ```
//!
//! - Every entry carries a sequence number; a member that sees a gap asks
//!   the sequencer (`Nack`), which retransmits from its history.  Every
//!   datagram a member sends carries how far it holds the stream, so the
//!   sequencer knows what every member has and purges it; when the history
//!   fills, or the group is quiet, it asks silent members (`Sync` with
//!   `want_status`).
//! - A message is delivered once committed: at once with r = 0; with
//!   r > 0 once r members besides the sequencer hold it (and everything
//!   before it).
//! - Joins, leaves and resets are entries of the stream, so every member
//!   sees the same membership at the same point.
//! - When the sequencer or a member is lost, a survivor coordinates a reset
//!   (`recovery.rs`): the members vote, the best log wins, the coordinator
//!   becomes the new sequencer of a new incarnation.
//! - Memory is bounded: the sequencer's history by `history_bytes` (a member
//!   that holds it back is expelled), each member's log by twice that, each
//!   sender's in-flight messages by a window.
//!
//! - A group's datagrams are sealed under keys its members hand each
//!   other (`keys.rs`: who gets the next epoch's key, and when; `seal.rs`:
//!   each datagram sealed and opened in the epochs a member holds).
//!
//! The guarantees and how they are tested: `docs/group.md`.

mod assembly;
mod config;
mod core;
mod event;
mod join;
pub mod keys;
mod parts;
mod recovery;
pub mod seal;
mod sequencer;
mod stream;

pub use crate::config::GroupConfig;
pub use crate::core::{GroupCore, GroupDest, GroupInfo, GroupStats, GroupTransmit, Status};
pub use crate::event::{Event, SendError};
pub use assembly::{frag_count, frag_range};
pub use shoal_wire::group::MemberEntry;
pub use shoal_wire::{GroupSeq, Incarnation, MemberId, MsgId};
