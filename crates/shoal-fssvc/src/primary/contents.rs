//! The tree's contents for the object manager (`docs/files.md`, "Garbage
//! collection"): no directory names them, so before it asks the file
//! servers to age their files, the manager has the primary touch every
//! content version the tree holds, a batch of inodes at a time.

use std::collections::BTreeMap;

use shoal_cap::{Capability, PutPort};
use shoal_fs::model::Ino;
use shoal_fs::op::{Failure, Reply, TOUCH_BATCH};
use shoal_fs::tree::Body;

use super::{Primary, Rep};

impl Primary {
    /// Touches the contents of the files among the [`TOUCH_BATCH`] inodes
    /// after `after`; fails if a file server holding some does not answer
    /// (then the manager must not age).
    pub(super) fn touch_contents(&self, r: &Rep, after: Ino) -> Result<Reply, Failure> {
        let (caps, next) = r.read(|m| {
            let mut caps: Vec<Capability> = Vec::new();
            let mut last = after;
            for (seen, i) in m.tree.inodes_after(after).enumerate() {
                if seen == TOUCH_BATCH {
                    return (caps, Some(last));
                }
                last = i.attr.ino;
                if let Body::File { content, .. } = &i.body {
                    caps.extend_from_slice(content);
                }
            }
            (caps, None)
        });
        let mut by_server: BTreeMap<PutPort, Vec<Capability>> = BTreeMap::new();
        for c in caps {
            by_server.entry(c.port()).or_default().push(c);
        }
        let (mut touched, mut missing) = (0, 0);
        for caps in by_server.values() {
            for had in self.with_files(|f| f.touch(caps))? {
                if had {
                    touched += 1;
                } else {
                    missing += 1;
                }
            }
        }
        if missing > 0 {
            tracing::warn!("{missing} contents of the tree are on no file server");
        }
        Ok(Reply::Touched {
            next,
            touched,
            missing,
        })
    }
}
