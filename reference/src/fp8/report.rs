//! The report of an FP8 grouped-GEMM check: the grouped GEMM's report of the recipe-exact
//! comparison (the verdict), with the recipe and the comparison against the unquantised GEMM
//! (information).
//!
//! JSON schema ([`Fp8Document`]): every field of the grouped GEMM's report
//! ([`crate::gemm::GemmDocument`]), flattened, for the recipe-exact comparison, plus `fp8`:
//! `recipe` (the `case.json` `fp8` object), `verdict_from` (`"recipe-exact"`) and
//! `high_precision` (per pass: `elements`, `rel_err`, `calc_diff`, `max_abs_err`,
//! `outside_envelope`, `max_envelope_ratio`), and `model_check` (`null` unless a fast
//! accumulator's bound could not decide: then per undecided pass and group `distance`,
//! `spread`, `threshold`, `zero_distance`, see [`super::model`]).

use std::fmt::Write as _;

use serde::Serialize;

use super::case::{Fp8Recipe, ScalingKind};
use super::high_precision::HighPrecisionStats;
use super::model::ModelCheck;
use super::op::Fp8Gemm;
use crate::gemm::render_fast;
use crate::gemm::{render_case, render_kinds, render_passes, ByMode, Gemm, GemmDocument};
use crate::gemm::{Streamed, Verify};
use crate::report::{verdict_line, Reported, RunInfo};

/// The `--json` document of `moecheck gemm --dtype fp8` and of `moecheck check` on an FP8
/// case.
#[derive(Debug, Clone, Serialize)]
pub struct Fp8Document {
    #[serde(flatten)]
    pub gemm: GemmDocument,
    pub fp8: Fp8Extra,
}

/// What an FP8 report adds to the grouped GEMM's.
#[derive(Debug, Clone, Serialize)]
pub struct Fp8Extra {
    pub recipe: Fp8Recipe,
    /// What the verdict is: the recipe-exact comparison.
    pub verdict_from: &'static str,
    /// Against the unquantised f64 GEMM, for information (never a verdict).
    pub high_precision: Vec<HighPrecisionStats>,
    /// The model-based check, where it ran (it can fail a case, never pass one).
    pub model_check: Option<ModelCheck>,
}

impl Reported for Fp8Gemm {
    type Document = Fp8Document;

    fn document(run: &RunInfo<Fp8Gemm>) -> Fp8Document {
        // The verdict of the recipe-exact comparison alone, as the grouped GEMM reports it.
        let verdict = run.verdict.map(|v| v.map(|r| r.recipe_exact.clone()));
        // The grouped GEMM's document reads only the mode of its reference.
        let expected = ByMode::unheld(run.expected.mode(), Streamed);
        let gemm = <Gemm as Reported>::document(&RunInfo::<Gemm> {
            implementation: run.implementation,
            case: &run.case.gemm,
            ask: run.ask,
            expected: &expected,
            precision: run.precision,
            verdict: verdict.as_ref(),
            draws: run.draws,
            reference_seconds: run.reference_seconds,
        });
        Fp8Document {
            gemm,
            fp8: Fp8Extra {
                recipe: run.case.recipe,
                verdict_from: "recipe-exact",
                high_precision: run
                    .report()
                    .map_or_else(Vec::new, |r| r.high_precision.clone()),
                model_check: run.report().and_then(|r| r.model.clone()),
            },
        }
    }

    /// The recipe, the grouped GEMM's table of the recipe-exact comparison, the table against
    /// the unquantised GEMM, and the verdict.
    fn render(doc: &Fp8Document) -> String {
        let mut s = String::new();
        render_recipe(&mut s, &doc.fp8.recipe);
        let _ = writeln!(s, "verdict below: recipe-exact (the GEMM of the recipe's dequantised operands, bound from the accumulation model)");
        let g = &doc.gemm;
        if let Some(line) = accumulation_line(doc.fp8.recipe.accumulation, g.verification.mode) {
            let _ = writeln!(s, "{line}");
        }
        g.head.render(&mut s);
        render_case(&mut s, g);
        let fast = g.verification.mode == Verify::Fast;
        if fast {
            let v = &g.verification;
            let _ = writeln!(s, "verification: {}: {}", v.mode, v.guarantee);
        }
        g.outcome.render(&mut s);
        render_kinds(&mut s, &g.passes);
        render_passes(&mut s, &g.passes);
        render_fast(&mut s, &g.fast);
        if fast {
            let _ = writeln!(s, "against the unquantised f64 GEMM: not computed under --verify fast (information only; --verify full computes it)");
        }
        render_high_precision(&mut s, &doc.fp8.high_precision);
        if let Some(m) = &doc.fp8.model_check {
            render_model(&mut s, m);
        }
        let non_finite: usize = g
            .passes
            .iter()
            .flat_map(|p| &p.groups)
            .map(|g| g.stats.exact_non_finite)
            .sum();
        if non_finite > 0 {
            let _ = writeln!(
                s,
                "NOTE: {non_finite} outputs are NaN or inf in the recipe itself (without saturation, a scale from a stale amax overflows the FP8 format); they were matched exactly, and the verdict says only that the implementation follows the recipe"
            );
        }
        for h in &g.hints {
            let _ = writeln!(s, "hint: {h}");
        }
        g.outcome.render_inconclusive(&mut s, g.head.verdict);
        verdict_line(&mut s, g.head.verdict);
        s
    }
}

/// `FP8 recipe: lhs e4m3 per Group, ...`.
fn render_recipe(s: &mut String, r: &Fp8Recipe) {
    let scaling = match r.scaling {
        ScalingKind::Current => "current scaling".to_string(),
        ScalingKind::Delayed {
            history_len,
            algo,
            margin,
        } => format!("delayed scaling (history {history_len}, {algo:?}, margin {margin})"),
    };
    let _ = writeln!(
        s,
        "FP8 recipe: lhs {} per {:?}, rhs {} per {:?}, dout {} per {:?}; {}; {}; accumulation {}",
        r.lhs.format,
        r.lhs.scope,
        r.rhs.format,
        r.rhs.scope,
        r.dout.format,
        r.dout.scope,
        if r.saturate {
            "saturating casts"
        } else {
            "IEEE casts"
        },
        scaling,
        r.accumulation
    );
}

/// One row per pass against the unquantised GEMM (nothing when there is none).
fn render_high_precision(s: &mut String, hp: &[HighPrecisionStats]) {
    if hp.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "against the unquantised f64 GEMM (information, not a verdict):"
    );
    let _ = writeln!(
        s,
        "{:<6} {:>11} {:>11} {:>11} {:>16} {:>12}",
        "pass", "rel err", "calc_diff", "max|err|", "outside envelope", "max env ratio"
    );
    for h in hp {
        let _ = writeln!(
            s,
            "{:<6} {:>11.3e} {:>11.3e} {:>11.3e} {:>16} {:>12.3}",
            h.pass.name(),
            h.rel_err,
            h.calc_diff,
            h.max_abs_err,
            format!("{}/{}", h.outside_envelope, h.elements),
            h.max_envelope_ratio
        );
    }
}

/// The model-based check: its failure, or why it decided nothing.
fn render_model(s: &mut String, m: &ModelCheck) {
    let line = m.failure_line().or_else(|| m.undecided_line());
    if let Some(line) = line {
        let _ = writeln!(s, "{line}");
    }
}

/// What a fast-accumulation verdict rests on, in one line (none under exact accumulation).
fn accumulation_line(acc: super::AccumModel, mode: Verify) -> Option<String> {
    use super::accum::{AccumRounding, AccumVariant};
    if acc == super::AccumModel::Exact {
        return None;
    }
    let v = AccumVariant::NOMINAL;
    let rounding = match v.rounding {
        AccumRounding::TowardZero => "truncating",
        AccumRounding::NearestEven => "rounding to nearest",
    };
    let model = format!(
        "k-blocks of {} products into a {}-bit {rounding} accumulator{}",
        v.block,
        v.bits,
        if acc == super::AccumModel::FastPromote {
            ", promoted to f32 every 128"
        } else {
            ""
        }
    );
    Some(match mode {
        Verify::Full => format!("accumulation {acc}: a bound under the model ({model}), from the magnitudes of the partial sums it holds (reference/src/fp8/running.rs); exact f32 accumulation is far inside it"),
        Verify::Fast => format!("accumulation {acc}: the model's worst-case bound ({model}); the running form is not computed under --verify fast, so a pass may be INCONCLUSIVE where --verify full decides"),
    })
}
