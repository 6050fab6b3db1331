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
//! [`ExecRequest::Write`] calls, signals in [`ExecRequest::Signal`], a
//! terminal's new size in [`ExecRequest::Resize`].  The last `Read` answer
//! carries the program's end.
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
    /// Supplementary groups.
    pub groups: Vec<u32>,
    pub umask: u32,
    /// Resource limits (`RLIMIT_*` number, soft, hard).
    pub rlimits: Vec<Rlimit>,
    /// The home's host name, which the program sees as its own where the
    /// node can give it a UTS namespace.
    pub hostname: String,
    /// Run on a pseudo-terminal of this size (stdout and stderr are then
    /// one stream, and arrive as stdout).
    pub tty: Option<WinSize>,
}

/// One resource limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rlimit {
    pub resource: u32,
    pub soft: u64,
    pub hard: u64,
}

/// A terminal's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WinSize {
    pub rows: u16,
    pub cols: u16,
}

/// A request to a node's exec service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecRequest {
    /// Start `spec` as process `id`, with the start grant its home sealed
    /// for this node ([`Grant`], sealed by `shoal_session::grant`).
    Start {
        id: ProcId,
        spec: StartSpec,
        grant: Vec<u8>,
    },
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
    /// The program's terminal changed size (it gets SIGWINCH).
    Resize { id: ProcId, size: WinSize },
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
    /// Output since the last read, whether the program is stopped (by
    /// this signal), and its end once every byte of its output has been
    /// read.
    Output {
        stdout: Vec<u8>,
        stderr: Vec<u8>,
        stopped: Option<i32>,
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
/// Most supplementary groups in a start request (Linux's `NGROUPS_MAX`).
pub const MAX_GROUPS: usize = 65_536;
/// Most resource limits in a start request.
pub const MAX_RLIMITS: usize = 64;
/// Most bytes of a sealed start grant.
pub const MAX_GRANT: usize = 16 * 1024;

/// What a home vouches for about the process that asked it to start
/// program `id` (`docs/security.md`, "Local authority"): its uid, gid and
/// groups and its hard limits, as the home's kernel reports them.  The
/// home seals it for the node the program runs on; that node's exec
/// service runs nothing without one, and nothing beyond it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub id: ProcId,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// Hard limits: `RLIMIT_*` number, hard limit.
    pub hard: Vec<(u32, u64)>,
}

impl Grant {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(32 + 4 * self.groups.len() + 12 * self.hard.len());
        w.extend_from_slice(&self.id.to_bytes());
        put_u32(&mut w, self.uid);
        put_u32(&mut w, self.gid);
        put_u32(&mut w, self.groups.len() as u32);
        for g in &self.groups {
            put_u32(&mut w, *g);
        }
        put_u32(&mut w, self.hard.len() as u32);
        for (resource, hard) in &self.hard {
            put_u32(&mut w, *resource);
            w.extend_from_slice(&hard.to_le_bytes());
        }
        w
    }

    pub fn decode(b: &[u8]) -> Result<Grant, DecodeError> {
        let mut r = reader(b);
        let id = ProcId::from_bytes(r.take(ProcId::LEN)?.try_into().expect("16 bytes"));
        let (uid, gid) = (r.u32()?, r.u32()?);
        let groups = r.groups()?;
        let n = r.limit_count()?;
        let hard = (0..n)
            .map(|_| Ok((r.u32()?, r.u64()?)))
            .collect::<Result<_, DecodeError>>()?;
        r.end()?;
        Ok(Grant {
            id,
            uid,
            gid,
            groups,
            hard,
        })
    }

    /// `spec`, the start of process `id`, as this grant allows it, or why
    /// not: the uid the grant's (root's grant may name any uid); a gid and
    /// groups the process had (root naming another uid leaves them to the
    /// node's account check); no hard limit above the process's, and one
    /// for every limit the process had.
    pub fn clamp(&self, id: ProcId, spec: &mut StartSpec) -> Result<(), String> {
        if self.id != id {
            return Err(format!(
                "the start grant is for process {}, not {id}",
                self.id
            ));
        }
        if spec.uid == self.uid {
            if spec.gid != self.gid && !self.groups.contains(&spec.gid) {
                return Err(format!("uid {} is not in group {}", spec.uid, spec.gid));
            }
            spec.groups.retain(|g| self.groups.contains(g));
        } else if self.uid != 0 {
            return Err(format!(
                "uid {} may not start a program as uid {}",
                self.uid, spec.uid
            ));
        }
        for &(resource, hard) in &self.hard {
            let mut found = false;
            for l in spec.rlimits.iter_mut().filter(|l| l.resource == resource) {
                l.hard = l.hard.min(hard);
                l.soft = l.soft.min(l.hard);
                found = true;
            }
            if !found {
                spec.rlimits.push(Rlimit {
                    resource,
                    soft: hard,
                    hard,
                });
            }
        }
        Ok(())
    }
}

impl ExecRequest {
    /// The process the request is about.
    pub fn id(&self) -> ProcId {
        match self {
            ExecRequest::Start { id, .. }
            | ExecRequest::Read { id, .. }
            | ExecRequest::Write { id, .. }
            | ExecRequest::Signal { id, .. }
            | ExecRequest::Resize { id, .. } => *id,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::new();
        let (tag, id) = match self {
            ExecRequest::Start { id, .. } => (1, id),
            ExecRequest::Read { id, .. } => (2, id),
            ExecRequest::Write { id, .. } => (3, id),
            ExecRequest::Signal { id, .. } => (4, id),
            ExecRequest::Resize { id, .. } => (5, id),
        };
        w.push(tag);
        w.extend_from_slice(&id.to_bytes());
        match self {
            ExecRequest::Start { spec, grant, .. } => {
                put_u32(&mut w, spec.uid);
                put_u32(&mut w, spec.gid);
                put_u32(&mut w, spec.umask);
                put_strings(&mut w, std::slice::from_ref(&spec.cwd));
                put_strings(&mut w, &spec.argv);
                put_strings(&mut w, &spec.env);
                put_strings(&mut w, std::slice::from_ref(&spec.hostname));
                put_u32(&mut w, spec.groups.len() as u32);
                for g in &spec.groups {
                    put_u32(&mut w, *g);
                }
                put_u32(&mut w, spec.rlimits.len() as u32);
                for l in &spec.rlimits {
                    put_u32(&mut w, l.resource);
                    w.extend_from_slice(&l.soft.to_le_bytes());
                    w.extend_from_slice(&l.hard.to_le_bytes());
                }
                match spec.tty {
                    None => w.push(0),
                    Some(size) => {
                        w.push(1);
                        put_size(&mut w, size);
                    }
                }
                put_u32(&mut w, grant.len() as u32);
                w.extend_from_slice(grant);
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
            ExecRequest::Resize { size, .. } => put_size(&mut w, *size),
        }
        w
    }

    pub fn decode(b: &[u8]) -> Result<ExecRequest, DecodeError> {
        let mut r = reader(b);
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
                let env = r.strings()?;
                let mut hostname = r.strings()?;
                if hostname.len() != 1 {
                    return Err(DecodeError("a start has one host name"));
                }
                let groups = r.groups()?;
                let n = r.limit_count()?;
                let rlimits = (0..n)
                    .map(|_| {
                        Ok(Rlimit {
                            resource: r.u32()?,
                            soft: r.u64()?,
                            hard: r.u64()?,
                        })
                    })
                    .collect::<Result<_, DecodeError>>()?;
                let tty = match r.u8()? {
                    0 => None,
                    1 => Some(r.size()?),
                    _ => return Err(DecodeError("tty flag")),
                };
                let n = r.u32()? as usize;
                if n > MAX_GRANT {
                    return Err(DecodeError("grant too long"));
                }
                let grant = r.take(n)?.to_vec();
                ExecRequest::Start {
                    id,
                    grant,
                    spec: StartSpec {
                        argv,
                        env,
                        cwd: cwd.remove(0),
                        uid,
                        gid,
                        groups,
                        umask,
                        rlimits,
                        hostname: hostname.remove(0),
                        tty,
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
                    data: r.rest().to_vec(),
                });
            }
            4 => ExecRequest::Signal {
                id,
                signal: r.u32()? as i32,
            },
            5 => ExecRequest::Resize {
                id,
                size: r.size()?,
            },
            _ => return Err(DecodeError("unknown request")),
        };
        r.end()?;
        Ok(req)
    }
}

impl ExecReply {
    /// The encoding in pieces whose concatenation is [`ExecReply::encode`]'s:
    /// an output's bytes are pieces of their own, not copied.
    pub fn into_pieces(self) -> Vec<Vec<u8>> {
        match self {
            ExecReply::Output {
                stdout,
                stderr,
                stopped,
                ended,
            } => vec![output_head(stopped, ended, stdout.len()), stdout, stderr],
            other => vec![other.encode()],
        }
    }

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
                stopped,
                ended,
            } => {
                w = output_head(*stopped, *ended, stdout.len());
                w.extend_from_slice(stdout);
                w.extend_from_slice(stderr);
            }
            ExecReply::Done => w.push(3),
        }
        w
    }

    pub fn decode(b: &[u8]) -> Result<ExecReply, DecodeError> {
        let mut r = reader(b);
        let reply = match r.u8()? {
            0 => {
                return std::str::from_utf8(r.rest())
                    .map(|m| ExecReply::Error(m.to_string()))
                    .map_err(|_| DecodeError("error text is not UTF-8"));
            }
            1 => ExecReply::Started { pid: r.u32()? },
            2 => {
                let o = output(r)?;
                return Ok(ExecReply::Output {
                    stdout: o.stdout.to_vec(),
                    stderr: o.stderr.to_vec(),
                    stopped: o.stopped,
                    ended: o.ended,
                });
            }
            3 => ExecReply::Done,
            _ => return Err(DecodeError("unknown reply")),
        };
        r.end()?;
        Ok(reply)
    }
}

/// An [`ExecReply::Output`] read in place: its bytes borrowed from the
/// reply (output at volume is written on without a copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputRef<'a> {
    pub stdout: &'a [u8],
    pub stderr: &'a [u8],
    pub stopped: Option<i32>,
    pub ended: Option<Ended>,
}

impl ExecReply {
    /// The reply in place if it is an output; `None` for any other reply
    /// (decode those with [`ExecReply::decode`]).
    pub fn decode_output(b: &[u8]) -> Result<Option<OutputRef<'_>>, DecodeError> {
        let mut r = reader(b);
        if r.u8()? != 2 {
            return Ok(None);
        }
        output(r).map(Some)
    }
}

/// The rest of an output reply, after its tag.
fn output(mut r: Reader<'_>) -> Result<OutputRef<'_>, DecodeError> {
    let stopped = match r.u8()? {
        0 => None,
        1 => Some(r.u32()? as i32),
        _ => return Err(DecodeError("stopped flag")),
    };
    let ended = r.ended()?;
    let n = r.u32()? as usize;
    let stdout = r.take(n)?;
    Ok(OutputRef {
        stdout,
        stderr: r.rest(),
        stopped,
        ended,
    })
}

/// What `shoal make` tells the make shell that handed it a recipe line:
/// how the line ended.  (The shell hands the line over as an
/// [`ExecRequest::Start`] whose id is left for the home to give, with its
/// standard streams attached, and then passes on the signals it gets as
/// [`ExecRequest::Signal`]s on the same connection.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineEnded(pub Ended);

impl LineEnded {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(5);
        put_ended(&mut w, Some(self.0));
        w
    }

    pub fn decode(b: &[u8]) -> Result<LineEnded, DecodeError> {
        let mut r = reader(b);
        let ended = r.ended()?.ok_or(DecodeError("a line's end"))?;
        r.end()?;
        Ok(LineEnded(ended))
    }
}

/// An output reply up to its stdout: tag, stop, end, stdout's length.
fn output_head(stopped: Option<i32>, ended: Option<Ended>, stdout_len: usize) -> Vec<u8> {
    let mut w = Vec::with_capacity(15);
    w.push(2);
    match stopped {
        None => w.push(0),
        Some(s) => {
            w.push(1);
            put_u32(&mut w, s as u32);
        }
    }
    put_ended(&mut w, ended);
    put_u32(&mut w, stdout_len as u32);
    w
}

/// How a program ended, if it did: 0; 1 and the exit status; 2 and the
/// signal.
fn put_ended(w: &mut Vec<u8>, ended: Option<Ended>) {
    match ended {
        None => w.push(0),
        Some(Ended::Exited(c)) => {
            w.push(1);
            put_u32(w, c as u32);
        }
        Some(Ended::Killed(s)) => {
            w.push(2);
            put_u32(w, s as u32);
        }
    }
}

fn put_u32(w: &mut Vec<u8>, v: u32) {
    w.extend_from_slice(&v.to_le_bytes());
}

fn put_size(w: &mut Vec<u8>, size: WinSize) {
    w.extend_from_slice(&size.rows.to_le_bytes());
    w.extend_from_slice(&size.cols.to_le_bytes());
}

fn put_strings(w: &mut Vec<u8>, strings: &[String]) {
    put_u32(w, strings.len() as u32);
    for s in strings {
        put_u32(w, s.len() as u32);
        w.extend_from_slice(s.as_bytes());
    }
}

/// The shared reader (`shoal_cap::codec`), with the exec messages' own
/// fields.
type Reader<'a> = shoal_cap::codec::Reader<'a>;

fn reader(bytes: &[u8]) -> Reader<'_> {
    Reader::new(bytes, "exec message")
}

impl From<shoal_cap::codec::DecodeError> for DecodeError {
    fn from(e: shoal_cap::codec::DecodeError) -> DecodeError {
        DecodeError(e.why)
    }
}

trait Fields {
    fn ended(&mut self) -> Result<Option<Ended>, DecodeError>;
    fn size(&mut self) -> Result<WinSize, DecodeError>;
    fn groups(&mut self) -> Result<Vec<u32>, DecodeError>;
    fn limit_count(&mut self) -> Result<usize, DecodeError>;
    fn strings(&mut self) -> Result<Vec<String>, DecodeError>;
}

impl Fields for Reader<'_> {
    fn ended(&mut self) -> Result<Option<Ended>, DecodeError> {
        Ok(match self.u8()? {
            0 => None,
            1 => Some(Ended::Exited(self.u32()? as i32)),
            2 => Some(Ended::Killed(self.u32()? as i32)),
            _ => return Err(DecodeError("end kind")),
        })
    }

    fn size(&mut self) -> Result<WinSize, DecodeError> {
        let b = self.take(4)?;
        Ok(WinSize {
            rows: u16::from_le_bytes([b[0], b[1]]),
            cols: u16::from_le_bytes([b[2], b[3]]),
        })
    }

    /// A count of groups, then the groups.
    fn groups(&mut self) -> Result<Vec<u32>, DecodeError> {
        let n = self.u32()? as usize;
        if n > MAX_GROUPS {
            return Err(DecodeError("too many groups"));
        }
        (0..n).map(|_| Ok(self.u32()?)).collect()
    }

    /// A count of resource limits, checked.
    fn limit_count(&mut self) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n > MAX_RLIMITS {
            return Err(DecodeError("too many resource limits"));
        }
        Ok(n)
    }

    fn strings(&mut self) -> Result<Vec<String>, DecodeError> {
        let n = self.u32()? as usize;
        if n > MAX_STRINGS {
            return Err(DecodeError("too many strings"));
        }
        let mut out = Vec::with_capacity(n.min(self.remaining() / 4));
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
                (text(), text()),
                any::<(u32, u32, u32)>(),
                proptest::collection::vec(any::<u32>(), 0..5),
                proptest::collection::vec(any::<(u32, u64, u64)>(), 0..5),
                (
                    proptest::option::of(any::<(u16, u16)>()),
                    proptest::collection::vec(any::<u8>(), 0..40),
                ),
            )
                .prop_map(
                    |(
                        id,
                        argv,
                        env,
                        (cwd, hostname),
                        (uid, gid, umask),
                        groups,
                        limits,
                        (tty, grant),
                    )| {
                        ExecRequest::Start {
                            id,
                            grant,
                            spec: StartSpec {
                                argv,
                                env,
                                cwd,
                                uid,
                                gid,
                                groups,
                                umask,
                                rlimits: limits
                                    .into_iter()
                                    .map(|(resource, soft, hard)| Rlimit {
                                        resource,
                                        soft,
                                        hard,
                                    })
                                    .collect(),
                                hostname,
                                tty: tty.map(|(rows, cols)| WinSize { rows, cols }),
                            },
                        }
                    },
                ),
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
            (id(), any::<(u16, u16)>()).prop_map(|(id, (rows, cols))| ExecRequest::Resize {
                id,
                size: WinSize { rows, cols }
            }),
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
            (bytes(), bytes(), proptest::option::of(any::<i32>()), ended).prop_map(
                |(stdout, stderr, stopped, ended)| ExecReply::Output {
                    stdout,
                    stderr,
                    stopped,
                    ended
                }
            ),
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
            prop_assert_eq!(ExecReply::decode(&r.encode()).unwrap(), r.clone());
            prop_assert_eq!(r.clone().into_pieces().concat(), r.encode());
            let bytes = r.encode();
            match (&r, ExecReply::decode_output(&bytes).unwrap()) {
                (ExecReply::Output { stdout, stderr, stopped, ended }, Some(o)) => {
                    prop_assert_eq!(
                        (o.stdout, o.stderr, o.stopped, o.ended),
                        (&stdout[..], &stderr[..], *stopped, *ended)
                    );
                }
                (ExecReply::Output { .. }, None) => prop_assert!(false, "an output not read as one"),
                (_, o) => prop_assert!(o.is_none()),
            }
        }

        #[test]
        fn grants_round_trip(
            id in id(),
            (uid, gid) in any::<(u32, u32)>(),
            groups in proptest::collection::vec(any::<u32>(), 0..5),
            hard in proptest::collection::vec(any::<(u32, u64)>(), 0..5),
        ) {
            let g = Grant { id, uid, gid, groups, hard };
            prop_assert_eq!(Grant::decode(&g.encode()).unwrap(), g);
        }

        #[test]
        fn a_clamped_start_never_exceeds_its_grant(
            asked_gid in 0u32..6,
            asked_groups in proptest::collection::vec(0u32..6, 0..6),
            granted in proptest::collection::vec(0u32..6, 0..4),
            limits in proptest::collection::vec((0u32..4, any::<u64>(), any::<u64>()), 0..4),
            hard in proptest::collection::vec((0u32..4, any::<u64>()), 0..4),
        ) {
            let id = ProcId { home: NodeId(1), seq: 1 };
            let grant = Grant { id, uid: 1000, gid: 1, groups: granted.clone(), hard: hard.clone() };
            let mut spec = StartSpec {
                uid: 1000,
                gid: asked_gid,
                groups: asked_groups,
                rlimits: limits.iter().map(|&(resource, soft, hard)| Rlimit { resource, soft, hard }).collect(),
                ..StartSpec::default()
            };
            match grant.clamp(id, &mut spec) {
                Err(_) => prop_assert!(asked_gid != 1 && !granted.contains(&asked_gid)),
                Ok(()) => {
                    prop_assert!(spec.groups.iter().all(|g| granted.contains(g)));
                    for &(resource, h) in &hard {
                        for l in spec.rlimits.iter().filter(|l| l.resource == resource) {
                            prop_assert!(l.hard <= h && l.soft <= l.hard);
                        }
                        prop_assert!(spec.rlimits.iter().any(|l| l.resource == resource));
                    }
                }
            }
            // Another uid, or another process's grant, is refused.
            let mut other = StartSpec { uid: 1001, ..StartSpec::default() };
            prop_assert!(grant.clamp(id, &mut other).is_err());
            let another = ProcId { home: NodeId(1), seq: 2 };
            prop_assert!(grant.clamp(another, &mut spec).is_err());
        }

        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Grant::decode(&b);
            let _ = ExecRequest::decode(&b);
            let _ = ExecReply::decode(&b);
            let _ = LineEnded::decode(&b);
        }

        #[test]
        fn line_ends_round_trip(v in any::<i32>()) {
            for e in [LineEnded(Ended::Exited(v)), LineEnded(Ended::Killed(v))] {
                prop_assert_eq!(LineEnded::decode(&e.encode()).unwrap(), e);
            }
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
            grant: Vec::new(),
        };
        assert!(ExecRequest::decode(&r.encode()).is_err());
    }
}
