//! Comparing an implementation's routing with the reference, and the weight error bound.
//!
//! ## What must match exactly
//! `indices` (in selection order), `kept` and `group_sizes` are discrete and must be equal.
//! Where a token's indices differ its weights and kept flags are not compared (the index
//! mismatch is the finding). A dropped assignment's weight must be exactly 0.
//!
//! ## The weight bound
//! An implementation that declares a compute format with unit roundoff `u_c` (smallest normal
//! `ν_c`) and an output format `u_o` (smallest subnormal `η_o`) computes each kept weight with
//! a relative error bounded by the sum of the relative errors of its steps (first order; the
//! final `R/(1-R)` covers the products of the `(1+δ)` factors):
//!
//! * **score** `ε_s`: `softmax` over `n` values (`n = E`, or `n = K` for `topk-softmax`) with
//!   logit spread `Δ = max l - min l` over those values: the subtraction `l - m` is rounded
//!   (absolute error `u_c·Δ`, which `exp` turns into relative error `u_c·Δ`), `exp` adds `2u_c`
//!   (library `exp` is not correctly rounded; 2 ulps is the documented worst case of glibc and
//!   XLA's f32 `exp`), numerator and every summand alike, the sum `(n-1)u_c`, the division
//!   `u_c`: `ε_s = (2Δ + n + 4)·u_c`. `sigmoid` (`1/(1+exp(-l))`, logits exact): `ε_s = 4u_c`.
//! * **normalisation** `g/(Σg + ε)` (when on): the `K` gates each carry `ε_s`, the sum adds
//!   `(K-1)u_c`, `+ε` and the division `2u_c`: `ε_w = 2ε_s + (K + 1)u_c`; otherwise `ε_w = ε_s`.
//! * **scaling** by `α`: `u_c`; **output rounding**: `u_o`.
//!
//! With `R = ε_w + u_c + u_o` and `u_c` replaced by `u_c + 2^-53` (the reference is itself
//! f64), a kept weight passes when
//!
//! `|ŵ - w| <= R/(1 - R)·|w| + ν_c + η_o/2`.
//!
//! The absolute terms cover the underflow region: a sigmoid of a logit below about `-88`
//! overflows `exp` in f32 and comes back as 0, with a true value below `ν_c`.

use ndarray::Array2;
use serde::{Deserialize, Serialize};

use super::config::{DropPolicy, ScoreFunction};
use super::convention::Ties;
use super::near_tie::probs_near_ties;
use super::route::{route_following, Routing, RoutingCase};
use crate::format::Format;

/// What an implementation returns for a routing case.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteOutputs {
    /// `(T, K)` selected experts, in selection order (largest selection score first, ties
    /// toward the lower index). Every entry `< E`.
    pub indices: Array2<usize>,
    /// `(T, K)` combine weights after normalisation and scaling, exactly 0 where dropped,
    /// widened to f64.
    pub weights: Array2<f64>,
    /// `(T, K)` the assignment survived capacity dropping.
    pub kept: Array2<bool>,
    /// `(E,)` kept assignments per expert.
    pub group_sizes: Vec<usize>,
    /// The format the weights were stored in (`weights.npy`'s dtype), when they were read
    /// from a file; it is the output format their bound is derived from (docs/protocol.md).
    /// `None` for in-process implementations, which declare it.
    pub weights_format: Option<Format>,
}

impl RouteOutputs {
    /// The outputs of a reference [`Routing`].
    pub fn from_routing(r: &Routing) -> RouteOutputs {
        RouteOutputs {
            indices: r.indices.clone(),
            weights: r.combine.clone(),
            kept: r.kept.clone(),
            group_sizes: r.group_sizes.clone(),
            weights_format: None,
        }
    }
}

/// The precision an implementation declares: the weight bound is derived from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutePrecision {
    /// The format scores and weights are computed in.
    pub compute: Format,
    /// The format the weights are written in.
    pub output: Format,
}

/// The bound on `|ŵ - w|` for a kept weight `w` of token `t`, whose selected experts are
/// `selected` (`K` of them), for an implementation with `precision` (module documentation).
pub fn weight_bound(
    case: &RoutingCase,
    precision: RoutePrecision,
    t: usize,
    selected: &[usize],
    w: f64,
) -> f64 {
    let uc = precision.compute.info().unit_roundoff() + Format::F64.info().unit_roundoff();
    let uo = precision.output.info().unit_roundoff();
    let k = selected.len();
    let spread = |vals: &mut dyn Iterator<Item = f64>| {
        let (lo, hi) = vals.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
        if hi >= lo {
            hi - lo
        } else {
            0.0
        }
    };
    let es = match case.config.score {
        ScoreFunction::Sigmoid => 4.0 * uc,
        ScoreFunction::Softmax => {
            let n = case.experts() as f64;
            let d = spread(&mut case.logits.row(t).iter().copied());
            (2.0 * d + n + 4.0) * uc
        }
        ScoreFunction::TopkSoftmax => {
            let d = spread(&mut selected.iter().map(|&e| case.logits[[t, e]]));
            (2.0 * d + k as f64 + 4.0) * uc
        }
    };
    let ew = if case.config.normalises() {
        2.0 * es + (k as f64 + 1.0) * uc
    } else {
        es
    };
    let r = ew + uc + uo;
    let rel = if r < 1.0 {
        r / (1.0 - r)
    } else {
        f64::INFINITY
    };
    rel * w.abs()
        + precision.compute.info().min_normal()
        + precision.output.info().min_subnormal() / 2.0
}

/// A bound on the error of the selection score `u[t, e] = s[t, e] + b[e]` as computed by an
/// implementation with `precision`: the score's own error (`ε_s·s + ν_c`, nothing for
/// `topk-softmax`, whose scores are the logits) plus the rounding of the bias addition
/// (`u_c·|u|`). Two experts whose reference selection scores are closer than the sum of their
/// bounds are a **near-tie**: an implementation of that precision may order them either way.
pub fn selection_score_bound(
    case: &RoutingCase,
    routing: &Routing,
    precision: RoutePrecision,
    t: usize,
    e: usize,
) -> f64 {
    let uc = precision.compute.info().unit_roundoff() + Format::F64.info().unit_roundoff();
    let s = routing.scores[[t, e]].abs();
    let score = match case.config.score {
        ScoreFunction::TopkSoftmax => 0.0,
        ScoreFunction::Sigmoid => 4.0 * uc * s + precision.compute.info().min_normal(),
        ScoreFunction::Softmax => {
            let row = case.logits.row(t);
            let (lo, hi) = row
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
                    (lo.min(v), hi.max(v))
                });
            let d = if hi >= lo { hi - lo } else { 0.0 };
            (2.0 * d + case.experts() as f64 + 4.0) * uc * s + precision.compute.info().min_normal()
        }
    };
    let add = if case.bias.is_some() {
        uc * routing.selection_scores[[t, e]].abs()
    } else {
        0.0
    };
    score + add
}

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
                let (a, b) = (wi[j], gi[j]);
                let u = &want.selection_scores;
                let gap = (u[[ti, a]] - u[[ti, b]]).abs();
                let tol = selection_score_bound(case, want, precision, ti, a)
                    + selection_score_bound(case, want, precision, ti, b);
                if gap == 0.0 {
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
                let why = if wk && case.config.score == ScoreFunction::Sigmoid && k == 1 {
                    format!(
                        "bound {bound:.3e}; at K = 1 a sigmoid weight is α normalised \
                         (--sigmoid-norm always) and α·sigmoid not (skip-k1), declared {}",
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
