//! Where the directory service's writes go: the replica whose group
//! member is the sequencer (`shoal_replicasvc::writes_at`), and how a
//! client follows it.

use shoal_cap::PutPort;
use shoal_dir::{Answer, Request, Response};
use shoal_rpc::Client;

pub use shoal_replicasvc::writes_at::{Endpoint, choose};

/// Asks the replica `rpc` reaches for `port` where the service's writes go
/// and aims `rpc`'s calls to `port` there (`shoal_replicasvc::writes_at::
/// follow`, with the directory's status request); returns the endpoint,
/// or `None` if the replica does not say or does not answer within a
/// second.
pub fn follow(rpc: &mut Client, port: &PutPort) -> Option<Endpoint> {
    shoal_replicasvc::writes_at::follow(rpc, port, Request::status().encode(), |reply| {
        match Response::decode(reply) {
            Ok(Response {
                result: Ok(Answer::Status(s)),
                ..
            }) => Some(s),
            _ => None,
        }
    })
}
