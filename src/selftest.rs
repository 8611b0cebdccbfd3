//! `moecheck selftest`: do the properties catch the bugs planted in `emulate`?
//!
//! Every property runs against the correct model (`Emulate { inject: None }`), which must
//! pass all of them, and against each [`Bug`], which at least one property must catch.
//! Every property must also catch at least one bug, or it checks nothing the others do not.

use moecheck_properties::{all, check, Outcome, RunConfig};
use serde::Serialize;

use crate::impls::emulate::{Bug, Emulate};
use crate::impls::route_emulate::{RouteBug, RouteEmulate};
use moecheck_properties::routing::{all_route, check_route};

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
    pub cases: usize,
    pub seed: u64,
    pub properties: Vec<String>,
    /// The correct model: every cell must pass.
    pub correct: Row,
    /// One row per bug: some cell must fail.
    pub bugs: Vec<Row>,
    /// Bugs no property caught.
    pub uncaught_bugs: Vec<String>,
    /// Properties that caught no bug.
    pub idle_properties: Vec<String>,
    pub ok: bool,
    /// Further sections with their own properties and planted bugs (routing, …), each held
    /// to the same rule as the grouped-GEMM table above.
    pub sections: Vec<Section>,
}

/// One more selftest table: its own properties against its own correct model and bugs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Section {
    /// `routing`, …
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

    /// The section's table, in the layout of [`SelftestReport::render_table`].
    pub fn render(&self, cases: usize, seed: u64) -> String {
        let as_report = SelftestReport {
            cases,
            seed,
            properties: self.properties.clone(),
            correct: self.correct.clone(),
            bugs: self.bugs.clone(),
            uncaught_bugs: self.uncaught_bugs.clone(),
            idle_properties: self.idle_properties.clone(),
            ok: self.ok,
            sections: Vec::new(),
        };
        let table = as_report.render_table();
        let body = table
            .trim_end()
            .rsplit_once('\n')
            .map_or(table.as_str(), |(head, _)| head);
        format!(
            "\n== {} ==\n{}\n{}: {}\n",
            self.name,
            body.trim_end(),
            self.name,
            if self.ok { "ok" } else { "FAILED" }
        )
    }
}

/// A table cell from a property's outcome.
pub(crate) fn cell(property: &str, outcome: Outcome) -> Cell {
    match outcome {
        Outcome::Passed { .. } => Cell {
            property: property.to_string(),
            failed: false,
            reason: None,
            minimal_case: None,
        },
        Outcome::Failed {
            reason,
            minimal_case,
        } => Cell {
            property: property.to_string(),
            failed: true,
            reason: Some(reason),
            minimal_case: Some(minimal_case),
        },
    }
}

fn route_row(bug: Option<RouteBug>, config: &RunConfig) -> Row {
    let imp = RouteEmulate::with_bug(bug);
    Row {
        bug: bug.map(|b| b.name().to_string()),
        implementation: moecheck_reference::routing::Router::name(&imp),
        description: bug
            .map_or("the correct model", |b| b.description())
            .to_string(),
        cells: all_route()
            .iter()
            .map(|p| cell(p.name, check_route(p, &imp, config)))
            .collect(),
    }
}

/// The routing section: every routing property against the correct routing model and each
/// planted [`RouteBug`].
pub fn routing_section(config: &RunConfig) -> Section {
    let properties = all_route().iter().map(|p| p.name.to_string()).collect();
    let correct = route_row(None, config);
    let bugs = RouteBug::ALL
        .iter()
        .map(|&b| route_row(Some(b), config))
        .collect();
    Section::new("routing", properties, correct, bugs)
}

fn row(imp: &Emulate, bug: Option<Bug>, config: &RunConfig) -> Row {
    let cells = all()
        .iter()
        .map(|p| cell(p.name, check(p, imp, config)))
        .collect();
    Row {
        bug: bug.map(|b| b.name().to_string()),
        implementation: moecheck_reference::implementation::GroupedGemm::name(imp),
        description: bug
            .map_or("the correct model", |b| b.description())
            .to_string(),
        cells,
    }
}

/// Runs every property with `cases` cases from `seed` against the correct model and each bug.
pub fn run(cases: usize, seed: u64) -> SelftestReport {
    let config = RunConfig::new(cases.min(u32::MAX as usize) as u32, seed);
    let properties: Vec<String> = all().iter().map(|p| p.name.to_string()).collect();
    let correct = row(&Emulate::default(), None, &config);
    let bugs: Vec<Row> = Bug::ALL
        .iter()
        .map(|&b| row(&Emulate::with_bug(Some(b)), Some(b), &config))
        .collect();
    let uncaught_bugs = bugs
        .iter()
        .filter(|r| !r.caught())
        .filter_map(|r| r.bug.clone())
        .collect();
    let idle_properties = properties
        .iter()
        .enumerate()
        .filter(|(i, _)| !bugs.iter().any(|r| r.cells[*i].failed))
        .map(|(_, p)| p.clone())
        .collect();
    let mut report = SelftestReport {
        cases,
        seed,
        properties,
        correct,
        bugs,
        uncaught_bugs,
        idle_properties,
        ok: false,
        sections: vec![
            crate::selftest_fp8::fp8_section(&config),
            routing_section(&config),
            crate::selftest_moe::section(&config),
        ],
    };
    report.ok = report.compute_ok();
    report
}

impl SelftestReport {
    fn compute_ok(&self) -> bool {
        !self.correct.caught()
            && self.uncaught_bugs.is_empty()
            && self.idle_properties.is_empty()
            && self.sections.iter().all(|s| s.ok)
    }

    /// The correct model passes every property, every bug is caught by some property, and
    /// every property catches some bug.
    pub fn ok(&self) -> bool {
        self.compute_ok()
    }

    /// A bug × property table (`caught` / `-`), then the correct model's row, then the
    /// minimal case of the first property that caught each bug.
    pub fn render_table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
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
        let _ = writeln!(s, "\n{} cases per property, seed {}", self.cases, self.seed);
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
        for section in &self.sections {
            s.push_str(&section.render(self.cases, self.seed));
        }
        let _ = writeln!(s, "\nselftest: {}", if self.ok() { "ok" } else { "FAILED" });
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_section_catches_every_routing_bug() {
        let section = routing_section(&RunConfig::new(32, 7));
        assert_eq!(section.bugs.len(), RouteBug::ALL.len());
        assert!(section.ok, "{}", section.render(32, 7));
        assert!(section.render(32, 7).contains("routing: ok"));
    }

    #[test]
    fn selftest_catches_every_bug() {
        let r = run(48, 1);
        eprintln!("{}", r.render_table());
        assert!(r.ok(), "{}", r.render_table());
    }
}
