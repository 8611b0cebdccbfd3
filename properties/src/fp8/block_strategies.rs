//! proptest strategies for FP8 grouped-GEMM cases with block scopes (`block:1xC`,
//! `block:CxC`, `mx:C`), biased to the edges that break block-scaled kernels: K shorter than a
//! block (a tail only), exactly one block, one block and a tail, two blocks and a tail;
//! groups smaller than a block, of 127/128/129 rows and empty (so that a column-wise block
//! along M meets a group boundary); block sizes 4, 8, 32 and 128 (the small ones keep cases
//! cheap with several blocks; 32 and 128 are MXFP8's and DeepGEMM's). Magnitudes grow by one
//! binade per block along the contraction ([`Fp8CaseArgs::k_ramp`]), so consecutive blocks
//! and the K tail have different (even power-of-two) scales; groups and experts keep their
//! own magnitudes as in [`super::strategies`].

use moecheck_reference::format::Format;
use moecheck_reference::fp8::{AccumModel, ScopeKind};
use proptest::prelude::*;

use super::strategies::{Fp8CaseArgs, FP8_MAX_EXP, FP8_MAX_N};
use crate::gemm::group_sizes;

/// The block sizes drawn.
pub const FP8_BLOCK_SIZES: [usize; 4] = [4, 8, 32, 128];

/// The scopes of one case: `(lhs/dout scope, rhs scope)` of one kind (DeepGEMM's three casts,
/// or MX's two roundings) and block size `c`.
fn block_scopes(c: usize, recipe: usize) -> (ScopeKind, ScopeKind) {
    let p = |s: String| ScopeKind::parse(&s).expect("a generated scope parses");
    let names = [
        "deepgemm",
        "deepgemm-reciprocal",
        "deepgemm-ue8m0",
        "floor",
        "rceil",
    ];
    let name = names[recipe % names.len()];
    if recipe % names.len() >= 3 {
        (p(format!("mx:{c}/{name}")), p(format!("mx:{c}/{name}")))
    } else {
        (
            p(format!("block:1x{c}/{name}")),
            p(format!("block:{c}x{c}/{name}")),
        )
    }
}

/// FP8 cases with block scopes on most operands (each operand keeps a per-group, per-expert
/// or per-tensor scope one time in five), current scaling and exact accumulation (what
/// block scopes support).
pub fn fp8_block_case_args() -> BoxedStrategy<Fp8CaseArgs> {
    let block = prop_oneof![3 => Just(4usize), 2 => Just(8), 2 => Just(32), 1 => Just(128)];
    let sizes = prop_oneof![group_sizes(true), group_sizes(false)];
    (block, 0usize..5, sizes, 0usize..=4, 1usize..=FP8_MAX_N)
        .prop_flat_map(|(c, recipe, sizes, tail, n)| {
            let g = sizes.len();
            let k = prop_oneof![
                1 => 1..c.max(2),
                1 => Just(c),
                3 => c + 1..2 * c,
                1 => 2 * c + 1..=3 * c,
            ];
            let exps = move || proptest::collection::vec(-FP8_MAX_EXP..=FP8_MAX_EXP, g..=g);
            let (row, rhs) = block_scopes(c, recipe);
            let row_scope = prop_oneof![4 => Just(row), 1 => Just(ScopeKind::Group), 1 => Just(ScopeKind::Tensor)];
            let rhs_scope = prop_oneof![4 => Just(rhs), 1 => Just(ScopeKind::Expert)];
            (
                Just((sizes, tail, n, c)),
                k,
                prop_oneof![3 => Just(Format::F32), 1 => Just(Format::Bf16)],
                (exps(), exps(), exps()),
                (
                    proptest::option::weighted(0.3, 0..g),
                    proptest::option::weighted(0.3, 0..g),
                    prop_oneof![Just(0usize), Just(3), Just(7)],
                ),
                (row_scope.clone(), rhs_scope, row_scope),
                any::<u64>(),
            )
        })
        .prop_map(
            |(
                (group_sizes, tail_rows, n, c),
                k,
                out_dtype,
                (lhs_exp, expert_exp, dout_exp),
                (zero_group, zero_expert, tiny_every),
                (lhs_scope, rhs_scope, dout_scope),
                value_seed,
            )| Fp8CaseArgs {
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
                outlier: None,
                tiny_every,
                lhs_scope,
                rhs_scope,
                dout_scope,
                accumulation: AccumModel::Exact,
                stale_shift: None,
                rescale_exp: 1,
                value_seed,
                k_ramp: c,
            },
        )
        .boxed()
}
