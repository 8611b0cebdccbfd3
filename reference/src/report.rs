//! What a finished check looks like to its reader: [`Reported`] turns one run of one operation
//! into its `--json` document and its text table, with the building blocks every operation's
//! report shares (the header lines, the statistics table, the verdict line).
//!
//! Rendering is pure string formatting; printing, exit statuses and `--json` live in the CLI
//! crate (`src/report.rs`).

use std::fmt::Write as _;

use serde::Serialize;

use crate::op::{Op, Verdict, VerdictKind};
use crate::stats::{max_of, ElementStats};

/// The implementation a report is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Implemented {
    /// `reference`, `emulate[inject=…]`, `exec:CMD`, `outputs in DIR`.
    pub name: String,
    /// A CPU model of a kernel: never reported as a GPU result.
    pub is_model: bool,
}

/// One run of one operation, as the reports see it.
#[derive(Debug)]
pub struct RunInfo<'a, O: Op> {
    /// `None` for a reference-only run (nothing was checked).
    pub implementation: Option<&'a Implemented>,
    pub case: &'a O::Case,
    pub ask: O::Ask,
    pub expected: &'a O::Expected,
    /// The precision the implementation declared (the reference's without one).
    pub precision: &'a O::Precision,
    /// `None` for a reference-only run.
    pub verdict: Option<&'a Verdict<O::Report>>,
    /// Cases drawn until one could be checked (near ties are redrawn); 0 for a case read
    /// from a directory.
    pub draws: usize,
    /// Seconds the f64 reference took.
    pub reference_seconds: f64,
}

impl<O: Op> RunInfo<'_, O> {
    /// `pass`, `fail`, or `done` without an implementation.
    pub fn verdict_kind(&self) -> VerdictKind {
        self.verdict.map_or(VerdictKind::Done, Verdict::kind)
    }
    /// The implementation's name (`reference` for a reference-only run).
    pub fn name(&self) -> String {
        self.implementation
            .map_or_else(|| "reference".into(), |i| i.name.clone())
    }
    pub fn is_model(&self) -> bool {
        self.implementation.is_some_and(|i| i.is_model)
    }
    pub fn run_error(&self) -> Option<String> {
        self.verdict
            .and_then(Verdict::run_error)
            .map(|e| e.message.clone())
    }
    pub fn failure(&self) -> Option<String> {
        self.verdict.and_then(Verdict::failure)
    }
    /// The comparison, when one was made.
    pub fn report(&self) -> Option<&O::Report> {
        self.verdict.and_then(Verdict::report)
    }
}

/// How an operation reports a run.
pub trait Reported: Op {
    /// The `--json` document (with a top-level `verdict`).
    type Document: Serialize;
    fn document(run: &RunInfo<Self>) -> Self::Document;
    /// The readable report, ending with the `verdict:` line.
    fn render(doc: &Self::Document) -> String;
}

/// The fields every element-wise report opens with.
#[derive(Debug, Clone, Serialize)]
pub struct RunHead {
    pub verdict: VerdictKind,
    pub implementation: String,
    /// A CPU model of a kernel: never a GPU result.
    pub is_model: bool,
}

impl RunHead {
    pub fn of<O: Op>(run: &RunInfo<O>) -> RunHead {
        RunHead {
            verdict: run.verdict_kind(),
            implementation: run.name(),
            is_model: run.is_model(),
        }
    }
    /// The implementation lines.
    pub fn render(&self, s: &mut String) {
        implementation_lines(s, &self.implementation, self.is_model);
    }
}

/// Why a run did not pass, when it did not.
#[derive(Debug, Clone, Serialize)]
pub struct RunOutcome {
    /// One line when the implementation produced nothing.
    pub run_error: Option<String>,
    /// One line on the first failure.
    pub failure: Option<String>,
}

/// How a report labels a run error: `not applicable` for a refusal (whose failure line says
/// so, [`crate::op::Verdict::failure`]), else `run failed`.
pub fn run_error_label(failure: Option<&str>) -> &'static str {
    match failure {
        Some(f) if f.starts_with("not applicable: ") => "not applicable",
        _ => "run failed",
    }
}

impl RunOutcome {
    pub fn of<O: Op>(run: &RunInfo<O>) -> RunOutcome {
        RunOutcome {
            run_error: run.run_error(),
            failure: run.failure(),
        }
    }
    /// `run failed: …` when the implementation produced nothing (`not applicable: …` when it
    /// refused the case).
    pub fn render(&self, s: &mut String) {
        if let Some(e) = &self.run_error {
            let _ = writeln!(s, "{}: {e}", run_error_label(self.failure.as_deref()));
        }
    }
    /// `inconclusive: …` (the bound that had no teeth), just above the verdict line.
    pub fn render_inconclusive(&self, s: &mut String, verdict: VerdictKind) {
        if verdict == VerdictKind::Inconclusive {
            if let Some(why) = &self.failure {
                let _ = writeln!(s, "{why}");
            }
        }
    }
}

/// `implementation: NAME` and, for a model, the line that says it is not a GPU result.
pub fn implementation_lines(s: &mut String, name: &str, is_model: bool) {
    let _ = writeln!(s, "implementation: {name}");
    if is_model {
        let _ = writeln!(
            s,
            "  NOTE: this is a CPU model of a kernel (emulation), not a GPU result"
        );
    }
}

/// `verdict: PASS`.
pub fn verdict_line(s: &mut String, verdict: VerdictKind) {
    let _ = writeln!(s, "verdict: {}", verdict.shout());
}

/// The statistics table shared by every element-wise report: one row per output (pass or
/// tensor), then its failing slices.
pub struct StatsTable<'a> {
    /// The first column's title (`pass`, `tensor`) and width.
    pub label: &'a str,
    pub width: usize,
    /// What the worst column locates (`(group, row, col)`, `(expert, index)`).
    pub worst_label: &'a str,
    /// Indentation of the lines under a row.
    pub indent: usize,
    /// The noun of a failing slice in "… and N more failing groups".
    pub slice_noun: &'a str,
}

/// A bound ratio in a table: 3 decimals up to 1000, short scientific form beyond (garbage
/// outputs give ratios of 1e40), `inf` past a bound of exactly 0.
pub fn ratio(r: f64) -> String {
    if r.is_finite() && r < 1000.0 {
        format!("{r:.3}")
    } else {
        format!("{r:.2e}")
    }
}

/// A value in a failure line: scientific, at most 7 significant digits, trailing zeros
/// dropped (`0e0`, `1.25e-2`, `3.402823e38`).
pub fn sci(x: f64) -> String {
    sci_digits(x, 6)
}

/// [`sci`] with `digits` digits after the point before trailing zeros are dropped.
fn sci_digits(x: f64, digits: usize) -> String {
    let s = format!("{x:.digits$e}");
    match s.split_once('e') {
        Some((m, e)) if m.contains('.') => {
            format!("{}e{e}", m.trim_end_matches('0').trim_end_matches('.'))
        }
        _ => s,
    }
}

/// A failing element's value and its reference in a failure line: [`sci`] each, with more
/// significant digits (up to 17) where 7 would print them the same although they differ
/// (`-4.454131e-2` and `-4.4541309e-2`, not twice `-4.454131e-2`).
///
/// ```
/// use moecheck_reference::report::sci_pair;
/// assert_eq!(sci_pair(1.5, 2.0), ("1.5e0".to_string(), "2e0".to_string()));
/// let (g, w) = sci_pair(0.1 + 1e-12, 0.1);
/// assert_ne!(g, w);
/// assert_eq!(w, "1e-1");
/// ```
pub fn sci_pair(got: f64, want: f64) -> (String, String) {
    let (g, w) = (sci(got), sci(want));
    if g != w || got == want || got.is_nan() || want.is_nan() {
        return (g, w);
    }
    (7..=16)
        .map(|d| (sci_digits(got, d), sci_digits(want, d)))
        .find(|(g, w)| g != w)
        .unwrap_or_else(|| (sci_digits(got, 16), sci_digits(want, 16)))
}

/// A bound in a failure line: `0 (contract)` where the contract demands exactly 0.
pub fn bound_text(b: f64) -> String {
    if b == 0.0 {
        "0 (contract)".into()
    } else {
        format!("{b:.3e}")
    }
}

/// One row of a [`StatsTable`]: the slices of one output.
pub struct StatsRow<'a, L> {
    pub name: &'a str,
    pub passed: bool,
    pub slices: Vec<&'a ElementStats<L>>,
    /// Where the worst element is, already formatted (`-` when none).
    pub worst: String,
    /// Why the output failed without statistics.
    pub error: Option<&'a str>,
    /// Lines about failing slices (the first 8 are printed).
    pub failing: Vec<String>,
    /// Extra lines after the row (warnings).
    pub notes: Vec<String>,
}

impl StatsTable<'_> {
    /// The column titles.
    pub fn header(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "{:<w$} {:<5} {:>9} {:>11} {:>10} {:>10} {:>5}  worst {}",
            self.label,
            "ok",
            "failed",
            "max|err|",
            "err/bound",
            "calc_diff",
            "nan",
            self.worst_label,
            w = self.width
        );
    }

    /// One output's row and the lines under it.
    pub fn row<L>(&self, s: &mut String, row: &StatsRow<'_, L>) {
        let max = |f: fn(&ElementStats<L>) -> f64| max_of(row.slices.iter().copied(), f);
        let calc = row
            .slices
            .iter()
            .map(|g| g.calc_diff)
            .fold(0.0f64, f64::max);
        let _ = writeln!(
            s,
            "{:<w$} {:<5} {:>9} {:>11.3e} {:>10} {:>10.2e} {:>5}  {}",
            row.name,
            if row.passed { "PASS" } else { "FAIL" },
            row.slices.iter().map(|g| g.failed).sum::<usize>(),
            max(|g| g.max_abs_err),
            ratio(max(|g| g.max_bound_ratio)),
            calc,
            row.slices.iter().map(|g| g.nan).sum::<usize>(),
            row.worst,
            w = self.width
        );
        let pad = " ".repeat(self.indent);
        if let Some(e) = row.error {
            let _ = writeln!(s, "{pad}{e}");
        }
        for note in &row.notes {
            let _ = writeln!(s, "{pad}{note}");
        }
        for line in row.failing.iter().take(8) {
            let _ = writeln!(s, "{pad}{line}");
        }
        if row.failing.len() > 8 {
            let _ = writeln!(
                s,
                "{pad}… and {} more failing {} (see --json)",
                row.failing.len() - 8,
                self.slice_noun
            );
        }
    }
}

#[cfg(test)]
mod number_tests {
    #[test]
    fn numbers_are_short() {
        assert_eq!(super::sci(0.0), "0e0");
        assert_eq!(super::sci(0.0125), "1.25e-2");
        assert_eq!(super::sci(f32::MAX as f64), "3.402823e38");
        assert_eq!(super::sci(f64::NAN), "NaN");
        assert_eq!(super::sci(-1.0 / 3.0), "-3.333333e-1");
        assert_eq!(super::bound_text(0.0), "0 (contract)");
        assert_eq!(super::ratio(0.5), "0.500");
        assert_eq!(super::ratio(5.369e42), "5.37e42");
    }
}
