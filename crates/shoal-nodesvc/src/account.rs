//! Users' accounts on this node: who a uid is, which groups it may run
//! with, and who is at the other end of a local socket.  A start request
//! names a uid, a gid and groups; a root daemon runs the program with no
//! group the account does not have (`docs/security.md`, "Local
//! authority").

use std::ffi::{CStr, CString};

/// An entry of the passwd database.
pub struct Passwd {
    pub name: CString,
    pub uid: u32,
    /// Primary group.
    pub gid: u32,
    pub home: std::path::PathBuf,
}

/// The passwd entry `lookup` finds: `getpwuid_r` or `getpwnam_r` bound to
/// its key, given the entry, buffer, buffer length and result to fill.
fn passwd_entry(
    lookup: impl FnOnce(
        *mut libc::passwd,
        *mut libc::c_char,
        usize,
        *mut *mut libc::passwd,
    ) -> libc::c_int,
) -> Option<Passwd> {
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: an all-zero passwd is a valid value to be filled in.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // The lookup writes into `pw` and `buf`, both ours and of the sizes
    // given, and sets `found` to `&pw` or null.
    let rc = lookup(&mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut found);
    if rc != 0 || found.is_null() {
        return None;
    }
    // SAFETY: pw_name and pw_dir point into `buf`, NUL-terminated, while
    // `buf` lives.
    let (name, home) = unsafe {
        (
            CStr::from_ptr(pw.pw_name).to_owned(),
            CStr::from_ptr(pw.pw_dir).to_string_lossy().into_owned(),
        )
    };
    Some(Passwd {
        name,
        uid: pw.pw_uid,
        gid: pw.pw_gid,
        home: home.into(),
    })
}

/// The passwd entry of `uid`.
fn passwd(uid: u32) -> Option<Passwd> {
    // SAFETY: getpwuid_r with the buffers `passwd_entry` hands it.
    passwd_entry(|pw, buf, len, found| unsafe { libc::getpwuid_r(uid, pw, buf, len, found) })
}

/// The passwd entry of the account `name`.
pub fn by_name(name: &str) -> Option<Passwd> {
    let name = CString::new(name).ok()?;
    // SAFETY: getpwnam_r with a NUL-terminated name and the buffers
    // `passwd_entry` hands it.
    passwd_entry(|pw, buf, len, found| unsafe {
        libc::getpwnam_r(name.as_ptr(), pw, buf, len, found)
    })
}

/// The gid of group `name`.
pub fn group_by_name(name: &str) -> Option<u32> {
    let cname = CString::new(name).ok()?;
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: an all-zero group is a valid value to be filled in.
    let mut gr: libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: getgrnam_r writes into `gr` and `buf`, both ours and of the
    // sizes given, and sets `found` to `&gr` or null.
    let rc = unsafe {
        libc::getgrnam_r(
            cname.as_ptr(),
            &mut gr,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    (rc == 0 && !found.is_null()).then_some(gr.gr_gid)
}

/// The uid and gid a squashed remote root runs as: `nobody`'s, or
/// 65534 where the node has no such account.
pub fn nobody() -> (u32, u32) {
    by_name("nobody").map_or((65_534, 65_534), |p| (p.uid, p.gid))
}

/// The login name of `uid` on this node, or the number if it has none.
pub fn user_name(uid: u32) -> String {
    passwd(uid).map_or_else(
        || uid.to_string(),
        |p| p.name.to_string_lossy().into_owned(),
    )
}

/// Who is on the other end of a Unix socket, as the kernel says
/// (`SO_PEERCRED`): pid, uid, gid.  Nothing the peer says can change it.
pub fn peer(socket: &impl std::os::fd::AsRawFd) -> Option<(i32, u32, u32)> {
    shoal_rpc::link::peer(socket)
}

/// A user's primary group and every group they belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub gid: u32,
    /// Supplementary groups, the primary one among them.
    pub groups: Vec<u32>,
}

/// The account of `uid` on this node, from the passwd and group
/// databases; `None` if it has none.
pub fn lookup(uid: u32) -> Option<Account> {
    let Passwd { name, gid, .. } = passwd(uid)?;
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut n = groups.len() as libc::c_int;
        // SAFETY: getgrouplist writes at most `n` gids into `groups` and
        // sets `n` to how many there are.
        let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n.max(0) as usize);
            break;
        }
        if groups.len() >= 65_536 {
            return None;
        }
        groups.resize((n.max(0) as usize).max(groups.len() * 2), 0);
    }
    groups.sort_unstable();
    groups.dedup();
    Some(Account { gid, groups })
}

/// What a start request for `uid` with `gid` and `groups` may have: the
/// gid if the account has it, and the groups it has; or why not.
pub fn clamp(uid: u32, gid: u32, groups: &[u32]) -> Result<(u32, Vec<u32>), String> {
    let account = lookup(uid).ok_or_else(|| format!("user {uid} has no account on this node"))?;
    if gid != account.gid && account.groups.binary_search(&gid).is_err() {
        return Err(format!("user {uid} is not in group {gid} on this node"));
    }
    let kept = groups
        .iter()
        .copied()
        .filter(|g| account.groups.binary_search(g).is_ok())
        .collect();
    Ok((gid, kept))
}

#[cfg(test)]
mod tests {
    #[test]
    fn root_has_an_account_and_cannot_borrow_groups() {
        let root = super::lookup(0).expect("root has an account");
        assert_eq!(root.gid, 0);
        assert!(root.groups.contains(&0));
        let (gid, groups) = super::clamp(0, 0, &[0, 4_000_000]).unwrap();
        assert_eq!((gid, groups), (0, vec![0]));
        assert!(super::clamp(0, 4_000_000, &[]).is_err());
        assert!(super::clamp(4_000_000, 0, &[]).is_err());
        assert_eq!(super::user_name(0), "root");
        assert_eq!(super::group_by_name("root"), Some(0));
        assert_eq!(super::group_by_name("no-such-group-here"), None);
        assert_eq!(super::user_name(4_000_000), "4000000");
    }

    #[test]
    fn the_kernel_says_who_is_on_the_other_end() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (pid, uid, gid) = super::peer(&a).unwrap();
        assert_eq!(pid as u32, std::process::id());
        // SAFETY: getuid/getgid cannot fail.
        assert_eq!((uid, gid), unsafe { (libc::getuid(), libc::getgid()) });
    }
}
