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
    let held = shared.revocations.lock().as_ref().map_or(0, |(v, _)| *v);
    if list.version <= held {
        return Err(format!(
            "this node holds revocation list version {held} already (given {})",
            list.version
        ));
    }
    let version = list.version;
    let revoked = list.serials.len();
    shared.sessions.lock().revoke(list);
    crate::identity::store_revoked(&shared.config.state_dir, bytes)?;
    *shared.revocations.lock() = Some((version, bytes.to_vec()));
    shared.announce.store(true, Ordering::Release);
    tracing::warn!(version, revoked, "revocation list taken");
    Ok(())
}
