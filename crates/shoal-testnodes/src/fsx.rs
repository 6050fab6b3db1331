//! What the fsx-style tests of the shared file system share: their seed
//! and length, and how a failure shows where bytes part.

/// The seed and the number of steps: seed 1 unless `SHOAL_FSX_SEED` says
/// a number or `random` (a fresh one, printed, to replay), and `ops`
/// steps unless `SHOAL_FSX_OPS` says.
pub fn seed_and_steps(ops: usize) -> (u64, usize) {
    let seed: u64 = match std::env::var("SHOAL_FSX_SEED").ok().as_deref() {
        None => 1,
        Some("random") => rand::random(),
        Some(s) => s.parse().expect("SHOAL_FSX_SEED is a number or random"),
    };
    let ops: usize = std::env::var("SHOAL_FSX_OPS")
        .ok()
        .map(|s| s.parse().expect("SHOAL_FSX_OPS is a number"))
        .unwrap_or(ops);
    eprintln!("fsx: seed {seed}, {ops} steps (SHOAL_FSX_SEED={seed} replays)");
    (seed, ops)
}

/// Where `got` and `want` part: their sizes and the first and last bytes
/// that differ.
pub fn differ(got: &[u8], want: &[u8]) -> String {
    let diff: Vec<usize> = (0..got.len().min(want.len()))
        .filter(|i| got[*i] != want[*i])
        .collect();
    format!(
        "{} bytes, the model {}; bytes {:?} to {:?} differ",
        got.len(),
        want.len(),
        diff.first(),
        diff.last()
    )
}
