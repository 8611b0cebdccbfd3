//! The FP8 GEMM against the unquantised f64 GEMM, for information only (never a verdict).
//!
//! Per pass, over the checked elements (tail rows excluded): the relative error
//! `‖ŷ - y‖₂ / ‖y‖₂`, DeepGEMM's `calc_diff = 1 - 2Σŷy / Σ(ŷ² + y²)`, the largest absolute
//! error, and how many elements fall outside the expected FP8 envelope
//! `(u_a + u_b + u_a·u_b)·Σ|a·b| + c_acc(n)·Σ|a·b|`: the first-order quantisation error of two
//! normal-range FP8 operands (`u = 2^-4` for E4M3, `2^-3` for E5M2) plus the accumulation
//! model's coefficient at the reduction depth `n`. Subnormal-range and saturated values can
//! exceed it, which is why it is information and not a verdict.

use ndarray::Array2;
use serde::{Deserialize, Serialize};

use super::case::Fp8GemmCase;
use crate::format::Format;
use crate::gemm::{GemmOutputs, Pass, Passes, ReferenceResult};

/// One pass against the unquantised f64 GEMM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HighPrecisionStats {
    pub pass: Pass,
    /// Elements compared (tail rows excluded).
    pub elements: usize,
    /// `‖ŷ - y‖₂ / ‖y‖₂` (0 when both are 0).
    pub rel_err: f64,
    /// `1 - 2Σŷy / Σ(ŷ² + y²)`.
    pub calc_diff: f64,
    pub max_abs_err: f64,
    /// Elements outside the expected FP8 envelope (information).
    pub outside_envelope: usize,
    /// `max |ŷ - y| / envelope`.
    pub max_envelope_ratio: f64,
}

/// The checked elements of one pass, flattened: what was got (`None` when the output is
/// missing or ill-shaped), the unquantised value, its magnitude `Σ|a·b|`, and the envelope's
/// coefficient of that magnitude.
struct Flat {
    got: Option<Vec<f64>>,
    want: Vec<f64>,
    magnitude: Vec<f64>,
    coeff: Vec<f64>,
}

/// The statistics of every asked pass whose output `got` holds with the right shape, against
/// `hp`, the unquantised f64 reference of `case.gemm` for `passes`.
pub fn high_precision(
    case: &Fp8GemmCase,
    passes: Passes,
    hp: &ReferenceResult,
    got: &GemmOutputs,
) -> Vec<HighPrecisionStats> {
    passes
        .iter()
        .filter_map(|pass| {
            let flat = flatten(case, pass, hp, got);
            flat.got.as_ref().map(|g| stats(pass, g, &flat))
        })
        .collect()
}

/// The envelope's coefficient for operands in formats `fa`, `fb` summed over `n` products.
fn envelope(case: &Fp8GemmCase, fa: Format, fb: Format, n: usize) -> f64 {
    let (ua, ub) = (fa.info().unit_roundoff(), fb.info().unit_roundoff());
    ua + ub + ua * ub + case.recipe.accumulation.coefficient(n)
}

fn flatten(case: &Fp8GemmCase, pass: Pass, hp: &ReferenceResult, got: &GemmOutputs) -> Flat {
    let r = &case.recipe;
    match pass {
        Pass::Fwd | Pass::Dgrad => {
            let pick = |o: &GemmOutputs| {
                if pass == Pass::Fwd {
                    o.out.clone()
                } else {
                    o.dlhs.clone()
                }
            };
            let (fa, n) = if pass == Pass::Fwd {
                (r.lhs.format, case.gemm.k())
            } else {
                (r.dout.format, case.gemm.n())
            };
            let want = pick(&hp.value).expect("asked pass");
            let mag = pick(&hp.magnitude).expect("asked pass");
            let used = case.gemm.rows_used();
            let rows = |a: &Array2<f64>| {
                a.rows()
                    .into_iter()
                    .take(used)
                    .flatten()
                    .copied()
                    .collect::<Vec<_>>()
            };
            let c = envelope(case, fa, r.rhs.format, n);
            let magnitude = rows(&mag);
            Flat {
                got: pick(got)
                    .filter(|a| a.shape() == want.shape())
                    .map(|a| rows(&a)),
                want: rows(&want),
                coeff: vec![c; magnitude.len()],
                magnitude,
            }
        }
        Pass::Wgrad => {
            let want = hp.value.drhs.as_ref().expect("asked pass");
            let mag = hp.magnitude.drhs.as_ref().expect("asked pass");
            let (_, k, n) = want.dim();
            let coeff = case
                .gemm
                .group_sizes
                .iter()
                .flat_map(|s| {
                    std::iter::repeat_n(envelope(case, r.lhs.format, r.dout.format, *s), k * n)
                })
                .collect();
            Flat {
                got: got
                    .drhs
                    .as_ref()
                    .filter(|a| a.shape() == want.shape())
                    .map(|a| a.iter().copied().collect()),
                want: want.iter().copied().collect(),
                magnitude: mag.iter().copied().collect(),
                coeff,
            }
        }
    }
}

fn stats(pass: Pass, g: &[f64], f: &Flat) -> HighPrecisionStats {
    let w = &f.want;
    let (mut num, mut den, mut xy, mut sq, mut max_abs, mut outside, mut ratio) =
        (0.0, 0.0, 0.0, 0.0, 0.0f64, 0usize, 0.0f64);
    for i in 0..w.len() {
        let e = g[i] - w[i];
        num += e * e;
        den += w[i] * w[i];
        xy += g[i] * w[i];
        sq += g[i] * g[i] + w[i] * w[i];
        max_abs = if e.is_nan() {
            f64::NAN
        } else {
            max_abs.max(e.abs())
        };
        let envelope = f.coeff[i] * f.magnitude[i];
        let q = if e == 0.0 {
            0.0
        } else if envelope > 0.0 {
            e.abs() / envelope
        } else {
            f64::INFINITY
        };
        if e.is_nan() || e.abs() > envelope {
            outside += 1;
        }
        ratio = if q.is_nan() { f64::NAN } else { ratio.max(q) };
    }
    HighPrecisionStats {
        pass,
        elements: w.len(),
        rel_err: if den == 0.0 {
            if num == 0.0 {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            (num / den).sqrt()
        },
        calc_diff: if sq == 0.0 { 0.0 } else { 1.0 - 2.0 * xy / sq },
        max_abs_err: max_abs,
        outside_envelope: outside,
        max_envelope_ratio: ratio,
    }
}
