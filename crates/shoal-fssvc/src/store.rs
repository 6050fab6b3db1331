//! Storing a file's bytes as a content version, as the primary does for
//! an overlay and a mount does for its write-backs: on the first `copies`
//! file servers that take them, starting from a place that moves with the
//! inode (so versions spread over the servers).

use shoal_cap::Capability;
use shoal_filesvc::{ClientError, FileClient};
use shoal_fs::model::Ino;

/// Stores `bytes` for inode `ino` on `copies` of `servers`; with
/// `safety`, each copy is on its server's disk first.  Fewer copies than
/// asked is an error, and the copies made are destroyed.
pub fn store(
    files: &mut FileClient,
    servers: &[Capability],
    copies: usize,
    ino: Ino,
    bytes: &[u8],
    safety: bool,
) -> Result<Vec<Capability>, ClientError> {
    if servers.is_empty() {
        return Err(ClientError::Local(
            "no file servers are configured for file contents".into(),
        ));
    }
    let n = servers.len();
    let mut content = Vec::new();
    let mut errors = Vec::new();
    for k in 0..n {
        if content.len() == copies {
            break;
        }
        let server = servers[(ino as usize + k) % n];
        match files.create(&server, bytes, safety) {
            Ok(c) => content.push(c),
            Err(e) => errors.push(e.to_string()),
        }
    }
    if content.len() < copies {
        for c in &content {
            let _ = files.destroy(c);
        }
        return Err(ClientError::Local(format!(
            "{} of {copies} copies of a file's contents stored: {}",
            content.len(),
            errors.join("; ")
        )));
    }
    Ok(content)
}
