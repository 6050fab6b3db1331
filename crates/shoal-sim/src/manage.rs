//! The object manager's pass (`shoal_bullet::manage::Pass`, the core the
//! manager ships) over real file stores, a directory graph and a file
//! system's tree, while clients make, name, move and unname files, servers
//! go away and come back, replicas are lost, and listings and trees fail
//! to answer.  Every step of the pass is one step of the world, so the
//! clients' changes land between any two of its asks.
//!
//! Checks:
//! - **nothing named is destroyed**: after every ageing a server is asked
//!   for, every replica a directory entry or the tree names on it (and the
//!   files made but not named yet, within their time-to-live) still
//!   exists, unless the world itself lost it;
//! - **k replicas once faults heal**: after the faults stop and passes
//!   run, every entry names exactly k replicas on k servers, each holding
//!   the file's bytes;
//! - **what nothing names is reclaimed**: after that, every store holds
//!   only what is named.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_bullet::manage::{Ask, Heard, Listing, Pass, PassOptions};
use shoal_bullet::op::FLAG_COMMIT;
use shoal_bullet::{Disks, SimDisk, Store, StoreConfig};
use shoal_cap::{Capability, GetPort, ObjectId, ObjectSecret, Rights};
use shoal_proto::Time;

/// A scenario's shape.
#[derive(Debug, Clone)]
pub struct ManageSimConfig {
    pub servers: usize,
    pub k: usize,
    /// Ageing passes a file survives untouched.
    pub ttl: u8,
    /// Passes while faults and clients run, then passes after they stop.
    pub passes: usize,
    pub heal_passes: usize,
    /// Chances per step.
    pub make_chance: f64,
    pub unname_chance: f64,
    pub move_chance: f64,
    pub server_flip_chance: f64,
    pub lose_chance: f64,
    pub list_fail_chance: f64,
    pub tree_fail_chance: f64,
    /// Whether the pass verifies replicas.
    pub verify: bool,
}

impl Default for ManageSimConfig {
    fn default() -> Self {
        ManageSimConfig {
            servers: 4,
            k: 2,
            ttl: 4,
            passes: 12,
            heal_passes: 8,
            make_chance: 0.15,
            unname_chance: 0.03,
            move_chance: 0.01,
            server_flip_chance: 0.01,
            lose_chance: 0.01,
            list_fail_chance: 0.02,
            tree_fail_chance: 0.05,
            verify: false,
        }
    }
}

/// What a run did and found.
#[derive(Debug, Default, Clone)]
pub struct ManageReport {
    pub passes: usize,
    pub ages: u64,
    pub destroyed_by_age: u64,
    pub recreated: u64,
    pub made: u64,
    pub violations: Vec<String>,
}

/// Directories are objects of one port; the root is object 1.
const DIRS: u8 = 200;

struct Server {
    store: Store<SimDisk>,
    cap: Capability,
    up: bool,
}

/// The world the pass asks.
pub struct ManageSim {
    cfg: ManageSimConfig,
    rng: ChaCha8Rng,
    servers: Vec<Server>,
    /// Directory → its entries (name → replicas or a directory).
    dirs: BTreeMap<u64, BTreeMap<String, Vec<Capability>>>,
    /// The tree's contents: capabilities it names.
    tree: Vec<Vec<Capability>>,
    /// Files made and not named yet, with the passes begun at their
    /// making.
    pending: Vec<(Vec<Capability>, usize)>,
    /// Each file's bytes, by its first replica's object.
    bytes: BTreeMap<(usize, u64), Vec<u8>>,
    /// Replicas the world lost (a disk's failure), not the pass.
    lost: HashSet<Capability>,
    passes_begun: usize,
    faults: bool,
    now: Time,
    next_name: u64,
    report: ManageReport,
}

fn dir_cap(object: u64) -> Capability {
    Capability::mint(
        GetPort::from_bytes([DIRS; 16]).put_port(),
        ObjectId::new(object),
        Rights::ALL,
        &ObjectSecret::from_bytes([DIRS; 32]),
    )
}

impl ManageSim {
    pub fn new(seed: u64, cfg: ManageSimConfig) -> ManageSim {
        let servers = (0..cfg.servers)
            .map(|i| {
                let store = Store::format(
                    Disks {
                        data: SimDisk::new(),
                        meta: [SimDisk::new(), SimDisk::new()],
                    },
                    GetPort::from_bytes([i as u8 + 1; 16]),
                    StoreConfig {
                        ttl: cfg.ttl,
                        age_gap: Duration::ZERO,
                        cache_bytes: 1 << 20,
                        grow_step: 64 << 10,
                        seed: Some(seed ^ i as u64),
                        ..StoreConfig::default()
                    },
                )
                .expect("a store on fresh disks");
                let cap = store.server_cap();
                Server {
                    store,
                    cap,
                    up: true,
                }
            })
            .collect();
        let mut dirs = BTreeMap::new();
        dirs.insert(1, BTreeMap::new());
        for sub in 2..=4 {
            dirs.insert(sub, BTreeMap::new());
            dirs.get_mut(&1)
                .unwrap()
                .insert(format!("d{sub}"), vec![dir_cap(sub)]);
        }
        ManageSim {
            cfg,
            rng: ChaCha8Rng::seed_from_u64(seed),
            servers,
            dirs,
            tree: Vec::new(),
            pending: Vec::new(),
            bytes: BTreeMap::new(),
            lost: HashSet::new(),
            passes_begun: 0,
            faults: true,
            now: Time::ZERO,
            next_name: 0,
            report: ManageReport::default(),
        }
    }

    pub fn run(&mut self) -> ManageReport {
        for _ in 0..self.cfg.passes {
            self.pass();
        }
        // The faults heal and the clients stop: what is pending is named.
        self.faults = false;
        for s in &mut self.servers {
            s.up = true;
        }
        while let Some((caps, _)) = self.pending.pop() {
            self.name(caps);
        }
        for _ in 0..self.cfg.heal_passes {
            self.pass();
        }
        self.check_healed();
        std::mem::take(&mut self.report)
    }

    fn violation(&mut self, v: String) {
        if self.report.violations.len() < 8 {
            self.report.violations.push(v);
        }
    }

    fn server_of(&self, c: &Capability) -> Option<usize> {
        self.servers.iter().position(|s| s.cap.port() == c.port())
    }

    /// One pass, a world step before each ask.
    fn pass(&mut self) {
        self.passes_begun += 1;
        self.report.passes += 1;
        let servers = self
            .servers
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("fs{i}"), s.cap))
            .collect();
        let opts = PassOptions {
            k: self.cfg.k,
            verify: self.cfg.verify,
            age: true,
        };
        let mut pass = Pass::new(dir_cap(1), servers, opts);
        for _ in 0..1_000_000 {
            if self.faults {
                self.step();
            }
            self.now += Duration::from_millis(1);
            match pass.ask() {
                Ask::Done(r) => {
                    self.report.recreated += r.replicas_recreated;
                    return;
                }
                ask => {
                    let heard = self.answer(ask);
                    pass.heard(heard);
                }
            }
        }
        self.violation("a pass never ended".into());
    }

    /// Clients and faults between two asks.
    fn step(&mut self) {
        let r: f64 = self.rng.random();
        let c = &self.cfg;
        let mut p = 0.0;
        let mut hit = |chance: f64| {
            p += chance;
            r < p
        };
        if hit(c.make_chance) {
            self.make();
        } else if hit(c.unname_chance) {
            self.unname();
        } else if hit(c.move_chance) {
            self.move_entry();
        } else if hit(c.server_flip_chance) {
            let i = self.rng.random_range(0..self.servers.len());
            self.servers[i].up = !self.servers[i].up;
        } else if hit(c.lose_chance) {
            self.lose();
        }
        // A file made is named within the pass after the one it was made
        // in: its time-to-live outlasts that.
        let due: Vec<usize> = (0..self.pending.len())
            .filter(|i| self.passes_begun > self.pending[*i].1 + 1 || self.rng.random_bool(0.2))
            .collect();
        for i in due.into_iter().rev() {
            let (caps, _) = self.pending.remove(i);
            self.name(caps);
        }
    }

    /// A client stores a file on k servers that are up.
    fn make(&mut self) {
        let up: Vec<usize> = (0..self.servers.len())
            .filter(|i| self.servers[*i].up)
            .collect();
        if up.len() < self.cfg.k {
            return;
        }
        let start = self.rng.random_range(0..up.len());
        let len = self.rng.random_range(1..2000);
        let data: Vec<u8> = (0..len).map(|_| self.rng.random()).collect();
        let mut caps = Vec::new();
        for j in 0..self.cfg.k {
            let s = &self.servers[up[(start + j) % up.len()]];
            let c = s
                .store
                .create(&s.cap, FLAG_COMMIT, &data, self.now)
                .expect("a store takes a small file");
            caps.push(c);
        }
        let first = self.server_of(&caps[0]).unwrap();
        self.bytes.insert((first, caps[0].object().get()), data);
        self.report.made += 1;
        self.pending.push((caps, self.passes_begun));
    }

    /// A pending file named: in a directory, or in the tree.
    fn name(&mut self, caps: Vec<Capability>) {
        if self.rng.random_bool(0.25) {
            self.tree.push(caps);
            return;
        }
        let dir = self.rng.random_range(1..=4);
        self.next_name += 1;
        let name = format!("f{}", self.next_name);
        self.dirs.get_mut(&dir).unwrap().insert(name, caps);
    }

    /// A random file entry (directory, name).
    fn some_entry(&mut self) -> Option<(u64, String)> {
        let all: Vec<(u64, String)> = self
            .dirs
            .iter()
            .flat_map(|(d, e)| {
                e.keys()
                    .filter(|n| n.starts_with('f'))
                    .map(|n| (*d, n.clone()))
            })
            .collect();
        (!all.is_empty()).then(|| all[self.rng.random_range(0..all.len())].clone())
    }

    fn unname(&mut self) {
        if self.rng.random_bool(0.3) && !self.tree.is_empty() {
            let i = self.rng.random_range(0..self.tree.len());
            self.tree.remove(i);
        } else if let Some((d, n)) = self.some_entry() {
            self.dirs.get_mut(&d).unwrap().remove(&n);
        }
    }

    /// An entry moved to another directory (a rename).
    fn move_entry(&mut self) {
        if let Some((d, n)) = self.some_entry() {
            let caps = self.dirs.get_mut(&d).unwrap().remove(&n).unwrap();
            let to = self.rng.random_range(1..=4);
            self.dirs.get_mut(&to).unwrap().insert(n, caps);
        }
    }

    /// A server loses one replica (its disk's failure, not ageing).
    fn lose(&mut self) {
        // In one order (a set's is not), so the seed picks the same one.
        let mut named: Vec<Capability> = self.named().into_iter().collect();
        named.sort_by_key(|c| c.to_bytes());
        if named.is_empty() {
            return;
        }
        let c = named[self.rng.random_range(0..named.len())];
        if let Some(i) = self.server_of(&c)
            && self.servers[i].store.destroy(&c).is_ok()
        {
            self.lost.insert(c);
        }
    }

    /// Every replica named: by an entry, by the tree, or made and about to
    /// be named.
    fn named(&self) -> HashSet<Capability> {
        let mut out: HashSet<Capability> = HashSet::new();
        for entries in self.dirs.values() {
            for caps in entries.values() {
                out.extend(caps.iter().filter(|c| self.server_of(c).is_some()));
            }
        }
        for caps in self.tree.iter().chain(self.pending.iter().map(|p| &p.0)) {
            out.extend(caps.iter().copied());
        }
        out
    }

    fn up(&self, c: &Capability) -> Result<usize, String> {
        match self.server_of(c) {
            Some(i) if self.servers[i].up => Ok(i),
            Some(i) => Err(format!("fs{i} is away")),
            None => Err("no such server".into()),
        }
    }

    fn answer(&mut self, ask: Ask) -> Heard {
        match ask {
            Ask::List { dir } => {
                if self.faults && self.rng.random_bool(self.cfg.list_fail_chance) {
                    return Heard::Listed(Err("the directory service is away".into()));
                }
                let listing: Listing = self.dirs[&dir.object().get()]
                    .iter()
                    .map(|(n, c)| (n.clone(), Ok(c.clone())))
                    .collect();
                Heard::Listed(Ok(listing))
            }
            Ask::Touch { files } => Heard::Touched(
                self.up(&files[0])
                    .map(|i| self.servers[i].store.touch(&files, self.now)),
            ),
            Ask::Verify { file } => Heard::Verified(
                self.up(&file)
                    .map(|i| self.servers[i].store.verify(&file).is_ok()),
            ),
            Ask::Destroy { file } => Heard::Done(self.up(&file).and_then(|i| {
                self.servers[i]
                    .store
                    .destroy(&file)
                    .map_err(|e| e.to_string())
            })),
            Ask::Copy { from, to } => Heard::Copied(self.copy(&from, &to)),
            Ask::Replace {
                dir,
                name,
                old,
                new,
            } => {
                let entries = self.dirs.get_mut(&dir.object().get()).unwrap();
                Heard::Done(match entries.get_mut(&name) {
                    Some(caps) if *caps == old => {
                        // The file's bytes follow it under its new first
                        // replica.
                        *caps = new.clone();
                        self.follow(&old, &new);
                        Ok(())
                    }
                    _ => Err("the entry changed".into()),
                })
            }
            Ask::Trees => Heard::Trees(Ok(vec!["fs".into()])),
            Ask::TouchTree { .. } => {
                if self.faults && self.rng.random_bool(self.cfg.tree_fail_chance) {
                    return Heard::TreeTouched(Err("its primary is away".into()));
                }
                let (mut touched, mut missing) = (0, 0);
                for c in self.tree.iter().flatten() {
                    if let Some(i) = self.server_of(c)
                        && self.servers[i].up
                    {
                        if self.servers[i].store.touch(&[*c], self.now)[0] {
                            touched += 1;
                        } else {
                            missing += 1;
                        }
                    }
                }
                Heard::TreeTouched(Ok((touched, missing)))
            }
            Ask::Age { server } => {
                let heard = self.up(&server).map(|i| {
                    let n = self.servers[i].store.age_when_due(self.now);
                    (n.is_some(), n.unwrap_or(0) as u64)
                });
                if let Ok((_, n)) = &heard {
                    self.report.ages += 1;
                    self.report.destroyed_by_age += n;
                    let i = self.server_of(&server).unwrap();
                    self.check_aged(i);
                }
                Heard::Aged(heard)
            }
            Ask::Done(_) => unreachable!("answered by the pass"),
        }
    }

    /// The pass's copy: the bytes of a live replica, stored committed on
    /// each target.
    fn copy(&mut self, from: &[Capability], to: &[Capability]) -> Result<Vec<Capability>, String> {
        let source = from
            .iter()
            .find_map(|c| {
                let i = self.up(c).ok()?;
                let s = &self.servers[i].store;
                let size = s.stat(c).ok()?.size;
                let mut out = Vec::new();
                s.read_into(c, 0, size as u32, &mut out).ok()?;
                Some(out)
            })
            .ok_or("no live replica answers")?;
        let mut made = Vec::new();
        for t in to {
            let i = self.up(t)?;
            let s = &self.servers[i];
            made.push(
                s.store
                    .create(&s.cap, FLAG_COMMIT, &source, self.now)
                    .map_err(|e| e.to_string())?,
            );
        }
        Ok(made)
    }

    /// Keeps a file's bytes under its entry's new first replica.
    fn follow(&mut self, old: &[Capability], new: &[Capability]) {
        let key = |sim: &Self, c: &Capability| (sim.server_of(c).unwrap(), c.object().get());
        let bytes = old
            .iter()
            .find_map(|c| self.bytes.get(&key(self, c)).cloned());
        if let (Some(b), Some(first)) = (bytes, new.first()) {
            let k = key(self, first);
            self.bytes.insert(k, b);
        }
    }

    /// After server `i` aged: everything named on it is still there.
    fn check_aged(&mut self, i: usize) {
        let gone: Vec<Capability> = self
            .named()
            .into_iter()
            .filter(|c| self.server_of(c) == Some(i) && !self.lost.contains(c))
            .filter(|c| self.servers[i].store.stat(c).is_err())
            .collect();
        for c in gone {
            self.violation(format!(
                "pass {}: fs{i} destroyed a named replica (object {})",
                self.passes_begun,
                c.object().get()
            ));
        }
    }

    /// After the heal: k replicas per entry, each with the file's bytes;
    /// nothing unnamed left.
    fn check_healed(&mut self) {
        let k = self.cfg.k;
        let mut problems = Vec::new();
        for (d, entries) in &self.dirs {
            for (name, caps) in entries.iter().filter(|(n, _)| n.starts_with('f')) {
                // The world lost every replica: nothing could keep it.
                if caps.iter().all(|c| self.lost.contains(c)) {
                    continue;
                }
                let servers: BTreeSet<usize> =
                    caps.iter().filter_map(|c| self.server_of(c)).collect();
                if caps.len() != k || servers.len() != k {
                    problems.push(format!(
                        "{d}/{name}: {} replicas on {} servers",
                        caps.len(),
                        servers.len()
                    ));
                    continue;
                }
                let want = caps
                    .iter()
                    .find_map(|c| self.bytes.get(&(self.server_of(c)?, c.object().get())));
                for c in caps {
                    let s = &self.servers[self.server_of(c).unwrap()].store;
                    let mut out = Vec::new();
                    let read = s
                        .stat(c)
                        .and_then(|st| s.read_into(c, 0, st.size as u32, &mut out));
                    if read.is_err() || want.is_some_and(|w| *w != out) {
                        problems.push(format!(
                            "{d}/{name}: a replica does not hold the file ({read:?})"
                        ));
                    }
                }
            }
        }
        let named = self.named();
        for (i, s) in self.servers.iter().enumerate() {
            let files = match s.store.stats() {
                shoal_bullet::Answer::Report { figures, .. } => {
                    figures.iter().find(|f| f.0 == "files").map_or(0, |f| f.1)
                }
                _ => 0,
            };
            let kept = named
                .iter()
                .filter(|c| self.server_of(c) == Some(i) && s.store.stat(c).is_ok())
                .count() as u64;
            if files > kept {
                problems.push(format!(
                    "fs{i} still holds {} files nothing names",
                    files - kept
                ));
            }
        }
        for p in problems {
            self.violation(p);
        }
    }
}
