//! The metadata service's client, as a mount uses it: one session (a
//! random `ClientId`), request numbers that make retried changes
//! exactly-once, and calls aimed at the primary (the replica whose status
//! says it takes the writes), followed when the primary moves.

use std::time::Duration;

use shoal_cap::{Capability, PutPort};
use shoal_fs::model::{Attr, Identity, Ino};
use shoal_fs::op::{self, Failure, Op, Reply};
use shoal_fs::tokens::ClientId;
use shoal_replicasvc::client::{self, Tries, Verdict};
use shoal_replicasvc::writes_at::Endpoint;
use shoal_rpc::{Client, Context};

/// How long a call keeps trying through primary changes and lost
/// answers before it reports the service unavailable.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// What a hello learns.
#[derive(Debug, Clone)]
pub struct Hello {
    pub root: Attr,
    pub servers: Vec<shoal_cap::Capability>,
    pub copies: usize,
}

/// A session with a file system's metadata service.
pub struct FsClient {
    rpc: Client,
    port: PutPort,
    session: u64,
    seq: u64,
}

impl FsClient {
    /// A new session with file system `name` of the context's cluster (not
    /// yet known to the primary: say [`FsClient::hello`]).
    pub fn new(ctx: &Context, name: &str) -> Result<FsClient, Failure> {
        let cluster = ctx.config().cluster;
        Ok(FsClient {
            rpc: ctx
                .client()
                .map_err(|e| Failure::Unavailable(format!("cannot make an RPC client: {e}")))?,
            port: crate::service_port(&cluster, name).put_port(),
            session: rand::random::<u64>() | 1,
            seq: 0,
        })
    }

    /// Another caller for an existing session (a mount's thread that keeps
    /// its `Events` request parked while others call).  It must not send
    /// changes: their request numbers are the first caller's.
    pub fn for_session(ctx: &Context, name: &str, session: u64) -> Result<FsClient, Failure> {
        let mut c = FsClient::new(ctx, name)?;
        c.session = session;
        Ok(c)
    }

    /// A caller that acts by capability on the file system that made
    /// `cap`: any program may, with no session and no identity of its
    /// own (the capability's rights are what it may do).
    pub fn for_capability(ctx: &Context, cap: &Capability) -> Result<FsClient, Failure> {
        Ok(FsClient {
            rpc: ctx
                .client()
                .map_err(|e| Failure::Unavailable(format!("cannot make an RPC client: {e}")))?,
            port: cap.port(),
            session: 0,
            seq: 0,
        })
    }

    /// The attributes of the inode `cap` names.
    pub fn cap_stat(&mut self, cap: &Capability) -> Result<Attr, Failure> {
        match self.call(&nobody(), Op::CapStat { cap: *cap })? {
            Reply::Entry { attr, .. } => Ok(attr),
            other => Err(unexpected(&other)),
        }
    }

    /// Up to `len` bytes (at most [`op::IO_MAX`]) at `offset` of the file
    /// `cap` names: its latest bytes, written back from any mount that
    /// held them.
    pub fn cap_read(
        &mut self,
        cap: &Capability,
        offset: u64,
        len: u32,
    ) -> Result<Vec<u8>, Failure> {
        let op = Op::CapRead {
            cap: *cap,
            offset,
            len: len.min(op::IO_MAX as u32),
        };
        match self.call(&nobody(), op)? {
            Reply::Data(d) => Ok(d),
            other => Err(unexpected(&other)),
        }
    }

    /// The session's number (its `ClientId` at the primary).
    pub fn session(&self) -> u64 {
        self.session
    }

    /// Starts (or, after [`Failure::NoSession`], restarts) the session;
    /// returns the root's attributes, the file servers for contents and
    /// how many copies of each to store.
    pub fn hello(&mut self, node: &str) -> Result<Hello, Failure> {
        let op = Op::Hello {
            instance: rand::random(),
            node: node.as_bytes().to_vec(),
        };
        match self.call(&Identity::root(), op)? {
            Reply::Hello {
                root,
                servers,
                copies,
                ..
            } => Ok(Hello {
                root,
                servers,
                copies: copies.max(1) as usize,
            }),
            other => Err(unexpected(&other)),
        }
    }

    /// Sends one request as `who`, retrying (with the same request number,
    /// so a change is made once) through lost answers and primary changes
    /// for up to [`PATIENCE`].
    pub fn call(&mut self, who: &Identity, op: Op) -> Result<Reply, Failure> {
        self.call_within(who, op, PATIENCE)
    }

    /// [`FsClient::call`], trying for up to `patience`.
    pub fn call_within(
        &mut self,
        who: &Identity,
        op: Op,
        patience: Duration,
    ) -> Result<Reply, Failure> {
        self.seq += 1;
        let events = matches!(op, Op::Events { .. });
        let bytes = op::Request {
            session: ClientId(self.session),
            seq: self.seq,
            who: who.clone(),
            op,
        }
        .encode();
        let tries = Tries {
            patience,
            each: if events {
                crate::primary::EVENTS_HOLD + Duration::from_secs(3)
            } else {
                Duration::from_secs(5)
            },
            each_within_patience: false,
            pause: Duration::from_millis(50),
        };
        let (port, session) = (self.port, self.session);
        let again = |why: String| Verdict::Again {
            why,
            elsewhere: false,
        };
        let outcome = client::call(&mut self.rpc, &port, &bytes, &tries, |rpc, sent| {
            let reply = match sent {
                Ok(reply) => reply,
                Err(e) => return again(e.to_string()),
            };
            match op::decode_reply(&reply) {
                Ok(Err(Failure::NotPrimary)) => {
                    follow(rpc, &port);
                    again("no replica is the primary".into())
                }
                Ok(Err(Failure::Unavailable(why))) => again(why),
                // A caller by capability has no session to lose: a new
                // primary dropped its waiting request; ask again.
                Ok(Err(Failure::NoSession)) if session == 0 => again("the primary changed".into()),
                Ok(answer) => Verdict::Done(answer),
                Err(e) => Verdict::Done(Err(Failure::Unavailable(format!("bad reply: {e}")))),
            }
        });
        outcome.unwrap_or_else(|last| {
            Err(Failure::Unavailable(
                last.unwrap_or_else(|| "no answer".into()),
            ))
        })
    }

    /// Has the primary touch every content version its tree holds, a
    /// batch of inodes at a time (the object manager's, before it ages
    /// the file servers; a node's root only): how many the file servers
    /// had and had not.
    pub fn touch_contents(&mut self) -> Result<(u64, u64), Failure> {
        let (mut after, mut touched, mut missing) = (Ino(0), 0, 0);
        loop {
            match self.call(&Identity::root(), Op::TouchContents { after })? {
                Reply::Touched {
                    next,
                    touched: t,
                    missing: m,
                } => {
                    touched += t;
                    missing += m;
                    match next {
                        Some(n) => after = n,
                        None => return Ok((touched, missing)),
                    }
                }
                other => return Err(unexpected(&other)),
            }
        }
    }

    /// The status of whichever replica answers within 5 s.
    pub fn status(&mut self) -> Result<serde_json::Value, Failure> {
        match self.call_within(&Identity::root(), Op::Status, Duration::from_secs(5))? {
            Reply::Status(s) => serde_json::from_str(&s)
                .map_err(|e| Failure::Unavailable(format!("bad status: {e}"))),
            other => Err(unexpected(&other)),
        }
    }
}

/// The identity a request by capability names (the service ignores it).
fn nobody() -> Identity {
    Identity::user(65_534, 65_534)
}

/// A reply of the wrong kind.
pub fn unexpected(reply: &Reply) -> Failure {
    Failure::Unavailable(format!("unexpected reply {reply:?}"))
}

/// Asks a replica where the primary is and aims `rpc`'s calls to `port`
/// there (`shoal_replicasvc::writes_at::follow`, with the metadata
/// service's status request).
fn follow(rpc: &mut Client, port: &PutPort) -> Option<Endpoint> {
    let req = op::Request {
        session: ClientId(0),
        seq: 0,
        who: Identity::root(),
        op: Op::Status,
    };
    shoal_replicasvc::writes_at::follow(rpc, port, req.encode(), |reply| {
        match op::decode_reply(reply) {
            Ok(Ok(Reply::Status(s))) => Some(s),
            _ => None,
        }
    })
}
