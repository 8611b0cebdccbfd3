//! Fast verification of a grouped GEMM (`--verify fast`, [`Verify::Fast`], a mode of
//! [`crate::gemm::Gemm`] and of the FP8 grouped GEMM, not an operation of its own): checks that cost
//! `O(V·(M·K + G·K·N))`, one product with `1/W` of the full reference's multiply-adds
//! (`2·M·K·N/W`, values and magnitudes) and a few sampled rows and columns per group, instead
//! of the full reference's `2·M·K·N` (per pass), with `V =` [`VECTORS`] and `W =` [`CHUNK`].
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
//! 4. **Projections of every chunk of every row**: the columns cut into chunks `c` of `W`
//!    consecutive columns (the last one of a row narrower where `W` does not divide `cols`)
//!    and one more seeded vector `x`; compare `q_ic = Σ_{j∈c} got_ij·x_j` with
//!    `p_ic = Σ_t a_it·(Σ_{j∈c} b_tj·x_j)` (one product of `A` with the `cols/W` chunk sums of
//!    `B`'s rows), both in f64, within a threshold of about the chunk's summed bounds.
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
//! ## Chunks of columns (derivation)
//! Nothing above uses that `j` runs over the whole row: for a chunk `c` of `W_c` columns the
//! same steps give its threshold `τ_ic`, the formula of `τ_i` with `C → W_c`,
//! `Ŝ_i → Ŝ_ic = Σ_t |a_it|·(Σ_{j∈c} |b_tj|)` (one product of `|A|` with the chunk sums of
//! `|B|`'s rows, in f64 like `p̂_ic`: the same `γ_n` for the product, `γ_W` for the chunk sums)
//! and `Ĝ_i → Ĝ_ic = Σ_{j∈c} |got_ij|`:
//!
//! `τ_ic = (slack_ic + ρ_ic)·(1 + 4·γ(n + W_c + 10, 2^-53))`, with
//! `slack_ic = [Ŝ_ic > 0]·((c_S + γ_n)·Ŝ_ic + c_y·Ĝ_ic + W_c·(floor + underflow)) / (1 − c_y)` and
//! `ρ_ic = (γ_W + γ_n + γ_n·γ_W)·Ŝ_ic + γ_W·Ĝ_ic`.
//!
//! A chunk fails when `|q̂_ic − p̂_ic| > τ_ic` (or is NaN). `slack_ic` is `Σ_{j∈c} b_ij`
//! computed (the `b_ij` of the first section, up to the inflation), so the chunk's mean
//! per-element bound is `b̄_ic = slack_ic / W_c`, and write `ρ_ic = r·slack_ic`.
//!
//! **The choice of `W`.** A lone element of the chunk outside its `b_ij`, off by `|E|`, gives
//! `|q̂_ic − p̂_ic| >= |E| − slack_ic − ρ_ic >= |E| − τ_ic` for either sign of its `x_j`, so it
//! is caught whenever `|E| > 2·τ_ic`, and `2·τ_ic = 2·W_c·(1 + r)·b̄_ic·inflate`. The promise
//! is [`LONE`]` = 64`: `W = LONE/4 = 16` makes `2·τ_ic <= 32·(1 + r)·b̄_ic·inflate`, at most
//! `64·b̄_ic` as long as `(1 + r)·inflate <= 2`. Term by term,
//! `r <= max((γ_W + γ_n + γ_n·γ_W)/(c_S + γ_n), γ_W/c_y)`:
//!
//! * an accumulator of f32 or narrower has `c_S >= γ(1, 2^-24) ≈ 6·10^-8` against
//!   `γ_W + γ_n ≈ (16 + n)·1.1·10^-16`, and an output of f32 or narrower `c_y >= 2^-24`
//!   against `γ_16 ≈ 1.8·10^-15`: `r < 10^-6` (for `n < 2^30`), the factor is 32;
//! * an f64 output has `c_y = 2^-53`, but then the rounding of `Ĝ_ic` is below that of
//!   `Ŝ_ic` (`|got_ij| <= S_ij + b_ij` for the passing elements, and the bad element's
//!   `γ_W·|got|` is `2^-49·|E|`, nothing against `|E|`), which leaves the first ratio with
//!   `2·γ_W` in place of `γ_W`;
//! * an f64 accumulator (the reference as an implementation, `--acc f64`) has
//!   `c_S >= 3·γ_n` (its own `γ_d` with `d = n`, and the reference's `2·γ_n`), so
//!   `r <= (2·W + n)/(4·n) <= 1` for `n >= 11`. Below that the bound itself is a few f64
//!   units in the last place of `Σ|a·b|`, and so is the check's rounding: the factor there is
//!   `32·(1 + (2·W + n)/(4·n))`, 296 at `n = 1`.
//!
//! The chunk sums cost `O(n·cols)` per block beside the whole-row projections', and the
//! products `2·rows·n·cols/W`: at `W = 16` an eighth of one GEMM of the pass. At
//! DeepSeek-V3's size the fast check took 5 – 9% more wall time (9 – 13% more CPU time) with
//! the chunks than without, old and new in one session (docs/performance.md).
//!
//! ## What is guaranteed
//! * **No false failures.** Outputs that pass full mode pass fast mode: every element of the
//!   sampled rows and columns is judged by the same bound, and every row's projections stay
//!   within `τ_i` for every vector (the derivation above holds for any `x ∈ {±1}^C`).
//! * **Structural errors, always:** a NaN or ±inf anywhere, a non-zero tail element, a
//!   non-zero element where `n = 0` (an empty expert's `drhs`).
//! * **Sampled elements, always:** an element of a sampled row or column outside its own
//!   bound — the same guarantee as full mode, for those elements.
//! * **One bad element in a chunk, always:** if the only element of chunk `c` of row `i`
//!   outside its `b_ij` is `(i, j*)` and `|E_ij*| > 2·τ_ic`, which `|E_ij*| > 64·b̄_ic`
//!   implies (above: declared accumulators narrower than f64, or f64 over 11 terms or more),
//!   the chunk's projection gives `|q̂_ic − p̂_ic| >= |E_ij*| − slack_ic − ρ_ic > τ_ic` whatever
//!   its signs: it is caught wherever it lies. Where the bounds of a row are alike, `b̄_ic` is
//!   about the element's own bound, so an element off by 64 times its own bound is caught
//!   (the tests plant exactly that, in rows and columns not sampled, in every pass).
//! * **One bad element in a row, always:** the same for the whole row with `|E_ij*| > 2·τ_i`.
//! * **Any error above the row's threshold, with probability:** if some element of row `i`
//!   has `|E_ij*| > τ_i + ρ_i`, with `ρ_i = (γ_C + γ_n + γ_n·γ_C)·Ŝ_i + γ_C·Ĝ_i` the
//!   projections' rounding (at most `τ_i`, and orders of magnitude below it for any
//!   accumulator narrower than f64), then for each vector, fixing every sign but `x_j*`, the
//!   two values of `x_j*` give computed projections more than `2·τ_i` apart, so at most one of
//!   them lands within `τ_i`: each vector misses with probability at most 1/2, and all `V`
//!   independent vectors with probability at most `2^-V` (`2^-8` here). Several errors that
//!   cancel in one projection are exactly this case. The same argument for a chunk: an
//!   element with `|E_ij*| > τ_ic + ρ_ic` escapes its chunk's one vector with probability at
//!   most 1/2.
//! * **Not guaranteed:** an element outside its own bound `b_ij` but below about `2·τ_ic`
//!   (`32·b̄_ic`, at most `64·b̄_ic`), in a row and column that were not sampled, or several
//!   in one chunk that cancel in its projection (with probability at most 1/2 when above
//!   `τ_ic + ρ_ic`). A uniformly slightly-too-loose accumulator shows up in every element, so
//!   in the sampled ones; a single element a few times outside its bound in an unsampled
//!   place is what only `--verify full` sees.
//!
//! The vectors and samples are drawn from a fixed seed ([`sample::SEED`]), so a run is
//! reproducible; the probabilities are over that draw, for errors that do not depend on it.

pub mod check;
mod chunks;
pub mod expected;
mod flat;
pub mod mode;
mod projection;
pub mod sample;

pub use check::{fast_compare, fast_compare_with_bound};
pub use expected::{fast_expected, flat_shape, FastExpected};
pub use mode::{Verification, Verify, CHUNK, FAST_ABOVE_MACS, LONE, VECTORS};
pub use projection::{ChunkWorst, FastPass, ProjectionWorst};
pub use sample::sampled;

#[cfg(test)]
mod tests;
