//! `shoal bench exec`: the processor pool after the Amoeba–Sprite
//! comparison's Table 4 (program invocation) and the Sprite migration
//! paper's Table 5 (compilations spread over the nodes).
//!
//! On a four-node local cluster (`bx`, 10.77.249.0/24), an agent on n1
//! (the home) times, in interleaved rounds:
//!
//! - a program that exits at once (`/bin/true`) started by a plain
//!   fork+exec, by `shoal run` on n1 itself, on n2 named, and on a node the
//!   pool picks (n1's owner is marked active meanwhile, so the pick is
//!   another node), and by `ssh` to n2 (OpenSSH's server, started by the
//!   bench in n2's namespace with a key made for the run);
//! - a remote `cat` of a 1 GiB file through `shoal run`'s stdout, beside
//!   a local `cat` into a pipe;
//! - a build of Lua 5.4's C sources (32 files, unmodified, as the
//!   `lua-src` crate ships them) with `make -jN` on n1, with `shoal make
//!   -jN` over the four nodes, and with `make -jN CC=distcc` over distccd
//!   on the four nodes; N is the cluster's cores.
//!
//! Every node of a local cluster shares this machine's cores, so the
//! builds cannot go faster over four nodes than on one: the figures are
//! the pool's overhead.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde_json::{Value, json};
use shoal_cluster::Cluster;

use crate::agent::{Agent, arg, num, serve_commands};
use crate::dir::DataDir;
use crate::sshd::{Daemon, SSH_PORT, Sshd, ip_of};

/// Flags of `shoal bench exec`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(flatten)]
    pub run: crate::RunArgs,
    /// The C sources to build (default: Lua 5.4 from the `lua-src` crate
    /// in Cargo's registry).
    #[arg(long)]
    pub sources: Option<PathBuf>,
    /// Only copy the sources and their Makefile into this directory (to
    /// build them by hand), and exit.
    #[arg(long, value_name = "DIR")]
    pub prepare_build: Option<PathBuf>,
}

/// The half of `shoal bench exec` that runs on a node.
#[derive(Subcommand, Debug, Clone)]
pub enum AgentCommand {
    /// Runs and times programs, driven by commands on standard input:
    /// `spawn N PROGRAM ARGS...` (N runs, one after another: each one's
    /// milliseconds), `stream PROGRAM ARGS...` (its stdout's bytes and
    /// seconds), `build DIR PROGRAM ARGS...` (seconds, in DIR, output to
    /// DIR/build.log).
    Timer,
}

/// The null program.
const NULL: &str = "/bin/true";
/// The stdout test's file.
const BIG: u64 = 1 << 30;
/// The paper's Table 4 (ms): local, remote specified, remote chosen.
const AMOEBA_1991: [f64; 3] = [58.0, 84.0, 95.0];
const SPRITE_1991: [f64; 3] = [72.0, 116.0, 131.0];

pub fn agent(command: AgentCommand) -> Result<(), String> {
    match command {
        AgentCommand::Timer => {
            serve_commands(|w| match w[0] {
                "spawn" => {
                    let n = num(w, 1)?;
                    let argv = &w[2..];
                    let mut ms = Vec::with_capacity(n);
                    for _ in 0..n {
                        let t = Instant::now();
                        let status = command_of(argv)?
                            .stdin(Stdio::null())
                            .stdout(Stdio::null())
                            .status()
                            .map_err(|e| format!("{}: {e}", argv[0]))?;
                        ms.push(t.elapsed().as_secs_f64() * 1e3);
                        if !status.success() {
                            return Err(format!("{} failed: {status}", argv.join(" ")));
                        }
                    }
                    Ok(json!({ "ms": ms }))
                }
                "stream" => {
                    let argv = &w[1..];
                    let t = Instant::now();
                    let mut child = command_of(argv)?
                        .stdin(Stdio::null())
                        .stdout(Stdio::piped())
                        .spawn()
                        .map_err(|e| format!("{}: {e}", argv[0]))?;
                    let mut out = child.stdout.take().expect("piped");
                    let mut buf = vec![0u8; 1 << 20];
                    let mut bytes = 0u64;
                    loop {
                        match out.read(&mut buf) {
                            Ok(0) => break,
                            Ok(n) => bytes += n as u64,
                            Err(e) => return Err(format!("reading {}: {e}", argv[0])),
                        }
                    }
                    let status = child.wait().map_err(|e| e.to_string())?;
                    let s = t.elapsed().as_secs_f64();
                    if !status.success() {
                        return Err(format!("{} failed: {status}", argv.join(" ")));
                    }
                    Ok(json!({ "bytes": bytes, "s": s }))
                }
                "build" => {
                    let t = Instant::now();
                    run_build(Path::new(arg(w, 1)?), &w[2..])?;
                    Ok(json!({ "s": t.elapsed().as_secs_f64() }))
                }
                other => Err(format!("unknown command {other}")),
            });
            Ok(())
        }
    }
}

/// Runs `argv` in `dir`, its output in `dir/build.log`; an error names
/// the log if it fails.
pub(crate) fn run_build(dir: &Path, argv: &[&str]) -> Result<(), String> {
    let log = dir.join("build.log");
    let out = File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let status = command_of(argv)?
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(out)
        .status()
        .map_err(|e| format!("{}: {e}", argv[0]))?;
    if !status.success() {
        return Err(format!(
            "{} failed ({status}); see {}",
            argv.join(" "),
            log.display()
        ));
    }
    Ok(())
}

fn command_of(argv: &[&str]) -> Result<Command, String> {
    let (program, args) = argv.split_first().ok_or("no program")?;
    let mut c = Command::new(program);
    c.args(args);
    Ok(c)
}

/// Runs the benchmark.
pub fn run(args: BenchArgs) -> Result<(), String> {
    crate::announce_cpu();
    let sources = match &args.sources {
        Some(s) => s.clone(),
        None => find_lua_sources()?,
    };
    if let Some(dir) = &args.prepare_build {
        let files = prepare_build(&sources, dir)?;
        println!(
            "{files} C files of {} and a Makefile in {}",
            sources.display(),
            dir.display()
        );
        return Ok(());
    }
    let tools = Tools::find()?;
    crate::on_cluster(
        &args.run,
        ("exec", (4, "bx", 249)),
        |guard, shoal| measure(guard.cluster(), shoal, &tools, &sources, args.run.quick),
        table,
    )
}

/// The programs the baselines need, from Debian's packages.
struct Tools {
    sshd: PathBuf,
    distccd: PathBuf,
}

impl Tools {
    fn find() -> Result<Tools, String> {
        crate::peers::ensure(
            &[
                ("ssh", "openssh-client"),
                ("ssh-keygen", "openssh-client"),
                ("sshd", "openssh-server"),
                ("distcc", "distcc"),
                ("distccd", "distcc"),
                ("make", "make"),
                ("cc", "gcc"),
                ("ar", "binutils"),
            ],
            "the exec benchmark compares shoal with ssh and distcc",
        )?;
        let find = |p: &str| crate::peers::find(p).ok_or_else(|| format!("{p} not found"));
        Ok(Tools {
            sshd: find("sshd")?,
            distccd: find("distccd")?,
        })
    }
}

/// Lua 5.4's sources in Cargo's registry (the `lua-src` crate, a
/// dependency of this one, so any build of shoal fetched it).
pub(crate) fn find_lua_sources() -> Result<PathBuf, String> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let mut found = Vec::new();
    for registry in std::fs::read_dir(cargo_home.join("registry/src"))
        .into_iter()
        .flatten()
        .flatten()
    {
        for krate in std::fs::read_dir(registry.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = krate.file_name().to_string_lossy().into_owned();
            if !name.starts_with("lua-src-") {
                continue;
            }
            for lua in std::fs::read_dir(krate.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if lua.file_name().to_string_lossy().starts_with("lua-5.4") {
                    found.push(lua.path());
                }
            }
        }
    }
    found.sort();
    found.pop().ok_or_else(|| {
        format!(
            "no Lua 5.4 sources under {}/registry/src/*/lua-src-*: run `cargo fetch` in shoal's workspace, or give --sources DIR",
            cargo_home.display()
        )
    })
}

/// The build description the bench adds to the sources: every `.c` file
/// compiled to an object, all archived in one library.
const MAKEFILE: &str = "CC ?= cc\n\
CFLAGS = -O2 -Wall -DLUA_USE_LINUX\n\
OBJS = $(patsubst %.c,%.o,$(wildcard *.c))\n\
liblua.a: $(OBJS)\n\
\tar rcs $@ $(OBJS)\n\
%.o: %.c\n\
\t$(CC) $(CFLAGS) -c $< -o $@\n\
clean:\n\
\trm -f *.o liblua.a\n";

/// Copies the C sources (and their headers) in `sources` into `tree`
/// with the bench's Makefile: how many C files.
pub fn prepare_build(sources: &Path, tree: &Path) -> Result<usize, String> {
    std::fs::create_dir_all(tree).map_err(|e| format!("{}: {e}", tree.display()))?;
    let mut files = 0;
    for entry in std::fs::read_dir(sources).map_err(|e| format!("{}: {e}", sources.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name();
        let name_s = name.to_string_lossy();
        if name_s.ends_with(".c") || name_s.ends_with(".h") {
            std::fs::copy(entry.path(), tree.join(&name)).map_err(|e| e.to_string())?;
            files += usize::from(name_s.ends_with(".c"));
        }
    }
    std::fs::write(tree.join("Makefile"), MAKEFILE).map_err(|e| e.to_string())?;
    Ok(files)
}

fn ms_of(answer: &Value) -> Result<Vec<f64>, String> {
    answer["ms"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .ok_or_else(|| format!("agent answer without ms: {answer}"))
}

fn measure(
    cluster: &Cluster,
    shoal: &Path,
    tools: &Tools,
    sources: &Path,
    quick: bool,
) -> Result<BTreeMap<String, f64>, String> {
    let (rounds, per_round, streams, builds) = if quick { (2, 5, 1, 1) } else { (10, 20, 3, 5) };
    let mut metrics = BTreeMap::new();
    let work = DataDir::fresh("exec")?;
    let w = &work.0;
    let shoal_s = shoal.to_str().ok_or("the shoal path is not UTF-8")?;
    let nodes: Vec<String> = cluster
        .file()
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .collect();
    if nodes.len() < 4 {
        return Err("the exec benchmark needs a cluster of four nodes".into());
    }

    // ssh: a key for the run, and sshd on n2.
    eprintln!("bench: starting sshd on n2 (port {SSH_PORT}) with a key made for this run");
    let sshd = Sshd::start(cluster, "n2", &tools.sshd, w)?;

    // distccd on every node.
    eprintln!("bench: starting distccd on {}", nodes.join(", "));
    let net = {
        let ip = ip_of(cluster, "n1")?;
        let (a, _) = ip.rsplit_once('.').ok_or("an IPv4 cluster")?;
        format!("{a}.0/24")
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut distcc_hosts = Vec::new();
    let mut _distccd = Vec::new();
    for n in &nodes[..4] {
        let ip = ip_of(cluster, n)?;
        distcc_hosts.push(format!("{ip}/{cores}"));
        _distccd.push(Daemon::spawn(
            cluster
                .command(n, &tools.distccd)?
                .args(["--no-detach", "--daemon", "--allow", &net, "--listen", &ip])
                .args(["--jobs", &cores.to_string(), "--user", "nobody"])
                .args(["--log-stderr", "--log-level", "error"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(
                    File::create(w.join(format!("distccd-{n}.log"))).map_err(|e| e.to_string())?,
                ),
            &format!("distccd on {n}"),
        )?);
    }

    // The sources, three times: one tree per way of building.
    let jobs = cores * 4;
    let trees: Vec<PathBuf> = ["local", "shoal", "distcc"]
        .iter()
        .map(|name| w.join(format!("build-{name}")))
        .collect();
    let mut files = 0;
    for tree in &trees {
        files = prepare_build(sources, tree)?;
    }
    if files < 30 {
        return Err(format!(
            "{} has {files} C files; the build wants 30 or more",
            sources.display()
        ));
    }
    metrics.insert("make_files".into(), files as f64);
    metrics.insert("make_jobs".into(), jobs as f64);

    // The 1 GiB file: sparse, so it costs no disk.
    let big = w.join("big");
    File::create(&big)
        .and_then(|f| f.set_len(BIG))
        .map_err(|e| format!("{}: {e}", big.display()))?;

    // distcc reads its hosts from $DISTCC_DIR/hosts.
    let distcc_dir = w.join("distcc");
    std::fs::create_dir_all(&distcc_dir).map_err(|e| e.to_string())?;
    std::fs::write(distcc_dir.join("hosts"), distcc_hosts.join(" ") + "\n")
        .map_err(|e| e.to_string())?;
    let mut timer = Agent::start_with_env(
        cluster,
        "n1",
        &["exec", "timer"],
        &[("DISTCC_DIR", distcc_dir.as_os_str())],
    )?;
    let ssh = format!("ssh {} root@{} {NULL}", sshd.ssh_options(), sshd.ip);
    let kinds: [(&str, String); 5] = [
        ("fork_exec_ms", NULL.to_string()),
        ("exec_local_ms", format!("{shoal_s} run --on n1 -- {NULL}")),
        (
            "exec_remote_specified_ms",
            format!("{shoal_s} run --on n2 -- {NULL}"),
        ),
        (
            "exec_remote_placed_ms",
            format!("{shoal_s} run --any -- {NULL}"),
        ),
        ("ssh_exec_ms", ssh),
    ];
    // Warm-up, and a check that each way works (sshd may take a moment).
    let until = Instant::now() + Duration::from_secs(15);
    for (name, line) in &kinds {
        loop {
            match timer.call(&format!("spawn 3 {line}")) {
                Ok(_) => break,
                Err(_) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(format!("{name}: {e}")),
            }
        }
    }
    // n1's owner is at the keyboard: the pool places n1's programs
    // elsewhere.
    timer.call(&format!("spawn 1 {shoal_s} node owner active"))?;
    std::thread::sleep(Duration::from_secs(1));
    eprintln!(
        "bench: null program, {rounds} rounds of {per_round} runs per way (fork+exec, shoal local, named, placed, ssh)"
    );
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for round in 0..rounds {
        for k in 0..kinds.len() {
            let k = (k + round) % kinds.len();
            let answer = timer.call(&format!("spawn {per_round} {}", kinds[k].1))?;
            times[k].extend(ms_of(&answer)?);
        }
    }
    timer.call(&format!("spawn 1 {shoal_s} node owner idle"))?;
    for ((name, _), mut t) in kinds.iter().zip(times) {
        metrics.insert(name.to_string(), crate::stats::median(&mut t));
    }

    eprintln!(
        "bench: 1 GiB through shoal run's stdout (remote cat), and a local cat, {streams} each"
    );
    let mut rates: [Vec<f64>; 2] = Default::default();
    // Round 0 warms up (the first gigabyte through a node finds its
    // buffers unallocated).
    for round in 0..=streams {
        for (i, line) in [
            format!("{shoal_s} run --on n2 -- cat {}", big.display()),
            format!("cat {}", big.display()),
        ]
        .iter()
        .enumerate()
        {
            let a = timer.call(&format!("stream {line}"))?;
            let bytes = a["bytes"].as_f64().ok_or("stream: no bytes")?;
            if bytes as u64 != BIG {
                return Err(format!("{line} gave {bytes} bytes, not {BIG}"));
            }
            if round > 0 {
                rates[i].push(bytes / (1 << 20) as f64 / a["s"].as_f64().ok_or("stream: no s")?);
            }
        }
    }
    metrics.insert(
        "exec_stdout_mib_s".into(),
        crate::stats::median(&mut rates[0]),
    );
    metrics.insert(
        "local_cat_mib_s".into(),
        crate::stats::median(&mut rates[1]),
    );

    eprintln!(
        "bench: building {files} C files with -j{jobs}: make on n1, shoal make over 4 nodes, distcc over 4 nodes; {builds} rounds"
    );
    let builds_of = |tree: &Path| -> [String; 3] {
        let t = tree.display();
        [
            format!("build {t} make -j{jobs}"),
            format!("build {t} {shoal_s} make -j{jobs}"),
            format!("build {t} make -j{jobs} CC=distcc"),
        ]
    };
    let mut secs: [Vec<f64>; 3] = Default::default();
    for round in 0..=builds {
        for k in 0..3 {
            let k = (k + round) % 3;
            let tree = &trees[k];
            timer.call(&format!("build {} make clean", tree.display()))?;
            let a = timer.call(&builds_of(tree)[k])?;
            if !tree.join("liblua.a").exists() {
                return Err(format!("{} built no liblua.a", tree.display()));
            }
            // Round 0 warms the caches (compiler, headers, page cache).
            if round > 0 {
                secs[k].push(a["s"].as_f64().ok_or("build: no s")?);
            }
        }
    }
    for (name, mut s) in ["make_local_s", "make_shoal_s", "make_distcc_s"]
        .into_iter()
        .zip(secs)
    {
        metrics.insert(name.into(), crate::stats::median(&mut s));
    }
    Ok(metrics)
}

fn table(m: &BTreeMap<String, f64>) -> String {
    let g = |k: &str| m.get(k).copied().unwrap_or(f64::NAN);
    let mut t = String::new();
    t.push_str("## Program invocation (Amoeba–Sprite comparison, Table 4)\n\n");
    t.push_str("| | Amoeba 1991 (ms) | Sprite 1991 (ms) | shoal (ms) | ssh (ms) |\n");
    t.push_str("|---|---:|---:|---:|---:|\n");
    for (i, (name, key, ssh)) in [
        ("local", "exec_local_ms", String::new()),
        (
            "remote, specified",
            "exec_remote_specified_ms",
            format!("{:.2}", g("ssh_exec_ms")),
        ),
        (
            "remote, chosen at invocation",
            "exec_remote_placed_ms",
            String::new(),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        t.push_str(&format!(
            "| {name} | {:.0} | {:.0} | {:.2} | {ssh} |\n",
            AMOEBA_1991[i],
            SPRITE_1991[i],
            g(key)
        ));
    }
    t.push_str(&format!(
        "\nA plain fork+exec of the same program: {:.2} ms. Placed remote run against ssh: {:.2}×.\n",
        g("fork_exec_ms"),
        g("exec_remote_placed_ms") / g("ssh_exec_ms")
    ));
    t.push_str("The 1991 figures are Sun 3/60s on 10 Mb/s Ethernet; shoal's are nodes of a local cluster\n");
    t.push_str(
        "(each time includes starting the `shoal run` command). Compare ratios, not times.\n\n",
    );
    t.push_str("## Output through the home\n\n");
    t.push_str(&format!(
        "1 GiB through `shoal run`'s stdout (remote cat): {:.0} MiB/s; a local cat into a pipe: {:.0} MiB/s.\n\n",
        g("exec_stdout_mib_s"),
        g("local_cat_mib_s")
    ));
    t.push_str("## Parallel compilation (Sprite migration paper, Table 5)\n\n");
    t.push_str(
        "Sprite 1987, four compilations: 66 s local, 28 s with three migrated (58% better);\n",
    );
    t.push_str("over NFS with rsh: 72 s local, 53 s remote.\n\n");
    t.push_str(&format!(
        "| {:.0} C files, -j{:.0} | seconds | against local |\n|---|---:|---:|\n",
        g("make_files"),
        g("make_jobs")
    ));
    for (name, key) in [
        ("make on one node", "make_local_s"),
        ("shoal make over 4 nodes", "make_shoal_s"),
        ("make with distcc over 4 nodes", "make_distcc_s"),
    ] {
        t.push_str(&format!(
            "| {name} | {:.2} | {:.2}× |\n",
            g(key),
            g(key) / g("make_local_s")
        ));
    }
    t.push_str(
        "\nThe four nodes of a local cluster share this machine's cores, so spreading a build\n",
    );
    t.push_str("over them cannot beat one node: these figures are the overhead of shoal make and distcc.\n");
    t
}
