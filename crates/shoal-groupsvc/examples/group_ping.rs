//! Group latency by hand: `group_ping create [R]` creates a group and reads
//! its deliveries (prints the port); `group_ping join PORT` joins and reads;
//! `group_ping ping PORT N` joins and times N sends (p50, p99 in µs).
//! Run each on a node of a local cluster (`shoal cluster exec`).

use std::time::{Duration, Instant};

use shoal_groupsvc::{Group, GroupOptions};
use shoal_rpc::Context;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ctx = Context::from_env().expect("attach to the node");
    match args.first().map(String::as_str) {
        Some("create") => {
            let r = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
            let g = Group::create(
                &ctx,
                GroupOptions {
                    resilience: r,
                    ..Default::default()
                },
            )
            .expect("create");
            println!("{}", g.port());
            loop {
                let _ = g.receive_timeout(Some(Duration::from_secs(1)));
            }
        }
        Some("join") => {
            let g = Group::join(
                &ctx,
                args[1].parse().expect("port"),
                GroupOptions::default(),
            )
            .expect("join");
            loop {
                let _ = g.receive_timeout(Some(Duration::from_secs(1)));
            }
        }
        Some("ping") => {
            let g = Group::join(
                &ctx,
                args[1].parse().expect("port"),
                GroupOptions::default(),
            )
            .expect("join");
            let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2000);
            let mut t = Vec::with_capacity(n);
            for i in 0..n + 200 {
                let start = Instant::now();
                g.send(b"0123456789abcdef").expect("send");
                if i >= 200 {
                    t.push(start.elapsed());
                }
                while let Ok(Some(_)) = g.receive_timeout(Some(Duration::ZERO)) {}
            }
            // Idle for a while (the I/O thread must keep the membership
            // alive), then send again.
            std::thread::sleep(Duration::from_secs(2));
            g.send(b"after a pause").expect("send after a pause");
            t.sort();
            println!(
                "p50 {:.1} µs p99 {:.1} µs",
                t[n / 2].as_secs_f64() * 1e6,
                t[n * 99 / 100].as_secs_f64() * 1e6
            );
        }
        _ => eprintln!("usage: group_ping create [R] | join PORT | ping PORT N"),
    }
}
