//! The FP8 section of `moecheck selftest`: every FP8 property against the correct FP8 model
//! ([`EmulateFp8`] without a bug), which must pass all of them, and against each [`Fp8Bug`],
//! which at least one property must catch; every property must catch some bug.

use moecheck_properties::fp8::{check_fp8, fp8_all};
use moecheck_properties::{Outcome, RunConfig};
use moecheck_reference::fp8::Fp8GroupedGemm;
use serde::Serialize;

use crate::impls::emulate_fp8::{EmulateFp8, Fp8Bug};
use crate::selftest::{Cell, Row};

/// The FP8 bug × property table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fp8Section {
    pub properties: Vec<String>,
    pub correct: Row,
    pub bugs: Vec<Row>,
    pub uncaught_bugs: Vec<String>,
    pub idle_properties: Vec<String>,
}

fn row(imp: &EmulateFp8, bug: Option<Fp8Bug>, config: &RunConfig) -> Row {
    let cells = fp8_all()
        .iter()
        .map(|p| match check_fp8(p, imp, config) {
            Outcome::Passed { .. } => Cell {
                property: p.name.to_string(),
                failed: false,
                reason: None,
                minimal_case: None,
            },
            Outcome::Failed {
                reason,
                minimal_case,
            } => Cell {
                property: p.name.to_string(),
                failed: true,
                reason: Some(reason),
                minimal_case: Some(minimal_case),
            },
        })
        .collect();
    Row {
        bug: bug.map(|b| b.name().to_string()),
        implementation: imp.name(),
        description: bug
            .map_or("the correct FP8 model", |b| b.description())
            .to_string(),
        cells,
    }
}

/// Runs every FP8 property against the correct model and each planted FP8 bug.
pub fn run(config: &RunConfig) -> Fp8Section {
    let properties: Vec<String> = fp8_all().iter().map(|p| p.name.to_string()).collect();
    let correct = row(&EmulateFp8::default(), None, config);
    let bugs: Vec<Row> = Fp8Bug::ALL
        .iter()
        .map(|&b| row(&EmulateFp8::with_bug(Some(b)), Some(b), config))
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
    Fp8Section {
        properties,
        correct,
        bugs,
        uncaught_bugs,
        idle_properties,
    }
}

impl Fp8Section {
    /// The correct model passes every FP8 property, every FP8 bug is caught, every property
    /// catches some bug.
    pub fn ok(&self) -> bool {
        !self.correct.caught() && self.uncaught_bugs.is_empty() && self.idle_properties.is_empty()
    }

    /// The FP8 table, in the same layout as the grouped-GEMM one.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut s = String::from("\nFP8 (current scaling, E4M3 fwd / E5M2 bwd)\n");
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
                "\ncorrect FP8 model FAILED {}\n  reason: {}\n  minimal case: {}",
                c.property,
                c.reason.as_deref().unwrap_or(""),
                c.minimal_case.as_deref().unwrap_or("")
            );
        }
        if !self.idle_properties.is_empty() {
            let _ = writeln!(
                s,
                "\nFP8 properties that caught no bug: {}",
                self.idle_properties.join(", ")
            );
        }
        s
    }
}
