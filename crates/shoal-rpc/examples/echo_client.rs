//! A minimal shoal client: calls a put-port and checks the echo.
//!
//! ```text
//! SHOAL_NODE=/path/to/node.sock cargo run --example echo_client -- PUT_PORT [BYTES] [COUNT]
//! ```
//!
//! Prints each call's round trip (or the error, which says whether the
//! request may have run) and the client's protocol counters.

use std::time::Instant;

use shoal_rpc::{Context, Error, PutPort};

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let Some(port) = args.next().and_then(|a| a.parse::<PutPort>().ok()) else {
        eprintln!("usage: echo_client PUT_PORT [BYTES] [COUNT]");
        std::process::exit(2);
    };
    let bytes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let count: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let ctx = Context::from_env()?;
    let mut client = ctx.client()?;
    let body: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    let body = bytes::Bytes::from(body);
    let mut rtts = Vec::with_capacity(count);
    for _ in 0..count {
        let start = Instant::now();
        let reply = client.trans(&port, body.clone())?;
        let took = start.elapsed();
        assert!(reply == body, "the echo came back different");
        if count <= 10 {
            let mib_s = (2 * bytes) as f64 / (1 << 20) as f64 / took.as_secs_f64();
            println!("{bytes} bytes there and back in {took:?} ({mib_s:.0} MiB/s)");
        }
        rtts.push(took);
    }
    rtts.sort();
    if let Some(p50) = rtts.get(count / 2) {
        println!("{count} calls of {bytes} bytes: median round trip {p50:?}");
    }
    println!("{:?}", client.stats());
    Ok(())
}
