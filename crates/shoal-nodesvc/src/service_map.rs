//! The service map reaches every node as revocation lists do
//! (`docs/security.md`, "Which nodes serve the system"): the
//! administrator hands it to any node (`shoal node services`), and nodes
//! tell each other the version they hold inside their sessions; a node
//! whose peer holds an older one sends it the map.  A map is taken only
//! if the admin key signed it for this cluster and it is newer; it is
//! kept in the state directory for the next start.
//!
//! Where the map names a system port's servers, this node keeps only
//! their answers to a locate of it ([`crate::locate`]), registers it here
//! only if it is one of them, and tells the programs that ask
//! ([`servers`]) so that replicas take peers only from them.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;

use shoal_cap::PutPort;
use shoal_session::ServiceMap;
use shoal_wire::NodeId;

use crate::daemon::Shared;

/// Where a node keeps the newest map it verified (hex).
pub const SERVICE_MAP: &str = "service-map";

/// The map a node holds: its version, signed bytes, and each named
/// port's servers.
#[derive(Debug, Clone)]
pub struct Held {
    pub version: u64,
    pub bytes: Vec<u8>,
    by_port: HashMap<PutPort, Vec<NodeId>>,
}

impl Held {
    fn of(map: &ServiceMap, bytes: Vec<u8>, cluster: &[u8; 16]) -> Held {
        let by_port = map
            .entries
            .iter()
            .map(|e| {
                let port = shoal_rpc::system_port(cluster, &e.name).put_port();
                (port, e.nodes.iter().map(|&n| NodeId(n)).collect())
            })
            .collect();
        Held {
            version: map.version,
            bytes,
            by_port,
        }
    }

    /// The nodes that may serve `port`, if the map names it.
    pub fn servers(&self, port: &PutPort) -> Option<&[NodeId]> {
        self.by_port.get(port).map(Vec::as_slice)
    }
}

/// The map kept in `state_dir`, if any, checked again.
pub(crate) fn load(state_dir: &Path, trust: &shoal_session::Trust) -> Result<Option<Held>, String> {
    let path = state_dir.join(SERVICE_MAP);
    if !path.exists() {
        return Ok(None);
    }
    let bytes = crate::identity::read_hex(&path)?;
    let map = ServiceMap::verify(&bytes, trust.cluster, &trust.admin)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Some(Held::of(&map, bytes, &trust.cluster.0)))
}

/// Takes the signed map `bytes` if it is valid and newer than the one
/// held; says why not otherwise.
pub(crate) fn take(shared: &Shared, bytes: &[u8]) -> Result<(), String> {
    let trust = &shared.identity.trust;
    let map = ServiceMap::verify(bytes, trust.cluster, &trust.admin)
        .map_err(|e| format!("not a service map of this cluster: {e}"))?;
    let mut held = shared.service_map.lock();
    let version = held.as_ref().map_or(0, |h| h.version);
    if !shoal_node::gossip::newer(Some(version), map.version) {
        return Err(format!(
            "this node holds service map version {version} already (given {})",
            map.version
        ));
    }
    shoal_rpc::secrets::write(
        &shared.config.state_dir.join(SERVICE_MAP),
        format!("{}\n", hex::encode(bytes)).as_bytes(),
    )?;
    *held = Some(Held::of(&map, bytes.to_vec(), &trust.cluster.0));
    drop(held);
    shared.announce.store(true, Ordering::Release);
    tracing::warn!(
        version = map.version,
        services = map.entries.len(),
        "service map taken"
    );
    Ok(())
}

/// The nodes the map names for `port`, if it names it.
pub(crate) fn servers(shared: &Shared, port: &PutPort) -> Option<Vec<NodeId>> {
    shared
        .service_map
        .lock()
        .as_ref()?
        .servers(port)
        .map(<[NodeId]>::to_vec)
}

/// The version of the map held (0: none).
pub(crate) fn version(shared: &Shared) -> u64 {
    shared.service_map.lock().as_ref().map_or(0, |h| h.version)
}
