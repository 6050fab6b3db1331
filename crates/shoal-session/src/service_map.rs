//! The service map (`docs/security.md`, "Which nodes serve the system"):
//! the administrator's signed record of which nodes serve each of the
//! cluster's replicated system services.
//!
//! A system port is public (derived from the cluster id and a name), so
//! any node whose root turns `system_ports = "root"` on could serve one.
//! Where the map names a port's servers, every node keeps only their
//! answers to a locate of it, and the services themselves take peers
//! (the replicas' group, their two-phase commit) only from those nodes.
//! Ports the map does not name are served by whoever may serve them
//! today.
//!
//! ```text
//! "SSM1" | cluster id (16) | version (u64) | issued (u64) | entries (u16)
//!   per entry: name length (u8) | name (UTF-8) | nodes (u8) | node ids (u64 each)
//! | Ed25519 signature over all before it, in context "shoal 2026 service map v1"
//! ```
//!
//! Names are strictly increasing, and each entry's node ids too; the
//! decoder checks every length and count before it reads, never panics,
//! and checks the signature before it returns anything.

use crate::SessionError;
use crate::cert::{AdminKey, AdminPublic, ClusterId};

/// The map's envelope (`signed.rs`).
const MAP: crate::signed::Kind = crate::signed::Kind {
    magic: *b"SSM1",
    context: b"shoal 2026 service map v1",
    bad_magic: "service map magic",
};

/// Most services one map names.
pub const MAX_SERVICES: usize = 256;
/// Longest service name, in bytes.
pub const MAX_SERVICE_NAME: usize = 128;
/// Most nodes one service is served by.
pub const MAX_SERVERS: usize = 64;

/// One system service (by the name its port derives from, e.g.
/// `directory service dir`) and the node ids that may serve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceEntry {
    pub name: String,
    pub nodes: Vec<u64>,
}

/// The map: entries by name, with a version that only grows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceMap {
    pub version: u64,
    pub issued: u64,
    pub entries: Vec<ServiceEntry>,
}

impl ServiceMap {
    /// The nodes that may serve `name`, if the map names it.
    pub fn servers(&self, name: &str) -> Option<&[u64]> {
        self.entries
            .binary_search_by(|e| e.name.as_str().cmp(name))
            .ok()
            .map(|i| self.entries[i].nodes.as_slice())
    }

    /// The map for `cluster`, signed by `admin`, encoded: entries sorted
    /// by name (a name given twice is refused), node ids sorted and
    /// deduplicated.
    pub fn sign(&self, cluster: ClusterId, admin: &AdminKey) -> Result<Vec<u8>, SessionError> {
        let mut entries = self.entries.clone();
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        if entries.windows(2).any(|w| w[0].name == w[1].name) {
            return Err(SessionError::Malformed("a service named twice"));
        }
        if entries.len() > MAX_SERVICES {
            return Err(SessionError::Malformed("too many services"));
        }
        let mut out = Vec::new();
        out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
        for e in &mut entries {
            if e.name.is_empty() || e.name.len() > MAX_SERVICE_NAME {
                return Err(SessionError::Malformed("service name length"));
            }
            e.nodes.sort_unstable();
            e.nodes.dedup();
            if e.nodes.is_empty() || e.nodes.len() > MAX_SERVERS {
                return Err(SessionError::Malformed("a service's node count"));
            }
            out.push(e.name.len() as u8);
            out.extend_from_slice(e.name.as_bytes());
            out.push(e.nodes.len() as u8);
            for n in &e.nodes {
                out.extend_from_slice(&n.to_le_bytes());
            }
        }
        let when = (self.version, self.issued);
        Ok(crate::signed::sign(&MAP, cluster, when, &out, admin))
    }

    /// Decodes an encoded map and checks its signature under `admin` and
    /// that it belongs to `cluster`.
    pub fn verify(
        bytes: &[u8],
        cluster: ClusterId,
        admin: &AdminPublic,
    ) -> Result<ServiceMap, SessionError> {
        let (version, issued, mut r) = crate::signed::open(&MAP, bytes, cluster, admin)?;
        let n = r.u16()? as usize;
        if n > MAX_SERVICES {
            return Err(SessionError::Malformed("too many services"));
        }
        let mut entries: Vec<ServiceEntry> = Vec::with_capacity(n);
        for _ in 0..n {
            let len = r.u8()? as usize;
            if len == 0 || len > MAX_SERVICE_NAME {
                return Err(SessionError::Malformed("service name length"));
            }
            let name = std::str::from_utf8(r.take(len)?)
                .map_err(|_| SessionError::Malformed("service name is not UTF-8"))?
                .to_string();
            if entries.last().is_some_and(|e| e.name >= name) {
                return Err(SessionError::Malformed("service names not increasing"));
            }
            let count = r.u8()? as usize;
            if count == 0 || count > MAX_SERVERS {
                return Err(SessionError::Malformed("a service's node count"));
            }
            let nodes: Vec<u64> = r
                .take(8 * count)?
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            if nodes.windows(2).any(|w| w[0] >= w[1]) {
                return Err(SessionError::Malformed("node ids not increasing"));
            }
            entries.push(ServiceEntry { name, nodes });
        }
        if r.remaining() != 0 {
            return Err(SessionError::Malformed("service map length"));
        }
        Ok(ServiceMap {
            version,
            issued,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> ServiceMap {
        ServiceMap {
            version: 3,
            issued: 1_800_000_000,
            entries: vec![
                ServiceEntry {
                    name: "file system metadata fs".into(),
                    nodes: vec![9, 2, 2],
                },
                ServiceEntry {
                    name: "directory service dir".into(),
                    nodes: vec![5, 1],
                },
            ],
        }
    }

    #[test]
    fn a_signed_map_verifies_to_itself_sorted_and_nothing_else_does() {
        let admin = AdminKey::from_seed([1; 32]);
        let cluster = ClusterId([7; 16]);
        let bytes = map().sign(cluster, &admin).unwrap();
        let got = ServiceMap::verify(&bytes, cluster, &admin.public()).unwrap();
        assert_eq!(got.version, 3);
        assert_eq!(got.servers("directory service dir"), Some(&[1, 5][..]));
        assert_eq!(got.servers("file system metadata fs"), Some(&[2, 9][..]));
        assert_eq!(got.servers("directory service other"), None);
        // Another cluster's, another key's, or any byte changed: refused.
        assert_eq!(
            ServiceMap::verify(&bytes, ClusterId([8; 16]), &admin.public()),
            Err(SessionError::WrongCluster)
        );
        let other = AdminKey::from_seed([2; 32]).public();
        assert!(ServiceMap::verify(&bytes, cluster, &other).is_err());
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 1;
            assert!(
                ServiceMap::verify(&b, cluster, &admin.public()).is_err(),
                "byte {i}"
            );
        }
        for cut in 0..bytes.len() {
            assert!(ServiceMap::verify(&bytes[..cut], cluster, &admin.public()).is_err());
        }
    }

    #[test]
    fn a_map_naming_a_service_twice_or_none_is_not_signed() {
        let admin = AdminKey::from_seed([1; 32]);
        let mut twice = map();
        twice.entries[1].name = twice.entries[0].name.clone();
        assert!(twice.sign(ClusterId([7; 16]), &admin).is_err());
        let mut nobody = map();
        nobody.entries[0].nodes.clear();
        assert!(nobody.sign(ClusterId([7; 16]), &admin).is_err());
    }
}
