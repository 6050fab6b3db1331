//! Files with holes (`docs/files.md`, "Holes"): where a file holds data,
//! and copies that keep its holes, so a sparse file costs what it holds
//! wherever it is copied.

use shoal_bullet::model::MAX_MAP;
use shoal_bullet::op::Edit;
use shoal_bullet::{Answer, Op};
use shoal_cap::Capability;

use crate::client::{ClientError, FileClient, unexpected};

/// Most bytes read and written at a time by a copy.
const WINDOW: u64 = 1 << 20;

impl FileClient {
    /// Where a file holds data from `offset` on, from the first replica
    /// that answers: at most [`MAX_MAP`] data ranges (ask again from the
    /// last one's end for more); holes lie between.
    pub fn map(
        &mut self,
        replicas: &[Capability],
        offset: u64,
    ) -> Result<Vec<(u64, u64)>, ClientError> {
        let mut errors = Vec::new();
        for c in replicas {
            match self.call(c, &Op::Map { file: *c, offset }) {
                Ok(Answer::Map(m)) => return Ok(m),
                Ok(a) => errors.push(unexpected(a)),
                Err(e) if e.try_another() => errors.push(e),
                Err(e) => return Err(e),
            }
        }
        Err(ClientError::AllReplicas(errors))
    }

    /// Whether a committed file of `size` bytes has a hole.
    pub fn has_holes(&mut self, replicas: &[Capability], size: u64) -> Result<bool, ClientError> {
        let map = self.map(replicas, 0)?;
        Ok(size > 0 && map != [(0, size)])
    }

    /// An empty uncommitted file on `server`.
    pub fn create_uncommitted(&mut self, server: &Capability) -> Result<Capability, ClientError> {
        let op = Op::Create {
            server: *server,
            flags: 0,
            data: Vec::new(),
        };
        match self.call(server, &op)? {
            Answer::Cap(c) => Ok(c),
            a => Err(unexpected(a)),
        }
    }

    /// An uncommitted copy on `server` of a committed file of `size`
    /// bytes: its data ranges read a window at a time from whichever
    /// replica answers, its holes left holes.  The file is mapped first,
    /// so one no server holds fails before anything is made; on failure
    /// the copy is destroyed.
    pub fn copy_uncommitted(
        &mut self,
        replicas: &[Capability],
        size: u64,
        server: &Capability,
    ) -> Result<Capability, ClientError> {
        let mut ranges = self.map(replicas, 0)?;
        let copy = self.create_uncommitted(server)?;
        let result = (|| {
            let mut len = 0u64;
            loop {
                for &(start, end) in &ranges {
                    if start > len {
                        let hole = Edit::Hole {
                            offset: len,
                            len: start - len,
                        };
                        self.edit(&copy, hole, false, false)?;
                    }
                    let mut at = start;
                    while at < end {
                        let n = (end - at).min(WINDOW) as u32;
                        let data = self.read_any(replicas, at, n)?;
                        self.edit(&copy, Edit::Write { offset: at, data }, false, false)?;
                        at += u64::from(n);
                    }
                    len = end;
                }
                if ranges.len() < MAX_MAP {
                    break;
                }
                ranges = self.map(replicas, len)?;
            }
            if size > len {
                let hole = Edit::Hole {
                    offset: len,
                    len: size - len,
                };
                self.edit(&copy, hole, false, false)?;
            }
            Ok(copy)
        })();
        if result.is_err() {
            let _ = self.destroy(&copy);
        }
        result
    }

    /// `len` bytes at `offset` of the first replica that answers.
    pub fn read_any(
        &mut self,
        replicas: &[Capability],
        offset: u64,
        len: u32,
    ) -> Result<Vec<u8>, ClientError> {
        let mut errors = Vec::new();
        for r in replicas {
            match self.read(r, offset, len) {
                Ok(d) => return Ok(d),
                Err(e) if e.try_another() => errors.push(e),
                Err(e) => return Err(e),
            }
        }
        Err(ClientError::AllReplicas(errors))
    }
}
