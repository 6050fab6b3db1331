//! Keeping a store: ageing, flushing and checkpointing its metadata, its
//! figures, `fsck` and compaction (`super`).

use super::*;

impl<D: Disk> Store<D> {
    /// The ageing pass a manager asks for at `now`, after touching what
    /// it found named: run unless the last one ran less than the gap ago
    /// (then `None`).  The server never ages on its own: a file something
    /// names dies only if no pass touched it in `ttl` passes that did.
    pub fn age_when_due(&self, now: Time) -> Option<usize> {
        {
            let mut g = self.inner.lock();
            if g.aged
                .is_some_and(|t| now.saturating_since(t) < self.cfg.age_gap)
            {
                return None;
            }
            g.aged = Some(now);
        }
        Some(self.age())
    }

    /// One ageing pass: every committed file's time-to-live drops by one;
    /// files that reach zero are destroyed.  Returns how many were.
    pub fn age(&self) -> usize {
        let mut g = self.inner.lock();
        let mut dead = Vec::new();
        for (&k, f) in g.files.iter_mut() {
            if f.committed {
                f.ttl = f.ttl.saturating_sub(1);
                if f.ttl == 0 {
                    dead.push(k);
                }
            }
        }
        // In one order (the map's is not), so the space freed is reused
        // alike on every run of a seed.
        dead.sort_unstable();
        for &obj in &dead {
            g.destroy(obj);
        }
        g.destroyed_by_age += dead.len() as u64;
        dead.len()
    }

    /// Makes everything appended so far durable.
    pub fn flush(&self) -> Result<(), FileError> {
        let _f = self.flushing.lock();
        self.flush_locked()
    }

    /// Returns once record `lsn` is durable (flushing if no one else is).
    pub(super) fn sync_to(&self, lsn: u64) -> Result<(), FileError> {
        if self.inner.lock().durable >= lsn {
            return Ok(());
        }
        let _f = self.flushing.lock();
        if self.inner.lock().durable >= lsn {
            return Ok(());
        }
        self.flush_locked()
    }

    pub(super) fn flush_locked(&self) -> Result<(), FileError> {
        let (records, target, generation, tail, made, active) = {
            let mut g = self.inner.lock();
            if g.log.is_empty() {
                let a = g.appended;
                g.release(a);
                return Ok(());
            }
            (
                std::mem::take(&mut g.log),
                g.appended,
                g.generation,
                g.tail,
                g.made,
                g.active,
            )
        };
        // Rule 1: the new extents are durable before the records naming
        // them, by a sync of the data disk, or (small commits) by their
        // bytes in the records themselves, one sync in all.
        let inline = self.with_bytes(&records);
        let mut buf = Vec::new();
        for r in inline.as_ref().unwrap_or(&records) {
            let at = tail + buf.len() as u64;
            buf.extend(r.encode(generation, at));
        }
        let data_synced = match inline {
            Some(_) => Ok(()),
            None => self.disks.data.sync(),
        };
        let end = tail + buf.len() as u64;
        // Past the zeros made so far: the next step's zeros go with the
        // records, made durable by the same sync.
        let now_made = if end > made {
            let to = end.next_multiple_of(META_AHEAD);
            buf.resize((to - tail) as usize, 0);
            to
        } else {
            made
        };
        let written = data_synced
            .and_then(|_| self.disks.meta[active].write_at(&buf, tail))
            .and_then(|_| self.disks.meta[active].sync());
        let mut g = self.inner.lock();
        if let Err(e) = written {
            // Put the records back for the next attempt (at the same tail).
            let later = std::mem::replace(&mut g.log, records);
            g.log.extend(later);
            return Err(e.into());
        }
        g.tail = end;
        g.made = now_made;
        g.release(target);
        let big = g.tail > self.cfg.checkpoint_after;
        drop(g);
        if big {
            self.checkpoint_locked()?;
        }
        Ok(())
    }

    /// `records` with each commit's new extents' bytes before it, if
    /// they are few ([`INLINE_BYTES`] in all), no record moves an extent,
    /// and each reads back as its checksum says; else `None` (the data
    /// disk is synced instead).  Compaction, the only mover of extents,
    /// holds `flushing` too, so the offsets stay true while they are read.
    fn with_bytes(&self, records: &[Record]) -> Option<Vec<Record>> {
        let mut total = 0u64;
        for r in records {
            match r {
                Record::Commit { extents, .. } => {
                    total += extents.iter().map(|e| e.len as u64).sum::<u64>();
                }
                Record::Move { .. } => return None,
                Record::Destroy { .. } | Record::Bytes { .. } => {}
            }
        }
        if total > INLINE_BYTES {
            return None;
        }
        let mut out = Vec::with_capacity(records.len());
        for r in records {
            if let Record::Commit { extents, .. } = r {
                for e in extents {
                    let mut data = vec![0u8; e.len as usize];
                    self.disks.data.read_at(&mut data, e.off).ok()?;
                    if *blake3::hash(&data).as_bytes() != e.hash {
                        return None;
                    }
                    out.push(Record::Bytes { extent: e.id, data });
                }
            }
            out.push(r.clone());
        }
        Some(out)
    }

    /// Writes a new snapshot into the other metadata file (the caller
    /// holds `flushing`).
    pub(super) fn checkpoint_locked(&self) -> Result<(), FileError> {
        let (snap, records, target, generation, other) = {
            let mut g = self.inner.lock();
            (
                g.snapshot(&self.port, &self.server_secret),
                std::mem::take(&mut g.log),
                g.appended,
                g.generation + 1,
                1 - g.active,
            )
        };
        let bytes = snap.encode(generation);
        let d = &self.disks.meta[other];
        let written = self
            .disks
            .data
            .sync()
            .and_then(|_| d.write_at(&bytes, 0))
            .and_then(|_| d.set_len(bytes.len() as u64))
            .and_then(|_| d.sync());
        let mut g = self.inner.lock();
        if let Err(e) = written {
            let later = std::mem::replace(&mut g.log, records);
            g.log.extend(later);
            return Err(e.into());
        }
        g.active = other;
        g.generation = generation;
        g.tail = bytes.len() as u64;
        g.made = g.tail;
        g.release(target);
        Ok(())
    }

    /// Writes a checkpoint now (compaction does, to shrink the metadata).
    pub fn checkpoint(&self) -> Result<(), FileError> {
        let _f = self.flushing.lock();
        self.checkpoint_locked()
    }

    pub(super) fn figures(&self, g: &Inner) -> Vec<(String, u64)> {
        let c = self.cache.lock();
        let committed = g.files.values().filter(|f| f.committed).count() as u64;
        vec![
            ("files".into(), committed),
            ("uncommitted".into(), g.files.len() as u64 - committed),
            ("extents".into(), g.extents.len() as u64),
            (
                "bytes_stored".into(),
                g.extents.values().map(|e| e.len as u64).sum(),
            ),
            ("store_bytes".into(), g.alloc.end()),
            ("free_bytes".into(), g.alloc.free_bytes()),
            ("free_ranges".into(), g.alloc.holes() as u64),
            (
                "pending_free_bytes".into(),
                g.pending_free.iter().map(|p| p.2).sum(),
            ),
            ("cache_bytes".into(), c.bytes),
            ("cache_hits".into(), c.hits),
            ("cache_misses".into(), c.misses),
            ("meta_generation".into(), g.generation),
            ("meta_log_bytes".into(), g.tail),
            ("destroyed_by_age".into(), g.destroyed_by_age),
            ("requests".into(), self.requests.load(Ordering::Relaxed)),
            (
                "request_bytes".into(),
                self.request_bytes.load(Ordering::Relaxed),
            ),
        ]
    }

    /// Counts a request of `bytes` the store's server received, other than
    /// administration (the figures `requests` and `request_bytes`: what
    /// clients sent it, for a benchmark to compare before and after).
    pub fn count_request(&self, bytes: usize) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.request_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Figures about the store.
    pub fn stats(&self) -> Answer {
        let g = self.inner.lock();
        Answer::Report {
            figures: self.figures(&g),
            problems: vec![],
        }
    }

    /// [`Store::stats`] at `now`, with how long ago the last ageing
    /// pass a manager asked for ran (`since_aged_us`; `u64::MAX`: none
    /// since the server started), which managers look at before a pass.
    pub fn stats_at(&self, now: Time) -> Answer {
        let g = self.inner.lock();
        let mut figures = self.figures(&g);
        let since = (g.aged).map_or(u64::MAX, |t| now.saturating_since(t).as_micros() as u64);
        figures.push(("since_aged_us".into(), since));
        Answer::Report {
            figures,
            problems: vec![],
        }
    }

    /// Verifies the metadata's consistency and every extent's checksum.
    pub fn fsck(&self) -> Answer {
        let _m = self.maintenance.lock();
        let mut problems = Vec::new();
        let (figures, extents) = {
            let g = self.inner.lock();
            let mut refs: HashMap<u64, u32> = HashMap::new();
            for (obj, f) in &g.files {
                let mut sum = 0u64;
                for p in &f.pieces {
                    sum += p.len as u64;
                    if p.extent == HOLE {
                        continue;
                    }
                    *refs.entry(p.extent).or_default() += 1;
                    match g.extents.get(&p.extent) {
                        None => problems.push(format!("file {obj}: unknown extent {}", p.extent)),
                        Some(e) if p.off as u64 + p.len as u64 > e.len as u64 => problems.push(
                            format!("file {obj}: piece past the end of extent {}", p.extent),
                        ),
                        _ => {}
                    }
                }
                if sum != f.size {
                    problems.push(format!(
                        "file {obj}: pieces add up to {sum}, size is {}",
                        f.size
                    ));
                }
            }
            let mut ranges: Vec<(u64, u64, u64)> = Vec::new();
            for (&id, e) in &g.extents {
                if refs.get(&id).copied().unwrap_or(0) != e.refs {
                    problems.push(format!("extent {id}: reference count {} is wrong", e.refs));
                }
                if g.alloc.overlaps_free(e.off, e.len as u64) {
                    problems.push(format!("extent {id} overlaps free space"));
                }
                ranges.push((e.off, e.len as u64, id));
            }
            ranges.sort_unstable();
            for w in ranges.windows(2) {
                if w[0].0 + w[0].1 > w[1].0 {
                    problems.push(format!("extents {} and {} overlap", w[0].2, w[1].2));
                }
            }
            let used: u64 = ranges.iter().map(|r| r.1).sum();
            let pending: u64 = g.pending_free.iter().map(|p| p.2).sum();
            if used + pending + g.alloc.free_bytes() != g.alloc.end() {
                problems.push(format!(
                    "space does not add up: {used} used + {pending} pending + {} free != {}",
                    g.alloc.free_bytes(),
                    g.alloc.end()
                ));
            }
            let extents: Vec<ReadPart> = g
                .extents
                .iter()
                .map(|(&id, e)| ReadPart {
                    extent: id,
                    off: e.off,
                    len: e.len,
                    hash: e.hash,
                    from: 0,
                    take: 0,
                })
                .collect();
            (self.figures(&g), extents)
        };
        let mut verified = 0u64;
        let mut buf = Vec::new();
        for mut p in extents {
            match self.read_verified(&mut p, &mut buf) {
                Ok(()) => verified += 1,
                // Its files went meanwhile.
                Err(FileError::NotFound) => {}
                Err(FileError::Corrupt(why)) => problems.push(format!(
                    "{why}; files using it: {:?}",
                    self.files_using(p.extent)
                )),
                Err(e) => problems.push(format!("extent {}: {e}", p.extent)),
            }
        }
        let mut figures = figures;
        figures.push(("extents_verified".into(), verified));
        Answer::Report { figures, problems }
    }

    /// Object numbers of the files that use an extent.
    pub fn files_using(&self, extent: u64) -> Vec<u64> {
        let g = self.inner.lock();
        let mut v: Vec<u64> = g
            .files
            .iter()
            .filter(|(_, f)| f.pieces.iter().any(|p| p.extent == extent))
            .map(|(&k, _)| k)
            .collect();
        v.sort_unstable();
        v
    }

    /// Moves extents from the end of the store into free space nearer the
    /// front, then shrinks the data disk and rewrites the metadata.
    /// Readers go on meanwhile.
    pub fn compact(&self) -> Result<Answer, FileError> {
        let _m = self.maintenance.lock();
        self.flush()?;
        let before = self.inner.lock().alloc.end();
        let mut order: Vec<(u64, u64, u32, [u8; 32])> = {
            let g = self.inner.lock();
            g.extents
                .iter()
                .filter(|(_, e)| e.logged)
                .map(|(&id, e)| (e.off, id, e.len, e.hash))
                .collect()
        };
        order.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
        let (mut moved, mut moved_bytes) = (0u64, 0u64);
        let mut buf = Vec::new();
        for (off, id, len, hash) in order {
            let to = {
                let mut g = self.inner.lock();
                match g.extents.get(&id) {
                    Some(e) if e.off == off => {}
                    _ => continue,
                }
                match g.alloc.alloc_below(len as u64, off) {
                    Some(to) => to,
                    None => continue,
                }
            };
            buf.resize(len as usize, 0);
            let copied = self
                .disks
                .data
                .read_at(&mut buf, off)
                .and_then(|_| {
                    if *blake3::hash(&buf).as_bytes() != hash {
                        Err(std::io::Error::other("checksum"))
                    } else {
                        Ok(())
                    }
                })
                .and_then(|_| self.disks.data.write_at(&buf, to));
            let mut g = self.inner.lock();
            let still = matches!(g.extents.get(&id), Some(e) if e.off == off);
            if copied.is_err() || !still {
                g.alloc.free(to, len as u64);
                continue;
            }
            g.extents.get_mut(&id).unwrap().off = to;
            let lsn = g.append(Record::Move {
                extent: id,
                off: to,
            });
            g.pending_free.push((lsn, off, len as u64));
            moved += 1;
            moved_bytes += len as u64;
        }
        // Make the moves durable (which frees the old places), then cut
        // the free run at the end and rewrite the metadata compactly.
        self.flush()?;
        let after = {
            let _f = self.flushing.lock();
            let mut g = self.inner.lock();
            let end = g.alloc.trim();
            self.disks.data.set_len(end)?;
            self.disks.data.sync()?;
            drop(g);
            self.checkpoint_locked()?;
            end
        };
        Ok(Answer::Report {
            figures: vec![
                ("extents_moved".into(), moved),
                ("bytes_moved".into(), moved_bytes),
                ("store_bytes_before".into(), before),
                ("store_bytes_after".into(), after),
            ],
            problems: vec![],
        })
    }
}
