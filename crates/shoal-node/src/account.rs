//! Users' accounts on this node: who a uid is, and which groups it may
//! run with.  A start request names a uid, a gid and groups; a root daemon
//! runs the program with no group the account does not have
//! (`docs/security.md`, "Local authority").

use std::ffi::CStr;

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
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: an all-zero passwd is a valid value to be filled in.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwuid_r writes into `pw` and `buf`, both ours and of the
    // sizes given, and sets `found` to `&pw` or null.
    let rc =
        unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() {
        return None;
    }
    // SAFETY: pw_name points into `buf`, NUL-terminated, while `buf` lives.
    let name = unsafe { CStr::from_ptr(pw.pw_name) }.to_owned();
    let gid = pw.pw_gid;
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
    }
}
