//! FP8 current-tensor scaling, written down once: the recipe, its scopes, delayed scaling, the
//! FP8 grouped GEMM reference and the accumulation models its error bound is derived from.
//!
//! The FP8 grouped GEMM is the operation [`Fp8Gemm`]: its case and recipe ([`case`]), the
//! recipe-exact reference and bound ([`gemm`]), the two comparisons (`compare.rs`, with
//! [`high_precision`](mod@high_precision) for the information against the unquantised GEMM), and `op.rs`,
//! `files.rs`, `report.rs` for the vocabulary's `Op`, `Protocol` and `Reported`.
//!
//! ## The recipe (Transformer Engine's current tensor scaling)
//! For a scaling scope (the whole tensor, one group of rows, one expert's weight):
//!
//! 1. `amax = max |x|` over the scope, in f32 (exact: `|x|` and `max` do not round).
//! 2. `scale = fp8_max / amax` in f32 (round to nearest even), `fp8_max = 448` (E4M3) or
//!    `57344` (E5M2), margin 0. If `amax` is 0, NaN or ±inf, `scale = 1`. If the division
//!    overflows (a tiny non-zero `amax`), `scale = f32::MAX`.
//!    Follows `compute_scale_from_amax` in Transformer Engine's
//!    `transformer_engine/common/recipe/recipe_common.cuh` (the C++/CUDA path: `__fdiv_rn`,
//!    `isinf(scale) -> FLT_MAX`, NaN or inf or zero amax -> 1). TE's JAX path
//!    (`transformer_engine/jax/quantize/quantizer.py`, `compute_scale_from_amax`) computes
//!    `(fp8_max / amax) / 2^margin` and guards `amax > 0` and `isfinite(amax)` but **not**
//!    the overflow: there a tiny amax gives `scale = inf`, and `0 · inf = NaN` for zeros in
//!    the scope. [`jax_scale_overflows`] reports when that happens.
//! 3. `q = round_nearest_even_satfinite(fl32(x · scale))`: the product is rounded to f32 first,
//!    then cast to FP8 once (PTX `cvt.rn.satfinite`): values past ±max become ±max, ±inf
//!    becomes ±max, NaN stays NaN. `--no-saturate` uses the IEEE cast of ml_dtypes instead
//!    (E4M3 overflow -> NaN, E5M2 overflow -> ±inf).
//! 4. `scale_inv = fl32(1 / scale)`, correctly rounded in f32 (may be subnormal when
//!    `scale = f32::MAX`).
//! 5. Dequantise: `x̂ = decode(q) · scale_inv`. The GEMM reference uses the exact product (in
//!    f64, where it is exact); `dequant.npy` of `moecheck fp8 quantize` is the f32 product
//!    `fl32(decode(q) · scale_inv)` (the FP8 value is exact in f32, one rounding).
//!
//! ## Decisions the issue left open (kernels should follow them)
//! * **NaN in amax**: `amax` propagates NaN (as `jnp.max`/`np.max` do): one NaN in a scope
//!   makes its `amax` NaN, hence `scale = 1` for the whole scope; the NaN element itself
//!   encodes as NaN (E4M3 `0x7f`/`0xff`, E5M2 `0x7e`/`0xfe`, sign kept). An `inf` makes
//!   `amax = inf`, hence `scale = 1`, and under saturation `inf -> ±max`. (TE's C++ amax
//!   kernel reduces with `fmaxf`, which drops NaN; a kernel that does so differs only on
//!   scopes that hold NaN.)
//! * **Empty scopes** (a group with no rows, an expert with `K = 0`): no amax; stored as
//!   `amax = 0`, `scale = scale_inv = 1`. Every group keeps its own slot: scale arrays have
//!   one entry per group, empty or not, so an empty group never shifts another group's scale
//!   (the opposite of a compacted layout, see [`scaling`]).
//! * **Tail rows** (rows past `Σ group_sizes`, dropped tokens) belong to no scope: they do not
//!   enter any amax, and they are not quantised (their bytes are `0x00`). With
//!   [`Scope::Tensor`] in the grouped GEMM the tensor is the rows in groups.
//! * **Order of the output scaling**: `out = fl_out(fl32(fl32(acc · sinv_a) · sinv_b))`, the
//!   accumulator times the lhs-side `scale_inv`, then times the rhs-side one; the error bound
//!   ([`gemm`]) allows any order with two f32 roundings.
//! * **Column-wise copies** (wgrad): the transpose of the same FP8 bytes, sharing `scale_inv`
//!   (tensor or per-group scaling), never re-quantised.
//!
//! ## Delayed scaling ([`scaling::AmaxHistory`])
//! The scale of step `t` comes from the amax history *before* step `t`
//! (`max` over the history or its `most_recent` entry, margin `m`:
//! `scale = (fp8_max / amax) / 2^m`, same guards); after quantising, `amax_t` is pushed and the
//! oldest entry dropped (length `L`). Values past the range of a stale scale saturate.

pub mod accum;
pub mod block;
pub mod block_bound;
mod block_files;
pub mod block_gemm;
mod block_recipe;
pub mod block_scope;
pub mod bulk;
pub mod case;
mod compare;
pub mod fast;
mod files;
pub mod gemm;
pub mod high_precision;
pub mod model;
mod op;
pub mod recipe;
mod report;
pub mod running;
pub mod scaling;
mod shard;

pub use accum::{AccumModel, AccumRounding, AccumVariant, Running};
pub use case::{
    Fp8GemmCase, Fp8Recipe, GivenScales, Operand, OperandRecipe, RecipeError, RecipeProblem,
    ScalingKind, ScopeKind,
};
pub use compare::{compare_fp8, Fp8Expected, Fp8Report};
pub use fast::{fp8_fast_compare, fp8_fast_expected};
pub use files::Fp8Json;
pub use gemm::{
    fp8_reference, quantize_operands, reference_from_operands, rhs_rows, Fp8Bound, Fp8Operands,
};
pub use high_precision::{high_precision, merge_high_precision, HighPrecisionStats};
pub use model::{model_check, ModelCheck, ModelGroupCheck};
pub use op::{fp8_precision, Fp8Gemm};
pub use recipe::{
    amax, compute_scale, dequantize_f32, dequantize_value, fp8_max, jax_scale_overflows,
    quantize_value, scale_inv,
};
pub use report::{Fp8Document, Fp8Extra};
pub use scaling::{
    quantize_experts, quantize_rows, quantize_rows_with_scales, AmaxAlgo, AmaxHistory, ColumnWise,
    Quantized, Scope,
};
pub use shard::merge_fp8;
