//! A minimal shoal server: echoes every request back.
//!
//! ```text
//! shoal rpc new-port                      # prints a get-port and its put-port
//! SHOAL_NODE=/path/to/node.sock cargo run --example echo_server -- GET_PORT [THREADS]
//! ```
//!
//! Run it on any node (inside a local cluster: `shoal cluster exec --node n2
//! -- target/debug/examples/echo_server GET_PORT`).  Clients call the
//! put-port from anywhere in the cluster.

use shoal_rpc::{Context, Error, GetPort};

fn main() -> Result<(), Error> {
    let get: GetPort = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| {
            eprintln!("usage: echo_server GET_PORT   (make one with `shoal rpc new-port`)");
            std::process::exit(2);
        });
    let threads: usize = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(4);
    let ctx = Context::from_env()?;
    let server = ctx.serve(get)?;
    println!(
        "serving put-port {} at {}",
        server.port(),
        server.local_addr()
    );
    // Server threads share the endpoint; each takes the next request.
    let threads: Vec<_> = (0..threads)
        .map(|_| {
            let server = server.clone();
            std::thread::spawn(move || -> Result<(), Error> {
                loop {
                    let request = server.getreq()?;
                    let reply = request.body().to_vec();
                    server.putrep(&request, reply)?;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("server thread panicked")?;
    }
    Ok(())
}
