//! `shoal bench group`: group communication on a three-node cluster,
//! measured side by side with a null RPC and a three-member etcd cluster,
//! in one run.
//!
//! Placement: the creator of every group, and so its sequencer, runs on
//! n2; the measuring sender on n1; a passive member on n3.  The etcd peer
//! is placed alike: one member per node, its leader moved to n2, the
//! client on n1.
//!
//! The driver brings up the cluster (or uses `--dir`), starts etcd, and
//! runs one *member agent* per node (`shoal-bench agent group member`),
//! which it drives line by line over the agent's standard input; the agent
//! answers each command with one JSON line (see `member_agent`).  An
//! agent reads its deliveries all the time (one receive thread per group:
//! a member that never reads falls behind and is expelled), except while it
//! measures, when the measuring thread reads them itself between sends, so
//! that no hand-off between threads is timed.
//!
//! Phases, in order:
//! 1. latency: 16-byte sends at r = 0, 1, 2 (three groups), null RPCs
//!    n1 → n2 and etcd puts, sampled in interleaved rounds; then r = 0 and
//!    the null RPC again with the agents pinned, sender and sequencer on
//!    one CPU (`_pinned`) and on two (`_split`): left to the scheduler,
//!    the group's threads and the RPC's may sit in different placements
//!    in one run, and the ratio of the two then compares placements, not
//!    protocols;
//! 2. throughput of 16-byte messages and bandwidth of 1 MiB messages at
//!    r = 0, with sender threads on n1 and n3 (a member that only receives
//!    is expelled from a group busy for longer than `dead_after`: at r = 0
//!    the sequencer asks silent members for their status only when quiet);
//! 3. datagrams per message at r = 0: n1 and n3 send at once, the members'
//!    counters are read before and after through `inspect`;
//! 4. fail-over at r = 1: n1 sends continuously, the driver SIGKILLs the
//!    sequencer's agent and n1 reports the gap.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Subcommand;
use serde_json::{Value, json};
use shoal_cluster::{Cluster, Mode};
use shoal_groupsvc::{Group, GroupOptions};
use shoal_rpc::{Context, GetPort, PutPort, Server};

use crate::agent::{Agent, say};
use crate::etcd::{Etcd, Kv, find_etcd};
use crate::report::{self, target};
use crate::stats::{median, percentile_us};

/// Flags of `shoal bench group`.
pub use crate::RunArgs as BenchArgs;

/// The halves of `shoal bench group` that run on the nodes.
#[derive(Subcommand, Debug, Clone)]
pub enum AgentCommand {
    /// A group member driven by commands on standard input, one JSON
    /// answer line each on standard output; leaves its groups and exits
    /// when standard input closes.
    Member,
}

/// Size of the small messages (latency, throughput, packet count).
const SMALL: usize = 16;
/// Size of the large messages (bandwidth): sent by BB.
const LARGE: usize = 1 << 20;

// ----- the agent -------------------------------------------------------------

/// Runs an agent.
pub fn agent(command: AgentCommand) -> Result<(), String> {
    match command {
        AgentCommand::Member => member_agent(),
    }
}

/// One group this agent is a member of, with its receive thread.
struct Membership {
    group: Arc<Group>,
    /// The receive thread stops reading (a measuring thread reads instead).
    paused: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    /// The receive thread saw this member expelled.
    lost: Arc<AtomicBool>,
    receiver: Option<JoinHandle<()>>,
}

impl Membership {
    fn new(group: Group) -> Membership {
        let group = Arc::new(group);
        let paused = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicBool::new(false));
        let receiver = {
            let (group, paused, stop, lost) =
                (group.clone(), paused.clone(), stop.clone(), lost.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    if paused.load(Ordering::Acquire) {
                        // Woken by `pause(false)`.
                        std::thread::park_timeout(Duration::from_millis(100));
                        continue;
                    }
                    if group
                        .receive_timeout(Some(Duration::from_millis(20)))
                        .is_err()
                    {
                        lost.store(true, Ordering::Release);
                        return;
                    }
                }
            })
        };
        Membership {
            group,
            paused,
            stop,
            lost,
            receiver: Some(receiver),
        }
    }

    fn pause(&self, on: bool) {
        self.paused.store(on, Ordering::Release);
        if !on && let Some(t) = &self.receiver {
            t.thread().unpark();
        }
    }

    fn leave(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.receiver.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        self.group.leave();
    }
}

/// Reads every delivery already there (the measuring thread's share of
/// the receive loop).
fn drain(group: &Group) -> Result<(), String> {
    while group
        .receive_timeout(Some(Duration::ZERO))
        .map_err(|e| e.to_string())?
        .is_some()
    {}
    Ok(())
}

struct AgentState {
    ctx: Context,
    groups: HashMap<String, Membership>,
    server: Option<Server>,
}

/// The member agent's command loop.  Commands (one line each):
///
/// ```text
/// create LABEL R [unicast]       → {"port": P}   create a group, resilience R
/// join LABEL PORT [unicast]     → {"ok": true}
/// leave LABEL                    → {"ok": true}
/// serve-rpc                      → {"port": P}   an echo port for null RPCs
/// latency N WARMUP LABELS RPC ETCD → {metric: value}
///                                  LABELS: comma-separated; RPC: put-port
///                                  or -; ETCD: ip:port or -
/// stream LABEL THREADS MS BYTES  → {"msgs", "secs", "max_ms", "slow"}
/// inspect LABEL                  → {"members": [info, ...]}
/// info LABEL                     → this member's info
/// failover LABEL                 → {"ready": true} once sending; then,
///                                  after a `kill` line: {"failover_ms", ...}
/// ```
///
/// A failed command answers `{"error": "..."}`.
fn member_agent() -> Result<(), String> {
    let ctx = Context::from_env().map_err(|e| e.to_string())?;
    let mut state = AgentState {
        ctx,
        groups: HashMap::new(),
        server: None,
    };
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    while let Some(Ok(line)) = lines.next() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.is_empty() {
            continue;
        }
        let answer = match state.command(&words, &mut lines) {
            Ok(v) => v,
            Err(e) => json!({ "error": e }),
        };
        say(&answer);
    }
    // Standard input closed: leave every group, stop serving.
    for (_, m) in state.groups.drain() {
        m.leave();
    }
    if let Some(server) = state.server.take() {
        let _ = server.shutdown();
    }
    Ok(())
}

impl AgentState {
    fn member(&self, label: &str) -> Result<&Membership, String> {
        self.groups
            .get(label)
            .ok_or_else(|| format!("no group {label} here"))
    }

    fn command(
        &mut self,
        words: &[&str],
        lines: &mut dyn Iterator<Item = std::io::Result<String>>,
    ) -> Result<Value, String> {
        let arg = |i: usize| -> Result<&str, String> {
            words
                .get(i)
                .copied()
                .ok_or_else(|| format!("{}: missing argument {i}", words[0]))
        };
        let num = |i: usize| -> Result<usize, String> {
            arg(i)?.parse().map_err(|e| format!("{}: {e}", words[0]))
        };
        match words[0] {
            "create" => {
                let opts = GroupOptions {
                    resilience: num(2)?,
                    // For experiments: `unicast` sends broadcasts as one
                    // datagram per member.
                    multicast: (words.get(3) == Some(&"unicast")).then_some(false),
                    ..GroupOptions::default()
                };
                let g = Group::create(&self.ctx, opts).map_err(|e| e.to_string())?;
                let port = g.port().to_string();
                self.groups.insert(arg(1)?.to_string(), Membership::new(g));
                Ok(json!({ "port": port }))
            }
            "join" => {
                let port: PutPort = arg(2)?.parse().map_err(|e| format!("join: {e}"))?;
                let opts = GroupOptions {
                    multicast: (words.get(3) == Some(&"unicast")).then_some(false),
                    ..GroupOptions::default()
                };
                let g = Group::join(&self.ctx, port, opts).map_err(|e| e.to_string())?;
                self.groups.insert(arg(1)?.to_string(), Membership::new(g));
                Ok(json!({ "ok": true }))
            }
            "leave" => {
                let m = self
                    .groups
                    .remove(arg(1)?)
                    .ok_or_else(|| format!("no group {} here", arg(1).unwrap_or("")))?;
                m.leave();
                Ok(json!({ "ok": true }))
            }
            "serve-rpc" => {
                let server = self
                    .ctx
                    .serve(GetPort::random())
                    .map_err(|e| e.to_string())?;
                let s = server.clone();
                std::thread::spawn(move || {
                    while let Ok(req) = s.getreq() {
                        if s.putrep(&req, Bytes::new()).is_err() {
                            break;
                        }
                    }
                });
                let port = server.port().to_string();
                self.server = Some(server);
                Ok(json!({ "port": port }))
            }
            "latency" => self.latency(num(1)?, num(2)?, arg(3)?, arg(4)?, arg(5)?),
            "stream" => {
                let m = self.member(arg(1)?)?;
                let ms = num(3)? as u64;
                stream(m, num(2)?, Duration::from_millis(ms), num(4)?)
            }
            "inspect" => {
                let m = self.member(arg(1)?)?;
                let list = shoal_groupsvc::inspect(&self.ctx, &m.group.port())
                    .map_err(|e| e.to_string())?;
                Ok(json!({ "members": list }))
            }
            "info" => {
                let m = self.member(arg(1)?)?;
                let mut v = serde_json::to_value(m.group.info()).expect("info serializes");
                v["lost"] = json!(m.lost.load(Ordering::Acquire));
                Ok(v)
            }
            "failover" => failover(self.member(arg(1)?)?, lines),
            "pin" => pin_process(arg(1)?),
            other => Err(format!("unknown command {other}")),
        }
    }

    /// Latency of every kind, sampled in interleaved rounds (round 0 is
    /// the warm-up) so that drift in the machine's state weighs on all
    /// alike.
    fn latency(
        &self,
        n: usize,
        warmup: usize,
        labels: &str,
        rpc: &str,
        etcd: &str,
    ) -> Result<Value, String> {
        enum Kind<'a> {
            Group(&'a Membership),
            Rpc(Box<shoal_rpc::Client>, PutPort),
            Etcd(Box<Kv>),
        }
        let mut kinds: Vec<(String, Kind)> = Vec::new();
        for label in labels.split(',').filter(|l| !l.is_empty()) {
            kinds.push((
                format!("group_{label}_us"),
                Kind::Group(self.member(label)?),
            ));
        }
        if rpc != "-" {
            let port: PutPort = rpc.parse().map_err(|e| format!("rpc port: {e}"))?;
            let client = self.ctx.client().map_err(|e| e.to_string())?;
            kinds.push(("null_rpc_rtt_us".into(), Kind::Rpc(Box::new(client), port)));
        }
        if etcd != "-" {
            let addr: SocketAddr = etcd.parse().map_err(|e| format!("etcd address: {e}"))?;
            let kv = Kv::connect(addr)?;
            kinds.push(("etcd_put_us".into(), Kind::Etcd(Box::new(kv))));
        }
        let msg = [0x5au8; SMALL];
        let mut samples: Vec<Vec<Duration>> = kinds.iter().map(|_| Vec::with_capacity(n)).collect();
        for (_, k) in &kinds {
            if let Kind::Group(m) = k {
                m.pause(true);
            }
        }
        const ROUNDS: usize = 10;
        let result = (|| -> Result<(), String> {
            for round in 0..=ROUNDS {
                let keep = round > 0;
                let count = if keep { n / ROUNDS } else { warmup };
                for ((name, kind), out) in kinds.iter_mut().zip(samples.iter_mut()) {
                    for _ in 0..count {
                        let start = Instant::now();
                        match kind {
                            Kind::Group(m) => {
                                m.group.send(&msg).map_err(|e| format!("{name}: {e}"))?;
                                let t = start.elapsed();
                                drain(&m.group)?;
                                if keep {
                                    out.push(t);
                                }
                                continue;
                            }
                            Kind::Rpc(client, port) => {
                                client
                                    .trans(port, Bytes::new())
                                    .map_err(|e| format!("{name}: {e}"))?;
                            }
                            Kind::Etcd(kv) => {
                                kv.put(b"shoal-bench/put", &msg)?;
                            }
                        }
                        if keep {
                            out.push(start.elapsed());
                        }
                    }
                }
            }
            Ok(())
        })();
        for (_, k) in &kinds {
            if let Kind::Group(m) = k {
                m.pause(false);
            }
        }
        result?;
        let mut out = serde_json::Map::new();
        for ((name, _), mut s) in kinds.iter().zip(samples) {
            out.insert(format!("{name}_p50"), json!(percentile_us(&mut s, 50)));
            out.insert(format!("{name}_p99"), json!(percentile_us(&mut s, 99)));
        }
        Ok(Value::Object(out))
    }
}

/// Sets the CPUs of every thread of this process (`all`, or one CPU's
/// number); threads started later inherit them from their starter.
fn pin_process(cpus: &str) -> Result<Value, String> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    let wanted: Vec<usize> = if cpus == "all" {
        (0..n).collect()
    } else {
        vec![cpus.parse().map_err(|e| format!("pin {cpus}: {e}"))?]
    };
    let tasks = std::fs::read_dir("/proc/self/task").map_err(|e| format!("pin: {e}"))?;
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
        else {
            continue;
        };
        match crate::set_affinity(tid, &wanted) {
            // A thread that ended meanwhile is no matter.
            Err(e) if e.raw_os_error() != Some(libc::ESRCH) => {
                return Err(format!("pin thread {tid} to {cpus}: {e}"));
            }
            _ => {}
        }
    }
    Ok(json!({ "ok": true }))
}

/// `threads` threads send messages of `bytes` bytes for `dur`; each reads
/// the deliveries between its sends.
fn stream(m: &Membership, threads: usize, dur: Duration, bytes: usize) -> Result<Value, String> {
    m.pause(true);
    let start = Instant::now();
    let until = start + dur;
    let body = Arc::new(vec![0xa5u8; bytes]);
    let handles: Vec<_> = (0..threads.max(1))
        .map(|_| {
            let (g, body) = (m.group.clone(), body.clone());
            std::thread::spawn(move || -> Result<(u64, Duration, u64, Instant), String> {
                let (mut sent, mut max, mut slow) = (0u64, Duration::ZERO, 0u64);
                while Instant::now() < until {
                    let t = Instant::now();
                    g.send(&body).map_err(|e| e.to_string())?;
                    let took = t.elapsed();
                    max = max.max(took);
                    if took >= Duration::from_millis(10) {
                        slow += 1;
                    }
                    sent += 1;
                    drain(&g)?;
                }
                Ok((sent, max, slow, Instant::now()))
            })
        })
        .collect();
    let mut total = (0u64, Duration::ZERO, 0u64, start);
    let mut error = None;
    for h in handles {
        match h.join().map_err(|_| "a sender thread panicked".to_string()) {
            Ok(Ok((sent, max, slow, end))) => {
                total.0 += sent;
                total.1 = total.1.max(max);
                total.2 += slow;
                total.3 = total.3.max(end);
            }
            Ok(Err(e)) | Err(e) => error = Some(e),
        }
    }
    m.pause(false);
    if let Some(e) = error {
        return Err(e);
    }
    Ok(json!({
        "msgs": total.0,
        "secs": (total.3 - start).as_secs_f64(),
        "max_ms": total.1.as_secs_f64() * 1e3,
        "slow": total.2,
    }))
}

/// Sends continuously; once the driver says `kill` (just before it kills
/// the sequencer), reports how long after that the first message was
/// ordered in the group's next incarnation.
fn failover(
    m: &Membership,
    lines: &mut dyn Iterator<Item = std::io::Result<String>>,
) -> Result<Value, String> {
    m.pause(true);
    let g = m.group.clone();
    let inc0 = g.info().incarnation;
    let killed: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let (ready_tx, ready_rx) = mpsc::channel();
    let sender = {
        let killed = killed.clone();
        std::thread::spawn(move || -> Result<Value, String> {
            let msg = [0x5au8; SMALL];
            let started = Instant::now();
            let mut sent = 0u64;
            let mut ready = Some(ready_tx);
            loop {
                let seq = g.send(&msg).map_err(|e| e.to_string())?;
                let end = Instant::now();
                sent += 1;
                drain(&g)?;
                if sent >= 200
                    && started.elapsed() >= Duration::from_millis(200)
                    && let Some(tx) = ready.take()
                {
                    let _ = tx.send(());
                }
                let Some(at) = *killed.lock().expect("not poisoned") else {
                    continue;
                };
                if end <= at {
                    continue;
                }
                // Ordered after the kill: by the new sequencer only if the
                // incarnation changed (a message ordered just before the
                // kill may complete just after it).
                let info = g.info();
                if info.incarnation != inc0 {
                    return Ok(json!({
                        "failover_ms": (end - at).as_secs_f64() * 1e3,
                        "sent_before": sent - 1,
                        "seq": seq.0,
                        "incarnation": info.incarnation,
                        "sequencer": info.sequencer,
                        "members": info.members.len(),
                    }));
                }
                if at.elapsed() > Duration::from_secs(30) {
                    return Err("no message ordered in a new incarnation within 30 s".into());
                }
            }
        })
    };
    let result = (|| -> Result<Value, String> {
        if ready_rx.recv_timeout(Duration::from_secs(20)).is_err() {
            return Err("the sender did not get going".into());
        }
        say(&json!({ "ready": true }));
        match lines.next() {
            Some(Ok(line)) if line.trim() == "kill" => {}
            other => return Err(format!("failover: expected `kill`, got {other:?}")),
        }
        *killed.lock().expect("not poisoned") = Some(Instant::now());
        sender
            .join()
            .map_err(|_| "the sender thread panicked".to_string())?
    })();
    m.pause(false);
    result
}

// ----- the driver ------------------------------------------------------------

/// The nodes, in placement order: the sender, the sequencer, the passive
/// member.
const NODES: [&str; 3] = ["n1", "n2", "n3"];

/// The member agent's command line.
const MEMBER: &[&str] = &["group", "member"];

/// Runs the benchmark.
pub fn run(args: BenchArgs) -> Result<(), String> {
    let etcd = find_etcd()?;
    crate::on_cluster(
        &args,
        ("group", (3, "bg", 252)),
        |guard, _| measure(guard.cluster(), &etcd, args.quick),
        table,
    )
}

fn num(v: &Value, key: &str) -> Result<f64, String> {
    v[key]
        .as_f64()
        .ok_or_else(|| format!("agent answer without {key}: {v}"))
}

/// Sum over the members' info of `stats.datagrams_sent` (a broadcast
/// counted once per receiver where it is not multicast) and the sequencer's
/// delivered count.
fn datagrams(members: &Value, multicast: bool) -> Result<(f64, usize), String> {
    let list = members["members"]
        .as_array()
        .ok_or("inspect: no member list")?;
    let mut sum = 0.0;
    for m in list {
        let s = &m["stats"];
        let sent = s["datagrams_sent"].as_f64().ok_or("inspect: no stats")?;
        let bcast = s["broadcasts_sent"].as_f64().unwrap_or(0.0);
        sum += if multicast {
            sent
        } else {
            sent + bcast * (list.len().saturating_sub(2)) as f64
        };
    }
    Ok((sum, list.len()))
}

/// Sender threads per node for small and large messages.
const SMALL_THREADS: usize = 2;
const LARGE_THREADS: usize = 1;
/// n1 alone sends in bursts this long, this far apart.
const BURST_MS: u64 = 300;
const PAUSE_MS: u64 = 100;

/// Fails unless every agent is still a normal member of the group's first
/// incarnation: nobody expelled, no reset.
fn check_intact(agents: &mut [&mut Agent], label: &str) -> Result<(), String> {
    for agent in agents.iter_mut() {
        let info = agent.call(&format!("info {label}"))?;
        if info["lost"] == json!(true)
            || info["status"] != json!("normal")
            || info["incarnation"] != json!(1)
            || info["members"].as_array().map(Vec::len) != Some(3)
        {
            return Err(format!(
                "the group is no longer intact on {}: {info}",
                agent.node
            ));
        }
    }
    Ok(())
}

fn measure(
    cluster: &Cluster,
    etcd_bin: &Path,
    quick: bool,
) -> Result<BTreeMap<String, f64>, String> {
    for node in NODES {
        cluster.node(node)?;
    }
    let multicast = cluster.file().mode == Mode::Netns;
    let mut metrics = BTreeMap::new();
    let (n, warmup) = if quick { (300, 50) } else { (5000, 500) };
    let stream_ms = if quick { 500 } else { 3000 };
    let failovers = if quick { 1 } else { 5 };

    let etcd = Etcd::start_led_from(cluster, etcd_bin, (&NODES, 1), &mut metrics)?;

    eprintln!("bench: starting agents; groups r = 0, 1, 2 created on n2 (the sequencer)");
    let mut a2 = Agent::start(cluster, "n2", MEMBER)?;
    let mut a1 = Agent::start(cluster, "n1", MEMBER)?;
    let mut a3 = Agent::start(cluster, "n3", MEMBER)?;
    for r in 0..3 {
        let port = a2.call(&format!("create r{r} {r}"))?["port"]
            .as_str()
            .ok_or("create: no port")?
            .to_string();
        a1.call(&format!("join r{r} {port}"))?;
        a3.call(&format!("join r{r} {port}"))?;
    }
    let rpc = a2.call("serve-rpc")?["port"]
        .as_str()
        .ok_or("serve-rpc: no port")?
        .to_string();

    eprintln!(
        "bench: latency: {n} samples each of r = 0, 1, 2, null RPC and etcd put, in interleaved rounds"
    );
    let lat = a1.call(&format!(
        "latency {n} {warmup} r0,r1,r2 {rpc} {}",
        etcd.clients[0]
    ))?;
    for (k, v) in lat.as_object().ok_or("latency: not an object")? {
        metrics.insert(k.clone(), v.as_f64().unwrap_or(f64::NAN));
    }
    drop(etcd);
    if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
        for (suffix, sequencer, label) in [
            ("_pinned", "0", "sender and sequencer on CPU 0"),
            ("_split", "1", "sender on CPU 0, sequencer on CPU 1"),
        ] {
            eprintln!("bench: latency: r = 0 and null RPC again, {label}");
            a1.call("pin 0")?;
            a2.call(&format!("pin {sequencer}"))?;
            let lat = a1.call(&format!("latency {n} {warmup} r0 {rpc} -"))?;
            for (k, v) in lat.as_object().ok_or("latency: not an object")? {
                metrics.insert(format!("{k}{suffix}"), v.as_f64().unwrap_or(f64::NAN));
            }
        }
        a1.call("pin all")?;
        a2.call("pin all")?;
    }
    for agent in [&mut a1, &mut a3, &mut a2] {
        for r in [1, 2] {
            agent.call(&format!("leave r{r}"))?;
        }
    }

    // Streams run on n1 and n3 at once: a member that only receives is
    // expelled from a busy r = 0 group (see docs/benchmarks.md), and the
    // paper's directory servers all send.
    let both = |a1: &mut Agent, a3: &mut Agent, cmd: &str| -> Result<(f64, f64), String> {
        a1.write(cmd)?;
        a3.write(cmd)?;
        let (x, y) = (a1.answer()?, a3.answer()?);
        let secs = num(&x, "secs")?.max(num(&y, "secs")?);
        let max_ms = num(&x, "max_ms")?.max(num(&y, "max_ms")?);
        Ok(((num(&x, "msgs")? + num(&y, "msgs")?) / secs, max_ms))
    };
    eprintln!(
        "bench: throughput: {SMALL_THREADS} sender threads on n1 and {SMALL_THREADS} on n3, 16-byte messages, r = 0"
    );
    let cmd = |threads: usize, ms: u64, bytes: usize| format!("stream r0 {threads} {ms} {bytes}");
    both(&mut a1, &mut a3, &cmd(SMALL_THREADS, stream_ms / 5, SMALL))?;
    let (rate, _) = both(&mut a1, &mut a3, &cmd(SMALL_THREADS, stream_ms, SMALL))?;
    metrics.insert("group_msgs_per_s".into(), rate);
    check_intact(&mut [&mut a1, &mut a2, &mut a3], "r0")?;

    eprintln!(
        "bench: bandwidth: {LARGE_THREADS} sender thread on n1 and {LARGE_THREADS} on n3, 1 MiB messages (BB), r = 0"
    );
    both(&mut a1, &mut a3, &cmd(LARGE_THREADS, stream_ms / 5, LARGE))?;
    let (rate, max_ms) = both(&mut a1, &mut a3, &cmd(LARGE_THREADS, stream_ms, LARGE))?;
    metrics.insert(
        "group_1mib_mib_s".into(),
        rate * LARGE as f64 / (1 << 20) as f64,
    );
    metrics.insert("group_1mib_max_send_ms".into(), max_ms);
    check_intact(&mut [&mut a1, &mut a2, &mut a3], "r0")?;

    // Datagrams per message: every member's counters through `inspect`
    // before and after.  The first answer of every member to the first
    // inspect is counted in the second; it is taken off.
    let count = |a1: &mut Agent, a3: &mut Agent, both: bool| -> Result<f64, String> {
        let before = a1.call("inspect r0")?;
        let mut msgs = 0.0;
        if both {
            let cmd = format!("stream r0 1 {stream_ms} {SMALL}");
            a1.write(&cmd)?;
            a3.write(&cmd)?;
            msgs += num(&a1.answer()?, "msgs")? + num(&a3.answer()?, "msgs")?;
        } else {
            // n1 alone, in bursts shorter than the time after which the
            // sequencer expels a member it has not heard from.
            for _ in 0..(stream_ms / BURST_MS).max(1) {
                msgs += num(
                    &a1.call(&format!("stream r0 1 {BURST_MS} {SMALL}"))?,
                    "msgs",
                )?;
                std::thread::sleep(Duration::from_millis(PAUSE_MS));
            }
        }
        // Include the status traffic that follows a stream.
        std::thread::sleep(Duration::from_millis(100));
        let after = a1.call("inspect r0")?;
        let (b, members) = datagrams(&before, multicast)?;
        let (a, members_after) = datagrams(&after, multicast)?;
        if members != 3 || members_after != 3 {
            return Err(format!(
                "inspect answered for {members} and {members_after} members, not 3"
            ));
        }
        Ok((a - b - members as f64) / msgs)
    };
    eprintln!("bench: datagrams per message: n1 and n3 send 16-byte messages at once, r = 0");
    metrics.insert(
        "group_packets_per_msg_r0".into(),
        count(&mut a1, &mut a3, true)?,
    );
    eprintln!("bench: datagrams per message: n1 alone sends, in bursts of {BURST_MS} ms, r = 0");
    metrics.insert(
        "group_packets_per_msg_r0_one_sender".into(),
        count(&mut a1, &mut a3, false)?,
    );
    check_intact(&mut [&mut a1, &mut a2, &mut a3], "r0")?;
    for agent in [&mut a1, &mut a3, &mut a2] {
        agent.call("leave r0")?;
    }
    drop(a2);

    let mut gaps = Vec::new();
    for i in 1..=failovers {
        eprintln!(
            "bench: fail-over {i}/{failovers}: r = 1, n1 sends, the sequencer on n2 is SIGKILLed"
        );
        let mut b2 = Agent::start(cluster, "n2", MEMBER)?;
        let label = format!("f{i}");
        let port = b2.call(&format!("create {label} 1"))?["port"]
            .as_str()
            .ok_or("create: no port")?
            .to_string();
        a1.call(&format!("join {label} {port}"))?;
        a3.call(&format!("join {label} {port}"))?;
        let ready = a1.call(&format!("failover {label}"))?;
        if ready["ready"] != json!(true) {
            return Err(format!("failover: unexpected answer {ready}"));
        }
        a1.write("kill")?;
        b2.kill();
        let result = a1.answer()?;
        let gap = num(&result, "failover_ms")?;
        eprintln!(
            "bench:   {gap:.0} ms to the next ordered message (incarnation {}, {} members)",
            result["incarnation"], result["members"]
        );
        gaps.push(gap);
        a3.call(&format!("leave {label}"))?;
        a1.call(&format!("leave {label}"))?;
    }
    metrics.insert(
        "group_failover_ms_max".into(),
        gaps.iter().copied().fold(0.0, f64::max),
    );
    metrics.insert("group_failover_ms".into(), median(&mut gaps));
    Ok(metrics)
}

/// The markdown report: the paper's message counts beside shoal's
/// figures, then the targets.
fn table(m: &BTreeMap<String, f64>) -> String {
    let g = |k: &str| m.get(k).copied().unwrap_or(f64::NAN);
    let rpc = g("null_rpc_rtt_us_p50");
    let mut t = String::new();
    t.push_str("## Group communication (group-vs-RPC directory paper, 1992)\n\n");
    t.push_str(
        "> \"The protocol implementing these semantics only requires 2 messages per reliable,\n",
    );
    t.push_str(
        "> globally ordered group message. [...] The costs for this protocol are 3 + R messages\n",
    );
    t.push_str(
        "> per fault-tolerant and globally ordered group message.\"  An RPC is 2 messages too\n",
    );
    t.push_str("> (request, reply): in Amoeba a group message cost about as much as an RPC.\n\n");
    t.push_str("| 16-byte message, 3 members | Amoeba (messages) | shoal p50 (µs) | p99 (µs) | p50 / null RPC p50 |\n");
    t.push_str("|---|---:|---:|---:|---:|\n");
    for (name, paper, key) in [
        ("group send, r = 0", "2", "group_r0_us"),
        ("group send, r = 1", "4", "group_r1_us"),
        ("group send, r = 2", "5", "group_r2_us"),
        ("null RPC n1 → n2", "2", "null_rpc_rtt_us"),
        ("etcd put (3 members, leader on n2)", "", "etcd_put_us"),
    ] {
        let p50 = g(&format!("{key}_p50"));
        t.push_str(&format!(
            "| {name} | {paper} | {p50:.1} | {:.1} | {:.2} |\n",
            g(&format!("{key}_p99")),
            p50 / rpc
        ));
    }
    t.push_str("\nSender on n1, sequencer (the group's creator) on n2, a passive member on n3;\n");
    t.push_str("all latencies sampled in interleaved rounds in the same run.\n\n");
    t.push_str("| placement | group send, r = 0, p50 (µs) | null RPC p50 (µs) | ratio |\n|---|---:|---:|---:|\n");
    for (name, suffix) in [
        ("unpinned (the scheduler decides)", ""),
        ("pinned: sender and sequencer on CPU 0", "_pinned"),
        ("split: sender on CPU 0, sequencer on CPU 1", "_split"),
    ] {
        let group = g(&format!("group_r0_us_p50{suffix}"));
        let rpc = g(&format!("null_rpc_rtt_us_p50{suffix}"));
        t.push_str(&format!(
            "| {name} | {group:.1} | {rpc:.1} | {:.2} |\n",
            group / rpc
        ));
    }
    t.push_str("\nThe passive member n3 is left to the scheduler in every placement.\n\n");
    t.push_str("| r = 0 | shoal | Amoeba |\n|---|---:|---:|\n");
    #[rustfmt::skip]
    let rows = [
        ("16-byte messages/s (2 sender threads on n1, 2 on n3)", format!("{:.0}", g("group_msgs_per_s")), ""),
        ("1 MiB messages, MiB/s (BB, 1 sender thread on n1, 1 on n3)", format!("{:.0}", g("group_1mib_mib_s")), ""),
        ("datagrams per message (n1 and n3 sending)", format!("{:.3}", g("group_packets_per_msg_r0")), "2"),
        ("datagrams per message (n1 alone sending, in bursts)", format!("{:.3}", g("group_packets_per_msg_r0_one_sender")), "2"),
    ];
    for (what, shoal, amoeba) in rows {
        t.push_str(&format!("| {what} | {shoal} | {amoeba} |\n"));
    }
    t.push_str(&format!(
        "\nFail-over at r = 1 (sequencer SIGKILLed mid-stream): {:.0} ms to the next ordered message (median; max {:.0} ms).\n",
        g("group_failover_ms"),
        g("group_failover_ms_max")
    ));
    let r0 = g("group_r0_us_p50") / rpc;
    let r0_pinned = g("group_r0_us_p50_pinned") / g("null_rpc_rtt_us_p50_pinned");
    let r0_split = g("group_r0_us_p50_split") / g("null_rpc_rtt_us_p50_split");
    let r2 = g("group_r2_us_p50") / g("etcd_put_us_p50");
    let pk = g("group_packets_per_msg_r0");
    let fo = g("group_failover_ms");
    report::targets(
        &mut t,
        &[
            target(
                "group r0 p50 / null RPC p50, pinned",
                format!("{r0_pinned:.3}"),
                "≤ 2",
                r0_pinned <= 2.0,
            ),
            target(
                "same, split",
                format!("{r0_split:.3}"),
                "≤ 2",
                r0_split <= 2.0,
            ),
            target(
                "group r2 p50 / etcd put p50",
                format!("{r2:.3}"),
                "< 1",
                r2 < 1.0,
            ),
            // The paper counts the messages of the protocol proper; status
            // traffic (heartbeats, status requests) may add a little.
            target(
                "datagrams per message, r = 0",
                format!("{pk:.3}"),
                "≤ 2 + 0.5 %",
                pk <= 2.01,
            ),
            target(
                "fail-over, r = 1 (ms)",
                format!("{fo:.3}"),
                "≤ 500",
                fo <= 500.0,
            ),
        ],
    );
    t.push_str(&format!(
        "\nFor information: unpinned, group r0 p50 / null RPC p50 is {r0:.3}. Left to the scheduler,\n\
         the group's threads and the RPC's are placed independently, and the ratio may compare a\n\
         group send with both ends on one CPU against an RPC spread over two (see docs/benchmarks.md).\n"
    ));
    t
}
