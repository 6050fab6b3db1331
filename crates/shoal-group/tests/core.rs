//! Small, deterministic tests of the group core: a few members wired
//! together in memory, every datagram delivered at once unless a test
//! drops it.  The simulator (`shoal-sim`) does the same under faults and
//! over many seeds; these pin down single behaviours.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use shoal_cap::PutPort;
use shoal_group::{
    Event, GroupConfig, GroupCore, GroupDest, GroupSeq, MemberEntry, MemberId, Status,
};
use shoal_proto::Time;
use shoal_wire::group::GroupBody;
use shoal_wire::{Packet, decode_plain};

fn addr(i: u64) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i as u8], 7000))
}

struct Net {
    cores: Vec<GroupCore>,
    /// Each core's address.
    addrs: Vec<SocketAddr>,
    now: Time,
    /// Datagrams sent so far (a broadcast counts once), and by kind.
    sent: u64,
    kinds: Vec<u8>,
    /// Drop datagrams to this member.
    deaf: Option<usize>,
    /// Drop acks to this member.
    no_acks_to: Option<usize>,
    events: Vec<Vec<Event>>,
}

impl Net {
    /// A group of `n` members created by member 0, everyone joined.
    fn new(n: usize, cfg: GroupConfig) -> Net {
        let group = PutPort::from_bytes([9; 16]);
        let me = |i: usize| MemberEntry {
            id: MemberId(i as u64 + 1),
            addr: addr(i as u64 + 1),
        };
        let mut net = Net {
            cores: vec![GroupCore::create(Time(0), group, me(0), cfg.clone())],
            addrs: vec![addr(1)],
            now: Time(0),
            sent: 0,
            kinds: Vec::new(),
            deaf: None,
            no_acks_to: None,
            events: vec![Vec::new()],
        };
        for i in 1..n {
            net.cores.push(GroupCore::join(
                net.now,
                group,
                me(i),
                cfg.clone(),
                vec![addr(1)],
                i as u64,
            ));
            net.events.push(Vec::new());
            net.addrs.push(addr(i as u64 + 1));
            net.settle();
            assert_eq!(net.cores[i].status(), Status::Normal, "member {i} joined");
        }
        net.sent = 0;
        net.kinds.clear();
        net
    }

    /// Moves datagrams until none are left; collects events.
    fn settle(&mut self) {
        for _ in 0..1000 {
            let mut moved = false;
            for i in 0..self.cores.len() {
                while let Some(t) = self.cores[i].poll_transmit() {
                    moved = true;
                    self.sent += 1;
                    let mut is_ack = false;
                    if let Ok(Packet::Group(p)) = decode_plain(&t.bytes) {
                        self.kinds.push(t.bytes[3]);
                        is_ack = matches!(p.body, GroupBody::Ack(_));
                    }
                    let targets: Vec<usize> = match t.dest {
                        GroupDest::Addr(a) => (0..self.cores.len())
                            .filter(|&j| self.addrs[j] == a)
                            .collect(),
                        GroupDest::Members => {
                            let members: Vec<SocketAddr> =
                                self.cores[i].members().iter().map(|m| m.addr).collect();
                            (0..self.cores.len())
                                .filter(|&j| j != i && members.contains(&self.addrs[j]))
                                .collect()
                        }
                    };
                    for j in targets {
                        if self.deaf == Some(j) || (self.no_acks_to == Some(j) && is_ack) {
                            continue;
                        }
                        let from = self.addrs[i];
                        self.cores[j].handle_datagram(self.now, from, &t.bytes);
                    }
                }
                while let Some(e) = self.cores[i].poll_event() {
                    if let Event::StateWanted { joiner } = e {
                        self.cores[i].provide_state(self.now, joiner, b"state");
                        moved = true;
                    }
                    self.events[i].push(e);
                }
            }
            if !moved {
                return;
            }
        }
        panic!("the network never went quiet");
    }

    fn advance(&mut self, by: Duration) {
        let end = self.now + by;
        while self.now < end {
            self.now += Duration::from_millis(5);
            for c in self.cores.iter_mut() {
                c.handle_timeout(self.now);
            }
            self.settle();
        }
    }

    /// The network after member `i` died: gone, deaf and mute.
    fn without(mut self, i: usize) -> Net {
        self.cores.remove(i);
        self.events.remove(i);
        self.addrs.remove(i);
        Net {
            sent: 0,
            kinds: Vec::new(),
            deaf: None,
            no_acks_to: None,
            ..self
        }
    }

    fn messages(&self, i: usize) -> Vec<(GroupSeq, Vec<u8>)> {
        self.events[i]
            .iter()
            .filter_map(|e| match e {
                Event::Message { seq, body, .. } => Some((*seq, body.to_vec())),
                _ => None,
            })
            .collect()
    }
}

fn cfg(r: usize) -> GroupConfig {
    GroupConfig {
        resilience: r,
        ..GroupConfig::default()
    }
}

#[test]
fn every_member_delivers_every_message_in_one_order() {
    let mut net = Net::new(3, cfg(1));
    for round in 0..5u8 {
        for i in 0..3 {
            net.cores[i]
                .send(net.now, Bytes::from(vec![round, i as u8]))
                .unwrap();
        }
        net.settle();
    }
    let first = net.messages(0);
    assert_eq!(first.len(), 15);
    for i in 1..3 {
        assert_eq!(
            net.messages(i),
            first,
            "member {i} delivered another stream"
        );
    }
}

#[test]
fn pb_costs_two_datagrams_per_message_when_every_member_sends() {
    // r = 0: data to the sequencer, one broadcast back; the others' holds
    // travel with their own data, so nothing else is needed.
    let mut net = Net::new(3, cfg(0));
    let rounds = 20;
    for round in 0..rounds {
        for i in 1..3 {
            net.cores[i]
                .send(net.now, Bytes::from(vec![round; 8]))
                .unwrap();
            net.settle();
        }
    }
    let messages = 2 * rounds as u64;
    assert_eq!(net.messages(0).len() as u64, messages);
    assert_eq!(
        net.sent,
        2 * messages,
        "datagrams on the wire: {:?}",
        net.kinds
    );
}

#[test]
fn resilience_waits_for_r_acknowledgements_before_delivery() {
    // r = 1: tentative broadcast and one ack; every member that holds the
    // entry knows that it and the sequencer do, r + 1 members: 2 + r
    // datagrams.
    let mut net = Net::new(3, cfg(1));
    net.cores[1]
        .send(net.now, Bytes::from_static(b"x"))
        .unwrap();
    net.settle();
    assert_eq!(
        net.sent, 3,
        "data, tentative order, one ack: {:?}",
        net.kinds
    );
    for i in 0..3 {
        assert_eq!(net.messages(i).len(), 1, "member {i} delivered");
    }
    // The commit point goes out on its own once `accept_delay` has passed
    // without a next entry to carry it.
    net.advance(Duration::from_millis(5));
    assert_eq!(net.sent, 4, "the held-back accept: {:?}", net.kinds);

    // With the acknowledger deaf, nobody delivers: the entry is not yet
    // held by r + 1 members.
    let mut net = Net::new(3, cfg(2));
    net.deaf = Some(2);
    net.cores[1]
        .send(net.now, Bytes::from_static(b"y"))
        .unwrap();
    net.settle();
    assert!(net.messages(0).is_empty() && net.messages(1).is_empty());
    net.deaf = None;
    net.advance(Duration::from_millis(200));
    assert_eq!(net.messages(0).len(), 1);
    assert_eq!(net.messages(1).len(), 1);
}

#[test]
fn the_commit_point_waits_for_the_next_entry_and_senders_count_the_acks() {
    // r = 2, sent by the sequencer's own process: tentative order and two
    // acks to the sequencer; the commit point travels with the next
    // entry's broadcast, or on its own once `accept_delay` has passed.
    let mut net = Net::new(3, cfg(2));
    net.cores[0]
        .send(net.now, Bytes::from_static(b"a"))
        .unwrap();
    net.settle();
    assert_eq!(
        net.cores[0].poll_sent().map(|(_, seq)| seq > GroupSeq(0)),
        Some(true)
    );
    assert_eq!(net.sent, 3, "tentative order, two acks: {:?}", net.kinds);
    assert!(net.messages(1).is_empty() && net.messages(2).is_empty());

    net.cores[0]
        .send(net.now, Bytes::from_static(b"b"))
        .unwrap();
    net.settle();
    assert_eq!(net.sent, 6, "no accept between the two: {:?}", net.kinds);
    for i in 1..3 {
        let got: Vec<Vec<u8>> = net.messages(i).into_iter().map(|(_, b)| b).collect();
        assert_eq!(
            got,
            vec![b"a".to_vec()],
            "member {i} learnt a's commit from b"
        );
    }
    net.advance(Duration::from_millis(5));
    assert_eq!(net.sent, 7, "the held-back accept: {:?}", net.kinds);
    for i in 0..3 {
        assert_eq!(net.messages(i), net.messages(0));
        assert_eq!(net.messages(i).len(), 2, "member {i}");
    }

    // Another member's message: the other acknowledger multicasts its ack,
    // so the sender counts three holders (itself, the sequencer, the
    // acknowledger) without waiting for an accept.
    net.cores[1]
        .send(net.now, Bytes::from_static(b"c"))
        .unwrap();
    net.settle();
    assert_eq!(net.sent, 7 + 4, "data, order, two acks: {:?}", net.kinds);
    assert!(net.cores[1].poll_sent().is_some(), "c's send completed");
    assert_eq!(net.messages(1).len(), 3, "the sender delivered c");
    assert_eq!(net.messages(0).len(), 3, "the sequencer delivered c");
    assert_eq!(net.messages(2).len(), 2, "2 did not hear the sender's ack");
    net.advance(Duration::from_millis(5));
    assert_eq!(net.sent, 7 + 5, "the held-back accept: {:?}", net.kinds);
    assert_eq!(net.messages(2), net.messages(0));

    // That ack lost on the way to the sender: it learns the commit point
    // from the accept that goes out after `accept_delay`.
    net.no_acks_to = Some(1);
    net.cores[1]
        .send(net.now, Bytes::from_static(b"d"))
        .unwrap();
    net.settle();
    assert_eq!(net.sent, 12 + 4, "data, order, two acks: {:?}", net.kinds);
    assert_eq!(net.messages(1).len(), 3, "d is not known committed at 1");
    net.advance(Duration::from_millis(5));
    assert_eq!(net.sent, 12 + 5, "the held-back accept: {:?}", net.kinds);
    for i in 0..3 {
        assert_eq!(net.messages(i), net.messages(0));
        assert_eq!(net.messages(i).len(), 4, "member {i}");
    }
}

#[test]
fn large_messages_are_broadcast_by_their_sender_and_accepted_short() {
    let mut net = Net::new(
        3,
        GroupConfig {
            large_bytes: 1000,
            frag_bytes: 1200,
            ..cfg(0)
        },
    );
    let body = Bytes::from(vec![7u8; 5000]);
    net.cores[1].send(net.now, body.clone()).unwrap();
    net.settle();
    for i in 0..3 {
        assert_eq!(net.messages(i), vec![(net.messages(0)[0].0, body.to_vec())]);
    }
    // 5 fragments broadcast by the sender, one body-less accept.
    assert_eq!(net.sent, 6, "{:?}", net.kinds);
}

#[test]
fn a_member_that_missed_an_entry_asks_and_catches_up() {
    let mut net = Net::new(3, cfg(0));
    net.deaf = Some(2);
    net.cores[1]
        .send(net.now, Bytes::from_static(b"lost to 2"))
        .unwrap();
    net.settle();
    net.deaf = None;
    net.cores[1]
        .send(net.now, Bytes::from_static(b"next"))
        .unwrap();
    net.settle();
    assert_eq!(net.messages(2), net.messages(0));
    assert_eq!(net.messages(2).len(), 2);
}

#[test]
fn a_silent_member_is_expelled_and_the_rest_carry_on() {
    let mut net = Net::new(3, cfg(1));
    net.deaf = Some(2);
    net.advance(Duration::from_secs(2));
    assert!(
        !net.cores[0].members().iter().any(|m| m.id == MemberId(3)),
        "the silent member is out of the view"
    );
    net.cores[1]
        .send(net.now, Bytes::from_static(b"after"))
        .unwrap();
    net.advance(Duration::from_millis(100));
    assert_eq!(net.messages(0).last().unwrap().1, b"after");
    assert!(
        net.events[0]
            .iter()
            .any(|e| matches!(e, Event::Left { member, .. } if *member == MemberId(3))),
        "everyone saw the expulsion in the stream"
    );
    assert!(
        net.cores[0].is_sequencer(),
        "a deaf member does not depose the sequencer"
    );
}

#[test]
fn the_sequencer_crashing_hands_over_without_losing_committed_messages() {
    let mut net = Net::new(3, cfg(1));
    for k in 0..5u8 {
        net.cores[1].send(net.now, Bytes::from(vec![k])).unwrap();
    }
    net.settle();
    // Member 0 (the sequencer) goes silent: deaf and mute.
    let committed = net.cores[0].delivered();
    let mut net2 = net.without(0);
    net2.advance(Duration::from_secs(2));
    assert!(
        net2.cores.iter().any(|c| c.is_sequencer()),
        "a new sequencer"
    );
    net2.cores[0]
        .send(net2.now, Bytes::from_static(b"go on"))
        .unwrap();
    net2.advance(Duration::from_millis(100));
    for i in 0..2 {
        let m = net2.messages(i);
        assert!(
            m.len() as u64 >= 5 && m.last().unwrap().1 == b"go on",
            "{m:?}"
        );
        assert!(m.iter().all(|(s, _)| *s <= committed || m.len() > 5));
    }
}

#[test]
fn members_that_keep_asking_for_a_reset_let_the_one_they_voted_in_finish() {
    // The sequencer dies; the two survivors' applications each ask for a
    // reset every 100 ms, 50 ms apart.  Each reset waits `vote_wait` for
    // the dead member's vote: were every call to start a new ballot, each
    // would abort the other's before it could settle.
    let mut net = Net::new(3, cfg(1));
    net.cores[1]
        .send(net.now, Bytes::from_static(b"a"))
        .unwrap();
    net.settle();
    let mut net = net.without(0);
    for round in 0..20 {
        net.cores[round % 2].reset(net.now, None);
        net.settle();
        net.advance(Duration::from_millis(50));
        if net.cores.iter().all(|c| c.status() == Status::Normal) {
            break;
        }
    }
    assert!(
        net.cores.iter().all(|c| c.status() == Status::Normal),
        "the survivors reset: {:?}",
        net.cores.iter().map(|c| c.status()).collect::<Vec<_>>()
    );
    assert!(net.cores.iter().any(|c| c.is_sequencer()));
    net.cores[0]
        .send(net.now, Bytes::from_static(b"b"))
        .unwrap();
    net.settle();
    for i in 0..2 {
        assert_eq!(net.messages(i).last().unwrap().1, b"b", "member {i}");
    }
}

#[test]
fn a_stopped_member_cannot_make_the_history_grow_past_its_limit() {
    let limit = 64 * 1024;
    let mut net = Net::new(
        3,
        GroupConfig {
            history_bytes: limit,
            ..cfg(0)
        },
    );
    net.deaf = Some(2);
    for k in 0..200u32 {
        if net.cores[1].can_send(1000) {
            let _ = net.cores[1].send(net.now, Bytes::from(vec![k as u8; 1000]));
        }
        net.advance(Duration::from_millis(10));
        assert!(net.cores[0].info().history_bytes <= limit);
    }
    assert!(
        !net.cores[0].members().iter().any(|m| m.id == MemberId(3)),
        "expelled"
    );
}

proptest! {
    /// A reset's quorum always meets every set of r + 1 holders (so no
    /// committed entry is lost) and is a majority (so no split brain).
    #[test]
    fn quorum_meets_every_holder_set_and_is_a_majority(n in 1usize..40, r in 0usize..40) {
        let c = GroupConfig { resilience: r, ..GroupConfig::default() };
        let q = c.quorum(n);
        let holders = (c.acks_needed(n) + 1).min(n);
        prop_assert!(q <= n);
        prop_assert!(q + holders > n, "n {} r {} quorum {} holders {}", n, r, q, holders);
        prop_assert!(2 * q > n);
    }
}
