//! The remote execution protocol: what a home says to the exec service of
//! the node a program runs on, and what it answers.
//!
//! Every request names the process by its [`ProcId`].  A program is
//! started once ([`ExecRequest::Start`]); its output is then pulled by
//! [`ExecRequest::Read`] calls, each returning what the program wrote since
//! the last one (up to a bound, waiting a little if there is nothing yet):
//! the service stops reading the program's pipes while its buffers are
//! full, so a program that writes faster than its home reads is slowed by
//! the pipe, never by memory.  Input goes the other way in
//! [`ExecRequest::Write`] calls, signals in [`ExecRequest::Signal`].  The
//! last `Read` answer carries the program's end.
//!
//! Encoding: a tag byte, the process id (16 bytes), then per kind fixed
//! little-endian fields and, last, variable bytes; the start request's
//! description is a length-prefixed list of strings.

use crate::ProcId;

/// What a program runs with: everything that makes it behave as if it ran
/// on its home.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StartSpec {
    /// The program and its arguments (`argv[0]` is looked up in `PATH`).
    pub argv: Vec<String>,
    /// The whole environment, `NAME=value` each.
    pub env: Vec<String>,
    /// The working directory.
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    pub umask: u32,
}

/// A request to a node's exec service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecRequest {
    /// Start `spec` as process `id`.
    Start { id: ProcId, spec: StartSpec },
    /// Output written since the last read (at most `max` bytes of each
    /// stream), waiting up to `wait_ms` for some.
    Read { id: ProcId, max: u32, wait_ms: u32 },
    /// Input for the program; `close` ends it (after `data`).
    Write {
        id: ProcId,
        data: Vec<u8>,
        close: bool,
    },
    /// Deliver signal `signal` to the program's process group.
    Signal { id: ProcId, signal: i32 },
}

/// How a program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this status.
    Exited(i32),
    /// A signal killed it.
    Killed(i32),
}

/// An exec service's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecReply {
    /// The request could not be carried out: why, in one line.
    Error(String),
    /// The program started as this process of its node.
    Started { pid: u32 },
    /// Output since the last read, and the program's end once every byte
    /// of its output has been read.
    Output {
        stdout: Vec<u8>,
        stderr: Vec<u8>,
        ended: Option<Ended>,
    },
    /// Done.
    Done,
}

/// Why bytes are not a request or reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed exec message: {0}")]
pub struct DecodeError(&'static str);

/// Most strings in a start request, and most bytes in each.
pub const MAX_STRINGS: usize = 65_536;

impl ExecRequest {
    /// The process the request is about.
    pub fn id(&self) -> ProcId {
        match self {
            ExecRequest::Start { id, .. }
            | ExecRequest::Read { id, .. }
            | ExecRequest::Write { id, .. }
            | ExecRequest::Signal { id, .. } => *id,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::new();
        let (tag, id) = match self {
            ExecRequest::Start { id, .. } => (1, id),
            ExecRequest::Read { id, .. } => (2, id),
            ExecRequest::Write { id, .. } => (3, id),
            ExecRequest::Signal { id, .. } => (4, id),
        };
        w.push(tag);
        w.extend_from_slice(&id.to_bytes());
        match self {
            ExecRequest::Start { spec, .. } => {
                put_u32(&mut w, spec.uid);
                put_u32(&mut w, spec.gid);
                put_u32(&mut w, spec.umask);
                put_strings(&mut w, std::slice::from_ref(&spec.cwd));
                put_strings(&mut w, &spec.argv);
                put_strings(&mut w, &spec.env);
            }
            ExecRequest::Read { max, wait_ms, .. } => {
                put_u32(&mut w, *max);
                put_u32(&mut w, *wait_ms);
            }
            ExecRequest::Write { data, close, .. } => {
                w.push(*close as u8);
                w.extend_from_slice(data);
            }
            ExecRequest::Signal { signal, .. } => put_u32(&mut w, *signal as u32),
        }
        w
    }

    pub fn decode(b: &[u8]) -> Result<ExecRequest, DecodeError> {
        let mut r = Reader(b);
        let tag = r.u8()?;
        let id = ProcId::from_bytes(r.take(ProcId::LEN)?.try_into().expect("16 bytes"));
        let req = match tag {
            1 => {
                let (uid, gid, umask) = (r.u32()?, r.u32()?, r.u32()?);
                let mut cwd = r.strings()?;
                if cwd.len() != 1 {
                    return Err(DecodeError("a start has one working directory"));
                }
                let argv = r.strings()?;
                if argv.is_empty() {
                    return Err(DecodeError("a start names a program"));
                }
                ExecRequest::Start {
                    id,
                    spec: StartSpec {
                        argv,
                        env: r.strings()?,
                        cwd: cwd.remove(0),
                        uid,
                        gid,
                        umask,
                    },
                }
            }
            2 => ExecRequest::Read {
                id,
                max: r.u32()?,
                wait_ms: r.u32()?,
            },
            3 => {
                let close = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(DecodeError("close flag")),
                };
                return Ok(ExecRequest::Write {
                    id,
                    close,
                    data: r.0.to_vec(),
                });
            }
            4 => ExecRequest::Signal {
                id,
                signal: r.u32()? as i32,
            },
            _ => return Err(DecodeError("unknown request")),
        };
        r.end()?;
        Ok(req)
    }
}

impl ExecReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::new();
        match self {
            ExecReply::Error(m) => {
                w.push(0);
                w.extend_from_slice(m.as_bytes());
            }
            ExecReply::Started { pid } => {
                w.push(1);
                put_u32(&mut w, *pid);
            }
            ExecReply::Output {
                stdout,
                stderr,
                ended,
            } => {
                w.push(2);
                match ended {
                    None => w.push(0),
                    Some(Ended::Exited(c)) => {
                        w.push(1);
                        put_u32(&mut w, *c as u32);
                    }
                    Some(Ended::Killed(s)) => {
                        w.push(2);
                        put_u32(&mut w, *s as u32);
                    }
                }
                put_u32(&mut w, stdout.len() as u32);
                w.extend_from_slice(stdout);
                w.extend_from_slice(stderr);
            }
            ExecReply::Done => w.push(3),
        }
        w
    }

    pub fn decode(b: &[u8]) -> Result<ExecReply, DecodeError> {
        let mut r = Reader(b);
        let reply = match r.u8()? {
            0 => {
                return std::str::from_utf8(r.0)
                    .map(|m| ExecReply::Error(m.to_string()))
                    .map_err(|_| DecodeError("error text is not UTF-8"));
            }
            1 => ExecReply::Started { pid: r.u32()? },
            2 => {
                let ended = match r.u8()? {
                    0 => None,
                    1 => Some(Ended::Exited(r.u32()? as i32)),
                    2 => Some(Ended::Killed(r.u32()? as i32)),
                    _ => return Err(DecodeError("end kind")),
                };
                let n = r.u32()? as usize;
                let stdout = r.take(n)?.to_vec();
                return Ok(ExecReply::Output {
                    stdout,
                    stderr: r.0.to_vec(),
                    ended,
                });
            }
            3 => ExecReply::Done,
            _ => return Err(DecodeError("unknown reply")),
        };
        r.end()?;
        Ok(reply)
    }
}

fn put_u32(w: &mut Vec<u8>, v: u32) {
    w.extend_from_slice(&v.to_le_bytes());
}

fn put_strings(w: &mut Vec<u8>, strings: &[String]) {
    put_u32(w, strings.len() as u32);
    for s in strings {
        put_u32(w, s.len() as u32);
        w.extend_from_slice(s.as_bytes());
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn strings(&mut self) -> Result<Vec<String>, DecodeError> {
        let n = self.u32()? as usize;
        if n > MAX_STRINGS {
            return Err(DecodeError("too many strings"));
        }
        let mut out = Vec::with_capacity(n.min(self.0.len() / 4));
        for _ in 0..n {
            let len = self.u32()? as usize;
            let s = std::str::from_utf8(self.take(len)?)
                .map_err(|_| DecodeError("a string is not UTF-8"))?;
            if s.contains('\0') {
                return Err(DecodeError("a string holds a NUL byte"));
            }
            out.push(s.to_string());
        }
        Ok(out)
    }

    fn end(&self) -> Result<(), DecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DecodeError("trailing bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use shoal_wire::NodeId;

    fn id() -> impl Strategy<Value = ProcId> {
        (any::<u64>(), any::<u64>()).prop_map(|(h, s)| ProcId {
            home: NodeId(h),
            seq: s,
        })
    }

    fn text() -> impl Strategy<Value = String> {
        "[^\u{0}]{0,12}"
    }

    fn requests() -> impl Strategy<Value = ExecRequest> {
        prop_oneof![
            (
                id(),
                proptest::collection::vec(text(), 1..5),
                proptest::collection::vec(text(), 0..5),
                text(),
                any::<(u32, u32, u32)>()
            )
                .prop_map(|(id, argv, env, cwd, (uid, gid, umask))| {
                    ExecRequest::Start {
                        id,
                        spec: StartSpec {
                            argv,
                            env,
                            cwd,
                            uid,
                            gid,
                            umask,
                        },
                    }
                }),
            (id(), any::<u32>(), any::<u32>()).prop_map(|(id, max, wait_ms)| ExecRequest::Read {
                id,
                max,
                wait_ms
            }),
            (
                id(),
                proptest::collection::vec(any::<u8>(), 0..64),
                any::<bool>()
            )
                .prop_map(|(id, data, close)| ExecRequest::Write { id, data, close }),
            (id(), any::<i32>()).prop_map(|(id, signal)| ExecRequest::Signal { id, signal }),
        ]
    }

    fn replies() -> impl Strategy<Value = ExecReply> {
        let bytes = || proptest::collection::vec(any::<u8>(), 0..64);
        let ended = prop_oneof![
            Just(None),
            any::<i32>().prop_map(|c| Some(Ended::Exited(c))),
            any::<i32>().prop_map(|s| Some(Ended::Killed(s))),
        ];
        prop_oneof![
            text().prop_map(ExecReply::Error),
            any::<u32>().prop_map(|pid| ExecReply::Started { pid }),
            (bytes(), bytes(), ended).prop_map(|(stdout, stderr, ended)| ExecReply::Output {
                stdout,
                stderr,
                ended
            }),
            Just(ExecReply::Done),
        ]
    }

    proptest! {
        #[test]
        fn requests_round_trip(r in requests()) {
            prop_assert_eq!(ExecRequest::decode(&r.encode()).unwrap(), r);
        }

        #[test]
        fn replies_round_trip(r in replies()) {
            prop_assert_eq!(ExecReply::decode(&r.encode()).unwrap(), r);
        }

        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = ExecRequest::decode(&b);
            let _ = ExecReply::decode(&b);
        }
    }

    #[test]
    fn a_start_without_a_program_is_refused() {
        let r = ExecRequest::Start {
            id: ProcId {
                home: NodeId(1),
                seq: 2,
            },
            spec: StartSpec::default(),
        };
        assert!(ExecRequest::decode(&r.encode()).is_err());
    }
}
