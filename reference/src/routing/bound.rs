//! What an implementation returns for a routing case, the precision it declares, and the
//! error bound on its weights and selection scores.
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

use super::config::ScoreFunction;
use super::route::{Routing, RoutingCase};
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
