//! A group's keys, the shell: every member serves a **key service** on a
//! port of its own, [`key_port`] (group port, member id), registered with
//! its node like any server, so every request it gets comes with the
//! caller's node and uid from the node sessions (a node that was revoked
//! has no session left to ask through); a thread answers it, and another
//! rekeys while the member is the sequencer and catches up when it missed
//! an epoch.  What to answer, when to rekey and what to take are
//! `shoal_group::keys` (the protocol, and its wire formats), which the
//! simulator drives too.

use std::sync::Arc;

use parking_lot::Mutex;
use shoal_cap::{GetPort, PutPort};
use shoal_group::keys::{
    Catch, KEY_POLL, KeyCore, KeyReply, KeyRequest, Keys, Membership, PUSH_DEADLINE, admits,
    decode_reply, encode_reply, encode_request, is_open, new_epoch,
};
use shoal_wire::MemberId;

use shoal_rpc::CallOptions;
use shoal_rpc::Context;
use shoal_rpc::clock;

/// The port member `member` of group `group` serves its key service on:
/// public, as a group's locate port is (who may serve it is checked by
/// uid, see [`admits`]).
pub fn key_port(group: &PutPort, member: MemberId) -> GetPort {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(group.as_bytes());
    key[16..24].copy_from_slice(&member.0.to_le_bytes());
    GetPort::derive(&key, "shoal 2026 group member keys v1")
}

/// A fresh port for a new group, open or owned ([`is_open`]).
pub fn new_group_port(open: bool) -> PutPort {
    loop {
        let port = GetPort::random().put_port();
        if is_open(&port) == open {
            return port;
        }
    }
}

/// A new group's keys, for its creator `me`.
pub fn new_keys(me: MemberId) -> Keys {
    Keys {
        master: rand::random(),
        epoch: new_epoch(0, rand::random),
        key: rand::random(),
        members: vec![me.0],
    }
}

/// What a member's key service and its rekeying share.
pub(crate) type SharedKeys = Arc<Mutex<KeyCore>>;

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
    let request = encode_request(&KeyRequest::rekey(keys));
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
    /// What a sequencer in normal operation rekeys for (else `None`).
    fn sequencing(&self) -> Option<Sequencing>;
    /// Opens epoch `epoch` from now on; with `send`, sends in it too.
    fn take(&self, epoch: u32, key: [u8; 32], send: bool);
    /// Opens epoch `epoch`, not the group's own, for a while (see
    /// [`crate::seal::GroupSeal::add_extra`]).
    fn take_extra(&self, epoch: u32, key: [u8; 32]);
    /// When a datagram came in an epoch this member does not hold.
    fn behind(&self) -> Option<Behind>;
}

/// This member's id and the membership, while it is the sequencer.
pub(crate) struct Sequencing {
    pub me: MemberId,
    /// The members' ids, ascending.
    pub members: Vec<u64>,
    pub membership: Membership,
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
                        let (reply, take) = if served_by.as_ref().is_some_and(|s| !s.admits(node)) {
                            let why = format!(
                                "the service map does not name node {node} as a server of \
                                 this group's service"
                            );
                            (state.lock().refuse(why), None)
                        } else {
                            state
                                .lock()
                                .answer(&group, uid, req.caller().uid, req.body())
                        };
                        if let Some((epoch, key)) = take {
                            host.take(epoch, key, false);
                        }
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

/// As the sequencer, draws the next epoch's key when the core says it is
/// due, hands it to every other member, and sends in it.
fn rekey_if_due(
    client: &mut shoal_rpc::Client,
    group: &PutPort,
    state: &SharedKeys,
    host: &dyn KeyHost,
) {
    let Some(Sequencing {
        me,
        members,
        membership,
    }) = host.sequencing()
    else {
        return;
    };
    let next = {
        let s = state.lock();
        if !s.rekey_due(clock::now(), membership) {
            return;
        }
        s.next(members, rand::random, rand::random())
    };
    push(client, group, me, &next);
    state.lock().drawn(clock::now(), membership, next.clone());
    host.take(next.epoch, next.key, true);
}

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
    if !state.lock().catch_up_due(clock::now()) {
        return;
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
            Ok(keys) => {
                let catch = state.lock().caught(want, Some(m) == sequencer, &keys);
                match catch {
                    Some(Catch::Own(epoch, key)) => host.take(epoch, key, false),
                    Some(Catch::Extra(epoch, key)) => host.take_extra(epoch, key),
                    None => continue,
                }
            }
            Err(e) => {
                tracing::debug!(member = %m, "asking for the group's keys failed: {e}");
                continue;
            }
        }
        return true;
    }
    false
}
