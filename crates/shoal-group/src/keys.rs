//! A group's keys (`docs/security.md`, "Groups"), the decisions: random,
//! held only by its members, handed from member to member over endpoint
//! channels.  Without I/O, as the rest of this crate: the shell
//! (`shoal_groupsvc::keys`) serves the requests, makes the calls and
//! draws the randomness; the simulator (`shoal-sim`, `group_keys.rs`)
//! drives the same [`KeyCore`] over a lossy network.
//!
//! Every member serves a **key service** on a port of its own:
//!
//! - [`KeyRequest::Admit`]: a joiner (or `shoal group info`) asks a member
//!   for the group's keys. An owned group's member answers only its own
//!   uid; an open group's anyone ([`admits`]).
//! - [`KeyRequest::Rekey`]: the sequencer hands each member the next
//!   epoch's key, whenever the membership changes and every
//!   [`REKEY_EVERY`] ([`KeyCore::rekey_due`], for a [`Membership`]), with a MAC under the
//!   group's master secret; only after every member answered (or its call
//!   timed out) does it send in the new epoch ([`KeyCore::drawn`]). A
//!   member that left or was expelled gets no later key, and cannot read
//!   the group's traffic from then on.
//!
//! A member that sees a datagram of an epoch newer than it holds (its
//! push was lost, or it was expelled while cut off) asks the sequencer, or
//! another member, for the keys again with `Admit`
//! ([`KeyCore::catch_up_due`], [`KeyCore::caught`]): so it either goes on,
//! or learns from the sequencer that it is out and joins again.
//!
//! A member takes a rekey only for an epoch it has not held before: a
//! push delayed past its call's deadline, arriving after a later one,
//! would otherwise take the member back to an epoch the others have left.
//!
//! The wire formats are in [`encode_request`] and [`encode_reply`].

use std::time::Duration;

use shoal_cap::PutPort;
use shoal_proto::Time;
use shoal_wire::{GroupSeq, Incarnation};

/// How often a sequencer draws a new key when the membership is steady:
/// the longest a member on a revoked node, or one that can no longer be
/// reached through its node, stays in the group.
pub const REKEY_EVERY: Duration = Duration::from_secs(10);

/// How often a member looks whether it should rekey (as the sequencer)
/// or catch up.
pub const KEY_POLL: Duration = Duration::from_millis(50);

/// How long a member waits for another's key service to answer.
pub const PUSH_DEADLINE: Duration = Duration::from_secs(2);

/// How often a member that is behind asks for keys.
pub const CATCH_UP_EVERY: Duration = Duration::from_millis(500);

/// Most members a key message names.
const MAX_MEMBERS: usize = 4096;

/// Epochs a member remembers having held, beyond the one it holds: a
/// rekey for one of them is late, not new.
const MAX_PAST: usize = 16;

/// Whether group `group` admits anyone who knows its port (an *open*
/// group), or only programs of its owner's uid, on any node (the default):
/// the lowest bit of its port's first byte.
pub fn is_open(group: &PutPort) -> bool {
    group.as_bytes()[0] & 1 == 1
}

/// Whether a member of uid `member_uid` of `group` gives its keys to, or
/// takes them from, a caller of uid `caller_uid`: anyone for an open
/// group, the same uid for an owned one.
pub fn admits(group: &PutPort, member_uid: u32, caller_uid: u32) -> bool {
    is_open(group) || member_uid == caller_uid
}

/// A fresh epoch id from `draw`: random, so that two sequencers (one cut
/// off by a partition, one after a reset) never draw the same id for
/// different keys; never 0 or `avoid`.
pub fn new_epoch(avoid: u32, mut draw: impl FnMut() -> u32) -> u32 {
    loop {
        let e = draw();
        if e != 0 && e != avoid {
            return e;
        }
    }
}

/// A group's keys as a member holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// The group's master secret: the MAC of every rekey. Drawn by the
    /// creator; the same for the group's life.
    pub master: [u8; 32],
    /// The current epoch and its key.
    pub epoch: u32,
    pub key: [u8; 32],
    /// The members the epoch's key was made for, ascending.
    pub members: Vec<u64>,
}

/// A request to a member's key service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRequest {
    Admit,
    Rekey {
        epoch: u32,
        key: [u8; 32],
        members: Vec<u64>,
        mac: [u8; 32],
    },
}

impl KeyRequest {
    /// The rekey that hands `keys` to the members it names.
    pub fn rekey(keys: &Keys) -> KeyRequest {
        KeyRequest::Rekey {
            epoch: keys.epoch,
            key: keys.key,
            members: keys.members.clone(),
            mac: rekey_mac(&keys.master, keys.epoch, &keys.key, &keys.members),
        }
    }
}

/// A key service's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyReply {
    Admitted(Keys),
    Taken,
    Refused(String),
}

/// The MAC of a rekey, under the group's master secret.
pub fn rekey_mac(master: &[u8; 32], epoch: u32, key: &[u8; 32], members: &[u64]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(master);
    h.update(b"shoal 2026 group rekey v1");
    h.update(&epoch.to_le_bytes());
    h.update(key);
    for m in members {
        h.update(&m.to_le_bytes());
    }
    *h.finalize().as_bytes()
}

/// Which membership a sequencer drew a key for: its incarnation and the
/// entry that last changed the members
/// ([`crate::GroupCore::membership`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Membership {
    pub incarnation: Incarnation,
    pub entry: GroupSeq,
}

/// What a member does with keys another member gave it when it asked for
/// an epoch it missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Catch {
    /// The group's own next epoch, whose push was lost: take it as
    /// current.
    Own(u32, [u8; 32]),
    /// Another side's (a member cut off from the sequencer asked one
    /// that is not): open it for a while, enough to hear it, or for it to
    /// hear that it is out.
    Extra(u32, [u8; 32]),
}

/// One member's key decisions: what it holds, when it last drew a key as
/// sequencer, when it last asked for one it missed.
#[derive(Debug, Clone)]
pub struct KeyCore {
    keys: Keys,
    /// Epochs held before the current one, newest last.
    past: Vec<u32>,
    /// When this member last drew a key as sequencer, and for which
    /// membership.
    drawn: Option<(Time, Membership)>,
    caught_up: Option<Time>,
    /// Rekeys taken, and requests refused.
    pub taken: u64,
    pub refused: u64,
}

impl KeyCore {
    pub fn new(keys: Keys) -> KeyCore {
        KeyCore {
            keys,
            past: Vec::new(),
            drawn: None,
            caught_up: None,
            taken: 0,
            refused: 0,
        }
    }

    /// The keys held now.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Counts a request refused before it reached [`KeyCore::answer`]
    /// (the shell's own checks), and says why.
    pub fn refuse(&mut self, why: String) -> KeyReply {
        self.refused += 1;
        KeyReply::Refused(why)
    }

    /// The answer of a member of uid `my_uid` to `request` from a caller
    /// of uid `caller_uid`, and the epoch to open from now on if it took
    /// a rekey.
    pub fn answer(
        &mut self,
        group: &PutPort,
        my_uid: u32,
        caller_uid: u32,
        request: &[u8],
    ) -> (KeyReply, Option<(u32, [u8; 32])>) {
        if !admits(group, my_uid, caller_uid) {
            let why = format!(
                "group {group} admits only programs of its creator's uid (created without --open)"
            );
            return (self.refuse(why), None);
        }
        match decode_request(request) {
            Ok(KeyRequest::Admit) => (KeyReply::Admitted(self.keys.clone()), None),
            Ok(KeyRequest::Rekey {
                epoch,
                key,
                members,
                mac,
            }) => {
                let want = rekey_mac(&self.keys.master, epoch, &key, &members);
                if !subtle_eq(&want, &mac) {
                    return (self.refuse("the rekey's MAC does not match".into()), None);
                }
                if epoch == self.keys.epoch || self.past.contains(&epoch) {
                    return (KeyReply::Taken, None);
                }
                self.install(Keys {
                    master: self.keys.master,
                    epoch,
                    key,
                    members,
                });
                self.taken += 1;
                (KeyReply::Taken, Some((epoch, key)))
            }
            Err(e) => (self.refuse(e.to_string()), None),
        }
    }

    /// Makes `keys` the current ones, remembering the epoch they replace.
    fn install(&mut self, keys: Keys) {
        if self.past.len() >= MAX_PAST {
            self.past.remove(0);
        }
        self.past.push(self.keys.epoch);
        self.keys = keys;
    }

    /// Whether this member, the sequencer of `membership` in normal
    /// operation, should draw the next epoch's key at `now`: the
    /// membership changed since the last (even if only for a member that
    /// joined and left again: it holds the key), or [`REKEY_EVERY`] has
    /// passed, or it never drew one.
    pub fn rekey_due(&self, now: Time, membership: Membership) -> bool {
        self.drawn
            .is_none_or(|(t, m)| m != membership || now - t >= REKEY_EVERY)
    }

    /// The next epoch's keys for `members`: the epoch from `draw_epoch`
    /// (see [`new_epoch`]), the key `key` (random).
    pub fn next(&self, members: Vec<u64>, draw_epoch: impl FnMut() -> u32, key: [u8; 32]) -> Keys {
        Keys {
            master: self.keys.master,
            epoch: new_epoch(self.keys.epoch, draw_epoch),
            key,
            members,
        }
    }

    /// The sequencer handed `next`, drawn for `membership`, to every
    /// member (or gave up on those that did not answer) at `now`: it is
    /// current, and the sequencer sends in it.
    pub fn drawn(&mut self, now: Time, membership: Membership, next: Keys) {
        self.drawn = Some((now, membership));
        self.install(next);
    }

    /// Whether a member that is behind asks for keys at `now` (at most
    /// every [`CATCH_UP_EVERY`]); if so, the time is noted.
    pub fn catch_up_due(&mut self, now: Time) -> bool {
        if self.caught_up.is_some_and(|t| now - t < CATCH_UP_EVERY) {
            return false;
        }
        self.caught_up = Some(now);
        true
    }

    /// A member asked for epoch `want` got `keys` from another, which is
    /// its sequencer if `from_sequencer`: what to open, if anything (keys
    /// of another epoch or another group's master are no use).
    pub fn caught(&mut self, want: u32, from_sequencer: bool, keys: &Keys) -> Option<Catch> {
        if keys.epoch != want || keys.master != self.keys.master {
            return None;
        }
        if from_sequencer {
            if keys.epoch != self.keys.epoch {
                self.install(keys.clone());
            }
            Some(Catch::Own(keys.epoch, keys.key))
        } else {
            Some(Catch::Extra(keys.epoch, keys.key))
        }
    }
}

/// Constant-time equality of two MACs.
fn subtle_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

fn put_members(out: &mut Vec<u8>, members: &[u64]) {
    out.extend_from_slice(&(members.len() as u16).to_le_bytes());
    for m in members {
        out.extend_from_slice(&m.to_le_bytes());
    }
}

/// `Admit`: `1`. `Rekey`: `2`, epoch (u32 LE), key (32), member count
/// (u16 LE), members (u64 LE each), MAC (32).
pub fn encode_request(r: &KeyRequest) -> Vec<u8> {
    match r {
        KeyRequest::Admit => vec![1],
        KeyRequest::Rekey {
            epoch,
            key,
            members,
            mac,
        } => {
            let mut out = vec![2];
            out.extend_from_slice(&epoch.to_le_bytes());
            out.extend_from_slice(key);
            put_members(&mut out, members);
            out.extend_from_slice(mac);
            out
        }
    }
}

/// `Admitted`: `0`, master (32), epoch (u32 LE), key (32), member count
/// (u16 LE), members (u64 LE each). `Taken`: `1`. `Refused`: `2`, a UTF-8
/// message.
pub fn encode_reply(r: &KeyReply) -> Vec<u8> {
    match r {
        KeyReply::Admitted(k) => {
            let mut out = vec![0];
            out.extend_from_slice(&k.master);
            out.extend_from_slice(&k.epoch.to_le_bytes());
            out.extend_from_slice(&k.key);
            put_members(&mut out, &k.members);
            out
        }
        KeyReply::Taken => vec![1],
        KeyReply::Refused(m) => {
            let mut out = vec![2];
            out.extend_from_slice(m.as_bytes());
            out
        }
    }
}

/// Why a key message did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed group key message: {0}")]
pub struct KeyDecodeError(&'static str);

impl From<shoal_cap::codec::DecodeError> for KeyDecodeError {
    fn from(e: shoal_cap::codec::DecodeError) -> KeyDecodeError {
        KeyDecodeError(e.why)
    }
}

type Reader<'a> = shoal_cap::codec::Reader<'a>;

fn reader(bytes: &[u8]) -> Reader<'_> {
    Reader::new(bytes, "group key message")
}

/// A member list: u16 count, then ascending u64 ids.
fn members(r: &mut Reader<'_>) -> Result<Vec<u64>, KeyDecodeError> {
    let n = r.u16()? as usize;
    if n > MAX_MEMBERS {
        return Err(KeyDecodeError("too many members"));
    }
    let mut list = Vec::with_capacity(r.count(n, 8)?);
    for _ in 0..n {
        list.push(r.u64()?);
    }
    if list.windows(2).any(|w| w[0] >= w[1]) {
        return Err(KeyDecodeError("members not ascending"));
    }
    Ok(list)
}

pub fn decode_request(bytes: &[u8]) -> Result<KeyRequest, KeyDecodeError> {
    let mut r = reader(bytes);
    let request = match r.u8()? {
        1 => KeyRequest::Admit,
        2 => KeyRequest::Rekey {
            epoch: r.u32()?,
            key: r.array()?,
            members: members(&mut r)?,
            mac: r.array()?,
        },
        _ => return Err(KeyDecodeError("unknown request")),
    };
    r.end()?;
    Ok(request)
}

pub fn decode_reply(bytes: &[u8]) -> Result<KeyReply, KeyDecodeError> {
    let mut r = reader(bytes);
    let reply = match r.u8()? {
        0 => KeyReply::Admitted(Keys {
            master: r.array()?,
            epoch: r.u32()?,
            key: r.array()?,
            members: members(&mut r)?,
        }),
        1 => KeyReply::Taken,
        2 => {
            let text = std::str::from_utf8(r.rest()).map_err(|_| KeyDecodeError("not UTF-8"))?;
            KeyReply::Refused(text.to_string())
        }
        _ => return Err(KeyDecodeError("unknown reply")),
    };
    r.end()?;
    Ok(reply)
}

#[cfg(test)]
mod tests;
