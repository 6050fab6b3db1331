//! The driver's side of the benchmark agents: a temporary cluster that
//! goes down when dropped, and an agent process on a node, commanded line
//! by line over its standard input, answering one JSON line each.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use shoal_cluster::{Cluster, Mode, Spec};

/// How long the driver waits for an agent's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(300);

/// Prints one answer line on standard output (the agent's side).
pub fn say(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// An agent's main loop: one command per line of standard input (words
/// separated by blanks), one JSON answer per line of standard output
/// (`{"error": "..."}` for a command that failed), until the input ends.
pub fn serve_commands(mut command: impl FnMut(&[&str]) -> Result<Value, String>) {
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.is_empty() {
            continue;
        }
        let answer = command(&words).unwrap_or_else(|e| serde_json::json!({ "error": e }));
        say(&answer);
    }
}

/// Argument `i` of an agent command (`words[0]` is the command).
pub fn arg<'a>(words: &[&'a str], i: usize) -> Result<&'a str, String> {
    words
        .get(i)
        .copied()
        .ok_or_else(|| format!("{}: missing argument {i}", words[0]))
}

/// Argument `i` of an agent command, as a number.
pub fn num(words: &[&str], i: usize) -> Result<usize, String> {
    arg(words, i)?
        .parse()
        .map_err(|e| format!("{}: {e}", words[0]))
}

/// The lines a child writes to `out`, as they come, on a channel.
pub fn lines_of(out: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

/// A cluster that goes down when dropped, if this run started it.
pub struct ClusterGuard {
    pub cluster: Option<Cluster>,
    pub temporary: bool,
}

impl ClusterGuard {
    /// The cluster in `dir` if one is given (left running afterwards),
    /// else a new temporary one for benchmark `bench`: `nodes` nodes named
    /// `name`, on subnet `subnet`, in network namespaces as root.
    pub fn open_or_start(
        dir: Option<&Path>,
        bench: &str,
        (nodes, name, subnet): (usize, &str, u8),
        shoal: &Path,
    ) -> Result<ClusterGuard, String> {
        if let Some(dir) = dir {
            return Ok(ClusterGuard {
                cluster: Some(Cluster::open(dir)?),
                temporary: false,
            });
        }
        let dir = std::env::temp_dir().join(format!("shoal-bench-{bench}-{}", std::process::id()));
        let mode = if shoal_cluster::is_root() {
            Mode::Netns
        } else {
            Mode::Loopback
        };
        eprintln!(
            "bench: starting a {nodes}-node {mode:?} cluster in {}",
            dir.display()
        );
        let spec = Spec {
            dir,
            nodes,
            name: name.into(),
            subnet,
            mode,
            shoal: shoal.to_path_buf(),
        };
        Ok(ClusterGuard {
            cluster: Some(Cluster::up(&spec, &mut |l| eprintln!("  {l}"))?),
            temporary: true,
        })
    }

    /// The cluster (until the guard drops).
    pub fn cluster(&self) -> &Cluster {
        self.cluster
            .as_ref()
            .expect("a guard holds its cluster until dropped")
    }
}

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        if let Some(c) = self.cluster.take()
            && self.temporary
        {
            eprintln!("bench: stopping the cluster");
            if let Err(e) = c.down(&mut |_| {}) {
                eprintln!("bench: {e}");
            }
        }
    }
}

/// An agent on one node, driven line by line; closing its standard input
/// makes it finish and exit (killed if it has not within a few seconds).
pub struct Agent {
    pub node: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Agent {
    /// Starts `shoal-bench agent ARGS` on `node`.
    pub fn start(cluster: &Cluster, node: &str, args: &[&str]) -> Result<Agent, String> {
        Agent::start_with_env(cluster, node, args, &[])
    }

    /// Starts `shoal-bench agent ARGS` on `node` with `env` added to its
    /// environment.
    pub fn start_with_env(
        cluster: &Cluster,
        node: &str,
        args: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Result<Agent, String> {
        let mut child = cluster
            .command(node, &crate::bench_exe()?)?
            .arg("agent")
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start the agent on {node}: {e}"))?;
        let lines = lines_of(child.stdout.take().expect("piped"));
        Ok(Agent {
            node: node.to_string(),
            stdin: child.stdin.take(),
            child,
            lines,
        })
    }

    pub fn write(&mut self, line: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().expect("open until drop");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("the agent on {} is gone ({e})", self.node))
    }

    pub fn answer(&mut self) -> Result<Value, String> {
        let line = match self.lines.recv_timeout(ANSWER_TIMEOUT) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return Err(format!(
                    "the agent on {} did not answer within {ANSWER_TIMEOUT:?}",
                    self.node
                ));
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(format!(
                    "the agent on {} exited (see its error above)",
                    self.node
                ));
            }
        };
        let v: Value = serde_json::from_str(&line)
            .map_err(|e| format!("agent on {}: {e}: {line:?}", self.node))?;
        match v.get("error").and_then(Value::as_str) {
            Some(e) => Err(format!("agent on {}: {e}", self.node)),
            None => Ok(v),
        }
    }

    pub fn call(&mut self, line: &str) -> Result<Value, String> {
        self.write(line)?;
        self.answer()
    }

    pub fn kill(&mut self) {
        // SAFETY: kill(2) of our own child (ip netns exec execs the agent).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    self.kill();
                    return;
                }
            }
        }
    }
}
