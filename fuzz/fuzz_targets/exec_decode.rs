//! The processor pool's decoders (`ExecRequest`, `ExecReply`,
//! `LineEnded`, `Grant`, `ProcId` text) never panic, and every value they accept
//! re-encodes to bytes that decode to an equal value.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_pool::ProcId;
use shoal_pool::exec::{ExecReply, ExecRequest, Grant, LineEnded};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = ExecRequest::decode(data) {
        let again = ExecRequest::decode(&r.encode()).expect("a re-encoded request decodes");
        assert_eq!(again, r, "re-encoding changed the request");
    }
    // Read in place, an output is what the full decoder makes of it.
    if let Ok(Some(o)) = ExecReply::decode_output(data) {
        match ExecReply::decode(data).expect("an output read in place decodes") {
            ExecReply::Output {
                stdout,
                stderr,
                stopped,
                ended,
            } => assert_eq!((o.stdout, o.stderr, o.stopped, o.ended), (&stdout[..], &stderr[..], stopped, ended)),
            other => panic!("read in place as an output, decoded as {other:?}"),
        }
    }
    if let Ok(r) = ExecReply::decode(data) {
        let again = ExecReply::decode(&r.encode()).expect("a re-encoded reply decodes");
        assert_eq!(again, r, "re-encoding changed the reply");
    }
    if let Ok(g) = Grant::decode(data) {
        assert_eq!(Grant::decode(&g.encode()), Ok(g), "re-encoding changed the grant");
    }
    if let Ok(e) = LineEnded::decode(data) {
        assert_eq!(LineEnded::decode(&e.encode()), Ok(e), "re-encoding changed the line's end");
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(id) = text.parse::<ProcId>()
    {
        assert_eq!(id.to_string().parse::<ProcId>(), Ok(id));
    }
});
