//! The envelope of the records the cluster's admin signs (the revocation
//! list in `cert.rs`, the service map in `service_map.rs`): magic (4
//! bytes), cluster (16), version (u64 LE), issued (u64 LE, Unix
//! seconds), the record's own body, and the admin's Ed25519 signature
//! over everything before it.  A record's body is parsed only once its
//! signature checks and it names this cluster.

use crate::SessionError;
use crate::cert::{AdminKey, AdminPublic, ClusterId, Reader, SIGNATURE_LEN, reader};

/// Bytes before a record's body.
const HEAD: usize = 4 + 16 + 8 + 8;

/// What kind of record: its magic, its signature's context, and what a
/// wrong magic is called.
pub(crate) struct Kind {
    pub magic: [u8; 4],
    pub context: &'static [u8],
    pub bad_magic: &'static str,
}

/// A record of `kind` for `cluster`, its `body` already encoded, signed by
/// `admin`.
pub(crate) fn sign(
    kind: &Kind,
    cluster: ClusterId,
    (version, issued): (u64, u64),
    body: &[u8],
    admin: &AdminKey,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEAD + body.len() + SIGNATURE_LEN);
    out.extend_from_slice(&kind.magic);
    out.extend_from_slice(&cluster.0);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&issued.to_le_bytes());
    out.extend_from_slice(body);
    let sig = admin.sign(kind.context, &out);
    out.extend_from_slice(&sig);
    out
}

/// Checks a record of `kind`: its magic, the admin's signature, and that
/// it is `cluster`'s; its version, issued time and body.
pub(crate) fn open<'a>(
    kind: &Kind,
    bytes: &'a [u8],
    cluster: ClusterId,
    admin: &AdminPublic,
) -> Result<(u64, u64, Reader<'a>), SessionError> {
    if bytes.len() < HEAD + SIGNATURE_LEN {
        return Err(SessionError::Truncated);
    }
    let (signed, sig) = bytes.split_at(bytes.len() - SIGNATURE_LEN);
    let mut r = reader(signed);
    if r.take(4)? != kind.magic {
        return Err(SessionError::Malformed(kind.bad_magic));
    }
    admin.verify(kind.context, signed, sig)?;
    if ClusterId(r.array()?) != cluster {
        return Err(SessionError::WrongCluster);
    }
    let version = r.u64()?;
    let issued = r.u64()?;
    Ok((version, issued, r))
}
