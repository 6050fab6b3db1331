//! The object manager's pass (`docs/files.md`, "The object manager") as a
//! state machine without I/O: [`Pass::ask`] says what to ask of the
//! directory service, the file servers or a file system, and
//! [`Pass::heard`] takes the answer, until [`Ask::Done`] gives the
//! report.  The manager's process (`shoal_bulletsvc::manager::pass`) and the
//! simulator drive this same code.
//!
//! A pass walks every directory reachable from the root, touches every
//! replica an entry names (one batch per server), brings each file named
//! only by file server capabilities back to k replicas on distinct
//! servers (a copy from a live replica, then a compare-and-swap of the
//! entry), has every file system's tree touch the contents it holds, and
//! then, only if nothing named went untouched, asks every server it could
//! touch to age.  The rule that makes it safe: **a server ages only when
//! a complete pass asks it**, so a file something names is never
//! destroyed for want of a touch.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use shoal_cap::{Capability, PutPort};

/// Options of a pass.
#[derive(Debug, Clone)]
pub struct PassOptions {
    /// Replicas each file should have.
    pub k: usize,
    /// Read every replica in full (the servers verify checksums).
    pub verify: bool,
    /// Ask every server for an ageing pass afterwards.
    pub age: bool,
}

/// What a pass found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassReport {
    pub directories: u64,
    pub files: u64,
    pub replicas_touched: u64,
    pub replicas_missing: u64,
    pub replicas_recreated: u64,
    pub replicas_corrupt: u64,
    pub servers_unreachable: Vec<String>,
    /// Each registered file system's tree: contents touched and missing.
    pub trees: Vec<(String, u64, u64)>,
    /// Servers that ran an ageing pass (others ran one too lately, or the
    /// pass did not age: see `problems`).
    pub servers_aged: u64,
    pub destroyed_by_age: u64,
    /// Files that could not be brought back to k replicas, and why.
    pub problems: Vec<String>,
}

/// What the pass needs done next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// Every name in directory `dir` and the capabilities each names:
    /// answer [`Heard::Listed`].
    List { dir: Capability },
    /// Touch `files`, all on one server: [`Heard::Touched`].
    Touch { files: Vec<Capability> },
    /// Read `file` in full from its server's disk: [`Heard::Verified`].
    Verify { file: Capability },
    /// Destroy `file` (a corrupt replica): [`Heard::Done`].
    Destroy { file: Capability },
    /// Copy the file of replicas `from` to each of `to` (servers):
    /// [`Heard::Copied`].
    Copy {
        from: Vec<Capability>,
        to: Vec<Capability>,
    },
    /// Replace entry `name` of `dir` from `old` to `new`, only if it is
    /// still `old`: [`Heard::Done`].
    Replace {
        dir: Capability,
        name: String,
        old: Vec<Capability>,
        new: Vec<Capability>,
    },
    /// The names of the registered file systems: [`Heard::Trees`].
    Trees,
    /// Have file system `name` touch what its tree holds:
    /// [`Heard::TreeTouched`].
    TouchTree { name: String },
    /// Ask `server` for an ageing pass: [`Heard::Aged`].
    Age { server: Capability },
    /// The pass is over.
    Done(PassReport),
}

/// A directory's names, each with the capabilities it names (or why its
/// lookup failed).
pub type Listing = Vec<(String, Result<Vec<Capability>, String>)>;

/// The answer to an [`Ask`]; an error is said in a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// Each name, with what it names (an error: the lookup failed).
    Listed(Result<Listing, String>),
    /// Whether each file touched exists.
    Touched(Result<Vec<bool>, String>),
    /// `Ok(false)`: the replica is corrupt; errors other than corruption
    /// keep the replica.
    Verified(Result<bool, String>),
    Copied(Result<Vec<Capability>, String>),
    Trees(Result<Vec<String>, String>),
    /// Contents touched and missing.
    TreeTouched(Result<(u64, u64), String>),
    /// Whether the server aged, and how many files it destroyed.
    Aged(Result<(bool, u64), String>),
    Done(Result<(), String>),
}

/// An entry naming a file: the replicas it names.
#[derive(Debug, Clone)]
struct Row {
    dir: Capability,
    name: String,
    caps: Vec<Capability>,
}

/// The repair of one row, step by step.
#[derive(Debug)]
struct Repair {
    row: Row,
    live: Vec<Capability>,
    /// With `verify`: replicas still to read.
    unverified: VecDeque<Capability>,
    /// A corrupt replica to destroy.
    corrupt: Option<Capability>,
    /// Whether the copy was asked.
    copied: bool,
}

#[derive(Debug)]
enum Phase {
    Walk,
    Touch,
    Repair,
    Trees,
    TouchTrees(VecDeque<String>),
    Age(VecDeque<(String, Capability)>),
    Over,
}

/// One pass, from the root directory over the registered servers.
#[derive(Debug)]
pub struct Pass {
    opts: PassOptions,
    root: Capability,
    servers: Vec<(String, Capability)>,
    by_port: BTreeMap<PutPort, usize>,
    report: PassReport,
    /// Whether everything named was touched: only then may servers age.
    complete: bool,
    phase: Phase,
    queue: VecDeque<Capability>,
    seen: BTreeSet<u64>,
    /// The directory being listed.
    listing: Option<Capability>,
    rows: VecDeque<Row>,
    /// Every file capability some entry names, by server.
    named: BTreeMap<PutPort, Vec<Capability>>,
    /// The server being touched, and those touched (or tried).
    touching: Option<PutPort>,
    touched: BTreeSet<PutPort>,
    alive: BTreeSet<(PutPort, u64)>,
    unreachable: BTreeSet<PutPort>,
    repair: Option<Repair>,
}

impl Pass {
    /// A pass from directory `root` over `servers` (name, capability).
    pub fn new(root: Capability, servers: Vec<(String, Capability)>, opts: PassOptions) -> Pass {
        let by_port = servers
            .iter()
            .enumerate()
            .map(|(i, (_, c))| (c.port(), i))
            .collect();
        Pass {
            opts,
            root,
            servers,
            by_port,
            report: PassReport::default(),
            complete: true,
            phase: Phase::Walk,
            queue: VecDeque::from([root]),
            seen: BTreeSet::from([root.object().get()]),
            listing: None,
            rows: VecDeque::new(),
            named: BTreeMap::new(),
            touching: None,
            touched: BTreeSet::new(),
            alive: BTreeSet::new(),
            unreachable: BTreeSet::new(),
            repair: None,
        }
    }

    /// What to ask next (the same until it is [`Pass::heard`]).
    pub fn ask(&mut self) -> Ask {
        loop {
            match &mut self.phase {
                Phase::Walk => {
                    if let Some(dir) = self.listing {
                        return Ask::List { dir };
                    }
                    match self.queue.pop_front() {
                        Some(dir) => {
                            self.report.directories += 1;
                            self.listing = Some(dir);
                        }
                        None => {
                            self.report.files = self.rows.len() as u64;
                            self.phase = Phase::Touch;
                        }
                    }
                }
                Phase::Touch => {
                    if let Some(port) = self.touching {
                        return Ask::Touch {
                            files: self.named[&port].clone(),
                        };
                    }
                    match self.named.keys().find(|p| !self.touched.contains(*p)) {
                        Some(port) => self.touching = Some(*port),
                        None => self.phase = Phase::Repair,
                    }
                }
                Phase::Repair => {
                    if self.repair.is_none() {
                        match self.rows.pop_front() {
                            Some(row) => self.repair = Some(self.start_repair(row)),
                            None => {
                                self.phase = Phase::Trees;
                                continue;
                            }
                        }
                    }
                    if let Some(ask) = self.repair_step() {
                        return ask;
                    }
                    self.repair = None;
                }
                Phase::Trees => return Ask::Trees,
                Phase::TouchTrees(names) => match names.front() {
                    Some(name) => return Ask::TouchTree { name: name.clone() },
                    None => self.phase = self.ageing(),
                },
                Phase::Age(servers) => match servers.front() {
                    Some((_, server)) => return Ask::Age { server: *server },
                    None => self.phase = Phase::Over,
                },
                Phase::Over => return Ask::Done(self.report.clone()),
            }
        }
    }

    /// The answer to what [`Pass::ask`] asked.
    pub fn heard(&mut self, heard: Heard) {
        match (&mut self.phase, heard) {
            (Phase::Walk, Heard::Listed(listed)) => {
                let dir = self.listing.take().expect("a listing was asked");
                self.listed(dir, listed);
            }
            (Phase::Touch, Heard::Touched(flags)) => {
                let port = self.touching.take().expect("a touch was asked");
                match flags {
                    Ok(flags) => {
                        for (c, ok) in self.named[&port].iter().zip(flags) {
                            if ok {
                                self.alive.insert((port, c.object().get()));
                                self.report.replicas_touched += 1;
                            } else {
                                self.report.replicas_missing += 1;
                            }
                        }
                    }
                    Err(_) => {
                        self.unreachable.insert(port);
                        // Not asked to age either: what it holds waits.
                        let name = self.servers[self.by_port[&port]].0.clone();
                        self.report.servers_unreachable.push(name);
                    }
                }
                self.touched.insert(port);
            }
            (Phase::Repair, heard) => self.repair_heard(heard),
            (Phase::Trees, Heard::Trees(names)) => match names {
                Ok(names) => self.phase = Phase::TouchTrees(names.into()),
                Err(e) => {
                    self.problem(format!("the file systems could not be listed ({e})"));
                    self.complete = false;
                    self.phase = self.ageing();
                }
            },
            (Phase::TouchTrees(names), Heard::TreeTouched(r)) => {
                let name = names.pop_front().expect("a tree was asked");
                match r {
                    Ok((touched, missing)) => self.report.trees.push((name, touched, missing)),
                    Err(e) => {
                        self.problem(format!(
                            "file system {name}: its tree's contents could not be touched ({e})"
                        ));
                        self.complete = false;
                    }
                }
            }
            (Phase::Age(servers), Heard::Aged(r)) => {
                let (name, _) = servers.pop_front().expect("an ageing was asked");
                match r {
                    Ok((aged, destroyed)) => {
                        self.report.servers_aged += u64::from(aged);
                        self.report.destroyed_by_age += destroyed;
                    }
                    Err(_) => self.report.servers_unreachable.push(name),
                }
            }
            (phase, heard) => panic!("{heard:?} heard in phase {phase:?}"),
        }
    }

    fn problem(&mut self, p: String) {
        self.report.problems.push(p);
    }

    fn listed(&mut self, dir: Capability, listed: Result<Listing, String>) {
        let entries = match listed {
            Ok(entries) => entries,
            Err(e) => {
                self.problem(format!("a directory could not be listed: {e}"));
                self.complete = false;
                return;
            }
        };
        for (name, caps) in entries {
            let caps = match caps {
                Ok(caps) => caps,
                Err(e) => {
                    self.problem(format!("{name}: could not be looked up ({e})"));
                    self.complete = false;
                    continue;
                }
            };
            for c in &caps {
                if c.port() == self.root.port() && self.seen.insert(c.object().get()) {
                    self.queue.push_back(*c);
                }
            }
            let files: Vec<Capability> = caps
                .iter()
                .filter(|c| self.by_port.contains_key(&c.port()) && c.object().get() != 0)
                .copied()
                .collect();
            // Every replica named is touched; only entries made of
            // replicas alone are repaired.
            for c in &files {
                self.named.entry(c.port()).or_default().push(*c);
            }
            if !files.is_empty() && files.len() == caps.len() {
                self.rows.push_back(Row {
                    dir,
                    name,
                    caps: files,
                });
            }
        }
    }

    fn start_repair(&self, row: Row) -> Repair {
        let live: Vec<Capability> = row
            .caps
            .iter()
            .filter(|c| self.alive.contains(&(c.port(), c.object().get())))
            .copied()
            .collect();
        Repair {
            unverified: if self.opts.verify {
                live.iter().copied().collect()
            } else {
                VecDeque::new()
            },
            live: if self.opts.verify { Vec::new() } else { live },
            row,
            corrupt: None,
            copied: false,
        }
    }

    /// The next ask of the row's repair, or `None` when it is over.
    fn repair_step(&mut self) -> Option<Ask> {
        let k = self.opts.k;
        let reachable: Vec<Capability> = self.reachable().map(|(_, c)| c).collect();
        let r = self.repair.as_mut().expect("a repair");
        if let Some(file) = r.corrupt {
            return Some(Ask::Destroy { file });
        }
        if let Some(file) = r.unverified.front() {
            return Some(Ask::Verify { file: *file });
        }
        if !r.copied {
            if r.live.len() >= k && r.live.len() == r.row.caps.len() {
                return None;
            }
            if r.live.is_empty() {
                let p = format!("{}: no replica is reachable or intact", r.row.name);
                self.problem(p);
                return None;
            }
            r.copied = true;
            let want = k.saturating_sub(r.live.len());
            let used: BTreeSet<PutPort> = r.row.caps.iter().map(|c| c.port()).collect();
            let to: Vec<Capability> = reachable
                .into_iter()
                .filter(|c| !used.contains(&c.port()))
                .take(want)
                .collect();
            if to.len() < want {
                let p = format!(
                    "{}: {} replicas alive, {k} wanted, and only {} other servers answer",
                    r.row.name,
                    r.live.len(),
                    to.len()
                );
                self.report.problems.push(p);
            }
            if !to.is_empty() {
                return Some(Ask::Copy {
                    from: r.live.clone(),
                    to,
                });
            }
        }
        let r = self.repair.as_mut().expect("a repair");
        if r.live != r.row.caps {
            let new = std::mem::take(&mut r.live);
            return Some(Ask::Replace {
                dir: r.row.dir,
                name: r.row.name.clone(),
                old: std::mem::replace(&mut r.row.caps, new.clone()),
                new,
            });
        }
        None
    }

    fn repair_heard(&mut self, heard: Heard) {
        let r = self.repair.as_mut().expect("a repair");
        match heard {
            Heard::Verified(v) => {
                let file = r.unverified.pop_front().expect("a verify was asked");
                match v {
                    // Destroyed next; the entry loses it.
                    Ok(false) => {
                        r.corrupt = Some(file);
                        self.report.replicas_corrupt += 1;
                    }
                    _ => r.live.push(file),
                }
            }
            Heard::Copied(Ok(made)) => {
                self.report.replicas_recreated += made.len() as u64;
                r.live.extend(made);
            }
            Heard::Copied(Err(e)) => {
                let p = format!("{}: copy failed: {e}", r.row.name);
                self.repair = None;
                self.problem(p);
            }
            // A corrupt replica destroyed (or not: it ages away).
            Heard::Done(_) if r.corrupt.is_some() => r.corrupt = None,
            Heard::Done(Ok(())) => {
                // The entry now names what it should: the repair is over.
                self.repair = None;
            }
            Heard::Done(Err(e)) => {
                let p = format!(
                    "{}: entry changed meanwhile ({e}); will retry next pass",
                    r.row.name
                );
                self.repair = None;
                self.problem(p);
            }
            other => panic!("{other:?} heard while repairing"),
        }
    }

    /// Servers this pass could touch.
    fn reachable(&self) -> impl Iterator<Item = (String, Capability)> + '_ {
        self.servers
            .iter()
            .filter(|(_, c)| !self.unreachable.contains(&c.port()))
            .cloned()
    }

    /// The ageing phase: every reachable server, if the pass was complete.
    fn ageing(&mut self) -> Phase {
        if !self.opts.age {
            return Phase::Over;
        }
        if !self.complete {
            self.problem("no ageing this pass: not everything named was touched".into());
            return Phase::Over;
        }
        Phase::Age(self.reachable().collect())
    }
}

#[cfg(test)]
mod tests;
