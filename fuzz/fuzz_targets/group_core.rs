//! The group core never panics and stays within its memory bounds,
//! whatever authenticated datagrams arrive, in whatever order and at
//! whatever times.
//!
//! Three members (a creator and two joiners) run over an in-memory
//! network and send messages of their own; the fuzz input adds datagrams
//! of its choosing as if sent by one of them, moves the clock, and loses
//! the members' own datagrams.
//!
//! The input is a list of records: `tick, flags, len_lo, len_hi`, then
//! `len` bytes of a datagram's plaintext (as the seal hands it over once
//! it opened).  `tick` advances the clock by `tick` milliseconds (an odd
//! `tick` fires the timers); an odd `flags` loses what the members send in
//! this round, `flags / 2 % 3` picks the member it goes to, and
//! `flags / 8 % 2` makes that member send a message.

#![no_main]

use std::net::SocketAddr;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use shoal_cap::PutPort;
use shoal_group::{GroupConfig, GroupCore, GroupDest, MemberEntry, MemberId};
use shoal_proto::Time;

const fn addr(last: u8) -> SocketAddr {
    SocketAddr::new(
        std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, last)),
        7000,
    )
}

const HISTORY: usize = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    let group = PutPort::from_bytes([1; 16]);
    let cfg = GroupConfig {
        resilience: 1,
        large_bytes: 1000,
        frag_bytes: 600,
        history_bytes: HISTORY,
        max_state_bytes: HISTORY,
        ..GroupConfig::default()
    };
    let members: Vec<MemberEntry> = (1..=3)
        .map(|i| MemberEntry {
            id: MemberId(i),
            addr: addr(i as u8),
        })
        .collect();
    let mut now = Time(0);
    let mut cores = vec![GroupCore::create(
        now,
        group,
        members[0],
        cfg.clone(),
    )];
    for m in &members[1..] {
        cores.push(GroupCore::join(
            now,
            group,
            *m,
            cfg.clone(),
            vec![members[0].addr],
            m.id.0,
        ));
    }
    let mut rest = data;
    let mut rounds = 0;
    while rest.len() >= 4 && rounds < 2000 {
        rounds += 1;
        let (tick, flags) = (rest[0], rest[1]);
        let len = (u16::from_le_bytes([rest[2], rest[3]]) as usize).min(rest.len() - 4);
        let datagram = rest[4..4 + len].to_vec();
        rest = &rest[4 + len..];
        now = Time(now.0 + u64::from(tick) * 1000);
        let target = (flags / 2 % 3) as usize;
        let from = members[(target + 1) % 3].addr;
        cores[target].handle_datagram(now, from, &datagram);
        if flags / 8 % 2 == 1 && cores[target].can_send(100) {
            let _ = cores[target].send(now, Bytes::from(vec![flags; 100 + tick as usize * 10]));
        }
        if tick % 2 == 1 {
            for c in cores.iter_mut() {
                c.handle_timeout(now);
            }
        }
        // Move the members' own datagrams (or lose them).
        for _ in 0..8 {
            let mut moved = false;
            for i in 0..3 {
                while let Some(t) = cores[i].poll_transmit() {
                    moved = true;
                    if flags % 2 == 1 {
                        continue;
                    }
                    let to: Vec<usize> = match t.dest {
                        GroupDest::Addr(a) => members
                            .iter()
                            .position(|m| m.addr == a)
                            .into_iter()
                            .collect(),
                        GroupDest::Members => (0..3).filter(|&j| j != i).collect(),
                    };
                    for j in to {
                        cores[j].handle_datagram(now, members[i].addr, &t.bytes);
                    }
                }
                while cores[i].poll_event().is_some() {}
                while cores[i].poll_sent().is_some() {}
            }
            if !moved {
                break;
            }
        }
        for c in &cores {
            let info = c.info();
            if c.is_sequencer() {
                assert!(
                    info.history_bytes <= HISTORY,
                    "sequencer history over its limit"
                );
            }
            assert!(
                info.history_bytes <= 2 * HISTORY + 64 * 1024,
                "member log over its limit"
            );
        }
    }
});
