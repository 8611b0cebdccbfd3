//! The MoE-layer section of `moecheck selftest`: every layer property against the correct
//! layer model (`MoeEmulate` without a bug), which must pass all of them, and against each
//! [`MoeBug`], which at least one property must catch; every property must catch some bug.

use moecheck_properties::moe::{check_layer, layer_properties};
use moecheck_properties::{Outcome, RunConfig};
use serde::Serialize;

use crate::impls::moe_emulate::{MoeBug, MoeEmulate};
use crate::selftest::{Cell, Row};

/// The layer section of the selftest report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MoeLayerSection {
    pub properties: Vec<String>,
    pub correct: Row,
    pub bugs: Vec<Row>,
    pub uncaught_bugs: Vec<String>,
    pub idle_properties: Vec<String>,
    pub ok: bool,
}

fn row(imp: &MoeEmulate, config: &RunConfig) -> Row {
    let cells = layer_properties()
        .iter()
        .map(|p| match check_layer(p, imp, config) {
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
        bug: imp.inject.map(|b| b.name().to_string()),
        implementation: moecheck_reference::moe::MoeLayer::name(imp),
        description: imp
            .inject
            .map_or("the correct layer model", MoeBug::description)
            .to_string(),
        cells,
    }
}

/// Runs the layer section with `cases` cases per cell from `seed`.
pub fn run(cases: usize, seed: u64) -> MoeLayerSection {
    let config = RunConfig::new(cases.min(u32::MAX as usize) as u32, seed);
    let properties: Vec<String> = layer_properties()
        .iter()
        .map(|p| p.name.to_string())
        .collect();
    let correct = row(&MoeEmulate::default(), &config);
    let bugs: Vec<Row> = MoeBug::ALL
        .iter()
        .map(|&b| row(&MoeEmulate { inject: Some(b) }, &config))
        .collect();
    let uncaught_bugs: Vec<String> = bugs
        .iter()
        .filter(|r| !r.caught())
        .filter_map(|r| r.bug.clone())
        .collect();
    let idle_properties: Vec<String> = properties
        .iter()
        .enumerate()
        .filter(|(i, _)| !bugs.iter().any(|r| r.cells[*i].failed))
        .map(|(_, p)| p.clone())
        .collect();
    let ok = !correct.caught() && uncaught_bugs.is_empty() && idle_properties.is_empty();
    MoeLayerSection {
        properties,
        correct,
        bugs,
        uncaught_bugs,
        idle_properties,
        ok,
    }
}

impl MoeLayerSection {
    /// The bug × property table and the first catch of each bug.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut s = String::from("\n== MoE layer (op moe_layer, emulate model) ==\n");
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
                "\ncorrect layer model FAILED {}\n  reason: {}\n  minimal case: {}",
                c.property,
                c.reason.as_deref().unwrap_or(""),
                c.minimal_case.as_deref().unwrap_or("")
            );
        }
        if !self.idle_properties.is_empty() {
            let _ = writeln!(
                s,
                "\nlayer properties that caught no bug: {}",
                self.idle_properties.join(", ")
            );
        }
        let _ = writeln!(
            s,
            "\nMoE layer section: {}",
            if self.ok { "ok" } else { "FAILED" }
        );
        s
    }
}
