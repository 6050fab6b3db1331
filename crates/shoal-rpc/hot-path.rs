//! The build script of the `shoal` and `shoal-bench` packages (their
//! `Cargo.toml`s name it): links the code of a small call together, as
//! `hot-path.ld` beside it says, into their binaries.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let script = format!("{dir}/../shoal-rpc/hot-path.ld");
    println!("cargo:rerun-if-changed={script}");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg-bins=-Wl,-T,{script}");
    }
}
