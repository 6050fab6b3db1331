//! Capabilities and their parts never panic when parsed, from bytes or
//! text, and whatever parses prints back to the same value: a capability
//! through `to_bytes` and `Display`, rights, put-ports and object ids
//! through `Display`.

#![no_main]

use std::fmt::Display;
use std::str::FromStr;

use libfuzzer_sys::fuzz_target;
use shoal_cap::{Capability, GetPort, ObjectId, PutPort, Rights};

fuzz_target!(|data: &[u8]| {
    if let Ok(cap) = Capability::from_bytes(data) {
        assert_eq!(Capability::from_bytes(&cap.to_bytes()), Ok(cap));
        round_trip(&cap);
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cap) = text.parse::<Capability>() {
        assert_eq!(Capability::from_bytes(&cap.to_bytes()), Ok(cap));
        round_trip(&cap);
    }
    let _ = text.parse::<GetPort>();
    if let Ok(port) = text.parse::<PutPort>() {
        round_trip(&port);
    }
    if let Ok(rights) = text.parse::<Rights>() {
        round_trip(&rights);
    }
    if let Ok(id) = text.parse::<ObjectId>() {
        round_trip(&id);
    }
});

/// `value` prints to text that parses back to `value`.
fn round_trip<T>(value: &T)
where
    T: Display + FromStr + PartialEq + std::fmt::Debug,
    T::Err: std::fmt::Debug,
{
    let text = value.to_string();
    assert_eq!(&text.parse::<T>().expect("printed form parses"), value);
}
