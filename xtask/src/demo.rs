//! `cargo xtask demo`: a 4-node cluster brought up with one command
//! (`shoal cluster up`), and each part of shoal shown at work on it, every
//! step checked: RPC, a group, the directory service through a replica's
//! SIGKILL and its restart by the node daemon, a file read on another node
//! after a file server's SIGKILL and restart, the pool and `shoal make`,
//! and the shared file system (a file written on one node read on
//! another, `shoal run` and `shoal make` working in /shoal, a file
//! server's SIGKILL).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{BUILD, SYSTEM, ensure_packages, root, run, shoal, shoal_bin, step};

pub fn demo() -> Result<(), String> {
    // The system's tools, and the pool's parallel build.
    ensure_packages(&[SYSTEM, BUILD].concat())?;
    crate::build_product()?;
    let dir = root().join("target/demo-cluster");
    if dir.join("cluster.toml").exists() {
        let _ = run(&mut shoal(&["cluster", "down"], &dir));
    }
    step(
        "starting a 4-node cluster with one command: nodes, a directory service, file servers, a root, a shared file system",
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
    demo_pool(dir, &data, &on)?;
    demo_fs(dir, &on)
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

/// `sh -c SCRIPT` on `node`, inside its namespaces (its /shoal), with
/// `$SHOAL` the shoal binary; its output, shown.
fn sh_on(dir: &Path, node: &str, script: &str) -> Result<String, String> {
    let out = shoal(
        &["cluster", "exec", "--node", node, "--", "sh", "-c", script],
        dir,
    )
    .env("SHOAL", shoal_bin())
    .output()
    .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    print!(
        "  {node}$ {}\n{}",
        script.replace("$SHOAL", "shoal"),
        indent(&text)
    );
    if !out.status.success() {
        return Err(format!(
            "{script} failed on {node}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(text)
}

/// The shared file system that `cluster up` mounted: one tree at /shoal on
/// every node, a file written on one node read at once on another, a
/// program run remotely working in it, a parallel build writing its
/// objects there, and a file server killed without the tree losing data.
fn demo_fs(dir: &Path, on: &On<'_>) -> Result<(), String> {
    step(
        "the shared file system: its metadata replicas on n1, n2, n3, the tree at /shoal on every node",
    );
    on("n2", &["fs", "status"]).map(|_| ())?;
    for node in ["n1", "n2", "n3", "n4"] {
        sh_on(dir, node, "mountpoint /shoal")?;
    }
    step("a file written on n1 is read at once on n3");
    sh_on(
        dir,
        "n1",
        "mkdir -p /shoal/demo && echo written on n1 > /shoal/demo/hello && ls -l /shoal/demo",
    )?;
    let read = sh_on(dir, "n3", "cat /shoal/demo/hello")?;
    if !read.starts_with("written on") {
        return Err(format!("n3 read {read:?}"));
    }
    step("a program run remotely by shoal run works in the shared tree");
    let out = sh_on(
        dir,
        "n1",
        "cd /shoal/demo && $SHOAL run --on n4 -- sh -c 'pwd; cat hello; echo made on n4 > from-n4'",
    )?;
    if !out.starts_with("/shoal/demo\n") {
        return Err(format!("the remote program ran in {out:?}"));
    }
    sh_on(dir, "n2", "cat /shoal/demo/from-n4")?;
    step(
        "a parallel build in the shared tree: Lua's C files, every recipe placed by shoal make, every object written to /shoal",
    );
    on("n1", &["bench", "exec", "--prepare-build", "/shoal/build"])?;
    let started = Instant::now();
    let made = sh_on(dir, "n1", "cd /shoal/build && $SHOAL make 2>&1 | tail -n 3")?;
    sh_on(
        dir,
        "n3",
        "ls /shoal/build/*.o | wc -l; ls -l /shoal/build/liblua.a",
    )?;
    println!(
        "  built in {:.1} s on the shared tree",
        started.elapsed().as_secs_f64()
    );
    let sum = |node: &str| sh_on(dir, node, "md5sum /shoal/build/liblua.a /shoal/demo/hello");
    let before = sum("n4")?;
    if made.is_empty() || before.is_empty() {
        return Err("the build left no liblua.a".into());
    }
    step("killing the file server on n2 with SIGKILL: the tree loses nothing");
    kill_service(dir, "n2", "file")?;
    let after = sum("n3")?;
    if after != before {
        return Err(format!("after the crash: {after:?}, before: {before:?}"));
    }
    restarted(dir, "n2", "file")?;
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
