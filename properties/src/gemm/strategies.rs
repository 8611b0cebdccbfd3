//! proptest strategies for grouped-GEMM cases.
//!
//! Shapes fit by construction ([`prop_flat_map`](proptest::strategy::Strategy::prop_flat_map)):
//! first the layout (group sizes, K, N, tail rows, formats), then per-expert scales of
//! exactly `G` entries. Values are small integers (hashed from a seed) times a power-of-two scale, rounded
//! to the case dtype, so every value is exactly representable and sums are often exact.
//!
//! The generators are biased toward edges: empty experts (at the start, in the middle, at
//! the end, in runs, all of them), size-1 groups, sizes around a 128-row tile, `K = 0`, `K`
//! not a multiple of 16, dropped tail rows with non-zero `dout`, and per-expert weight
//! magnitudes spread over orders of magnitude.

use moecheck_reference::format::{pow2, round_to, Format, Overflow};
use moecheck_reference::gemm::{GroupedGemmCase, Passes, TailContract, Weights};
use moecheck_reference::seed::mix;
use ndarray::{Array2, Array3};
use proptest::prelude::*;

/// Most experts in a case.
pub const MAX_GROUPS: usize = 8;
/// Most rows used by groups (keeps each case fast).
pub const MAX_USED_ROWS: usize = 400;
/// Most dropped (tail) rows.
pub const MAX_TAIL_ROWS: usize = 12;
/// Largest K.
pub const MAX_K: usize = 72;
/// Largest N.
pub const MAX_N: usize = 12;
/// Per-expert weight scales range over `2^-MAX_EXPERT_EXP ..= 2^MAX_EXPERT_EXP`.
pub const MAX_EXPERT_EXP: i32 = 10;
/// Largest size of an ordinary (non-tile-edge) group.
pub const MAX_PLAIN_GROUP: usize = 40;

/// What a generated case must contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Require {
    /// At least one empty expert.
    pub empty_expert: bool,
    /// `K = 0`.
    pub k_zero: bool,
    /// At least one dropped tail row.
    pub tail: bool,
    /// `K >= 1` and `N >= 1` (so `drhs` has elements).
    pub nonempty_weights: bool,
}

/// The arguments a case is built from: the layout, formats and scales, plus a seed and an
/// integer range from which every value is derived. Values are not stored element by
/// element, so shrinking works on the shape (fewer groups, smaller K, fewer tail rows) and
/// on the value range, and the minimal case prints in one line.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmArgs {
    pub dtype: Format,
    pub out_dtype: Format,
    pub group_sizes: Vec<usize>,
    pub tail_rows: usize,
    pub k: usize,
    pub n: usize,
    /// Scale exponent of `lhs`.
    pub lhs_exp: i32,
    /// Scale exponent of each expert's `rhs`.
    pub expert_exp: Vec<i32>,
    /// Scale exponent of `dout`.
    pub dout_exp: i32,
    /// Values are integers in `-int_max..=int_max` (a quarter of them in `-2..=2`) times
    /// `2^exp`, rounded to `dtype`.
    pub int_max: i32,
    /// Seed of the value hash.
    pub value_seed: u64,
    /// The tail rule the case declares ([`TailContract::Zero`] as drawn; the implementation's
    /// declaration, [`super::GemmDomain`], may relax it).
    pub tail: TailContract,
    /// The passes a full check of the case asks for (all of them as drawn; the domain may
    /// leave some out).
    pub passes: Passes,
}

impl GemmArgs {
    pub fn m(&self) -> usize {
        self.group_sizes.iter().sum::<usize>() + self.tail_rows
    }

    /// The integer at `index` of array `tag` (0 lhs, 1 rhs, 2 dout).
    fn int(&self, tag: u64, index: usize) -> i32 {
        let h = mix(self.value_seed ^ mix((tag << 56) ^ index as u64));
        let max = if h & 3 == 0 {
            2.min(self.int_max)
        } else {
            self.int_max
        };
        let span = 2 * max.max(0) as u64 + 1;
        ((h >> 2) % span) as i32 - max.max(0)
    }

    fn value(&self, int: i32, exp: i32) -> f32 {
        round_to(int as f64 * pow2(exp), self.dtype, Overflow::Saturate) as f32
    }

    /// The case (with `dout`, tail contract [`GemmArgs::tail`]).
    pub fn build(&self) -> GroupedGemmCase {
        let (m, k, n, g) = (self.m(), self.k, self.n, self.group_sizes.len());
        let lhs = Array2::from_shape_fn((m, k), |(r, c)| {
            self.value(self.int(0, r * k + c), self.lhs_exp)
        });
        let rhs = Array3::from_shape_fn((g, k, n), |(e, r, c)| {
            self.value(self.int(1, (e * k + r) * n + c), self.expert_exp[e])
        });
        let dout = Array2::from_shape_fn((m, n), |(r, c)| {
            self.value(self.int(2, r * n + c), self.dout_exp)
        });
        GroupedGemmCase {
            lhs,
            // Held in bf16 when the dtype is bf16 (f32 for f32 and f16 cases).
            rhs: Weights::narrowed(rhs, self.dtype),
            group_sizes: self.group_sizes.clone(),
            dout: Some(dout),
            dtype: self.dtype,
            out_dtype: self.out_dtype,
            tail: self.tail,
        }
    }

    /// The same case with the tail rows of `dout` replaced by `f(row, col)` (a value
    /// representable in the dtype).
    pub fn with_tail_dout(
        &self,
        case: &GroupedGemmCase,
        f: impl Fn(usize, usize) -> f32,
    ) -> GroupedGemmCase {
        let mut c = case.clone();
        let used = c.rows_used();
        if let Some(d) = c.dout.as_mut() {
            for ((r, col), v) in d.indexed_iter_mut() {
                if r >= used {
                    *v = round_to(f(r, col) as f64, self.dtype, Overflow::Saturate) as f32;
                }
            }
        }
        c
    }
}

/// One group's size: mostly small, often empty, sometimes 1, occasionally 127/128/129.
fn group_size() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => Just(0usize),
        2 => Just(1usize),
        4 => 2usize..=12,
        2 => 13usize..=MAX_PLAIN_GROUP,
        1 => prop_oneof![Just(63usize), Just(64), Just(65), Just(127), Just(128), Just(129)],
    ]
}

/// Caps the total at [`MAX_USED_ROWS`] by shrinking the groups that overflow it.
fn cap_total(mut sizes: Vec<usize>) -> Vec<usize> {
    let mut left = MAX_USED_ROWS;
    for s in sizes.iter_mut() {
        *s = (*s).min(left);
        left -= *s;
    }
    sizes
}

/// Group sizes, with the empty-expert patterns named in the module docs.
pub fn group_sizes(require_empty: bool) -> BoxedStrategy<Vec<usize>> {
    let random = proptest::collection::vec(group_size(), 1..=MAX_GROUPS);
    // A run of empties at the start, the middle or the end.
    let run = (
        proptest::collection::vec(group_size(), 1..=MAX_GROUPS),
        0usize..3,
        1usize..=3,
    )
        .prop_map(|(mut v, at, len)| {
            let len = len.min(v.len());
            let start = match at {
                0 => 0,
                1 => (v.len() - len) / 2,
                _ => v.len() - len,
            };
            for s in &mut v[start..start + len] {
                *s = 0;
            }
            v
        });
    let all_empty = (1usize..=MAX_GROUPS).prop_map(|g| vec![0; g]);
    let base: BoxedStrategy<Vec<usize>> = if require_empty {
        prop_oneof![3 => run, 1 => all_empty, 2 => random.prop_map(|mut v| {
            let i = v.len() / 2;
            v[i] = 0;
            v
        })]
        .boxed()
    } else {
        prop_oneof![6 => random, 3 => run, 1 => all_empty].boxed()
    };
    base.prop_map(cap_total).boxed()
}

fn k_dim(req: Require) -> BoxedStrategy<usize> {
    if req.k_zero {
        return Just(0usize).boxed();
    }
    let lo = usize::from(req.nonempty_weights);
    prop_oneof![
        1 => Just(0usize),
        3 => 1usize..=8,
        2 => prop_oneof![Just(16usize), Just(32), Just(48), Just(64)],
        2 => prop_oneof![Just(15usize), Just(17), Just(31), Just(33), Just(47), Just(63), Just(65)],
        2 => 9usize..=MAX_K,
    ]
    .prop_map(move |k| k.max(lo))
    .boxed()
}

fn tail_rows(req: Require) -> BoxedStrategy<usize> {
    if req.tail {
        (1usize..=MAX_TAIL_ROWS).boxed()
    } else {
        prop_oneof![2 => Just(0usize), 2 => 1usize..=MAX_TAIL_ROWS].boxed()
    }
}

/// Input dtype and output dtype: bf16 inputs most often; outputs f32, or bf16 for bf16.
fn formats() -> impl Strategy<Value = (Format, Format)> {
    prop_oneof![
        4 => Just((Format::Bf16, Format::F32)),
        1 => Just((Format::Bf16, Format::Bf16)),
        1 => Just((Format::F16, Format::F32)),
        1 => Just((Format::F16, Format::F16)),
        2 => Just((Format::F32, Format::F32)),
    ]
}

/// `N`, sometimes 0 (no output columns: `out` and `drhs` have no elements), unless `req`
/// needs non-empty weights.
fn n_dim(req: Require) -> BoxedStrategy<usize> {
    let lo = usize::from(req.nonempty_weights);
    prop_oneof![1 => Just(0usize), 9 => 1usize..=MAX_N]
        .prop_map(move |n| n.max(lo))
        .boxed()
}

/// Largest integer magnitude for values of a case: [`int_max`], but at most 63 when the
/// outputs are f16, so that with [`exp_range`] no sum can reach f16's maximum (65504):
/// at most `129 · 63² · 2^-4 < 2^15` for `drhs` (the longest reduction, one group's rows).
pub(super) fn int_max_for(dtype: Format, out_dtype: Format) -> i32 {
    if out_dtype == Format::F16 {
        int_max(dtype).min(63)
    } else {
        int_max(dtype)
    }
}

/// Largest integer magnitude used for values of `dtype` (fills its mantissa).
fn int_max(dtype: Format) -> i32 {
    match dtype {
        Format::Bf16 => 255,
        Format::F16 => 2047,
        _ => 1 << 20,
    }
}

/// Exponent range for a dtype: f16 has a narrow range, keep its values finite (and, for f16
/// outputs, every product at most `2^-4·63²`: both factors' exponents are at most -2).
fn exp_range(dtype: Format, wide: i32) -> std::ops::RangeInclusive<i32> {
    match dtype {
        Format::F16 => -8..=2,
        _ => -wide..=wide,
    }
}

pub(super) fn exp_range_for(
    dtype: Format,
    out_dtype: Format,
    wide: i32,
) -> std::ops::RangeInclusive<i32> {
    if out_dtype == Format::F16 {
        -8..=-2
    } else {
        exp_range(dtype, wide)
    }
}

/// Cases meeting `req`.
pub fn case_args(req: Require) -> BoxedStrategy<GemmArgs> {
    (
        formats(),
        group_sizes(req.empty_expert),
        tail_rows(req),
        k_dim(req),
        n_dim(req),
    )
        .prop_flat_map(|((dtype, out_dtype), sizes, tail, k, n)| {
            let g = sizes.len();
            // Per-expert scales: one shared, or spread over powers of two.
            let exps = move |wide| exp_range_for(dtype, out_dtype, wide);
            let expert_exp = prop_oneof![
                1 => exps(4).prop_map(move |e| vec![e; g]),
                2 => proptest::collection::vec(exps(MAX_EXPERT_EXP), g..=g),
            ];
            let top = int_max_for(dtype, out_dtype);
            (
                Just((dtype, out_dtype, sizes, tail, k, n)),
                exps(4),
                expert_exp,
                exps(4),
                prop_oneof![3 => Just(top), 1 => 1..=top],
                // The seed only picks values through a hash: a smaller seed is not a simpler case,
                // so it is not shrunk (shrinking spends its budget on the shape and the range).
                any::<u64>().no_shrink(),
            )
        })
        .prop_map(
            |(
                (dtype, out_dtype, group_sizes, tail_rows, k, n),
                lhs_exp,
                expert_exp,
                dout_exp,
                int_max,
                value_seed,
            )| {
                GemmArgs {
                    dtype,
                    out_dtype,
                    group_sizes,
                    tail_rows,
                    k,
                    n,
                    lhs_exp,
                    expert_exp,
                    dout_exp,
                    int_max,
                    value_seed,
                    tail: TailContract::Zero,
                    passes: Passes::ALL,
                }
            },
        )
        .boxed()
}

/// Any case.
pub fn any_case() -> BoxedStrategy<GemmArgs> {
    case_args(Require::default())
}
