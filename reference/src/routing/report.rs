//! The report of a routing run (`moecheck route`, `moecheck check` on a routing case): the
//! readable summary and the `--json` document.
//!
//! JSON schema ([`RouteDocument`]): `verdict` (`"pass"`, `"fail"`: an implementation differs
//! or failed, `"done"`: the reference only), `tokens`, `experts`, `topk`, `config` (the
//! routing configuration), `capacity` (the expert capacity, with dropping), `dropped`
//! (dropped assignments), `group_sizes` (kept assignments per expert), `reference_seconds`,
//! `implementation` (`null` for the reference only), `is_model` (true for the CPU model,
//! never a GPU result), `comparison` (the [`RouteReport`]), `run_error`, `failure` (one line
//! on the first failure, as every operation's document has it; `null` when it passed).

use std::fmt::Write as _;

use serde::Serialize;

use super::compare::RouteReport;
use super::config::{DropPolicy, RoutingConfig, ScoreFunction};
use super::op::Route;
use crate::op::VerdictKind;
use crate::report::{verdict_line, Reported, RunInfo};

/// The `--json` document of `moecheck route`.
#[derive(Debug, Clone, Serialize)]
pub struct RouteDocument {
    pub verdict: VerdictKind,
    pub tokens: usize,
    pub experts: usize,
    pub topk: usize,
    pub config: RoutingConfig,
    /// The expert capacity, with dropping.
    pub capacity: Option<usize>,
    /// Dropped assignments.
    pub dropped: usize,
    /// Kept assignments per expert.
    pub group_sizes: Vec<usize>,
    /// Seconds the reference routing took.
    pub reference_seconds: f64,
    pub implementation: Option<String>,
    /// The implementation is a CPU model (never a GPU result).
    pub is_model: bool,
    pub comparison: Option<RouteReport>,
    pub run_error: Option<String>,
    /// One line on the first failure (`None` when it passed or nothing was checked).
    pub failure: Option<String>,
    /// Where the reference's outputs were written (`--out`), for the text only.
    #[serde(skip)]
    pub wrote_to: Option<String>,
}

impl Reported for Route {
    type Document = RouteDocument;

    fn document(run: &RunInfo<Route>) -> RouteDocument {
        let want = run.expected;
        RouteDocument {
            verdict: run.verdict_kind(),
            tokens: run.case.tokens(),
            experts: run.case.experts(),
            topk: run.case.config.topk,
            config: run.case.config,
            capacity: want.capacity,
            dropped: want.kept.iter().filter(|k| !**k).count(),
            group_sizes: want.group_sizes.clone(),
            reference_seconds: run.reference_seconds,
            implementation: run.implementation.map(|i| i.name.clone()),
            is_model: run.is_model(),
            comparison: run.report().cloned(),
            run_error: run.run_error(),
            failure: run.failure(),
            wrote_to: None,
        }
    }

    fn render(r: &RouteDocument) -> String {
        let mut s = String::new();
        render_reference(&mut s, r);
        if let Some(name) = &r.implementation {
            let _ = writeln!(
                s,
                "implementation: {name}{}",
                if r.is_model {
                    " (a CPU model, not a GPU result)"
                } else {
                    ""
                }
            );
            if let Some(e) = &r.run_error {
                let label = crate::report::run_error_label(r.failure.as_deref());
                let _ = writeln!(s, "{label}: {e}");
            }
            if let Some(cmp) = &r.comparison {
                render_comparison(&mut s, cmp);
            }
            verdict_line(&mut s, r.verdict);
        }
        s
    }
}

/// The configuration, the capacity, the group sizes and where the outputs went.
fn render_reference(s: &mut String, r: &RouteDocument) {
    let c = &r.config;
    let _ = write!(
        s,
        "route: T = {}, E = {}, K = {}, score {}",
        r.tokens, r.experts, r.topk, c.score
    );
    if let Some(g) = c.groups {
        let _ = write!(
            s,
            ", {} groups keep {} (scored by {})",
            g.groups,
            g.topk_groups,
            c.group_score.name()
        );
    }
    if c.normalises() {
        let _ = write!(s, ", normalised (eps {:e})", c.norm_eps);
    } else if c.score == ScoreFunction::Sigmoid {
        let _ = write!(
            s,
            ", not normalised (sigmoid-norm {})",
            c.sigmoid_norm.name()
        );
    }
    let _ = write!(s, ", ties {}", c.ties.name());
    if c.slot_order == super::convention::SlotOrder::Any {
        let _ = write!(s, ", slots in any order");
    }
    if c.scaling_factor != 1.0 {
        let _ = write!(s, ", scaling {}", c.scaling_factor);
    }
    s.push('\n');
    if let (Some(cap), Some(k)) = (c.capacity, r.capacity) {
        let _ = writeln!(
            s,
            "capacity: {} policy, factor {}, C = {k}{}: {} of {} assignments dropped",
            cap.policy.name(),
            cap.factor,
            if cap.policy == DropPolicy::Position {
                format!(" per sequence of {}", cap.seq_len.unwrap_or(r.tokens))
            } else {
                String::new()
            },
            r.dropped,
            r.tokens * r.topk
        );
    }
    let (min, max) = r
        .group_sizes
        .iter()
        .fold((usize::MAX, 0), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let empty = r.group_sizes.iter().filter(|v| **v == 0).count();
    let _ = writeln!(
        s,
        "group sizes: min {}, max {max}, {empty} empty experts; reference took {:.3} s",
        if r.group_sizes.is_empty() { 0 } else { min },
        r.reference_seconds
    );
    if let Some(dir) = &r.wrote_to {
        let _ = writeln!(
            s,
            "wrote indices.npy, weights.npy, kept.npy, group_sizes.npy to {dir}"
        );
    }
}

/// The counts of differences, the listed mismatches and the near ties.
fn render_comparison(s: &mut String, cmp: &RouteReport) {
    let _ = writeln!(
        s,
        "indices: {} tokens differ; kept: {} differ; group_sizes: {} experts differ; \
         weights: {} outside bound (max |err| {:.3e}, max err/bound {:.3})",
        cmp.index_mismatch_tokens,
        cmp.kept_mismatches,
        cmp.group_size_mismatches,
        cmp.weight_failures,
        cmp.max_weight_abs_err,
        cmp.max_weight_err_ratio
    );
    for m in &cmp.mismatches {
        let _ = writeln!(s, "  {}{:?}: {}", m.what, m.at, m.detail);
    }
    if cmp.near_tie_assignments > 0 {
        let _ = writeln!(
            s,
            "near-ties: {} assignments decided the other way at a probs capacity \
             boundary between weights equal within rounding (not failures)",
            cmp.near_tie_assignments
        );
        for m in &cmp.near_ties {
            let _ = writeln!(s, "  {}{:?}: {}", m.what, m.at, m.detail);
        }
    }
}
