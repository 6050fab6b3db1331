//! A local etcd cluster for the benchmarks' baselines; [`Kv`], the client
//! the baselines are measured with (etcd's KV service over gRPC, as its own
//! clients use it); and a minimal HTTP/1.1 client for etcd's JSON gateway
//! (`/v3/kv/...`, `/v3/maintenance/...`), used to start and steer the
//! cluster, and in `shoal bench dir` for a figure beside the gRPC one.
//! The gateway turns each request into a gRPC call to the member itself,
//! so a put through it costs more than one made over gRPC.
//!
//! It needs etcd: Debian's `etcd-server` (etcd 3.4, `/usr/bin/etcd`), or
//! the binary `SHOAL_ETCD` names.  One member runs in each given node's
//! namespace, peers and clients on the nodes' addresses (on loopback
//! clusters: one address, ports apart); data directories on tmpfs
//! (`/dev/shm`) when there is one.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shoal_cluster::Cluster;

mod kv;
pub use kv::Kv;

/// One keep-alive HTTP/1.1 connection.
pub struct Http {
    host: String,
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Http {
    pub fn connect(addr: SocketAddr) -> std::io::Result<Http> {
        let w = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        w.set_nodelay(true)?;
        w.set_read_timeout(Some(Duration::from_secs(10)))?;
        let r = BufReader::new(w.try_clone()?);
        Ok(Http {
            host: addr.to_string(),
            w,
            r,
        })
    }

    /// POSTs `body` (JSON) to `path`; fails unless etcd answers 200.
    pub fn post_ok(&mut self, path: &str, body: &[u8]) -> Result<Vec<u8>, String> {
        let (status, answer) = self.post(path, body)?;
        if status != 200 {
            return Err(format!(
                "etcd {path}: HTTP {status}: {}",
                String::from_utf8_lossy(&answer)
            ));
        }
        Ok(answer)
    }

    /// POSTs `body` (JSON) to `path`; returns the status and the body.
    pub fn post(&mut self, path: &str, body: &[u8]) -> Result<(u16, Vec<u8>), String> {
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        let io = |e: std::io::Error| format!("HTTP {}: {e}", self.host);
        self.w.write_all(&req).map_err(io)?;
        let mut line = String::new();
        self.r.read_line(&mut line).map_err(io)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("HTTP {}: bad status line {line:?}", self.host))?;
        let (mut length, mut chunked) = (None, false);
        loop {
            line.clear();
            if self.r.read_line(&mut line).map_err(io)? == 0 {
                return Err(format!("HTTP {}: connection closed", self.host));
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((name, value)) = l.split_once(':') {
                let value = value.trim();
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.parse::<usize>().ok();
                } else if name.eq_ignore_ascii_case("transfer-encoding") {
                    chunked = value.eq_ignore_ascii_case("chunked");
                }
            }
        }
        let mut out = Vec::new();
        if chunked {
            loop {
                line.clear();
                self.r.read_line(&mut line).map_err(io)?;
                let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                    .map_err(|_| format!("HTTP {}: bad chunk size {line:?}", self.host))?;
                if size == 0 {
                    // Trailers, then the empty line.
                    loop {
                        line.clear();
                        if self.r.read_line(&mut line).map_err(io)? == 0
                            || line.trim_end().is_empty()
                        {
                            break;
                        }
                    }
                    break;
                }
                let at = out.len();
                out.resize(at + size + 2, 0);
                self.r.read_exact(&mut out[at..]).map_err(io)?;
                out.truncate(at + size);
            }
        } else if let Some(n) = length {
            out.resize(n, 0);
            self.r.read_exact(&mut out).map_err(io)?;
        }
        Ok((status, out))
    }
}

pub fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(c.get(1).copied().unwrap_or(0)) << 8)
            | u32::from(c.get(2).copied().unwrap_or(0));
        out.push(A[(n >> 18) as usize & 63] as char);
        out.push(A[(n >> 12) as usize & 63] as char);
        out.push(if c.len() > 1 {
            A[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if c.len() > 2 {
            A[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

/// Where etcd member `i` (0-based) listens: (ip, client port, peer port).
fn etcd_addrs(cluster: &Cluster, node: &str, i: usize) -> Result<(IpAddr, u16, u16), String> {
    let entry = cluster.node(node)?;
    Ok(match entry.netns {
        Some(_) => (entry.addr.ip(), 2379, 2380),
        None => {
            // Loopback: one address, ports apart.
            let base = 24_000 + u16::from(cluster.file().subnet) * 10 + 2 * i as u16;
            (IpAddr::V4(Ipv4Addr::LOCALHOST), base, base + 1)
        }
    })
}

/// An etcd cluster, one member in each given node's namespace, stopped
/// (and its data removed) when dropped.
pub struct Etcd {
    children: Vec<Child>,
    /// Each member's client address, in the order of the nodes.
    pub clients: Vec<SocketAddr>,
    nodes: Vec<String>,
    dir: PathBuf,
}

/// The etcd binary: `SHOAL_ETCD`, else `etcd` on the PATH or in /usr/bin
/// (installed from Debian's `etcd-server` if missing and run as root).
pub fn find_etcd() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("SHOAL_ETCD").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "SHOAL_ETCD names {}, which is not a file",
                path.display()
            ))
        };
    }
    crate::peers::ensure(
        &[("etcd", "etcd-server")],
        "the benchmark measures an etcd cluster beside shoal",
    )?;
    crate::peers::find("etcd").ok_or_else(|| "etcd not found".into())
}

impl Etcd {
    /// A member on each of `nodes`, ready and led from `nodes[leader]`
    /// (where the benchmark's shoal service has its sequencer);
    /// `etcd_leader_on_NODE` in `metrics` says whether the leadership
    /// moved there.
    pub(crate) fn start_led_from(
        cluster: &Cluster,
        etcd: &Path,
        (nodes, leader): (&[&str], usize),
        metrics: &mut std::collections::BTreeMap<String, f64>,
    ) -> Result<Etcd, String> {
        eprintln!(
            "bench: starting etcd (members on {}, data on tmpfs)",
            nodes.join(", ")
        );
        let mut etcd = Etcd::start(cluster, etcd, nodes)?;
        etcd.wait_ready()?;
        let led = etcd.move_leader(leader)?;
        eprintln!("bench: etcd leader on {led}");
        let wanted = nodes[leader];
        let moved = if led == wanted { 1.0 } else { 0.0 };
        metrics.insert(format!("etcd_leader_on_{wanted}"), moved);
        Ok(etcd)
    }

    /// Starts one member on each of `nodes` (data on tmpfs when there is
    /// one); see [`Etcd::wait_ready`].
    pub fn start(cluster: &Cluster, etcd: &Path, nodes: &[&str]) -> Result<Etcd, String> {
        // tmpfs when there is one: fsync then costs next to nothing, so the
        // comparison is between protocols, not disks (shoal's groups keep
        // messages in memory only).
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("shoal-bench-etcd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut me = Etcd {
            children: Vec::new(),
            clients: Vec::new(),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            dir,
        };
        let mut peers = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let (ip, client, peer) = etcd_addrs(cluster, node, i)?;
            peers.push(format!("{node}=http://{ip}:{peer}"));
            me.clients.push(SocketAddr::new(ip, client));
        }
        let initial = peers.join(",");
        for (i, node) in nodes.iter().enumerate() {
            let (ip, client, peer) = etcd_addrs(cluster, node, i)?;
            let log_path = me.dir.join(format!("{node}.log"));
            let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
            let log2 = log.try_clone().map_err(|e| e.to_string())?;
            let child = cluster
                .command(node, etcd)?
                .arg(format!("--name={node}"))
                .arg(format!("--data-dir={}", me.dir.join(node).display()))
                .arg(format!("--listen-peer-urls=http://{ip}:{peer}"))
                .arg(format!("--initial-advertise-peer-urls=http://{ip}:{peer}"))
                .arg(format!("--listen-client-urls=http://{ip}:{client}"))
                .arg(format!("--advertise-client-urls=http://{ip}:{client}"))
                .arg(format!("--initial-cluster={initial}"))
                .arg("--initial-cluster-state=new")
                .arg(format!(
                    "--initial-cluster-token=shoal-bench-{}",
                    std::process::id()
                ))
                .arg("--logger=zap")
                .arg("--log-level=warn")
                .stdin(Stdio::null())
                .stdout(Stdio::from(log))
                .stderr(Stdio::from(log2))
                .spawn()
                .map_err(|e| format!("cannot start etcd on {node}: {e}"))?;
            me.children.push(child);
        }
        Ok(me)
    }

    /// The last lines of every member's log, for an error message.
    fn logs(&self) -> String {
        let mut s = String::new();
        for node in &self.nodes {
            let text =
                std::fs::read_to_string(self.dir.join(format!("{node}.log"))).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(3).collect();
            for l in tail.into_iter().rev() {
                s.push_str(&format!("\n  {node}: {l}"));
            }
        }
        s
    }

    /// Waits until a put through n1 succeeds.
    pub fn wait_ready(&mut self) -> Result<(), String> {
        let until = Instant::now() + Duration::from_secs(30);
        let body =
            json!({ "key": base64(b"shoal-bench/ready"), "value": base64(b"1") }).to_string();
        let mut last = String::new();
        while Instant::now() < until {
            for (i, c) in self.children.iter_mut().enumerate() {
                if let Ok(Some(status)) = c.try_wait() {
                    return Err(format!(
                        "etcd on {} exited ({status}):{}",
                        self.nodes[i],
                        self.logs()
                    ));
                }
            }
            match Http::connect(self.clients[0]).map_err(|e| e.to_string()) {
                Ok(mut h) => match h.post("/v3/kv/put", body.as_bytes()) {
                    Ok((200, _)) => return Ok(()),
                    Ok((status, b)) => {
                        last = format!("HTTP {status}: {}", String::from_utf8_lossy(&b))
                    }
                    Err(e) => last = e,
                },
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "etcd did not accept a put within 30 s ({last}):{}",
            self.logs()
        ))
    }

    /// Each member's (id, leader id), from `/v3/maintenance/status`.
    fn status(&self, i: usize) -> Result<(String, String), String> {
        let mut h = Http::connect(self.clients[i]).map_err(|e| e.to_string())?;
        let (code, body) = h.post("/v3/maintenance/status", b"{}")?;
        if code != 200 {
            return Err(format!("etcd status: HTTP {code}"));
        }
        let v: Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        let text = |v: &Value| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        let header = &v["header"];
        let id = text(&header["member_id"])
            .or_else(|| text(&header["memberId"]))
            .ok_or("etcd status: no member id")?;
        let leader = text(&v["leader"]).ok_or("etcd status: no leader")?;
        Ok((id, leader))
    }

    /// Moves the Raft leadership to member `to`; returns the node that
    /// leads afterwards.
    pub fn move_leader(&self, to: usize) -> Result<String, String> {
        let ids: Vec<String> = (0..self.nodes.len())
            .map(|i| self.status(i).map(|s| s.0))
            .collect::<Result<_, _>>()?;
        for _ in 0..50 {
            let leader = self.status(to)?.1;
            if leader == ids[to] {
                return Ok(self.nodes[to].clone());
            }
            if let Some(from) = ids.iter().position(|id| *id == leader) {
                let mut h = Http::connect(self.clients[from]).map_err(|e| e.to_string())?;
                let body = json!({ "targetID": ids[to] }).to_string();
                let _ = h.post("/v3/maintenance/transfer-leadership", body.as_bytes())?;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let leader = self.status(to)?.1;
        Ok(ids
            .iter()
            .position(|id| *id == leader)
            .map_or("unknown".into(), |i| self.nodes[i].clone()))
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for c in &mut self.children {
            // SAFETY: kill(2) of our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
        let until = Instant::now() + Duration::from_secs(5);
        for c in &mut self.children {
            loop {
                match c.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < until => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => {
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
