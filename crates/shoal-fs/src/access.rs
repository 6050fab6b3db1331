//! POSIX permission checks, as the metadata service applies them to every
//! operation it performs for a claimed identity (the kernel of the
//! caller's node has checked the same against its cached attributes).

use crate::model::{Attr, FsError, Identity, Kind, S_ISGID, S_ISUID, S_ISVTX};

/// Read permission.
pub const R: u16 = 4;
/// Write permission.
pub const W: u16 = 2;
/// Execute (search, for a directory) permission.
pub const X: u16 = 1;

/// Whether `who` has every permission in `want` (a mask of [`R`], [`W`],
/// [`X`]) on an inode with `attr`.  Root has all, except execute on a
/// non-directory with no execute bit at all.
pub fn may(attr: &Attr, who: &Identity, want: u16) -> bool {
    if who.is_root() {
        return want & X == 0 || attr.kind == Kind::Dir || attr.perm & 0o111 != 0;
    }
    let bits = if who.uid == attr.uid {
        (attr.perm >> 6) & 7
    } else if who.in_group(attr.gid) {
        (attr.perm >> 3) & 7
    } else {
        attr.perm & 7
    };
    bits & want == want
}

/// [`may`], as an `EACCES` error.
pub fn check(attr: &Attr, who: &Identity, want: u16) -> Result<(), FsError> {
    if may(attr, who, want) {
        Ok(())
    } else {
        Err(FsError::Access)
    }
}

/// Whether `who` may remove or rename away the entry for `victim` in
/// directory `dir` as far as the sticky bit goes: in a sticky directory
/// only the entry's owner, the directory's owner and root may.
pub fn sticky_allows(dir: &Attr, victim: &Attr, who: &Identity) -> bool {
    dir.perm & S_ISVTX == 0 || who.is_root() || who.uid == dir.uid || who.uid == victim.uid
}

/// Whether `who` owns the inode or is root (who may change its mode and
/// times, and its group to one of their own).
pub fn owns(attr: &Attr, who: &Identity) -> bool {
    who.is_root() || who.uid == attr.uid
}

/// The permission bits a `chmod` by `who` leaves: an owner who is not in
/// the file's group cannot set set-group-id on a file.
pub fn chmod_bits(attr: &Attr, who: &Identity, perm: u16) -> u16 {
    let perm = perm & 0o7777;
    if !who.is_root() && attr.kind != Kind::Dir && !who.in_group(attr.gid) {
        perm & !S_ISGID
    } else {
        perm
    }
}

/// Whether `perm` only takes set-user-id and set-group-id away from the
/// inode's bits: what the kernel asks, as the writer, when a write by a
/// caller without `CAP_FSETID` must drop them (a writer may; only the
/// owner may change any other bit).
pub fn drops_only_setid(attr: &Attr, perm: u16) -> bool {
    const SETID: u16 = S_ISUID | S_ISGID;
    let perm = perm & 0o7777;
    perm & !SETID == attr.perm & !SETID && perm & SETID & !attr.perm == 0
}

/// The permission bits left after a write by `who`: as a local file
/// system leaves them, the set-id bits go as after a change of owner
/// ([`after_chown`]), unless the writer is root (who has `CAP_FSETID`).
pub fn after_write(attr: &Attr, who: &Identity) -> u16 {
    if who.is_root() || attr.kind != Kind::File {
        return attr.perm;
    }
    without_setid(attr.perm)
}

/// The permission bits left after a change of owner or group, for a
/// non-directory: [`without_setid`].
pub fn after_chown(attr: &Attr) -> u16 {
    if attr.kind == Kind::Dir {
        return attr.perm;
    }
    without_setid(attr.perm)
}

/// `perm` without set-user-id, and without set-group-id too when group
/// execute is set (otherwise it marks mandatory locking, which is kept).
fn without_setid(perm: u16) -> u16 {
    let perm = perm & !S_ISUID;
    if perm & 0o010 != 0 {
        perm & !S_ISGID
    } else {
        perm
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Ino, Timestamp};

    fn attr(kind: Kind, perm: u16, uid: u32, gid: u32) -> Attr {
        Attr {
            ino: Ino(2),
            kind,
            perm,
            nlink: 1,
            uid,
            gid,
            rdev: 0,
            size: 0,
            held: 0,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            version: 0,
        }
    }

    #[test]
    fn classes() {
        let a = attr(Kind::File, 0o640, 10, 20);
        let owner = Identity::user(10, 99);
        let member = Identity {
            uid: 11,
            gid: 99,
            groups: vec![20],
        };
        let other = Identity::user(12, 99);
        assert!(may(&a, &owner, R | W));
        assert!(!may(&a, &owner, X));
        assert!(may(&a, &member, R));
        assert!(!may(&a, &member, W));
        assert!(!may(&a, &other, R));
        // The owner class decides for the owner, even if the group's is
        // wider.
        let b = attr(Kind::File, 0o070, 10, 20);
        assert!(!may(&b, &Identity::user(10, 20), R));
    }

    #[test]
    fn root() {
        let root = Identity::root();
        assert!(may(&attr(Kind::File, 0, 10, 20), &root, R | W));
        assert!(!may(&attr(Kind::File, 0o600, 10, 20), &root, X));
        assert!(may(&attr(Kind::File, 0o001, 10, 20), &root, X));
        assert!(may(&attr(Kind::Dir, 0, 10, 20), &root, X));
    }

    #[test]
    fn sticky() {
        let dir = attr(Kind::Dir, 0o1777, 1, 1);
        let file = attr(Kind::File, 0o644, 10, 10);
        assert!(sticky_allows(&dir, &file, &Identity::user(10, 10)));
        assert!(sticky_allows(&dir, &file, &Identity::user(1, 1)));
        assert!(!sticky_allows(&dir, &file, &Identity::user(11, 10)));
        assert!(sticky_allows(
            &attr(Kind::Dir, 0o777, 1, 1),
            &file,
            &Identity::user(11, 10)
        ));
    }

    #[test]
    fn mode_changes() {
        let f = attr(Kind::File, 0o6755, 10, 20);
        assert_eq!(chmod_bits(&f, &Identity::user(10, 99), 0o2755), 0o755);
        assert_eq!(chmod_bits(&f, &Identity::user(10, 20), 0o2755), 0o2755);
        assert_eq!(after_chown(&f), 0o755);
        assert_eq!(after_chown(&attr(Kind::File, 0o6745, 10, 20)), 0o2745);
        assert_eq!(after_chown(&attr(Kind::Dir, 0o6755, 10, 20)), 0o6755);
    }

    #[test]
    fn writes_drop_the_set_id_bits() {
        let writer = Identity::user(11, 99);
        assert_eq!(
            after_write(&attr(Kind::File, 0o6777, 10, 20), &writer),
            0o777
        );
        // Set-group-id without group execute marks mandatory locking.
        assert_eq!(
            after_write(&attr(Kind::File, 0o6767, 10, 20), &writer),
            0o2767
        );
        assert_eq!(
            after_write(&attr(Kind::File, 0o4766, 10, 20), &Identity::root()),
            0o4766
        );
        // What a writer may ask for: those bits gone, nothing else moved.
        let f = attr(Kind::File, 0o6777, 10, 20);
        for ok in [0o777, 0o2777, 0o4777, 0o6777] {
            assert!(drops_only_setid(&f, ok), "{ok:o}");
        }
        for refused in [0o775, 0o7777, 0o1777, 0o666, 0o4775] {
            assert!(!drops_only_setid(&f, refused), "{refused:o}");
        }
        assert!(!drops_only_setid(&attr(Kind::File, 0o777, 10, 20), 0o4777));
    }
}
