//! The simulation's promises, checked at the end of a run (see the crate
//! documentation): at-most-once, integrity, deadlines, honest errors, that
//! only replays fail to open between endpoints, and liveness after the
//! faults heal.

use std::collections::BTreeMap;
use std::time::Duration;

use super::Sim;

impl Sim {
    /// Checks every promise over what happened; see the crate docs.
    pub fn check(&self) -> Result<Report, String> {
        self.check_promises(true)
    }

    /// Checks the safety promises only (at-most-once, integrity, deadlines,
    /// honest errors), for scenarios where calls may fail by design.
    pub fn check_safety(&self) -> Result<Report, String> {
        self.check_promises(false)
    }

    fn check_promises(&self, liveness: bool) -> Result<Report, String> {
        let fail = |what: String| Err(format!("seed {}: {what}", self.seed));
        if let Some(v) = self.violations.first() {
            return fail(v.clone());
        }
        let mut report = Report::default();
        for o in &self.outcomes {
            let runs = self.executions.get(&o.txn).copied().unwrap_or(0);
            match o.result {
                Ok(()) => {
                    report.ok += 1;
                    if runs != 1 {
                        return fail(format!("{} succeeded but ran {runs} times", o.txn));
                    }
                }
                Err(code) => {
                    *report.errors.entry(code).or_default() += 1;
                    if matches!(code, "not-found" | "busy" | "too-large") && runs != 0 {
                        return fail(format!(
                            "{} reported {code} (never executed) but ran",
                            o.txn
                        ));
                    }
                    if liveness
                        && let Some(healed) = self.healed_at
                        && o.started >= healed + Duration::from_secs(3)
                    {
                        return fail(format!(
                            "{} started after the network healed but failed: {code}",
                            o.txn
                        ));
                    }
                }
            }
            if o.ended.0 > o.started.0 + self.config.deadline_us {
                return fail(format!("{} ended after its deadline", o.txn));
            }
        }
        report.executions = self.executions.values().map(|&n| n as usize).sum();
        report.replays_refused = self.seals.replays;
        if self.seals.bad > 0 {
            return fail(format!(
                "{} datagrams between endpoints did not open",
                self.seals.bad
            ));
        }
        if liveness
            && let Some(healed) = self.healed_at
            && self.now >= healed + Duration::from_secs(3)
        {
            for (i, n) in self.nodes.iter().enumerate() {
                let view = n.membership.view(self.now);
                let alive = view.iter().filter(|m| m.alive).count();
                if alive != self.nodes.len() {
                    return fail(format!(
                        "after healing, node {} sees {alive} of {} nodes alive",
                        i + 1,
                        self.nodes.len()
                    ));
                }
            }
        }
        Ok(report)
    }
}

/// What a run did.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub ok: usize,
    pub errors: BTreeMap<&'static str, usize>,
    pub executions: usize,
    /// Datagrams the endpoints' replay windows refused.
    pub replays_refused: usize,
}
