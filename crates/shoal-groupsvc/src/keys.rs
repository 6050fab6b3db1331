//! A group's keys (`docs/security.md`, "Groups"): random, held only by its
//! members, handed from member to member over endpoint channels.
//!
//! Every member serves a **key service** on a port of its own,
//! [`key_port`] (group port, member id), registered with its node like any
//! server, so every request it gets comes with the caller's node and uid
//! from the node sessions:
//!
//! - [`KeyRequest::Admit`]: a joiner (or `shoal group info`) asks a member
//!   for the group's keys. An owned group's member answers only its own
//!   uid; an open group's anyone. A node that was revoked has no session
//!   left to ask through.
//! - [`KeyRequest::Rekey`]: the sequencer hands each member the next
//!   epoch's key, whenever the membership changes and every
//!   [`REKEY_EVERY`], with a MAC under the group's master secret; only
//!   after every member answered (or its call timed out) does it send in
//!   the new epoch. A member that left or was expelled, or lives on a node
//!   that was revoked, gets no later key, and cannot read the group's
//!   traffic from then on; a member that cannot read falls silent, and
//!   the sequencer expels it as it would a dead one.
//!
//! A member that sees a datagram of an epoch newer than it holds (its
//! push was lost, or it was expelled while cut off) asks the sequencer, or
//! another member, for the keys again with `Admit`: so it either goes on,
//! or learns from the sequencer that it is out and joins again.
//!
//! The wire formats are in [`encode_request`] and [`encode_reply`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use shoal_cap::{GetPort, PutPort};
use shoal_wire::MemberId;

use crate::seal::is_open;
use shoal_rpc::CallOptions;
use shoal_rpc::Context;

/// How often a sequencer draws a new key when the membership is steady:
/// the longest a member on a revoked node, or one that can no longer be
/// reached through its node, stays in the group.
pub const REKEY_EVERY: Duration = Duration::from_secs(10);

/// How often a member looks whether it should rekey (as the sequencer)
/// or catch up.
const KEY_POLL: Duration = Duration::from_millis(50);

/// How long a member waits for another's key service to answer.
const PUSH_DEADLINE: Duration = Duration::from_secs(2);

/// The port member `member` of group `group` serves its key service on:
/// public, as a group's locate port is (who may serve it is checked by
/// uid, see [`admits`]).
pub fn key_port(group: &PutPort, member: MemberId) -> GetPort {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(group.as_bytes());
    key[16..24].copy_from_slice(&member.0.to_le_bytes());
    GetPort::derive(&key, "shoal 2026 group member keys v1")
}

/// Whether a member of uid `member_uid` of `group` gives its keys to, or
/// takes them from, a caller of uid `caller_uid`: anyone for an open
/// group, the same uid for an owned one.
pub fn admits(group: &PutPort, member_uid: u32, caller_uid: u32) -> bool {
    is_open(group) || member_uid == caller_uid
}

/// A group's keys as a member holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// The group's master secret: the protocol core's MAC, and the MAC of
    /// every rekey. Drawn by the creator; the same for the group's life.
    pub master: [u8; 32],
    /// The current epoch and its key.
    pub epoch: u32,
    pub key: [u8; 32],
    /// The members the epoch's key was made for, ascending.
    pub members: Vec<u64>,
}

impl Keys {
    /// A new group's keys, for its creator `me`.
    pub fn new(me: MemberId) -> Keys {
        Keys {
            master: rand::random(),
            epoch: crate::seal::new_epoch(0),
            key: rand::random(),
            members: vec![me.0],
        }
    }
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

/// A key service's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyReply {
    Admitted(Keys),
    Taken,
    Refused(String),
}

/// Most members a key message names.
const MAX_MEMBERS: usize = 4096;

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

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], KeyDecodeError> {
        if self.0.len() < n {
            return Err(KeyDecodeError("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], KeyDecodeError> {
        Ok(self.take(N)?.try_into().expect("length taken"))
    }
    fn members(&mut self) -> Result<Vec<u64>, KeyDecodeError> {
        let n = u16::from_le_bytes(self.array()?) as usize;
        if n > MAX_MEMBERS {
            return Err(KeyDecodeError("too many members"));
        }
        let mut list = Vec::with_capacity(n);
        for _ in 0..n {
            list.push(u64::from_le_bytes(self.array()?));
        }
        if list.windows(2).any(|w| w[0] >= w[1]) {
            return Err(KeyDecodeError("members not ascending"));
        }
        Ok(list)
    }
    fn end(&self) -> Result<(), KeyDecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(KeyDecodeError("trailing bytes"))
        }
    }
}

pub fn decode_request(bytes: &[u8]) -> Result<KeyRequest, KeyDecodeError> {
    let mut r = Reader(bytes);
    let request = match r.array::<1>()?[0] {
        1 => KeyRequest::Admit,
        2 => KeyRequest::Rekey {
            epoch: u32::from_le_bytes(r.array()?),
            key: r.array()?,
            members: r.members()?,
            mac: r.array()?,
        },
        _ => return Err(KeyDecodeError("unknown request")),
    };
    r.end()?;
    Ok(request)
}

pub fn decode_reply(bytes: &[u8]) -> Result<KeyReply, KeyDecodeError> {
    let mut r = Reader(bytes);
    let reply = match r.array::<1>()?[0] {
        0 => KeyReply::Admitted(Keys {
            master: r.array()?,
            epoch: u32::from_le_bytes(r.array()?),
            key: r.array()?,
            members: r.members()?,
        }),
        1 => KeyReply::Taken,
        2 => {
            let text = std::str::from_utf8(r.0).map_err(|_| KeyDecodeError("not UTF-8"))?;
            r.0 = &[];
            KeyReply::Refused(text.to_string())
        }
        _ => return Err(KeyDecodeError("unknown reply")),
    };
    r.end()?;
    Ok(reply)
}

/// What a member's key service and its rekeying share.
pub(crate) struct KeyState {
    pub keys: Keys,
    /// When this member last drew a key as sequencer.
    pub drawn: Option<Instant>,
    /// Rekeys taken, and requests refused.
    pub taken: u64,
    pub refused: u64,
    /// When this member last asked for keys it missed.
    pub caught_up: Option<Instant>,
}

pub(crate) type SharedKeys = Arc<Mutex<KeyState>>;

pub(crate) fn shared(keys: Keys) -> SharedKeys {
    Arc::new(Mutex::new(KeyState {
        keys,
        drawn: None,
        taken: 0,
        refused: 0,
        caught_up: None,
    }))
}

/// The answer of a member of uid `my_uid` holding `state` to `request`
/// from a caller of uid `caller_uid`; `take` installs a new epoch's key
/// for opening (the member's seal).
pub(crate) fn answer(
    group: &PutPort,
    my_uid: u32,
    caller_uid: u32,
    state: &SharedKeys,
    request: &[u8],
    take: impl FnOnce(u32, [u8; 32]),
) -> KeyReply {
    if !admits(group, my_uid, caller_uid) {
        state.lock().refused += 1;
        return KeyReply::Refused(format!(
            "group {group} admits only programs of its creator's uid (created without --open)"
        ));
    }
    match decode_request(request) {
        Ok(KeyRequest::Admit) => KeyReply::Admitted(state.lock().keys.clone()),
        Ok(KeyRequest::Rekey {
            epoch,
            key,
            members,
            mac,
        }) => {
            let mut s = state.lock();
            let want = rekey_mac(&s.keys.master, epoch, &key, &members);
            if !subtle_eq(&want, &mac) {
                s.refused += 1;
                return KeyReply::Refused("the rekey's MAC does not match".into());
            }
            if epoch != s.keys.epoch {
                s.keys.epoch = epoch;
                s.keys.key = key;
                s.keys.members = members;
                s.taken += 1;
                drop(s);
                take(epoch, key);
            }
            KeyReply::Taken
        }
        Err(e) => {
            state.lock().refused += 1;
            KeyReply::Refused(e.to_string())
        }
    }
}

/// Constant-time equality of two MACs.
fn subtle_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// A client for `group`'s key services: for an owned group, it believes
/// only those of this program's uid.
pub(crate) fn key_client(
    ctx: &Context,
    group: &PutPort,
) -> Result<shoal_rpc::Client, shoal_rpc::Error> {
    let mut client = ctx.client()?;
    if !is_open(group) {
        client.only_uid(Some(ctx.config().uid));
    }
    Ok(client)
}

/// How a call to a key service waits.
fn call_options() -> CallOptions {
    CallOptions {
        deadline: Some(PUSH_DEADLINE),
        cancel: None,
    }
}

/// Asks member `member` of `group` for the group's keys (as a joiner, to
/// inspect the group, or to catch up), through a [`key_client`].
pub(crate) fn admit(
    client: &mut shoal_rpc::Client,
    group: &PutPort,
    member: MemberId,
) -> Result<Keys, String> {
    let reply = client
        .trans_with(
            &key_port(group, member).put_port(),
            encode_request(&KeyRequest::Admit),
            &call_options(),
        )
        .map_err(|e| e.to_string())?;
    match decode_reply(&reply).map_err(|e| e.to_string())? {
        KeyReply::Admitted(keys) => Ok(keys),
        KeyReply::Refused(why) => Err(why),
        KeyReply::Taken => Err("a key service answered an admission with a rekey's answer".into()),
    }
}

/// The sequencer's side of a rekey: hands `keys` (the next epoch) to each
/// of its members but itself.  One that does not take it cannot read the
/// group from the switch on, falls silent and is expelled, or catches up.
pub(crate) fn push(client: &mut shoal_rpc::Client, group: &PutPort, me: MemberId, keys: &Keys) {
    let request = encode_request(&KeyRequest::Rekey {
        epoch: keys.epoch,
        key: keys.key,
        members: keys.members.clone(),
        mac: rekey_mac(&keys.master, keys.epoch, &keys.key, &keys.members),
    });
    for &m in &keys.members {
        let m = MemberId(m);
        if m == me {
            continue;
        }
        let port = key_port(group, m).put_port();
        let reply = client.trans_with(&port, request.clone(), &call_options());
        match reply.as_deref().map(decode_reply) {
            Ok(Ok(KeyReply::Taken)) => {}
            other => {
                tracing::info!(member = %m, ?other, "a member did not take the group's next key");
            }
        }
        client.forget(&port);
    }
}

/// What the key service needs of the member it serves.
pub(crate) trait KeyHost: Send + Sync + 'static {
    /// This member's id, and the membership, when it is the sequencer in
    /// normal operation (else `None`).
    fn sequencing(&self) -> Option<(MemberId, Vec<u64>)>;
    /// Opens epoch `epoch` from now on; with `send`, sends in it too.
    fn take(&self, epoch: u32, key: [u8; 32], send: bool);
    /// Opens epoch `epoch`, not the group's own, for a while (see
    /// [`crate::seal::GroupSeal::add_extra`]).
    fn take_extra(&self, epoch: u32, key: [u8; 32]);
    /// When a datagram came in an epoch this member does not hold.
    fn behind(&self) -> Option<Behind>;
}

/// What a member that saw a datagram in an epoch it does not hold knows.
pub(crate) struct Behind {
    /// The epoch.
    pub want: u32,
    pub me: MemberId,
    /// Its sequencer, unless itself.
    pub sequencer: Option<MemberId>,
    /// The other members it counts, the sequencer first.
    pub members: Vec<MemberId>,
}

/// A member's key service: its server, a thread answering it, and a
/// thread that rekeys while the member is the sequencer.
pub(crate) struct KeyService {
    server: shoal_rpc::Server,
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl KeyService {
    pub fn start(
        ctx: &Context,
        group: PutPort,
        me: MemberId,
        state: SharedKeys,
        host: Arc<dyn KeyHost>,
        served_by: Option<shoal_rpc::served_by::ServedBy>,
    ) -> Result<KeyService, shoal_rpc::Error> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let server = ctx.serve(key_port(&group, me))?;
        let stop = Arc::new(AtomicBool::new(false));
        let uid = ctx.config().uid;
        let serving = {
            let (server, state, host) = (server.clone(), state.clone(), host.clone());
            std::thread::Builder::new()
                .name("shoal-group-keys".into())
                .spawn(move || {
                    while let Ok(req) = server.getreq() {
                        let node = req.caller().node;
                        let reply = if served_by.as_ref().is_some_and(|s| !s.admits(node)) {
                            state.lock().refused += 1;
                            KeyReply::Refused(format!(
                                "the service map does not name node {node} as a server of \
                                 this group's service"
                            ))
                        } else {
                            answer(&group, uid, req.caller().uid, &state, req.body(), |e, k| {
                                host.take(e, k, false)
                            })
                        };
                        let _ = server.putrep(&req, encode_reply(&reply));
                    }
                })
                .expect("spawn a group key thread")
        };
        let rekeying = {
            let (ctx, stop) = (ctx.clone(), stop.clone());
            std::thread::Builder::new()
                .name("shoal-group-rekey".into())
                .spawn(move || {
                    let mut client = None;
                    while !stop.load(Ordering::Acquire) {
                        std::thread::sleep(KEY_POLL);
                        if client.is_none() {
                            client = key_client(&ctx, &group)
                                .inspect_err(|e| {
                                    tracing::warn!("no client for the group's keys: {e}")
                                })
                                .ok();
                        }
                        let Some(client) = client.as_mut() else {
                            continue;
                        };
                        rekey_if_due(client, &group, &state, &*host);
                        catch_up(&ctx, client, &group, &state, &*host);
                    }
                })
                .expect("spawn a group key thread")
        };
        Ok(KeyService {
            server,
            stop,
            threads: vec![serving, rekeying],
        })
    }

    /// Stops both threads (within a poll of the server).
    pub fn stop(mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.server.close();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// As the sequencer, draws the next epoch's key when the membership has
/// changed since the last or [`REKEY_EVERY`] has passed, hands it to every
/// other member, and sends in it.
fn rekey_if_due(
    client: &mut shoal_rpc::Client,
    group: &PutPort,
    state: &SharedKeys,
    host: &dyn KeyHost,
) {
    let Some((me, members)) = host.sequencing() else {
        return;
    };
    let next = {
        let s = state.lock();
        let due = s.keys.members != members || s.drawn.is_none_or(|t| t.elapsed() >= REKEY_EVERY);
        if !due {
            return;
        }
        Keys {
            master: s.keys.master,
            epoch: crate::seal::new_epoch(s.keys.epoch),
            key: rand::random(),
            members,
        }
    };
    push(client, group, me, &next);
    {
        let mut s = state.lock();
        s.drawn = Some(Instant::now());
        s.keys = next.clone();
    }
    host.take(next.epoch, next.key, true);
}

/// How often a member that is behind asks for keys.
const CATCH_UP_EVERY: Duration = Duration::from_millis(500);

/// Asks for the keys of an epoch a datagram came in that this member does
/// not hold: the members it knows first, the sequencer first of all; then
/// whoever else serves the group (a member left alone by a partition
/// counts nobody else, and must learn the others' epoch to hear that it
/// is out).
fn catch_up(
    ctx: &Context,
    client: &mut shoal_rpc::Client,
    group: &PutPort,
    state: &SharedKeys,
    host: &dyn KeyHost,
) {
    let Some(Behind {
        want,
        me,
        sequencer,
        members: ask,
    }) = host.behind()
    else {
        return;
    };
    {
        let mut s = state.lock();
        if s.caught_up.is_some_and(|t| t.elapsed() < CATCH_UP_EVERY) {
            return;
        }
        s.caught_up = Some(Instant::now());
    }
    // The members this one counts first; only if none has the epoch, the
    // others its node finds (a locate costs a round of the nodes).
    if ask_for(client, group, state, host, want, sequencer, &ask) {
        return;
    }
    let Ok(found) = crate::find::locate(ctx, group) else {
        return;
    };
    let uid = ctx.config().uid;
    let others: Vec<MemberId> = found
        .into_iter()
        .filter(|f| f.member != me && !ask.contains(&f.member) && admits(group, f.uid, uid))
        .map(|f| f.member)
        .collect();
    ask_for(client, group, state, host, want, sequencer, &others);
}

/// Asks `ask` in turn for epoch `want`; true once one gave it.
fn ask_for(
    client: &mut shoal_rpc::Client,
    group: &PutPort,
    state: &SharedKeys,
    host: &dyn KeyHost,
    want: u32,
    sequencer: Option<MemberId>,
    ask: &[MemberId],
) -> bool {
    for &m in ask {
        match admit(client, group, m) {
            Ok(keys) if keys.epoch == want && keys.master == state.lock().keys.master => {
                if Some(m) == sequencer {
                    // The group's own next epoch, whose push was lost.
                    state.lock().keys = keys.clone();
                    host.take(keys.epoch, keys.key, false);
                } else {
                    // Another's: enough to hear it, or for it to hear
                    // that it is out.
                    host.take_extra(keys.epoch, keys.key);
                }
                return true;
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(member = %m, "asking for the group's keys failed: {e}"),
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn members() -> impl Strategy<Value = Vec<u64>> {
        proptest::collection::btree_set(any::<u64>(), 0..20).prop_map(|s| s.into_iter().collect())
    }

    proptest! {
        #[test]
        fn requests_and_replies_decode_to_what_was_encoded(
            epoch in any::<u32>(), key in any::<[u8; 32]>(), mac in any::<[u8; 32]>(),
            master in any::<[u8; 32]>(), members in members(), text in ".{0,40}",
        ) {
            for r in [KeyRequest::Admit, KeyRequest::Rekey { epoch, key, members: members.clone(), mac }] {
                prop_assert_eq!(decode_request(&encode_request(&r)).unwrap(), r);
            }
            let keys = Keys { master, epoch, key, members };
            for r in [KeyReply::Admitted(keys), KeyReply::Taken, KeyReply::Refused(text)] {
                prop_assert_eq!(decode_reply(&encode_reply(&r)).unwrap(), r);
            }
        }

        #[test]
        fn no_byte_string_panics_the_decoders(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_request(&bytes);
            let _ = decode_reply(&bytes);
        }
    }

    #[test]
    fn a_member_takes_a_new_key_only_under_the_master_and_from_its_uid_if_owned() {
        let owned = crate::seal::new_group_port(false);
        let keys = Keys::new(MemberId(1));
        let state = shared(keys.clone());
        let mut took = Vec::new();
        let rekey = |epoch: u32, master: &[u8; 32]| {
            let key = [epoch as u8; 32];
            let members = vec![1, 2];
            encode_request(&KeyRequest::Rekey {
                epoch,
                key,
                members: members.clone(),
                mac: rekey_mac(master, epoch, &key, &members),
            })
        };
        // Another uid is refused, whatever it asks.
        for r in [encode_request(&KeyRequest::Admit), rekey(1, &keys.master)] {
            let reply = answer(&owned, 1000, 1001, &state, &r, |e, k| took.push((e, k)));
            assert!(matches!(reply, KeyReply::Refused(_)), "{reply:?}");
        }
        // The same uid is admitted, and a rekey under the master is taken.
        let reply = answer(
            &owned,
            1000,
            1000,
            &state,
            &encode_request(&KeyRequest::Admit),
            |_, _| {},
        );
        assert_eq!(reply, KeyReply::Admitted(keys.clone()));
        let reply = answer(
            &owned,
            1000,
            1000,
            &state,
            &rekey(1, &keys.master),
            |e, k| took.push((e, k)),
        );
        assert_eq!(reply, KeyReply::Taken);
        // Not under another master; not the current epoch again.
        let reply = answer(&owned, 1000, 1000, &state, &rekey(2, &[0; 32]), |e, k| {
            took.push((e, k))
        });
        assert!(matches!(reply, KeyReply::Refused(_)));
        answer(
            &owned,
            1000,
            1000,
            &state,
            &rekey(1, &keys.master),
            |e, k| took.push((e, k)),
        );
        assert_eq!(took, vec![(1, [1; 32])]);
        let s = state.lock();
        assert_eq!(
            (s.keys.epoch, s.keys.members.clone(), s.taken, s.refused),
            (1, vec![1, 2], 1, 3)
        );
        // An open group admits any uid.
        let open = crate::seal::new_group_port(true);
        assert!(admits(&open, 1000, 0) && admits(&open, 0, 1001) && !admits(&owned, 0, 1000));
    }
}
