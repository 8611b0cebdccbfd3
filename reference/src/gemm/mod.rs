//! The grouped GEMM: the operation, the contract moecheck enforces, and the error bound.
//!
//! ## The operation
//! Inputs `lhs (M, K)`, `rhs (G, K, N)` and `group_sizes (G,)` with `Σ size_g <= M`. Group `g`
//! owns rows `[off_g, off_g + size_g)` with `off_g = Σ_{h<g} size_h`. For `r` in group `g`:
//!
//! * fwd:   `out[r, n]     = Σ_k lhs[r, k] · rhs[g, k, n]`
//! * dgrad: `dlhs[r, k]    = Σ_n dout[r, n] · rhs[g, k, n]`   (`dout_g · rhs_gᵀ`)
//! * wgrad: `drhs[g, k, n] = Σ_{r in g} lhs[r, k] · dout[r, n]` (`lhs_gᵀ · dout_g`)
//!
//! ## The contract (enforced by every check, in one place: [`compare`])
//! * Rows `r >= Σ size_g` are **dropped tokens** (the tail). `out` and `dlhs` are exactly 0
//!   there, and `dout` on those rows must not change `drhs` (it is absent from the sum above).
//!   [`TailContract::Ignored`] relaxes the first half to "not checked" for implementations
//!   that document uninitialised tails; reports then say so.
//! * `drhs` of an empty expert is exactly 0.
//! * `M = 0`, `K = 0`, `G = 1`, all-empty and all-in-one-expert are legal inputs. With `K = 0`
//!   `out` is exactly 0 everywhere.
//!
//! Exactness follows from the bound, not from special cases: where every product is zero
//! (tails, empty experts, `K = 0`) the bound is zero, so anything but an exact 0 fails.
//!
//! ## Error model
//! See [`bound`]: `|ŷ - y| <= γ(n, u_acc)·(1+u_out)·Σ|a·b| + u_out·|y| + η_out/2 + …` per
//! element, with `n` the reduction depth of that element.

pub mod bound;
pub mod case;
pub mod compare;
pub mod fast;
mod files;
mod fit;
mod grouped;
pub mod held;
mod judge;
mod op;
mod report;
pub mod shard;
pub mod stream;
pub mod weights;

pub use bound::{Accumulator, ErrorBound, Precision};
pub use case::{GemmOutputs, GroupedGemmCase, Outputs, Pass, Passes, TailContract, WideOutputs};
pub use compare::{
    compare_outputs, compare_outputs_with_bound, compare_streamed, CaseReport, GemmAt, GroupId,
    GroupStats, PassReport, Worst,
};
pub use fast::Verify;
pub use files::{read_group_sizes, GemmJson};
pub use grouped::{
    grouped_dgrad, grouped_fwd, grouped_fwd_into, grouped_wgrad, reference, ReferenceResult, CHUNK,
};
pub use held::{OutArray, OutArray2, OutArray3, OutView, OutView2};
pub use op::{ByMode, Gemm, GemmDeclaration, Streamed};
pub use report::{
    hints, render_case, render_fast, render_kinds, render_passes, GemmDocument, Shape,
};
pub use weights::{WeightView, Weights};
