//! Prometheus metrics over a minimal HTTP/1.1 responder: every request,
//! whatever its path, gets the text exposition of the node's counters.
//! Up to 32 clients are answered at once, each on its own thread, and up
//! to 4 from one address: idle connections from one place block nobody
//! else's scrapes.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::daemon::Shared;

/// Most scrapes served at once; a connection past them is closed at once.
const MAX_CLIENTS: usize = 32;
/// Most scrapes served at once for one address.
const MAX_PER_ADDRESS: usize = 4;

/// Serves metrics on `addr`; returns the bound address.  Each connection
/// is answered on a thread of its own, so an idle or slow client delays
/// nobody else.
pub fn start(shared: Arc<Shared>, addr: SocketAddr) -> Result<SocketAddr, String> {
    let listener =
        TcpListener::bind(addr).map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let clients = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            let per_address: Arc<parking_lot::Mutex<HashMap<IpAddr, usize>>> = Arc::default();
            let leave = |per_address: &parking_lot::Mutex<HashMap<IpAddr, usize>>, ip| {
                let mut map = per_address.lock();
                if let Some(n) = map.get_mut(&ip) {
                    *n -= 1;
                    if *n == 0 {
                        map.remove(&ip);
                    }
                }
            };
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let Ok(ip) = stream.peer_addr().map(|a| a.ip()) else {
                    continue;
                };
                {
                    let mut map = per_address.lock();
                    let n = map.entry(ip).or_default();
                    if *n >= MAX_PER_ADDRESS {
                        continue;
                    }
                    *n += 1;
                }
                if clients.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
                    clients.fetch_sub(1, Ordering::AcqRel);
                    leave(&per_address, ip);
                    continue;
                }
                let (shared, mine, theirs) = (shared.clone(), clients.clone(), per_address.clone());
                let spawned = std::thread::Builder::new()
                    .name("metrics-client".into())
                    .spawn(move || {
                        answer(&shared, stream);
                        mine.fetch_sub(1, Ordering::AcqRel);
                        leave(&theirs, ip);
                    });
                if spawned.is_err() {
                    clients.fetch_sub(1, Ordering::AcqRel);
                    leave(&per_address, ip);
                }
            }
        })
        .map_err(|e| format!("cannot start metrics thread: {e}"))?;
    Ok(bound)
}

/// Reads one request (whatever it asks) and answers with the exposition.
fn answer(shared: &Shared, mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    let mut buf = [0u8; 4096];
    let _ = stream.read(&mut buf);
    let body = render(shared);
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body.as_bytes());
}

/// The exposition text.
pub fn render(shared: &Shared) -> String {
    let status = shared.status();
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, value: f64| {
        out.push_str(&format!(
            "# HELP shoal_node_{name} {help}\n# TYPE shoal_node_{name} gauge\nshoal_node_{name}{{node=\"{}\"}} {value}\n",
            status.name
        ));
    };
    gauge("up", "1 while the node daemon runs.", 1.0);
    gauge(
        "uptime_seconds",
        "Seconds since the daemon started.",
        status.uptime_s,
    );
    gauge(
        "ports",
        "Ports served by endpoints on this node.",
        status.ports as f64,
    );
    gauge(
        "links",
        "Programs linked to this node.",
        status.links as f64,
    );
    gauge(
        "members_alive",
        "Members this node hears from (itself included).",
        status.members.iter().filter(|m| m.alive).count() as f64,
    );
    gauge(
        "members_known",
        "Members this node knows of (itself included).",
        status.members.len() as f64,
    );
    for (name, value) in &status.counters {
        out.push_str(&format!(
            "# TYPE shoal_node_{name}_total counter\nshoal_node_{name}_total{{node=\"{}\"}} {value}\n",
            status.name
        ));
    }
    render_services(&mut out, &status);
    out
}

/// Each service's state, starts and ends (`docs/services.md`).
fn render_services(out: &mut String, status: &crate::NodeStatus) {
    if status.services.is_empty() {
        return;
    }
    let node = &status.name;
    out.push_str(
        "# HELP shoal_service_up 1 while the service runs.\n# TYPE shoal_service_up gauge\n",
    );
    for s in &status.services {
        let up = u8::from(s.state == "running");
        out.push_str(&format!(
            "shoal_service_up{{node=\"{node}\",service=\"{}\"}} {up}\n",
            s.name
        ));
    }
    out.push_str("# HELP shoal_service_starts_total Times the service was started.\n# TYPE shoal_service_starts_total counter\n");
    for s in &status.services {
        out.push_str(&format!(
            "shoal_service_starts_total{{node=\"{node}\",service=\"{}\"}} {}\n",
            s.name, s.starts
        ));
    }
    out.push_str("# HELP shoal_service_exits_total Times the service ended, by how (exited: status 0; failed: another status; killed: by a signal).\n# TYPE shoal_service_exits_total counter\n");
    for s in &status.services {
        for how in ["exited", "failed", "killed"] {
            out.push_str(&format!(
                "shoal_service_exits_total{{node=\"{node}\",service=\"{}\",how=\"{how}\"}} {}\n",
                s.name,
                s.exits.get(how).copied().unwrap_or(0)
            ));
        }
    }
}
