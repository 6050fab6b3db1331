//! Which nodes may serve a system port, as the local node's service map
//! says (`docs/security.md`, "Which nodes serve the system"): what a
//! replicated service asks before it takes a caller as its peer.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use shoal_cap::PutPort;
use shoal_wire::NodeId;

use crate::context::Context;

/// How long an answer of the node is used before it is asked again: a new
/// map takes effect within this.
const REFRESH: Duration = Duration::from_secs(2);

/// The servers of one system port, asked of the local node and kept for
/// [`REFRESH`].
pub struct ServedBy {
    ctx: Context,
    port: PutPort,
    /// When the node last answered, and its answer.
    last: Mutex<Option<(Instant, Option<Vec<NodeId>>)>>,
}

impl ServedBy {
    pub fn new(ctx: &Context, port: PutPort) -> ServedBy {
        ServedBy {
            ctx: ctx.clone(),
            port,
            last: Mutex::new(None),
        }
    }

    /// Whether `node` may serve the port: the map does not name the port,
    /// or names `node`.  While the node cannot be asked, its last answer
    /// holds; if it never answered, no node may.
    pub fn admits(&self, node: NodeId) -> bool {
        let mut last = self.last.lock();
        if last.as_ref().is_none_or(|(at, _)| at.elapsed() >= REFRESH) {
            match self.ctx.servers(&self.port) {
                Ok(servers) => *last = Some((Instant::now(), servers)),
                Err(e) => tracing::warn!(port = %self.port, "cannot ask the node who serves: {e}"),
            }
        }
        match last.as_ref() {
            Some((_, None)) => true,
            Some((_, Some(servers))) => servers.contains(&node),
            None => false,
        }
    }
}
