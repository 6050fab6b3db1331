//! The names of the cluster's nodes, as their certificates give them and
//! their heartbeats (in node sessions) carry them: what this node shows a
//! process id with (`n1.42`, as `shoal ps` prints it and every tool
//! takes it), not its home's node id.
//!
//! One entry per node that reached this one through a session (a node
//! speaks only for its own id), so the table is as large as the cluster.

use std::collections::HashMap;

use parking_lot::RwLock;
use shoal_pool::ProcId;
use shoal_wire::NodeId;

pub(crate) struct Names(RwLock<HashMap<NodeId, String>>);

impl Names {
    /// The table, knowing this node's own name.
    pub(crate) fn new(me: NodeId, name: &str) -> Names {
        Names(RwLock::new(HashMap::from([(me, name.to_string())])))
    }

    /// Node `node` is called `name`.
    pub(crate) fn learn(&self, node: NodeId, name: &str) {
        if self.0.read().get(&node).is_some_and(|n| n == name) {
            return;
        }
        self.0.write().insert(node, name.to_string());
    }

    /// Process `id` as people see it: its home's name and its number, or
    /// the home's node id if this node has not heard its name.
    pub(crate) fn show(&self, id: ProcId) -> String {
        id.named(self.0.read().get(&id.home).map(String::as_str))
    }
}
