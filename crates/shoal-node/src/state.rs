//! The node's state directory (private: `crate::private`): its
//! persistent identity, written durably.

use std::path::Path;

use shoal_wire::NodeId;

/// Reads the node id from `dir/node.id`, creating it on first start.
pub fn node_id(dir: &Path) -> Result<NodeId, String> {
    shoal_rpc::private::dir(dir, true)?;
    let path = dir.join("node.id");
    match std::fs::read_to_string(&path) {
        Ok(text) => u64::from_str_radix(text.trim(), 16)
            .map(NodeId)
            .map_err(|_| format!("{} is corrupt: expected 16 hex digits", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = NodeId::random();
            shoal_rpc::private::write(&path, format!("{id}\n").as_bytes())?;
            Ok(id)
        }
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn identity_survives_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let a = super::node_id(dir.path()).unwrap();
        let b = super::node_id(dir.path()).unwrap();
        assert_eq!(a, b);
        std::fs::write(dir.path().join("node.id"), "zz").unwrap();
        assert!(super::node_id(dir.path()).is_err());
    }
}
