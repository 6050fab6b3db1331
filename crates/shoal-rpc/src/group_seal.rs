//! Group datagrams sealed (`docs/security.md`, "Groups"): every datagram a
//! member sends, multicast or unicast, travels as a class 7 datagram,
//! encrypted under its sender's key for the current key epoch, with a
//! counter per sender and a replay window per sender and epoch at each
//! receiver.
//!
//! A group's keys are random: the creator draws the first, and the
//! sequencer a new one whenever the membership changes and every
//! [`crate::group_keys::REKEY_EVERY`], handing it to each member over an
//! endpoint channel (`group_keys`).  Each member seals with
//! `member_key(epoch key, its member id)`; member ids are drawn afresh by
//! every member that joins, so its counters start at zero.  A member
//! opens the epochs it holds (the newest, and the one before for a short
//! while), and sends in the newest once the sequencer does.

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap as HashMap;
use shoal_cap::PutPort;
use shoal_session::kdf::member_key;
use shoal_session::{Algorithm, Header, Key, ReplayWindow, SessionError, open, seal};
use shoal_wire::MemberId;

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

/// How long a member still opens an epoch after it has a newer one:
/// datagrams sealed just before the switch, and retransmissions of them.
pub(crate) const OLD_EPOCH_GRACE: Duration = Duration::from_secs(2);

/// One epoch's key, and when a member stops opening it.
struct Epoch {
    number: u32,
    key: [u8; 32],
    retire: Option<Instant>,
}

/// One member's sealing and opening.
pub(crate) struct GroupSeal {
    /// The epochs held, oldest first (at most two).
    epochs: Vec<Epoch>,
    /// The epoch this member sends in.
    sending: u32,
    /// The group port's first bytes, which every datagram names.
    group: [u8; 8],
    me: MemberId,
    own: Key,
    counter: u64,
    /// Senders heard, by (epoch, member): their key, their window, and
    /// when last heard.
    senders: HashMap<(u32, u64), (Key, ReplayWindow, u64)>,
    heard: u64,
    /// Datagrams that did not open, and replays.
    pub bad: u64,
    pub replays: u64,
    /// The newest epoch seen in a datagram of this group that is newer
    /// than any held: this member missed a key (or was left out of it).
    pub ahead: u32,
}

impl GroupSeal {
    pub fn new(epoch: u32, key: [u8; 32], group: &PutPort, me: MemberId) -> Self {
        Self {
            epochs: vec![Epoch {
                number: epoch,
                key,
                retire: None,
            }],
            sending: epoch,
            group: group.as_bytes()[..8].try_into().expect("16-byte port"),
            me,
            own: Key::new(ALGORITHM, &member_key(&key, me.0)),
            counter: 0,
            senders: HashMap::default(),
            heard: 0,
            bad: 0,
            replays: 0,
            ahead: 0,
        }
    }

    /// Whether a datagram showed a newer epoch than any held.
    pub fn behind(&self) -> bool {
        self.ahead > self.newest().0
    }

    /// The newest epoch held, and its key.
    pub fn newest(&self) -> (u32, [u8; 32]) {
        let e = self.epochs.last().expect("an epoch");
        (e.number, e.key)
    }

    /// The epoch this member sends in.
    pub fn sending(&self) -> u32 {
        self.sending
    }

    /// Takes epoch `number` (newer than any held) for opening; with
    /// `send`, for sending too (the sequencer, once every member has it).
    /// Older epochs are opened for [`OLD_EPOCH_GRACE`] more, then dropped.
    pub fn add(&mut self, number: u32, key: [u8; 32], send: bool) {
        if number <= self.newest().0 {
            return;
        }
        let retire = Instant::now() + OLD_EPOCH_GRACE;
        for e in &mut self.epochs {
            e.retire.get_or_insert(retire);
        }
        self.epochs.push(Epoch {
            number,
            key,
            retire: None,
        });
        // At most two: an epoch two behind is gone at once.
        while self.epochs.len() > 2 {
            let gone = self.epochs.remove(0).number;
            self.senders.retain(|(e, _), _| *e != gone);
        }
        if send {
            self.send_in(number);
        }
    }

    /// Sends in epoch `number` (held) from now on.
    fn send_in(&mut self, number: u32) {
        if let Some(e) = self.epochs.iter().find(|e| e.number == number) {
            self.own = Key::new(ALGORITHM, &member_key(&e.key, self.me.0));
            self.sending = number;
        }
    }

    /// Drops epochs whose grace has passed (not the newest).
    fn retire(&mut self) {
        if self.epochs.len() < 2 {
            return;
        }
        let now = Instant::now();
        let newest = self.newest().0;
        let before = self.epochs.len();
        self.epochs
            .retain(|e| e.number == newest || e.retire.is_none_or(|t| t > now));
        if self.epochs.len() != before {
            let held: Vec<u32> = self.epochs.iter().map(|e| e.number).collect();
            self.senders.retain(|(e, _), _| held.contains(e));
            if !held.contains(&self.sending) {
                self.send_in(newest);
            }
        }
    }

    /// Seals `plain` (a datagram the core made) into `out`.
    pub fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) {
        let header = Header::Group {
            group: self.group,
            epoch: self.sending,
            member: self.me.0,
            counter: self.counter,
        };
        self.counter += 1;
        seal(&self.own, &header, &[plain], out);
    }

    /// Opens a member's datagram in place: the range of its plaintext, or
    /// `None` (counted) if it is not this group's, is of an epoch not
    /// held, does not open, or was seen before.  A datagram of a newer
    /// epoch than this member sends in moves its sending there.
    pub fn open(&mut self, datagram: &mut [u8]) -> Option<std::ops::Range<usize>> {
        let Ok(
            header @ Header::Group {
                group,
                epoch,
                member,
                ..
            },
        ) = Header::peek(datagram)
        else {
            self.bad += 1;
            return None;
        };
        if group != self.group || member == self.me.0 {
            self.bad += 1;
            return None;
        }
        self.retire();
        let Some(key) = self
            .epochs
            .iter()
            .find(|e| e.number == epoch)
            .map(|e| e.key)
        else {
            if epoch > self.newest().0 {
                self.ahead = self.ahead.max(epoch);
            }
            self.bad += 1;
            return None;
        };
        self.heard += 1;
        if !self.senders.contains_key(&(epoch, member)) && self.senders.len() >= MAX_SENDERS {
            let oldest = self
                .senders
                .iter()
                .min_by_key(|(_, s)| s.2)
                .map(|(m, _)| *m);
            if let Some(m) = oldest {
                self.senders.remove(&m);
            }
        }
        let (sender, window, heard) = self.senders.entry((epoch, member)).or_insert_with(|| {
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
                if epoch > self.sending {
                    self.send_in(epoch);
                }
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
        let port = new_group_port(false);
        let key = [7u8; 32];
        let mut a = GroupSeal::new(0, key, &port, MemberId(10));
        let mut b = GroupSeal::new(0, key, &port, MemberId(20));
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
        let mut c = GroupSeal::new(0, key, &other, MemberId(30));
        assert!(c.open(&mut copy.clone()).is_none());
        // Nor one sealed under another key for this group.
        let mut e = GroupSeal::new(0, [9; 32], &port, MemberId(40));
        let mut f = Vec::new();
        e.seal(b"x", &mut f);
        assert!(b.open(&mut f).is_none());
        assert_eq!(b.bad, 1);
    }

    #[test]
    fn a_member_left_behind_by_a_new_epoch_opens_nothing_sent_in_it() {
        let port = new_group_port(true);
        let (k0, k1) = ([1u8; 32], [2u8; 32]);
        let mut seq = GroupSeal::new(0, k0, &port, MemberId(1));
        let mut stays = GroupSeal::new(0, k0, &port, MemberId(2));
        let mut left = GroupSeal::new(0, k0, &port, MemberId(3));
        // The sequencer hands epoch 1 to the member that stays, then
        // sends in it; the one that left never gets it.
        stays.add(1, k1, false);
        assert_eq!(stays.sending(), 0, "not before the sequencer does");
        seq.add(1, k1, true);
        let mut d = Vec::new();
        seq.seal(b"after", &mut d);
        let copy = d.clone();
        let r = stays.open(&mut d).expect("the member that stays opens it");
        assert_eq!(&d[r], b"after");
        assert_eq!(stays.sending(), 1, "and sends in the new epoch from now on");
        assert!(left.open(&mut copy.clone()).is_none());
        // What the member that stays sends now, the other cannot read.
        let mut e = Vec::new();
        stays.seal(b"too", &mut e);
        assert!(left.open(&mut e.clone()).is_none());
        assert!(seq.open(&mut e).is_some());
        // A datagram still sealed in epoch 0 opens during the grace.
        let mut late = Vec::new();
        left.seal(b"late", &mut late);
        assert!(stays.open(&mut late).is_some());
    }

    #[test]
    fn an_epoch_two_behind_is_dropped_at_once() {
        let port = new_group_port(false);
        let mut a = GroupSeal::new(0, [1; 32], &port, MemberId(1));
        let mut b = GroupSeal::new(0, [1; 32], &port, MemberId(2));
        let mut old = Vec::new();
        a.seal(b"epoch 0", &mut old);
        b.add(1, [2; 32], false);
        b.add(2, [3; 32], true);
        assert_eq!(b.newest().0, 2);
        assert!(b.open(&mut old).is_none());
        assert!(!b.behind());
        // A member that missed epochs 1 and 2 knows it from the datagrams.
        let mut d = Vec::new();
        b.seal(b"epoch 2", &mut d);
        assert!(a.open(&mut d).is_none());
        assert!(a.behind());
        a.add(2, [3; 32], true);
        assert!(!a.behind());
        // An older epoch handed over late changes nothing.
        b.add(1, [2; 32], true);
        assert_eq!((b.newest().0, b.sending()), (2, 2));
    }
}
