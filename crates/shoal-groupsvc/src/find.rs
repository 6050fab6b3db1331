//! Finding a group's members (`locate`), getting the group's keys from one
//! that admits this program (`admitted`), registering a member with its
//! node (`register`), and `shoal group info` (`inspect`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use shoal_cap::PutPort;
use shoal_group::{MemberEntry, MemberId};
use shoal_wire::{Incarnation, Instance, MAX_DATAGRAM, Nonce, Packet};

use crate::{GroupError, locate_port};
use shoal_group::keys::Keys;
use shoal_group::seal::GroupSeal;
use shoal_rpc::Context;
use shoal_rpc::link::{Link, LinkRequest, LinkResponse};
use shoal_rpc::socket;

/// Registers this member under the group's locate port with the local
/// node, as instance `me.id` (so a joiner learns the member's id, and so
/// its key service's port, from locate).
pub(crate) fn register(
    ctx: &Context,
    group: &PutPort,
    me: &MemberEntry,
) -> Result<Option<Link>, GroupError> {
    let Some(path) = &ctx.config().node_socket else {
        return Ok(None);
    };
    let mut link = Link::connect(path)?;
    let answer = link.call(&LinkRequest::Register {
        get_port: locate_port(group).to_hex(),
        addr: me.addr,
        instance: Instance(me.id.0).to_string(),
    })?;
    match answer {
        LinkResponse::Registered { .. } => Ok(Some(link)),
        other => {
            Err(shoal_rpc::Error::Node(format!("unexpected answer to register: {other:?}")).into())
        }
    }
}

/// A member found by [`locate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub addr: SocketAddr,
    pub member: MemberId,
    /// The uid that runs it, as its node says.
    pub uid: u32,
}

/// Finds members of `group`: asks the local node, which asks the others,
/// who serves its locate port, for a short while.
pub fn locate(ctx: &Context, group: &PutPort) -> Result<Vec<Found>, GroupError> {
    let port = locate_port(group).put_port();
    let config = ctx.config();
    let client = match config.call_node(&LinkRequest::Client)? {
        LinkResponse::Client { id, .. } => id,
        _ => return Err(shoal_rpc::Error::Node("unexpected answer to client".into()).into()),
    };
    let mut found: Vec<Found> = Vec::new();
    for round in 0..4 {
        let request = LinkRequest::Locate {
            client: client.clone(),
            port: port.to_string(),
            instance: format!("{:016x}", 0),
            node: format!("{:016x}", 0),
            wait_ms: 60 << round.min(2),
            all: true,
        };
        if let LinkResponse::Located { answers } = config.call_node(&request)? {
            for e in answers.iter().flat_map(|a| &a.endpoints) {
                let Ok(member) = u64::from_str_radix(&e.instance, 16) else {
                    continue;
                };
                if !found.iter().any(|f| f.addr == e.addr) {
                    found.push(Found {
                        addr: e.addr,
                        member: MemberId(member),
                        uid: e.uid,
                    });
                }
            }
        }
        if !found.is_empty() {
            break;
        }
    }
    Ok(found)
}

/// The group's keys, from the first member that admits this program, and
/// the addresses of the members to contact.  An owned group's members
/// must run as this program's uid (their nodes say), and answer only it.
pub(crate) fn admitted(
    ctx: &Context,
    group: &PutPort,
) -> Result<(Keys, Vec<SocketAddr>), GroupError> {
    let found = locate(ctx, group)?;
    if found.is_empty() {
        return Err(GroupError::NotFound(*group));
    }
    let uid = ctx.config().uid;
    let members: Vec<Found> = found
        .into_iter()
        .filter(|f| shoal_group::keys::admits(group, f.uid, uid))
        .collect();
    if members.is_empty() {
        return Err(GroupError::NotAdmitted(
            *group,
            "its members run as another uid, and a group admits only programs of its creator's uid unless created --open".into(),
        ));
    }
    let mut client = crate::keys::key_client(ctx, group)?;
    let mut why = String::new();
    for f in &members {
        match crate::keys::admit(&mut client, group, f.member) {
            Ok(keys) => return Ok((keys, members.iter().map(|f| f.addr).collect())),
            Err(e) => why = e,
        }
    }
    Err(GroupError::NotAdmitted(*group, why))
}

/// Asks the members of `group` for their view of it (`shoal group info`).
pub fn inspect(ctx: &Context, group: &PutPort) -> Result<Vec<serde_json::Value>, GroupError> {
    let (keys, members) = admitted(ctx, group)?;
    let socket = socket::bind(SocketAddr::new(ctx.config().bind_ip, 0))?;
    let me = MemberId::random();
    let mut seal = GroupSeal::new(keys.epoch, keys.key, group, me);
    let nonce = Nonce::random().0;
    let plain = shoal_wire::plain(&Packet::Group(shoal_wire::group::GroupPacket {
        hdr: shoal_wire::group::GroupHeader {
            group: *group,
            inc: Incarnation(0),
            seqr: MemberId(0),
            from: me,
        },
        body: shoal_wire::group::GroupBody::InfoReq(shoal_wire::group::InfoReq { nonce }),
    }));
    let mut answers: HashMap<SocketAddr, serde_json::Value> = HashMap::new();
    let mut ask = Vec::new();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    for _ in 0..3 {
        for m in &members {
            if !answers.contains_key(m) {
                seal.seal(&plain, &mut ask);
                let _ = socket.send_to(&ask, m);
            }
        }
        let until = Instant::now() + Duration::from_millis(200);
        while answers.len() < members.len() {
            let Some(left) = until.checked_duration_since(Instant::now()) else {
                break;
            };
            socket.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
            match socket.recv_from(&mut buf) {
                Ok((len, from)) => {
                    let Some(range) = seal.open(shoal_rpc::clock::now(), &mut buf[..len]) else {
                        continue;
                    };
                    if let Ok(Packet::Group(p)) = shoal_wire::decode_plain(&buf[range])
                        && let shoal_wire::group::GroupBody::Info(i) = p.body
                        && i.nonce == nonce
                        && let Ok(v) = serde_json::from_slice(i.json)
                    {
                        answers.insert(from, v);
                    }
                }
                Err(e) if socket::is_timeout(&e) => break,
                Err(e) => return Err(e.into()),
            }
        }
        if answers.len() == members.len() {
            break;
        }
    }
    let mut list: Vec<_> = answers.into_values().collect();
    list.sort_by_key(|v| v["member"].as_str().unwrap_or_default().to_string());
    Ok(list)
}
