//! The half of `shoal bench dir` that runs on the nodes: the measuring
//! clients, commanded line by line by the driver (`super`).

use super::*;

/// Runs the agent.
pub fn agent(command: AgentCommand) -> Result<(), String> {
    match command {
        AgentCommand::Client => client_agent(),
        AgentCommand::Twopc {
            replica,
            service,
            data,
        } => twopc_agent(replica, service, data),
    }
}

/// Runs replica `replica` of the two-phase-commit baseline until SIGTERM
/// or SIGINT, then stops it in order.
fn twopc_agent(replica: usize, service: String, data: PathBuf) -> Result<(), String> {
    // SAFETY: a signal set on the stack, filled by sigemptyset/sigaddset
    // before use; blocked here, before any thread starts, so every thread
    // the replica starts inherits the mask and the signal waits for
    // `sigwait` below.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SHOAL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let ctx = Context::from_env().map_err(|e| e.to_string())?;
    let mut cfg = twopc::TwoPcConfig::new(replica, data);
    cfg.service = service;
    let r = twopc::TwoPc::start(ctx, cfg).map_err(|e| e.to_string())?;
    eprintln!(
        "directory replica {replica} of 2 serving {} (rpc2pc: two-phase commit, intentions on disk)",
        r.port()
    );
    let mut sig = 0;
    // SAFETY: `set` is initialised above and `sig` is a valid out-pointer.
    unsafe { libc::sigwait(&set, &mut sig) };
    r.stop();
    Ok(())
}

/// The replica every measuring client is first located at: not the
/// group's sequencer (its creator, replica 0); for rpc2pc, the initiator
/// asks replica 0.  The latency session then follows the service's advice
/// to the replica that orders writes, as a `DirClient` does.
pub(super) const AIM: usize = 1;

/// One service the agent uses: its port, a session located at replica
/// [`AIM`] and aimed where the service orders writes, a directory of its
/// own.
pub(super) struct Opened {
    port: PutPort,
    service: String,
    session: Aimed,
    dir: Capability,
}

/// A client session located at one replica: what [`DirClient`] does
/// (session id, request numbers, read-your-writes), without moving to
/// another replica.
pub(super) struct Aimed {
    rpc: shoal_rpc::Client,
    port: PutPort,
    id: u64,
    seq: u64,
    seen: u64,
}

impl Aimed {
    fn new(ctx: &Context, port: PutPort, service: &str, replica: usize) -> Result<Aimed, String> {
        let (rpc, ..) = aimed_client(ctx, port, service, Some(replica))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        Ok(Aimed {
            rpc,
            port,
            id: (nanos ^ (u64::from(std::process::id()) << 40)) | 1,
            seq: 0,
            seen: 0,
        })
    }

    fn call(&mut self, op: Op) -> Result<Answer, String> {
        let what = op.name();
        if op.is_write() {
            self.seq += 1;
        }
        let body = Request {
            client: self.id,
            seq: self.seq,
            min_index: self.seen,
            flags: 0,
            op,
        }
        .encode();
        let reply = self
            .rpc
            .trans(&self.port, body)
            .map_err(|e| format!("{what}: {e}"))?;
        let r = Response::decode(&reply).map_err(|e| format!("{what}: {e}"))?;
        self.seen = self.seen.max(r.index);
        r.result.map_err(|e| format!("{what}: {e}"))
    }
}

pub(super) struct ClientAgent {
    ctx: Context,
    services: HashMap<String, Opened>,
    /// Names made so far (every appended name is new).
    made: u64,
}

pub(super) fn masks() -> Vec<shoal_cap::Rights> {
    shoal_dir::model::default_masks(3)
}

/// Enter `name` in `dir` (holding `dir` itself).
pub(super) fn append(dir: Capability, name: &str) -> Op {
    Op::Append {
        dir,
        name: name.as_bytes().to_vec(),
        caps: vec![dir],
        masks: masks(),
    }
}

/// The client agent's command loop.  Commands (one line each):
///
/// ```text
/// open LABEL SERVICE          → {"dir": CAP}  a client and a new directory
///                               (holding the name "target")
/// status SERVICE N            → {"replicas": [status or null; N]} (peer ports)
/// latency N WARMUP LABELS LOOKUP ETCD
///                             → {metric: value}: append-delete on each of
///                               LABELS (comma-separated), lookups on LOOKUP
///                               (or -), etcd put-delete at ETCD (ip:port, or -)
///                               over gRPC and through its JSON gateway
/// tmp LABEL K                 → {"pairs": K, "ms": M}: K append-delete pairs
/// lookups LABEL THREADS MS    → {"per_s", "p50_us", "replica", ...}
/// updates LABEL THREADS MS    → {"per_s", "writes", "secs"}
/// ```
///
/// A failed command answers `{"error": "..."}`.
pub(super) fn client_agent() -> Result<(), String> {
    let ctx = Context::from_env().map_err(|e| e.to_string())?;
    let mut agent = ClientAgent {
        ctx,
        services: HashMap::new(),
        made: 0,
    };
    crate::agent::serve_commands(|words| agent.command(words));
    Ok(())
}

impl ClientAgent {
    fn command(&mut self, words: &[&str]) -> Result<Value, String> {
        let arg = |i: usize| crate::agent::arg(words, i);
        let num = |i: usize| crate::agent::num(words, i);
        match words[0] {
            "open" => self.open(arg(1)?, arg(2)?),
            "status" => {
                let list = replica_status(&self.ctx, arg(1)?, num(2)?)?;
                Ok(json!({ "replicas": list }))
            }
            "latency" => self.latency(num(1)?, num(2)?, arg(3)?, arg(4)?, arg(5)?),
            "tmp" => self.tmp(arg(1)?, num(2)?),
            "lookups" => self.lookups(arg(1)?, num(2)?, num(3)? as u64),
            "updates" => self.updates(arg(1)?, num(2)?, num(3)? as u64),
            other => Err(format!("unknown command {other}")),
        }
    }

    fn service(&mut self, label: &str) -> Result<&mut Opened, String> {
        self.services
            .get_mut(label)
            .ok_or_else(|| format!("no service {label} opened"))
    }

    fn open(&mut self, label: &str, service: &str) -> Result<Value, String> {
        let port = shoal_dirsvc::service_port(&self.ctx.config().cluster, service).put_port();
        let mut session = Aimed::new(&self.ctx, port, service, AIM)?;
        // A group replica learns where writes go from its peers within a
        // second of joining; rpc2pc replicas never say.
        for _ in 0..30 {
            if shoal_dirsvc::writes_at::follow(&mut session.rpc, &port).is_some()
                || !label.starts_with("group")
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let dir = match session.call(Op::CreateDir {
            columns: vec![b"owner".to_vec(), b"group".to_vec(), b"other".to_vec()],
            secret: [0; 32],
        })? {
            Answer::Cap(c) => c,
            a => return Err(format!("{service}: create-dir answered {a:?}")),
        };
        session.call(append(dir, "target"))?;
        self.services.insert(
            label.into(),
            Opened {
                port,
                service: service.into(),
                session,
                dir,
            },
        );
        Ok(json!({ "dir": dir.to_string() }))
    }

    /// One append-delete pair of a new name.
    fn pair(&mut self, label: &str) -> Result<(), String> {
        self.made += 1;
        let name = format!("tmp{}", self.made);
        let s = self.service(label)?;
        let dir = s.dir;
        s.session.call(append(dir, &name))?;
        s.session.call(Op::Delete {
            dir,
            name: name.into_bytes(),
        })?;
        Ok(())
    }

    /// Latency of every kind, sampled in interleaved rounds (round 0 is
    /// the warm-up) so that drift in the machine's state weighs on all
    /// alike; each kind's turn starts with a few untimed operations.
    fn latency(
        &mut self,
        n: usize,
        warmup: usize,
        labels: &str,
        lookup: &str,
        etcd: &str,
    ) -> Result<Value, String> {
        enum Kind {
            Pair(String),
            Lookup(String),
            Etcd(Box<Kv>),
            Gateway(Box<Http>),
        }
        let mut kinds: Vec<(String, Kind)> = labels
            .split(',')
            .filter(|l| !l.is_empty())
            .map(|l| (format!("dir_append_delete_us_{l}"), Kind::Pair(l.into())))
            .collect();
        if lookup != "-" {
            kinds.push(("dir_lookup_us".into(), Kind::Lookup(lookup.into())));
        }
        if etcd != "-" {
            let addr: SocketAddr = etcd.parse().map_err(|e| format!("etcd address: {e}"))?;
            let kv = Kv::connect(addr)?;
            kinds.push(("etcd_put_delete_us".into(), Kind::Etcd(Box::new(kv))));
            // For information: the same through etcd's JSON gateway.
            let http = Http::connect(addr).map_err(|e| format!("etcd at {addr}: {e}"))?;
            kinds.push((
                "etcd_gateway_put_delete_us".into(),
                Kind::Gateway(Box::new(http)),
            ));
        }
        const KEY: &[u8] = b"shoal-bench/dir/tmp";
        const VALUE: [u8; 48] = [0x5a; 48];
        let put = json!({ "key": base64(KEY), "value": base64(&VALUE) }).to_string();
        let delete = json!({ "key": base64(KEY) }).to_string();
        let mut samples: Vec<Vec<Duration>> = kinds.iter().map(|_| Vec::with_capacity(n)).collect();
        const ROUNDS: usize = 10;
        // Each kind's turn in a round starts with a few untimed operations:
        // its processes have idled while the other kinds ran (the disk-bound
        // kinds for hundreds of milliseconds).
        const REWARM: usize = 10;
        const SETTLE: Duration = Duration::from_millis(50);
        for round in 0..=ROUNDS {
            let timed = if round > 0 { n / ROUNDS } else { 0 };
            let untimed = if round > 0 { REWARM } else { warmup };
            for ((_, kind), out) in kinds.iter_mut().zip(samples.iter_mut()) {
                // Let the previous turn's after-work settle (post-reply
                // fsyncs, the file system's journal commits).
                std::thread::sleep(SETTLE);
                for i in 0..untimed + timed {
                    let keep = i >= untimed;
                    let start = Instant::now();
                    match kind {
                        Kind::Pair(label) => {
                            let label = label.clone();
                            self.pair(&label)?;
                        }
                        Kind::Lookup(label) => {
                            let s = self.service(label)?;
                            let dir = s.dir;
                            s.session.call(Op::Lookup {
                                dir,
                                name: b"target".to_vec(),
                            })?;
                        }
                        Kind::Etcd(kv) => {
                            kv.put(KEY, &VALUE)?;
                            if kv.delete(KEY)? != 1 {
                                return Err("etcd: the key put was not there to delete".into());
                            }
                        }
                        Kind::Gateway(http) => {
                            for (path, body) in
                                [("/v3/kv/put", &put), ("/v3/kv/deleterange", &delete)]
                            {
                                http.post_ok(path, body.as_bytes())?;
                            }
                        }
                    }
                    if keep {
                        out.push(start.elapsed());
                    }
                }
            }
        }
        let mut out = serde_json::Map::new();
        for ((name, _), mut s) in kinds.iter().zip(samples) {
            let p50 = percentile_us(&mut s, 50);
            let p99 = percentile_us(&mut s, 99);
            // The paper's figures: the append-delete and etcd keys name the
            // median itself.
            if name == "dir_lookup_us" {
                out.insert(format!("{name}_p50"), json!(p50));
            } else {
                out.insert(name.clone(), json!(p50));
            }
            out.insert(format!("{name}_p99"), json!(p99));
        }
        Ok(Value::Object(out))
    }

    /// `k` append-delete pairs, back to back.
    fn tmp(&mut self, label: &str, k: usize) -> Result<Value, String> {
        let start = Instant::now();
        for _ in 0..k {
            self.pair(label)?;
        }
        Ok(json!({ "pairs": k, "ms": start.elapsed().as_secs_f64() * 1e3 }))
    }

    /// `threads` threads look the name "target" up for `ms`, all at one
    /// replica.
    fn lookups(&mut self, label: &str, threads: usize, ms: u64) -> Result<Value, String> {
        let (port, service, dir) = {
            let s = self.service(label)?;
            (s.port, s.service.clone(), s.dir)
        };
        let replica = AIM;
        let mut clients = Vec::new();
        let mut relocations = 0;
        for _ in 0..threads.max(1) {
            let (c, _, r) = aimed_client(&self.ctx, port, &service, Some(replica))?;
            relocations += r;
            clients.push(c);
        }
        let body = Bytes::from(
            Request {
                client: 0,
                seq: 0,
                min_index: 0,
                flags: 0,
                op: Op::Lookup {
                    dir,
                    name: b"target".to_vec(),
                },
            }
            .encode(),
        );
        let start = Instant::now();
        let until = start + Duration::from_millis(ms);
        let results = on_threads(clients, |mut c| {
            let mut lat = Vec::with_capacity(1 << 16);
            while Instant::now() < until {
                let t = Instant::now();
                let reply = c.trans(&port, body.clone()).map_err(|e| e.to_string())?;
                lat.push(t.elapsed());
                match Response::decode(&reply) {
                    Ok(Response {
                        result: Ok(Answer::Caps(_)),
                        ..
                    }) => {}
                    other => return Err(format!("lookup: {other:?}")),
                }
            }
            Ok(lat)
        })?;
        let secs = start.elapsed().as_secs_f64();
        let mut all: Vec<Duration> = results.into_iter().flatten().collect();
        let count = all.len();
        Ok(json!({
            "per_s": count as f64 / secs,
            "lookups": count,
            "secs": secs,
            "p50_us": percentile_us(&mut all, 50),
            "p99_us": percentile_us(&mut all, 99),
            "replica": replica,
            "threads": threads.max(1),
            "relocations": relocations,
        }))
    }

    /// `threads` threads, each with its own client, append and delete new
    /// names for `ms`.
    fn updates(&mut self, label: &str, threads: usize, ms: u64) -> Result<Value, String> {
        let (port, dir) = {
            let s = self.service(label)?;
            (s.port, s.dir)
        };
        let start = Instant::now();
        let until = start + Duration::from_millis(ms);
        let ctx = &self.ctx;
        let results = on_threads((0..threads.max(1)).collect(), |t| {
            let mut c = DirClient::with_port(ctx, port).map_err(|e| e.to_string())?;
            let mut writes = 0u64;
            while Instant::now() < until {
                let name = format!("u{t}-{writes}");
                c.append(&dir, &name, &[dir], Some(&masks()))
                    .and_then(|()| c.delete(&dir, &name))
                    .map_err(|e| format!("update: {e}"))?;
                writes += 2;
            }
            Ok(writes)
        })?;
        let secs = start.elapsed().as_secs_f64();
        let writes: u64 = results.into_iter().sum();
        Ok(json!({ "per_s": writes as f64 / secs, "writes": writes, "secs": secs }))
    }
}

/// Runs `work` on each of `items`, every one on a thread of its own, and
/// returns what they made, or the first error in the order of `items`.
fn on_threads<I: Send, T: Send>(
    items: Vec<I>,
    work: impl Fn(I) -> Result<T, String> + Sync,
) -> Result<Vec<T>, String> {
    std::thread::scope(|sc| {
        let work = &work;
        let handles: Vec<_> = items
            .into_iter()
            .map(|item| sc.spawn(move || work(item)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    })
}

/// An RPC client located at one replica of `service` (whose port is
/// `port`; any replica, with `None`): it asks for the status of whichever
/// replica it reached and tries again until that is `want`.  Returns the
/// client, the replica and how many times it tried again.
///
/// A locate returns the answer of the first node that names a server, so
/// locating again reaches the wanted replica only as often as its node
/// answers first: the client is aimed at it instead, where the replicas'
/// statuses say where it serves (a group-variant replica does), and
/// locates again otherwise.
pub(super) fn aimed_client(
    ctx: &Context,
    port: PutPort,
    service: &str,
    want: Option<usize>,
) -> Result<(shoal_rpc::Client, usize, u64), String> {
    let mut c = ctx.client().map_err(|e| e.to_string())?;
    let status = Request::status().encode();
    // Where the wanted replica serves, asked at the first miss and again
    // every tenth (it serves anew after its group re-forms, and a status
    // may not have answered).
    let mut endpoint = None;
    for again in 0..500 {
        let reply = c
            .trans(&port, status.clone())
            .map_err(|e| format!("status: {e}"))?;
        let replica = match Response::decode(&reply) {
            Ok(Response {
                result: Ok(Answer::Status(s)),
                ..
            }) => serde_json::from_str::<Value>(&s)
                .ok()
                .and_then(|v| v["replica"].as_u64())
                .ok_or("status without a replica number")?,
            other => return Err(format!("status: {other:?}")),
        } as usize;
        let Some(want) = want.filter(|&w| w != replica) else {
            return Ok((c, replica, again));
        };
        if again.is_multiple_of(10) {
            endpoint = None;
        }
        match *endpoint.get_or_insert_with(|| endpoint_of(ctx, service, want)) {
            Some((node, instance)) => c.aim(&port, node, instance),
            None => c.forget(&port),
        }
    }
    Err(format!(
        "could not reach replica {want:?} of the service in 500 tries"
    ))
}

/// Where replica `replica` of `service` serves clients (its node and its
/// server's instance), as its status says; `None` if it does not say.
fn endpoint_of(
    ctx: &Context,
    service: &str,
    replica: usize,
) -> Option<(shoal_wire::NodeId, shoal_wire::Instance)> {
    let mut c = ctx.client().ok()?;
    let status = peer_status(&mut c, &ctx.config().cluster, service, replica);
    let endpoint = &status["endpoint"];
    let hex = |k: &str| u64::from_str_radix(endpoint[k].as_str()?, 16).ok();
    Some((
        shoal_wire::NodeId(hex("node")?),
        shoal_wire::Instance(hex("instance")?),
    ))
}

/// The status of each of the `n` replicas of `service`, from their peer
/// ports (`null` where one does not answer three times in a row).
pub(crate) fn replica_status(ctx: &Context, service: &str, n: usize) -> Result<Vec<Value>, String> {
    let mut c = ctx.client().map_err(|e| e.to_string())?;
    let cluster = &ctx.config().cluster;
    Ok((0..n)
        .map(|i| peer_status(&mut c, cluster, service, i))
        .collect())
}

/// The status of replica `replica` of `service`, from its peer port
/// (`null` if it does not answer three times in a row).
fn peer_status(
    c: &mut shoal_rpc::Client,
    cluster: &[u8; 16],
    service: &str,
    replica: usize,
) -> Value {
    let opts = shoal_rpc::CallOptions {
        deadline: Some(Duration::from_secs(1)),
        cancel: None,
    };
    let port = shoal_dirsvc::peer_port(cluster, service, replica).put_port();
    for _ in 0..3 {
        match c.trans_with(&port, Vec::new(), &opts) {
            Ok(b) => return serde_json::from_slice(&b).unwrap_or(Value::Null),
            Err(_) => c.forget(&port),
        }
    }
    Value::Null
}
