//! The pieces every benchmark's Markdown report shares: the targets
//! table, with one word for a target met and one for a target missed,
//! and the rows of a figure beside its 99th percentile.

/// One target: what is measured, the figure and the goal as printed, and
/// whether the figure meets the goal.
pub(crate) struct Target<'a> {
    name: &'a str,
    value: String,
    goal: String,
    met: bool,
}

/// A target whose figure and goal the report prints as given.
pub(crate) fn target<'a>(name: &'a str, value: String, goal: &str, met: bool) -> Target<'a> {
    Target {
        name,
        value,
        goal: goal.to_string(),
        met,
    }
}

/// The target that `value` be at most `limit` (both printed to two places).
pub(crate) fn at_most(name: &str, value: f64, limit: f64) -> Target<'_> {
    target(
        name,
        format!("{value:.2}"),
        &format!("≤ {limit:.2}"),
        value <= limit,
    )
}

/// The target that `value` be at least `limit` (both printed to two places).
pub(crate) fn at_least(name: &str, value: f64, limit: f64) -> Target<'_> {
    target(
        name,
        format!("{value:.2}"),
        &format!("≥ {limit:.2}"),
        value >= limit,
    )
}

/// The target that `value` be zero (a count of what must never happen).
pub(crate) fn none(name: &str, value: f64) -> Target<'_> {
    target(name, format!("{value}"), "0", value == 0.0)
}

/// Appends the "Targets" section: a row per target with its verdict.
pub(crate) fn targets(t: &mut String, rows: &[Target<'_>]) {
    t.push_str("\n## Targets\n\n| target | measured | goal | |\n|---|---:|---:|---|\n");
    for Target {
        name,
        value,
        goal,
        met,
    } in rows
    {
        let verdict = if *met { "met" } else { "MISSED" };
        t.push_str(&format!("| {name} | {value} | {goal} | {verdict} |\n"));
    }
}

/// Appends a row `| what | p50 | p99 |` for the metric `key` (its median)
/// and `key_p99`, read through `g`.
pub(crate) fn p50_p99(t: &mut String, g: impl Fn(&str) -> f64, what: &str, key: &str) {
    t.push_str(&format!(
        "| {what} | {:.1} | {:.1} |\n",
        g(key),
        g(&format!("{key}_p99"))
    ));
}
