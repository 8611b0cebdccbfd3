//! The report of a property campaign (`moecheck prop`): one row per property, with how its
//! cases met the implementation's contract, and for each failure its reason, the minimal case
//! directory and the line that reproduces it.
//!
//! JSON schema ([`PropReport`]): `verdict` (`"pass"`, `"fail"`, or `"inconclusive"`: nothing
//! failed but a case was inconclusive), `op`, `impl` (the implementation's report name),
//! `is_model`, `cases` (cases asked per property), `seed`, `max_shrink`, `contract` (each
//! declared key as `section.key = value (source)`), `strict`, `unexercised` (the op's edge
//! classes no applied case exercised), and `properties`: per property `name`, `description`,
//! `cases` (applied cases: run by the implementation; shrink steps not counted), `refused`
//! (cases the implementation refused), `outside` (drawn cases outside the declared domain,
//! never run), `inconclusive` (applied cases that were), `exercised` (edge classes),
//! `stopped` (why it stopped early, too many refusals), `verdict`, `reason`, `arguments` (the
//! shrunk arguments of the minimal case), `minimal_case` (its directory), `reproduce` (one
//! shell line) and `seconds`.
//!
//! A property's `verdict`: `"pass"`, `"fail"`, `"inconclusive"`, `"not-applicable"` (the
//! declaration relaxes its rule: `tail-contract` with no wgrad pass under `tail ignored`,
//! `ties-to-lower-index` under `ties any`, a pass the implementation does not declare),
//! `"not-run"` (no case could be applied: every one refused or outside the domain; `reason`
//! says why) or `"skipped"` (it checks internals the implementation does not expose). The
//! campaign fails when a property failed, or when none applied a case; with `--strict` also
//! when a property was not run or stopped early, or an edge class was never exercised.

use std::fmt::Write as _;

use moecheck_properties::Coverage;
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
    /// Cases asked per property.
    pub cases: u32,
    pub seed: u64,
    /// Most shrink steps per failure.
    pub max_shrink: u32,
    /// The declared contract, a key a line.
    pub contract: Vec<String>,
    /// `--strict`.
    pub strict: bool,
    /// Edge classes no applied case exercised.
    pub unexercised: Vec<String>,
    pub properties: Vec<PropertyResult>,
}

/// One property of a campaign.
#[derive(Debug, Clone, Serialize)]
pub struct PropertyResult {
    pub name: String,
    pub description: String,
    /// Applied cases (see the module documentation).
    pub cases: u32,
    pub refused: u32,
    pub outside: u32,
    pub inconclusive: u32,
    pub exercised: Vec<String>,
    pub stopped: Option<String>,
    pub verdict: PropertyVerdict,
    /// The failure's one line on the minimal case (why it did not run, for the others).
    pub reason: Option<String>,
    /// The shrunk arguments (their `Debug`).
    pub arguments: Option<String>,
    /// The minimal case directory (case, ask and the implementation's outputs on it).
    pub minimal_case: Option<String>,
    /// One shell line that reproduces the failure.
    pub reproduce: Option<String>,
    pub seconds: f64,
    /// Why the minimal case could not be written under `--out` (the campaign still reports;
    /// the command then exits 2 with this line).
    #[serde(skip)]
    pub unwritten: Option<String>,
}

/// What became of one property of a campaign.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PropertyVerdict {
    Pass,
    Fail,
    /// Nothing failed, but a case was inconclusive.
    Inconclusive,
    /// The declaration relaxes the property's rule: nothing to check.
    NotApplicable,
    /// No case could be applied.
    NotRun,
    /// It checks internals the implementation does not expose: nothing was checked.
    Skipped,
}

impl PropertyVerdict {
    pub fn shout(self) -> &'static str {
        match self {
            PropertyVerdict::Pass => "PASS",
            PropertyVerdict::Fail => "FAIL",
            PropertyVerdict::Inconclusive => "INCONCLUSIVE",
            PropertyVerdict::NotApplicable => "NOT APPLICABLE",
            PropertyVerdict::NotRun => "NOT RUN",
            PropertyVerdict::Skipped => "SKIPPED",
        }
    }
}

impl PropertyResult {
    /// A property that has checked nothing yet.
    pub fn new(name: &str, description: &str) -> PropertyResult {
        PropertyResult {
            name: name.to_string(),
            description: description.to_string(),
            cases: 0,
            refused: 0,
            outside: 0,
            inconclusive: 0,
            exercised: Vec::new(),
            stopped: None,
            verdict: PropertyVerdict::Pass,
            reason: None,
            arguments: None,
            minimal_case: None,
            reproduce: None,
            seconds: 0.0,
            unwritten: None,
        }
    }

    /// Records how its cases met the contract.
    pub fn set_coverage(&mut self, c: &Coverage) {
        self.cases = c.applied;
        self.refused = c.refused;
        self.outside = c.outside;
        self.inconclusive = c.inconclusive;
        self.exercised = c.edges.iter().map(|e| e.to_string()).collect();
        self.stopped = c.stopped.clone();
    }

    pub fn failed(&self) -> bool {
        self.verdict == PropertyVerdict::Fail
    }
    /// Whether it checked nothing (not applicable, not run, skipped).
    pub fn checked_nothing(&self) -> bool {
        matches!(
            self.verdict,
            PropertyVerdict::NotApplicable | PropertyVerdict::NotRun | PropertyVerdict::Skipped
        )
    }
}

impl PropReport {
    /// The campaign's verdict from its properties': it fails when one of them failed, or
    /// when none checked anything; with `strict`, also when one was not run or stopped
    /// early, or an edge class was never exercised. Otherwise inconclusive when one was.
    pub fn verdict_of(&self) -> VerdictKind {
        let ps = &self.properties;
        let strict_failure = self.strict
            && (!self.unexercised.is_empty()
                || ps
                    .iter()
                    .any(|p| p.verdict == PropertyVerdict::NotRun || p.stopped.is_some()));
        if ps.iter().any(PropertyResult::failed)
            || ps.iter().all(PropertyResult::checked_nothing)
            || strict_failure
        {
            VerdictKind::Fail
        } else if ps
            .iter()
            .any(|p| p.verdict == PropertyVerdict::Inconclusive)
        {
            VerdictKind::Inconclusive
        } else {
            VerdictKind::Pass
        }
    }

    /// The failed properties.
    pub fn failures(&self) -> impl Iterator<Item = &PropertyResult> {
        self.properties.iter().filter(|p| p.failed())
    }

    /// `N refused, M outside the domain, I inconclusive` for a property, empty when none.
    fn counts(p: &PropertyResult) -> String {
        let parts: Vec<String> = [
            (p.refused, "refused"),
            (p.outside, "outside the domain"),
            (p.inconclusive, "inconclusive"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        parts.join(", ")
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
        if !self.contract.is_empty() {
            let _ = writeln!(s, "declared contract:");
            for line in &self.contract {
                let _ = writeln!(s, "  {line}");
            }
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
            let counts = Self::counts(p);
            let counts = if counts.is_empty() {
                String::new()
            } else {
                format!("  ({counts})")
            };
            let _ = writeln!(
                s,
                "{:width$}  {:>5} cases  {:>7.2} s  {}{counts}",
                p.name,
                p.cases,
                p.seconds,
                p.verdict.shout()
            );
        }
        for p in self.failures() {
            let _ = writeln!(
                s,
                "\n{} FAILED: {}",
                p.name,
                p.reason.as_deref().unwrap_or("(no reason)")
            );
            let lines = [
                ("checks", &Some(p.description.clone())),
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
        for p in self.properties.iter().filter(|p| !p.failed()) {
            let why = p.reason.as_deref().unwrap_or_default();
            match p.verdict {
                PropertyVerdict::Inconclusive => {
                    let _ = writeln!(s, "\n{} INCONCLUSIVE: {why}", p.name);
                }
                PropertyVerdict::NotApplicable => {
                    let _ = writeln!(s, "\n{} NOT APPLICABLE (checked nothing): {why}", p.name);
                }
                PropertyVerdict::NotRun => {
                    let _ = writeln!(s, "\n{} NOT RUN (checked nothing): {why}", p.name);
                }
                PropertyVerdict::Skipped => {
                    let _ = writeln!(s, "\n{} SKIPPED (checked nothing): {why}", p.name);
                }
                PropertyVerdict::Pass | PropertyVerdict::Fail => {}
            }
            if let Some(stopped) = &p.stopped {
                let _ = writeln!(s, "\n{}: {stopped}", p.name);
            }
        }
        if !self.unexercised.is_empty() {
            let _ = writeln!(
                s,
                "\nedge classes no case exercised: {}{}",
                self.unexercised.join(", "),
                if self.strict {
                    " (--strict: a failure)"
                } else {
                    ""
                }
            );
        }
        let failed = self.failures().count();
        let _ = write!(
            s,
            "\n{failed} of {} properties failed",
            self.properties.len()
        );
        for v in [
            PropertyVerdict::Inconclusive,
            PropertyVerdict::NotApplicable,
            PropertyVerdict::NotRun,
            PropertyVerdict::Skipped,
        ] {
            let n = self.properties.iter().filter(|p| p.verdict == v).count();
            if n > 0 {
                let _ = write!(s, ", {n} {}", v.shout().to_lowercase());
            }
        }
        if self.properties.iter().all(PropertyResult::checked_nothing) {
            let _ = write!(s, " (no property checked anything)");
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
            verdict,
            cases: 1,
            ..PropertyResult::new("p", "d")
        }
    }

    fn report(v: &[PropertyVerdict], strict: bool, unexercised: &[&str]) -> PropReport {
        PropReport {
            verdict: VerdictKind::Pass,
            op: "gemm".into(),
            implementation: "x".into(),
            is_model: false,
            cases: 1,
            seed: 0,
            max_shrink: 1,
            contract: Vec::new(),
            strict,
            unexercised: unexercised.iter().map(|e| e.to_string()).collect(),
            properties: v.iter().map(|&v| result(v)).collect(),
        }
    }

    #[test]
    fn what_fails_a_campaign() {
        use PropertyVerdict::*;
        let of = |v: &[PropertyVerdict]| report(v, false, &[]).verdict_of();
        assert_eq!(of(&[Pass, Skipped]), VerdictKind::Pass);
        assert_eq!(of(&[Pass, Skipped, Fail]), VerdictKind::Fail);
        assert_eq!(of(&[Skipped, Skipped]), VerdictKind::Fail);
        assert_eq!(of(&[NotApplicable, NotRun, Skipped]), VerdictKind::Fail);
        assert_eq!(of(&[Pass, NotRun, NotApplicable]), VerdictKind::Pass);
        assert_eq!(of(&[Pass, Inconclusive]), VerdictKind::Inconclusive);
        assert_eq!(of(&[Fail, Inconclusive]), VerdictKind::Fail);
        assert_eq!(VerdictKind::Inconclusive.exit_code(), 3);
    }

    #[test]
    fn strict_fails_on_not_run_stopped_and_unexercised() {
        use PropertyVerdict::*;
        assert_eq!(
            report(&[Pass, NotRun], true, &[]).verdict_of(),
            VerdictKind::Fail
        );
        assert_eq!(
            report(&[Pass], true, &["k-zero"]).verdict_of(),
            VerdictKind::Fail
        );
        assert_eq!(
            report(&[Pass], false, &["k-zero"]).verdict_of(),
            VerdictKind::Pass
        );
        let mut r = report(&[Pass], true, &[]);
        assert_eq!(r.verdict_of(), VerdictKind::Pass);
        r.properties[0].stopped = Some("stopped after 161 refused".into());
        assert_eq!(r.verdict_of(), VerdictKind::Fail);
    }

    #[test]
    fn the_text_states_the_failure_and_the_counts() {
        use PropertyVerdict::*;
        let mut r = report(&[Fail, NotRun], false, &["k-zero", "dtype-f16"]);
        r.properties[0].name = "fwd-matches-reference".into();
        r.properties[0].description = "out is inside the error bound".into();
        r.properties[0].reason = Some("3 elements outside the bound".into());
        r.properties[0].refused = 4;
        r.properties[1].reason = Some("stopped after 161 refused".into());
        r.verdict = r.verdict_of();
        let t = r.text();
        assert!(t.contains("fwd-matches-reference FAILED: 3 elements outside the bound\n  checks: out is inside the error bound"), "{t}");
        assert!(t.contains("FAIL  (4 refused)"), "{t}");
        assert!(
            t.contains("p NOT RUN (checked nothing): stopped after 161 refused"),
            "{t}"
        );
        assert!(
            t.contains("edge classes no case exercised: k-zero, dtype-f16"),
            "{t}"
        );
        assert!(t.contains("1 of 2 properties failed, 1 not run"), "{t}");
    }
}
