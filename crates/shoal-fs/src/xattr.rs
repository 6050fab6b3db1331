//! Extended attributes as the metadata service reads them, and the
//! capabilities it gives out for inodes (`docs/fs.md`, "Authority").
//!
//! Two namespaces are kept: `user.*` (files and directories, readable by
//! whoever may read the inode, written by whoever may write it) and
//! `trusted.*` (root's alone).  Names under `user.shoal.` are the
//! service's own and are never stored: `user.shoal.cap` is a capability
//! for the inode, minted for each caller with the rights its permissions
//! give (and `user.shoal.content`, answered by the mount, names the
//! current version's contents).  They are not listed, so that copying a
//! file's attributes (`cp -a`, `rsync -X`) does not try to set them.

use shoal_cap::{Capability, ObjectId, ObjectSecret, PutPort, Rights};

use crate::access::{self, R, W};
use crate::model::{FsError, Identity, Kind};
use crate::tree::Inode;

/// The capability of an inode (`cap1:` text).
pub const CAP: &[u8] = b"user.shoal.cap";
/// The capabilities of an inode's current content version, one `cap1:`
/// text a line (the mount answers it).
pub const CONTENT: &[u8] = b"user.shoal.content";
/// The prefix of the service's own names.
pub const SHOAL: &[u8] = b"user.shoal.";

/// The fixed half of an inode's capability key: the key is the inode's
/// 128-bit secret followed by these 16 bytes.
const KEY_TAIL: &[u8; 16] = b"shoal fs inode\0\0";

/// Whether the service keeps attributes named `name` at all: `user.*` and
/// `trusted.*` (others, `security.*` and `system.*`, are `ENOTSUP` to set
/// and absent to read, so the mount answers them without a message).
pub fn kept_namespace(name: &[u8]) -> bool {
    name.starts_with(b"user.") || name.starts_with(b"trusted.")
}

/// The value of attribute `name` of `inode`, for `who`.
pub fn get(inode: &Inode, who: &Identity, name: &[u8]) -> Result<Vec<u8>, FsError> {
    visible(inode, who, name)?;
    inode.xattrs.get(name).cloned().ok_or(FsError::NoData)
}

/// The names of `inode`'s attributes `who` may see, each followed by a
/// NUL.
pub fn list(inode: &Inode, who: &Identity) -> Result<Vec<u8>, FsError> {
    let mut out = Vec::new();
    for name in inode.xattrs.keys() {
        if name.starts_with(b"trusted.") && !who.is_root() {
            continue;
        }
        out.extend_from_slice(name);
        out.push(0);
    }
    Ok(out)
}

/// Whether `who` may read attribute `name` of `inode` (`ENODATA` for a
/// name that cannot be there).
fn visible(inode: &Inode, who: &Identity, name: &[u8]) -> Result<(), FsError> {
    if name.starts_with(b"user.") {
        if !matches!(inode.attr.kind, Kind::File | Kind::Dir) {
            return Err(FsError::NoData);
        }
        access::check(&inode.attr, who, R)
    } else if name.starts_with(b"trusted.") {
        if who.is_root() {
            Ok(())
        } else {
            Err(FsError::NoData)
        }
    } else {
        Err(FsError::NoData)
    }
}

/// The key an inode's capabilities are minted and checked with.
pub fn object_secret(secret: &[u8; 16]) -> ObjectSecret {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(secret);
    key[16..].copy_from_slice(KEY_TAIL);
    ObjectSecret::from_bytes(key)
}

/// The rights `who`'s permissions give it on `inode`: `READ` if it may
/// read, `WRITE` if it may write, `ADMIN` if it owns it (or is root).
pub fn rights(inode: &Inode, who: &Identity) -> Rights {
    let mut r = Rights::NONE;
    if access::may(&inode.attr, who, R) {
        r = r | Rights::READ;
    }
    if access::may(&inode.attr, who, W) {
        r = r | Rights::WRITE;
    }
    if access::owns(&inode.attr, who) {
        r = r | Rights::ADMIN;
    }
    r
}

/// `user.shoal.cap` for `who`: a capability for the inode served at
/// `port`, with [`rights`] (`EACCES` if they are none).
pub fn mint(port: PutPort, inode: &Inode, who: &Identity) -> Result<Capability, FsError> {
    let rights = rights(inode, who);
    if rights == Rights::NONE {
        return Err(FsError::Access);
    }
    Ok(Capability::mint(
        port,
        ObjectId::new(inode.attr.ino.0),
        rights,
        &object_secret(&inode.secret),
    ))
}

/// Checks `cap` against `inode` (the inode its object names) and that it
/// holds `need`: `EACCES` for a forged or revoked capability or one
/// without the rights.
pub fn verify(cap: &Capability, inode: &Inode, need: Rights) -> Result<(), FsError> {
    if cap.object().get() != inode.attr.ino.0 {
        return Err(FsError::Access);
    }
    cap.require(&object_secret(&inode.secret), need)
        .map(|_| ())
        .map_err(|_| FsError::Access)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::model::{Attr, Ino, Timestamp};
    use crate::tokens::ClientId;
    use crate::tree::Body;

    fn port() -> PutPort {
        shoal_cap::GetPort::from_bytes([3; 16]).put_port()
    }

    /// File 5 (0640, uid 1000, gid 100) holding `user.a` and `trusted.t`.
    fn file() -> Inode {
        let t = Timestamp::new(1, 0);
        Inode {
            attr: Attr {
                ino: Ino(5),
                kind: Kind::File,
                perm: 0o640,
                nlink: 1,
                uid: 1000,
                gid: 100,
                rdev: 0,
                size: 0,
                held: 0,
                atime: t,
                mtime: t,
                ctime: t,
                version: 0,
            },
            secret: [7; 16],
            body: Body::File {
                content: Vec::new(),
                overlay: Vec::new(),
            },
            xattrs: BTreeMap::from([
                (b"user.a".to_vec(), b"v".to_vec()),
                (b"trusted.t".to_vec(), b"v".to_vec()),
            ]),
        }
    }

    #[test]
    fn reads_follow_permissions_and_namespaces() {
        let f = file();
        let owner = Identity::user(1000, 100);
        let group = Identity::user(1001, 100);
        let other = Identity::user(1002, 200);
        assert_eq!(get(&f, &owner, b"user.a"), Ok(b"v".to_vec()));
        assert_eq!(get(&f, &group, b"user.a"), Ok(b"v".to_vec()));
        assert_eq!(get(&f, &other, b"user.a"), Err(FsError::Access));
        assert_eq!(get(&f, &owner, b"user.b"), Err(FsError::NoData));
        assert_eq!(get(&f, &owner, b"trusted.t"), Err(FsError::NoData));
        assert_eq!(get(&f, &Identity::root(), b"trusted.t"), Ok(b"v".to_vec()));
        assert_eq!(
            get(&f, &owner, b"security.capability"),
            Err(FsError::NoData)
        );
        assert_eq!(list(&f, &owner), Ok(b"user.a\0".to_vec()));
        assert_eq!(
            list(&f, &Identity::root()),
            Ok(b"trusted.t\0user.a\0".to_vec())
        );
        let mut link = f.clone();
        link.attr.kind = Kind::Symlink;
        assert_eq!(get(&link, &owner, b"user.a"), Err(FsError::NoData));
    }

    #[test]
    fn capabilities_carry_the_callers_rights_and_verify() {
        let f = file();
        let owner = Identity::user(1000, 100);
        let group = Identity::user(1001, 100);
        let other = Identity::user(1002, 200);
        let cap = mint(port(), &f, &owner).expect("owner's");
        assert_eq!(cap.rights(), Rights::READ | Rights::WRITE | Rights::ADMIN);
        assert_eq!(verify(&cap, &f, Rights::WRITE), Ok(()));
        let read = mint(port(), &f, &group).expect("group's");
        assert_eq!(read.rights(), Rights::READ);
        assert_eq!(verify(&read, &f, Rights::READ), Ok(()));
        assert_eq!(verify(&read, &f, Rights::WRITE), Err(FsError::Access));
        assert_eq!(mint(port(), &f, &other), Err(FsError::Access));
        // Restricted offline, it still verifies, with fewer rights.
        let weaker = cap.restrict(Rights::READ).expect("a step");
        assert_eq!(verify(&weaker, &f, Rights::READ), Ok(()));
        assert_eq!(verify(&weaker, &f, Rights::WRITE), Err(FsError::Access));
        // Another object number, or a changed secret, refuses it.
        let mut moved = f.clone();
        moved.attr.ino = Ino(6);
        assert_eq!(verify(&cap, &moved, Rights::READ), Err(FsError::Access));
        let mut revoked = f.clone();
        revoked.secret = [8; 16];
        assert_eq!(verify(&cap, &revoked, Rights::READ), Err(FsError::Access));
    }

    /// Review 3, M4: a capability stops verifying once its inode is
    /// revoked (by its owner or root only), or once a change of attributes
    /// that takes rights away is made with a new secret; one that takes
    /// none needs none, and a refused change keeps the secret.
    #[test]
    fn a_revoked_inode_verifies_no_earlier_capability() {
        use crate::tree::{Applied, Tree};
        use crate::update::{Answer, SetAttr, Update, UpdateOp};
        let mut tree = Tree::new([1; 16], Timestamp::new(1, 0));
        let mut seq = 0;
        let mut run = |tree: &mut Tree, who: &Identity, op: UpdateOp| {
            seq += 1;
            let u = Update {
                session: ClientId(7),
                seq,
                who: who.clone(),
                now: Timestamp::new(seq as i64 + 1, 0),
                op,
            };
            match tree.apply(&u) {
                Applied::New(r) => r,
                Applied::Duplicate(r) => panic!("duplicate: {r:?}"),
            }
        };
        let (alice, bob) = (Identity::user(1000, 1000), Identity::user(1001, 1001));
        let first = match run(&mut tree, &Identity::root(), UpdateOp::Range { count: 10 }) {
            Ok(Answer::Range { first, .. }) => first,
            other => panic!("{other:?}"),
        };
        let create = UpdateOp::Create {
            parent: crate::model::ROOT,
            name: b"f".to_vec(),
            kind: Kind::File,
            perm: 0o666,
            rdev: 0,
            ino: first,
            secret: [2; 16],
            target: Vec::new(),
            excl: true,
        };
        let root = Identity::root();
        run(&mut tree, &root, create).unwrap();
        run(
            &mut tree,
            &root,
            UpdateOp::SetAttr {
                ino: first,
                set: SetAttr {
                    uid: Some(1000),
                    gid: Some(1000),
                    ..SetAttr::default()
                },
            },
        )
        .unwrap();
        let inode = |tree: &Tree| tree.get(first).unwrap().clone();
        let cap = mint(port(), &inode(&tree), &bob).unwrap();
        assert_eq!(cap.rights(), Rights::READ | Rights::WRITE);
        // Bob may not revoke alice's file; she may.
        let revoke = |secret| UpdateOp::Revoke {
            ino: first,
            secret,
            set: None,
        };
        assert_eq!(run(&mut tree, &bob, revoke([3; 16])), Err(FsError::Perm));
        assert_eq!(verify(&cap, &inode(&tree), Rights::READ), Ok(()));
        assert_eq!(run(&mut tree, &alice, revoke([3; 16])), Ok(Answer::Done));
        assert_eq!(
            verify(&cap, &inode(&tree), Rights::READ),
            Err(FsError::Access)
        );
        // A chmod to 0600, with a new secret: bob's new capability goes.
        let cap = mint(port(), &inode(&tree), &bob).unwrap();
        let chmod = |perm| SetAttr {
            perm: Some(perm),
            ..SetAttr::default()
        };
        assert!(chmod(0o600).takes_rights(&inode(&tree).attr));
        assert!(!chmod(0o777).takes_rights(&inode(&tree).attr));
        let revoking = |set, secret| UpdateOp::Revoke {
            ino: first,
            secret,
            set: Some(set),
        };
        // Refused (bob owns nothing here): the secret stays.
        assert_eq!(
            run(&mut tree, &bob, revoking(chmod(0o600), [4; 16])),
            Err(FsError::Perm)
        );
        assert_eq!(verify(&cap, &inode(&tree), Rights::READ), Ok(()));
        assert!(matches!(
            run(&mut tree, &alice, revoking(chmod(0o600), [4; 16])),
            Ok(Answer::Attr(a)) if a.perm == 0o600
        ));
        assert_eq!(
            verify(&cap, &inode(&tree), Rights::READ),
            Err(FsError::Access)
        );
        assert_eq!(mint(port(), &inode(&tree), &bob), Err(FsError::Access));
        // A chown or chgrp takes rights too.
        let chgrp = SetAttr {
            gid: Some(5),
            ..SetAttr::default()
        };
        assert!(chgrp.takes_rights(&inode(&tree).attr));
        assert!(!SetAttr::default().takes_rights(&inode(&tree).attr));
    }
}
