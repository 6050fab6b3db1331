//! shoal's Debian packages (`cargo xtask dist`, `docs/operations.md`).
//!
//! Two packages, so that what users install is what users run:
//!
//! ```text
//! shoal        /usr/bin/shoal, /usr/bin/shoal-make-shell
//!              /lib/systemd/system/shoal-node.service
//!              /etc/shoal/node.toml                  (a conffile)
//!              /usr/share/bash-completion/completions/shoal
//!              /usr/share/doc/shoal/                 operations and services
//! shoal-bench  /usr/bin/shoal-bench                  (depends on shoal)
//! ```
//!
//! The packages have no maintainer scripts: the unit makes the state
//! directory (`StateDirectory=`, 0700) and the runtime directory, and
//! `systemctl enable` reloads systemd. So they also install into another
//! root (`dpkg --instdir`), which is how the package test installs one
//! per namespaced node of a local cluster.
//!
//! Built with `dpkg-deb`, which every Debian machine has.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The systemd unit.
pub const UNIT: &str = include_str!("../files/shoal-node.service");
/// The default node configuration, `/etc/shoal/node.toml`.
pub const CONFIG: &str = include_str!("../files/node.toml");

/// Where the installed files go.
pub const UNIT_PATH: &str = "lib/systemd/system/shoal-node.service";
pub const CONFIG_PATH: &str = "etc/shoal/node.toml";

/// What goes into the packages.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The `shoal` binary (release).
    pub shoal: PathBuf,
    /// `shoal-make-shell`, beside it.
    pub make_shell: PathBuf,
    /// `shoal-bench`, for a package of its own; none: no such package.
    pub bench: Option<PathBuf>,
    /// Documents installed under `/usr/share/doc/shoal` (name, contents).
    pub docs: Vec<(String, String)>,
    pub version: String,
    /// Debian's name for the architecture (`dpkg --print-architecture`).
    pub arch: String,
    /// Where the packages and their staging trees go.
    pub out: PathBuf,
}

/// Debian's name for this machine's architecture.
pub fn host_arch() -> Result<String, String> {
    let out = Command::new("dpkg")
        .arg("--print-architecture")
        .output()
        .map_err(|e| format!("cannot run dpkg: {e}"))?;
    if !out.status.success() {
        return Err("dpkg --print-architecture failed".into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Builds the packages; their paths, `shoal` first.
pub fn build(inputs: &Inputs) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(&inputs.out)
        .map_err(|e| format!("cannot create {}: {e}", inputs.out.display()))?;
    let mut debs = Vec::new();
    let stage = fresh_dir(&inputs.out.join("stage-shoal"))?;
    install(&inputs.shoal, &stage.join("usr/bin/shoal"), 0o755, true)?;
    install(
        &inputs.make_shell,
        &stage.join("usr/bin/shoal-make-shell"),
        0o755,
        true,
    )?;
    write(&stage.join(UNIT_PATH), UNIT, 0o644)?;
    write(&stage.join(CONFIG_PATH), CONFIG, 0o644)?;
    let completion = Command::new(&inputs.shoal)
        .args(["completions", "bash"])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", inputs.shoal.display()))?;
    if !completion.status.success() {
        return Err("shoal completions bash failed".into());
    }
    write(
        &stage.join("usr/share/bash-completion/completions/shoal"),
        &String::from_utf8_lossy(&completion.stdout),
        0o644,
    )?;
    for (name, text) in &inputs.docs {
        write(&stage.join("usr/share/doc/shoal").join(name), text, 0o644)?;
    }
    write(
        &stage.join("DEBIAN/control"),
        &control(
            "shoal",
            inputs,
            "libc6",
            "a distributed operating system for clusters of Linux machines",
            "The shoal node daemon and the user's commands: RPC to location-independent\n \
             ports protected by capabilities, group communication, a replicated\n \
             directory service, an immutable file service and a processor pool.",
        ),
        0o644,
    )?;
    write(
        &stage.join("DEBIAN/conffiles"),
        &format!("/{CONFIG_PATH}\n"),
        0o644,
    )?;
    debs.push(pack(&stage, inputs, "shoal")?);
    if let Some(bench) = &inputs.bench {
        let stage = fresh_dir(&inputs.out.join("stage-shoal-bench"))?;
        install(bench, &stage.join("usr/bin/shoal-bench"), 0o755, true)?;
        write(
            &stage.join("DEBIAN/control"),
            &control(
                "shoal-bench",
                inputs,
                &format!("shoal (= {})", inputs.version),
                "shoal's benchmark suite",
                "Measures shoal side by side with the systems it compares against\n \
                 (gRPC with TLS, etcd, ssh, distcc, ...): `shoal bench`.",
            ),
            0o644,
        )?;
        debs.push(pack(&stage, inputs, "shoal-bench")?);
    }
    Ok(debs)
}

fn control(name: &str, inputs: &Inputs, depends: &str, summary: &str, long: &str) -> String {
    format!(
        "Package: {name}\nVersion: {}\nArchitecture: {}\nMaintainer: shoal developers <shoal@localhost>\n\
         Section: admin\nPriority: optional\nDepends: {depends}\nSuggests: make\n\
         Description: {summary}\n {long}\n",
        inputs.version, inputs.arch
    )
}

fn pack(stage: &Path, inputs: &Inputs, name: &str) -> Result<PathBuf, String> {
    let deb = inputs
        .out
        .join(format!("{name}_{}_{}.deb", inputs.version, inputs.arch));
    let out = Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(stage)
        .arg(&deb)
        .output()
        .map_err(|e| format!("cannot run dpkg-deb: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "dpkg-deb --build {}: {}",
            stage.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(deb)
}

fn fresh_dir(dir: &Path) -> Result<PathBuf, String> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("cannot clear {}: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir.to_path_buf())
}

fn write(path: &Path, text: &str, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Copies a binary into the tree, without its debugging information when
/// `strip` (and `strip` is there to do it).
fn install(from: &Path, to: &Path, mode: u32, strip: bool) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    std::fs::copy(from, to).map_err(|e| format!("cannot copy {}: {e}", from.display()))?;
    if strip {
        // Optional: a binary with its debugging information still works.
        let _ = Command::new("strip").arg("--strip-debug").arg(to).status();
    }
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("{}: {e}", to.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_default_configuration_and_unit_agree() {
        // The unit starts the daemon on the configuration the package
        // installs, whose socket is where programs look by default.
        assert!(super::UNIT.contains(&format!("--config /{}", super::CONFIG_PATH)));
        assert!(super::CONFIG.contains("socket = \"/run/shoal/node.sock\""));
        assert!(super::CONFIG.contains("state_dir = \"/var/lib/shoal\""));
        assert!(super::UNIT.contains("StateDirectory=shoal"));
        assert!(super::UNIT.contains("ConditionPathExists=/var/lib/shoal/node.cert"));
    }
}
