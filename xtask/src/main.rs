//! `cargo xtask demo` and `cargo xtask test`: the two commands of the
//! README.  Each first installs what it needs from Debian's packages (when
//! run as root on a machine that lacks them), so both work on a fresh
//! Debian machine that has only the Rust toolchain.

mod bench;
mod dist;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo(),
        Some("test") => test(&args[1..]),
        Some("sim") => sim(&args[1..]),
        Some("bench") => bench::bench(&args[1..]),
        Some("dist") => dist::dist().map(|_| ()),
        Some("fuzz") => match args.get(1).map(|s| s.parse::<u64>()) {
            None => fuzz(60),
            Some(Ok(seconds)) => fuzz(seconds),
            Some(Err(_)) => Err(format!("fuzz takes a number of seconds\n\n{USAGE}")),
        },
        Some("-h" | "--help") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown task {other:?}\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  demo     build shoal, start the whole system on 4 local nodes with one
           `shoal cluster up`, show RPC with a moving server and a
           crashing node, a process group that loses its sequencer, the
           directory and file services through crashes of their servers
           (restarted by the node daemons), the pool and shoal make, tear
           it down
  dist     the Debian packages shoal and shoal-bench (systemd unit and
           default configuration included) in target/dist/
  test     install what the tests need, then run the whole suite:
           format and lint checks, unit, property and simulation tests,
           real-cluster integration tests, and short fuzz runs
           (--quick: skip the fuzz runs and use fewer simulation seeds)
  sim [--seeds N] [--scenario NAME]
           the simulator alone, over N seeds per scenario (default
           20000): the nightly-size run of what `test` runs with 2000;
           NAME filters scenarios (e.g. group_ or promises_)
  fuzz [SECONDS]
           build the fuzz targets (fuzz/, stable Rust, no cargo-fuzz
           needed) and run each for SECONDS (default 60; 0: build only)
  bench [--quick] [--json PATH]
           every benchmark in turn (rpc, group, dir, file, exec), each
           beside its baselines, into one JSON (default target/bench.json);
           as root it installs the peers they compare against";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn step(what: &str) {
    println!("\n==> {what}");
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .current_dir(root())
        .status()
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed ({status})"))
    }
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Installs missing Debian packages: `(program, package)` pairs.
fn ensure_packages(needed: &[(&str, &str)]) -> Result<(), String> {
    let missing: Vec<&str> = needed
        .iter()
        .filter(|(program, _)| !have(program))
        .map(|(_, package)| *package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        return Err(format!(
            "missing packages {}: install them (apt-get install {}) or run as root",
            missing.join(", "),
            missing.join(" ")
        ));
    }
    step(&format!("installing {}", missing.join(" ")));
    run(Command::new("apt-get").args(["update", "-q"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

const SYSTEM: &[(&str, &str)] = &[("ip", "iproute2"), ("iptables", "iptables")];
/// What `shoal make` drives: GNU make and a C compiler.
const BUILD: &[(&str, &str)] = &[("make", "make"), ("cc", "gcc")];

fn shoal_bin() -> PathBuf {
    root().join("target/release/shoal")
}

/// `shoal SUBCOMMAND ACTION --dir DIR REST...`: the directory goes before
/// anything that might follow a `--`.
fn shoal(args: &[&str], dir: &Path) -> Command {
    let mut c = Command::new(shoal_bin());
    let (head, rest) = args.split_at(args.len().min(2));
    c.args(head).arg("--dir").arg(dir).args(rest);
    c
}

fn demo() -> Result<(), String> {
    // The system's tools, and the pool's parallel build.
    ensure_packages(&[SYSTEM, BUILD].concat())?;
    step("building shoal and shoal-bench (release)");
    run(cargo().args(["build", "--release", "-p", "shoal", "-p", "shoal-bench"]))?;
    let dir = root().join("target/demo-cluster");
    if dir.join("cluster.toml").exists() {
        let _ = run(&mut shoal(&["cluster", "down"], &dir));
    }
    step(
        "starting a 4-node cluster with one command: nodes, a directory service, file servers, a root",
    );
    run(&mut shoal(
        &[
            "cluster", "up", "--nodes", "4", "--name", "demo", "--subnet", "7",
        ],
        &dir,
    ))?;
    let result = demo_steps(&dir);
    step("tearing the cluster down");
    let down = run(&mut shoal(&["cluster", "down"], &dir));
    result.and(down)?;
    println!("\ndemo finished: every step behaved as expected");
    Ok(())
}

fn demo_steps(dir: &Path) -> Result<(), String> {
    run(&mut shoal(&["cluster", "status"], dir))?;
    step("the services the node daemons keep");
    run(&mut shoal(&["service", "ls", "--all"], dir))?;
    let out = Command::new(shoal_bin())
        .args(["rpc", "new-port"])
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|s| s.trim().to_string())
            .ok_or(format!("no {name} in {text:?}"))
    };
    let (get, put) = (field("get-port")?, field("put-port")?);
    println!("a service port: put-port {put} (its get-port stays secret)");

    step("serving an echo on n2, calling it from n4");
    let mut server = serve_echo(dir, "n2", &get)?;
    let call = |from: &str, data: &str| {
        run(&mut shoal(
            &[
                "cluster",
                "exec",
                "--node",
                from,
                "--",
                shoal_bin().to_str().unwrap(),
                "rpc",
                "call",
                &put,
                "--data",
                data,
            ],
            dir,
        ))
    };
    call("n4", "hello from n4")?;

    step("moving the server to n3 (stop on n2, start on n3); n4 calls again, unchanged");
    stop(&mut server);
    let mut server = serve_echo(dir, "n3", &get)?;
    call("n4", "hello again, wherever you are")?;

    step(
        "killing node n1 (and so its services) with SIGKILL: status reports it unreachable, the rest carry on",
    );
    run(&mut shoal(&["cluster", "kill", "n1"], dir))?;
    let status = shoal(&["cluster", "status", "--deadline-ms", "1000"], dir)
        .status()
        .map_err(|e| e.to_string())?;
    if status.code() != Some(3) {
        return Err(format!(
            "cluster status should exit 3 with a node down, got {status}"
        ));
    }
    call("n2", "still served on n3")?;
    run(&mut shoal(&["cluster", "start", "n1"], dir))?;
    stop(&mut server);
    demo_group(dir)
}

/// A process group at work: members on three nodes, messages in one
/// order, the sequencer killed, the group carrying on.
fn demo_group(dir: &Path) -> Result<(), String> {
    step("a process group with resilience 1: created on n2, joined from n3 and n4");
    let mut seq = GroupMember::start(dir, "n2", &["create", "--resilience", "1"])?;
    let port = seq
        .wait_line(|l| l.starts_with("group "))?
        .split_whitespace()
        .nth(1)
        .ok_or("no group port")?
        .to_string();
    println!("group {port}");
    let mut b = GroupMember::start(dir, "n3", &["join", &port])?;
    let mut c = GroupMember::start(dir, "n4", &["join", &port])?;
    b.say("hello from n3")?;
    c.say("hello from n4")?;
    seq.say("hello from n2")?;
    for m in [&b, &c, &seq] {
        m.wait_line(|l| l.ends_with("hello from n2"))?;
        m.wait_line(|l| l.ends_with("hello from n3"))?;
        m.wait_line(|l| l.ends_with("hello from n4"))?;
    }
    let order = |m: &GroupMember| {
        m.lines()
            .into_iter()
            .filter(|l| l.contains(" msg "))
            .filter_map(|l| l.splitn(5, ' ').nth(4).map(str::to_string))
            .collect::<Vec<_>>()
    };
    for (name, m) in [("n2", &seq), ("n3", &b), ("n4", &c)] {
        println!("  {name} delivered, in order: {:?}", order(m));
    }
    if order(&seq) != order(&b) || order(&b) != order(&c) {
        return Err("members delivered different orders".into());
    }
    step("the group as each member sees it");
    run(&mut shoal(
        &[
            "cluster",
            "exec",
            "--node",
            "n3",
            "--",
            shoal_bin().to_str().unwrap(),
            "group",
            "info",
            &port,
        ],
        dir,
    ))?;

    step("killing the sequencer (the member on n2) with SIGKILL: n3 and n4 reset and carry on");
    seq.kill();
    b.say("after the crash, from n3")?;
    for (name, m) in [("n3", &b), ("n4", &c)] {
        let view =
            m.wait_line(|l| l.split_whitespace().nth(2) == Some("view") && !l.starts_with("1 "))?;
        println!("  {name}: new view {view}");
        m.wait_line(|l| l.ends_with("after the crash, from n3"))?;
        println!("  {name}: delivered \"after the crash, from n3\"");
    }
    b.stop();
    c.stop();
    demo_dir(dir)
}

/// The directory service that `cluster up` started: three replicas kept
/// by their daemons, names registered on one node and looked up on
/// another, a replica killed and restarted by its daemon, the names still
/// there.
fn demo_dir(dir: &Path) -> Result<(), String> {
    let data = dir.join("demo-data");
    let _ = std::fs::remove_dir_all(&data);
    std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
    let on = |node: &str, args: &[&str]| -> Result<String, String> {
        let mut all = vec![
            "cluster".to_string(),
            "exec".into(),
            "--node".into(),
            node.into(),
            "--".into(),
            shoal_bin().display().to_string(),
        ];
        all.extend(args.iter().map(|a| a.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        // The service may still be forming (or re-forming): retry a while.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = shoal(&all, dir).output().map_err(|e| e.to_string())?;
            if out.status.success() {
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                print!("  {node}$ shoal {}\n{}", args.join(" "), indent(&text));
                return Ok(text);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "shoal {} failed on {node}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    };
    step("the directory service (replicas on n1, n2, n3): names registered on n4");
    let projects = on("n4", &["dir", "mkdir", "projects"])?;
    on("n4", &["dir", "mkdir", "projects/shoal"])?;
    on("n4", &["dir", "put", "projects/link", projects.trim()])?;
    step("looked up on n2 (one call for the whole path) and listed on n3");
    let found = on("n2", &["dir", "lookup", "projects/link"])?;
    if found.trim() != projects.trim() {
        return Err(format!(
            "n2 looked up {found:?}, n4 registered {projects:?}"
        ));
    }
    on("n3", &["dir", "ls", "projects"])?;
    step("every replica as it sees itself");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let table = on("n4", &["dir", "status", "--all"])?;
        if table.lines().skip(1).all(|l| l.contains(" member ")) {
            break;
        }
        if Instant::now() >= deadline {
            return Err("the replicas did not all join their group".into());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    step("killing the replica on n1 with SIGKILL: the names survive, updates go on");
    kill_service(dir, "n1", "dir-r0")?;
    let found = on("n3", &["dir", "lookup", "projects/link"])?;
    if found.trim() != projects.trim() {
        return Err(format!("after the crash n3 looked up {found:?}"));
    }
    on("n4", &["dir", "mv", "projects/link", "projects/shoal/link"])?;
    on("n2", &["dir", "ls", "projects/shoal"])?;
    step("n1's daemon restarts it: it recovers from its log and catches up by state transfer");
    restarted(dir, "n1", "dir-r0")?;
    on("n1", &["dir", "lookup", "projects/shoal/link"])?;
    demo_files(dir, &data, &on)?;
    demo_pool(dir, &data, &on)
}

/// Kills service `name` on `node` with SIGKILL, as a crash would.
fn kill_service(dir: &Path, node: &str, name: &str) -> Result<(), String> {
    let (pid, _) = service_pid(dir, node, name)?;
    let pid = pid.ok_or(format!("{name} on {node} is not running"))?;
    println!("  kill -KILL {pid}   # {name} on {node}");
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("kill {pid} failed"));
    }
    Ok(())
}

/// Service `name` on `node`: its pid if it runs, and how often it started.
fn service_pid(dir: &Path, node: &str, name: &str) -> Result<(Option<u64>, u64), String> {
    let out = shoal(&["service", "ls", "--node", node, "--json"], dir)
        .output()
        .map_err(|e| e.to_string())?;
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "shoal service ls: {e}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })?;
    let s = list
        .iter()
        .find(|s| s["name"] == name)
        .ok_or(format!("no service {name} on {node}"))?;
    let pid = (s["state"] == "running")
        .then(|| s["pid"].as_u64())
        .flatten();
    Ok((pid, s["starts"].as_u64().unwrap_or(0)))
}

/// Waits until the daemon of `node` has started `name` again, and shows
/// the node's services.
fn restarted(dir: &Path, node: &str, name: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(service_pid(dir, node, name)?, (Some(_), starts) if starts >= 2) {
        if Instant::now() >= deadline {
            return Err(format!("{node}'s daemon did not restart {name}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = shoal(&["service", "ls", "--node", node], dir)
        .output()
        .map_err(|e| e.to_string())?;
    print!(
        "  $ shoal service ls --node {node}\n{}",
        indent(&String::from_utf8_lossy(&out.stdout))
    );
    Ok(())
}

type On<'a> = dyn Fn(&str, &[&str]) -> Result<String, String> + 'a;

/// The file service that `cluster up` started: a file server on every
/// node, a file stored with two replicas and named in the directory, read
/// on another node, the server of one replica killed, the file still
/// read, the server restarted by its daemon with the replica it held.
fn demo_files(dir: &Path, data: &Path, on: &On<'_>) -> Result<(), String> {
    step("the file service: a server on every node, registered in the directory");
    on("n4", &["file", "servers"])?;
    // 5 MiB of recognisable text.
    let source = data.join("report.txt");
    let text: String = (0..150_000)
        .map(|i| format!("line {i:06} of the shoal demo report\n"))
        .collect::<String>()[..5 << 20]
        .to_string();
    std::fs::write(&source, &text).map_err(|e| e.to_string())?;
    step(
        "a 5 MiB file stored from n4 with two replicas on different servers, named projects/report",
    );
    on(
        "n4",
        &[
            "file",
            "put",
            "-q",
            "projects/report",
            source.to_str().unwrap(),
        ],
    )?;
    let stat = on("n2", &["file", "stat", "projects/report"])?;
    step("read back on n2 (from whichever replica answers)");
    // Reads the file on `node` into a copy and compares it.
    let read_back = |node: &str| -> Result<(), String> {
        let copy = data.join(format!("report.{node}"));
        on(
            node,
            &[
                "file",
                "get",
                "-q",
                "projects/report",
                copy.to_str().unwrap(),
            ],
        )?;
        same(&source, &copy)
    };
    read_back("n2")?;
    let first = stat
        .lines()
        .find_map(|l| l.trim().strip_prefix("fs").and_then(|r| r.chars().next()))
        .and_then(|c| c.to_digit(10))
        .ok_or("no replica listed")?;
    let node = format!("n{first}");
    step(&format!(
        "killing fs{first} (the first replica's server, on {node}) with SIGKILL: n3 still reads the file"
    ));
    kill_service(dir, &node, "file")?;
    read_back("n3")?;
    step(&format!(
        "{node}'s daemon restarts fs{first}, with the replica it stored"
    ));
    restarted(dir, &node, "file")?;
    on("n4", &["file", "stat", "projects/report"])?;
    Ok(())
}

/// The processor pool: programs placed across the nodes, `shoal ps`
/// listing them with their home and node, one killed through its home,
/// and a C code base built by `shoal make` over the cluster.
fn demo_pool(dir: &Path, data: &Path, on: &On<'_>) -> Result<(), String> {
    step("the processor pool: four programs started from n1 with shoal run --any");
    let bin = shoal_bin().display().to_string();
    let runs = (0..4)
        .map(|i| {
            shoal(
                &[
                    "cluster",
                    "exec",
                    "--node",
                    "n1",
                    "--",
                    &bin,
                    "run",
                    "--any",
                    "--",
                    "sleep",
                    &format!("{}.{i}", 5 + i),
                ],
                dir,
            )
            .spawn()
            .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Until every program runs on its node.
    let deadline = Instant::now() + Duration::from_secs(20);
    let listing = loop {
        let out = shoal(&["cluster", "exec", "--node", "n3", "--", &bin, "ps"], dir)
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let running = text
            .lines()
            .filter(|l| l.contains(" running ") && !l.contains(" - "))
            .count();
        if running == 4 {
            break text;
        }
        if Instant::now() >= deadline {
            return Err(format!("the four programs never all ran:\n{text}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    step("shoal ps on n3: every process with its home (n1) and the node it runs on");
    print!("  n3$ shoal ps\n{}", indent(&listing));
    let nodes: std::collections::BTreeSet<&str> = listing
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    if nodes.len() < 2 {
        return Err(format!("the pool put every program on one node: {nodes:?}"));
    }
    let victim = listing
        .lines()
        .find(|l| l.contains("sleep 8.3"))
        .and_then(|l| l.split_whitespace().next())
        .ok_or("sleep 8.3 is not listed")?
        .to_string();
    step("shoal kill from n2, through the home n1; shoal wait from n4 sees how it ended");
    on("n2", &["kill", &victim])?;
    let waited = shoal(
        &[
            "cluster", "exec", "--node", "n4", "--", &bin, "wait", &victim,
        ],
        dir,
    )
    .status()
    .map_err(|e| e.to_string())?;
    let code = waited
        .code()
        .map_or_else(|| "none (killed)".to_string(), |c| c.to_string());
    println!("  n4$ shoal wait {victim}; echo $?   # {code}: 128 + SIGTERM");
    if waited.code() != Some(128 + 15) {
        return Err(format!("shoal wait gave {waited}"));
    }
    for mut r in runs {
        let _ = r.wait();
    }

    let build = data.join("build");
    step("a parallel build: Lua 5.4's 32 C files, every recipe placed by shoal make");
    on(
        "n1",
        &["bench", "exec", "--prepare-build", build.to_str().unwrap()],
    )?;
    let started = Instant::now();
    let out = shoal(
        &["cluster", "exec", "--node", "n1", "--", &bin, "make"],
        dir,
    )
    .current_dir(&build)
    .output()
    .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<&str> = text.lines().collect();
    for l in lines.iter().take(3) {
        println!("  {l}");
    }
    println!("  ... ({} recipe lines)", lines.len());
    if !out.status.success() || !build.join("liblua.a").exists() {
        return Err(format!(
            "shoal make failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    println!(
        "  built liblua.a in {:.1} s ({})",
        started.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Checks two local files hold the same bytes, and says so.
fn same(a: &Path, b: &Path) -> Result<(), String> {
    let (x, y) = (
        std::fs::read(a).map_err(|e| e.to_string())?,
        std::fs::read(b).map_err(|e| e.to_string())?,
    );
    if x != y {
        return Err(format!("{} differs from {}", b.display(), a.display()));
    }
    println!("    identical to the original: {} bytes", x.len());
    Ok(())
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

/// A `shoal group` member run on a node, fed through stdin, read through
/// stdout.
struct GroupMember {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl GroupMember {
    fn start(dir: &Path, node: &str, args: &[&str]) -> Result<GroupMember, String> {
        use std::io::BufRead;
        let bin = shoal_bin();
        let mut all = vec![
            "cluster",
            "exec",
            "--node",
            node,
            "--",
            bin.to_str().unwrap(),
            "group",
        ];
        all.extend_from_slice(args);
        let mut child = shoal(&all, dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let out = std::io::BufReader::new(child.stdout.take().expect("piped"));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                sink.lock().expect("lines").push(line);
            }
        });
        let stdin = child.stdin.take().expect("piped");
        let m = GroupMember {
            child,
            stdin,
            lines,
        };
        m.wait_line(|l| l.starts_with("group ") || l.starts_with("joined "))?;
        Ok(m)
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }

    fn say(&mut self, text: &str) -> Result<(), String> {
        use std::io::Write;
        writeln!(self.stdin, "{text}").map_err(|e| e.to_string())
    }

    fn wait_line(&self, pred: impl Fn(&str) -> bool) -> Result<String, String> {
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            if let Some(l) = self.lines().into_iter().find(|l| pred(l)) {
                return Ok(l);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!(
            "a group member did not print what was expected; it printed {:?}",
            self.lines()
        ))
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn stop(&mut self) {
        stop(&mut self.child);
    }
}

impl Drop for GroupMember {
    fn drop(&mut self) {
        self.kill();
    }
}

fn serve_echo(dir: &Path, node: &str, get: &str) -> Result<std::process::Child, String> {
    let child = shoal(
        &[
            "cluster",
            "exec",
            "--node",
            node,
            "--",
            shoal_bin().to_str().unwrap(),
            "rpc",
            "serve-echo",
            "--get-port",
            get,
        ],
        dir,
    )
    .spawn()
    .map_err(|e| e.to_string())?;
    // Registered as soon as it prints; give it a moment.
    std::thread::sleep(Duration::from_millis(300));
    Ok(child)
}

fn stop(child: &mut std::process::Child) {
    // `cluster exec` becomes the server, so this is the server's pid:
    // SIGTERM makes it drain and exit.
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

fn test(args: &[String]) -> Result<(), String> {
    let quick = args.iter().any(|a| a == "--quick");
    let started = Instant::now();
    // shoal make's test runs GNU make; the pty test runs script(1).
    ensure_packages(&[SYSTEM, BUILD, &[("script", "bsdutils")]].concat())?;
    step("format");
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    step("what users run links no benchmark peer");
    bench::users_run_no_bench()?;
    step("lints");
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    step("unit, property, simulation and integration tests");
    let seeds = if quick { "64" } else { "2000" };
    let (passed, failed) = cargo_test(&["test", "--workspace", "--release"], seeds)?;
    if !quick {
        fuzz(10)?;
    }
    println!("\nxtask: all tests passed in {:.0?}", started.elapsed());
    println!("tests: {passed} passed, {failed} failed");
    Ok(())
}

/// `cargo xtask sim`: every simulation scenario (RPC and group) over many
/// seeds, in release mode.  A failure prints the seed and how to replay it.
fn sim(args: &[String]) -> Result<(), String> {
    let mut seeds = "20000".to_string();
    let mut filter: Option<String> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seeds" => {
                seeds = it.next().ok_or("--seeds takes a number")?.clone();
                seeds
                    .parse::<u64>()
                    .map_err(|_| format!("--seeds takes a number, not {seeds:?}"))?;
            }
            "--scenario" => filter = Some(it.next().ok_or("--scenario takes a name")?.clone()),
            other => return Err(format!("sim: unknown argument {other:?}\n\n{USAGE}")),
        }
    }
    step(&format!("simulation: {seeds} seeds per scenario"));
    let started = Instant::now();
    let mut cmd = vec!["test", "--release", "-p", "shoal-sim"];
    if let Some(f) = &filter {
        cmd.push(f);
    }
    let (passed, failed) = cargo_test(&cmd, &seeds)?;
    println!(
        "\nxtask: {passed} scenarios passed, {failed} failed, {seeds} seeds each, in {:.0?}",
        started.elapsed()
    );
    Ok(())
}

/// Runs `cargo ARGS`, echoing its output, and adds up the "test result"
/// lines: `(passed, failed)`.  Fails if cargo does.
fn cargo_test(args: &[&str], seeds: &str) -> Result<(u64, u64), String> {
    use std::io::{BufRead, BufReader};
    let mut child = cargo()
        .args(args)
        .env("SHOAL_SIM_SEEDS", seeds)
        .current_dir(root())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run cargo test: {e}"))?;
    let (mut passed, mut failed) = (0, 0);
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line.map_err(|e| e.to_string())?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            let count = |word: &str| {
                rest.split(';')
                    .find_map(|part| part.trim().strip_suffix(word))
                    .and_then(|n| n.split_whitespace().last()?.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            passed += count(" passed");
            failed += count(" failed");
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!(
            "cargo test failed ({status}): {passed} passed, {failed} failed"
        ));
    }
    Ok((passed, failed))
}

/// The fuzz targets of `fuzz/Cargo.toml`.
const FUZZ_TARGETS: &[&str] = &[
    "wire_decode",
    "capability",
    "cores",
    "link_request",
    "node_config",
    "group_payloads",
    "group_core",
    "dir_decode",
    "file_decode",
    "exec_decode",
    "session_decode",
    "fs_decode",
];

/// cargo-fuzz's instrumentation flags, less `-Zsanitizer=address`, the one
/// that needs nightly: libFuzzer's coverage (8-bit counters, PC table) and
/// comparison tracing, `cfg(fuzzing)`, debug assertions and overflow checks.
const FUZZ_RUSTFLAGS: &str = "--cfg fuzzing \
    -Cpasses=sancov-module \
    -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
    -Cllvm-args=-sanitizer-coverage-pc-table \
    -Cllvm-args=-sanitizer-coverage-trace-compares \
    -Cdebug-assertions -Coverflow-checks";

/// Builds every fuzz target with libFuzzer on stable Rust and runs each for
/// `seconds` (none if 0); fails if any finds a crash (the input is kept in
/// `fuzz/artifacts/TARGET/`).  Corpora grow in `fuzz/corpus/TARGET/`.
fn fuzz(seconds: u64) -> Result<(), String> {
    ensure_packages(&[("c++", "g++")])?; // libfuzzer-sys compiles libFuzzer
    let host = Command::new("rustc")
        .arg("-vV")
        .output()
        .map_err(|e| format!("cannot run rustc: {e}"))?;
    let host = String::from_utf8_lossy(&host.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .ok_or("rustc -vV names no host")?
        .to_string();
    step("building the fuzz targets");
    // An explicit --target keeps the instrumentation out of build scripts
    // and proc macros; a separate target dir keeps the main build intact.
    run(cargo()
        .args(["build", "--release", "--bins", "--manifest-path"])
        .args(["fuzz/Cargo.toml", "--target-dir", "fuzz/target", "--target"])
        .arg(&host)
        .env("RUSTFLAGS", FUZZ_RUSTFLAGS)
        .env_remove("CARGO_ENCODED_RUSTFLAGS"))?;
    if seconds == 0 {
        return Ok(());
    }
    let fuzz = root().join("fuzz");
    let mut failed = Vec::new();
    for target in FUZZ_TARGETS {
        step(&format!("fuzzing {target} for {seconds} s"));
        let (corpus, artifacts) = (
            fuzz.join("corpus").join(target),
            fuzz.join("artifacts").join(target),
        );
        for dir in [&corpus, &artifacts] {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let mut cmd = Command::new(fuzz.join("target").join(&host).join("release").join(target));
        cmd.arg(&corpus)
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .arg(format!(
                "-dict={}",
                fuzz.join("dict").join(format!("{target}.dict")).display()
            ))
            .arg(format!("-max_total_time={seconds}"))
            .arg("-print_final_stats=1");
        let shown = format!("{cmd:?}");
        let out = cmd
            .current_dir(root())
            .output()
            .map_err(|e| format!("cannot run {shown}: {e}"))?;
        // libFuzzer reports on stderr, a line per finding: show the summary,
        // or, on a crash, everything from the panic on (its message, the
        // backtrace, the input and where it was saved).
        let log = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = log.lines().collect();
        if out.status.success() {
            for line in lines
                .iter()
                .filter(|l| l.contains("DONE") || l.starts_with("stat::"))
            {
                println!("{line}");
            }
        } else {
            let from = lines.iter().position(|l| l.contains("panicked at"));
            for line in &lines[from.unwrap_or(lines.len().saturating_sub(60))..] {
                println!("{line}");
            }
            let artifact = lines
                .iter()
                .find_map(|l| l.split_once("Test unit written to "))
                .map_or("ARTIFACT", |(_, path)| path.trim());
            println!(
                "\n{target} crashed ({}); reproduce with:\n  fuzz/target/{host}/release/{target} {artifact}",
                out.status
            );
            failed.push(*target);
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "fuzz targets crashed: {} (inputs in fuzz/artifacts/)",
            failed.join(", ")
        ))
    }
}
