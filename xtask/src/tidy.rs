//! The tidy tests, run by `cargo test` (and so by `cargo xtask test`) as
//! rust-analyzer runs its own: what a reviewer would otherwise check by
//! hand on every change.
//!
//! - Every source file opens with a `//!` note saying what it is for.
//! - No source file is over [`LINES_MAX`] lines.
//! - `docs/ARCHITECTURE.md`, the map, has a `### \`PATH\`` section for
//!   every crate of the workspace (and the fuzz crate), in dependency
//!   order (a crate after every crate it names in its `Cargo.toml`), and
//!   everything it
//!   names in backticks exists: crates and programs by name, files by
//!   path. A file inside a crate's section is named from that crate's
//!   `src/` or from the crate's directory (`tests/fs.rs`); anywhere, a
//!   path from the repository's root (`crates/shoal-sim/src/fs.rs`).
//!
//! Source files are the `.rs` files under `crates/`, `xtask/` and `fuzz/`
//! (not `third_party/`, code kept as it came, nor build output).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Most lines in one source file.
pub const LINES_MAX: usize = 1000;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the repository")
        .to_path_buf()
}

/// Every source file, as a path from the root.
fn sources(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for top in ["crates", "xtask", "fuzz"] {
        walk(root, &root.join(top), &mut out);
    }
    out.sort();
    out
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            // Build output and the fuzzer's inputs hold no sources.
            if !matches!(&*name, "target" | "corpus" | "artifacts" | "dict") {
                walk(root, &path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(
                path.strip_prefix(root)
                    .expect("under the root")
                    .to_path_buf(),
            );
        }
    }
}

/// The first line of `text` that is not blank.
fn first_line(text: &str) -> &str {
    text.lines().find(|l| !l.trim().is_empty()).unwrap_or("")
}

/// The workspace's members, from the root `Cargo.toml`.
fn members(root: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(root.join("Cargo.toml")).expect("the root Cargo.toml");
    let start = text.find("members = [").expect("a members list");
    let list = &text[start..start + text[start..].find(']').expect("a closed list")];
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The names of the workspace's packages and of the programs they build.
fn names(root: &Path, crates: &[String]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for c in crates {
        let text = std::fs::read_to_string(root.join(c).join("Cargo.toml"))
            .unwrap_or_else(|e| panic!("{c}/Cargo.toml: {e}"));
        for line in text.lines() {
            if let Some(v) = line.strip_prefix("name = ") {
                names.insert(v.trim_matches('"').to_string());
            }
        }
        let bin = root.join(c).join("src/bin");
        for entry in std::fs::read_dir(bin).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if let Some(stem) = name.strip_suffix(".rs") {
                names.insert(stem.to_string());
            }
        }
    }
    names
}

/// The backticked words of a line (code fences are skipped by the caller).
fn ticked(line: &str) -> impl Iterator<Item = &str> {
    line.split('`').skip(1).step_by(2)
}

/// What is wrong with the map `text`: one line each.
fn check_map(root: &Path, text: &str) -> Vec<String> {
    let mut crates = members(root);
    crates.push("fuzz".to_string());
    let names = names(root, &crates);
    let mut wrong = Vec::new();
    let mut sections = BTreeSet::new();
    let mut order = Vec::new();
    let mut here: Option<String> = None;
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        let at = n + 1;
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if line.starts_with('#') {
            here = None;
            if let Some(path) = line.strip_prefix("### `").and_then(|r| r.strip_suffix('`')) {
                if !root.join(path).join("Cargo.toml").is_file() {
                    wrong.push(format!("line {at}: section `{path}` is no crate"));
                }
                sections.insert(path.to_string());
                order.push(path.to_string());
                here = Some(path.to_string());
            }
            continue;
        }
        for word in ticked(line) {
            if let Some(problem) = check_word(root, &names, here.as_deref(), word) {
                wrong.push(format!("line {at}: {problem}"));
            }
        }
    }
    for c in &crates {
        if !sections.contains(c) {
            wrong.push(format!("no section for the crate `{c}`"));
        }
    }
    wrong.extend(check_order(root, &order));
    wrong
}

/// Whether the sections (crate directories, in the map's order) come
/// after every workspace crate each depends on.
fn check_order(root: &Path, order: &[String]) -> Vec<String> {
    // Each section's package name and place, read once.
    let place: std::collections::BTreeMap<String, usize> = order
        .iter()
        .enumerate()
        .filter_map(|(i, d)| Some((package_name(root, d)?, i)))
        .collect();
    let mut wrong = Vec::new();
    for (i, dir) in order.iter().enumerate() {
        let text = std::fs::read_to_string(root.join(dir).join("Cargo.toml")).unwrap_or_default();
        for line in text.lines() {
            let Some(dep) = line.split(['.', ' ', '=']).next() else {
                continue;
            };
            if !dep.starts_with("shoal")
                || !line.contains("workspace = true") && !line.contains("path =")
            {
                continue;
            }
            if let Some(&j) = place.get(dep)
                && j > i
            {
                wrong.push(format!(
                    "`{dir}` comes before `{}`, which it depends on",
                    order[j]
                ));
            }
        }
    }
    wrong
}

/// The package name in `dir/Cargo.toml`.
fn package_name(root: &Path, dir: &str) -> Option<String> {
    let text = std::fs::read_to_string(root.join(dir).join("Cargo.toml")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("name = "))
        .map(|v| v.trim_matches('"').to_string())
}

/// Whether `word`, backticked in the map (in the section of crate `here`),
/// names something that exists; `None` if it does or names nothing we
/// check.
fn check_word(
    root: &Path,
    names: &BTreeSet<String>,
    here: Option<&str>,
    word: &str,
) -> Option<String> {
    if word.contains(|c: char| c.is_whitespace() || "*{}<>$=(),|".contains(c)) {
        return None;
    }
    let from_root = ["crates/", "xtask/", "fuzz/", "docs/", "third_party/"]
        .iter()
        .any(|p| word.starts_with(p));
    if word.ends_with(".rs") || word.ends_with(".md") || from_root {
        let found = root.join(word).exists()
            || here.is_some_and(|c| {
                root.join(c).join("src").join(word).exists() || root.join(c).join(word).exists()
            });
        return (!found).then(|| format!("`{word}` does not exist"));
    }
    let lead = word.split("::").next().unwrap_or(word);
    let crate_like = lead.starts_with("shoal-") || lead.starts_with("shoal_");
    if crate_like
        && lead
            .chars()
            .all(|c| c.is_ascii_lowercase() || "-_".contains(c))
    {
        let name = lead.replace('_', "-");
        if !names.contains(&name) {
            return Some(format!("`{word}`: no crate or program `{name}`"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_file_opens_with_a_note() {
        let root = root();
        let bare: Vec<String> = sources(&root)
            .into_iter()
            .filter(|p| {
                let text = std::fs::read_to_string(root.join(p)).unwrap_or_default();
                !first_line(&text).starts_with("//!")
            })
            .map(|p| p.display().to_string())
            .collect();
        assert!(
            bare.is_empty(),
            "these files do not open with a //! note saying what they are for:\n  {}",
            bare.join("\n  ")
        );
    }

    #[test]
    fn no_source_file_is_over_the_limit() {
        let root = root();
        let long: Vec<String> = sources(&root)
            .into_iter()
            .filter_map(|p| {
                let text = std::fs::read_to_string(root.join(&p)).unwrap_or_default();
                let n = text.lines().count();
                (n > LINES_MAX).then(|| format!("{} ({n} lines)", p.display()))
            })
            .collect();
        assert!(
            long.is_empty(),
            "over {LINES_MAX} lines: split them where they part naturally:\n  {}",
            long.join("\n  ")
        );
    }

    #[test]
    fn the_map_names_every_crate_and_only_what_exists() {
        let root = root();
        let map = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("the map");
        let wrong = check_map(&root, &map);
        assert!(
            wrong.is_empty(),
            "docs/ARCHITECTURE.md is not true to the tree:\n  {}",
            wrong.join("\n  ")
        );
    }

    #[test]
    fn the_map_check_finds_what_is_missing() {
        let root = root();
        let map = "### `crates/shoal-cap`\n`capability.rs`, `nowhere.rs`, `shoal-nothing`\n";
        let wrong = check_map(&root, map);
        assert!(
            wrong
                .iter()
                .any(|w| w.contains("`nowhere.rs` does not exist"))
        );
        assert!(
            wrong
                .iter()
                .any(|w| w.contains("no crate or program `shoal-nothing`"))
        );
        assert!(
            wrong
                .iter()
                .any(|w| w.contains("no section for the crate `crates/shoal-rpc`"))
        );
        assert!(!wrong.iter().any(|w| w.contains("capability.rs")));
    }

    #[test]
    fn the_order_check_finds_a_crate_before_its_dependency() {
        let root = root();
        let order = [
            "crates/shoal-wire".to_string(),
            "crates/shoal-cap".to_string(),
        ];
        let wrong = check_order(&root, &order);
        assert!(
            wrong
                .iter()
                .any(|w| w.contains("`crates/shoal-wire` comes before `crates/shoal-cap`")),
            "{wrong:?}"
        );
        let right = [
            "crates/shoal-cap".to_string(),
            "crates/shoal-wire".to_string(),
        ];
        assert!(check_order(&root, &right).is_empty());
    }
}
