//! # moecheck-properties
//!
//! proptest strategies and properties for every operation moecheck checks, generic over the
//! implementation under test ([`moecheck_reference::op::Implementation`]).
//!
//! * [`property`]: the one property type, [`Property<O>`](Property), and [`PropertyOp`], what
//!   an operation adds to join: its case arguments and its properties.
//! * [`runner`]: the one property loop (deterministic seeds, redrawn rejects, quiet
//!   shrinking).
//! * Per operation, its strategies and properties: [`gemm`], [`fp8`], [`routing`], [`moe`].
//!
//! ## Checking your own kernel from its crate's tests
//!
//! Add `moecheck-properties` and `moecheck-reference` as dev-dependencies, implement
//! [`Implementation`](moecheck_reference::op::Implementation) for your kernel (its name, the
//! precision it declares — the error bound is derived from it — and one run), and check every
//! property of the operation. Here the "kernel" is a plain f32 grouped GEMM, forward and both
//! gradients, rounding each output once to the case's output format:
//!
//! ```
//! use moecheck_properties::{check, Outcome, PropertyOp, RunConfig};
//! use moecheck_reference::format::{round_to, Overflow};
//! use moecheck_reference::gemm::{Accumulator, Gemm, GemmOutputs, GroupedGemmCase, Passes, Precision};
//! use moecheck_reference::op::{Implementation, RunError};
//! use ndarray::{Array2, Array3};
//!
//! /// A grouped GEMM in f32: `out[m] = lhs[m] @ rhs[g]` for the rows `m` of group `g`, tail
//! /// rows 0. `wrong_expert` plants a bug: group `g` multiplies by expert `g + 1`'s weights.
//! struct MyKernel {
//!     wrong_expert: bool,
//! }
//!
//! impl Implementation<Gemm> for MyKernel {
//!     fn name(&self) -> String {
//!         "my-kernel".into()
//!     }
//!     fn is_model(&self) -> bool {
//!         false
//!     }
//!     fn precision(&self, case: &GroupedGemmCase) -> Precision {
//!         Precision {
//!             input: case.dtype,
//!             accumulator: Accumulator::any_order(moecheck_reference::format::Format::F32),
//!             output: case.out_dtype,
//!         }
//!     }
//!     fn run(&self, case: &GroupedGemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
//!         let (m, k) = case.lhs.dim();
//!         let (g, _, n) = case.rhs.dim();
//!         // Outputs in f32 (an f64 array is taken too: `OutArray` holds either).
//!         let round = |x: f32| round_to(f64::from(x), case.out_dtype, Overflow::Ieee) as f32;
//!         let mut out = Array2::<f32>::zeros((m, n));
//!         let mut dlhs = Array2::<f32>::zeros((m, k));
//!         let mut drhs = Array3::<f32>::zeros((g, k, n));
//!         let mut start = 0;
//!         for (group, &rows) in case.group_sizes.iter().enumerate() {
//!             let e = if self.wrong_expert { (group + 1) % g } else { group };
//!             for r in start..start + rows {
//!                 for j in 0..n {
//!                     let acc: f32 = (0..k).map(|i| case.lhs[[r, i]] * case.rhs.at(e, i, j)).sum();
//!                     out[[r, j]] = round(acc);
//!                 }
//!                 if let Some(dout) = &case.dout {
//!                     for i in 0..k {
//!                         let acc: f32 = (0..n).map(|j| dout[[r, j]] * case.rhs.at(e, i, j)).sum();
//!                         dlhs[[r, i]] = round(acc);
//!                     }
//!                 }
//!             }
//!             if let Some(dout) = &case.dout {
//!                 for i in 0..k {
//!                     for j in 0..n {
//!                         let acc: f32 =
//!                             (start..start + rows).map(|r| case.lhs[[r, i]] * dout[[r, j]]).sum();
//!                         drhs[[group, i, j]] = round(acc);
//!                     }
//!                 }
//!             }
//!             start += rows;
//!         }
//!         Ok(GemmOutputs {
//!             out: passes.fwd.then_some(out.into()),
//!             dlhs: passes.dgrad.then_some(dlhs.into()),
//!             drhs: passes.wgrad.then_some(drhs.into()),
//!         })
//!     }
//! }
//!
//! // Every property of the grouped GEMM, on 16 cases each (RunConfig::default() reads
//! // PROPTEST_CASES).
//! let config = RunConfig::new(16, 42);
//! for property in Gemm::properties() {
//!     let kernel = MyKernel { wrong_expert: false };
//!     if let Outcome::Failed { reason, minimal_case, .. } = check(&property, &kernel, &config) {
//!         panic!("{}: {reason}\nminimal case: {minimal_case}", property.name);
//!     }
//! }
//!
//! // The planted bug is caught, with a shrunk minimal case.
//! let buggy = MyKernel { wrong_expert: true };
//! let caught = Gemm::properties().iter().any(|p| !check(p, &buggy, &config).passed());
//! assert!(caught);
//! ```
//!
//! A kernel that forgot to zero the rows past the last group, or paired a group with the
//! wrong expert, fails here with the shrunk arguments of a minimal case. The same properties
//! run from the command line against a program in any language: `moecheck prop` (README,
//! "proptest in CI").

pub mod coverage;
pub mod fp8;
pub mod gemm;
pub mod moe;
pub mod property;
pub mod routing;
pub mod runner;

pub use property::{by_name, check, check_in, check_observed, verified, Property, PropertyOp};
pub use runner::{
    run_property, run_property_in, run_property_observed, run_property_with_rejects, CaseResult,
    Coverage, Outcome, RunConfig, Scope, Step, DEFAULT_CASES, DEFAULT_MAX_SHRINK_ITERS,
    DEFAULT_SEED, OUTSIDE_BASE, OUTSIDE_PER_CASE, REFUSALS_PER_CASE,
};
