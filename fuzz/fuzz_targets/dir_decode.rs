//! The directory service's decoders (requests, responses, snapshots, log
//! files) never panic; what they accept re-encodes to bytes that decode
//! the same; and a replica fed a decoded request applies it without
//! panicking, staying decodable (its snapshot round-trips).

#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_cap::GetPort;
use shoal_dir::replica::{ReplicaState, encode_entry};
use shoal_dir::{DirState, Request, Response, log};

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = Request::decode(data) {
        assert_eq!(Request::decode(&req.encode()).expect("re-encoded request"), req);
        // Apply it to a state with one directory, as a replica would.
        let port = GetPort::from_bytes([3; 16]).put_port();
        let mut rs = ReplicaState::new(DirState::new(port));
        let mk = Request {
            client: 1,
            seq: 1,
            min_index: 0,
            flags: 0,
            op: shoal_dir::Op::CreateDir {
                columns: vec![b"owner".to_vec()],
                secret: [7; 32],
            },
        };
        rs.deliver(&encode_entry(1, &mk));
        rs.deliver(&encode_entry(2, &req));
        let _ = rs.read(&req);
        let snap = rs.state.encode_snapshot();
        assert_eq!(DirState::decode_snapshot(&snap).expect("snapshot"), rs.state);
    }
    if let Ok(resp) = Response::decode(data) {
        assert_eq!(Response::decode(&resp.encode()).expect("re-encoded response"), resp);
    }
    if let Ok(state) = DirState::decode_snapshot(data) {
        let again = DirState::decode_snapshot(&state.encode_snapshot()).expect("snapshot");
        assert_eq!(again, state);
    }
    if let Some(parsed) = log::parse(data) {
        assert!(parsed.valid_len <= data.len());
        let _ = log::recover(GetPort::from_bytes([3; 16]).put_port(), None, &[(parsed.base, data)]);
    }
});
