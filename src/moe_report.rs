//! The report of `moecheck moe`: the table and the `--json` document.
//!
//! JSON schema ([`MoeReport`]): `verdict` (`"pass"`/`"fail"`), `implementation`, `is_model`
//! (true for the CPU emulation, never a GPU result), `shape` (tokens, hidden, experts, ffn,
//! shared_ffn, topk, kept and dropped assignments, empty experts), `routing` (the
//! configuration), `precision` (declared input/compute/output), `draws` (cases drawn until one
//! had no near tie), `run_error`, `failure`, and `tensors`: per output tensor (`out`, `dx`,
//! `dw_router`, `dw0`, `dw1`, `dwo`, `dshared_*`) and, for the expert weight gradients, per
//! expert: `failed`, `max_abs_err`, `max_bound_ratio`, `max_ulp`, `calc_diff`, `nan`, `inf`,
//! `worst` element. Non-finite numbers are written as `null`.

use std::fmt::Write as _;

use serde::Serialize;

use moecheck_reference::moe::{Forward, LayerPrecision, LayerVerdict, MoeCase, TensorReport};
use moecheck_reference::routing::RoutingConfig;

/// The case's shape and routing outcome.
#[derive(Debug, Clone, Serialize)]
pub struct MoeShape {
    pub tokens: usize,
    pub hidden: usize,
    pub experts: usize,
    pub ffn: usize,
    pub shared_ffn: usize,
    pub topk: usize,
    pub kept_assignments: usize,
    pub dropped_assignments: usize,
    pub empty_experts: usize,
}

impl MoeShape {
    pub fn of(case: &MoeCase, fwd: &Forward) -> MoeShape {
        let kept = fwd.perm.rows_used();
        MoeShape {
            tokens: case.tokens(),
            hidden: case.hidden(),
            experts: case.experts(),
            ffn: case.ffn(),
            shared_ffn: case.shared.as_ref().map_or(0, |s| s.w0.ncols()),
            topk: case.topk(),
            kept_assignments: kept,
            dropped_assignments: fwd.perm.rows() - kept,
            empty_experts: fwd.perm.group_sizes.iter().filter(|s| **s == 0).count(),
        }
    }
}

/// The `--json` document of `moecheck moe`.
#[derive(Debug, Clone, Serialize)]
pub struct MoeReport {
    pub verdict: &'static str,
    pub implementation: String,
    pub is_model: bool,
    pub dtype: String,
    pub shape: MoeShape,
    pub routing: RoutingConfig,
    pub precision: LayerPrecision,
    /// Cases drawn (from consecutive seeds) until one had no top-k/group/capacity near tie.
    pub draws: usize,
    pub run_error: Option<String>,
    pub failure: Option<String>,
    pub tensors: Vec<TensorReport>,
}

impl MoeReport {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        implementation: String,
        is_model: bool,
        case: &MoeCase,
        fwd: &Forward,
        precision: LayerPrecision,
        draws: usize,
        verdict: &LayerVerdict,
    ) -> MoeReport {
        let (run_error, tensors) = match verdict {
            LayerVerdict::Compared(r) => (None, r.tensors.clone()),
            LayerVerdict::RunFailed(e) => (Some(e.0.clone()), Vec::new()),
        };
        MoeReport {
            verdict: if verdict.passed() { "pass" } else { "fail" },
            implementation,
            is_model,
            dtype: case.dtype.to_string(),
            shape: MoeShape::of(case, fwd),
            routing: case.routing,
            precision,
            draws,
            run_error,
            failure: verdict.failure(),
            tensors,
        }
    }

    /// The readable table: one line per tensor, then the failing experts.
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
        let r = &self.routing;
        let _ = writeln!(
            s_,
            "case: T={} H={} E={} F={} shared F={} k={}, {} assignments kept, {} dropped, {} empty experts, dtype {}",
            sh.tokens, sh.hidden, sh.experts, sh.ffn, sh.shared_ffn, sh.topk,
            sh.kept_assignments, sh.dropped_assignments, sh.empty_experts, self.dtype
        );
        let _ = writeln!(
            s_,
            "routing: {}{}{}, scaling {}{}",
            r.score,
            r.groups
                .map(|g| format!(", {} groups keep {}", g.groups, g.topk_groups))
                .unwrap_or_default(),
            if r.norm_topk { ", norm_topk" } else { "" },
            r.scaling_factor,
            r.capacity
                .map(|c| format!(", capacity factor {} ({})", c.factor, c.policy.name()))
                .unwrap_or_default()
        );
        let _ = writeln!(
            s_,
            "declared precision: compute {}, output {}; case drawn in {} attempt(s) (near ties resampled)",
            self.precision.compute, self.precision.output, self.draws
        );
        if let Some(e) = &self.run_error {
            let _ = writeln!(s_, "run failed: {e}");
        }
        if !self.tensors.is_empty() {
            let _ = writeln!(
                s_,
                "{:<11} {:<5} {:>9} {:>11} {:>10} {:>9} {:>10} {:>5}  worst (expert, index)",
                "tensor", "ok", "failed", "max|err|", "err/bound", "max ulp", "calc_diff", "nan"
            );
        }
        for t in &self.tensors {
            let worst = t
                .worst_slice()
                .and_then(|sl| {
                    sl.stats.worst.as_ref().map(|w| {
                        let e = sl
                            .expert
                            .map(|e| format!("expert {e}, "))
                            .unwrap_or_default();
                        format!("({e}{:?})", w.at.index)
                    })
                })
                .unwrap_or_else(|| "-".into());
            let calc = t
                .slices
                .iter()
                .map(|g| g.stats.calc_diff)
                .fold(0.0f64, f64::max);
            let _ = writeln!(
                s_,
                "{:<11} {:<5} {:>9} {:>11.3e} {:>10.3} {:>9.2} {:>10.2e} {:>5}  {}",
                t.tensor.name(),
                if t.passed() { "PASS" } else { "FAIL" },
                t.failed_elements(),
                t.max_of(|g| g.max_abs_err),
                t.max_of(|g| g.max_bound_ratio),
                t.max_of(|g| g.max_ulp),
                calc,
                t.slices.iter().map(|g| g.stats.nan).sum::<usize>(),
                worst
            );
            if let Some(e) = &t.error {
                let _ = writeln!(s_, "            {e}");
            }
            let bad: Vec<_> = t.slices.iter().filter(|g| g.stats.failed > 0).collect();
            for g in bad.iter().take(8) {
                let w = g
                    .stats
                    .worst
                    .as_ref()
                    .expect("a failed slice has a worst element");
                let at = g
                    .expert
                    .map(|e| format!("expert {e}"))
                    .unwrap_or_else(|| "all".into());
                let _ = writeln!(
                    s_,
                    "            {at}: {} of {} elements outside the bound; worst {:?}: got {:e}, want {:e}, bound {:.3e}",
                    g.stats.failed, g.stats.elements, w.at.index, w.got, w.want, w.bound
                );
            }
            if bad.len() > 8 {
                let _ = writeln!(
                    s_,
                    "            … and {} more failing experts (see --json)",
                    bad.len() - 8
                );
            }
        }
        let _ = writeln!(s_, "verdict: {}", self.verdict.to_uppercase());
        s
    }
}
