//! The node's state directory: its persistent identity.

use std::path::Path;

use shoal_wire::NodeId;

/// Reads the node id from `dir/node.id`, creating it on first start.
pub fn node_id(dir: &Path) -> Result<NodeId, String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create state directory {}: {e}", dir.display()))?;
    let path = dir.join("node.id");
    match std::fs::read_to_string(&path) {
        Ok(text) => u64::from_str_radix(text.trim(), 16)
            .map(NodeId)
            .map_err(|_| format!("{} is corrupt: expected 16 hex digits", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = NodeId::random();
            let tmp = dir.join("node.id.tmp");
            std::fs::write(&tmp, format!("{id}\n"))
                .and_then(|()| std::fs::rename(&tmp, &path))
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
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
