//! The FP8 implementation trait and the two comparisons of an FP8 grouped GEMM.
//!
//! 1. **Recipe-exact** (the verdict): against [`super::fp8_reference`], every element within
//!    [`super::Fp8Bound`] for the declared accumulation model. This is the tight check that
//!    catches scale mix-ups, wrong rounding and wrong formats.
//! 2. **Against the unquantised GEMM** (information only): relative error
//!    `‖ŷ - y‖₂ / ‖y‖₂`, DeepGEMM's `calc_diff`, and how many elements fall outside the
//!    expected FP8 envelope `(u_a + u_b + u_a·u_b)·Σ|a·b| + c_acc·Σ|a·b|` (first-order
//!    quantisation error of two normal-range FP8 operands, `u = 2^-4` for E4M3 and `2^-3` for
//!    E5M2; subnormal-range and saturated values can exceed it, which is why it is information
//!    and not a verdict).

use serde::{Deserialize, Serialize};

use super::case::Fp8GemmCase;
use super::gemm::{fp8_reference, Fp8Bound, Fp8Operands};
use crate::format::Format;
use crate::gemm::{
    compare_outputs_with_bound, reference, Accumulator, CaseReport, GemmOutputs, Pass, Passes,
    Precision,
};
use crate::op::RunError;
use crate::Error;

/// An FP8 grouped-GEMM implementation under test: it reads float32 inputs and the recipe, and
/// quantises them itself.
pub trait Fp8GroupedGemm {
    /// A short name for reports.
    fn name(&self) -> String;
    /// Whether this is a CPU model rather than the real thing (never a GPU result).
    fn is_model(&self) -> bool;
    /// Runs the asked passes. `case` has been validated. Outputs are widened to f64.
    fn run(&self, case: &Fp8GemmCase, passes: Passes) -> Result<GemmOutputs, RunError>;
    /// The quantised operands the implementation used, when it can expose them (the CPU
    /// model can; an external program does not have to). Used by the quantisation and
    /// copy-agreement properties.
    fn operands(&self, _case: &Fp8GemmCase, _passes: Passes) -> Option<Fp8Operands> {
        None
    }
}

/// The declared precision of an FP8 case, for reports (the bound itself is [`Fp8Bound`]).
pub fn fp8_precision(case: &Fp8GemmCase) -> Precision {
    Precision {
        input: case.recipe.lhs.format,
        accumulator: Accumulator {
            format: Format::F32,
            block: match case.recipe.accumulation {
                super::AccumModel::FastPromote => Some(super::accum::PROMOTE_INTERVAL),
                _ => None,
            },
        },
        output: case.gemm.out_dtype,
    }
}

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

/// Both comparisons of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Report {
    pub recipe_exact: CaseReport,
    pub high_precision: Vec<HighPrecisionStats>,
}

/// What came of running an FP8 implementation.
#[derive(Debug, Clone, PartialEq)]
pub enum Fp8Verdict {
    Compared(Box<Fp8Report>),
    RunFailed(RunError),
}

impl Fp8Verdict {
    pub fn passed(&self) -> bool {
        matches!(self, Fp8Verdict::Compared(r) if r.recipe_exact.passed())
    }
    pub fn failure(&self) -> Option<String> {
        match self {
            Fp8Verdict::Compared(r) => r.recipe_exact.first_failure(),
            Fp8Verdict::RunFailed(e) => Some(format!("run failed: {e}")),
        }
    }
}

/// Compares `got` with the recipe-exact reference and with the unquantised GEMM.
pub fn compare_fp8(
    case: &Fp8GemmCase,
    passes: Passes,
    got: &GemmOutputs,
) -> Result<Fp8Report, Error> {
    let exact = fp8_reference(case, passes)?;
    let bound = Fp8Bound {
        accumulation: case.recipe.accumulation,
        output: case.gemm.out_dtype,
    };
    let recipe_exact = compare_outputs_with_bound(
        &case.gemm,
        passes,
        &fp8_precision(case),
        &exact,
        got,
        &|n| bound.at_len(n),
    );
    let hp = reference(&case.gemm, passes)?;
    let r = &case.recipe;
    let env = |fa: Format, fb: Format, n: usize| {
        let (ua, ub) = (fa.info().unit_roundoff(), fb.info().unit_roundoff());
        ua + ub + ua * ub + r.accumulation.coefficient(n)
    };
    let used = case.gemm.rows_used();
    let mut high_precision = Vec::new();
    for pass in passes.iter() {
        let (g, w, m, coeff): (Option<Vec<f64>>, Vec<f64>, Vec<f64>, Vec<f64>) = match pass {
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
                let rows = |a: &ndarray::Array2<f64>| {
                    a.rows()
                        .into_iter()
                        .take(used)
                        .flatten()
                        .copied()
                        .collect::<Vec<_>>()
                };
                let c = env(fa, r.rhs.format, n);
                let gv = pick(got)
                    .filter(|a| a.shape() == want.shape())
                    .map(|a| rows(&a));
                let mv = rows(&mag);
                (gv, rows(&want), mv.clone(), vec![c; mv.len()])
            }
            Pass::Wgrad => {
                let want = hp.value.drhs.clone().expect("asked pass");
                let mag = hp.magnitude.drhs.clone().expect("asked pass");
                let (_, k, n) = want.dim();
                let coeff = case
                    .gemm
                    .group_sizes
                    .iter()
                    .flat_map(|s| std::iter::repeat_n(env(r.lhs.format, r.dout.format, *s), k * n))
                    .collect();
                let gv = got
                    .drhs
                    .as_ref()
                    .filter(|a| a.shape() == want.shape())
                    .map(|a| a.iter().copied().collect());
                (
                    gv,
                    want.iter().copied().collect(),
                    mag.iter().copied().collect(),
                    coeff,
                )
            }
        };
        let Some(g) = g else { continue };
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
            let envelope = coeff[i] * m[i];
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
        high_precision.push(HighPrecisionStats {
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
        });
    }
    Ok(Fp8Report {
        recipe_exact,
        high_precision,
    })
}

/// Validates `case`, runs `imp`, and compares (both comparisons). An invalid case is an `Err`.
pub fn verify_fp8(
    imp: &dyn Fp8GroupedGemm,
    case: &Fp8GemmCase,
    passes: Passes,
) -> Result<Fp8Verdict, Error> {
    case.validate(passes)?;
    Ok(match imp.run(case, passes) {
        Ok(got) => Fp8Verdict::Compared(Box::new(compare_fp8(case, passes, &got)?)),
        Err(e) => Fp8Verdict::RunFailed(e),
    })
}

/// The recipe itself as an implementation: the f64 GEMM of the recipe's dequantised operands
/// (a self-check; passes any accumulation model).
#[derive(Debug, Clone, Copy, Default)]
pub struct Fp8Reference;

impl Fp8GroupedGemm for Fp8Reference {
    fn name(&self) -> String {
        "reference".into()
    }
    fn is_model(&self) -> bool {
        false
    }
    fn run(&self, case: &Fp8GemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
        fp8_reference(case, passes)
            .map(|r| r.value)
            .map_err(|e| RunError(e.to_string()))
    }
    fn operands(&self, case: &Fp8GemmCase, passes: Passes) -> Option<Fp8Operands> {
        Some(super::gemm::quantize_operands(case, passes))
    }
}
