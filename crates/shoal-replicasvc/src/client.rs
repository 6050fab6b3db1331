//! The client half of a replicated service: one request, sent again with
//! the same bytes (so with the same request number, which the service
//! applies once) until an answer is final or patience runs out.  The
//! directory's `DirClient` and the file system's `FsClient` call through
//! it, each judging its own answers: final, or not yet (a replica behind,
//! between groups, not the primary) and whether to try another replica.
//! Where writes go is [`crate::writes_at::follow`]'s.

use std::time::{Duration, Instant};

use shoal_cap::PutPort;
use shoal_rpc::{CallOptions, Client};

/// How long to keep trying.
#[derive(Debug, Clone, Copy)]
pub struct Tries {
    /// Until the call gives up.
    pub patience: Duration,
    /// The deadline of each try; cut to what patience has left if
    /// `each_within_patience`.
    pub each: Duration,
    pub each_within_patience: bool,
    /// The wait between tries.
    pub pause: Duration,
}

/// What a try's outcome means.
pub enum Verdict<T> {
    /// Final: the call returns it.
    Done(T),
    /// Not final: try again after the pause, at another replica if
    /// `elsewhere` (the port's cached location is forgotten).
    Again { why: String, elsewhere: bool },
}

/// Sends `body` to `port` until `judge` calls an outcome final or
/// `tries.patience` has passed.  `judge` gets the client too (to aim it
/// elsewhere, say).  Returns the final value, or the last reason given
/// (`None` if no try was made).
pub fn call<T>(
    rpc: &mut Client,
    port: &PutPort,
    body: &[u8],
    tries: &Tries,
    mut judge: impl FnMut(&mut Client, Result<Vec<u8>, shoal_rpc::Error>) -> Verdict<T>,
) -> Result<T, Option<String>> {
    let deadline = Instant::now() + tries.patience;
    let mut last = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(last);
        }
        let each = if tries.each_within_patience {
            left.min(tries.each)
        } else {
            tries.each
        };
        let opts = CallOptions {
            deadline: Some(each),
            cancel: None,
        };
        let outcome = rpc.trans_with(port, body.to_vec(), &opts);
        match judge(rpc, outcome) {
            Verdict::Done(t) => return Ok(t),
            Verdict::Again { why, elsewhere } => {
                last = Some(why);
                if elsewhere {
                    rpc.forget(port);
                }
            }
        }
        std::thread::sleep(tries.pause);
    }
}
