//! The report of an MoE-layer check (`moecheck moe`, `moecheck check` on a layer case): the
//! table and the `--json` document.
//!
//! JSON schema ([`MoeDocument`]): `verdict` (`"pass"`/`"fail"`), `implementation`, `is_model`
//! (true for the CPU emulation, never a GPU result), `dtype`, `shape` (tokens, hidden,
//! experts, ffn, shared_ffn, topk, kept and dropped assignments, empty experts), `routing`
//! (the configuration), `precision` (declared input/compute/output), `draws` (cases drawn
//! until one had no near tie; 0 for a case read by `moecheck check`), `run_error`, `failure`,
//! and `tensors`: per output tensor (`out`, `dx`, `dw_router`, `dw0`, `dw1`, `dwo`,
//! `dshared_*`) and, for the expert weight gradients, per expert: `failed`, `max_abs_err`, `max_bound_ratio`, `max_ulp`,
//! `calc_diff`, `nan`, `inf`, `worst` element. Non-finite numbers are written as `null`.

use std::fmt::Write as _;

use serde::Serialize;

use super::bound::LayerPrecision;
use super::compare::TensorReport;
use super::ffn::Activation;
use super::layer::{Forward, MoeCase};
use super::op::MoeLayer;

use crate::report::{verdict_line, Reported, RunHead, RunInfo, RunOutcome, StatsRow, StatsTable};
use crate::routing::RoutingConfig;

/// The case's shape and routing outcome.
#[derive(Debug, Clone, Serialize)]
pub struct MoeShape {
    pub tokens: usize,
    pub hidden: usize,
    pub experts: usize,
    pub ffn: usize,
    pub shared_ffn: usize,
    /// The shared expert is gated by `σ(x·g)`.
    pub shared_gate: bool,
    /// The experts' activation (`swiglu`, `clamped-swiglu`).
    pub activation: Activation,
    /// Per-expert biases, a router-logit bias.
    pub expert_bias: bool,
    pub router_bias: bool,
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
            shared_gate: case.shared.as_ref().is_some_and(|s| s.gate.is_some()),
            activation: case.activation,
            expert_bias: case.expert_bias.is_some(),
            router_bias: case.router_bias.is_some(),
            topk: case.topk(),
            kept_assignments: kept,
            dropped_assignments: fwd.perm.rows() - kept,
            empty_experts: fwd.perm.group_sizes.iter().filter(|s| **s == 0).count(),
        }
    }
}

/// The `--json` document of `moecheck moe`.
#[derive(Debug, Clone, Serialize)]
pub struct MoeDocument {
    #[serde(flatten)]
    pub head: RunHead,
    pub dtype: String,
    pub shape: MoeShape,
    pub routing: RoutingConfig,
    /// Whether the case has a per-expert selection bias (`bias.npy`).
    pub bias: bool,
    pub precision: LayerPrecision,
    /// Cases drawn (from consecutive seeds) until one had no top-k/group/capacity near tie.
    pub draws: usize,
    #[serde(flatten)]
    pub outcome: RunOutcome,
    pub tensors: Vec<TensorReport>,
}

impl Reported for MoeLayer {
    type Document = MoeDocument;

    fn document(run: &RunInfo<MoeLayer>) -> MoeDocument {
        MoeDocument {
            head: RunHead::of(run),
            dtype: run.case.dtype.to_string(),
            shape: MoeShape::of(run.case, &run.expected.forward),
            routing: run.case.routing,
            bias: run.case.bias.is_some(),
            precision: *run.precision,
            draws: run.draws,
            outcome: RunOutcome::of(run),
            tensors: run.report().map_or_else(Vec::new, |r| r.tensors.clone()),
        }
    }

    /// One line per tensor, then the failing experts.
    fn render(doc: &MoeDocument) -> String {
        let mut s = String::new();
        doc.head.render(&mut s);
        render_case(&mut s, doc);
        doc.outcome.render(&mut s);
        render_tensors(&mut s, &doc.tensors);
        verdict_line(&mut s, doc.head.verdict);
        s
    }
}

/// The shape, the routing and the declared precision.
fn render_case(s: &mut String, doc: &MoeDocument) {
    let sh = &doc.shape;
    let r = &doc.routing;
    let _ = writeln!(
        s,
        "case: T={} H={} E={} F={} shared F={}{} k={}, {} assignments kept, {} dropped, {} empty experts, dtype {}",
        sh.tokens, sh.hidden, sh.experts, sh.ffn, sh.shared_ffn,
        if sh.shared_gate { " (sigmoid-gated)" } else { "" },
        sh.topk,
        sh.kept_assignments, sh.dropped_assignments, sh.empty_experts, doc.dtype
    );
    if sh.activation != Activation::Swiglu || sh.expert_bias || sh.router_bias {
        let _ = writeln!(
            s,
            "layer: activation {}{}{}",
            sh.activation.name(),
            if sh.expert_bias {
                ", expert biases"
            } else {
                ""
            },
            if sh.router_bias {
                ", router-logit bias"
            } else {
                ""
            }
        );
    }
    let sigmoid = match r.score {
        crate::routing::ScoreFunction::Sigmoid => {
            format!(", sigmoid-norm {}", r.sigmoid_norm.name())
        }
        _ => String::new(),
    };
    let _ = writeln!(
        s,
        "routing: {}{}{}{}{}, scaling {}{}{}{}",
        r.score,
        if doc.bias { ", selection bias" } else { "" },
        r.groups
            .map(|g| format!(", {} groups keep {}", g.groups, g.topk_groups))
            .unwrap_or_default(),
        if r.norm_topk { ", norm_topk" } else { "" },
        sigmoid,
        r.scaling_factor,
        r.capacity
            .map(|c| format!(", capacity factor {} ({})", c.factor, c.policy.name()))
            .unwrap_or_default(),
        if r.ties == crate::routing::Ties::Any {
            ", ties any"
        } else {
            ""
        },
        if r.slot_order == crate::routing::SlotOrder::Any {
            ", slots in any order"
        } else {
            ""
        }
    );
    let drawn = match doc.draws {
        0 => "case read from a directory".to_string(),
        n => format!("case drawn in {n} attempt(s) (near ties resampled)"),
    };
    let router = match doc.precision.router {
        Some(f) => format!(", router {f}"),
        None => String::new(),
    };
    let _ = writeln!(
        s,
        "declared precision: compute {}{router}, output {}; {drawn}",
        doc.precision.compute, doc.precision.output
    );
}

/// One row per tensor (the statistics table every element-wise report shares), then its
/// failing slices.
fn render_tensors(s: &mut String, tensors: &[TensorReport]) {
    let table = StatsTable {
        label: "tensor",
        width: 13,
        worst_label: "(expert, index)",
        indent: 14,
        slice_noun: "experts",
    };
    if !tensors.is_empty() {
        table.header(s);
    }
    for t in tensors {
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
        let failing = t
            .slices
            .iter()
            .filter(|g| g.stats.failed > 0)
            .map(|g| {
                let w = g.stats.worst.as_ref().expect("a failed slice has a worst element");
                let at = g.expert.map_or_else(|| "all".into(), |e| format!("expert {e}"));
                let (got, want) = crate::report::sci_pair(w.got, w.want);
                format!(
                    "{at}: {} of {} elements outside the bound; worst {:?}: got {got}, want {want}, bound {}",
                    g.stats.failed, g.stats.elements, w.at.index, crate::report::bound_text(w.bound)
                )
            })
            .collect();
        table.row(
            s,
            &StatsRow {
                name: t.tensor.name(),
                passed: t.passed(),
                slices: t.slices.iter().map(|g| &g.stats).collect(),
                worst,
                error: t.error.as_deref(),
                failing,
                notes: Vec::new(),
            },
        );
    }
}
