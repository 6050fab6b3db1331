//! POSIX conformance of the shared file system: `pjdfstest` (the Rust
//! suite from crates.io, installed into `target/tools`) run against
//! /shoal on a namespaced local cluster, with the configuration in
//! `crates/shoal-fuse/tests/pjdfstest.toml`, whose expected failures
//! `docs/fs.md` must each name with a reason.

use std::path::Path;
use std::process::Command;

use crate::{cargo, ensure_packages, have, root, run, step, tested_bin};

/// The pjdfstest release this project runs.
const VERSION: &str = "0.2.2";

/// The expected failures of the configuration: the quoted names in its
/// `expected_failures` list.
fn expected_failures(config: &str) -> Vec<String> {
    let Some(start) = config.find("expected_failures") else {
        return Vec::new();
    };
    let list = &config[start..];
    let list = &list[..list.find(']').unwrap_or(list.len())];
    list.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(|l| l.split('"').skip(1).step_by(2))
        .map(str::to_string)
        .collect()
}

/// Installs pjdfstest (and what building it needs) unless it is there.
fn install(tools: &Path) -> Result<(), String> {
    let bin = tools.join("bin/pjdfstest");
    if bin.exists() {
        return Ok(());
    }
    // The suite links libacl; `setfacl` comes with the same package family.
    ensure_packages(&[("setfacl", "acl")])?;
    if !Path::new("/usr/include/sys/acl.h").exists() {
        step("installing libacl1-dev");
        run(Command::new("apt-get")
            .args([
                "install",
                "-y",
                "-q",
                "--no-install-recommends",
                "libacl1-dev",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    step(&format!(
        "installing pjdfstest {VERSION} into {}",
        tools.display()
    ));
    run(cargo()
        .args([
            "install",
            "pjdfstest",
            "--locked",
            "--version",
            VERSION,
            "--root",
        ])
        .arg(tools))
}

/// The user the suite switches to besides `nobody`.
fn ensure_test_user() -> Result<(), String> {
    if Command::new("id")
        .arg("tests")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(());
    }
    run(Command::new("useradd")
        .args(["--system", "--user-group", "--no-create-home", "--shell"])
        .args(["/usr/sbin/nologin", "tests"]))
}

/// Runs the suite on a fresh 3-node cluster; fails on any failure that is
/// not expected, or on an expected one `docs/fs.md` does not explain.
pub fn pjdfstest() -> Result<(), String> {
    let config_path = root().join("crates/shoal-fuse/tests/pjdfstest.toml");
    let config = std::fs::read_to_string(&config_path).map_err(|e| e.to_string())?;
    let doc = std::fs::read_to_string(root().join("docs/fs.md")).map_err(|e| e.to_string())?;
    for name in expected_failures(&config) {
        if !doc.contains(&format!("`{name}`")) {
            return Err(format!(
                "pjdfstest's expected failure {name} is not explained in docs/fs.md"
            ));
        }
    }
    if !have("nsenter") || !have("mountpoint") {
        return Err("pjdfstest needs nsenter and mountpoint (util-linux)".into());
    }
    let tools = root().join("target/tools");
    install(&tools)?;
    ensure_test_user()?;
    let dir = root().join("target/pjdfstest-cluster");
    let shoal = |args: &[&str]| {
        let mut c = Command::new(tested_bin());
        c.args(args).arg("--dir").arg(&dir);
        c
    };
    if dir.join("cluster.toml").exists() {
        let _ = run(&mut shoal(&["cluster", "down"]));
    }
    step("POSIX conformance: pjdfstest on /shoal of a 3-node cluster");
    run(shoal(&["cluster", "up"]).args(["--nodes", "3", "--name", "pjd", "--subnet", "62"]))?;
    let result = (|| {
        let exec = |args: &[&str]| {
            let mut c = shoal(&["cluster", "exec"]);
            c.args(["--node", "n1", "--"]).args(args);
            c
        };
        run(&mut exec(&["mkdir", "-p", "/shoal/pjdfstest"]))?;
        run(&mut exec(&["chmod", "0777", "/shoal/pjdfstest"]))?;
        let bin = tools.join("bin/pjdfstest");
        let out = exec(&[bin.to_str().unwrap(), "-c", config_path.to_str().unwrap()])
            .args(["-p", "/shoal/pjdfstest"])
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        let summary = text
            .lines()
            .find(|l| l.starts_with("Summary"))
            .unwrap_or("no summary")
            .to_string();
        println!("pjdfstest: {summary}");
        if !out.status.success() {
            let failed: Vec<&str> = text.lines().filter(|l| l.contains("FAILED")).collect();
            return Err(format!(
                "pjdfstest failed:\n{}\n{}",
                failed.join("\n"),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    })();
    let down = run(&mut shoal(&["cluster", "down"]));
    result.and(down)
}

#[cfg(test)]
mod tests {
    #[test]
    fn expected_failures_are_read_from_the_configuration() {
        let config = "[settings]\nexpected_failures = [\n  # a comment \"x\"\n  \"a::b\",\n  \"c\"]\n[x]\ny = \"z\"\n";
        assert_eq!(super::expected_failures(config), vec!["a::b", "c"]);
    }
}
