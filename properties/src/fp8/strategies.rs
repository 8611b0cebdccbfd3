//! proptest strategies for FP8 grouped-GEMM cases.
//!
//! Cases are built to expose scale bugs: every group of `lhs`/`dout` rows and every expert
//! gets its own magnitude (powers of two spread over 2^±20, so no two scales coincide by
//! accident — a uniform [0, 1) generator makes every scale equal and hides them), empty groups
//! sit before groups of other magnitudes, and cases may hold an all-zero group and an
//! all-zero expert, one huge outlier, values 2^-14 below their scope's amax (E4M3's subnormal
//! range after scaling), and, for delayed scaling, stale scales that push values past
//! `fp8_max` (saturation).

use moecheck_reference::format::{pow2, Format};
use moecheck_reference::fp8::{
    compute_scale, quantize_operands, AccumModel, AmaxAlgo, Fp8GemmCase, Fp8Recipe, GivenScales,
    OperandRecipe, Quantized, ScalingKind, ScopeKind,
};
use moecheck_reference::gemm::{GroupedGemmCase, Passes, TailContract};
use moecheck_reference::seed::mix;
use ndarray::{Array2, Array3};
use proptest::prelude::*;

use crate::gemm::group_sizes;

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
    /// 0, or the magnitude exponent grows by one every `k_ramp` elements along the
    /// contraction (lhs along K, rhs along K, dout along N), so that consecutive blocks (and
    /// a K tail) get different scales even when they are powers of two.
    pub k_ramp: usize,
    pub value_seed: u64,
}

impl Fp8CaseArgs {
    fn ramp(&self, i: usize) -> i32 {
        i.checked_div(self.k_ramp).map_or(0, |r| r as i32)
    }

    pub fn m(&self) -> usize {
        self.group_sizes.iter().sum::<usize>() + self.tail_rows
    }

    /// A value in (-1, 1) with 24 random bits, times `2^exp`, for array `tag` at `index`.
    fn value(&self, tag: u64, index: usize, exp: i32) -> f32 {
        let h = mix(self.value_seed ^ mix((tag << 56) ^ index as u64));
        let u = ((h >> 40) as f64 + 0.5) / pow2(24) * 2.0 - 1.0;
        let tiny = self.tiny_every > 0 && ((h & 0xff) as usize).is_multiple_of(self.tiny_every);
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
            self.value(0, r * k + c, exp + self.ramp(c))
        });
        if let (Some((i, exp)), true) = (self.outlier, used * k > 0) {
            let i = i % (used * k);
            lhs[(i / k, i % k)] *= pow2(exp) as f32;
        }
        let rhs = Array3::from_shape_fn((g, k, n), |(e, r, c)| {
            if Some(e) == self.zero_expert {
                0.0
            } else {
                self.value(1, (e * k + r) * n + c, self.expert_exp[e] + self.ramp(r))
            }
        });
        let dout = Array2::from_shape_fn((m, n), |(r, c)| {
            let exp = group_of(r).map_or(2, |e| self.dout_exp[e]);
            self.value(2, r * n + c, exp + self.ramp(c))
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
                rhs: rhs.into(),
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
                algo: AmaxAlgo::MostRecent,
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
                    k_ramp: 0,
                }
            },
        )
        .boxed()
}
