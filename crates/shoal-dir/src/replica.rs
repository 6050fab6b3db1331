//! The decisions of a directory replica, without I/O: what a group message
//! does to the state and the log, and when a read may be answered.  The
//! rules every replicated service shares (durability, forming and
//! re-forming the group) are `shoal_replica`'s, re-exported here.  The
//! replica shell (`shoal_dirsvc::replica`, on `shoal-replicasvc`) and the
//! simulator (`shoal_sim::dir`) both drive this code.

use crate::log::LogBuffer;
use crate::model::DirError;
use crate::op::{Answer, Op, Request, Response};
use crate::state::{Applied, DirState};

/// A group message: `origin u64 | encoded request` (the origin tells the
/// replica that sent it which answers are its own).
pub fn encode_entry(origin: u64, req: &Request) -> Vec<u8> {
    shoal_replica::entry(origin, &req.encode())
}

/// A replica's state and its unflushed log.
#[derive(Debug)]
pub struct ReplicaState {
    pub state: DirState,
    pub log: LogBuffer,
}

impl ReplicaState {
    pub fn new(state: DirState) -> ReplicaState {
        ReplicaState {
            state,
            log: LogBuffer::new(),
        }
    }

    /// Applies one group message (in the group's order): the state changes,
    /// the write goes to the log buffer (a refused one only advances the
    /// index).  Returns the message's origin and the answer for it; `None`
    /// for an undecodable message (which changes nothing).
    pub fn deliver(&mut self, body: &[u8]) -> Option<(u64, Response)> {
        let (origin, encoded) = shoal_replica::split_entry(body)?;
        Some((origin, self.apply(encoded)?))
    }

    /// Applies one group message's payload (an encoded request).
    fn apply(&mut self, encoded: &[u8]) -> Option<Response> {
        let req = Request::decode(encoded).ok()?;
        if matches!(req.op, Op::Sync) {
            return Some(Response {
                index: self.state.index(),
                result: Ok(Answer::Done),
            });
        }
        let applied = self.state.apply(&req);
        if let Applied::New(r) = &applied {
            if r.result.is_ok() {
                self.log.push(r.index, &req, encoded);
            } else {
                self.log.note_refused(r.index);
            }
        }
        Some(match applied {
            Applied::New(r) | Applied::Duplicate(r) => r,
        })
    }

    /// Answers a read if this replica has applied every write the client
    /// has seen; [`DirError::Behind`] if not (the caller may wait for more
    /// deliveries first).
    pub fn read(&self, req: &Request) -> Response {
        let index = self.state.index();
        if index < req.min_index {
            return Response {
                index,
                result: Err(DirError::Behind {
                    have: index,
                    want: req.min_index,
                }),
            };
        }
        Response {
            index,
            result: self.state.read(&req.op),
        }
    }
}

impl shoal_replica::Machine for ReplicaState {
    type Output = Response;

    fn index(&self) -> u64 {
        self.state.index()
    }

    fn deliver(&mut self, message: &[u8]) -> Option<Response> {
        self.apply(message)
    }

    fn take_log(&mut self, mark: bool) -> Option<Vec<u8>> {
        self.log.take(mark)
    }

    fn logged_index(&self) -> u64 {
        self.log.last_index()
    }

    fn log_header(base: u64) -> Vec<u8> {
        crate::log::header(base).to_vec()
    }

    fn encode_snapshot(&self) -> Vec<u8> {
        self.state.encode_snapshot()
    }

    fn decode_snapshot(bytes: &[u8]) -> Result<Self, String> {
        DirState::decode_snapshot(bytes)
            .map(ReplicaState::new)
            .map_err(|e| e.to_string())
    }

    fn recover(
        port: shoal_cap::PutPort,
        snapshot: Option<&[u8]>,
        logs: &[(u64, &[u8])],
    ) -> Result<shoal_replica::Recovery<Self>, String> {
        let r = crate::log::recover(port, snapshot, logs).map_err(|e| e.to_string())?;
        Ok(shoal_replica::Recovery {
            state: ReplicaState::new(r.state),
            replayed: r.replayed,
            keep: r.keep,
        })
    }

    fn counts(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("directories", self.state.dir_count() as u64),
            ("rows", self.state.row_count() as u64),
            ("cancelled_pairs", self.log.cancelled_pairs),
        ]
    }
}
