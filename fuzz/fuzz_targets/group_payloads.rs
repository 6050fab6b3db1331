//! The decoders of group payloads (a join entry's member, a view entry, a
//! state transfer's metadata) and of the members' key service (requests
//! and replies) never panic, and whatever they accept re-encodes to bytes
//! that decode the same.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_group::keys::{decode_reply, decode_request, encode_reply, encode_request};
use shoal_wire::group::{
    decode_member, decode_members, decode_state, decode_view, encode_member, encode_members,
    encode_state, encode_view,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = decode_member(data) {
        let mut out = Vec::new();
        encode_member(&m, &mut out);
        assert_eq!(decode_member(&out).expect("re-encoded member"), m);
    }
    if let Ok(list) = decode_members(data) {
        let mut out = Vec::new();
        encode_members(&list, &mut out);
        assert_eq!(decode_members(&out).expect("re-encoded members"), list);
    }
    if let Ok(view) = decode_view(data) {
        let mut out = Vec::new();
        encode_view(&view, &mut out);
        assert_eq!(decode_view(&out).expect("re-encoded view"), view);
    }
    if let Ok(r) = decode_request(data) {
        assert_eq!(decode_request(&encode_request(&r)).expect("re-encoded request"), r);
    }
    if let Ok(r) = decode_reply(data) {
        assert_eq!(decode_reply(&encode_reply(&r)).expect("re-encoded reply"), r);
    }
    if let Ok((meta, app)) = decode_state(data) {
        let mut out = Vec::new();
        encode_state(&meta, app, &mut out);
        let (again, app_again) = decode_state(&out).expect("re-encoded state");
        assert_eq!(again, meta);
        assert_eq!(app_again, app);
    }
});
