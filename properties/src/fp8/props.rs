//! The FP8 properties: recipe-exact agreement per pass, the quantised bytes and the
//! column-wise copies an implementation exposes ([`Implementation::internals`]), and exact
//! invariance of the output under a power-of-two rescaling of one expert's weights.

use moecheck_reference::format::{decode_fp8, pow2, ulp, Format};
use moecheck_reference::fp8::{rhs_rows, Fp8Gemm, Fp8GemmCase, Fp8Operands, Quantized};
use moecheck_reference::gemm::{OutArray, Pass, Passes};
use moecheck_reference::op::Implementation;
use ndarray::Array2;
use proptest::strategy::BoxedStrategy;

use super::strategies::{fp8_case_args, Fp8CaseArgs};
use crate::property::{verified, Property, PropertyOp};
use crate::runner::CaseResult;

impl PropertyOp for Fp8Gemm {
    type Args = Fp8CaseArgs;
    type Domain = ();

    fn properties() -> Vec<Property<Fp8Gemm>> {
        vec![
            Property {
                name: "fp8-fwd-recipe-exact",
                description: "out matches the GEMM of the recipe's dequantised operands within the accumulation bound",
                strategy: any,
                test: |imp, a| recipe_exact(imp, a, Pass::Fwd),
                case: Some(|a| only(a, Pass::Fwd)),
            },
            Property {
                name: "fp8-dgrad-recipe-exact",
                description: "dlhs (E5M2 dout x E4M3 rhs) matches the recipe within the bound",
                strategy: any,
                test: |imp, a| recipe_exact(imp, a, Pass::Dgrad),
                case: Some(|a| only(a, Pass::Dgrad)),
            },
            Property {
                name: "fp8-wgrad-recipe-exact",
                description: "drhs (column-wise lhs x column-wise dout) matches the recipe within the bound",
                strategy: any,
                test: |imp, a| recipe_exact(imp, a, Pass::Wgrad),
                case: Some(|a| only(a, Pass::Wgrad)),
            },
            Property {
                name: "fp8-block-fwd-recipe-exact",
                description: "block scopes: out matches the GEMM of the dequantised blocks (lhs 1xC along K, rhs blocks) within the per-block bound",
                strategy: blocks,
                test: |imp, a| recipe_exact(imp, a, Pass::Fwd),
                case: Some(|a| only(a, Pass::Fwd)),
            },
            Property {
                name: "fp8-block-dgrad-recipe-exact",
                description: "block scopes: dlhs (dout 1xC along N x rhs blocks along N) matches the recipe within the per-block bound",
                strategy: blocks,
                test: |imp, a| recipe_exact(imp, a, Pass::Dgrad),
                case: Some(|a| only(a, Pass::Dgrad)),
            },
            Property {
                name: "fp8-block-wgrad-recipe-exact",
                description: "block scopes: drhs (column-wise copies, blocks along M restarting at each group) matches the recipe within the per-block bound",
                strategy: blocks,
                test: |imp, a| recipe_exact(imp, a, Pass::Wgrad),
                case: Some(|a| only(a, Pass::Wgrad)),
            },
            Property {
                name: "fp8-quantize-half-ulp",
                description: "every FP8 byte is within half an ulp of its f32-scaled value (or ±max when saturated)",
                strategy: any,
                test: |imp, a| with_operands(imp, a, quantize_half_ulp),
                case: None,
            },
            Property {
                name: "fp8-copies-agree",
                description: "column-wise copies are the transposed row-wise bytes sharing scale_inv",
                strategy: any,
                test: |imp, a| with_operands(imp, a, copies_agree),
                case: None,
            },
            Property {
                name: "fp8-scale-invariance",
                description: "scaling one expert's weights by 2^j scales its rows' out by exactly 2^j and changes nothing else",
                strategy: per_expert,
                test: |imp, a| scale_invariance(imp, a).into(),
                case: Some(|a| only(a, Pass::Fwd)),
            },
        ]
    }

    fn case_of(args: &Fp8CaseArgs) -> (Fp8GemmCase, Passes) {
        (args.build(), Passes::ALL)
    }
}

/// Any FP8 case (tensor or per-expert rhs, current or stale delayed scales).
fn any() -> BoxedStrategy<Fp8CaseArgs> {
    fp8_case_args(false)
}
/// Block scopes ([`super::block_strategies`]).
fn blocks() -> BoxedStrategy<Fp8CaseArgs> {
    super::block_strategies::fp8_block_case_args()
}
/// Per-expert rhs scaling and current scaling (what scale invariance needs).
fn per_expert() -> BoxedStrategy<Fp8CaseArgs> {
    fp8_case_args(true)
}

type Imp<'a> = &'a dyn Implementation<Fp8Gemm>;

/// The case of `args` asking for `pass` only (what a per-pass property checks).
fn only(args: &Fp8CaseArgs, pass: Pass) -> (Fp8GemmCase, Passes) {
    (args.build(), Passes::only(pass))
}

fn recipe_exact(imp: Imp, args: &Fp8CaseArgs, pass: Pass) -> CaseResult {
    let (case, ask) = only(args, pass);
    verified(imp, &case, ask).into()
}

/// `Err` at the first byte of `q` (the recipe says `format`) that is not the nearest FP8
/// value of `fl32(x · scale)` (±max past the range when saturating).
fn check_half_ulp(
    what: &str,
    x: &Array2<f32>,
    q: &Quantized,
    format: Format,
    sat: bool,
) -> Result<(), String> {
    for i in 0..q.scale.len() {
        let s = q.scale[i];
        for r in q.offsets[i]..q.offsets[i + 1] {
            for c in 0..x.ncols() {
                let v = x[(r, c)] * s;
                let got = decode_fp8(q.q[(r, c)], format);
                let max = format.info().max;
                let ok = if v.is_nan() {
                    got.is_nan()
                } else if (v as f64).abs() > max && sat {
                    got == max.copysign(v as f64)
                } else {
                    (got - v as f64).abs() <= ulp(v as f64, format) / 2.0
                };
                if !ok || (v.is_nan() && x[(r, c)].is_finite()) {
                    return Err(format!(
                        "{what}[{r}, {c}] = {:e} with scale {s:e} scales to {v:e}, but its byte {:#04x} is {got:e} in {format}",
                        x[(r, c)], q.q[(r, c)]
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Runs `check` on the case of `args` and the quantised operands `imp` used for it; not
/// applicable when `imp` does not expose them (an external program).
fn with_operands(
    imp: Imp,
    args: &Fp8CaseArgs,
    check: fn(&Fp8GemmCase, &Fp8Operands) -> Result<(), String>,
) -> CaseResult {
    let case = args.build();
    match imp.internals(&case, Passes::ALL) {
        Some(ops) => check(&case, &ops).into(),
        None => CaseResult::NotApplicable(format!(
            "{} does not expose its quantised operands",
            imp.name()
        )),
    }
}

fn quantize_half_ulp(case: &Fp8GemmCase, ops: &Fp8Operands) -> Result<(), String> {
    let r = &case.recipe;
    check_half_ulp("lhs", &case.gemm.lhs, &ops.lhs, r.lhs.format, r.saturate)?;
    let rhs = rhs_rows(&case.gemm.rhs);
    check_half_ulp("rhs", &rhs, &ops.rhs, r.rhs.format, r.saturate)?;
    if let (Some(d), Some(q)) = (&case.gemm.dout, &ops.dout) {
        check_half_ulp("dout", d, q, r.dout.format, r.saturate)?;
    }
    Ok(())
}

fn copies_agree(_case: &Fp8GemmCase, ops: &Fp8Operands) -> Result<(), String> {
    ops.lhs_col
        .agrees_with(&ops.lhs)
        .map_err(|e| format!("lhs: {e}"))?;
    if let (Some(c), Some(d)) = (&ops.dout_col, &ops.dout) {
        c.agrees_with(d).map_err(|e| format!("dout: {e}"))?;
    }
    Ok(())
}

fn scale_invariance(imp: Imp, args: &Fp8CaseArgs) -> Result<(), String> {
    let case = args.build();
    let g = case.gemm.groups();
    let live: Vec<usize> = (0..g).filter(|e| case.gemm.group_sizes[*e] > 0).collect();
    let Some(&e) = live.get((args.value_seed % live.len().max(1) as u64) as usize) else {
        return Ok(());
    };
    let j = args.rescale_exp;
    let mut other = case.clone();
    other
        .gemm
        .rhs
        .f32_mut()
        .index_axis_mut(ndarray::Axis(0), e)
        .mapv_inplace(|v| v * pow2(j) as f32);
    let run = |c: &Fp8GemmCase| {
        imp.run(c, Passes::FWD)
            .map_err(|err| format!("run failed: {err}"))?
            .out
            .map(OutArray::into_f64)
            .ok_or_else(|| "no out".to_string())
    };
    let (a, b) = (run(&case)?, run(&other)?);
    let off = case.gemm.offsets();
    for ((r, c), x) in a.indexed_iter() {
        let in_e = off[e] <= r && r < off[e + 1];
        let want = if in_e { x * pow2(j) } else { *x };
        let y = b[(r, c)];
        if want.to_bits() != y.to_bits() && !(want.is_nan() && y.is_nan()) {
            return Err(format!(
                "expert {e}'s weights times 2^{j}: out[{r}, {c}] went from {x:e} to {y:e}, want {want:e}{}",
                if in_e { "" } else { " (a row of another expert)" }
            ));
        }
    }
    Ok(())
}
