//! Group datagrams sealed (`docs/security.md`, "Groups"): every datagram a
//! member sends, multicast or unicast, travels as a class 7 datagram,
//! encrypted under its sender's key, with a counter per sender and a
//! replay window per sender at each receiver.
//!
//! The group key is derived from the cluster key and the group's port
//! (`group_key`) by the members' nodes, which hand it to any local program
//! that names the port (`GroupKey` on the link): every member holds it,
//! and nobody on the network does.
//! Each member seals with `member_key(group key, its member id)`; member
//! ids are drawn afresh by every member that joins, so its counters start
//! at zero.  The group core inside still checks its own MAC, under the
//! group key too.  Per-incarnation keys, handed out by the sequencer so
//! that a member that left cannot read on, are designed, not built.

use rustc_hash::FxHashMap as HashMap;
use shoal_cap::PutPort;
use shoal_session::kdf::member_key;
use shoal_session::{Algorithm, Header, Key, ReplayWindow, SessionError, open, seal};
use shoal_wire::{ClusterKey, MemberId};

/// The AEAD of group datagrams: one for all members, whatever their CPUs
/// (`ring` falls back to a constant-time AES where there is no AES-NI).
const ALGORITHM: Algorithm = Algorithm::Aes256Gcm;

/// Senders whose keys and windows a member keeps; beyond, the least
/// recently heard are dropped.
const MAX_SENDERS: usize = 1024;

/// Whether group `group` admits anyone who knows its port (an *open*
/// group), or only programs of its owner's uid, on any node (the default):
/// the lowest bit of its port's first byte.
pub fn is_open(group: &PutPort) -> bool {
    group.as_bytes()[0] & 1 == 1
}

/// A fresh port for a new group, open or owned.
pub fn new_group_port(open: bool) -> PutPort {
    loop {
        let port = shoal_cap::GetPort::random().put_port();
        if is_open(&port) == open {
            return port;
        }
    }
}

/// The key of group `group`'s datagrams as a node derives it for a
/// program of `uid` (`docs/security.md`, "Groups"): an owned group's key
/// names the uid, so only programs of the uid that created it, on any
/// node, hold its key and can join it or read it; an open group's is the
/// same for every uid.
pub fn group_key(cluster: &ClusterKey, group: &PutPort, uid: u32) -> [u8; 32] {
    let owner = if is_open(group) {
        u64::MAX
    } else {
        u64::from(uid)
    };
    let mut input = [0u8; 56];
    input[..32].copy_from_slice(cluster.as_bytes());
    input[32..48].copy_from_slice(group.as_bytes());
    input[48..].copy_from_slice(&owner.to_le_bytes());
    blake3::derive_key("shoal 2026 group key v2", &input)
}

/// One member's sealing and opening.
pub(crate) struct GroupSeal {
    /// The group key.
    key: [u8; 32],
    /// The group port's first bytes, which every datagram names.
    group: [u8; 8],
    me: MemberId,
    own: Key,
    counter: u64,
    /// Senders heard: their key, their window, and when last heard.
    senders: HashMap<u64, (Key, ReplayWindow, u64)>,
    heard: u64,
    /// Datagrams that did not open, and replays.
    pub bad: u64,
    pub replays: u64,
}

impl GroupSeal {
    pub fn new(key: [u8; 32], group: &PutPort, me: MemberId) -> Self {
        Self {
            key,
            group: group.as_bytes()[..8].try_into().expect("16-byte port"),
            me,
            own: Key::new(ALGORITHM, &member_key(&key, me.0)),
            counter: 0,
            senders: HashMap::default(),
            heard: 0,
            bad: 0,
            replays: 0,
        }
    }

    /// Seals `plain` (a datagram the core made) into `out`.
    pub fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) {
        let header = Header::Group {
            group: self.group,
            incarnation: 0,
            member: self.me.0,
            counter: self.counter,
        };
        self.counter += 1;
        seal(&self.own, &header, &[plain], out);
    }

    /// Opens a member's datagram in place: the range of its plaintext, or
    /// `None` (counted) if it is not this group's, does not open, or was
    /// seen before.
    pub fn open(&mut self, datagram: &mut [u8]) -> Option<std::ops::Range<usize>> {
        let Ok(header @ Header::Group { group, member, .. }) = Header::peek(datagram) else {
            self.bad += 1;
            return None;
        };
        if group != self.group || member == self.me.0 {
            self.bad += 1;
            return None;
        }
        self.heard += 1;
        if !self.senders.contains_key(&member) && self.senders.len() >= MAX_SENDERS {
            let oldest = self
                .senders
                .iter()
                .min_by_key(|(_, s)| s.2)
                .map(|(m, _)| *m);
            if let Some(m) = oldest {
                self.senders.remove(&m);
            }
        }
        let key = self.key;
        let (sender, window, heard) = self.senders.entry(member).or_insert_with(|| {
            (
                Key::new(ALGORITHM, &member_key(&key, member)),
                ReplayWindow::new(),
                0,
            )
        });
        if !window.check(header.counter()) {
            self.replays += 1;
            return None;
        }
        match open(sender, datagram) {
            Ok((header, plain)) => {
                window.accept(header.counter());
                *heard = self.heard;
                let start = header.len();
                Some(start..start + plain.len())
            }
            Err(SessionError::BadTag) | Err(_) => {
                self.bad += 1;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_open_each_other_once_and_nothing_of_another_group() {
        let cluster = ClusterKey::from_bytes([1; 32]);
        let port = new_group_port(false);
        let key = group_key(&cluster, &port, 1000);
        let mut a = GroupSeal::new(key, &port, MemberId(10));
        let mut b = GroupSeal::new(key, &port, MemberId(20));
        let mut d = Vec::new();
        a.seal(b"ordered", &mut d);
        let copy = d.clone();
        let r = b.open(&mut d).expect("opens");
        assert_eq!(&d[r], b"ordered");
        assert!(b.open(&mut copy.clone()).is_none(), "a replay");
        assert_eq!(b.replays, 1);
        // Its own datagram looped back, and another group's, do not open.
        assert!(a.open(&mut copy.clone()).is_none());
        let other = new_group_port(false);
        let mut c = GroupSeal::new(group_key(&cluster, &other, 1000), &other, MemberId(30));
        assert!(c.open(&mut copy.clone()).is_none());
        // Nor one sealed under another cluster's key for this group.
        let mut e = GroupSeal::new(
            group_key(&ClusterKey::from_bytes([9; 32]), &port, 1000),
            &port,
            MemberId(40),
        );
        let mut f = Vec::new();
        e.seal(b"x", &mut f);
        assert!(b.open(&mut f).is_none());
        assert_eq!(b.bad, 1);
        // Nor one sealed by a program of another uid.
        let mut g = GroupSeal::new(group_key(&cluster, &port, 1001), &port, MemberId(50));
        let mut h = Vec::new();
        g.seal(b"y", &mut h);
        assert!(b.open(&mut h).is_none());
        assert_eq!(b.bad, 2);
    }

    #[test]
    fn an_owned_group_s_key_names_its_uid_an_open_one_s_does_not() {
        let cluster = ClusterKey::from_bytes([1; 32]);
        let owned = new_group_port(false);
        let open = new_group_port(true);
        assert!(!is_open(&owned) && is_open(&open));
        assert_ne!(
            group_key(&cluster, &owned, 0),
            group_key(&cluster, &owned, 1000)
        );
        assert_eq!(
            group_key(&cluster, &open, 0),
            group_key(&cluster, &open, 1000)
        );
        assert_ne!(
            group_key(&cluster, &open, 0),
            group_key(&cluster, &owned, 0)
        );
    }
}
