//! The file store under power loss: one [`Store`] on simulated disks that
//! keep, lose or tear (sector by sector) every write not yet synced when
//! the power goes, driven by a seeded random workload of creates, edits of
//! committed and uncommitted files, commits with and without the safety
//! flag, destroys, flushes, compactions and checkpoints.
//!
//! After every crash the store is opened again and checked against a model:
//! - **durability**: every file committed with the safety flag (or covered
//!   by a later completed sync) reads back byte for byte;
//! - **no wrong bytes**: any other committed file either is gone or reads
//!   back exactly; uncommitted files are gone;
//! - **consistency**: fsck finds no problem, and every extent verifies;
//! - **integrity** (with bit rot on): a read of a damaged extent fails with
//!   a corruption error, never returns wrong bytes.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_bullet::model::MAX_EXTENT;
use shoal_bullet::op::{FLAG_COMMIT, FLAG_SAFETY};
use shoal_bullet::{Answer, Disks, Edit, FileError, SimDisk, Store, StoreConfig};
use shoal_cap::{Capability, GetPort};
use shoal_proto::Time;

/// What a run does.
#[derive(Debug, Clone)]
pub struct BulletSimConfig {
    /// Operations in the run.
    pub ops: usize,
    /// Chance that a step is a power loss.
    pub crash_chance: f64,
    /// Chance that a step flips a bit of a stored extent.
    pub rot_chance: f64,
    /// Largest piece of data in one create or edit.
    pub max_data: usize,
}

impl Default for BulletSimConfig {
    fn default() -> Self {
        BulletSimConfig {
            ops: 80,
            crash_chance: 0.05,
            rot_chance: 0.0,
            max_data: 1 << 20,
        }
    }
}

/// What a run found.
#[derive(Debug, Default)]
pub struct BulletReport {
    pub crashes: usize,
    pub files_checked: usize,
    pub violations: Vec<String>,
}

/// How sure the model is of a committed file after a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Its commit was durable: it must read back.
    Durable,
    /// Committed, not known durable: gone or intact.
    Maybe,
    /// Destroyed, not known durable: gone or intact.
    Destroyed,
}

/// One seeded run.
pub struct BulletSim {
    rng: ChaCha8Rng,
    cfg: BulletSimConfig,
    disks: (SimDisk, SimDisk, SimDisk),
    store: Option<Store<SimDisk>>,
    server: Capability,
    /// Committed files: bytes and fate.
    files: BTreeMap<u64, (Capability, Vec<u8>, Fate)>,
    /// Uncommitted files being built.
    open: BTreeMap<u64, (Capability, Vec<u8>)>,
    /// Bit-rotted extents' data offsets (reads over them may fail).
    rotted: bool,
    now: Time,
    trace: Vec<String>,
    report: BulletReport,
}

fn store_cfg(seed: u64) -> StoreConfig {
    StoreConfig {
        cache_bytes: 2 << 20,
        grow_step: 256 << 10,
        checkpoint_after: 64 << 10,
        seed: Some(seed),
        ..StoreConfig::default()
    }
}

impl BulletSim {
    pub fn new(seed: u64, cfg: BulletSimConfig) -> BulletSim {
        let disks = (SimDisk::new(), SimDisk::new(), SimDisk::new());
        let store = Store::format(
            Disks {
                data: disks.0.clone(),
                meta: [disks.1.clone(), disks.2.clone()],
            },
            GetPort::from_bytes([seed as u8; 16]),
            store_cfg(seed),
        )
        .expect("format a simulated store");
        BulletSim {
            rng: ChaCha8Rng::seed_from_u64(seed),
            cfg,
            server: store.server_cap(),
            store: Some(store),
            disks,
            files: BTreeMap::new(),
            open: BTreeMap::new(),
            rotted: false,
            now: Time::ZERO,
            trace: Vec::new(),
            report: BulletReport::default(),
        }
    }

    /// What happened, one line per step.
    pub fn trace(&self) -> &[String] {
        &self.trace
    }

    fn store(&self) -> &Store<SimDisk> {
        self.store.as_ref().unwrap()
    }

    fn data(&mut self) -> Vec<u8> {
        let max = self.cfg.max_data;
        let n = match self.rng.random_range(0..10) {
            0 => 0,
            1..=6 => self.rng.random_range(1..=4096.min(max.max(1))),
            _ => self.rng.random_range(1..=max.max(1)),
        };
        let mut v = vec![0u8; n];
        self.rng.fill(&mut v[..]);
        v
    }

    fn flags(&mut self) -> u8 {
        match self.rng.random_range(0..4) {
            0 => 0,
            1 => FLAG_COMMIT,
            _ => FLAG_COMMIT | FLAG_SAFETY,
        }
    }

    fn violation(&mut self, what: String) {
        self.trace.push(format!("VIOLATION {what}"));
        self.report.violations.push(what);
    }

    /// Records the result of an operation that made or changed file
    /// `cap` with `flags`, whose bytes are now `bytes`.
    fn made(&mut self, cap: Capability, flags: u8, bytes: Vec<u8>) {
        let obj = cap.object().get();
        if flags & FLAG_COMMIT == 0 {
            self.open.insert(obj, (cap, bytes));
        } else {
            self.open.remove(&obj);
            let fate = if flags & FLAG_SAFETY != 0 {
                Fate::Durable
            } else {
                Fate::Maybe
            };
            self.files.insert(obj, (cap, bytes, fate));
        }
    }

    /// Every file the model knows is durable becomes so after a sync.
    fn synced(&mut self) {
        self.files.retain(|_, f| f.2 != Fate::Destroyed);
        for f in self.files.values_mut() {
            f.2 = Fate::Durable;
        }
    }

    fn read_all(&self, cap: &Capability) -> Result<Vec<u8>, FileError> {
        let st = self.store().stat(cap)?;
        let mut out = Vec::with_capacity(st.size as usize);
        while (out.len() as u64) < st.size {
            let before = out.len();
            self.store()
                .read_into(cap, out.len() as u64, 3 << 20, &mut out)?;
            if out.len() == before {
                break;
            }
        }
        Ok(out)
    }

    fn step(&mut self) {
        self.now += Duration::from_millis(1);
        let pick = self.rng.random_range(0..100);
        if self.rng.random_bool(self.cfg.crash_chance) {
            return self.crash();
        }
        if self.rng.random_bool(self.cfg.rot_chance) {
            return self.rot();
        }
        match pick {
            0..=24 => {
                let data = self.data();
                let flags = self.flags();
                let r = if data.len() > 2 && self.rng.random_bool(0.3) {
                    // As a streaming client does: parts, then one concat.
                    let cut = self.rng.random_range(1..data.len());
                    let parts: Result<Vec<_>, _> = [&data[..cut], &data[cut..]]
                        .iter()
                        .map(|d| self.store().create(&self.server, 0, d, self.now))
                        .collect();
                    parts.and_then(|p| self.store().concat(&self.server, flags, &p, self.now))
                } else {
                    self.store().create(&self.server, flags, &data, self.now)
                };
                self.trace.push(format!(
                    "create {} bytes flags {flags}: {:?}",
                    data.len(),
                    r.as_ref().map(|c| c.object().get())
                ));
                match r {
                    Ok(cap) => self.made(cap, flags, data),
                    Err(e) => self.violation(format!("create failed: {e}")),
                }
            }
            25..=49 => {
                // Edit a committed file (a new file) or an uncommitted one.
                let on_open = !self.open.is_empty() && self.rng.random_bool(0.4);
                let (cap, old) = if on_open {
                    let k = *self
                        .open
                        .keys()
                        .nth(self.rng.random_range(0..self.open.len()))
                        .unwrap();
                    self.open[&k].clone()
                } else if !self.files.is_empty() {
                    let k = *self
                        .files
                        .keys()
                        .nth(self.rng.random_range(0..self.files.len()))
                        .unwrap();
                    let f = &self.files[&k];
                    if f.2 == Fate::Destroyed {
                        return;
                    }
                    (f.0, f.1.clone())
                } else {
                    return;
                };
                let size = old.len() as u64;
                let offset = self.rng.random_range(0..=size);
                let (edit, new) = match self.rng.random_range(0..4) {
                    0 => {
                        let d = self.data();
                        let mut n = old.clone();
                        let end = (offset as usize + d.len()).max(n.len());
                        n.resize(end, 0);
                        n[offset as usize..offset as usize + d.len()].copy_from_slice(&d);
                        (Edit::Write { offset, data: d }, n)
                    }
                    1 => {
                        let d = self.data();
                        let mut n = old.clone();
                        n.splice(offset as usize..offset as usize, d.iter().copied());
                        (Edit::Insert { offset, data: d }, n)
                    }
                    2 => {
                        let len = self.rng.random_range(0..=2 * MAX_EXTENT);
                        let mut n = old.clone();
                        let end = (offset + len).max(size) as usize;
                        n.resize(end, 0);
                        n[offset as usize..(offset + len) as usize].fill(0);
                        (Edit::Hole { offset, len }, n)
                    }
                    _ => {
                        let len = self.rng.random_range(0..=size - offset);
                        let mut n = old.clone();
                        n.drain(offset as usize..(offset + len) as usize);
                        (Edit::Delete { offset, len }, n)
                    }
                };
                let flags = self.flags();
                let what = format!("{edit:?}").chars().take(60).collect::<String>();
                let r = self.store().edit(&cap, flags, edit, self.now);
                self.trace.push(format!(
                    "edit {} ({}) {what} flags {flags}: {:?}",
                    cap.object().get(),
                    if on_open { "uncommitted" } else { "committed" },
                    r.as_ref().map(|c| c.object().get())
                ));
                match r {
                    Ok(c) => self.made(c, flags, new),
                    Err(e) => self.violation(format!("edit failed: {e}")),
                }
            }
            50..=59 => {
                let Some((&k, _)) = self.open.iter().next() else {
                    return;
                };
                let (cap, bytes) = self.open[&k].clone();
                let flags = FLAG_COMMIT
                    | if self.rng.random_bool(0.5) {
                        FLAG_SAFETY
                    } else {
                        0
                    };
                let r = self.store().commit(&cap, flags & FLAG_SAFETY, self.now);
                self.trace.push(format!("commit {k} flags {flags}: {r:?}"));
                match r {
                    Ok(()) => self.made(cap, flags, bytes),
                    Err(e) => self.violation(format!("commit failed: {e}")),
                }
            }
            60..=74 => {
                let Some(k) = self.pick_live() else {
                    return;
                };
                let cap = self.files[&k].0;
                let r = self.store().destroy(&cap);
                self.trace.push(format!("destroy {k}: {r:?}"));
                match r {
                    Ok(()) => self.files.get_mut(&k).unwrap().2 = Fate::Destroyed,
                    Err(e) => self.violation(format!("destroy failed: {e}")),
                }
            }
            75..=84 => {
                // Read a file back while running (the cache and the disk).
                if let Some(k) = self.pick_live() {
                    self.check_file(k, false);
                }
            }
            85..=91 => {
                let r = self.store().flush();
                self.trace.push(format!("sync: {r:?}"));
                match r {
                    Ok(()) => self.synced(),
                    Err(e) => self.violation(format!("sync failed: {e}")),
                }
            }
            92..=95 => {
                let r = self.store().compact();
                self.trace.push(format!("compact: {r:?}"));
                match r {
                    // Compaction flushes: everything so far is durable.
                    Ok(_) => self.synced(),
                    Err(e) => self.violation(format!("compact failed: {e}")),
                }
            }
            _ => {
                // A process kill: the page cache survives, the store's
                // unwritten records do not.
                self.trace.push("kill and reopen".into());
                self.reopen();
            }
        }
    }

    /// A committed file not destroyed, at random.
    fn pick_live(&mut self) -> Option<u64> {
        let live: Vec<u64> = self
            .files
            .iter()
            .filter(|f| f.1.2 != Fate::Destroyed)
            .map(|f| *f.0)
            .collect();
        (!live.is_empty()).then(|| live[self.rng.random_range(0..live.len())])
    }

    /// Checks file `k` reads back as the model says; `after_crash` allows
    /// files not known durable to be gone.
    fn check_file(&mut self, k: u64, after_crash: bool) {
        let (cap, bytes, fate) = self.files[&k].clone();
        self.report.files_checked += 1;
        match self.read_all(&cap) {
            Ok(got) if got == bytes => {
                if after_crash {
                    self.files.get_mut(&k).unwrap().2 = Fate::Durable;
                }
            }
            Ok(got) => self.violation(format!(
                "file {k} reads {} bytes that differ from the {} written",
                got.len(),
                bytes.len()
            )),
            Err(FileError::NotFound) if after_crash && fate != Fate::Durable => {
                self.files.remove(&k);
            }
            Err(FileError::Corrupt(_)) if self.rotted => {}
            Err(e) => self.violation(format!("file {k} ({fate:?}): {e}")),
        }
    }

    fn reopen(&mut self) {
        self.store = None;
        match Store::open(
            Disks {
                data: self.disks.0.clone(),
                meta: [self.disks.1.clone(), self.disks.2.clone()],
            },
            store_cfg(self.rng.random()),
        ) {
            Ok(s) => self.store = Some(s),
            Err(e) => {
                self.violation(format!("the store does not open after a crash: {e}"));
                return;
            }
        }
        if self.store().server_cap() != self.server {
            self.violation("the server's capability changed across a crash".into());
        }
        for (k, (cap, _)) in std::mem::take(&mut self.open) {
            if self.store().stat(&cap) != Err(FileError::NotFound) {
                self.violation(format!("uncommitted file {k} survived a crash"));
            }
        }
        let keys: Vec<u64> = self.files.keys().copied().collect();
        for k in keys {
            self.check_file(k, true);
        }
        // What survived is durable now (recovery wrote nothing new, and a
        // destroyed file that came back is a file again).
        for f in self.files.values_mut() {
            f.2 = Fate::Durable;
        }
        if let Answer::Report { problems, .. } = self.store().fsck()
            && !problems.is_empty()
            && !self.rotted
        {
            self.violation(format!("fsck after the crash: {problems:?}"));
        }
    }

    fn crash(&mut self) {
        self.report.crashes += 1;
        self.trace.push("POWER LOSS".into());
        // Whatever the store was doing is cut short: drop it, then the disks.
        self.store = None;
        let mut r = ChaCha8Rng::seed_from_u64(self.rng.random());
        self.disks.0.crash(&mut r);
        self.disks.1.crash(&mut r);
        self.disks.2.crash(&mut r);
        self.reopen();
    }

    fn rot(&mut self) {
        let Ok(len) = shoal_bullet::Disk::len(&self.disks.0) else {
            return;
        };
        if len == 0 {
            return;
        }
        let at = self.rng.random_range(0..len);
        self.trace.push(format!("bit rot at {at}"));
        self.disks.0.corrupt(at);
        self.rotted = true;
    }

    /// Runs the workload, then a last power loss and check.
    pub fn run(&mut self) -> BulletReport {
        for _ in 0..self.cfg.ops {
            self.step();
        }
        self.crash();
        std::mem::take(&mut self.report)
    }
}
