//! The half of `shoal bench file` that runs on n1: the measuring client,
//! commanded line by line by the driver (`super`).

use super::*;

/// Runs the agent.
pub fn agent(command: AgentCommand) -> Result<(), String> {
    match command {
        AgentCommand::Client => client_agent(),
    }
}

pub(super) struct ClientAgent {
    ctx: Context,
    /// Linearizable reads (as the command line's default).
    dir: Option<DirClient>,
    /// The directory the tmp-file names go to.
    tmpdir: Option<Capability>,
    main: Option<Capability>,
    small: Option<Capability>,
    /// Without a client cache: reads go to the server.
    files: FileClient,
    /// With a client cache (in the work directory).
    cached: Option<FileClient>,
    /// Where the local files and the client cache go.
    work: PathBuf,
    /// `BIG + PAD` random bytes; the first 8 are restamped for every
    /// new file (`stamp`), so no two files of a size hold the same bytes.
    pattern: Vec<u8>,
    /// Reused read buffer of the cycles.
    buf: Vec<u8>,
    /// The committed 100 MiB file of the read phase, on the main server,
    /// with its contents (`pattern[..BIG]` when it was made).
    big: Option<(Capability, Vec<u8>)>,
    made: u64,
}

pub(super) fn need<T: Copy>(v: &Option<T>, what: &str) -> Result<T, String> {
    v.ok_or_else(|| format!("{what}: run `open` first"))
}

pub(super) fn io(what: &str) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// The client agent's command loop.  Commands (one line each):
///
/// ```text
/// status SERVICE N        → {"replicas": [status or null; N]} (peer ports)
/// root SERVICE            → {"root": CAP}  a new directory on SERVICE
/// open ROOT WORK NAME CAP NAME CAP
///                         → {}  checks that the two servers are registered
///                           under ROOT's fileservers/ with these CAPs; makes
///                           ROOT/tmp-PID; local files and the cache go to WORK
/// cycles ROUNDS COUNTS    → {"sizes": [...], "mismatches"}  COUNTS: cycles
///                           per round of each size (comma-separated)
/// reads ROUNDS            → {"cached_mib_s", "local_mib_s", "remote_mib_s",
///                            "uncached_mib_s", ..., "mismatches"}
/// append N WARMUP         → {"us", "us_p99", "n", "mismatches"}
/// tmpfile N WARMUP ETCD   → {"shoal_us", "local_etcd_us", ..., "mismatches"}
/// ```
///
/// A failed command answers `{"error": "..."}`.
pub(super) fn client_agent() -> Result<(), String> {
    let ctx = Context::from_env().map_err(|e| e.to_string())?;
    let files = FileClient::new(&ctx).map_err(|e| e.to_string())?;
    let mut agent = ClientAgent {
        ctx,
        dir: None,
        tmpdir: None,
        main: None,
        small: None,
        files,
        cached: None,
        work: PathBuf::new(),
        pattern: Vec::new(),
        buf: Vec::new(),
        big: None,
        made: 0,
    };
    crate::agent::serve_commands(|words| agent.command(words));
    Ok(())
}

/// Fills `out` with pseudo-random bytes (splitmix64): the contents must
/// not compress or repeat, and need no cryptographic quality.
pub(super) fn fill_random(out: &mut [u8], seed: u64) {
    let mut x = seed;
    for chunk in out.chunks_mut(8) {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
    }
}

/// Reads `path` with a 1 MiB buffer, comparing every chunk with
/// `expected`; the time spent comparing is not counted.  Returns the
/// time and whether the bytes were right.
pub(super) fn local_read(
    path: &Path,
    expected: &[u8],
    buf: &mut [u8],
) -> Result<(Duration, bool), String> {
    let start = Instant::now();
    let mut comparing = Duration::ZERO;
    let mut f = File::open(path).map_err(io("local read"))?;
    let (mut at, mut ok) = (0usize, true);
    loop {
        let n = f.read(buf).map_err(io("local read"))?;
        if n == 0 {
            break;
        }
        let c = Instant::now();
        ok &= expected.get(at..at + n) == Some(&buf[..n]);
        at += n;
        comparing += c.elapsed();
    }
    drop(f);
    Ok((start.elapsed() - comparing, ok && at == expected.len()))
}

/// Reads the whole file `caps` through `files`, comparing every chunk
/// with `expected`; the time spent comparing is not counted.
pub(super) fn shoal_read(
    files: &mut FileClient,
    caps: &[Capability],
    expected: &[u8],
) -> Result<(Duration, bool), String> {
    let start = Instant::now();
    let mut comparing = Duration::ZERO;
    let (mut at, mut ok) = (0usize, true);
    files
        .read_with(caps, |chunk| {
            let c = Instant::now();
            ok &= expected.get(at..at + chunk.len()) == Some(chunk);
            at += chunk.len();
            comparing += c.elapsed();
            Ok(())
        })
        .map_err(|e| format!("read: {e}"))?;
    Ok((start.elapsed() - comparing, ok && at == expected.len()))
}

/// Writes `data` to a new file at `path` and fsyncs it.
pub(super) fn write_synced(path: &Path, data: &[u8]) -> Result<(), String> {
    let mut f = File::create(path).map_err(io("local write"))?;
    f.write_all(data).map_err(io("local write"))?;
    f.sync_all().map_err(io("local fsync"))
}

/// A figure of a server's statistics.
pub(super) fn figure(
    files: &mut FileClient,
    server: &Capability,
    name: &str,
) -> Result<f64, String> {
    match files.admin(server, AdminOp::Stats) {
        Ok(Answer::Report { figures, .. }) => figures
            .iter()
            .find(|f| f.0 == name)
            .map(|f| f.1 as f64)
            .ok_or_else(|| format!("server statistics without {name}")),
        Ok(a) => Err(format!("stats: unexpected answer {a:?}")),
        Err(e) => Err(format!("stats: {e}")),
    }
}

pub(super) fn mib_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

impl ClientAgent {
    fn command(&mut self, words: &[&str]) -> Result<Value, String> {
        let arg = |i: usize| crate::agent::arg(words, i);
        let num = |i: usize| crate::agent::num(words, i);
        match words[0] {
            "status" => {
                let list = replica_status(&self.ctx, arg(1)?, num(2)?)?;
                Ok(json!({ "replicas": list }))
            }
            "root" => self.root(arg(1)?),
            "open" => self.open(arg(1)?, arg(2)?, [(arg(3)?, arg(4)?), (arg(5)?, arg(6)?)]),
            "cycles" => {
                let counts: Vec<usize> = arg(2)?
                    .split(',')
                    .map(|c| c.parse().map_err(|e| format!("cycles: {e}")))
                    .collect::<Result<_, _>>()?;
                if counts.len() != SIZES.len() || counts.contains(&0) {
                    return Err(format!(
                        "cycles: {} counts of 1 or more wanted",
                        SIZES.len()
                    ));
                }
                if num(1)? == 0 {
                    return Err("cycles: 1 round or more wanted".into());
                }
                self.cycles(num(1)?, &counts)
            }
            "reads" => self.reads(num(1)?),
            "append" => self.append(num(1)?, num(2)?),
            "tmpfile" => self.tmpfile(num(1)?, num(2)?, arg(3)?),
            other => Err(format!("unknown command {other}")),
        }
    }

    fn dir(&mut self) -> Result<&mut DirClient, String> {
        self.dir.as_mut().ok_or_else(|| "run `open` first".into())
    }

    /// A new root directory on `service`, once the service answers.
    fn root(&mut self, service: &str) -> Result<Value, String> {
        let port = shoal_dirsvc::service_port(&self.ctx.config().cluster, service).put_port();
        let mut dir = DirClient::with_port(&self.ctx, port).map_err(|e| e.to_string())?;
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            match dir.create_dir(&["owner", "group", "other"]) {
                Ok(root) => return Ok(json!({ "root": root.to_string() })),
                Err(e) if Instant::now() > until => return Err(format!("create root: {e}")),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    fn open(
        &mut self,
        root: &str,
        work: &str,
        servers: [(&str, &str); 2],
    ) -> Result<Value, String> {
        let root: Capability = root.parse().map_err(|e| format!("root: {e}"))?;
        let mut dir = DirClient::with_port(&self.ctx, root.port()).map_err(|e| e.to_string())?;
        dir.linearizable(true);
        let registered = manager::servers(&mut dir, &root)?;
        let mut caps = Vec::new();
        for (name, cap) in servers {
            let cap: Capability = cap.parse().map_err(|e| format!("{name}: {e}"))?;
            match registered.iter().find(|(n, _)| n == name) {
                Some((_, c)) if *c == cap => caps.push(cap),
                Some(_) => {
                    return Err(format!(
                        "fileservers/{name} names another capability than the server printed"
                    ));
                }
                None => return Err(format!("no file server {name} in fileservers/")),
            }
        }
        let tmp = dir
            .create_dir(&["owner", "group", "other"])
            .map_err(|e| format!("mkdir tmp: {e}"))?;
        let masks = shoal_dir::model::directory_masks(3);
        let name = format!("tmp-{}", std::process::id());
        dir.append(&root, &name, &[tmp], Some(&masks))
            .map_err(|e| format!("enter tmp: {e}"))?;
        self.work = PathBuf::from(work);
        std::fs::create_dir_all(self.work.join("local")).map_err(io("work directory"))?;
        let cache = self.work.join("cache");
        self.cached = Some(
            FileClient::new(&self.ctx)
                .map_err(|e| e.to_string())?
                .with_cache(Some(Cache::new(&cache, CLIENT_CACHE))),
        );
        self.pattern = vec![0; BIG + PAD];
        fill_random(&mut self.pattern, u64::from(std::process::id()));
        self.buf = vec![0; BIG + PAD];
        self.dir = Some(dir);
        self.tmpdir = Some(tmp);
        self.main = Some(caps[0]);
        self.small = Some(caps[1]);
        Ok(json!({}))
    }

    /// Marks the pattern's first bytes with a new number.
    fn stamp(&mut self) {
        self.made += 1;
        self.pattern[..8].copy_from_slice(&self.made.to_le_bytes());
    }

    /// One create-read-destroy cycle of `size` bytes on the main server:
    /// the times of its three steps, and whether the bytes read back were
    /// those written.
    fn shoal_cycle(&mut self, size: usize) -> Result<([Duration; 3], bool), String> {
        let server = need(&self.main, "cycle")?;
        self.stamp();
        let data = &self.pattern[..size];
        let buf = &mut self.buf;
        let start = Instant::now();
        let cap = self
            .files
            .create(&server, data, true)
            .map_err(|e| format!("create: {e}"))?;
        let created = Instant::now();
        let mut at = 0usize;
        let mut fits = true;
        self.files
            .read_with(&[cap], |chunk| {
                match buf.get_mut(at..at + chunk.len()) {
                    Some(b) => b.copy_from_slice(chunk),
                    None => fits = false,
                }
                at += chunk.len();
                Ok(())
            })
            .map_err(|e| format!("read: {e}"))?;
        let read = Instant::now();
        self.files
            .destroy(&cap)
            .map_err(|e| format!("destroy: {e}"))?;
        let end = Instant::now();
        Ok((
            [created - start, read - created, end - read],
            fits && at == size && buf[..size] == *data,
        ))
    }

    /// The local twin: write + fsync, read (opened again), unlink.
    fn local_cycle(&mut self, size: usize) -> Result<([Duration; 3], bool), String> {
        self.stamp();
        let path = self.work.join("local").join("cycle");
        let data = &self.pattern[..size];
        let buf = &mut self.buf;
        let start = Instant::now();
        write_synced(&path, data)?;
        let written = Instant::now();
        let mut f = File::open(&path).map_err(io("local read"))?;
        let mut at = 0;
        loop {
            // One byte of room beyond the size: a longer file shows.
            let room = &mut buf[at..(size + 1).max(at)];
            if room.is_empty() {
                break;
            }
            match f.read(room).map_err(io("local read"))? {
                0 => break,
                n => at += n,
            }
        }
        drop(f);
        let read = Instant::now();
        std::fs::remove_file(&path).map_err(io("unlink"))?;
        let end = Instant::now();
        Ok((
            [written - start, read - written, end - read],
            at == size && buf[..size] == *data,
        ))
    }

    /// Cycles of every size, shoal and local, in interleaved rounds
    /// (round 0 the warm-up).  Answers, per size, the medians of the
    /// cycles and of their steps (shoal: create, read, destroy; local:
    /// write + fsync, read, unlink).
    fn cycles(&mut self, rounds: usize, counts: &[usize]) -> Result<Value, String> {
        // [size][shoal, local][whole, step 1, step 2, step 3]
        let mut samples: Vec<[[Vec<Duration>; 4]; 2]> =
            SIZES.iter().map(|_| Default::default()).collect();
        let mut mismatches = 0u64;
        for round in 0..=rounds {
            for (i, &(size, _)) in SIZES.iter().enumerate() {
                let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
                for side in order {
                    std::thread::sleep(SETTLE);
                    for _ in 0..counts[i] {
                        let (steps, ok) = if side == 0 {
                            self.shoal_cycle(size)?
                        } else {
                            self.local_cycle(size)?
                        };
                        mismatches += u64::from(!ok);
                        if round > 0 {
                            let out = &mut samples[i][side];
                            out[0].push(steps.iter().sum());
                            for (o, s) in out[1..].iter_mut().zip(steps) {
                                o.push(s);
                            }
                        }
                    }
                }
            }
        }
        let sizes: Vec<Value> = SIZES
            .iter()
            .zip(samples.iter_mut())
            .map(|(&(size, _), [shoal, local])| {
                let p50 = |v: &mut [Vec<Duration>; 4]| -> Vec<f64> {
                    v.iter_mut().map(|s| percentile_us(s, 50)).collect()
                };
                json!({
                    "size": size,
                    "n": shoal[0].len(),
                    "shoal_us": p50(shoal),
                    "local_us": p50(local),
                })
            })
            .collect();
        Ok(json!({ "sizes": sizes, "mismatches": mismatches }))
    }

    /// The 100 MiB reads.
    fn reads(&mut self, rounds: usize) -> Result<Value, String> {
        let (main, small) = (need(&self.main, "reads")?, need(&self.small, "reads")?);
        if rounds == 0 {
            return Err("reads: 1 round or more wanted".into());
        }
        if let Some((old, _)) = self.big.take() {
            let _ = self.files.destroy(&old);
        }
        self.stamp();
        let expected = self.pattern[..BIG].to_vec();
        let mut mismatches = 0u64;
        let big = self
            .files
            .create_from(&[main, small], &expected[..], true, |_| {})
            .map_err(|e| format!("create: {e}"))?;
        let (on_main, on_small) = (big[0], big[1]);
        let path = self.work.join("local").join("read");
        write_synced(&path, &expected)?;
        let mut buf = crate::PageBuf::new(1 << 20);
        let cached = self.cached.as_mut().ok_or("run `open` first")?;
        // Warm-up: fills the client cache, the server's extent cache, the
        // page cache; reads the small-cache server's copy once.
        for ok in [
            shoal_read(cached, &[on_main], &expected)?.1,
            shoal_read(&mut self.files, &[on_main], &expected)?.1,
            shoal_read(&mut self.files, &[on_small], &expected)?.1,
            local_read(&path, &expected, &mut buf)?.1,
        ] {
            mismatches += u64::from(!ok);
        }
        let copies = std::fs::read_dir(self.work.join("cache"))
            .map_err(io("client cache"))?
            .flatten()
            // (A copy ends with its digest, checked before each use.)
            .filter(|e| e.metadata().is_ok_and(|m| m.len() >= BIG as u64))
            .count();
        if copies == 0 {
            return Err("the client cache kept no copy of the 100 MiB file".into());
        }
        let hits0 = figure(&mut self.files, &main, "cache_hits")?;
        let misses0 = figure(&mut self.files, &small, "cache_misses")?;
        let mut times: [Vec<Duration>; 4] = Default::default();
        for round in 0..rounds {
            for k in 0..4 {
                let kind = (k + round) % 4;
                let (took, ok) = match kind {
                    0 => shoal_read(cached, &[on_main], &expected)?,
                    1 => local_read(&path, &expected, &mut buf)?,
                    2 => shoal_read(&mut self.files, &[on_main], &expected)?,
                    _ => shoal_read(&mut self.files, &[on_small], &expected)?,
                };
                mismatches += u64::from(!ok);
                times[kind].push(took);
            }
        }
        let hits = figure(&mut self.files, &main, "cache_hits")? - hits0;
        let misses = figure(&mut self.files, &small, "cache_misses")? - misses0;
        std::fs::remove_file(&path).map_err(io("unlink"))?;
        self.files
            .destroy(&on_small)
            .map_err(|e| format!("destroy: {e}"))?;
        self.big = Some((on_main, expected));
        let rate =
            |t: &mut Vec<Duration>| mib_s(BIG, Duration::from_secs_f64(percentile_us(t, 50) / 1e6));
        let n = rounds as f64;
        Ok(json!({
            "cached_mib_s": rate(&mut times[0]),
            "local_mib_s": rate(&mut times[1]),
            "remote_mib_s": rate(&mut times[2]),
            "uncached_mib_s": rate(&mut times[3]),
            // The cached client asks the main server for a stat per read, a
            // stat is no extent read: hits come from the remote reads.
            "remote_extent_hits_per_read": hits / n,
            "uncached_extent_misses_per_read": misses / n,
            "rounds": rounds,
            "mismatches": mismatches,
        }))
    }

    /// 4 KiB appended to the 100 MiB file, `warmup` untimed then `n` timed.
    fn append(&mut self, n: usize, warmup: usize) -> Result<Value, String> {
        if n == 0 {
            return Err("append: 1 or more wanted".into());
        }
        let (big, expected) = self.big.take().ok_or("run `reads` first")?;
        let mut times = Vec::with_capacity(n);
        let mut mismatches = 0u64;
        let mut last = None;
        for i in 0..warmup + n + 1 {
            let at = BIG + (i * 4099) % (PAD - APPEND);
            let data = self.pattern[at..at + APPEND].to_vec();
            let start = Instant::now();
            let new = self
                .files
                .edit(
                    &big,
                    Edit::Write {
                        offset: BIG as u64,
                        data: data.clone(),
                    },
                    true,
                    true,
                )
                .map_err(|e| format!("append: {e}"))?;
            let took = start.elapsed();
            if i >= warmup && i < warmup + n {
                times.push(took);
            }
            // The last 4 KiB of the old contents and the new ones.
            let tail = self
                .files
                .read(&new, (BIG - APPEND) as u64, 2 * APPEND as u32 + 1)
                .map_err(|e| format!("read: {e}"))?;
            let ok = tail.len() == 2 * APPEND
                && tail[..APPEND] == expected[BIG - APPEND..]
                && tail[APPEND..] == data[..];
            mismatches += u64::from(!ok);
            if i == warmup + n {
                last = Some((new, data));
            } else {
                self.files
                    .destroy(&new)
                    .map_err(|e| format!("destroy: {e}"))?;
            }
        }
        // The last version, read in full.
        let (new, data) = last.expect("made");
        let mut whole = expected.clone();
        whole.extend_from_slice(&data);
        let (_, ok) = shoal_read(&mut self.files, &[new], &whole)?;
        mismatches += u64::from(!ok);
        self.files
            .destroy(&new)
            .map_err(|e| format!("destroy: {e}"))?;
        self.big = Some((big, expected));
        Ok(json!({
            "us": percentile_us(&mut times, 50),
            "us_p99": percentile_us(&mut times, 99),
            "n": n,
            "mismatches": mismatches,
        }))
    }

    /// One tmp file on shoal: the time and whether the bytes were right.
    fn tmp_shoal(&mut self) -> Result<(Duration, bool), String> {
        let server = need(&self.main, "tmpfile")?;
        let tmpdir = need(&self.tmpdir, "tmpfile")?;
        self.made += 1;
        let name = format!("t{}", self.made);
        let data = (self.made as u32).to_le_bytes();
        let masks = shoal_dir::model::default_masks(3);
        let start = Instant::now();
        let cap = self
            .files
            .create(&server, &data, true)
            .map_err(|e| format!("create: {e}"))?;
        let dir = self.dir()?;
        dir.append(&tmpdir, &name, &[cap], Some(&masks))
            .map_err(|e| format!("append: {e}"))?;
        let caps = dir
            .lookup(&tmpdir, &name)
            .map_err(|e| format!("lookup: {e}"))?;
        let got = self
            .files
            .read_all(&caps)
            .map_err(|e| format!("read: {e}"))?;
        self.dir()?
            .delete(&tmpdir, &name)
            .map_err(|e| format!("delete: {e}"))?;
        self.files
            .destroy(&cap)
            .map_err(|e| format!("destroy: {e}"))?;
        let took = start.elapsed();
        Ok((took, got == data && caps.len() == 1))
    }

    /// One tmp file on the local disk, named by an etcd key.
    fn tmp_local(&mut self, kv: &mut Kv) -> Result<(Duration, bool), String> {
        self.made += 1;
        let data = (self.made as u32).to_le_bytes();
        let path = self.work.join("local").join(format!("t{}", self.made));
        let key = format!("shoal-bench/file/t{}", self.made).into_bytes();
        let value = path.to_string_lossy().into_owned().into_bytes();
        let start = Instant::now();
        write_synced(&path, &data)?;
        kv.put(&key, &value)?;
        let named = kv.get(&key)?;
        let mut got = Vec::new();
        File::open(&path)
            .and_then(|mut f| f.read_to_end(&mut got))
            .map_err(io("local read"))?;
        let deleted = kv.delete(&key)?;
        std::fs::remove_file(&path).map_err(io("unlink"))?;
        let took = start.elapsed();
        let ok = got == data && named == Some(value) && deleted == 1;
        Ok((took, ok))
    }

    /// The tmp-file experiment, shoal and local + etcd in interleaved
    /// rounds (round 0 the warm-up); each turn starts after a pause.
    fn tmpfile(&mut self, n: usize, warmup: usize, etcd: &str) -> Result<Value, String> {
        const ROUNDS: usize = 10;
        if n < ROUNDS {
            return Err(format!("tmpfile: {ROUNDS} or more wanted"));
        }
        let addr: SocketAddr = etcd.parse().map_err(|e| format!("etcd address: {e}"))?;
        let mut kv = Kv::connect(addr)?;
        const REWARM: usize = 5;
        let mut times: [Vec<Duration>; 2] = Default::default();
        let mut mismatches = 0u64;
        for round in 0..=ROUNDS {
            let (timed, untimed) = if round > 0 {
                (n / ROUNDS, REWARM)
            } else {
                (0, warmup)
            };
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for kind in order {
                std::thread::sleep(SETTLE);
                for i in 0..untimed + timed {
                    let (took, ok) = if kind == 0 {
                        self.tmp_shoal()?
                    } else {
                        self.tmp_local(&mut kv)?
                    };
                    mismatches += u64::from(!ok);
                    if i >= untimed {
                        times[kind].push(took);
                    }
                }
            }
        }
        let count = times[0].len();
        Ok(json!({
            "shoal_us": percentile_us(&mut times[0], 50),
            "shoal_us_p99": percentile_us(&mut times[0], 99),
            "local_etcd_us": percentile_us(&mut times[1], 50),
            "local_etcd_us_p99": percentile_us(&mut times[1], 99),
            "n": count,
            "mismatches": mismatches,
        }))
    }
}
