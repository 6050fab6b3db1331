//! Writing to a store: new files from bytes or from the pieces of others
//! (create, edit, concat), their extents written outside the lock (`super`).

use super::*;

impl<D: Disk> Store<D> {
    /// Writes `data` into new extents (not yet part of any file).
    pub(super) fn write_extents(
        &self,
        data: &[u8],
        shared: Option<Bytes>,
    ) -> Result<Vec<Piece>, FileError> {
        debug_assert!(shared.as_ref().is_none_or(|s| s[..] == *data));
        let mut pieces = Vec::with_capacity(data.len().div_ceil(MAX_EXTENT as usize));
        for (i, chunk) in data.chunks(MAX_EXTENT as usize).enumerate() {
            let hash = *blake3::hash(chunk).as_bytes();
            let len = chunk.len() as u64;
            let (id, off) = {
                let mut g = self.inner.lock();
                let off = match g.alloc.alloc(len) {
                    Some(o) => o,
                    None => {
                        let end = g.alloc.end() + len.max(self.cfg.grow_step);
                        if let Err(e) = self.disks.data.set_len(end) {
                            drop(g);
                            self.forget_extents(&pieces);
                            return Err(e.into());
                        }
                        g.alloc.grow(end);
                        g.alloc.alloc(len).expect("space after growing")
                    }
                };
                let id = g.next_extent;
                g.next_extent += 1;
                g.extents.insert(
                    id,
                    Extent {
                        off,
                        len: len as u32,
                        hash,
                        refs: 1,
                        logged: false,
                    },
                );
                (id, off)
            };
            pieces.push(Piece {
                extent: id,
                off: 0,
                len: len as u32,
            });
            if let Err(e) = self.disks.data.write_at(chunk, off) {
                self.forget_extents(&pieces);
                return Err(e.into());
            }
            self.disks.data.start_writeback(off, len);
            // New files are hot: a read right after a create is common.
            // The request's own buffer is kept if it is shared, else a copy.
            if self.cfg.cache_bytes > 0 {
                let mut c = self.cache.lock();
                let bytes = match &shared {
                    Some(s) => {
                        let at = i * MAX_EXTENT as usize;
                        s.slice(at..at + chunk.len())
                    }
                    None => {
                        let mut b = c.buffer(chunk.len());
                        b.copy_from_slice(chunk);
                        Bytes::from(b)
                    }
                };
                c.put(id, bytes, self.cfg.cache_bytes);
            }
        }
        Ok(pieces)
    }

    /// Drops the caller's reference to extents from [`Store::write_extents`].
    pub(super) fn forget_extents(&self, pieces: &[Piece]) {
        let mut g = self.inner.lock();
        let lsn = g.appended;
        g.drop_refs(pieces, lsn);
    }

    /// Creates a file (needs CREATE on the server's capability).
    pub fn create(
        &self,
        server: &Capability,
        flags: u8,
        data: &[u8],
        now: Time,
    ) -> Result<Capability, FileError> {
        self.create_shared(server, flags, data, None, now)
    }

    /// [`Store::create`], where `shared` (if any) holds the same bytes as
    /// `data` in a buffer the cache may keep instead of a copy.
    pub(super) fn create_shared(
        &self,
        server: &Capability,
        flags: u8,
        data: &[u8],
        shared: Option<Bytes>,
        now: Time,
    ) -> Result<Capability, FileError> {
        self.check_server(server, CREATE)?;
        let pieces = self.write_extents(data, shared)?;
        let (cap, lsn) = {
            let mut g = self.inner.lock();
            let (obj, secret) = g.new_file(data.len() as u64, pieces, self.cfg.ttl, now);
            let lsn = (flags & FLAG_COMMIT != 0).then(|| g.commit(obj));
            (self.file_cap(obj, &secret), lsn)
        };
        if let (Some(lsn), true) = (lsn, flags & FLAG_SAFETY != 0) {
            self.sync_to(lsn)?;
        }
        Ok(cap)
    }

    /// Applies an edit: in place to an uncommitted file, or into a new
    /// file made from a committed one.  Returns the edited file's
    /// capability.
    pub fn edit<B: AsRef<[u8]>>(
        &self,
        cap: &Capability,
        flags: u8,
        edit: Edit<B>,
        now: Time,
    ) -> Result<Capability, FileError> {
        let edit = edit.as_ref();
        // What it writes at `offset`: `data`, or a hole of `added` bytes;
        // and how many bytes there it overwrites or removes.
        let (offset, data, removed) = match edit {
            Edit::Write { offset, data } => (offset, data, data.len() as u64),
            Edit::Insert { offset, data } => (offset, data, 0),
            Edit::Delete { offset, len } => (offset, &[][..], len),
            Edit::Hole { offset, len } => (offset, &[][..], len),
        };
        let added = match edit {
            Edit::Hole { len, .. } => len,
            _ => data.len() as u64,
        };
        // Check first, so a refused edit writes nothing.
        {
            let g = self.inner.lock();
            let (obj, _) = g.check(self.put_port, cap, MODIFY)?;
            let size = g.files[&obj].size;
            let bad = match edit {
                Edit::Delete { .. } => offset.checked_add(removed).is_none_or(|e| e > size),
                _ => offset > size,
            };
            if bad {
                return Err(FileError::Range {
                    offset,
                    len: removed,
                    size,
                });
            }
            if size.saturating_add(added) > MAX_FILE {
                return Err(FileError::TooLarge("file larger than 16 TiB".into()));
            }
        }
        let mid = match edit {
            Edit::Hole { len, .. } => holes(len),
            _ => self.write_extents(data, None)?,
        };
        let result = (|| {
            let mut g = self.inner.lock();
            // Checked again: the file may have gone while we wrote.
            let (obj, _) = g.check(self.put_port, cap, MODIFY)?;
            let f = &g.files[&obj];
            let size = f.size;
            let cut_end = match edit {
                Edit::Write { .. } | Edit::Hole { .. } => offset.saturating_add(removed).min(size),
                Edit::Insert { .. } => offset,
                Edit::Delete { .. } => offset + removed,
            };
            if offset > size || cut_end > size {
                return Err(FileError::Range {
                    offset,
                    len: removed,
                    size,
                });
            }
            let mut pieces = slice(&f.pieces, 0, offset);
            pieces.extend_from_slice(&mid);
            pieces.extend(slice(&f.pieces, cut_end, size));
            let pieces = normalize(pieces);
            if pieces.len() > MAX_PIECES {
                return Err(FileError::TooLarge(format!(
                    "the result would have more than {MAX_PIECES} pieces; copy the file to defragment it"
                )));
            }
            let new_size = size - (cut_end - offset) + added;
            let committed = f.committed;
            g.add_refs(&pieces);
            let lsn = g.appended;
            // The extents just written carried the writer's reference.
            g.drop_refs(&mid, lsn);
            let target = if committed {
                g.new_file(new_size, pieces, self.cfg.ttl, now).0
            } else {
                let f = g.files.get_mut(&obj).unwrap();
                let old = std::mem::replace(&mut f.pieces, pieces);
                f.size = new_size;
                f.touched = now;
                let lsn = g.appended;
                g.drop_refs(&old, lsn);
                obj
            };
            let lsn = (flags & FLAG_COMMIT != 0).then(|| g.commit(target));
            let secret = g.files[&target].secret;
            let out = if committed {
                self.file_cap(target, &secret)
            } else {
                *cap
            };
            Ok((out, lsn))
        })();
        match result {
            Ok((out, lsn)) => {
                if let (Some(lsn), true) = (lsn, flags & FLAG_SAFETY != 0) {
                    self.sync_to(lsn)?;
                }
                Ok(out)
            }
            Err(e) => {
                self.forget_extents(&mid);
                Err(e)
            }
        }
    }

    /// Makes one file of uncommitted `parts`, in order, consuming them
    /// (needs CREATE on the server and MODIFY on each part); shares their
    /// extents, copies nothing.
    pub fn concat(
        &self,
        server: &Capability,
        flags: u8,
        parts: &[Capability],
        now: Time,
    ) -> Result<Capability, FileError> {
        self.check_server(server, CREATE)?;
        let (cap, lsn) = {
            let mut g = self.inner.lock();
            let mut objs = Vec::with_capacity(parts.len());
            for p in parts {
                let (obj, _) = g.check(self.put_port, p, MODIFY)?;
                if g.files[&obj].committed {
                    return Err(FileError::Committed);
                }
                if objs.contains(&obj) {
                    return Err(FileError::BadRequest("a part is named twice".into()));
                }
                objs.push(obj);
            }
            let mut old = Vec::new();
            let mut size = 0u64;
            for obj in &objs {
                let f = &g.files[obj];
                size += f.size;
                old.extend_from_slice(&f.pieces);
            }
            let pieces = normalize(old.clone());
            if pieces.len() > MAX_PIECES {
                return Err(FileError::TooLarge(format!(
                    "the result would have more than {MAX_PIECES} pieces"
                )));
            }
            for obj in &objs {
                g.files.remove(obj);
            }
            // References follow the pieces (normalizing may merge some).
            g.add_refs(&pieces);
            let lsn = g.appended;
            g.drop_refs(&old, lsn);
            let (obj, secret) = g.new_file(size, pieces, self.cfg.ttl, now);
            let lsn = (flags & FLAG_COMMIT != 0).then(|| g.commit(obj));
            (self.file_cap(obj, &secret), lsn)
        };
        if let (Some(lsn), true) = (lsn, flags & FLAG_SAFETY != 0) {
            self.sync_to(lsn)?;
        }
        Ok(cap)
    }
}

/// Hole pieces for `len` bytes (each at most a piece's length).
fn holes(len: u64) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut left = len;
    while left > 0 {
        let n = left.min(u32::MAX as u64);
        out.push(Piece {
            extent: HOLE,
            off: 0,
            len: n as u32,
        });
        left -= n;
    }
    out
}
