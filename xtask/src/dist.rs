//! `cargo xtask dist`: shoal's Debian packages (`shoal-dist`), built from
//! the product binaries (`target/product/`) into `target/dist/`.

use std::path::PathBuf;

use crate::{root, step};

/// The documents installed under `/usr/share/doc/shoal`.
const DOCS: &[&str] = &["README.md", "docs/operations.md", "docs/services.md"];

pub fn dist() -> Result<Vec<PathBuf>, String> {
    crate::build_product()?;
    let bin = root().join("target/product");
    let docs = DOCS
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(root().join(path))
                .map_err(|e| format!("cannot read {path}: {e}"))?;
            let name = path.rsplit('/').next().unwrap_or(path).to_string();
            Ok((name, text))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let inputs = shoal_dist::Inputs {
        shoal: bin.join("shoal"),
        make_shell: bin.join("shoal-make-shell"),
        bench: Some(bin.join("shoal-bench")),
        docs,
        version: env!("CARGO_PKG_VERSION").to_string(),
        arch: shoal_dist::host_arch()?,
        out: root().join("target/dist"),
    };
    step("packing the Debian packages");
    let debs = shoal_dist::build(&inputs)?;
    for deb in &debs {
        let size = std::fs::metadata(deb).map(|m| m.len()).unwrap_or(0);
        println!("  {} ({:.1} MB)", deb.display(), size as f64 / 1e6);
    }
    Ok(debs)
}
