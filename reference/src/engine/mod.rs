//! The f64 kernel engine: the values and the certified magnitudes of a dense product
//! `c = a·b`, fast, on every core and instruction set this host has. The grouped GEMM's
//! reference (`crate::gemm`: its cases, bound, comparison and reports) calls it and nothing
//! else of it; everything here is how, none of it is what is checked.
//!
//! The API is two functions and the element types they read:
//!
//! * [`gemm`]: `c += a·b` in f64 (`a` f64, `b` f64, f32 or bf16 where it lies, widened in
//!   registers), in blocks of [`KC`] products along `K` (the summation order
//!   `crate::gemm::bound` charges);
//! * [`gemm_magnitude`]: the same values and, beside them, the magnitudes `Σ|a|·|b|` the bound
//!   scales with, as f64 sums or as a certified upper bound of them (f32 fused multiply-adds
//!   or AMX tiles over operands rounded up to bf16, inflated: `bf16mag.rs`);
//! * [`Operand`]: the element types `b` may be held in.
//!
//! Inside: the band level (`band.rs`: one `KC`-deep band's column tile of `b` and its copies),
//! the register tile (`tile.rs`), the instruction-set paths chosen at run time (`isa.rs`:
//! AVX-512 f64, AVX-512 with f32 magnitudes, AMX; portable elsewhere), the magnitudes' f32 and
//! AMX paths with their derivations (`bf16mag.rs`, `amx.rs`), and row-major and transposed
//! copies (`layout.rs`). Every `unsafe` of the reference's GEMM lives here.

#[cfg(target_arch = "x86_64")]
mod amx;
mod band;
#[cfg(target_arch = "x86_64")]
mod bf16mag;
mod isa;
mod kernel;
mod layout;
mod operand;
mod tile;

#[cfg(test)]
pub(crate) use kernel::exact_sum_as_reported;
pub use kernel::{gemm, gemm_magnitude, gemm_magnitude_with, gemm_with, Isa, Operand, KC};
pub(crate) use layout::{matrix, widen};
