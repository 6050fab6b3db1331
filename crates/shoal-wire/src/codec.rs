//! Encoding and decoding.  The decoder checks the MAC before it reads any
//! field, never panics, and allocates at most what the datagram's bounded
//! lists need.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use shoal_cap::PutPort;

use crate::group::{GROUP_KIND_BASE, GROUP_KIND_LAST};
use crate::ids::{ClientId, Instance, NodeId, Nonce, Seq, TxnId};
use crate::key::ClusterKey;
use crate::packet::*;
use crate::{HEADER_LEN, MAGIC, MAX_DATAGRAM, VERSION, WireError};

/// Encodes `packet` in the old header form, MAC included (what a node
/// that still has its cluster's old key counts, and the tests forge).
pub fn encode(packet: &Packet<'_>, key: &ClusterKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + 64 + payload_len(packet));
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(packet.kind());
    out.extend_from_slice(&[0u8; 16]);
    write_body(packet, &mut Writer(&mut out));
    let mac = key.mac(&out);
    out[4..HEADER_LEN].copy_from_slice(&mac);
    out
}

fn payload_len(packet: &Packet<'_>) -> usize {
    match packet {
        Packet::Request(r) => r.payload.len(),
        Packet::Reply(r) => r.payload.len(),
        Packet::Group(g) => g.body.payload_len(),
        _ => 0,
    }
}

/// Encodes `packet` into `out` (cleared first) as a plaintext: its kind
/// byte and its body, without the header.  This is what an endpoint or
/// node datagram carries sealed (`shoal_session`), and what the cores
/// take and give.
pub fn encode_plain(packet: &Packet<'_>, out: &mut Vec<u8>) {
    out.clear();
    out.push(packet.kind());
    write_body(packet, &mut Writer(out));
}

/// [`encode_plain`] into a new buffer.
pub fn plain(packet: &Packet<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + payload_len(packet));
    encode_plain(packet, &mut out);
    out
}

/// Bytes before a request's or reply's payload in its plaintext
/// ([`encode_plain`]): a shell sealing a large fragment seals these and
/// the payload's pieces together.
pub fn plain_head_len(packet: &Packet<'_>) -> usize {
    let mut out = Vec::with_capacity(64);
    encode_plain(packet, &mut out);
    out.len()
        - match packet {
            Packet::Request(r) => r.payload.len(),
            Packet::Reply(r) => r.payload.len(),
            _ => 0,
        }
}

fn write_body(packet: &Packet<'_>, w: &mut Writer<'_>) {
    match packet {
        Packet::Request(r) => {
            w.txn(r.txn);
            w.u64(r.instance.0);
            w.bytes(r.port.as_bytes());
            w.frag(r.frag);
            w.u64(r.total_len);
            w.bytes(r.payload);
        }
        Packet::Reply(r) => {
            w.txn(r.txn);
            w.u64(r.instance.0);
            w.u8(r.status as u8);
            w.frag(r.frag);
            w.u64(r.total_len);
            w.bytes(r.payload);
        }
        Packet::Ack(a) => {
            w.txn(a.txn);
            w.u64(a.instance.0);
            w.u8(a.dir as u8);
            w.u32(a.base);
            w.u64(a.mask);
        }
        Packet::Working(p) => {
            w.txn(p.txn);
            w.u64(p.instance.0);
        }
        Packet::NotHere(p) => {
            w.txn(p.txn);
            w.bytes(p.port.as_bytes());
            w.u64(p.wanted.0);
            w.u64(p.actual.0);
        }
        Packet::Locate(p) => {
            w.u64(p.nonce.0);
            w.bytes(p.port.as_bytes());
            w.u64(p.instance.0);
            w.u64(p.node.0);
        }
        Packet::Here(p) => write_here(p, w),
        Packet::Heartbeat(h) => write_heartbeat(h, w),
        Packet::Group(g) => crate::group::encode_group(g, w),
    }
}

// A locate's answer and a heartbeat are rare next to requests and
// replies: their code stays out of the request path's (see
// crates/shoal-rpc/hot-path.ld).

#[cold]
#[inline(never)]
fn write_here(p: &Here, w: &mut Writer<'_>) {
    assert!(p.endpoints.len() <= MAX_HERE_ENDPOINTS);
    w.u64(p.nonce.0);
    w.bytes(p.port.as_bytes());
    w.u64(p.node.0);
    w.u8(p.fate as u8);
    w.u8(p.endpoints.len() as u8);
    for e in &p.endpoints {
        w.addr(e.addr);
        w.u64(e.instance.0);
        w.u32(e.uid);
        w.u8(e.system as u8);
    }
}

#[cold]
#[inline(never)]
fn write_heartbeat(h: &Heartbeat, w: &mut Writer<'_>) {
    assert!(h.members.len() <= MAX_MEMBERS);
    assert!(h.name.len() <= MAX_NAME_BYTES);
    w.u64(h.node.0);
    w.u64(h.incarnation);
    w.u8(h.name.len() as u8);
    w.bytes(h.name.as_bytes());
    w.addr(h.addr);
    w.u16(h.members.len() as u16);
    for m in &h.members {
        w.u64(m.node.0);
        w.addr(m.addr);
    }
    match &h.load {
        Some(load) => {
            w.u8(1);
            w.bytes(&load.to_bytes());
        }
        None => w.u8(0),
    }
}

/// Checks the MAC of `datagram`, in the old header form, and decodes it.
pub fn decode<'a>(datagram: &'a [u8], key: &ClusterKey) -> Result<Packet<'a>, WireError> {
    if datagram.len() < HEADER_LEN {
        return Err(WireError::Truncated);
    }
    if datagram.len() > MAX_DATAGRAM {
        return Err(WireError::Oversized);
    }
    if datagram[..2] != MAGIC {
        return Err(WireError::BadMagic);
    }
    if datagram[2] != VERSION {
        return Err(WireError::BadVersion(datagram[2]));
    }
    let kind = datagram[3];
    if !(1..=8).contains(&kind) && !(GROUP_KIND_BASE..=GROUP_KIND_LAST).contains(&kind) {
        return Err(WireError::BadKind(kind));
    }
    let mac = key.mac(datagram);
    if !constant_time_eq(&mac, &datagram[4..HEADER_LEN]) {
        return Err(WireError::BadMac);
    }
    decode_body(kind, &datagram[HEADER_LEN..])
}

/// Decodes a plaintext made by [`encode_plain`]: a kind byte and a body.
/// Nothing is authenticated here: the plaintext came out of a sealed
/// datagram that opened, or from a core in the same process.
pub fn decode_plain(plain: &[u8]) -> Result<Packet<'_>, WireError> {
    let Some((&kind, body)) = plain.split_first() else {
        return Err(WireError::Truncated);
    };
    if plain.len() > MAX_DATAGRAM {
        return Err(WireError::Oversized);
    }
    if !(1..=8).contains(&kind) && !(GROUP_KIND_BASE..=GROUP_KIND_LAST).contains(&kind) {
        return Err(WireError::BadKind(kind));
    }
    decode_body(kind, body)
}

fn decode_body(kind: u8, body: &[u8]) -> Result<Packet<'_>, WireError> {
    let mut r = reader(body);
    let packet = match kind {
        1 => Packet::Request(Request {
            txn: r.txn()?,
            instance: Instance(r.u64()?),
            port: r.port()?,
            frag: r.frag()?,
            total_len: r.u64()?,
            payload: r.rest(),
        }),
        2 => {
            let txn = r.txn()?;
            let instance = Instance(r.u64()?);
            let status =
                ReplyStatus::from_u8(r.u8()?).ok_or(WireError::Malformed("reply status"))?;
            Packet::Reply(Reply {
                txn,
                instance,
                status,
                frag: r.frag()?,
                total_len: r.u64()?,
                payload: r.rest(),
            })
        }
        3 => {
            let txn = r.txn()?;
            let instance = Instance(r.u64()?);
            let dir = match r.u8()? {
                0 => AckDir::Request,
                1 => AckDir::Reply,
                _ => return Err(WireError::Malformed("ack direction")),
            };
            Packet::Ack(Ack {
                txn,
                instance,
                dir,
                base: r.u32()?,
                mask: r.u64()?,
            })
        }
        4 => Packet::Working(Working {
            txn: r.txn()?,
            instance: Instance(r.u64()?),
        }),
        5 => Packet::NotHere(NotHere {
            txn: r.txn()?,
            port: r.port()?,
            wanted: Instance(r.u64()?),
            actual: Instance(r.u64()?),
        }),
        6 => Packet::Locate(Locate {
            nonce: Nonce(r.u64()?),
            port: r.port()?,
            instance: Instance(r.u64()?),
            node: NodeId(r.u64()?),
        }),
        7 => decode_here(&mut r)?,
        8 => decode_heartbeat(&mut r)?,
        GROUP_KIND_BASE..=GROUP_KIND_LAST => {
            Packet::Group(crate::group::decode_group(kind, &mut r)?)
        }
        _ => unreachable!("kind checked above"),
    };
    r.end()?;
    if let Packet::Request(Request { frag, .. }) | Packet::Reply(Reply { frag, .. }) = &packet
        && (frag.count == 0 || frag.index >= frag.count)
    {
        return Err(WireError::Malformed("fragment index out of range"));
    }
    Ok(packet)
}

#[cold]
#[inline(never)]
fn decode_here<'a>(r: &mut Reader<'a>) -> Result<Packet<'a>, WireError> {
    let nonce = Nonce(r.u64()?);
    let port = r.port()?;
    let node = NodeId(r.u64()?);
    let fate = Fate::from_u8(r.u8()?).ok_or(WireError::Malformed("instance fate"))?;
    let n = r.u8()? as usize;
    if n > MAX_HERE_ENDPOINTS {
        return Err(WireError::Malformed("too many endpoints"));
    }
    let mut endpoints = Vec::with_capacity(n);
    for _ in 0..n {
        endpoints.push(Endpoint {
            addr: r.addr()?,
            instance: Instance(r.u64()?),
            uid: r.u32()?,
            system: r.flag()?,
        });
    }
    Ok(Packet::Here(Here {
        nonce,
        port,
        node,
        fate,
        endpoints,
    }))
}

#[cold]
#[inline(never)]
fn decode_heartbeat<'a>(r: &mut Reader<'a>) -> Result<Packet<'a>, WireError> {
    let node = NodeId(r.u64()?);
    let incarnation = r.u64()?;
    let name_len = r.u8()? as usize;
    if name_len > MAX_NAME_BYTES {
        return Err(WireError::Malformed("node name too long"));
    }
    let name = std::str::from_utf8(r.take(name_len)?)
        .map_err(|_| WireError::Malformed("node name is not UTF-8"))?
        .to_string();
    let addr = r.addr()?;
    let n = r.u16()? as usize;
    if n > MAX_MEMBERS {
        return Err(WireError::Malformed("too many members"));
    }
    let mut members = Vec::with_capacity(n.min(r.remaining() / 15));
    for _ in 0..n {
        members.push(Member {
            node: NodeId(r.u64()?),
            addr: r.addr()?,
        });
    }
    let load = match r.u8()? {
        0 => None,
        1 => Some(
            crate::Load::from_bytes(r.take(crate::LOAD_LEN)?)
                .map_err(|_| WireError::Malformed("heartbeat load"))?,
        ),
        _ => return Err(WireError::Malformed("heartbeat load flag")),
    };
    Ok(Packet::Heartbeat(Heartbeat {
        node,
        incarnation,
        name,
        addr,
        members,
        load,
    }))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub(crate) struct Writer<'a>(pub(crate) &'a mut Vec<u8>);

impl Writer<'_> {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn bytes(&mut self, v: &[u8]) {
        self.0.extend_from_slice(v);
    }
    pub(crate) fn txn(&mut self, t: TxnId) {
        self.u64(t.client.0);
        self.u64(t.seq.0);
    }
    pub(crate) fn frag(&mut self, f: Frag) {
        self.u32(f.index);
        self.u32(f.count);
    }
    pub(crate) fn addr(&mut self, a: SocketAddr) {
        match a.ip() {
            IpAddr::V4(ip) => {
                self.u8(4);
                self.bytes(&ip.octets());
            }
            IpAddr::V6(ip) => {
                self.u8(6);
                self.bytes(&ip.octets());
            }
        }
        self.u16(a.port());
    }
}

/// The shared reader (`shoal_cap::codec`), with the packets' own fields.
pub(crate) type Reader<'a> = shoal_cap::codec::Reader<'a>;

/// A reader of a packet's bytes.
pub(crate) fn reader(bytes: &[u8]) -> Reader<'_> {
    Reader::new(bytes, "packet")
}

impl From<shoal_cap::codec::DecodeError> for WireError {
    fn from(e: shoal_cap::codec::DecodeError) -> WireError {
        if e.is_truncated() {
            WireError::Truncated
        } else if e.is_trailing() {
            WireError::Oversized
        } else {
            WireError::Malformed(e.why)
        }
    }
}

/// The fields of packets, read with the shared reader.
pub(crate) trait Fields {
    fn txn(&mut self) -> Result<TxnId, WireError>;
    fn port(&mut self) -> Result<PutPort, WireError>;
    fn frag(&mut self) -> Result<Frag, WireError>;
    fn addr(&mut self) -> Result<SocketAddr, WireError>;
    fn flag(&mut self) -> Result<bool, WireError>;
    fn member(&mut self) -> Result<crate::group::MemberEntry, WireError>;
    fn members(&mut self) -> Result<Vec<crate::group::MemberEntry>, WireError>;
}

impl Fields for Reader<'_> {
    fn txn(&mut self) -> Result<TxnId, WireError> {
        Ok(TxnId {
            client: ClientId(self.u64()?),
            seq: Seq(self.u64()?),
        })
    }
    fn port(&mut self) -> Result<PutPort, WireError> {
        Ok(PutPort::from_bytes(self.array()?))
    }
    fn frag(&mut self) -> Result<Frag, WireError> {
        Ok(Frag {
            index: self.u32()?,
            count: self.u32()?,
        })
    }
    fn addr(&mut self) -> Result<SocketAddr, WireError> {
        let ip = match self.u8()? {
            4 => IpAddr::V4(Ipv4Addr::from(self.array::<4>()?)),
            6 => IpAddr::V6(Ipv6Addr::from(self.array::<16>()?)),
            _ => return Err(WireError::Malformed("address family")),
        };
        Ok(SocketAddr::new(ip, self.u16()?))
    }
    fn flag(&mut self) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(WireError::Malformed("flag")),
        }
    }
    fn member(&mut self) -> Result<crate::group::MemberEntry, WireError> {
        Ok(crate::group::MemberEntry {
            id: crate::MemberId(self.u64()?),
            addr: self.addr()?,
        })
    }
    fn members(&mut self) -> Result<Vec<crate::group::MemberEntry>, WireError> {
        let n = self.u16()? as usize;
        if n > crate::group::MAX_GROUP_MEMBERS {
            return Err(WireError::Malformed("too many members"));
        }
        let mut list = Vec::with_capacity(n.min(self.remaining() / 15));
        for _ in 0..n {
            list.push(self.member()?);
        }
        Ok(list)
    }
}
