//! Random operations in the style of fsx against the tree mounted twice
//! (two nodes of one cluster), checked against a model after every step:
//! writes at random offsets (beyond the end too), appends, truncations,
//! whole-file replacements by rename, `fsync`s, and reads, each on a
//! random mount, through a fresh descriptor or through one held open
//! across steps, so that files go back and forth between cached
//! (sequential sharing) and uncached (concurrent write sharing); and, in
//! a directory, names made, removed, renamed (over others too), listed
//! and read, on either mount (names cached under tokens, change
//! notices).  Every
//! read and `stat` must say what the model says: a close on one node is
//! seen by the next open on the other, and a file written on both is read
//! in one order.  Halfway through, the primary is stopped: the mounts
//! reclaim their opens at the next one, and nothing changes for the
//! programs.  The run is seeded (1 by default, so `cargo xtask test` runs
//! the same steps each time); `SHOAL_FSX_SEED=N` runs another seed,
//! `SHOAL_FSX_SEED=random` a fresh one (printed, to replay), and
//! `SHOAL_FSX_OPS=N` sets the length.  Needs root and /dev/fuse.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_fssvc::MetaReplica;
use shoal_testnodes::fsx::differ;

mod common;

use common::Setup;

const FILES: usize = 3;
/// The largest offset written to, and the largest size truncated to.
const MAX: u64 = 192 << 10;
/// The largest write.
const WRITE_MAX: usize = 16 << 10;
/// The names steps choose from in directory `d`.
const NAMES: usize = 6;

struct Run {
    rng: ChaCha8Rng,
    /// The mounts' roots.
    roots: [PathBuf; 2],
    /// What each file holds.
    model: Vec<Vec<u8>>,
    /// Descriptors held open across steps, by mount and file.
    held: [Vec<Option<File>>; 2],
    /// The names in directory `d` and what their files hold.
    names: BTreeMap<String, Vec<u8>>,
    /// The steps so far, to show with a failure.
    log: Vec<String>,
}

impl Run {
    fn path(&self, m: usize, f: usize) -> PathBuf {
        self.roots[m].join(format!("f{f}"))
    }

    fn rw(p: &Path) -> File {
        OpenOptions::new().read(true).write(true).open(p).unwrap()
    }

    /// A descriptor of file `f` on mount `m`: a held one (opened if
    /// need be) or a fresh one (closed when dropped).
    fn with_file<T>(&mut self, m: usize, f: usize, held: bool, op: impl FnOnce(&File) -> T) -> T {
        if held {
            if self.held[m][f].is_none() {
                self.held[m][f] = Some(Run::rw(&self.path(m, f)));
            }
            op(self.held[m][f].as_ref().unwrap())
        } else {
            op(&Run::rw(&self.path(m, f)))
        }
    }

    fn check(&self, ok: bool, what: &str) {
        assert!(
            ok,
            "{what}\nsteps:\n{}\n(replay with SHOAL_FSX_SEED and the same SHOAL_FSX_OPS)",
            self.log.join("\n")
        );
    }

    fn step(&mut self) {
        let m = self.rng.random_range(0..2);
        let f = self.rng.random_range(0..FILES);
        let held = self.rng.random_bool(0.4);
        let len = self.model[f].len() as u64;
        if self.rng.random_bool(0.3) {
            return self.name_step(m);
        }
        match self.rng.random_range(0..9) {
            0 | 1 => {
                let off = self.rng.random_range(0..=(len + 4096).min(MAX));
                let n = self.rng.random_range(1..=WRITE_MAX);
                let data: Vec<u8> = (0..n).map(|_| self.rng.random()).collect();
                self.log
                    .push(format!("m{m} f{f} write {n} at {off} (held {held})"));
                self.with_file(m, f, held, |file| file.write_all_at(&data, off).unwrap());
                let model = &mut self.model[f];
                let end = off as usize + n;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&data);
            }
            2 => {
                let n = self.rng.random_range(1..=4096);
                let data: Vec<u8> = (0..n).map(|_| self.rng.random()).collect();
                self.log.push(format!("m{m} f{f} append {n}"));
                let mut file = OpenOptions::new()
                    .append(true)
                    .open(self.path(m, f))
                    .unwrap();
                file.write_all(&data).unwrap();
                self.model[f].extend_from_slice(&data);
            }
            3 | 4 => {
                let off = self.rng.random_range(0..=len);
                let n = self.rng.random_range(1..=(32usize << 10));
                self.log
                    .push(format!("m{m} f{f} read {n} at {off} (held {held})"));
                let mut got = vec![0u8; n];
                let read = self.with_file(m, f, held, |file| {
                    let mut done = 0;
                    while done < n {
                        match file.read_at(&mut got[done..], off + done as u64).unwrap() {
                            0 => break,
                            k => done += k,
                        }
                    }
                    done
                });
                let end = (off as usize + n).min(self.model[f].len());
                let want = &self.model[f][off as usize..end];
                self.check(
                    &got[..read] == want,
                    &format!("read of f{f} on m{m}: {}", differ(&got[..read], want)),
                );
            }
            5 => {
                let size = self.rng.random_range(0..=MAX);
                self.log
                    .push(format!("m{m} f{f} truncate to {size} (held {held})"));
                self.with_file(m, f, held, |file| file.set_len(size).unwrap());
                self.model[f].resize(size as usize, 0);
            }
            6 => {
                self.log.push(format!("m{m} f{f} stat and fsync"));
                let size = fs::metadata(self.path(m, f)).unwrap().len();
                self.check(size == len, &format!("size of f{f} on m{m}: {size}"));
                self.with_file(m, f, held, |file| file.sync_all().unwrap());
            }
            7 => {
                // Replaced whole by a rename: descriptors of the old
                // inode go first (they would read the old bytes).
                let n = self.rng.random_range(0..=(64usize << 10));
                let data: Vec<u8> = (0..n).map(|_| self.rng.random()).collect();
                self.log
                    .push(format!("m{m} f{f} replace with {n} by rename"));
                self.held[0][f] = None;
                self.held[1][f] = None;
                let tmp = self.roots[m].join("new");
                fs::write(&tmp, &data).unwrap();
                fs::rename(&tmp, self.path(m, f)).unwrap();
                self.model[f] = data;
            }
            _ => {
                self.log.push(format!("m{m} f{f} close held, read whole"));
                self.held[m][f] = None;
                let got = fs::read(self.path(m, f)).unwrap();
                self.check(
                    got == self.model[f],
                    &format!("f{f} read whole on m{m}: {}", differ(&got, &self.model[f])),
                );
            }
        }
    }
}

impl Run {
    /// A step on the names of directory `d`: made, removed, renamed (over
    /// another too), listed or read, on mount `m`.
    fn name_step(&mut self, m: usize) {
        let dir = self.roots[m].join("d");
        let pick = |rng: &mut ChaCha8Rng| format!("n{}", rng.random_range(0..NAMES));
        let name = pick(&mut self.rng);
        match self.rng.random_range(0..5) {
            0 => {
                let n = self.rng.random_range(0..64);
                let data: Vec<u8> = (0..n).map(|_| self.rng.random()).collect();
                self.log.push(format!("m{m} d/{name} written ({n})"));
                fs::write(dir.join(&name), &data).unwrap();
                self.names.insert(name, data);
            }
            1 => {
                self.log.push(format!("m{m} d/{name} removed"));
                let removed = fs::remove_file(dir.join(&name));
                let had = self.names.remove(&name).is_some();
                self.check(
                    removed.is_ok() == had,
                    &format!("unlink of d/{name} on m{m}: {removed:?}"),
                );
            }
            2 => {
                let to = pick(&mut self.rng);
                self.log.push(format!("m{m} d/{name} renamed to d/{to}"));
                let moved = fs::rename(dir.join(&name), dir.join(&to));
                self.check(
                    moved.is_ok() == self.names.contains_key(&name),
                    &format!("rename of d/{name} on m{m}: {moved:?}"),
                );
                if let Some(data) = self.names.remove(&name) {
                    self.names.insert(to, data);
                }
            }
            3 => {
                self.log.push(format!("m{m} d listed"));
                let mut got: Vec<String> = fs::read_dir(&dir)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect();
                got.sort();
                let want: Vec<String> = self.names.keys().cloned().collect();
                self.check(got == want, &format!("listing of d on m{m}: {got:?}"));
            }
            _ => {
                self.log.push(format!("m{m} d/{name} read"));
                let got = fs::read(dir.join(&name)).ok();
                self.check(
                    got.as_ref() == self.names.get(&name),
                    &format!("d/{name} on m{m}: {:?} bytes", got.map(|g| g.len())),
                );
            }
        }
    }
}

#[test]
fn random_operations_on_two_mounts_match_a_model() {
    let (seed, ops) = shoal_testnodes::fsx::seed_and_steps(1500);
    let Setup {
        nodes: _nodes,
        server,
        service,
        pa,
        pb,
        a,
        b,
    } = Setup::up("fs-fsx-test");
    for f in 0..FILES {
        fs::write(pa.join(format!("f{f}")), b"").unwrap();
    }
    fs::create_dir(pa.join("d")).unwrap();
    let mut run = Run {
        rng: ChaCha8Rng::seed_from_u64(seed),
        roots: [pa.clone(), pb.clone()],
        model: vec![Vec::new(); FILES],
        held: [
            (0..FILES).map(|_| None).collect(),
            (0..FILES).map(|_| None).collect(),
        ],
        names: BTreeMap::new(),
        log: Vec::new(),
    };
    let mut service: Vec<Option<MetaReplica>> = service.into_iter().map(Some).collect();
    for i in 0..ops {
        if i == ops / 2 {
            let first = service
                .iter()
                .position(|r| r.as_ref().is_some_and(|r| r.status()["primary"] == true))
                .expect("a primary");
            run.log.push(format!("the primary (replica {first}) stops"));
            service[first].take().unwrap().stop();
        }
        run.step();
    }
    // At the end, every file as the model says on both mounts.
    run.held = [Vec::new(), Vec::new()];
    for f in 0..FILES {
        for m in 0..2 {
            let got = fs::read(run.path(m, f)).unwrap();
            run.check(
                got == run.model[f],
                &format!("f{f} at the end on m{m}: {}", differ(&got, &run.model[f])),
            );
        }
    }
    a.stop().unwrap();
    b.stop().unwrap();
    for r in service.into_iter().flatten() {
        r.stop();
    }
    server.stop().unwrap();
}
