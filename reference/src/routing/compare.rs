//! Comparing an implementation's routing with the reference (the weight bound is in
//! [`super::bound`]).
//!
//! ## What must match exactly
//! `indices` (in selection order, or as a set per token under [`SlotOrder::Any`], each
//! weight and kept flag following its expert), `kept` and `group_sizes` are discrete and must
//! be equal.
//! Where a token's indices differ its weights and kept flags are not compared (the index
//! mismatch is the finding). A dropped assignment's weight must be exactly 0.
//!

use serde::Serialize;

use super::bound::{selection_score_bound, weight_bound, RouteOutputs, RoutePrecision};
use super::config::{DropPolicy, ScoreFunction};
use super::convention::{SlotOrder, Ties};
use super::near_tie::probs_near_ties;
use super::route::{route_following, Routing, RoutingCase};

/// One discrete or out-of-bound difference.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteMismatch {
    /// `indices`, `kept`, `weights`, `group_sizes` or `shape`.
    pub what: String,
    /// Token (or expert for `group_sizes`).
    pub at: Vec<usize>,
    pub detail: String,
}

/// The comparison of one implementation's routing with the reference.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteReport {
    pub tokens: usize,
    pub experts: usize,
    pub topk: usize,
    /// Tokens whose `indices` row differs.
    pub index_mismatch_tokens: usize,
    /// Assignments whose `kept` differs (tokens with equal indices only).
    pub kept_mismatches: usize,
    /// Experts whose `group_sizes` differs.
    pub group_size_mismatches: usize,
    /// Weights outside their bound (tokens with equal indices only).
    pub weight_failures: usize,
    /// Largest `|ŵ - w|` over compared weights.
    pub max_weight_abs_err: f64,
    /// Largest `|ŵ - w| / bound` over compared weights (0 where both are exactly 0).
    pub max_weight_err_ratio: f64,
    /// Assignments on either side of a `probs` capacity boundary that the implementation
    /// decided the other way between weights equal within rounding (not failures).
    pub near_tie_assignments: usize,
    /// The first few differences, token-major.
    pub mismatches: Vec<RouteMismatch>,
    /// The first few near-ties (informational).
    pub near_ties: Vec<RouteMismatch>,
}

/// How many mismatches a report lists.
const MAX_LISTED: usize = 16;

impl RouteReport {
    pub fn passed(&self) -> bool {
        self.index_mismatch_tokens == 0
            && self.kept_mismatches == 0
            && self.group_size_mismatches == 0
            && self.weight_failures == 0
            && self.mismatches.is_empty()
    }
    /// One line on the first difference, `None` if it passed.
    pub fn first_failure(&self) -> Option<String> {
        self.mismatches
            .first()
            .map(|m| format!("{}{:?}: {}", m.what, m.at, m.detail))
    }
}

/// Compares `got` against the reference routing `want` of `case`.
pub fn compare_routing(
    case: &RoutingCase,
    want: &Routing,
    got: &RouteOutputs,
    precision: RoutePrecision,
) -> RouteReport {
    let (t, k) = want.indices.dim();
    let e = case.experts();
    let mut rep = RouteReport {
        tokens: t,
        experts: e,
        topk: k,
        index_mismatch_tokens: 0,
        kept_mismatches: 0,
        group_size_mismatches: 0,
        weight_failures: 0,
        max_weight_abs_err: 0.0,
        max_weight_err_ratio: 0.0,
        near_tie_assignments: 0,
        mismatches: Vec::new(),
        near_ties: Vec::new(),
    };
    let push = |rep: &mut RouteReport, what: &str, at: Vec<usize>, detail: String| {
        if rep.mismatches.len() < MAX_LISTED {
            rep.mismatches.push(RouteMismatch {
                what: what.into(),
                at,
                detail,
            });
        }
    };
    for (name, shape) in [
        ("indices", got.indices.dim()),
        ("weights", got.weights.dim()),
        ("kept", got.kept.dim()),
    ] {
        if shape != (t, k) {
            push(
                &mut rep,
                "shape",
                vec![],
                format!("{name} has shape {shape:?}, expected {:?}", (t, k)),
            );
        }
    }
    if got.group_sizes.len() != e {
        push(
            &mut rep,
            "shape",
            vec![],
            format!(
                "group_sizes has {} entries, expected {e}",
                got.group_sizes.len()
            ),
        );
    }
    if !rep.mismatches.is_empty() {
        return rep;
    }
    // Under `slot_order = any`, the implementation's slots put in the order the reference
    // writes them (selection score, equal scores lower expert first), so that everything read
    // by slot below — the tie order `route_following` follows (which then orders equal scores
    // the same way), which assignment a capacity policy prefers among equals, the slots
    // compared with the reference's — reads them as a sorted implementation would have written
    // them.
    let sorted;
    let got = match case.config.slot_order {
        SlotOrder::Any => {
            sorted = by_score(&want.selection_scores, got);
            &sorted
        }
        SlotOrder::Score => got,
    };
    // Under `ties = any`, the routing that breaks every exact tie as the implementation did.
    let followed;
    let want = match case.config.ties {
        Ties::Any => match route_following(case, got.indices.view(), got.kept.view()) {
            Ok(r) => {
                followed = r;
                &followed
            }
            Err(_) => want,
        },
        Ties::LowerIndex => want,
    };
    let near = probs_near_ties(case, want, got, precision);
    for ti in 0..t {
        let wi: Vec<usize> = want.indices.row(ti).to_vec();
        let gi: Vec<usize> = got.indices.row(ti).to_vec();
        if wi != gi {
            rep.index_mismatch_tokens += 1;
            let mut detail = format!("got experts {gi:?}, expected {wi:?}");
            if let Some(j) = (0..k).find(|&j| wi[j] != gi[j]) {
                // Under slot order any, the experts that differ as sets (not the first slot
                // that differs, which may only be reordered).
                let missing = wi.iter().find(|x| !gi.contains(x));
                let extra = gi.iter().find(|x| !wi.contains(x));
                let (a, b) = match (case.config.slot_order, missing, extra) {
                    (SlotOrder::Any, Some(&a), Some(&b)) => (a, b),
                    _ => (wi[j], gi[j]),
                };
                let u = &want.selection_scores;
                let gap = (u[[ti, a]] - u[[ti, b]]).abs();
                let tol = selection_score_bound(case, want, precision, ti, a)
                    + selection_score_bound(case, want, precision, ti, b);
                if gap == 0.0 && case.config.ties == Ties::Any {
                    detail.push_str(&format!(
                        "; experts {a} and {b} tie exactly, but no tie order gives this selection"
                    ));
                } else if gap == 0.0 {
                    detail.push_str(&format!(
                        "; exact tie: experts {a} and {b} have the same selection score {:.6e}, and \
                         the declared tie order is lower-index (--ties any accepts either)",
                        u[[ti, a]]
                    ));
                } else if gap <= tol {
                    detail.push_str(&format!(
                        "; near-tie: experts {a} and {b} differ by {gap:.3e} in selection score, \
                         within the {tol:.3e} a {} implementation may err by, so this case \
                         cannot decide (use inputs without near-ties, e.g. grid logits)",
                        precision.compute.name()
                    ));
                } else if same_set(&wi, &gi) {
                    detail.push_str(
                        "; the same experts in another slot order (--slot-order any accepts \
                         any order of a token's slots, each weight with its expert)",
                    );
                } else {
                    detail.push_str(&format!(
                        "; at slot {j} selection scores {:.6e} (expert {a}) vs {:.6e} (expert {b})",
                        u[[ti, a]],
                        u[[ti, b]]
                    ));
                }
            }
            if let (Some(mask), Some(g)) = (&want.group_mask, case.config.groups) {
                let per = e / g.groups;
                if let Some(&x) = gi.iter().find(|&&x| !mask[[ti, x / per]]) {
                    detail.push_str(&format!(
                        "; expert {x} lies in group {}, which group score {} does not keep \
                         (--group-score declares how the implementation scores groups)",
                        x / per,
                        case.config.group_score.name()
                    ));
                }
            }
            push(&mut rep, "indices", vec![ti], detail);
            continue;
        }
        for (j, &expert) in wi.iter().enumerate() {
            let (wk, gk) = (want.kept[[ti, j]], got.kept[[ti, j]]);
            if wk != gk && near.contains(&(ti, j)) {
                // Decided the other way at a capacity boundary between weights equal within
                // rounding: check the weight against the implementation's own decision.
                rep.near_tie_assignments += 1;
                let w = want.weights[[ti, j]];
                let gw = got.weights[[ti, j]];
                let ok = if gk {
                    (gw - w).abs() <= weight_bound(case, precision, ti, &wi, w)
                } else {
                    gw == 0.0
                };
                if !ok {
                    rep.weight_failures += 1;
                    push(
                        &mut rep,
                        "weights",
                        vec![ti, j],
                        format!("expert {expert} weight {gw:e} with kept = {gk}, expected {w:e} if kept, 0 if dropped"),
                    );
                }
                if rep.near_ties.len() < MAX_LISTED {
                    rep.near_ties.push(RouteMismatch {
                        what: "kept".into(),
                        at: vec![ti, j],
                        detail: format!(
                            "expert {expert} kept = {gk}, reference {wk}: near-tie at the probs \
                             capacity boundary (weight {w:e} equals a weight on the other side \
                             within rounding)"
                        ),
                    });
                }
                continue;
            }
            if wk != gk {
                rep.kept_mismatches += 1;
                let why = match case.config.capacity.map(|c| c.policy) {
                    Some(DropPolicy::TokenOrder) if case.config.ties == Ties::LowerIndex => {
                        "; token-order keeps an expert's lowest token indices (--ties any \
                         accepts any of its tokens)"
                    }
                    _ => "",
                };
                push(
                    &mut rep,
                    "kept",
                    vec![ti, j],
                    format!("expert {expert} kept = {gk}, expected {wk}{why}"),
                );
            }
            let (ww, gw) = (want.combine[[ti, j]], got.weights[[ti, j]]);
            let err = (gw - ww).abs();
            let bound = if wk {
                weight_bound(case, precision, ti, &wi, want.weights[[ti, j]])
            } else {
                0.0
            };
            let ok = if wk { err <= bound } else { gw == 0.0 };
            if err.is_finite() {
                rep.max_weight_abs_err = rep.max_weight_abs_err.max(err);
            } else {
                rep.max_weight_abs_err = f64::INFINITY;
            }
            let ratio = if err == 0.0 {
                0.0
            } else if bound > 0.0 {
                err / bound
            } else {
                f64::INFINITY
            };
            rep.max_weight_err_ratio = rep.max_weight_err_ratio.max(ratio);
            if !ok || gw.is_nan() {
                rep.weight_failures += 1;
                // A sigmoid weight that the other normalisation would give, within its bound.
                let other_norm = || {
                    let cfg = &case.config;
                    let g = want.gates[[ti, j]];
                    let other = if cfg.normalises() {
                        cfg.scaling_factor * g
                    } else {
                        let sum: f64 = want.gates.row(ti).sum() + cfg.norm_eps;
                        cfg.scaling_factor * g / sum
                    };
                    (gw - other).abs() <= weight_bound(case, precision, ti, &wi, other)
                };
                let why = if wk && case.config.score == ScoreFunction::Sigmoid && other_norm() {
                    format!(
                        "bound {bound:.3e}; sigmoid weights are divided by their sum under \
                         --sigmoid-norm always, not at K = 1 under skip-k1, not at all under \
                         never; declared {}",
                        case.config.sigmoid_norm.name()
                    )
                } else if wk {
                    format!("bound {bound:.3e}")
                } else {
                    "dropped, want exactly 0".into()
                };
                push(
                    &mut rep,
                    "weights",
                    vec![ti, j],
                    format!(
                        "expert {} weight {gw:e}, expected {ww:e} (|err| {err:.3e}, {why})",
                        expert
                    ),
                );
            }
        }
    }
    for (x, (&w, &g)) in want.group_sizes.iter().zip(&got.group_sizes).enumerate() {
        if w != g {
            rep.group_size_mismatches += 1;
            push(
                &mut rep,
                "group_sizes",
                vec![x],
                format!("expert {x} has {g} kept assignments, expected {w}"),
            );
        }
    }
    rep
}

/// Whether two tokens' slots hold the same experts (as multisets).
fn same_set(a: &[usize], b: &[usize]) -> bool {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    a.sort_unstable();
    b.sort_unstable();
    a == b
}

/// `got` with each token's slots (experts, weights, kept flags together) sorted by the
/// selection `scores` of their experts, largest first, equal scores lower expert first (as
/// `super::topk::select` orders them); a token naming an expert out of range is left as it is
/// (the comparison reports it).
fn by_score(scores: &ndarray::Array2<f64>, got: &RouteOutputs) -> RouteOutputs {
    let mut out = got.clone();
    let e = scores.ncols();
    for (ti, gi) in got.indices.rows().into_iter().enumerate() {
        if gi.iter().any(|&x| x >= e) {
            continue;
        }
        let mut order: Vec<usize> = (0..gi.len()).collect();
        order.sort_by(|&a, &b| {
            let (x, y) = (gi[a], gi[b]);
            scores[[ti, y]]
                .partial_cmp(&scores[[ti, x]])
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(x.cmp(&y))
        });
        for (j, &p) in order.iter().enumerate() {
            out.indices[[ti, j]] = gi[p];
            out.weights[[ti, j]] = got.weights[[ti, p]];
            out.kept[[ti, j]] = got.kept[[ti, p]];
        }
    }
    out
}
