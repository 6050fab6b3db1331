//! A node's TOML configuration file never panics the node: neither
//! parsing it (`NodeConfigFile`) nor resolving it (`NodeConfig::resolve`).

#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_nodesvc::{NodeConfig, NodeConfigFile};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(file) = toml::from_str::<NodeConfigFile>(text) {
        let _ = NodeConfig::resolve(file);
    }
});
