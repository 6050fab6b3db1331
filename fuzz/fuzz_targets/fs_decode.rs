//! The file system core's decoders (updates, answers, snapshots, a
//! client's requests and the primary's replies, metadata logs) never
//! panic; what they accept re-encodes to bytes that decode the same; and
//! a tree fed a decoded update applies it without panicking, its snapshot
//! still decoding to the same bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_cap::codec::{Reader, Writer};
use shoal_fs::model::{Identity, Timestamp};
use shoal_fs::op::{Request, decode_reply, encode_reply};
use shoal_fs::replica::FsReplica;
use shoal_replica::Machine;
use shoal_fs::update::{read_result, write_result};
use shoal_fs::{Tree, Update, UpdateOp};

fuzz_target!(|data: &[u8]| {
    if let Ok(u) = Update::decode(data) {
        assert_eq!(Update::decode(&u.encode()).expect("re-encoded update"), u);
        let mut tree = Tree::new([1; 16], Timestamp::new(1, 0));
        let range = Update {
            session: shoal_fs::tokens::ClientId(0),
            seq: 0,
            who: Identity::root(),
            now: Timestamp::new(2, 0),
            op: UpdateOp::Range { count: 64 },
        };
        tree.apply(&range);
        tree.apply(&u);
        let snap = tree.encode_snapshot();
        let back = Tree::decode_snapshot(&snap).expect("snapshot");
        assert_eq!(back.encode_snapshot(), snap);
    }
    let r = &mut Reader::new(data, "fuzz");
    if let Ok(res) = read_result(r, false)
        && r.end().is_ok()
    {
        let mut out = Vec::new();
        write_result(&mut Writer(&mut out), &res);
        let r2 = &mut Reader::new(&out, "fuzz");
        assert_eq!(read_result(r2, false).expect("re-encoded answer"), res);
    }
    if let Ok(req) = Request::decode(data) {
        assert_eq!(Request::decode(&req.encode()).expect("re-encoded request"), req);
    }
    if let Ok(reply) = decode_reply(data) {
        assert_eq!(decode_reply(&encode_reply(&reply)).expect("re-encoded reply"), reply);
    }
    let port = shoal_cap::PutPort::from_bytes([1; 16]);
    let _ = FsReplica::recover(port, None, &[(0, data)]);
    if let Ok(tree) = Tree::decode_snapshot(data) {
        let snap = tree.encode_snapshot();
        let again = Tree::decode_snapshot(&snap).expect("snapshot");
        assert_eq!(again.encode_snapshot(), snap);
    }
});
