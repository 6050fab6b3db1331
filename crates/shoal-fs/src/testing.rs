//! What the crate's tests share: the users they act as, the creates they
//! ask for and the updates they apply.

use crate::model::{Attr, FsError, Identity, Ino, Kind, Timestamp};
use crate::tokens::ClientId;
use crate::tree::Applied;
use crate::update::{Answer, Update, UpdateOp};

pub(crate) fn alice() -> Identity {
    Identity::user(1000, 1000)
}

pub(crate) fn bob() -> Identity {
    Identity::user(1001, 1001)
}

/// An exclusive create of `name` in `parent` as inode `ino`, with
/// `secret`; a symbolic link points at `target`.
pub(crate) fn create(
    (parent, name): (Ino, &[u8]),
    kind: Kind,
    perm: u16,
    ino: Ino,
    secret: [u8; 16],
    target: &[u8],
) -> UpdateOp {
    UpdateOp::Create {
        parent,
        name: name.to_vec(),
        kind,
        perm,
        rdev: 0,
        ino,
        secret,
        target: target.to_vec(),
        excl: true,
    }
}

/// Update `seq` of `session`, by `who` at `now`.
pub(crate) fn update(
    session: u64,
    seq: u64,
    who: &Identity,
    now: Timestamp,
    op: UpdateOp,
) -> Update {
    Update {
        session: ClientId(session),
        seq,
        who: who.clone(),
        now,
        op,
    }
}

/// What an update applied for the first time answered (a test that
/// applies one twice by mistake stops here).
pub(crate) fn first(applied: Applied) -> Result<Answer, FsError> {
    match applied {
        Applied::New(r) => r,
        Applied::Duplicate(r) => panic!("duplicate: {r:?}"),
    }
}

/// A file's attributes with a different number in every field, for
/// encodings to round-trip.
pub(crate) fn sample_attr() -> Attr {
    Attr {
        ino: Ino(5),
        kind: Kind::File,
        perm: 0o644,
        nlink: 1,
        uid: 1,
        gid: 2,
        rdev: 0,
        size: 99,
        held: 0,
        atime: Timestamp::new(1, 1),
        mtime: Timestamp::new(2, 2),
        ctime: Timestamp::new(3, 3),
        version: 4,
    }
}
