//! The programs the baselines need, from Debian's packages: a benchmark
//! run as root installs what is missing (once: the next run finds it), and
//! one run by anyone else names the packages and stops.

use std::path::PathBuf;
use std::process::Command;

/// `program` on `PATH`, or in `/usr/sbin` or `/usr/bin` (daemons live in
/// `/usr/sbin`, which an ordinary user's `PATH` may lack).
pub(crate) fn find(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Makes sure every `(program, package)` is there: as root, installs the
/// packages of the missing ones with apt-get (refreshing its lists first
/// if the install fails); otherwise fails naming them.  `why` says what
/// the benchmark compares against.
pub(crate) fn ensure(needed: &[(&str, &str)], why: &str) -> Result<(), String> {
    let mut missing: Vec<&str> = Vec::new();
    for (program, package) in needed {
        if find(program).is_none() && !missing.contains(package) {
            missing.push(package);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let list = missing.join(" ");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!(
            "{why}: install {list} (as root: apt-get install {list}), or run the benchmark as root and it installs them"
        ));
    }
    eprintln!("bench: installing {list} ({why}; once: the next run finds them)");
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !install() {
        eprintln!("bench: refreshing apt's package lists and trying again");
        let updated = Command::new("apt-get")
            .args(["update", "-q"])
            .status()
            .is_ok_and(|s| s.success());
        if !updated || !install() {
            return Err(format!(
                "{why}: apt-get could not install {list}; install them by hand"
            ));
        }
    }
    match needed.iter().find(|(program, _)| find(program).is_none()) {
        Some((program, package)) => Err(format!(
            "{why}: {package} is installed but {program} is still not found"
        )),
        None => Ok(()),
    }
}
