//! `moecheck selftest`: do the properties catch the bugs planted in the CPU models?
//!
//! One section per operation: every property of the operation runs against its correct model
//! (no bug), which must pass all of them, and against each planted bug, which at least one
//! property must catch. Every property must also catch at least one bug, or it checks nothing
//! the others do not.

use std::ops::ControlFlow;

use moecheck_properties::{check, Outcome, PropertyOp, RunConfig};
use moecheck_reference::op::VerdictKind;
use serde::Serialize;

use crate::impls::PlantedBug;
use crate::ops::{self, Operation, Visit};
use crate::progress::Progress;
use crate::registry::Backends;
use crate::report::Report;

/// One property against one implementation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cell {
    pub property: String,
    /// Whether the property failed (for a bug: caught it).
    pub failed: bool,
    /// Why it failed, when it did.
    pub reason: Option<String>,
    /// The shrunk failing case, when it failed.
    pub minimal_case: Option<String>,
}

/// One implementation against every property.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    /// `None` for the correct model.
    pub bug: Option<String>,
    pub implementation: String,
    pub description: String,
    pub cells: Vec<Cell>,
}

impl Row {
    /// Whether some property failed.
    pub fn caught(&self) -> bool {
        self.cells.iter().any(|c| c.failed)
    }
}

/// The whole selftest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SelftestReport {
    /// `pass` when every section is ok, else `fail`.
    pub verdict: VerdictKind,
    pub cases: usize,
    pub seed: u64,
    /// One per operation: grouped gemm, fp8, routing, moe layer.
    pub sections: Vec<Section>,
}

/// One operation's table: its properties against its correct model and each planted bug.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Section {
    /// `grouped gemm`, `fp8`, `routing`, `moe layer`.
    pub name: String,
    pub properties: Vec<String>,
    pub correct: Row,
    pub bugs: Vec<Row>,
    pub uncaught_bugs: Vec<String>,
    pub idle_properties: Vec<String>,
    pub ok: bool,
}

impl Section {
    /// Builds a section from its rows and decides `ok` (correct model passes everything,
    /// every bug caught, every property catches some bug).
    pub fn new(name: &str, properties: Vec<String>, correct: Row, bugs: Vec<Row>) -> Section {
        let uncaught_bugs = bugs
            .iter()
            .filter(|r| !r.caught())
            .filter_map(|r| r.bug.clone())
            .collect::<Vec<_>>();
        let idle_properties = properties
            .iter()
            .enumerate()
            .filter(|(i, _)| !bugs.iter().any(|r| r.cells[*i].failed))
            .map(|(_, p)| p.clone())
            .collect::<Vec<_>>();
        let ok = !correct.caught() && uncaught_bugs.is_empty() && idle_properties.is_empty();
        Section {
            name: name.to_string(),
            properties,
            correct,
            bugs,
            uncaught_bugs,
            idle_properties,
            ok,
        }
    }

    /// The section's table: a bug × property grid (`caught` / `-`), the correct model's row,
    /// then the minimal case of the first property that caught each bug.
    pub fn render(&self, cases: usize, seed: u64) -> String {
        use std::fmt::Write;
        let mut s = format!("\n== {} ==\n", self.name);
        let first = self
            .bugs
            .iter()
            .filter_map(|r| r.bug.as_ref().map(String::len))
            .chain(std::iter::once("correct (no bug)".len()))
            .max()
            .unwrap_or(0);
        let widths: Vec<usize> = self.properties.iter().map(|p| p.len().max(6)).collect();
        let _ = write!(s, "{:first$}", "bug \\ property");
        for (p, w) in self.properties.iter().zip(&widths) {
            let _ = write!(s, "  {p:w$}");
        }
        s.push('\n');
        let line = |s: &mut String, label: &str, row: &Row, mark: &str| {
            let _ = write!(s, "{label:first$}");
            for (c, w) in row.cells.iter().zip(&widths) {
                let _ = write!(s, "  {:w$}", if c.failed { mark } else { "-" });
            }
            s.push('\n');
        };
        for r in &self.bugs {
            line(&mut s, r.bug.as_deref().unwrap_or(""), r, "caught");
        }
        line(&mut s, "correct (no bug)", &self.correct, "FAILED");
        let _ = writeln!(s, "\n{cases} cases per property, seed {seed}");
        for r in &self.bugs {
            match r.cells.iter().find(|c| c.failed) {
                Some(c) => {
                    let _ = writeln!(
                        s,
                        "\n{} ({}): caught by {}\n  reason: {}\n  minimal case: {}",
                        r.bug.as_deref().unwrap_or(""),
                        r.description,
                        c.property,
                        c.reason.as_deref().unwrap_or(""),
                        c.minimal_case.as_deref().unwrap_or("")
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "\n{} ({}): NOT CAUGHT",
                        r.bug.as_deref().unwrap_or(""),
                        r.description
                    );
                }
            }
        }
        for c in self.correct.cells.iter().filter(|c| c.failed) {
            let _ = writeln!(
                s,
                "\ncorrect model FAILED {}\n  reason: {}\n  minimal case: {}",
                c.property,
                c.reason.as_deref().unwrap_or(""),
                c.minimal_case.as_deref().unwrap_or("")
            );
        }
        if !self.idle_properties.is_empty() {
            let _ = writeln!(
                s,
                "\nproperties that caught no bug: {}",
                self.idle_properties.join(", ")
            );
        }
        let _ = writeln!(
            s,
            "\n{}: {}",
            self.name,
            if self.ok { "ok" } else { "FAILED" }
        );
        s
    }
}

/// A table cell from a property's outcome.
pub(crate) fn cell<A>(property: &str, outcome: Outcome<A>) -> Cell {
    match outcome {
        Outcome::Passed { .. } => Cell {
            property: property.to_string(),
            failed: false,
            reason: None,
            minimal_case: None,
        },
        // A CPU model exposes everything a property checks: not applicable is a failure here.
        Outcome::NotApplicable { reason } => Cell {
            property: property.to_string(),
            failed: true,
            reason: Some(format!("not applicable: {reason}")),
            minimal_case: None,
        },
        // Nor may a model refuse a case, or pass on bounds that admit an all-zero output.
        Outcome::NotRun { reason } | Outcome::Inconclusive { reason, .. } => Cell {
            property: property.to_string(),
            failed: true,
            reason: Some(reason),
            minimal_case: None,
        },
        Outcome::Failed {
            reason,
            minimal_case,
            ..
        } => Cell {
            property: property.to_string(),
            failed: true,
            reason: Some(reason),
            minimal_case: Some(minimal_case),
        },
    }
}

/// One model (correct, or with `bug` planted) against every property of `O`.
fn row<O: PropertyOp + Backends>(
    bug: Option<O::Bug>,
    config: &RunConfig,
    progress: &Progress,
) -> Row {
    let imp = O::emulate(bug).expect("selftest runs operations that have a CPU model");
    Row {
        bug: bug.map(|b| b.name().to_string()),
        implementation: imp.name(),
        description: bug
            .map_or("the correct model", |b| b.description())
            .to_string(),
        cells: O::properties()
            .iter()
            .map(|p| {
                progress.stage(&format!("{}: {}", imp.name(), p.name));
                let c = cell(p.name, check(p, imp.as_ref(), config));
                progress.step();
                c
            })
            .collect(),
    }
}

/// The section of operation `O`: every property against its correct model and each bug.
pub fn section<O: PropertyOp + Backends>(name: &str, config: &RunConfig) -> Section {
    section_with::<O>(name, config, &Progress::new(0))
}

/// [`section`], counting each property run on `progress`.
fn section_with<O: PropertyOp + Backends>(
    name: &str,
    config: &RunConfig,
    progress: &Progress,
) -> Section {
    let properties = O::properties().iter().map(|p| p.name.to_string()).collect();
    let correct = row::<O>(None, config, progress);
    let bugs = O::Bug::ALL
        .iter()
        .map(|&b| row::<O>(Some(b), config, progress))
        .collect();
    Section::new(name, properties, correct, bugs)
}

/// Runs every section with `cases` cases per property from `seed`.
pub fn run(cases: usize, seed: u64) -> SelftestReport {
    /// Property runs in all: (correct model + each bug) × properties, per operation.
    struct Count(u64);
    impl Visit for Count {
        fn visit<O: Operation>(&mut self, _: &'static str) -> ControlFlow<()> {
            if O::emulate(None).is_some() {
                self.0 += ((1 + O::Bug::ALL.len()) * O::properties().len()) as u64;
            }
            ControlFlow::Continue(())
        }
    }
    struct Sections<'a>(RunConfig, Vec<Section>, &'a Progress);
    impl Visit for Sections<'_> {
        fn visit<O: Operation>(&mut self, title: &'static str) -> ControlFlow<()> {
            if O::emulate(None).is_some() {
                self.1.push(section_with::<O>(title, &self.0, self.2));
            }
            ControlFlow::Continue(())
        }
    }
    let mut count = Count(0);
    ops::each(&mut count);
    // A bar on stderr (when it is a terminal): property runs done, the current model and
    // property.
    let progress = Progress::steps(count.0, "");
    let config = RunConfig::new(cases.min(u32::MAX as usize) as u32, seed);
    let mut all = Sections(config, Vec::new(), &progress);
    ops::each(&mut all);
    progress.done();
    let sections = all.1;
    let ok = sections.iter().all(|s| s.ok);
    SelftestReport {
        verdict: if ok {
            VerdictKind::Pass
        } else {
            VerdictKind::Fail
        },
        cases,
        seed,
        sections,
    }
}

impl SelftestReport {
    /// Every section is ok: the correct models pass every property, every bug is caught by
    /// some property, and every property catches some bug.
    pub fn ok(&self) -> bool {
        self.verdict == VerdictKind::Pass
    }
}

impl Report for SelftestReport {
    fn text(&self) -> String {
        let mut s = String::new();
        for section in &self.sections {
            s.push_str(&section.render(self.cases, self.seed));
        }
        let default = moecheck_properties::DEFAULT_CASES as usize;
        if !self.ok() && self.cases < default {
            s.push_str(&format!(
                "\nnote: with --cases {} each property sees only {} case(s) per implementation; a bug whose edge case is not drawn stays NOT CAUGHT. At the default {default} every planted bug is caught.\n",
                self.cases, self.cases
            ));
        }
        s.push_str(&format!(
            "\nselftest: {}\n",
            if self.ok() { "ok" } else { "FAILED" }
        ));
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
    use moecheck_reference::routing::Route;

    #[test]
    fn routing_section_catches_every_routing_bug() {
        let section = section::<Route>("routing", &RunConfig::new(32, 7));
        assert_eq!(section.bugs.len(), <Route as Backends>::Bug::ALL.len());
        assert!(section.ok, "{}", section.render(32, 7));
        assert!(section.render(32, 7).contains("routing: ok"));
    }

    #[test]
    fn selftest_catches_every_bug() {
        let r = run(48, 1);
        eprintln!("{}", r.text());
        assert!(r.ok(), "{}", r.text());
        assert_eq!(r.sections.len(), 4);
    }
}
