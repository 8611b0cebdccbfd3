//! Rendering a verdict: a readable table and the `--json` document.
//!
//! JSON schema (a [`GemmReport`]): `verdict` (`"pass"`/`"fail"`), `implementation`, `is_model`
//! (true for the CPU emulation, which is never a GPU result), `shape` (`m`, `k`, `n`, `groups`,
//! `rows_used`), `precision` (declared input/accumulator/output), `tail` (`"zero"`/`"ignored"`),
//! `run_error` (one line when the implementation produced nothing), and `passes`: per pass the
//! bound depth and per-group statistics (`max_abs_err`, `max_bound_ratio`, `max_ulp` in the
//! output format, `calc_diff`, `nan`, `inf`, `failed`, `worst` element). Non-finite numbers are
//! written as `null`.

use std::fmt::Write as _;

use serde::Serialize;

use moecheck_reference::gemm::{CaseReport, GroupedGemmCase, PassReport, Precision, TailContract};
use moecheck_reference::implementation::Verdict;

#[derive(Debug, Serialize)]
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
#[derive(Debug, Serialize)]
pub struct GemmReport {
    pub verdict: &'static str,
    pub implementation: String,
    pub is_model: bool,
    pub dtype: String,
    pub out_dtype: String,
    pub shape: Shape,
    pub precision: Precision,
    pub tail: TailContract,
    pub run_error: Option<String>,
    pub failure: Option<String>,
    pub passes: Vec<PassReport>,
}

impl GemmReport {
    pub fn new(
        implementation: String,
        is_model: bool,
        case: &GroupedGemmCase,
        precision: Precision,
        verdict: &Verdict,
    ) -> GemmReport {
        let (run_error, passes) = match verdict {
            Verdict::Compared(CaseReport { passes, .. }) => (None, passes.clone()),
            Verdict::RunFailed(e) => (Some(e.0.clone()), Vec::new()),
        };
        GemmReport {
            verdict: if verdict.passed() { "pass" } else { "fail" },
            implementation,
            is_model,
            dtype: case.dtype.to_string(),
            out_dtype: case.out_dtype.to_string(),
            shape: Shape::of(case),
            precision,
            tail: case.tail,
            run_error,
            failure: verdict.failure(),
            passes,
        }
    }

    /// The readable table.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let s_ = &mut s;
        let _ = writeln!(s_, "implementation: {}", self.implementation);
        if self.is_model {
            let _ = writeln!(
                s_,
                "  NOTE: this is a CPU model of a kernel (emulation), not a GPU result"
            );
        }
        let sh = &self.shape;
        let _ = writeln!(
            s_,
            "case: M={} K={} N={} experts={} (empty {}), rows used {} (tail {}), dtype {} -> out {}",
            sh.m, sh.k, sh.n, sh.groups, sh.empty_groups, sh.rows_used, sh.m - sh.rows_used, self.dtype, self.out_dtype
        );
        let acc = &self.precision.accumulator;
        let _ = writeln!(
            s_,
            "declared accumulator: {}{}; tail contract: {}",
            acc.format,
            acc.block
                .map(|b| format!(" in K blocks of {b}"))
                .unwrap_or_default(),
            match self.tail {
                TailContract::Zero => "tail rows must be exactly 0",
                TailContract::Ignored => "tail rows of out/dlhs NOT CHECKED (--tail ignored)",
            }
        );
        if let Some(e) = &self.run_error {
            let _ = writeln!(s_, "run failed: {e}");
        }
        if !self.passes.is_empty() {
            let _ = writeln!(
                s_,
                "{:<6} {:<5} {:>9} {:>11} {:>10} {:>9} {:>10} {:>5}  worst (group, row, col)",
                "pass", "ok", "failed", "max|err|", "err/bound", "max ulp", "calc_diff", "nan"
            );
        }
        for p in &self.passes {
            let worst = p
                .worst_group()
                .and_then(|g| g.worst)
                .map(|w| format!("({}, {}, {})", w.group, w.row, w.col))
                .unwrap_or_else(|| "-".into());
            let calc = p.groups.iter().map(|g| g.calc_diff).fold(0.0f64, f64::max);
            let _ = writeln!(
                s_,
                "{:<6} {:<5} {:>9} {:>11.3e} {:>10.3} {:>9.2} {:>10.2e} {:>5}  {}",
                p.pass.name(),
                if p.passed() { "PASS" } else { "FAIL" },
                p.failed_elements(),
                p.max_of(|g| g.max_abs_err),
                p.max_of(|g| g.max_bound_ratio),
                p.max_of(|g| g.max_ulp),
                calc,
                p.groups.iter().map(|g| g.nan).sum::<usize>(),
                worst
            );
            if let Some(e) = &p.error {
                let _ = writeln!(s_, "       {e}");
            }
            if p.bound_vacuous {
                let _ = writeln!(s_, "       WARNING: the declared accumulator cannot resolve sums this long; the bound is infinite");
            }
            let bad: Vec<_> = p.groups.iter().filter(|g| !g.passed()).collect();
            for g in bad.iter().take(8) {
                let w = g.worst.expect("a failed group has a worst element");
                let _ = writeln!(
                    s_,
                    "       {}: {} of {} elements outside the bound; worst row {} col {}: got {:e}, want {:e}, bound {:.3e}",
                    g.group, g.failed, g.checked, w.row, w.col, w.got, w.want, w.bound
                );
            }
            if bad.len() > 8 {
                let _ = writeln!(
                    s_,
                    "       … and {} more failing groups (see --json)",
                    bad.len() - 8
                );
            }
        }
        let _ = writeln!(s_, "verdict: {}", self.verdict.to_uppercase());
        s
    }
}
