//! The report of a property campaign (`moecheck prop`): one row per property, and for each
//! failure its reason, the minimal case directory and the line that reproduces it.
//!
//! JSON schema ([`PropReport`]): `verdict` (`"pass"`: every property held, `"fail"`: one
//! failed or the implementation failed), `op`, `impl` (the implementation's report name),
//! `is_model`, `cases` (cases per property), `seed`, `max_shrink`, and `properties`: per
//! property `name`, `description`, `cases` (cases checked: all of them when it held, else those
//! that passed and the first failing one; shrink steps not counted), `verdict`, `reason`,
//! `arguments` (the shrunk arguments the minimal case is built from), `minimal_case` (its
//! directory, `null` when it held, the run was aborted or it was not run), `reproduce` (one shell line,
//! `null` when it held or was not run) and `seconds`. A property's `verdict` is `"pass"`,
//! `"fail"` or `"skipped"`: skipped when it checks what the implementation does not expose (an
//! external program's quantised operands or permutation), with `reason` saying so; a skipped
//! property neither passes nor fails the campaign, but a campaign whose every property was
//! skipped checked nothing and fails. A property is not run when the implementation can run
//! nothing (a worker that never started): it fails with a reason saying so.

use std::fmt::Write as _;

use moecheck_reference::op::VerdictKind;
use serde::Serialize;

use crate::report::Report;

/// A whole campaign.
#[derive(Debug, Clone, Serialize)]
pub struct PropReport {
    pub verdict: VerdictKind,
    pub op: String,
    #[serde(rename = "impl")]
    pub implementation: String,
    /// A CPU model of a kernel: never a GPU result.
    pub is_model: bool,
    /// Cases per property.
    pub cases: u32,
    pub seed: u64,
    /// Most shrink steps per failure.
    pub max_shrink: u32,
    pub properties: Vec<PropertyResult>,
}

/// One property of a campaign.
#[derive(Debug, Clone, Serialize)]
pub struct PropertyResult {
    pub name: String,
    pub description: String,
    /// Cases checked (see the module documentation).
    pub cases: u32,
    pub verdict: PropertyVerdict,
    /// The failure's one line on the minimal case (why it was skipped, for a skipped one).
    pub reason: Option<String>,
    /// The shrunk arguments (their `Debug`).
    pub arguments: Option<String>,
    /// The minimal case directory (case, ask and the implementation's outputs on it).
    pub minimal_case: Option<String>,
    /// One shell line that reproduces the failure.
    pub reproduce: Option<String>,
    pub seconds: f64,
}

/// What became of one property of a campaign.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PropertyVerdict {
    Pass,
    Fail,
    /// Not applicable to this implementation: nothing was checked.
    Skipped,
}

impl PropertyVerdict {
    pub fn shout(self) -> &'static str {
        match self {
            PropertyVerdict::Pass => "PASS",
            PropertyVerdict::Fail => "FAIL",
            PropertyVerdict::Skipped => "SKIPPED",
        }
    }
}

impl PropertyResult {
    pub fn failed(&self) -> bool {
        self.verdict == PropertyVerdict::Fail
    }
    pub fn skipped(&self) -> bool {
        self.verdict == PropertyVerdict::Skipped
    }
}

impl PropReport {
    /// The campaign's verdict from its properties': it fails when one of them failed, or
    /// when every one was skipped (nothing was checked).
    pub fn verdict_of(properties: &[PropertyResult]) -> VerdictKind {
        if properties.iter().any(PropertyResult::failed)
            || properties.iter().all(PropertyResult::skipped)
        {
            VerdictKind::Fail
        } else {
            VerdictKind::Pass
        }
    }

    /// The failed properties.
    pub fn failures(&self) -> impl Iterator<Item = &PropertyResult> {
        self.properties.iter().filter(|p| p.failed())
    }
}

impl Report for PropReport {
    fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "moecheck prop: op {}, implementation {}",
            self.op, self.implementation
        );
        if self.is_model {
            let _ = writeln!(
                s,
                "  NOTE: this is a CPU model of a kernel (emulation), not a GPU result"
            );
        }
        let _ = writeln!(
            s,
            "{} cases per property from seed {}, failures shrunk in at most {} steps\n",
            self.cases, self.seed, self.max_shrink
        );
        let width = self
            .properties
            .iter()
            .map(|p| p.name.len())
            .max()
            .unwrap_or(0);
        for p in &self.properties {
            let _ = writeln!(
                s,
                "{:width$}  {:>5} cases  {:>7.2} s  {}",
                p.name,
                p.cases,
                p.seconds,
                p.verdict.shout()
            );
        }
        for p in self.failures() {
            let _ = writeln!(s, "\n{} FAILED: {}", p.name, p.description);
            let lines = [
                ("reason", &p.reason),
                ("shrunk to", &p.arguments),
                ("minimal case", &p.minimal_case),
                ("reproduce", &p.reproduce),
            ];
            for (label, value) in lines {
                if let Some(v) = value {
                    let _ = writeln!(s, "  {label}: {v}");
                }
            }
        }
        let skipped: Vec<&PropertyResult> =
            self.properties.iter().filter(|p| p.skipped()).collect();
        for p in &skipped {
            let why = p.reason.as_deref().unwrap_or("not applicable");
            let _ = writeln!(s, "\n{} SKIPPED (checked nothing): {why}", p.name);
        }
        let failed = self.failures().count();
        let _ = write!(
            s,
            "\n{failed} of {} properties failed",
            self.properties.len()
        );
        if !skipped.is_empty() {
            let _ = write!(s, ", {} skipped", skipped.len());
        }
        if skipped.len() == self.properties.len() {
            let _ = write!(s, " (every property was skipped: nothing was checked)");
        }
        let _ = writeln!(s, "\nverdict: {}", self.verdict.shout());
        s
    }
    fn json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(self)
    }
    fn exit_code(&self) -> u8 {
        self.verdict.exit_code()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(verdict: PropertyVerdict) -> PropertyResult {
        PropertyResult {
            name: "p".into(),
            description: "d".into(),
            cases: 1,
            verdict,
            reason: None,
            arguments: None,
            minimal_case: None,
            reproduce: None,
            seconds: 0.0,
        }
    }

    #[test]
    fn skipped_properties_neither_pass_nor_fail_but_all_skipped_fails() {
        use PropertyVerdict::*;
        let of = |v: &[PropertyVerdict]| {
            PropReport::verdict_of(&v.iter().map(|&v| result(v)).collect::<Vec<_>>())
        };
        assert_eq!(of(&[Pass, Skipped]), VerdictKind::Pass);
        assert_eq!(of(&[Pass, Skipped, Fail]), VerdictKind::Fail);
        assert_eq!(of(&[Skipped, Skipped]), VerdictKind::Fail);
    }
}
