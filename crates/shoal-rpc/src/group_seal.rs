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

/// The key of group `group`'s datagrams, as every member derives it.
pub fn group_key(cluster: &ClusterKey, group: &PutPort) -> [u8; 32] {
    let mut input = [0u8; 48];
    input[..32].copy_from_slice(cluster.as_bytes());
    input[32..].copy_from_slice(group.as_bytes());
    blake3::derive_key("shoal 2026 group key v1", &input)
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
        let port = shoal_cap::GetPort::from_bytes([2; 16]).put_port();
        let key = group_key(&cluster, &port);
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
        let other = shoal_cap::GetPort::from_bytes([3; 16]).put_port();
        let mut c = GroupSeal::new(group_key(&cluster, &other), &other, MemberId(30));
        assert!(c.open(&mut copy.clone()).is_none());
        // Nor one sealed under another cluster's key for this group.
        let mut e = GroupSeal::new(
            group_key(&ClusterKey::from_bytes([9; 32]), &port),
            &port,
            MemberId(40),
        );
        let mut f = Vec::new();
        e.seal(b"x", &mut f);
        assert!(b.open(&mut f).is_none());
        assert_eq!(b.bad, 1);
    }
}
