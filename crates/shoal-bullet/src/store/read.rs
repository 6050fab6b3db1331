//! Reading a store: whole files or ranges, checksums verified, through the
//! extent cache (`super`).

use super::*;

/// What every hole reads as.
static ZEROS: [u8; MAX_CHUNK] = [0; MAX_CHUNK];

impl<D: Disk> Store<D> {
    /// Reads `len` bytes at `offset` of a committed file (needs READ),
    /// appending them to `out`; short only at the end of the file.
    pub fn read_into(
        &self,
        cap: &Capability,
        offset: u64,
        len: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), FileError> {
        let pieces = self.read_pieces(cap, offset, len)?;
        out.reserve(pieces.iter().map(|(_, r)| r.len()).sum());
        for (bytes, range) in pieces {
            out.extend_from_slice(&bytes[range]);
        }
        Ok(())
    }

    /// [`Store::read_into`] without the copy: the verified extents that
    /// hold the bytes, each with the range of it to take, in order (the
    /// server sends them as they are).
    pub fn read_pieces(
        &self,
        cap: &Capability,
        offset: u64,
        len: u32,
    ) -> Result<Vec<ExtentSlice>, FileError> {
        if len as usize > MAX_CHUNK {
            return Err(FileError::TooLarge("a read returns at most 8 MiB".into()));
        }
        let parts = {
            let g = self.inner.lock();
            let (obj, _) = g.check(self.put_port, cap, READ)?;
            let f = &g.files[&obj];
            if !f.committed {
                return Err(FileError::NotCommitted);
            }
            if offset > f.size {
                return Err(FileError::Range {
                    offset,
                    len: len as u64,
                    size: f.size,
                });
            }
            let end = (offset + len as u64).min(f.size);
            slice(&f.pieces, offset, end)
                .into_iter()
                .map(|p| {
                    if p.extent == HOLE {
                        return ReadPart {
                            extent: HOLE,
                            off: 0,
                            len: p.len,
                            hash: [0; 32],
                            from: 0,
                            take: p.len,
                        };
                    }
                    let e = &g.extents[&p.extent];
                    ReadPart {
                        extent: p.extent,
                        off: e.off,
                        len: e.len,
                        hash: e.hash,
                        from: p.off,
                        take: p.len,
                    }
                })
                .collect::<Vec<_>>()
        };
        parts
            .into_iter()
            .map(|p| {
                let range = p.from as usize..(p.from + p.take) as usize;
                Ok((self.extent_bytes(p)?, range))
            })
            .collect()
    }

    /// Reads every extent of a committed file from the disk, bypassing
    /// the cache, and checks its checksum (needs READ).
    pub fn verify(&self, cap: &Capability) -> Result<(), FileError> {
        let parts: Vec<ReadPart> = {
            let g = self.inner.lock();
            let (obj, _) = g.check(self.put_port, cap, READ)?;
            let f = &g.files[&obj];
            if !f.committed {
                return Err(FileError::NotCommitted);
            }
            let mut ids: Vec<u64> = f
                .pieces
                .iter()
                .map(|p| p.extent)
                .filter(|e| *e != HOLE)
                .collect();
            ids.sort_unstable();
            ids.dedup();
            ids.iter()
                .map(|id| {
                    let e = &g.extents[id];
                    ReadPart {
                        extent: *id,
                        off: e.off,
                        len: e.len,
                        hash: e.hash,
                        from: 0,
                        take: 0,
                    }
                })
                .collect()
        };
        let mut buf = self.cache.lock().buffer(0);
        for mut p in parts {
            self.read_verified(&mut p, &mut buf)?;
        }
        Ok(())
    }

    /// Reads extent `p` from the disk into `buf` and checks its checksum.
    /// A mismatch looks the extent up again: gone (its file destroyed)
    /// is not found; moved by compaction, it is read again where it is
    /// now; otherwise it is corrupt.
    pub(super) fn read_verified(
        &self,
        p: &mut ReadPart,
        buf: &mut Vec<u8>,
    ) -> Result<(), FileError> {
        buf.resize(p.len as usize, 0);
        let mut tries = 0;
        loop {
            self.disks.data.read_at(buf, p.off)?;
            if *blake3::hash(buf).as_bytes() == p.hash {
                return Ok(());
            }
            let again = self.inner.lock().extents.get(&p.extent).map(|e| e.off);
            match again {
                None => return Err(FileError::NotFound),
                Some(off) if off != p.off && tries < 3 => {
                    p.off = off;
                    tries += 1;
                }
                Some(_) => {
                    return Err(FileError::Corrupt(format!(
                        "extent {} ({} bytes at offset {} of the store) fails its checksum",
                        p.extent, p.len, p.off
                    )));
                }
            }
        }
    }

    /// An extent's verified bytes, from the cache or the disk.
    pub(super) fn extent_bytes(&self, mut p: ReadPart) -> Result<Bytes, FileError> {
        if p.extent == HOLE {
            // A read takes at most `MAX_CHUNK` bytes, so at most that of a
            // hole.
            return Ok(Bytes::from_static(&ZEROS[..p.len as usize]));
        }
        {
            let mut c = self.cache.lock();
            c.tick += 1;
            let tick = c.tick;
            if let Some((bytes, t)) = c.map.get_mut(&p.extent) {
                let (bytes, old) = (bytes.clone(), std::mem::replace(t, tick));
                c.lru.remove(&old);
                c.lru.insert(tick, p.extent);
                c.hits += 1;
                return Ok(bytes);
            }
            c.misses += 1;
        }
        let mut buf = self.cache.lock().buffer(p.len as usize);
        self.read_verified(&mut p, &mut buf)?;
        let bytes = Bytes::from(buf);
        self.cache
            .lock()
            .put(p.extent, bytes.clone(), self.cfg.cache_bytes);
        Ok(bytes)
    }
}
