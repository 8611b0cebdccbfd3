//! The report of a grouped-GEMM check: the readable table and the `--json` document.
//!
//! JSON schema ([`GemmDocument`]): `verdict` (`"pass"`/`"fail"`/`"inconclusive"`: every
//! element passed but a pass's bound admits an all-zero output), `implementation`, `is_model`
//! (true for the CPU emulation, which is never a GPU result), `dtype`, `out_dtype`, `shape`
//! (`m`, `k`, `n`, `groups`, `rows_used`, `empty_groups`), `precision` (declared
//! input/accumulator/output), `tail` (`"zero"`/`"ignored"`), `run_error` (one line when the
//! implementation produced nothing), `failure`, and `passes`: per pass the bound depth,
//! `bound_vacuous`, `zero_ratio` (`max |want| / bound`: at most 1 means zeros would pass) and
//! per-group statistics (`elements`, `checked`, `failed`, `max_abs_err`, `max_bound_ratio`,
//! `max_ulp` in the output format, `calc_diff`, `nan`, `inf`, `exact_non_finite` (NaN/inf in
//! the reference matched exactly), `worst` element). Non-finite
//! numbers are written as `null`.

use std::fmt::Write as _;

use serde::Serialize;

use super::bound::Precision;
use super::case::{GroupedGemmCase, TailContract};
use super::compare::PassReport;
use super::op::Gemm;
use crate::report::{verdict_line, Reported, RunHead, RunInfo, RunOutcome, StatsRow, StatsTable};

/// The case's shape.
#[derive(Debug, Clone, Serialize)]
pub struct Shape {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub groups: usize,
    pub rows_used: usize,
    pub empty_groups: usize,
}

impl Shape {
    pub fn of(case: &GroupedGemmCase) -> Shape {
        Shape {
            m: case.m(),
            k: case.k(),
            n: case.n(),
            groups: case.groups(),
            rows_used: case.rows_used(),
            empty_groups: case.group_sizes.iter().filter(|s| **s == 0).count(),
        }
    }
}

/// The `--json` document of `moecheck gemm` and `moecheck check`.
#[derive(Debug, Clone, Serialize)]
pub struct GemmDocument {
    #[serde(flatten)]
    pub head: RunHead,
    pub dtype: String,
    pub out_dtype: String,
    pub shape: Shape,
    pub precision: Precision,
    pub tail: TailContract,
    #[serde(flatten)]
    pub outcome: RunOutcome,
    pub passes: Vec<PassReport>,
}

impl Reported for Gemm {
    type Document = GemmDocument;

    fn document(run: &RunInfo<Gemm>) -> GemmDocument {
        GemmDocument {
            head: RunHead::of(run),
            dtype: run.case.dtype.to_string(),
            out_dtype: run.case.out_dtype.to_string(),
            shape: Shape::of(run.case),
            precision: *run.precision,
            tail: run.case.tail,
            outcome: RunOutcome::of(run),
            passes: run.report().map_or_else(Vec::new, |r| r.passes.clone()),
        }
    }

    fn render(doc: &GemmDocument) -> String {
        let mut s = String::new();
        doc.head.render(&mut s);
        render_case(&mut s, doc);
        doc.outcome.render(&mut s);
        render_passes(&mut s, &doc.passes);
        doc.outcome.render_inconclusive(&mut s, doc.head.verdict);
        verdict_line(&mut s, doc.head.verdict);
        s
    }
}

/// The case line and the declared precision.
pub fn render_case(s: &mut String, doc: &GemmDocument) {
    let sh = &doc.shape;
    let _ = writeln!(
        s,
        "case: M={} K={} N={} experts={} (empty {}), rows used {} (tail {}), dtype {} -> out {}",
        sh.m,
        sh.k,
        sh.n,
        sh.groups,
        sh.empty_groups,
        sh.rows_used,
        sh.m - sh.rows_used,
        doc.dtype,
        doc.out_dtype
    );
    let acc = &doc.precision.accumulator;
    let _ = writeln!(
        s,
        "declared accumulator: {}{}; tail contract: {}",
        acc.format,
        acc.block
            .map(|b| format!(" in K blocks of {b}"))
            .unwrap_or_default(),
        match doc.tail {
            TailContract::Zero => "tail rows must be exactly 0",
            TailContract::Ignored => "tail rows of out/dlhs NOT CHECKED (--tail ignored)",
        }
    );
}

/// One row per pass, then its failing groups.
pub fn render_passes(s: &mut String, passes: &[PassReport]) {
    let table = StatsTable {
        label: "pass",
        width: 6,
        worst_label: "(group, row, col)",
        indent: 7,
        slice_noun: "groups",
    };
    if !passes.is_empty() {
        table.header(s);
    }
    for p in passes {
        let worst = p
            .worst_group()
            .and_then(|g| g.stats.worst.as_ref())
            .map(|w| format!("({}, {}, {})", w.at.group, w.at.row, w.at.col))
            .unwrap_or_else(|| "-".into());
        let failing = p
            .groups
            .iter()
            .filter(|g| !g.passed())
            .map(|g| {
                let w = g.stats.worst.as_ref().expect("a failed group has a worst element");
                format!(
                    "{}: {} of {} elements outside the bound; worst row {} col {}: got {:e}, want {:e}, bound {:.3e}",
                    g.group, g.stats.failed, g.stats.checked, w.at.row, w.at.col, w.got, w.want, w.bound
                )
            })
            .collect();
        let notes = if p.bound_vacuous {
            vec!["WARNING: the declared accumulator cannot resolve sums this long; the bound is infinite".into()]
        } else {
            Vec::new()
        };
        table.row(
            s,
            &StatsRow {
                name: p.pass.name(),
                passed: p.passed(),
                slices: p.groups.iter().map(|g| &g.stats).collect(),
                worst,
                error: p.error.as_deref(),
                failing,
                notes,
            },
        );
    }
}
