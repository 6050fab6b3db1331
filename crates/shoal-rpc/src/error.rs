//! Errors of the RPC library.

use std::io;
use std::path::PathBuf;

use shoal_proto::TransError;

/// Why an RPC library call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The transaction failed; see [`TransError`] for whether it ran.
    #[error(transparent)]
    Trans(#[from] TransError),
    /// The local node could not be reached.
    #[error("cannot reach the shoal node at {}: {source} (is `shoal node` running? set SHOAL_NODE to its socket)", path.display())]
    NoNode { path: PathBuf, source: io::Error },
    /// The node refused a request of this program.
    #[error("the node refused: {0}")]
    Node(String),
    /// The server was shut down.
    #[error("server endpoint is shut down")]
    Closed,
    /// A socket operation failed.  If it happened during a call, the
    /// request may or may not have run.
    #[error("network i/o failed: {0}")]
    Io(#[from] io::Error),
}
