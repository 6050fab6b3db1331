//! Revocation lists reach every node (`docs/security.md`, "Admission and
//! revocation"): the administrator hands one to any node
//! (`shoal node revoke`), and nodes tell each other the version they hold
//! inside their sessions; a node whose peer holds an older one sends it the
//! list.  A list is taken only if the admin key signed it for this cluster
//! and it is newer: then the sessions with the nodes it names end, and it
//! is kept in the state directory for the next start.

use std::sync::atomic::Ordering;

use shoal_session::RevocationList;

use crate::daemon::Shared;

/// Takes the signed list `bytes` if it is valid and newer than the one
/// held; says why not otherwise.
pub(crate) fn take(shared: &Shared, bytes: &[u8]) -> Result<(), String> {
    let trust = &shared.identity.trust;
    let list = RevocationList::verify(bytes, trust.cluster, &trust.admin)
        .map_err(|e| format!("not a revocation list of this cluster: {e}"))?;
    // Held throughout, so two lists arriving at once (from the link and
    // from a peer) are taken one after the other, never interleaved.
    // Lock order: `revocations`, then `sessions`.
    let mut held = shared.revocations.lock();
    let version = held.as_ref().map_or(0, |(v, _)| *v);
    if !shoal_node::gossip::newer(Some(version), list.version) {
        return Err(format!(
            "this node holds revocation list version {version} already (given {})",
            list.version
        ));
    }
    let (version, revoked) = (list.version, list.serials.len());
    if !shared.sessions.lock().revoke(list) {
        return Err("the sessions hold a newer revocation list".into());
    }
    crate::identity::store_revoked(&shared.config.state_dir, bytes)?;
    *held = Some((version, bytes.to_vec()));
    drop(held);
    shared.announce.store(true, Ordering::Release);
    tracing::warn!(version, revoked, "revocation list taken");
    Ok(())
}
