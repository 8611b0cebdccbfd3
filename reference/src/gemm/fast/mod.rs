//! Fast verification of a grouped GEMM (`--verify fast`, [`Verify::Fast`], a mode of
//! [`crate::gemm::Gemm`] and of the FP8 grouped GEMM, not an operation of its own): checks that cost
//! `O(V·(M·K + G·K·N))` plus a few sampled rows and columns per group, instead of the full
//! reference's `O(M·K·N)`, with `V =` [`VECTORS`].
//!
//! ## What is checked
//! Per pass and per expert, with the pass's output seen as a matrix `C = A·B` per expert
//! (fwd `lhs_g·rhs_g`, dgrad `dout_g·rhs_gᵀ`, wgrad `lhs_gᵀ·dout_g`; `A` is `rows × n`, `B` is
//! `n × cols`, `n` the reduction length of the bound):
//!
//! 1. **Structure, every element.** No NaN or ±inf anywhere in an expert's rows; tail rows of
//!    `out` and `dlhs` exactly 0 under [`crate::gemm::TailContract::Zero`]; where `n = 0`
//!    (an empty expert's `drhs`, `out` with `K = 0`, `dlhs` with `N = 0`) every element
//!    exactly 0. These are the same element checks as full mode, and cost `O(elements)`.
//! 2. **Sampled rows and columns, element by element**, against the same per-element bound as
//!    full mode ([`crate::gemm::ErrorBound::at`], with `y_ref` and `Σ|a·b|` computed in f64
//!    for those elements only): each expert's rows and columns [`sampled`] picks (the first and
//!    last, both sides of every tile edge of 8/16/32/64/128 at the start and at the last,
//!    possibly partial, tile, and [`sample::RANDOM`] seeded ones). For wgrad the rows are
//!    `K`-indexed, so `K`'s tile edges are sampled too.
//! 3. **Random projections of every row** (Freivalds' check): for `V` vectors `x ∈ {±1}^cols`
//!    (seeded, independent, each sign ±1 with probability 1/2), compare
//!    `q_i = Σ_j got_ij·x_j` with `p_i = Σ_t a_it·(Σ_j b_tj·x_j)`, both in f64.
//!
//! ## The threshold of a row (derivation)
//! Let `y` be the exact product, `E_ij = got_ij − y_ij`, `S_ij = Σ_t |a_it·b_tj|` and the
//! per-element bound `β_ij = c_S·S_ij + c_y·|y_ref,ij| + [S_ij > 0]·(floor + underflow)`
//! ([`crate::gemm::ErrorBound`]'s fields). An element that passes full mode has
//! `|got − y_ref| <= β` and `|y_ref − y| <= γ_n·S` (`γ_n = γ(n, 2^-53)`, the reference's own
//! error), so with `|y_ref| <= |got| + |got − y_ref|`:
//!
//! `|E_ij| <= b_ij := [S_ij > 0]·((c_S + γ_n)·S_ij + c_y·|got_ij| + floor + underflow) / (1 − c_y)`.
//!
//! `b_ij` needs no `y`: its row sum is linear in things that are cheap,
//! `Σ_j S_ij = Σ_t |a_it|·(Σ_j |b_tj|) =: S_i` (one matrix-vector product of `|A|` with the
//! row sums of `|B|`) and `G_i = Σ_j |got_ij|`. Since `|x_j| = 1`,
//! `|Σ_j x_j·E_ij| <= Σ_j b_ij <= slack_i := [S_i > 0]·((c_S + γ_n)·S_i + c_y·G_i + C·(floor + underflow)) / (1 − c_y)`
//! for a row all of whose elements pass (`C = cols`; a row with `S_i = 0` must be exactly 0).
//!
//! **The projections' own f64 rounding.** `v̂_t = fl(Σ_j b_tj·x_j)` has
//! `|v̂_t − v_t| <= γ_C·Σ_j |b_tj|`, then `p̂_i = fl(Σ_t a_it·v̂_t)` has
//! `|p̂_i − Σ_t a_it·v̂_t| <= γ_n·Σ_t |a_it|·|v̂_t|`, so together
//! `|p̂_i − Σ_j y_ij·x_j| <= (γ_C + γ_n + γ_n·γ_C)·S_i`, and `|q̂_i − q_i| <= γ_C·G_i`
//! (Higham 2002, eq. 3.5: any summation order). Products of f32-valued inputs with f64 sums
//! of them stay far above f64's underflow threshold, so no absolute term enters. The computed
//! `Ŝ_i`, `Ĝ_i` (sums of non-negative terms) and the few operations combining them are
//! covered by the factor `1 + 4·γ(n + C + 10, 2^-53)`. The threshold is
//!
//! `τ_i = (slack_i + (γ_C + γ_n + γ_n·γ_C)·Ŝ_i + γ_C·Ĝ_i)·(1 + 4·γ(n + C + 10, 2^-53))`,
//!
//! and a row fails when `max_v |q̂_i − p̂_i| > τ_i` (or is NaN). See `check::Roundoff`.
//!
//! ## What is guaranteed
//! * **No false failures.** Outputs that pass full mode pass fast mode: every element of the
//!   sampled rows and columns is judged by the same bound, and every row's projections stay
//!   within `τ_i` for every vector (the derivation above holds for any `x ∈ {±1}^C`).
//! * **Structural errors, always:** a NaN or ±inf anywhere, a non-zero tail element, a
//!   non-zero element where `n = 0` (an empty expert's `drhs`).
//! * **Sampled elements, always:** an element of a sampled row or column outside its own
//!   bound — the same guarantee as full mode, for those elements.
//! * **One bad element in a row, always:** if the only element of row `i` outside its `b_ij`
//!   is `(i, j*)` and `|E_ij*| > 2·τ_i`, every vector gives
//!   `|q̂_i − p̂_i| >= |E_ij*| − slack_i − rounding > τ_i`: it is caught whatever the vectors.
//! * **Any error above the row's threshold, with probability:** if some element of row `i`
//!   has `|E_ij*| > τ_i + ρ_i`, with `ρ_i = (γ_C + γ_n + γ_n·γ_C)·Ŝ_i + γ_C·Ĝ_i` the
//!   projections' rounding (at most `τ_i`, and orders of magnitude below it for any
//!   accumulator narrower than f64), then for each vector, fixing every sign but `x_j*`, the
//!   two values of `x_j*` give computed projections more than `2·τ_i` apart, so at most one of
//!   them lands within `τ_i`: each vector misses with probability at most 1/2, and all `V`
//!   independent vectors with probability at most `2^-V` (`2^-8` here). Several errors that
//!   cancel in one projection are exactly this case.
//! * **Not guaranteed:** an element outside its own bound `b_ij` but below the row's
//!   threshold `τ_i ≈ Σ_j b_ij` (about `C` times larger), in a row and column that were not
//!   sampled. A uniformly slightly-too-loose accumulator shows up in every element, so in the
//!   sampled ones; a single element barely outside its bound in an unsampled place is what
//!   only `--verify full` sees.
//!
//! The vectors and samples are drawn from a fixed seed ([`sample::SEED`]), so a run is
//! reproducible; the probabilities are over that draw, for errors that do not depend on it.

pub mod check;
pub mod expected;
mod flat;
pub mod mode;
mod projection;
pub mod sample;

pub use check::{fast_compare, fast_compare_with_bound};
pub use expected::{fast_expected, flat_shape, FastExpected};
pub use mode::{Verification, Verify, FAST_ABOVE_MACS, VECTORS};
pub use projection::{FastPass, ProjectionWorst};
pub use sample::sampled;

#[cfg(test)]
mod tests;
