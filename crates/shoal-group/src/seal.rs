//! Group datagrams sealed (`docs/security.md`, "Groups"): every datagram a
//! member sends, multicast or unicast, travels as a class 7 datagram,
//! encrypted under its sender's key for the current key epoch, with a
//! counter per sender and a replay window per sender and epoch at each
//! receiver.  Without I/O: the current time comes in with each call, so
//! the simulator (`shoal-sim`, `group_keys.rs`) seals and opens with this
//! same code.
//!
//! A group's keys are random: the creator draws the first, and the
//! sequencer a new one whenever the membership changes and every
//! [`crate::keys::REKEY_EVERY`], handing it to each member over an
//! endpoint channel (`keys.rs`).  Each member seals with
//! `member_key(epoch key, its member id)`; member ids are drawn afresh by
//! every member that joins, so its counters start at zero.  A member
//! opens the epochs it holds (the current one, and those before for a
//! short while), and sends in the current one once the sequencer does.
//! Epoch ids are random, not counted: two sequencers (one cut off by a
//! partition, one after a reset) never draw one id for two keys.

use std::time::Duration;

use rustc_hash::FxHashMap as HashMap;
use shoal_cap::PutPort;
use shoal_proto::Time;
use shoal_session::kdf::member_key;
use shoal_session::{Algorithm, Header, Key, ReplayWindow, SessionError, open, seal};
use shoal_wire::MemberId;

/// The AEAD of group datagrams: one for all members, whatever their CPUs
/// (`ring` falls back to a constant-time AES where there is no AES-NI).
const ALGORITHM: Algorithm = Algorithm::Aes256Gcm;

/// Senders whose keys and windows a member keeps; beyond, the least
/// recently heard are dropped.
const MAX_SENDERS: usize = 1024;

/// How long a member still opens an epoch after it has a newer one:
/// datagrams sealed just before the switch, and retransmissions of them.
const OLD_EPOCH_GRACE: Duration = Duration::from_secs(2);

/// Most epochs a member holds: the current one and two before it.
const MAX_EPOCHS: usize = 3;

/// How long a member opens an epoch it holds for opening only.
const EXTRA_FOR: Duration = Duration::from_secs(10);

/// One epoch's key, and when a member stops opening it.
struct Epoch {
    number: u32,
    key: [u8; 32],
    retire: Option<Time>,
}

/// One member's sealing and opening.
pub struct GroupSeal {
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
    /// The last epoch seen in a datagram of this group that this member
    /// does not hold: it missed a key, or was left out of one.
    unknown: Option<u32>,
    /// Epochs this member held and dropped (the last few): a datagram in
    /// one is late, not a sign of a missed key.
    dropped: Vec<u32>,
    /// Epochs of others, held for opening only, for [`EXTRA_FOR`]: what a
    /// member cut off from the others (or they from it) needs to hear
    /// that it is out, and they to tell it.
    extra: Vec<Epoch>,
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
            unknown: None,
            dropped: Vec::new(),
            extra: Vec::new(),
        }
    }

    /// An epoch a datagram of this group came in that this member does
    /// not hold (still).
    pub fn behind(&self) -> Option<u32> {
        self.unknown.filter(|u| !self.holds(*u))
    }

    fn holds(&self, epoch: u32) -> bool {
        self.epochs
            .iter()
            .chain(&self.extra)
            .any(|e| e.number == epoch)
    }

    /// Holds epoch `number`, not this member's group's own, for opening
    /// only, for [`EXTRA_FOR`]; false if it was held already.
    pub fn add_extra(&mut self, now: Time, number: u32, key: [u8; 32]) -> bool {
        if self.holds(number) {
            return false;
        }
        self.found(number);
        if self.extra.len() >= 2 {
            let gone = self.extra.remove(0).number;
            self.forget(gone);
        }
        self.extra.push(Epoch {
            number,
            key,
            retire: Some(now + EXTRA_FOR),
        });
        true
    }

    /// The current epoch (the one taken last), and its key.
    pub fn newest(&self) -> (u32, [u8; 32]) {
        let e = self.epochs.last().expect("an epoch");
        (e.number, e.key)
    }

    /// The epoch this member sends in.
    pub fn sending(&self) -> u32 {
        self.sending
    }

    /// Takes epoch `number` as the current one, for opening; with `send`,
    /// for sending too (the sequencer, once every member has it); false if
    /// it was held already.  The others are opened for
    /// [`OLD_EPOCH_GRACE`] more, then dropped.
    pub fn add(&mut self, now: Time, number: u32, key: [u8; 32], send: bool) -> bool {
        // One held for opening only becomes the group's own.
        self.extra.retain(|e| e.number != number);
        if self.holds(number) {
            return false;
        }
        // Current with the group again: an epoch missed before is no
        // longer wanted (a datagram still sent in it will say so again).
        self.unknown = None;
        let retire = now + OLD_EPOCH_GRACE;
        for e in &mut self.epochs {
            e.retire.get_or_insert(retire);
        }
        self.epochs.push(Epoch {
            number,
            key,
            retire: None,
        });
        while self.epochs.len() > MAX_EPOCHS {
            let gone = self.epochs.remove(0).number;
            self.forget(gone);
        }
        if send || !self.holds(self.sending) {
            self.send_in(number);
        }
        true
    }

    /// Epoch `number` is held now: if it was the one missed, it is no
    /// longer (else, once dropped, it would look missed again, and the
    /// member would ask for it for ever).
    fn found(&mut self, number: u32) {
        if self.unknown == Some(number) {
            self.unknown = None;
        }
    }

    /// Sends in epoch `number` (held) from now on.
    fn send_in(&mut self, number: u32) {
        if let Some(e) = self.epochs.iter().find(|e| e.number == number) {
            self.own = Key::new(ALGORITHM, &member_key(&e.key, self.me.0));
            self.sending = number;
        }
    }

    /// Forgets a dropped epoch's senders, and remembers that it was held.
    fn forget(&mut self, gone: u32) {
        self.senders.retain(|(e, _), _| *e != gone);
        if self.dropped.len() >= 8 {
            self.dropped.remove(0);
        }
        self.dropped.push(gone);
    }

    /// Drops epochs whose grace has passed (not the newest).
    fn retire(&mut self, now: Time) {
        if self.epochs.len() < 2 && self.extra.is_empty() {
            return;
        }
        let newest = self.newest().0;
        let gone: Vec<u32> = self
            .epochs
            .iter()
            .chain(&self.extra)
            .filter(|e| e.number != newest && e.retire.is_some_and(|t| t <= now))
            .map(|e| e.number)
            .collect();
        if gone.is_empty() {
            return;
        }
        self.epochs.retain(|e| !gone.contains(&e.number));
        self.extra.retain(|e| !gone.contains(&e.number));
        for g in gone {
            self.forget(g);
        }
        if !self.holds(self.sending) {
            self.send_in(newest);
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
    /// held, does not open, or was seen before.  A datagram in the current
    /// epoch, while this member still sends in an earlier one, moves its
    /// sending there.
    pub fn open(&mut self, now: Time, datagram: &mut [u8]) -> Option<std::ops::Range<usize>> {
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
        self.retire(now);
        let Some(key) = self
            .epochs
            .iter()
            .chain(&self.extra)
            .find(|e| e.number == epoch)
            .map(|e| e.key)
        else {
            if !self.dropped.contains(&epoch) {
                self.unknown = Some(epoch);
            }
            self.bad += 1;
            return None;
        };
        self.heard += 1;
        // A sender not heard yet gets its entry (a key schedule) only once
        // a datagram of its opened: forged headers make none.
        let id = (epoch, member);
        let fresh = (!self.senders.contains_key(&id)).then(|| {
            (
                Key::new(ALGORITHM, &member_key(&key, member)),
                ReplayWindow::new(),
                0,
            )
        });
        let (sender, window, _) = match &fresh {
            Some(f) => f,
            None => &self.senders[&id],
        };
        if !window.check(header.counter()) {
            self.replays += 1;
            return None;
        }
        let opened = open(sender, datagram);
        match opened {
            Ok((header, plain)) => {
                if let Some(f) = fresh {
                    if self.senders.len() >= MAX_SENDERS {
                        let oldest = self
                            .senders
                            .iter()
                            .min_by_key(|(_, s)| s.2)
                            .map(|(m, _)| *m);
                        if let Some(m) = oldest {
                            self.senders.remove(&m);
                        }
                    }
                    self.senders.insert(id, f);
                }
                let (_, window, heard) = self.senders.get_mut(&id).expect("just kept");
                window.accept(header.counter());
                *heard = self.heard;
                let start = header.len();
                if epoch == self.newest().0 && self.sending != epoch {
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

    const T: Time = Time(1_000_000);

    fn group_port(open: bool, n: u8) -> PutPort {
        PutPort::from_bytes([
            if open { 1 } else { 2 },
            n,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ])
    }

    #[test]
    fn members_open_each_other_once_and_nothing_of_another_group() {
        let port = group_port(false, 1);
        let key = [7u8; 32];
        let mut a = GroupSeal::new(0, key, &port, MemberId(10));
        let mut b = GroupSeal::new(0, key, &port, MemberId(20));
        let mut d = Vec::new();
        a.seal(b"ordered", &mut d);
        let copy = d.clone();
        let r = b.open(T, &mut d).expect("opens");
        assert_eq!(&d[r], b"ordered");
        assert!(b.open(T, &mut copy.clone()).is_none(), "a replay");
        assert_eq!(b.replays, 1);
        // Its own datagram looped back, and another group's, do not open.
        assert!(a.open(T, &mut copy.clone()).is_none());
        let other = group_port(false, 2);
        let mut c = GroupSeal::new(0, key, &other, MemberId(30));
        assert!(c.open(T, &mut copy.clone()).is_none());
        // Nor one sealed under another key for this group.
        let mut e = GroupSeal::new(0, [9; 32], &port, MemberId(40));
        let mut f = Vec::new();
        e.seal(b"x", &mut f);
        assert!(b.open(T, &mut f).is_none());
        assert_eq!(b.bad, 1);
    }

    /// Review 3, L2: forged datagrams naming senders nobody heard make no
    /// sender entries; a real sender's first datagram does.
    #[test]
    fn forged_senders_make_no_entries() {
        let port = group_port(false, 1);
        let mut b = GroupSeal::new(0, [7u8; 32], &port, MemberId(20));
        let mut e = GroupSeal::new(0, [7u8; 32], &port, MemberId(40));
        let mut real = Vec::new();
        e.seal(b"x", &mut real);
        for member in 1000..1100u64 {
            let mut forged = real.clone();
            forged[16..24].copy_from_slice(&member.to_le_bytes());
            assert!(b.open(T, &mut forged).is_none());
        }
        assert!(b.senders.is_empty());
        assert!(b.open(T, &mut real).is_some());
        assert_eq!(b.senders.len(), 1);
    }

    #[test]
    fn a_member_left_behind_by_a_new_epoch_opens_nothing_sent_in_it() {
        let port = group_port(true, 1);
        let (k0, k1) = ([1u8; 32], [2u8; 32]);
        let mut seq = GroupSeal::new(0, k0, &port, MemberId(1));
        let mut stays = GroupSeal::new(0, k0, &port, MemberId(2));
        let mut left = GroupSeal::new(0, k0, &port, MemberId(3));
        // The sequencer hands epoch 1 to the member that stays, then
        // sends in it; the one that left never gets it.
        stays.add(T, 1, k1, false);
        assert_eq!(stays.sending(), 0, "not before the sequencer does");
        seq.add(T, 1, k1, true);
        let mut d = Vec::new();
        seq.seal(b"after", &mut d);
        let copy = d.clone();
        let r = stays
            .open(T, &mut d)
            .expect("the member that stays opens it");
        assert_eq!(&d[r], b"after");
        assert_eq!(stays.sending(), 1, "and sends in the new epoch from now on");
        assert!(left.open(T, &mut copy.clone()).is_none());
        // What the member that stays sends now, the other cannot read.
        let mut e = Vec::new();
        stays.seal(b"too", &mut e);
        assert!(left.open(T, &mut e.clone()).is_none());
        assert!(seq.open(T, &mut e).is_some());
        // A datagram still sealed in epoch 0 opens during the grace.
        let mut late = Vec::new();
        left.seal(b"late", &mut late);
        assert!(stays.open(T, &mut late).is_some());
    }

    #[test]
    fn three_epochs_at_most_and_a_member_knows_which_it_missed() {
        let port = group_port(false, 1);
        let mut a = GroupSeal::new(10, [1; 32], &port, MemberId(1));
        let mut b = GroupSeal::new(10, [1; 32], &port, MemberId(2));
        let mut old = Vec::new();
        a.seal(b"epoch 10", &mut old);
        assert!(b.add(T, 7, [2; 32], false));
        assert!(b.add(T, 30, [3; 32], false));
        assert!(
            b.add(T, 5, [4; 32], true),
            "ids are not ordered: the last taken is current"
        );
        assert_eq!((b.newest().0, b.sending()), (5, 5));
        assert!(
            b.open(T, &mut old).is_none(),
            "a fourth epoch pushes the first out"
        );
        assert_eq!(b.behind(), None, "an epoch it dropped is not one it missed");
        // A member that missed epochs knows which from the datagrams.
        let mut d = Vec::new();
        b.seal(b"epoch 5", &mut d);
        assert!(a.open(T, &mut d).is_none());
        assert_eq!(a.behind(), Some(5));
        assert!(a.add(T, 5, [4; 32], false));
        assert_eq!(a.behind(), None);
        // An epoch held already changes nothing.
        assert!(!b.add(T, 30, [3; 32], true));
        assert_eq!((b.newest().0, b.sending()), (5, 5));
    }

    #[test]
    fn a_missed_epoch_is_wanted_only_until_the_member_is_current_again() {
        let port = group_port(false, 1);
        let mut a = GroupSeal::new(10, [1; 32], &port, MemberId(1));
        let mut b = GroupSeal::new(10, [1; 32], &port, MemberId(2));
        b.add(T, 20, [2; 32], true);
        let mut d = Vec::new();
        b.seal(b"epoch 20", &mut d);
        assert!(a.open(T, &mut d).is_none());
        assert_eq!(a.behind(), Some(20));
        // Taken, then dropped once two newer ones are past their grace:
        // not missed again.
        a.add(T, 20, [2; 32], false);
        a.add(T, 30, [3; 32], false);
        a.add(T, 40, [4; 32], false);
        let later = T + OLD_EPOCH_GRACE * 2;
        let mut e = Vec::new();
        let mut c = GroupSeal::new(40, [4; 32], &port, MemberId(3));
        c.seal(b"epoch 40", &mut e);
        assert!(a.open(later, &mut e).is_some());
        assert_eq!(a.behind(), None);
        // Another missed epoch is forgotten once the member takes a new
        // one of its group's own.
        let mut f = Vec::new();
        let mut other = GroupSeal::new(50, [5; 32], &port, MemberId(4));
        other.seal(b"epoch 50", &mut f);
        assert!(a.open(later, &mut f).is_none());
        assert_eq!(a.behind(), Some(50));
        a.add(later, 60, [6; 32], false);
        assert_eq!(a.behind(), None);
    }

    #[test]
    fn another_side_s_epoch_opens_without_becoming_this_member_s_own() {
        let port = group_port(false, 1);
        let mut cut_off = GroupSeal::new(40, [1; 32], &port, MemberId(1));
        let mut other = GroupSeal::new(50, [2; 32], &port, MemberId(2));
        let mut d = Vec::new();
        other.seal(b"you are out", &mut d);
        assert!(cut_off.open(T, &mut d.clone()).is_none());
        assert_eq!(cut_off.behind(), Some(50));
        assert!(cut_off.add_extra(T, 50, [2; 32]));
        assert_eq!(cut_off.behind(), None);
        let r = cut_off.open(T, &mut d).expect("opens the other side's");
        assert_eq!(&d[r], b"you are out");
        assert_eq!(
            (cut_off.newest().0, cut_off.sending()),
            (40, 40),
            "and still sends in its own"
        );
        // Pushed later as the group's own, it becomes current.
        assert!(cut_off.add(T, 50, [2; 32], true));
        assert_eq!((cut_off.newest().0, cut_off.sending()), (50, 50));
    }
}
