//! The JSON a program or a peer sends a node never panics the node's
//! parsers: the link protocol's `LinkRequest` and the node service's
//! `NodeRequest`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_nodesvc::service::NodeRequest;
use shoal_rpc::link::LinkRequest;

fuzz_target!(|data: &[u8]| {
    let _ = serde_json::from_slice::<LinkRequest>(data);
    let _ = serde_json::from_slice::<NodeRequest>(data);
});
