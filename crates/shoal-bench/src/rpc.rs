//! `shoal bench rpc`: RPC latency and throughput between two nodes,
//! side by side with raw UDP, raw TCP and a gRPC echo.
//!
//! The driver brings up a two-node local cluster (or uses one given with
//! `--dir`), starts a *server agent* on node n2 (a shoal echo port, a raw
//! UDP echo, a raw TCP sink, a TLS 1.3 sink, and a gRPC echo in the clear
//! and over TLS) and runs a *client agent* on node n1 that measures them
//! all, unpinned, with both agents pinned to CPU 0, and split across two
//! CPUs.  Capability verification, the node session handshake and the
//! AEAD's in-memory rate (the ceiling of any encrypted transfer) are
//! measured in the driver.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Subcommand;
use serde::{Deserialize, Serialize};
use shoal_cap::{Capability, ObjectId, ObjectSecret, PutPort, Rights};
use shoal_cluster::Cluster;

use shoal_rpc::{Context, GetPort};

use crate::report::{self, at_least, at_most};
use crate::stats::{median, percentile_us};
use crate::{grpc, tls};

/// Flags of `shoal bench rpc`.
pub use crate::RunArgs as BenchArgs;

/// The halves that run on the nodes.
#[derive(Subcommand, Debug, Clone)]
pub enum AgentCommand {
    /// Serve every target; print their addresses as one JSON line; run
    /// until standard input closes.
    Serve {
        #[arg(long)]
        cpu: Option<usize>,
    },
    /// Measure the targets described by `--targets` (JSON); print results
    /// as one JSON line.
    Client {
        #[arg(long)]
        targets: String,
        #[arg(long)]
        cpu: Option<usize>,
        #[arg(long)]
        quick: bool,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Targets {
    port: String,
    udp: SocketAddr,
    tcp: SocketAddr,
    grpc: SocketAddr,
    /// The TLS 1.3 sink and gRPC over TLS, with the run's certificate.
    tls: SocketAddr,
    grpc_tls: SocketAddr,
    tls_cert: String,
    /// The sealed UDP echo, and the key made for it.
    sealed: SocketAddr,
    sealed_key: [u8; 32],
}

const BULK_BYTES: usize = 64 << 20;

/// Pins the calling thread (and threads it starts later) to `cpu`.
fn pin(cpu: usize) -> Result<(), String> {
    crate::set_affinity(0, &[cpu]).map_err(|e| format!("cannot pin to CPU {cpu}: {e}"))
}

/// Runs an agent.
pub fn agent(command: AgentCommand) -> Result<(), String> {
    match command {
        AgentCommand::Serve { cpu } => {
            if let Some(cpu) = cpu {
                pin(cpu)?;
            }
            serve_agent()
        }
        AgentCommand::Client {
            targets,
            cpu,
            quick,
        } => {
            if let Some(cpu) = cpu {
                pin(cpu)?;
            }
            let targets: Targets = serde_json::from_str(&targets).map_err(|e| e.to_string())?;
            let results = client_agent(&targets, quick)?;
            println!("{}", serde_json::to_string(&results).expect("serializes"));
            Ok(())
        }
    }
}

fn serve_agent() -> Result<(), String> {
    let ctx = Context::from_env().map_err(|e| e.to_string())?;
    let ip = ctx.config().bind_ip;
    let server = ctx.serve(GetPort::random()).map_err(|e| e.to_string())?;
    {
        let server = server.clone();
        std::thread::spawn(move || {
            while let Ok(req) = server.getreq() {
                if server.putrep(&req, Bytes::new()).is_err() {
                    break;
                }
            }
        });
    }
    let udp = UdpSocket::bind(SocketAddr::new(ip, 0)).map_err(|e| e.to_string())?;
    let udp_addr = udp.local_addr().map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        while let Ok((n, from)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(&buf[..n], from);
        }
    });
    let sealed = UdpSocket::bind(SocketAddr::new(ip, 0)).map_err(|e| e.to_string())?;
    let sealed_addr = sealed.local_addr().map_err(|e| e.to_string())?;
    let sealed_key: [u8; 32] = rand::random();
    std::thread::spawn(move || crate::crypto::serve_sealed_echo(sealed, sealed_key));
    let tcp = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| e.to_string())?;
    let tcp_addr = tcp.local_addr().map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        for stream in tcp.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = stream.set_nodelay(true);
                tls::sink(stream)
            });
        }
    });
    let grpc = grpc::GrpcServer::start(SocketAddr::new(ip, 0), None).map_err(|e| e.to_string())?;
    let cert = tls::Cert::new()?;
    let tls_addr = tls::start_sink(ip, &cert)?;
    let grpc_tls =
        grpc::GrpcServer::start(SocketAddr::new(ip, 0), Some(&cert)).map_err(|e| e.to_string())?;
    let targets = Targets {
        port: server.port().to_string(),
        udp: udp_addr,
        tcp: tcp_addr,
        grpc: grpc.local_addr(),
        tls: tls_addr,
        grpc_tls: grpc_tls.local_addr(),
        tls_cert: cert.cert_pem.clone(),
        sealed: sealed_addr,
        sealed_key,
    };
    println!("{}", serde_json::to_string(&targets).expect("serializes"));
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    // Run until the driver closes our standard input.
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    let _ = server.shutdown();
    drop(grpc);
    drop(grpc_tls);
    Ok(())
}

fn client_agent(t: &Targets, quick: bool) -> Result<BTreeMap<String, f64>, String> {
    let n = if quick { 300 } else { 5000 };
    let n_big = if quick { 100 } else { 1000 };
    let bulk_runs = if quick { 1 } else { 5 };
    let warmup = if quick { 50 } else { 500 };
    let mut out = BTreeMap::new();
    let ctx = Context::from_env().map_err(|e| e.to_string())?;
    let ip = ctx.config().bind_ip;
    let port: PutPort = t.port.parse().map_err(|e| format!("{e}"))?;

    // The floor, a plain UDP echo between the same two nodes, shoal's RPCs
    // of each size (request of that size, empty reply) and the gRPC echoes,
    // sampled in interleaved rounds so that drift in the machine's state
    // during the run weighs on all of them alike.
    let udp = UdpSocket::bind(SocketAddr::new(ip, 0)).map_err(|e| e.to_string())?;
    udp.connect(t.udp).map_err(|e| e.to_string())?;
    udp.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; 64];
    let mut sealed = crate::crypto::SealedEchoClient::connect(
        UdpSocket::bind(SocketAddr::new(ip, 0)).map_err(|e| e.to_string())?,
        t.sealed,
        t.sealed_key,
    )?;
    let mut sealed_rtt = Vec::with_capacity(n);
    let mut client = ctx.client().map_err(|e| e.to_string())?;
    let kinds = [
        ("null_rpc", 0usize, n),
        ("rpc_16kib", 16 << 10, n_big),
        ("rpc_30000b", 30_000, n_big),
    ];
    let bodies: Vec<Bytes> = kinds.iter().map(|k| Bytes::from(vec![0x5a; k.1])).collect();
    let mut udp_rtt = Vec::with_capacity(n);
    let mut rtts: Vec<Vec<Duration>> = kinds.iter().map(|k| Vec::with_capacity(k.2)).collect();
    // The peers a user would otherwise pick, a gRPC unary echo, plain and
    // as it is deployed (over TLS), in the same rounds.
    let cert = tls::Cert::trusting(&t.tls_cert)?;
    let mut grpcs = [
        grpc::EchoClient::connect(t.grpc, None).map_err(|e| format!("gRPC: {e}"))?,
        grpc::EchoClient::connect(t.grpc_tls, Some(&cert))
            .map_err(|e| format!("gRPC over TLS: {e}"))?,
    ];
    let mut grpc_rtts: [Vec<Duration>; 2] = [Vec::with_capacity(n), Vec::with_capacity(n)];
    const ROUNDS: usize = 10;
    for round in 0..=ROUNDS {
        // Round 0 is the warm-up; its samples are dropped.
        let keep = round > 0;
        let count = if keep { n / ROUNDS } else { warmup };
        for _ in 0..count {
            let start = Instant::now();
            udp.send(&[]).map_err(|e| e.to_string())?;
            udp.recv(&mut buf)
                .map_err(|e| format!("raw UDP echo: {e}"))?;
            if keep {
                udp_rtt.push(start.elapsed());
            }
        }
        for _ in 0..count {
            let start = Instant::now();
            sealed.echo()?;
            if keep {
                sealed_rtt.push(start.elapsed());
            }
        }
        for (k, (name, _, total)) in kinds.iter().enumerate() {
            let count = if keep { total / ROUNDS } else { warmup };
            for _ in 0..count {
                let start = Instant::now();
                client
                    .trans(&port, bodies[k].clone())
                    .map_err(|e| format!("{name}: {e}"))?;
                if keep {
                    rtts[k].push(start.elapsed());
                }
            }
        }
        for (g, samples) in grpcs.iter_mut().zip(&mut grpc_rtts) {
            let got = g.rtts(0, count).map_err(|e| format!("gRPC: {e}"))?;
            if keep {
                samples.extend(got);
            }
        }
    }
    out.insert("raw_udp_rtt_us_p50".into(), percentile_us(&mut udp_rtt, 50));
    out.insert("raw_udp_rtt_us_p99".into(), percentile_us(&mut udp_rtt, 99));
    out.insert(
        "sealed_udp_rtt_us_p50".into(),
        percentile_us(&mut sealed_rtt, 50),
    );
    out.insert(
        "sealed_udp_rtt_us_p99".into(),
        percentile_us(&mut sealed_rtt, 99),
    );
    for ((name, _, _), mut rtt) in kinds.iter().zip(rtts) {
        out.insert(format!("{name}_rtt_us_p50"), percentile_us(&mut rtt, 50));
        out.insert(format!("{name}_rtt_us_p99"), percentile_us(&mut rtt, 99));
    }

    // Bulk: 64 MiB in one RPC, against 64 MiB over one TCP stream and over
    // a TLS 1.3 stream (what a secure stream costs), one run of each in
    // turn, so that drift weighs on all three alike.
    let big = Bytes::from(vec![0xa5u8; BULK_BYTES]);
    let mib_s =
        |start: Instant| BULK_BYTES as f64 / (1 << 20) as f64 / start.elapsed().as_secs_f64();
    // Warm up with a full-size transfer: the measured runs show the steady
    // state, where the server's body buffer is recycled (see shoal-proto's
    // pool) rather than freshly faulted in.
    client
        .trans(&port, big.clone())
        .map_err(|e| format!("bulk warm-up: {e}"))?;
    let mut tcp = TcpStream::connect(t.tcp).map_err(|e| format!("raw TCP: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    tls::send_blob(&mut tcp, &big[..8 << 20])?;
    let mut stream = tls::connect(t.tls, &cert)?;
    tls::send_blob(&mut stream, &big[..8 << 20])?;
    let (mut rpc_rates, mut tcp_rates, mut tls_rates) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..bulk_runs {
        let start = Instant::now();
        client
            .trans(&port, big.clone())
            .map_err(|e| format!("bulk: {e}"))?;
        rpc_rates.push(mib_s(start));
        let start = Instant::now();
        tls::send_blob(&mut tcp, &big)?;
        tcp_rates.push(mib_s(start));
        let start = Instant::now();
        tls::send_blob(&mut stream, &big)?;
        tls_rates.push(mib_s(start));
    }
    out.insert("bulk_64mib_mib_s".into(), median(&mut rpc_rates));
    out.insert("rpc_retransmits".into(), client.stats().retransmits as f64);
    out.insert("raw_tcp_mib_s".into(), median(&mut tcp_rates));
    out.insert("tls_stream_mib_s".into(), median(&mut tls_rates));

    let [mut grpc_rtt, mut grpc_tls_rtt] = grpc_rtts;
    out.insert(
        "grpc_null_rtt_us_p50".into(),
        percentile_us(&mut grpc_rtt, 50),
    );
    out.insert(
        "grpc_null_rtt_us_p99".into(),
        percentile_us(&mut grpc_rtt, 99),
    );
    out.insert(
        "grpc_tls_null_rtt_us_p50".into(),
        percentile_us(&mut grpc_tls_rtt, 50),
    );
    out.insert(
        "grpc_tls_null_rtt_us_p99".into(),
        percentile_us(&mut grpc_tls_rtt, 99),
    );
    Ok(out)
}

/// Nanoseconds to verify a capability (one restriction step, as a client
/// that narrowed its rights would present it).
fn cap_verify_ns(quick: bool) -> f64 {
    let secret = ObjectSecret::random();
    let port = GetPort::random().put_port();
    let cap = Capability::mint(port, ObjectId(42), Rights::ALL, &secret)
        .restrict(Rights::READ | Rights::WRITE)
        .expect("one step fits");
    let n = if quick { 20_000 } else { 1_000_000 };
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..n {
            let r = std::hint::black_box(&cap).verify(std::hint::black_box(&secret));
            assert!(r.is_ok());
        }
        best = best.min(start.elapsed().as_nanos() as f64 / n as f64);
    }
    best
}

struct Agent {
    child: Child,
}

impl Agent {
    fn stop(mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn start_server(cluster: &Cluster, cpu: Option<usize>) -> Result<(Agent, String), String> {
    let mut cmd = cluster.command("n2", &crate::bench_exe()?)?;
    cmd.args(["agent", "serve"]);
    if let Some(cpu) = cpu {
        cmd.args(["--cpu", &cpu.to_string()]);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the server agent: {e}"))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    if line.trim().is_empty() {
        let _ = child.wait();
        return Err("the server agent failed to start (see its error above)".into());
    }
    Ok((Agent { child }, line.trim().to_string()))
}

fn run_client(
    cluster: &Cluster,
    targets: &str,
    cpu: Option<usize>,
    quick: bool,
) -> Result<BTreeMap<String, f64>, String> {
    let mut cmd = cluster.command("n1", &crate::bench_exe()?)?;
    cmd.args(["agent", "client", "--targets", targets]);
    if let Some(cpu) = cpu {
        cmd.args(["--cpu", &cpu.to_string()]);
    }
    if quick {
        cmd.arg("--quick");
    }
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run the client agent: {e}"))?;
    if !out.status.success() {
        return Err("the client agent failed (see its error above)".into());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("client agent output: {e}"))
}

/// Runs the benchmark.
pub fn run(args: BenchArgs) -> Result<(), String> {
    crate::on_cluster(
        &args,
        ("rpc", (2, "bn", 251)),
        |guard, _| measure(guard.cluster(), &args),
        table,
    )
}

fn measure(cluster: &Cluster, args: &BenchArgs) -> Result<BTreeMap<String, f64>, String> {
    let mut metrics = BTreeMap::new();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut placements = vec![
        ("", None, None, "unpinned"),
        ("_pinned", Some(0), Some(0), "both pinned to CPU 0"),
    ];
    if cpus > 1 {
        placements.push((
            "_split",
            Some(0),
            Some(1),
            "client on CPU 0, server on CPU 1",
        ));
    }
    for (suffix, client_cpu, server_cpu, label) in placements {
        eprintln!("bench: measuring {label} (client on n1, server on n2)");
        let (server, targets) = start_server(cluster, server_cpu)?;
        let results = run_client(cluster, &targets, client_cpu, args.quick);
        server.stop();
        for (name, value) in results? {
            metrics.insert(format!("{name}{suffix}"), value);
        }
    }
    eprintln!("bench: measuring capability verification");
    metrics.insert("cap_verify_ns".into(), cap_verify_ns(args.quick));
    eprintln!("bench: measuring the session handshake and the AEAD ceiling");
    metrics.insert(
        "session_handshake_us".into(),
        crate::crypto::handshake_us(args.quick)?,
    );
    metrics.insert(
        "aead_ceiling_mib_s".into(),
        crate::crypto::aead_ceiling_mib_s(args.quick),
    );
    Ok(metrics)
}

/// The markdown report: Table 1 of the Amoeba–Sprite paper beside shoal's
/// figures, the baselines in every placement, then the targets.
fn table(m: &BTreeMap<String, f64>) -> String {
    let g = |k: &str| m.get(k).copied().unwrap_or(f64::NAN);
    let placements = ["", "_pinned", "_split"];
    let mut t = String::new();
    t.push_str("## RPC latency (Amoeba–Sprite comparison, Table 1(b): user-level IPC)\n\n");
    t.push_str("| size (bytes) | Amoeba 1991 (ms) | Sprite 1991 (ms) | shoal p50 unpinned (µs) | pinned (µs) | split (µs) |\n");
    t.push_str("|---:|---:|---:|---:|---:|---:|\n");
    for (size, amoeba, sprite, key) in [
        (0, 1.2, 7.9, "null_rpc"),
        (16384, 21.0, 33.5, "rpc_16kib"),
        (30000, 36.0, 62.8, "rpc_30000b"),
    ] {
        t.push_str(&format!("| {size} | {amoeba:.1} | {sprite:.1} |"));
        for p in placements {
            t.push_str(&format!(" {:.1} |", g(&format!("{key}_rtt_us_p50{p}"))));
        }
        t.push('\n');
    }
    t.push_str("\nThe 1991 figures are milliseconds between two Sun 3/60s on 10 Mb/s Ethernet;\n");
    t.push_str("shoal's are microseconds between two nodes of a local cluster. Compare ratios, not times.\n");
    t.push_str(
        "Placements: unpinned (the scheduler decides), pinned (client and server on CPU 0),\n",
    );
    t.push_str("split (client on CPU 0, server on CPU 1).\n\n");
    t.push_str("## Null round trip against the baselines (p50 / p99, µs)\n\n");
    t.push_str("| | unpinned | pinned | split |\n|---|---:|---:|---:|\n");
    for (name, key) in [
        ("raw UDP echo", "raw_udp_rtt_us"),
        (
            "sealed UDP echo (the session AEAD, no protocol)",
            "sealed_udp_rtt_us",
        ),
        ("shoal null RPC", "null_rpc_rtt_us"),
        ("gRPC echo (tonic)", "grpc_null_rtt_us"),
        ("gRPC echo over TLS (tonic, rustls)", "grpc_tls_null_rtt_us"),
    ] {
        t.push_str(&format!("| {name} |"));
        for p in placements {
            t.push_str(&format!(
                " {:.1} / {:.1} |",
                g(&format!("{key}_p50{p}")),
                g(&format!("{key}_p99{p}"))
            ));
        }
        t.push('\n');
    }
    t.push_str("\n## Bulk transfer (64 MiB, MiB/s)\n\n| | unpinned | pinned | split |\n|---|---:|---:|---:|\n");
    for (name, key) in [
        ("shoal RPC", "bulk_64mib_mib_s"),
        ("raw TCP", "raw_tcp_mib_s"),
        ("TLS 1.3 stream (rustls)", "tls_stream_mib_s"),
    ] {
        t.push_str(&format!("| {name} |"));
        for p in placements {
            t.push_str(&format!(" {:.0} |", g(&format!("{key}{p}"))));
        }
        t.push('\n');
    }
    t.push_str("| Amoeba 1991 kernel RPC | 0.79 | | |\n| Sprite 1991 kernel RPC | 0.80 | | |\n");
    let ratio = |a: &str, b: &str| g(a) / g(b);
    report::targets(
        &mut t,
        &[
            at_most(
                "null RPC p50 / raw UDP p50",
                ratio("null_rpc_rtt_us_p50", "raw_udp_rtt_us_p50"),
                1.3,
            ),
            at_most(
                "same, pinned",
                ratio("null_rpc_rtt_us_p50_pinned", "raw_udp_rtt_us_p50_pinned"),
                1.3,
            ),
            at_least(
                "gRPC p50 / null RPC p50",
                ratio("grpc_null_rtt_us_p50", "null_rpc_rtt_us_p50"),
                3.0,
            ),
            at_least(
                "same, pinned",
                ratio("grpc_null_rtt_us_p50_pinned", "null_rpc_rtt_us_p50_pinned"),
                3.0,
            ),
            at_least(
                "gRPC over TLS p50 / null RPC p50",
                ratio("grpc_tls_null_rtt_us_p50", "null_rpc_rtt_us_p50"),
                5.0,
            ),
            at_least(
                "same, pinned",
                ratio(
                    "grpc_tls_null_rtt_us_p50_pinned",
                    "null_rpc_rtt_us_p50_pinned",
                ),
                5.0,
            ),
            at_least(
                "64 MiB RPC / TLS stream",
                ratio("bulk_64mib_mib_s", "tls_stream_mib_s"),
                1.1,
            ),
            at_most(
                "node session handshake (µs)",
                g("session_handshake_us"),
                1000.0,
            ),
            at_most("capability verify (ns)", g("cap_verify_ns"), 1000.0),
        ],
    );
    t.push_str(&format!(
        "\nThe AEAD's in-memory seal-and-open rate, the ceiling of any encrypted transfer \
         on this CPU: {:.0} MiB/s.\n",
        g("aead_ceiling_mib_s")
    ));
    t.push_str(&format!(
        "\nFor information: the sealed UDP echo (encryption alone, no protocol) is {:.2} × \
         raw UDP unpinned and {:.2} × pinned; gRPC over TLS is {:.2} × it unpinned and {:.2} × \
         pinned, the most any encrypted RPC could reach against gRPC over TLS here.\n",
        g("sealed_udp_rtt_us_p50") / g("raw_udp_rtt_us_p50"),
        g("sealed_udp_rtt_us_p50_pinned") / g("raw_udp_rtt_us_p50_pinned"),
        g("grpc_tls_null_rtt_us_p50") / g("sealed_udp_rtt_us_p50"),
        g("grpc_tls_null_rtt_us_p50_pinned") / g("sealed_udp_rtt_us_p50_pinned"),
    ));
    t.push_str(&format!(
        "\nFor information: 64 MiB RPC / raw TCP is {:.2} unpinned, {:.2} with both ends on one CPU, {:.2} split across two. Raw TCP is unencrypted: an encrypted transfer's target is the TLS stream above, and the AEAD alone seals and opens {:.0} MiB/s here, {:.2} of raw TCP.\n",
        g("bulk_64mib_mib_s") / g("raw_tcp_mib_s"),
        g("bulk_64mib_mib_s_pinned") / g("raw_tcp_mib_s_pinned"),
        g("bulk_64mib_mib_s_split") / g("raw_tcp_mib_s_split"),
        g("aead_ceiling_mib_s"),
        g("aead_ceiling_mib_s") / g("raw_tcp_mib_s"),
    ));
    t
}
