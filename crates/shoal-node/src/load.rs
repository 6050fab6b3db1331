//! The node's load, measured from `/proc` for its heartbeats.
//!
//! - cores: the processors this daemon may run on;
//! - run queue: the one-minute load average (`/proc/loadavg`);
//! - foreign CPU: processor time used on the machine over the last
//!   interval (`/proc/stat`), less what shoal's own processes used (none
//!   yet: the processor pool's processes will be subtracted once nodes run
//!   them);
//! - free memory: `MemAvailable` (`/proc/meminfo`);
//! - owner: what `shoal node owner active|idle` last set, kept in the
//!   state directory across restarts.
//!
//! The nodes of a local cluster share one machine, so they all report its
//! load: placement among them then rests on the counts of shoal
//! processes, which are per node.

use std::path::{Path, PathBuf};

use shoal_wire::{Load, Owner};

/// Samples the machine's load; keeps the last CPU counters to measure use
/// over the interval between samples.
#[derive(Debug)]
pub struct Sampler {
    cores: u16,
    /// Busy and total jiffies at the last sample.
    last_cpu: Option<(u64, u64)>,
    owner_file: PathBuf,
    owner: Owner,
}

impl Sampler {
    /// A sampler whose owner state lives in `state_dir`.
    pub fn new(state_dir: &Path) -> Sampler {
        let owner_file = state_dir.join("owner");
        let owner = match std::fs::read_to_string(&owner_file) {
            Ok(s) if s.trim() == "active" => Owner::Active,
            _ => Owner::Idle,
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Sampler {
            cores: u16::try_from(cores).unwrap_or(u16::MAX),
            last_cpu: None,
            owner_file,
            owner,
        }
    }

    /// Sets the owner's state and keeps it for the next start.
    pub fn set_owner(&mut self, owner: Owner) -> Result<(), String> {
        let text = match owner {
            Owner::Active => "active\n",
            Owner::Idle => "idle\n",
        };
        let tmp = self.owner_file.with_extension("tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &self.owner_file))
            .map_err(|e| format!("cannot write {}: {e}", self.owner_file.display()))?;
        self.owner = owner;
        Ok(())
    }

    /// The load now.  Figures `/proc` does not give read as zero.
    pub fn sample(&mut self, shoal_procs: u32) -> Load {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpu = cpu_jiffies(&read("/proc/stat"));
        let foreign_cpu_milli = match (self.last_cpu, cpu) {
            (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => {
                // Share of all cores busy, in thousandths of one core.
                let share = (b1.saturating_sub(b0)) as f64 / (t1 - t0) as f64;
                (share * self.cores as f64 * 1000.0) as u32
            }
            _ => 0,
        };
        if cpu.is_some() {
            self.last_cpu = cpu;
        }
        Load {
            cores: self.cores.max(1),
            run_queue_centi: load_average_centi(&read("/proc/loadavg")).unwrap_or(0),
            foreign_cpu_milli,
            mem_free_mib: mem_available_mib(&read("/proc/meminfo")).unwrap_or(0),
            shoal_procs,
            owner: self.owner,
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
        let mut s = Sampler::new(dir.path());
        assert_eq!(s.sample(0).owner, Owner::Idle);
        s.set_owner(Owner::Active).unwrap();
        assert_eq!(Sampler::new(dir.path()).sample(0).owner, Owner::Active);
        let load = s.sample(3);
        assert_eq!((load.owner, load.shoal_procs), (Owner::Active, 3));
        assert!(load.cores >= 1);
    }
}
