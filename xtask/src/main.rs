//! shoal's own tasks (`cargo xtask --help` lists them): `demo` and `test`,
//! the two commands of the README, and `sim`, `bench`, `fuzz`, `posix` and
//! `dist`.  Each first installs what it needs from Debian's packages (when
//! run as root on a machine that lacks them), so all work on a fresh
//! Debian machine that has only the Rust toolchain.  The tidy tests
//! (`tidy.rs`) run with the workspace's own, under `cargo test`.

mod bench;
mod demo;
mod dist;
mod posix;
#[cfg(test)]
mod tidy;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo::demo(),
        Some("test") => test(&args[1..]),
        Some("sim") => sim(&args[1..]),
        Some("bench") => bench::bench(&args[1..]),
        Some("dist") => dist::dist().map(|_| ()),
        Some("posix") => posix::pjdfstest(),
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
           it down; the shared file system: a file written on one node
           read on another, shoal run and shoal make in /shoal, a file
           server killed
  dist     the Debian packages shoal and shoal-bench (systemd unit and
           default configuration included) in target/dist/
  test     install what the tests need, then run the whole suite:
           format and lint checks, unit, property and simulation tests,
           real-cluster integration tests, pjdfstest on the shared file
           system, and short fuzz runs (--quick: skip pjdfstest and the
           fuzz runs, and use fewer simulation seeds)
  posix    pjdfstest alone, on /shoal of a 3-node local cluster
  sim [--seeds N] [--scenario NAME]
           the simulator alone, over N seeds per scenario (default
           20000): the nightly-size run of what `test` runs with 2000;
           NAME filters scenarios (e.g. group_ or promises_)
  fuzz [SECONDS]
           build the fuzz targets (fuzz/, stable Rust, no cargo-fuzz
           needed) and run each for SECONDS (default 60; 0: build only)
  bench [--quick] [--json PATH]
           every benchmark in turn (rpc, group, dir, file, exec, fs), each
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

/// The `shoal` users run and the benchmarks measure: built with the
/// `product` profile (whole-program optimisation; see Cargo.toml) by
/// [`build_product`].
fn shoal_bin() -> PathBuf {
    root().join("target/product/shoal")
}

/// The `shoal` the test build made (`cargo test --release` builds the
/// package's binaries too), for suites run after the tests.
fn tested_bin() -> PathBuf {
    root().join("target/release/shoal")
}

/// Builds what users run, `shoal`, `shoal-make-shell` and `shoal-bench`,
/// into `target/product/`.
fn build_product() -> Result<(), String> {
    step("building shoal and shoal-bench (product profile: a few minutes the first time)");
    run(cargo().args([
        "build",
        "--profile",
        "product",
        "-p",
        "shoal",
        "-p",
        "shoal-bench",
    ]))
}

/// `shoal SUBCOMMAND ACTION --dir DIR REST...`: the directory goes before
/// anything that might follow a `--`.
fn shoal(args: &[&str], dir: &Path) -> Command {
    let mut c = Command::new(shoal_bin());
    let (head, rest) = args.split_at(args.len().min(2));
    c.args(head).arg("--dir").arg(dir).args(rest);
    c
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
        posix::pjdfstest()?;
        fuzz(10)?;
    }
    println!("\nxtask: all tests passed in {:.0?}", started.elapsed());
    println!("tests: {passed} passed, {failed} failed");
    Ok(())
}

/// `cargo xtask sim`: every simulation scenario (`shoal-sim`'s tests) over
/// many seeds, in release mode.  A failure prints the seed and how to replay it.
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
