//! FP8 strategies and properties, generic over an [`Fp8GroupedGemm`].
//!
//! Cases are built to expose scale bugs: every group of `lhs`/`dout` rows and every expert
//! gets its own magnitude (powers of two spread over 2^±20, so no two scales coincide by
//! accident — a uniform [0, 1) generator makes every scale equal and hides them), empty groups
//! sit before groups of other magnitudes, and cases may hold an all-zero group and an
//! all-zero expert, one huge outlier, values 2^-14 below their scope's amax (E4M3's subnormal
//! range after scaling), and, for delayed scaling, stale scales that push values past
//! `fp8_max` (saturation).

use moecheck_reference::format::{decode_fp8, pow2, ulp, Format};
use moecheck_reference::fp8::{
    compute_scale, quantize_operands, verify_fp8, AccumModel, Fp8GemmCase, Fp8GroupedGemm,
    Fp8Recipe, GivenScales, OperandRecipe, Quantized, ScalingKind, ScopeKind,
};
use moecheck_reference::gemm::{GroupedGemmCase, Pass, Passes, TailContract};
use ndarray::{Array2, Array3};
use proptest::prelude::*;

use crate::gemm::group_sizes;
use crate::runner::{Outcome, RunConfig};

/// Largest K of a generated FP8 case.
pub const FP8_MAX_K: usize = 72;
/// Largest N of a generated FP8 case.
pub const FP8_MAX_N: usize = 12;
/// Group and expert magnitudes range over `2^-FP8_MAX_EXP ..= 2^FP8_MAX_EXP`.
pub const FP8_MAX_EXP: i32 = 20;

/// The arguments an FP8 case is built from (values are hashed from `value_seed`).
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8CaseArgs {
    pub group_sizes: Vec<usize>,
    pub tail_rows: usize,
    pub k: usize,
    pub n: usize,
    pub out_dtype: Format,
    /// Magnitude exponent of each group's `lhs` rows, each expert's weight, each group's `dout`.
    pub lhs_exp: Vec<i32>,
    pub expert_exp: Vec<i32>,
    pub dout_exp: Vec<i32>,
    /// A group whose `lhs` rows are all zero, an expert whose weight is all zero.
    pub zero_group: Option<usize>,
    pub zero_expert: Option<usize>,
    /// One `lhs` element (flat index mod size) multiplied by `2^exp`.
    pub outlier: Option<(usize, i32)>,
    /// One element in `tiny_every` is scaled by 2^-14 (subnormal after scaling); 0 = none.
    pub tiny_every: usize,
    pub lhs_scope: ScopeKind,
    pub rhs_scope: ScopeKind,
    pub dout_scope: ScopeKind,
    pub accumulation: AccumModel,
    /// Delayed scaling whose history saw amaxes `2^-shift` times the current ones.
    pub stale_shift: Option<i32>,
    /// Power of two for the scale-invariance property.
    pub rescale_exp: i32,
    pub value_seed: u64,
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Fp8CaseArgs {
    pub fn m(&self) -> usize {
        self.group_sizes.iter().sum::<usize>() + self.tail_rows
    }

    /// A value in (-1, 1) with 24 random bits, times `2^exp`, for array `tag` at `index`.
    fn value(&self, tag: u64, index: usize, exp: i32) -> f32 {
        let h = mix(self.value_seed ^ mix((tag << 56) ^ index as u64));
        let u = ((h >> 40) as f64 + 0.5) / pow2(24) * 2.0 - 1.0;
        let tiny = self.tiny_every > 0 && (h & 0xff) as usize % self.tiny_every == 0;
        let t = if tiny { pow2(-14) } else { 1.0 };
        (u * t * pow2(exp)) as f32
    }

    /// The case (current scaling unless `stale_shift` is set).
    pub fn build(&self) -> Fp8GemmCase {
        let (m, k, n, g) = (self.m(), self.k, self.n, self.group_sizes.len());
        let used: usize = self.group_sizes.iter().sum();
        let group_of = |r: usize| {
            let mut acc = 0;
            for (e, s) in self.group_sizes.iter().enumerate() {
                acc += s;
                if r < acc {
                    return Some(e);
                }
            }
            None
        };
        let mut lhs = Array2::from_shape_fn((m, k), |(r, c)| {
            let e = group_of(r);
            if e.is_some() && e == self.zero_group {
                return 0.0;
            }
            let exp = e.map_or(3, |e| self.lhs_exp[e]);
            self.value(0, r * k + c, exp)
        });
        if let (Some((i, exp)), true) = (self.outlier, used * k > 0) {
            let i = i % (used * k);
            lhs[(i / k, i % k)] *= pow2(exp) as f32;
        }
        let rhs = Array3::from_shape_fn((g, k, n), |(e, r, c)| {
            if Some(e) == self.zero_expert {
                0.0
            } else {
                self.value(1, (e * k + r) * n + c, self.expert_exp[e])
            }
        });
        let dout = Array2::from_shape_fn((m, n), |(r, c)| {
            let exp = group_of(r).map_or(2, |e| self.dout_exp[e]);
            self.value(2, r * n + c, exp)
        });
        let mut recipe = Fp8Recipe {
            lhs: OperandRecipe {
                format: Format::E4m3,
                scope: self.lhs_scope,
            },
            rhs: OperandRecipe {
                format: Format::E4m3,
                scope: self.rhs_scope,
            },
            dout: OperandRecipe {
                format: Format::E5m2,
                scope: self.dout_scope,
            },
            accumulation: self.accumulation,
            ..Fp8Recipe::default()
        };
        let mut case = Fp8GemmCase {
            gemm: GroupedGemmCase {
                lhs,
                rhs,
                group_sizes: self.group_sizes.clone(),
                dout: Some(dout),
                dtype: Format::F32,
                out_dtype: self.out_dtype,
                tail: TailContract::Zero,
            },
            recipe,
            given_scales: None,
        };
        if let Some(shift) = self.stale_shift {
            recipe.scaling = ScalingKind::Delayed {
                history_len: 1,
                algo: moecheck_reference::fp8::AmaxAlgo::MostRecent,
                margin: 0,
            };
            let ops = quantize_operands(&case, Passes::ALL);
            let stale = |q: &Quantized, f: Format| -> Vec<f32> {
                q.amax
                    .iter()
                    .map(|a| compute_scale(a * pow2(-shift) as f32, f, 0))
                    .collect()
            };
            case.given_scales = Some(GivenScales {
                lhs: stale(&ops.lhs, Format::E4m3),
                rhs: stale(&ops.rhs, Format::E4m3),
                dout: ops
                    .dout
                    .as_ref()
                    .map_or(Vec::new(), |d| stale(d, Format::E5m2)),
            });
            case.recipe = recipe;
        }
        case
    }
}

fn scope_row() -> impl Strategy<Value = ScopeKind> {
    prop_oneof![3 => Just(ScopeKind::Group), 1 => Just(ScopeKind::Tensor)]
}

/// FP8 cases; `expert_scope` forces per-expert rhs scaling and current scaling.
pub fn fp8_case_args(expert_scope: bool) -> BoxedStrategy<Fp8CaseArgs> {
    let sizes = prop_oneof![group_sizes(true), group_sizes(false)];
    let k = prop_oneof![
        1 => Just(0usize),
        4 => 1usize..=16,
        2 => prop_oneof![Just(31usize), Just(32), Just(33), Just(64), Just(65)],
        2 => 17usize..=FP8_MAX_K,
    ];
    (sizes, 0usize..=6, k, 1usize..=FP8_MAX_N)
        .prop_flat_map(move |(sizes, tail, k, n)| {
            let g = sizes.len();
            let exps = move || proptest::collection::vec(-FP8_MAX_EXP..=FP8_MAX_EXP, g..=g);
            let rhs_scope = if expert_scope {
                Just(ScopeKind::Expert).boxed()
            } else {
                prop_oneof![3 => Just(ScopeKind::Expert), 1 => Just(ScopeKind::Tensor)].boxed()
            };
            let stale = if expert_scope {
                Just(None).boxed()
            } else {
                prop_oneof![4 => Just(None), 1 => (0i32..=3).prop_map(Some)].boxed()
            };
            (
                Just((sizes, tail, k, n)),
                prop_oneof![3 => Just(Format::F32), 1 => Just(Format::Bf16)],
                (exps(), exps(), exps()),
                (
                    proptest::option::weighted(0.5, 0..g),
                    proptest::option::weighted(0.5, 0..g),
                    proptest::option::weighted(0.3, (any::<usize>(), 4i32..=12)),
                    prop_oneof![Just(0usize), Just(3), Just(7)],
                ),
                (scope_row(), rhs_scope, scope_row()),
                prop_oneof![
                    4 => Just(AccumModel::Exact),
                    1 => Just(AccumModel::Fast),
                    1 => Just(AccumModel::FastPromote)
                ],
                (stale, prop_oneof![-3i32..=-1, 1i32..=3], any::<u64>()),
            )
        })
        .prop_map(
            |(
                (group_sizes, tail_rows, k, n),
                out_dtype,
                (lhs_exp, expert_exp, dout_exp),
                (zero_group, zero_expert, outlier, tiny_every),
                (lhs_scope, rhs_scope, dout_scope),
                accumulation,
                (stale_shift, rescale_exp, value_seed),
            )| {
                Fp8CaseArgs {
                    group_sizes,
                    tail_rows,
                    k,
                    n,
                    out_dtype,
                    lhs_exp,
                    expert_exp,
                    dout_exp,
                    zero_group,
                    zero_expert,
                    outlier,
                    tiny_every,
                    lhs_scope,
                    rhs_scope,
                    dout_scope,
                    accumulation,
                    stale_shift,
                    rescale_exp,
                    value_seed,
                }
            },
        )
        .boxed()
}

/// An FP8 property.
#[derive(Clone, Copy)]
pub struct Fp8Property {
    pub name: &'static str,
    pub description: &'static str,
    pub strategy: fn() -> BoxedStrategy<Fp8CaseArgs>,
    pub test: fn(&dyn Fp8GroupedGemm, &Fp8CaseArgs) -> Result<(), String>,
}

fn any_fp8() -> BoxedStrategy<Fp8CaseArgs> {
    fp8_case_args(false)
}
fn expert_fp8() -> BoxedStrategy<Fp8CaseArgs> {
    fp8_case_args(true)
}

/// Every FP8 property, in a fixed order.
pub fn fp8_all() -> Vec<Fp8Property> {
    vec![
        Fp8Property {
            name: "fp8-fwd-recipe-exact",
            description: "out matches the GEMM of the recipe's dequantised operands within the accumulation bound",
            strategy: any_fp8,
            test: |imp, a| recipe_exact(imp, a, Pass::Fwd),
        },
        Fp8Property {
            name: "fp8-dgrad-recipe-exact",
            description: "dlhs (E5M2 dout x E4M3 rhs) matches the recipe within the bound",
            strategy: any_fp8,
            test: |imp, a| recipe_exact(imp, a, Pass::Dgrad),
        },
        Fp8Property {
            name: "fp8-wgrad-recipe-exact",
            description: "drhs (column-wise lhs x column-wise dout) matches the recipe within the bound",
            strategy: any_fp8,
            test: |imp, a| recipe_exact(imp, a, Pass::Wgrad),
        },
        Fp8Property {
            name: "fp8-quantize-half-ulp",
            description: "every FP8 byte is within half an ulp of its f32-scaled value (or ±max when saturated)",
            strategy: any_fp8,
            test: quantize_half_ulp,
        },
        Fp8Property {
            name: "fp8-copies-agree",
            description: "column-wise copies are the transposed row-wise bytes sharing scale_inv",
            strategy: any_fp8,
            test: copies_agree,
        },
        Fp8Property {
            name: "fp8-scale-invariance",
            description: "scaling one expert's weights by 2^j scales its rows' out by exactly 2^j and changes nothing else",
            strategy: expert_fp8,
            test: scale_invariance,
        },
    ]
}

fn recipe_exact(imp: &dyn Fp8GroupedGemm, args: &Fp8CaseArgs, pass: Pass) -> Result<(), String> {
    let case = args.build();
    let v = verify_fp8(imp, &case, Passes::only(pass))
        .map_err(|e| format!("invalid generated case: {e}"))?;
    match v.failure() {
        None if v.passed() => Ok(()),
        None => Err("failed (no detail)".into()),
        Some(f) => Err(f),
    }
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

fn operands_of(
    imp: &dyn Fp8GroupedGemm,
    case: &Fp8GemmCase,
) -> Result<moecheck_reference::fp8::Fp8Operands, String> {
    imp.operands(case, Passes::ALL)
        .ok_or_else(|| format!("{} does not expose its quantised operands", imp.name()))
}

fn quantize_half_ulp(imp: &dyn Fp8GroupedGemm, args: &Fp8CaseArgs) -> Result<(), String> {
    let case = args.build();
    let ops = operands_of(imp, &case)?;
    let r = &case.recipe;
    check_half_ulp("lhs", &case.gemm.lhs, &ops.lhs, r.lhs.format, r.saturate)?;
    let rhs = moecheck_reference::fp8::rhs_rows(&case.gemm.rhs);
    check_half_ulp("rhs", &rhs, &ops.rhs, r.rhs.format, r.saturate)?;
    if let (Some(d), Some(q)) = (&case.gemm.dout, &ops.dout) {
        check_half_ulp("dout", d, q, r.dout.format, r.saturate)?;
    }
    Ok(())
}

fn copies_agree(imp: &dyn Fp8GroupedGemm, args: &Fp8CaseArgs) -> Result<(), String> {
    let case = args.build();
    let ops = operands_of(imp, &case)?;
    ops.lhs_col
        .agrees_with(&ops.lhs)
        .map_err(|e| format!("lhs: {e}"))?;
    if let (Some(c), Some(d)) = (&ops.dout_col, &ops.dout) {
        c.agrees_with(d).map_err(|e| format!("dout: {e}"))?;
    }
    Ok(())
}

fn scale_invariance(imp: &dyn Fp8GroupedGemm, args: &Fp8CaseArgs) -> Result<(), String> {
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
        .index_axis_mut(ndarray::Axis(0), e)
        .mapv_inplace(|v| v * pow2(j) as f32);
    let run = |c: &Fp8GemmCase| {
        imp.run(c, Passes::FWD)
            .map_err(|err| format!("run failed: {err}"))?
            .out
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

/// Checks an FP8 property like [`crate::check`] does a grouped-GEMM one.
pub fn check_fp8(prop: &Fp8Property, imp: &dyn Fp8GroupedGemm, config: &RunConfig) -> Outcome {
    crate::runner::run_property(&(prop.strategy)(), |args| (prop.test)(imp, args), config)
}
