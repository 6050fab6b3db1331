//! Where the directory service's writes go: the replica whose group
//! member is the sequencer (`shoal_replicasvc::writes_at`), and how a
//! client follows it.

use std::time::Duration;

use serde_json::Value;
use shoal_cap::PutPort;
use shoal_dir::{Answer, Request, Response};
use shoal_rpc::{CallOptions, Client};

pub use shoal_replicasvc::writes_at::{Endpoint, choose};

/// Asks the replica `rpc` reaches for `port` where the service's writes go
/// and aims `rpc`'s calls to `port` there; returns the endpoint, or `None`
/// if the replica does not say (an rpc2pc one, or one between groups) or
/// does not answer within a second.
pub fn follow(rpc: &mut Client, port: &PutPort) -> Option<Endpoint> {
    let opts = CallOptions {
        deadline: Some(Duration::from_secs(1)),
        cancel: None,
    };
    let reply = rpc
        .trans_with(port, Request::status().encode(), &opts)
        .ok()?;
    let Ok(Response {
        result: Ok(Answer::Status(s)),
        ..
    }) = Response::decode(&reply)
    else {
        return None;
    };
    let v = serde_json::from_str::<Value>(&s).ok()?;
    let at = Endpoint::from_json(&v["writes_at"])?;
    rpc.aim(port, at.node, at.instance);
    Some(at)
}
