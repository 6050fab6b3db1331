//! Where a group-variant service orders its writes: the replica whose
//! group member is the sequencer.
//!
//! Any replica takes a write and sends it through the group, but one sent
//! from the sequencer's own replica skips the hop to the sequencer (the
//! group's r + 3 messages become r + 2, as for a client next to Amoeba's
//! sequencer).  So every replica says, in its status, where the writes
//! go: its own client endpoint if it is the sequencer's, else the
//! endpoint its peers' statuses give for the sequencer's member.  A
//! client (the directory's `DirClient`, the file system's `FsClient`) asks
//! once in a while ([`follow`]) and aims its calls there;
//! the RPC layer uses the advised endpoint only as that endpoint's node
//! confirms it serves the port, so a replica can steer a client to no one
//! but another server of the same service.

use std::time::Duration;

use serde_json::{Value, json};
use shoal_cap::PutPort;
use shoal_rpc::{CallOptions, Client};
use shoal_wire::{Instance, NodeId};

/// A replica's client endpoint: the node it runs on and its server's
/// instance there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub node: NodeId,
    pub instance: Instance,
}

impl Endpoint {
    /// As a status shows it: `{"node": hex, "instance": hex}`.
    pub fn to_json(self) -> Value {
        json!({ "node": self.node.to_string(), "instance": self.instance.to_string() })
    }

    /// From [`Endpoint::to_json`]'s form; `None` for anything else (or a
    /// zero id).
    pub fn from_json(v: &Value) -> Option<Endpoint> {
        let hex = |k: &str| {
            let s = v[k].as_str()?;
            (s.len() == 16)
                .then(|| u64::from_str_radix(s, 16).ok())
                .flatten()
                .filter(|&x| x != 0)
        };
        Some(Endpoint {
            node: NodeId(hex("node")?),
            instance: Instance(hex("instance")?),
        })
    }
}

/// The endpoint that takes writes best, given the sequencer's member id,
/// this replica's member id and endpoint, and its peers' statuses (each
/// with its `member` and `endpoint`).  `None` if no replica known serves
/// for the sequencer's member.
pub fn choose(sequencer: &str, me: (&str, Option<Endpoint>), peers: &[Value]) -> Option<Endpoint> {
    if sequencer.is_empty() {
        return None;
    }
    if me.0 == sequencer {
        return me.1;
    }
    peers
        .iter()
        .filter(|p| p["member"].as_str() == Some(sequencer))
        .find_map(|p| Endpoint::from_json(&p["endpoint"]))
}

/// Asks the replica `rpc` reaches for `port` where the service's writes
/// go and aims `rpc`'s calls to `port` there: `status_request` is the
/// service's own status request, `status_text` finds the status's JSON in
/// its answer.  Returns the endpoint, or `None` if the replica does not
/// say (one between groups, or not a group replica) or does not answer
/// within a second.
pub fn follow(
    rpc: &mut Client,
    port: &PutPort,
    status_request: Vec<u8>,
    status_text: impl FnOnce(&[u8]) -> Option<String>,
) -> Option<Endpoint> {
    let opts = CallOptions {
        deadline: Some(Duration::from_secs(1)),
        cancel: None,
    };
    let reply = rpc.trans_with(port, status_request, &opts).ok()?;
    let v = serde_json::from_str::<Value>(&status_text(&reply)?).ok()?;
    let at = Endpoint::from_json(&v["writes_at"])?;
    rpc.aim(port, at.node, at.instance);
    Some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(n: u64) -> Endpoint {
        Endpoint {
            node: NodeId(n),
            instance: Instance(n * 10),
        }
    }

    #[test]
    fn the_sequencers_replica_takes_the_writes() {
        let peers = vec![
            json!({ "member": "b", "endpoint": ep(2).to_json() }),
            json!({ "member": "c", "endpoint": ep(3).to_json() }),
            json!(null),
        ];
        assert_eq!(choose("a", ("a", Some(ep(1))), &peers), Some(ep(1)));
        assert_eq!(choose("c", ("a", Some(ep(1))), &peers), Some(ep(3)));
        // A sequencer no replica reports, or none at all.
        assert_eq!(choose("d", ("a", Some(ep(1))), &peers), None);
        assert_eq!(choose("", ("", None), &peers), None);
        // Not serving yet: no endpoint of its own.
        assert_eq!(choose("a", ("a", None), &peers), None);
    }

    #[test]
    fn endpoints_round_trip_and_bad_forms_are_refused() {
        assert_eq!(Endpoint::from_json(&ep(7).to_json()), Some(ep(7)));
        for bad in [
            json!(null),
            json!({ "node": "7", "instance": "70" }),
            json!({ "node": "000000000000000g", "instance": "0000000000000046" }),
            json!({ "node": "0000000000000000", "instance": "0000000000000046" }),
            json!({ "node": 7, "instance": 70 }),
        ] {
            assert_eq!(Endpoint::from_json(&bad), None, "{bad}");
        }
    }
}
