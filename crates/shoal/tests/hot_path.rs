//! The code of a small call is linked together (`crates/shoal-rpc/hot-path.ld`):
//! the section exists in the `shoal` binary and the request path's main
//! functions, client and server, are in it.  A rename that left the
//! script's names behind fails here, not silently in a benchmark.

use std::process::Command;

/// `tool ARGS` on the binary under test, its standard output.
fn binutils(tool: &str, args: &[&str]) -> String {
    let exe = env!("CARGO_BIN_EXE_shoal");
    let out = Command::new(tool)
        .args(args)
        .arg(exe)
        .output()
        .unwrap_or_else(|e| panic!("{tool} (binutils): {e}"));
    assert!(out.status.success(), "{tool} {exe}: {out:?}");
    String::from_utf8(out.stdout).expect("binutils print text")
}

#[test]
fn the_request_path_is_linked_together() {
    // `[Nr] Name Type Address Off Size ...`
    let sections = binutils("readelf", &["-SW"]);
    let line = sections
        .lines()
        .find(|l| l.contains(" .text.hot_path "))
        .unwrap_or_else(|| panic!("no .text.hot_path section:\n{sections}"));
    let fields: Vec<&str> = line
        .split_whitespace()
        .skip_while(|f| *f != ".text.hot_path")
        .collect();
    let start = u64::from_str_radix(fields[2], 16).expect("hex address");
    let size = u64::from_str_radix(fields[4], 16).expect("hex size");
    assert!(size > 0, "{line}");

    let symbols = binutils("nm", &[]);
    let inside = |name: &str| {
        symbols.lines().any(|l| {
            let mut f = l.split_whitespace();
            let (Some(addr), Some(_), Some(sym)) = (f.next(), f.next(), f.next()) else {
                return false;
            };
            let addr = u64::from_str_radix(addr, 16).unwrap_or(0);
            sym.contains(name) && (start..start + size).contains(&addr)
        })
    };
    for name in [
        "9shoal_rpc6server6Server6getreq17h",
        "11shoal_proto6server10ServerCore13handle_packet17h",
        "11shoal_proto6client10ClientCore13handle_packet17h",
        "9shoal_rpc6client6Client10trans_with17h",
        "13shoal_session8datagram4seal17h",
        "10shoal_wire5codec11decode_body17h",
    ] {
        assert!(inside(name), "{name} is not in .text.hot_path");
    }
}
