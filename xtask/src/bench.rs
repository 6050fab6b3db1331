//! `cargo xtask bench` (every benchmark in turn, one JSON) and the check
//! that what users run links none of the benchmarks' peers.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use crate::{BUILD, SYSTEM, USAGE, cargo, ensure_packages, root, run, shoal_bin, step};

/// The benchmarks `cargo xtask bench` runs, in order.
const BENCHES: &[&str] = &["rpc", "group", "dir", "file", "exec", "fs"];

/// `cargo xtask bench`: every benchmark in turn, one JSON
/// (`{"quick": ..., "benches": {NAME: {"metrics": ...} or {"error": ...}}}`;
/// every benchmark's metrics name the CPU).
/// A failed benchmark is recorded and the others still run.
pub(crate) fn bench(args: &[String]) -> Result<(), String> {
    let mut quick = false;
    let mut out = root().join("target/bench.json");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--json" => out = PathBuf::from(it.next().ok_or("--json takes a path")?),
            other => return Err(format!("bench: unknown argument {other:?}\n\n{USAGE}")),
        }
    }
    ensure_packages(&[SYSTEM, BUILD].concat())?;
    crate::build_product()?;
    let started = Instant::now();
    let mut parts = Vec::new();
    let mut failed = Vec::new();
    for (i, name) in BENCHES.iter().enumerate() {
        step(&format!("bench {name} ({} of {})", i + 1, BENCHES.len()));
        let json = root().join(format!("target/bench-{name}.json"));
        let _ = std::fs::remove_file(&json);
        let mut cmd = Command::new(shoal_bin());
        cmd.args(["bench", name, "--json"]).arg(&json);
        if quick {
            cmd.arg("--quick");
        }
        let part = match run(&mut cmd).and_then(|()| {
            std::fs::read_to_string(&json).map_err(|e| format!("{}: {e}", json.display()))
        }) {
            Ok(text) => text,
            Err(e) => {
                failed.push(*name);
                format!("{{\"error\": {}}}", json_string(&e))
            }
        };
        parts.push(format!("{}: {}", json_string(name), part.trim()));
    }
    let text = format!(
        "{{\"quick\": {quick}, \"benches\": {{\n{}\n}}}}\n",
        parts.join(",\n")
    );
    std::fs::write(&out, text).map_err(|e| format!("{}: {e}", out.display()))?;
    println!(
        "\nxtask: {} benchmarks in {:.0?}, written to {}",
        BENCHES.len(),
        started.elapsed(),
        out.display()
    );
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("these benchmarks failed: {}", failed.join(", ")))
    }
}

/// `s` as a JSON string.
fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The crates only the benchmarks may link: the peers they measure
/// against and the suite itself.
const BENCH_ONLY: &[&str] = &[
    "shoal-bench",
    "tonic",
    "prost",
    "rustls",
    "rcgen",
    "lua-src",
];

/// Fails if the `shoal` package (the binaries users run) depends, directly
/// or not, on a crate only the benchmarks may link.
pub(crate) fn users_run_no_bench() -> Result<(), String> {
    let out = cargo()
        .args([
            "tree",
            "-p",
            "shoal",
            "-e",
            "normal,build",
            "--prefix",
            "none",
        ])
        .args(["--format", "{p}"])
        .current_dir(root())
        .output()
        .map_err(|e| format!("cannot run cargo tree: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo tree failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let tree = String::from_utf8_lossy(&out.stdout);
    let linked: Vec<&str> = BENCH_ONLY
        .iter()
        .copied()
        .filter(|name| {
            tree.lines()
                .any(|l| l.split_whitespace().next() == Some(*name))
        })
        .collect();
    if !linked.is_empty() {
        return Err(format!(
            "the shoal binaries link benchmark-only crates: {}",
            linked.join(", ")
        ));
    }
    println!("  shoal depends on none of: {}", BENCH_ONLY.join(", "));
    Ok(())
}
