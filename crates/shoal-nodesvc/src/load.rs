//! The node's load, measured from `/proc` for its heartbeats.
//!
//! - cores: the processors this daemon may run on;
//! - run queue: the one-minute load average (`/proc/loadavg`);
//! - foreign CPU: processor time used on the machine over the last
//!   interval (`/proc/stat`), less what shoal used (the daemon itself and
//!   the programs the pool runs here);
//! - free memory: `MemAvailable` (`/proc/meminfo`);
//! - owner: what `shoal node owner active|idle` last set, kept in the
//!   state directory across restarts; or, if the owner has not said
//!   (`auto`) and the node detects it, active while a terminal had input
//!   in the last [`OWNER_INPUT`] or foreign programs use [`OWNER_CPU_MILLI`]
//!   thousandths of a core.
//!
//! The nodes of a local cluster share one machine, so they all report its
//! load: placement among them then rests on the counts of shoal
//! processes, which are per node.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use shoal_wire::{Load, Owner};

/// Terminal input this recent means the owner is at the machine.
pub const OWNER_INPUT: Duration = Duration::from_secs(5 * 60);
/// Foreign processor use (thousandths of a core) that means the owner is
/// running something.
pub const OWNER_CPU_MILLI: u32 = 500;

/// The detected owner state: active with recent terminal input (`input_age`
/// since the last) or foreground load from programs not shoal's.
pub fn detect_owner(input_age: Option<Duration>, foreign_cpu_milli: u32) -> Owner {
    if input_age.is_some_and(|a| a < OWNER_INPUT) || foreign_cpu_milli >= OWNER_CPU_MILLI {
        Owner::Active
    } else {
        Owner::Idle
    }
}

/// Time since the last input on any terminal of the machine (the access
/// times of `/dev/tty*` consoles and `/dev/pts/*`, as `w` reads them).
fn terminal_input_age() -> Option<Duration> {
    let mut newest: Option<SystemTime> = None;
    let mut look = |path: PathBuf| {
        if let Ok(t) = std::fs::metadata(&path).and_then(|m| m.accessed()) {
            newest = Some(newest.map_or(t, |n| n.max(t)));
        }
    };
    for entry in std::fs::read_dir("/dev/pts")
        .into_iter()
        .flatten()
        .flatten()
    {
        if entry.file_name() != "ptmx" {
            look(entry.path());
        }
    }
    for i in 1..=12 {
        look(PathBuf::from(format!("/dev/tty{i}")));
    }
    let newest = newest?;
    Some(SystemTime::now().duration_since(newest).unwrap_or_default())
}

/// Samples the machine's load; keeps the last CPU counters to measure use
/// over the interval between samples.
#[derive(Debug)]
pub struct Sampler {
    cores: u16,
    /// Busy and total jiffies at the last sample, and shoal's own.
    last_cpu: Option<(u64, u64, u64)>,
    owner_file: PathBuf,
    /// What the owner said; `None`: left to detection.
    said: Option<Owner>,
    /// Detect the owner's activity when they have not said.
    detect: bool,
}

impl Sampler {
    /// A sampler whose owner state lives in `state_dir`; `detect`: detect
    /// the owner's activity when they have not said.
    pub fn new(state_dir: &Path, detect: bool) -> Sampler {
        let owner_file = state_dir.join("owner");
        let said = match std::fs::read_to_string(&owner_file)
            .as_deref()
            .map(str::trim)
        {
            Ok("active") => Some(Owner::Active),
            Ok("idle") => Some(Owner::Idle),
            _ => None,
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Sampler {
            cores: u16::try_from(cores).unwrap_or(u16::MAX),
            last_cpu: None,
            owner_file,
            said,
            detect,
        }
    }

    /// Sets the owner's state (`None`: left to detection) and keeps it for
    /// the next start.
    pub fn set_owner(&mut self, owner: Option<Owner>) -> Result<(), String> {
        let text = match owner {
            Some(Owner::Active) => "active\n",
            Some(Owner::Idle) => "idle\n",
            None => "auto\n",
        };
        let tmp = self.owner_file.with_extension("tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &self.owner_file))
            .map_err(|e| format!("cannot write {}: {e}", self.owner_file.display()))?;
        self.said = owner;
        Ok(())
    }

    /// The load now, with `shoal_procs` programs of the pool here that have
    /// used `shoal_jiffies` of processor time, the daemon's own included
    /// (a running total).  Figures `/proc` does not give read as zero.
    pub fn sample(&mut self, shoal_procs: u32, shoal_jiffies: u64) -> Load {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpu = cpu_jiffies(&read("/proc/stat")).map(|(b, t)| (b, t, shoal_jiffies));
        let foreign_cpu_milli = match (self.last_cpu, cpu) {
            (Some((b0, t0, s0)), Some((b1, t1, s1))) if t1 > t0 => {
                // Share of all cores busy with other programs, in
                // thousandths of one core (a program that ended takes its
                // time out of the total: then shoal's share reads as none).
                let busy = b1.saturating_sub(b0).saturating_sub(s1.saturating_sub(s0));
                let share = busy as f64 / (t1 - t0) as f64;
                (share * self.cores as f64 * 1000.0) as u32
            }
            _ => 0,
        };
        if cpu.is_some() {
            self.last_cpu = cpu;
        }
        let owner = match self.said {
            Some(o) => o,
            None if self.detect => detect_owner(terminal_input_age(), foreign_cpu_milli),
            None => Owner::Idle,
        };
        Load {
            cores: self.cores.max(1),
            run_queue_centi: load_average_centi(&read("/proc/loadavg")).unwrap_or(0),
            foreign_cpu_milli,
            mem_free_mib: mem_available_mib(&read("/proc/meminfo")).unwrap_or(0),
            shoal_procs,
            owner,
        }
    }
}

/// The one-minute load average of `/proc/loadavg`, in hundredths.
fn load_average_centi(text: &str) -> Option<u32> {
    let first: f64 = text.split_whitespace().next()?.parse().ok()?;
    (first.is_finite() && first >= 0.0).then(|| (first * 100.0).round() as u32)
}

/// Busy and total jiffies of all processors, from `/proc/stat`'s `cpu`
/// line (idle and iowait count as not busy).
fn cpu_jiffies(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    if v.len() < 4 {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest is in user).
    let total: u64 = v.iter().take(8).sum();
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// `MemAvailable` of `/proc/meminfo`, in MiB.
fn mem_available_mib(text: &str) -> Option<u32> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(u32::try_from(kib / 1024).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_parse() {
        assert_eq!(load_average_centi("1.57 0.80 0.30 2/345 6789\n"), Some(157));
        assert_eq!(load_average_centi(""), None);
        assert_eq!(
            cpu_jiffies("cpu  100 5 50 800 20 3 2 0 0 0\ncpu0 1 2 3 4\n"),
            Some((160, 980))
        );
        assert_eq!(cpu_jiffies("intr 5\n"), None);
        assert_eq!(
            mem_available_mib("MemTotal: 24000000 kB\nMemAvailable:   2097152 kB\n"),
            Some(2048)
        );
        assert_eq!(mem_available_mib("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn the_owner_state_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Sampler::new(dir.path(), false);
        assert_eq!(s.sample(0, 0).owner, Owner::Idle);
        s.set_owner(Some(Owner::Active)).unwrap();
        assert_eq!(
            Sampler::new(dir.path(), false).sample(0, 0).owner,
            Owner::Active
        );
        let load = s.sample(3, 0);
        assert_eq!((load.owner, load.shoal_procs), (Owner::Active, 3));
        assert!(load.cores >= 1);
        s.set_owner(None).unwrap();
        assert_eq!(
            Sampler::new(dir.path(), false).sample(0, 0).owner,
            Owner::Idle,
            "auto without detection is idle"
        );
    }

    #[test]
    fn the_owner_is_detected_by_input_or_foreground_load() {
        let min = Duration::from_secs(60);
        assert_eq!(detect_owner(None, 0), Owner::Idle);
        assert_eq!(detect_owner(Some(min), 0), Owner::Active);
        assert_eq!(detect_owner(Some(OWNER_INPUT + min), 0), Owner::Idle);
        assert_eq!(
            detect_owner(Some(OWNER_INPUT + min), OWNER_CPU_MILLI),
            Owner::Active
        );
        assert_eq!(detect_owner(None, OWNER_CPU_MILLI - 1), Owner::Idle);
    }

    #[test]
    fn shoal_s_own_processor_time_is_not_foreign() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Sampler::new(dir.path(), false);
        s.sample(0, 0);
        // Burn processor time as shoal would, counting it as shoal's.
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(300) {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        // More than the whole machine could have used: nothing foreign.
        let load = s.sample(0, u64::MAX / 2);
        assert_eq!(load.foreign_cpu_milli, 0);
    }
}
