//! A node's identity and what it trusts, on disk (`docs/security.md`,
//! "Admission and revocation"), and the administrator's side: the admin
//! key that admits nodes and revokes them.
//!
//! ```text
//! STATE_DIR/node.key    the node's static X25519 key (hex, 0600), made at first
//!                       start; the node's id is derived from it
//! STATE_DIR/node.cert   its certificate, from the administrator (hex)
//! STATE_DIR/revoked     the newest revocation list this node verified (hex)
//! STATE_DIR/service-map the newest service map this node verified (hex)
//! ADMIN_DIR/admin.key   the admin key's seed (hex, 0600; the directory 0700)
//! ADMIN_DIR/cluster.id  the cluster id (hex)
//! ADMIN_DIR/admitted    one line per certificate: serial, name, key (hex)
//! ADMIN_DIR/revoked     the current revocation list (hex)
//! ADMIN_DIR/service-map the current service map (hex)
//! ```

use std::path::{Path, PathBuf};

use shoal_rpc::secrets;
use shoal_session::handshake::static_public;
use shoal_session::{
    AdminKey, AdminPublic, ClusterId, NodeCert, NodeIdentity, RevocationList, ServiceEntry,
    ServiceMap, Trust,
};

/// The node's static key file in its state directory.
pub const NODE_KEY: &str = "node.key";
/// The node's certificate, by default in its state directory.
pub const NODE_CERT: &str = "node.cert";
/// The newest revocation list, in the state directory.
pub const REVOKED: &str = "revoked";
/// The current service map (hex), in the admin directory.
const SERVICE_MAP: &str = "service-map";

/// How long a certificate is valid by default.
pub const CERT_DAYS: u64 = 365;

/// Unix seconds now.
pub fn wall() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The node's static private key, made (0600) on first use.
pub fn static_key(state_dir: &Path) -> Result<[u8; 32], String> {
    secrets::dir(state_dir, true)?;
    let path = state_dir.join(NODE_KEY);
    if path.exists() {
        let text = secrets::read(&path)?;
        return parse_hex32(&String::from_utf8_lossy(&text))
            .ok_or_else(|| format!("{} is corrupt: expected 64 hex digits", path.display()));
    }
    let key: [u8; 32] = rand::random();
    secrets::write(&path, format!("{}\n", hex::encode(key)).as_bytes())?;
    Ok(key)
}

/// The public half of the node's static key, which the administrator
/// admits (`shoal node key` prints it in hex).
pub fn static_public_key(state_dir: &Path) -> Result<[u8; 32], String> {
    Ok(static_public(&static_key(state_dir)?))
}

/// The node id of the node whose static public key is `public`: derived
/// from the key, so that no node can speak under another's id (a
/// heartbeat's id must be its session's), and kept as long as the key.
pub fn node_id(public: &[u8; 32]) -> shoal_wire::NodeId {
    let hash = blake3::derive_key("shoal 2026 node id", public);
    let id = u64::from_le_bytes(hash[..8].try_into().expect("8 bytes"));
    shoal_wire::NodeId(id.max(1))
}

/// A node's identity, checked, and what it trusts.
#[derive(Debug, Clone)]
pub struct Identity {
    pub me: NodeIdentity,
    pub trust: Trust,
}

/// Loads the identity of the node named `name` whose state is in
/// `state_dir` and certificate in `cert_file`, in the cluster `cluster`
/// under the admin key `admin`; checks it at `wall`.
pub fn load(
    name: &str,
    state_dir: &Path,
    cert_file: &Path,
    cluster: ClusterId,
    admin: AdminPublic,
    wall: u64,
) -> Result<Identity, String> {
    let private = static_key(state_dir)?;
    let revoked_path = state_dir.join(REVOKED);
    let revoked = if revoked_path.exists() {
        let bytes = read_hex(&revoked_path)?;
        RevocationList::verify(&bytes, cluster, &admin)
            .map_err(|e| format!("{}: {e}", revoked_path.display()))?
    } else {
        RevocationList::default()
    };
    let trust = Trust {
        cluster,
        admin,
        revoked,
    };
    if !cert_file.exists() {
        return Err(format!(
            "no node certificate at {}: print this node's key with `shoal node key`, have the \
             administrator run `shoal cluster admit {name} KEY`, and save what it prints there",
            cert_file.display()
        ));
    }
    let cert = read_hex(cert_file)?;
    let me = NodeIdentity::new(private, cert, &trust, wall)
        .map_err(|e| format!("{}: {e}", cert_file.display()))?;
    if me.cert().name != name {
        return Err(format!(
            "{} admits a node named {}, not {name}",
            cert_file.display(),
            me.cert().name
        ));
    }
    Ok(Identity { me, trust })
}

/// Stores a newer revocation list in `state_dir` (after the caller
/// verified it).
pub fn store_revoked(state_dir: &Path, bytes: &[u8]) -> Result<(), String> {
    secrets::write(
        &state_dir.join(REVOKED),
        format!("{}\n", hex::encode(bytes)).as_bytes(),
    )
}

/// The administrator's keys and records.
pub struct Admin {
    dir: PathBuf,
    key: AdminKey,
    cluster: ClusterId,
}

impl Admin {
    /// Makes a new admin key and cluster id in `dir` (private).  Refuses a
    /// directory that already holds an admin key.
    pub fn create(dir: &Path) -> Result<Admin, String> {
        secrets::dir(dir, false)?;
        let key_path = dir.join("admin.key");
        if key_path.exists() {
            return Err(format!(
                "{} exists already: this directory belongs to a cluster",
                key_path.display()
            ));
        }
        let key = AdminKey::from_seed(rand::random());
        let cluster = ClusterId(rand::random());
        secrets::write(
            &key_path,
            format!("{}\n", hex::encode(key.seed())).as_bytes(),
        )?;
        secrets::write(
            &dir.join("cluster.id"),
            format!("{}\n", cluster.to_hex()).as_bytes(),
        )?;
        Ok(Admin {
            dir: dir.to_path_buf(),
            key,
            cluster,
        })
    }

    /// Opens the admin key in `dir`.
    pub fn open(dir: &Path) -> Result<Admin, String> {
        secrets::dir(dir, false)?;
        let key_path = dir.join("admin.key");
        if !key_path.exists() {
            return Err(format!(
                "no admin key in {} (make one with `shoal cluster init`)",
                dir.display()
            ));
        }
        let seed = parse_hex32(&String::from_utf8_lossy(&secrets::read(&key_path)?))
            .ok_or_else(|| format!("{} is corrupt", key_path.display()))?;
        let id_path = dir.join("cluster.id");
        let cluster = ClusterId::from_hex(&String::from_utf8_lossy(&secrets::read(&id_path)?))
            .map_err(|e| format!("{}: {e}", id_path.display()))?;
        Ok(Admin {
            dir: dir.to_path_buf(),
            key: AdminKey::from_seed(seed),
            cluster,
        })
    }

    pub fn cluster(&self) -> ClusterId {
        self.cluster
    }

    pub fn public(&self) -> AdminPublic {
        self.key.public()
    }

    /// A certificate for node `name` with static public key `key`, valid
    /// from now for `days`; recorded in `admitted`.  A name admitted with
    /// another key and not revoked is refused: two nodes of one name would
    /// share its system ports.  The same key again is a renewal.
    pub fn admit(&self, name: &str, key: [u8; 32], days: u64) -> Result<Vec<u8>, String> {
        let revoked = self.revoked()?;
        let hex_key = hex::encode(key);
        for (serial, other, their_key) in self.admitted() {
            if other == name
                && !revoked.contains(&serial)
                && their_key.as_deref() != Some(hex_key.as_str())
            {
                return Err(format!(
                    "node {name} is admitted already with another key (serial {serial}); \
                     revoke it first (shoal cluster revoke {name})"
                ));
            }
        }
        let now = wall();
        let serial = loop {
            let s: u64 = rand::random();
            if s != 0 {
                break s;
            }
        };
        let cert = NodeCert {
            cluster: self.cluster,
            serial,
            // A little slack for clocks a few minutes apart.
            not_before: now.saturating_sub(600),
            not_after: now.saturating_add(days.saturating_mul(86_400)),
            static_key: key,
            name: name.to_string(),
        }
        .sign(&self.key)
        .map_err(|e| format!("cannot admit {name:?}: {e}"))?;
        let log = self.dir.join("admitted");
        let mut text = std::fs::read_to_string(&log).unwrap_or_default();
        text.push_str(&format!("{serial} {name} {hex_key}\n"));
        secrets::write(&log, text.as_bytes())?;
        Ok(cert)
    }

    /// Revokes every certificate issued to `name` (or with serial `name`):
    /// the new list, signed, also kept in `revoked`.
    pub fn revoke(&self, name: &str) -> Result<Vec<u8>, String> {
        let serials: Vec<u64> = self
            .admitted()
            .into_iter()
            .filter(|(s, n, _)| n == name || s.to_string() == name)
            .map(|(s, _, _)| s)
            .collect();
        if serials.is_empty() {
            return Err(format!(
                "no node {name} was admitted from {}",
                self.dir.display()
            ));
        }
        let path = self.dir.join(REVOKED);
        let mut list = self.revocations()?;
        list.version += 1;
        list.issued = wall();
        list.serials.extend(serials);
        let bytes = list
            .sign(self.cluster, &self.key)
            .map_err(|e| e.to_string())?;
        secrets::write(&path, format!("{}\n", hex::encode(&bytes)).as_bytes())?;
        Ok(bytes)
    }

    /// A new service map (`docs/security.md`, "Which nodes serve the
    /// system"): each system service named with the nodes that serve it,
    /// by the names they were admitted under; signed with the next
    /// version, and kept in `service-map`.  A node admitted under no key, or
    /// whose certificates are all revoked, is refused.
    pub fn services(&self, services: &[(String, Vec<String>)]) -> Result<Vec<u8>, String> {
        let revoked = self.revoked()?;
        let admitted = self.admitted();
        let id_of = |name: &str| -> Result<u64, String> {
            admitted
                .iter()
                .rev()
                .find(|(serial, n, _)| n == name && !revoked.contains(serial))
                .and_then(|(_, _, key)| parse_hex32(key.as_deref()?))
                .map(|key| node_id(&key).0)
                .ok_or_else(|| {
                    format!(
                        "no node {name} is admitted (with its key recorded) in {}",
                        self.dir.display()
                    )
                })
        };
        let mut entries = Vec::new();
        for (service, nodes) in services {
            let nodes = nodes.iter().map(|n| id_of(n)).collect::<Result<_, _>>()?;
            entries.push(ServiceEntry {
                name: service.clone(),
                nodes,
            });
        }
        let path = self.dir.join(SERVICE_MAP);
        let version = if path.exists() {
            ServiceMap::verify(&read_hex(&path)?, self.cluster, &self.public())
                .map_err(|e| format!("{}: {e}", path.display()))?
                .version
        } else {
            0
        };
        let map = ServiceMap {
            version: version + 1,
            issued: wall(),
            entries,
        };
        let bytes = map
            .sign(self.cluster, &self.key)
            .map_err(|e| format!("cannot sign the service map: {e}"))?;
        secrets::write(&path, format!("{}\n", hex::encode(&bytes)).as_bytes())?;
        Ok(bytes)
    }

    /// What `admitted` records: serial, name and (for certificates issued
    /// since it was kept) the static key in hex, per certificate.
    fn admitted(&self) -> Vec<(u64, String, Option<String>)> {
        let text = std::fs::read_to_string(self.dir.join("admitted")).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let serial = f.next()?.parse().ok()?;
                let name = f.next()?.to_string();
                Some((serial, name, f.next().map(str::to_string)))
            })
            .collect()
    }

    /// The revocation list issued so far.
    fn revocations(&self) -> Result<RevocationList, String> {
        let path = self.dir.join(REVOKED);
        if !path.exists() {
            return Ok(RevocationList::default());
        }
        RevocationList::verify(&read_hex(&path)?, self.cluster, &self.public())
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The serials revoked so far.
    fn revoked(&self) -> Result<Vec<u64>, String> {
        Ok(self.revocations()?.serials)
    }
}

/// Reads a file of hex text.
pub fn read_hex(path: &Path) -> Result<Vec<u8>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    hex::decode(text.trim()).map_err(|_| format!("{} is not hex", path.display()))
}

fn parse_hex32(text: &str) -> Option<[u8; 32]> {
    hex::decode(text.trim()).ok()?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new administrator's key (in a directory removed when dropped) that
    /// admitted n1 with the key `[1; 32]`.
    fn admin_with_n1() -> (tempfile::TempDir, Admin) {
        let tmp = tempfile::tempdir().unwrap();
        let admin = Admin::create(&tmp.path().join("admin")).unwrap();
        admin.admit("n1", [1; 32], 1).unwrap();
        (tmp, admin)
    }

    /// Review 3, L12: a name is one node's: admitted again with its own key
    /// (a renewal), refused with another until the first is revoked.
    #[test]
    fn a_name_is_admitted_with_one_key_until_revoked() {
        let (_tmp, admin) = admin_with_n1();
        admin.admit("n1", [1; 32], 1).unwrap();
        let refused = admin.admit("n1", [2; 32], 1).unwrap_err();
        assert!(refused.contains("revoke it first"), "{refused}");
        admin.admit("n2", [2; 32], 1).unwrap();
        admin.revoke("n1").unwrap();
        admin.admit("n1", [3; 32], 1).unwrap();
    }

    /// Review 3, H1: a service map names nodes by the keys they were
    /// admitted with (the newest unrevoked one), each new map a version
    /// above the last; a name not admitted, or revoked, is refused.
    #[test]
    fn a_service_map_names_admitted_nodes_by_their_keys() {
        let (_tmp, admin) = admin_with_n1();
        admin.admit("n2", [2; 32], 1).unwrap();
        let service = |nodes: &[&str]| {
            vec![(
                "directory service dir".to_string(),
                nodes.iter().map(|n| n.to_string()).collect(),
            )]
        };
        let first = admin.services(&service(&["n1", "n2"])).unwrap();
        let map = ServiceMap::verify(&first, admin.cluster(), &admin.public()).unwrap();
        let mut want = [node_id(&[1; 32]).0, node_id(&[2; 32]).0];
        want.sort_unstable();
        assert_eq!(map.servers("directory service dir"), Some(&want[..]));
        assert!(
            admin
                .services(&service(&["n3"]))
                .unwrap_err()
                .contains("no node n3")
        );
        admin.revoke("n2").unwrap();
        assert!(admin.services(&service(&["n2"])).is_err());
        let second = admin.services(&service(&["n1"])).unwrap();
        let map = ServiceMap::verify(&second, admin.cluster(), &admin.public()).unwrap();
        assert_eq!(map.version, 2);
        assert_eq!(
            map.servers("directory service dir"),
            Some(&[node_id(&[1; 32]).0][..])
        );
    }

    #[test]
    fn an_admitted_node_loads_and_a_revoked_one_does_not() {
        let tmp = tempfile::tempdir().unwrap();
        let admin = Admin::create(&tmp.path().join("admin")).unwrap();
        assert!(Admin::create(&tmp.path().join("admin")).is_err());
        let admin = {
            drop(admin);
            Admin::open(&tmp.path().join("admin")).unwrap()
        };
        let state = tmp.path().join("n1");
        let public = static_public_key(&state).unwrap();
        // The node id comes from the key: the same while it lasts, and
        // nobody else's.
        assert_eq!(node_id(&public), node_id(&public));
        assert_ne!(node_id(&public), node_id(&[0; 32]));
        let cert_file = state.join(NODE_CERT);
        let load_n1 = || {
            let (cluster, public) = (admin.cluster(), admin.public());
            load("n1", &state, &cert_file, cluster, public, wall())
        };
        assert!(load_n1().unwrap_err().contains("shoal cluster admit n1"));
        let cert = admin.admit("n1", public, CERT_DAYS).unwrap();
        std::fs::write(&cert_file, hex::encode(&cert)).unwrap();
        let id = load_n1().unwrap();
        assert_eq!(id.me.cert().name, "n1");
        let wrong_name = load(
            "n2",
            &state,
            &cert_file,
            admin.cluster(),
            admin.public(),
            wall(),
        );
        assert!(wrong_name.unwrap_err().contains("not n2"));
        // Another cluster's admin does not admit it.
        let other = Admin::create(&tmp.path().join("other")).unwrap();
        assert!(
            load(
                "n1",
                &state,
                &cert_file,
                admin.cluster(),
                other.public(),
                wall()
            )
            .is_err()
        );
        // Revoked: stored, and the node no longer loads.
        let list = admin.revoke("n1").unwrap();
        assert!(admin.revoke("n9").is_err());
        store_revoked(&state, &list).unwrap();
        let e = load(
            "n1",
            &state,
            &cert_file,
            admin.cluster(),
            admin.public(),
            wall(),
        )
        .unwrap_err();
        assert!(e.contains("revoked"), "{e}");
    }
}
