//! The expert GEMMs of the training model, through any grouped-GEMM implementation.
//!
//! Every expert GEMM of a step — the forward `y = x_g · W_g` and its backward
//! (`dx = dy_g · W_gᵀ`, `dW_g = x_gᵀ · dy_g`) — is one call of an [`ExpertGemm`]. Three kinds:
//!
//! * [`Exact`]: f64 on the f64 master values, nothing rounded (the model's own math, for the
//!   finite-difference test of its hand-written backward);
//! * [`Through<Gemm>`](Through): a grouped-GEMM case of the registry's implementation
//!   (`reference`, `emulate` with a planted bug, `exec:`, `worker:`, `cuda`): the operands
//!   rounded to the training dtype (f32 or bf16, round to nearest even), outputs written in it;
//! * [`Through<Fp8Gemm>`](Through): an FP8 grouped-GEMM case with TE's current-scaling recipe
//!   (E4M3 activations and weights, E5M2 gradients): the implementation quantises the f32
//!   operands itself.
//!
//! The dropped rows of the permuted activations are the GEMM's tail rows; the model reads
//! none of their outputs.

use ndarray::{Array2, Array3, ArrayView2, ArrayView3};

use moecheck_reference::format::{round_to, Format, Overflow};
use moecheck_reference::fp8::{Fp8Gemm, Fp8GemmCase, Fp8Recipe};
use moecheck_reference::gemm::{
    case::offsets, grouped_dgrad, grouped_fwd, grouped_wgrad, Gemm, GemmOutputs, GroupedGemmCase,
    OutArray, Passes, TailContract, Weights,
};
use moecheck_reference::op::{Implementation, Op};

/// Why an expert GEMM gave no result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GemmFailure {
    /// The implementation cannot run this configuration (a refusal: exit 2).
    #[error("{0}")]
    Refused(String),
    /// It ran and failed, or returned something unusable (exit 1).
    #[error("{0}")]
    Failed(String),
}

/// One grouped GEMM per call: rows `[off_g, off_{g+1})` of `x` belong to expert `g`.
pub trait ExpertGemm {
    /// For the log and the report (`reference`, `emulate[inject=…]`, `exact-f64`).
    fn name(&self) -> String;
    /// Whether the GEMMs are a CPU model of a kernel (never a GPU result).
    fn is_model(&self) -> bool;
    /// `y (M, N)`: `x_g · W_g` per group; tail rows are never read.
    fn forward(
        &self,
        x: ArrayView2<f64>,
        w: ArrayView3<f64>,
        sizes: &[usize],
    ) -> Result<Array2<f64>, GemmFailure>;
    /// `(dx (M, K), dW (G, K, N))` for `dy (M, N)`.
    fn backward(
        &self,
        x: ArrayView2<f64>,
        w: ArrayView3<f64>,
        sizes: &[usize],
        dy: ArrayView2<f64>,
    ) -> Result<(Array2<f64>, Array3<f64>), GemmFailure>;
}

/// f64 on the master values: nothing rounded.
#[derive(Debug, Clone, Copy, Default)]
pub struct Exact;

impl ExpertGemm for Exact {
    fn name(&self) -> String {
        "exact-f64".into()
    }
    fn is_model(&self) -> bool {
        false
    }
    fn forward(
        &self,
        x: ArrayView2<f64>,
        w: ArrayView3<f64>,
        sizes: &[usize],
    ) -> Result<Array2<f64>, GemmFailure> {
        Ok(grouped_fwd(x, w, &offsets(sizes)))
    }
    fn backward(
        &self,
        x: ArrayView2<f64>,
        w: ArrayView3<f64>,
        sizes: &[usize],
        dy: ArrayView2<f64>,
    ) -> Result<(Array2<f64>, Array3<f64>), GemmFailure> {
        let off = offsets(sizes);
        Ok((grouped_dgrad(dy, w, &off), grouped_wgrad(x, dy, &off)))
    }
}

/// The registry's `reference` at f32 or bf16, without what a check needs besides the values:
/// the f64 grouped GEMM of the operands rounded to `dtype`, its outputs rounded once to `dtype`
/// (the output format every implementation trained through is asked for) — the same values,
/// bit for bit, as
/// [`Through<Gemm>`](Through) of the reference, which also computes the magnitudes its error
/// bound needs and validates the case (twice the arithmetic).
#[derive(Debug, Clone, Copy)]
pub struct Rounded {
    pub dtype: Format,
}

impl Rounded {
    /// `a` with every value rounded to `dtype` (and widened back to f64).
    fn round<D: ndarray::Dimension>(
        &self,
        a: ndarray::ArrayView<f64, D>,
    ) -> ndarray::Array<f64, D> {
        a.mapv(|v| f64::from(round_operand(v, self.dtype)))
    }
}

/// [`Exact`] on the rounded operands.
impl ExpertGemm for Rounded {
    fn name(&self) -> String {
        "reference".into()
    }
    fn is_model(&self) -> bool {
        false
    }
    fn forward(
        &self,
        x: ArrayView2<f64>,
        w: ArrayView3<f64>,
        sizes: &[usize],
    ) -> Result<Array2<f64>, GemmFailure> {
        let out = Exact.forward(self.round(x).view(), self.round(w).view(), sizes)?;
        Ok(self.round(out.view()))
    }
    fn backward(
        &self,
        x: ArrayView2<f64>,
        w: ArrayView3<f64>,
        sizes: &[usize],
        dy: ArrayView2<f64>,
    ) -> Result<(Array2<f64>, Array3<f64>), GemmFailure> {
        let (x, w, dy) = (self.round(x), self.round(w), self.round(dy));
        let (dx, dw) = Exact.backward(x.view(), w.view(), sizes, dy.view())?;
        Ok((self.round(dx.view()), self.round(dw.view())))
    }
}

/// `v` rounded to `dtype` (f32 or a narrower format) to nearest even, as an f32.
fn round_operand(v: f64, dtype: Format) -> f32 {
    match dtype {
        // f64 → f32 `as` is IEEE round-to-nearest-even with overflow to ±inf: round_to's f32.
        Format::F32 => v as f32,
        _ => round_to(v, dtype, Overflow::Ieee) as f32,
    }
}

/// An implementation of a grouped-GEMM operation `O` (the plain [`Gemm`] or [`Fp8Gemm`]).
pub struct Through<O: Op> {
    imp: Box<dyn Implementation<O>>,
    /// The format the operands are rounded to (the case's dtype and output dtype).
    dtype: Format,
}

impl<O: Op> Through<O> {
    pub fn new(imp: Box<dyn Implementation<O>>, dtype: Format) -> Through<O> {
        Through { imp, dtype }
    }
}

/// A grouped-GEMM case's inputs from the f64 values: `x (M, K)`, `w (G, K, N)`, `dy (M, N)`
/// rounded to `dtype`.
fn gemm_case(
    x: ArrayView2<f64>,
    w: ArrayView3<f64>,
    sizes: &[usize],
    dy: Option<ArrayView2<f64>>,
    dtype: Format,
) -> GroupedGemmCase {
    let r = |v: &f64| round_operand(*v, dtype);
    GroupedGemmCase {
        lhs: x.map(r),
        rhs: Weights::narrowed(w.map(r), dtype),
        group_sizes: sizes.to_vec(),
        dout: dy.map(|d| d.map(r)),
        dtype,
        out_dtype: dtype,
        tail: TailContract::Zero,
    }
}

/// What turns the f64 operands into a case of `O`.
pub trait GemmLike: Op<Ask = Passes, Outputs = GemmOutputs> {
    fn case(gemm: GroupedGemmCase) -> Self::Case;
}

impl GemmLike for Gemm {
    fn case(gemm: GroupedGemmCase) -> GroupedGemmCase {
        gemm
    }
}

impl GemmLike for Fp8Gemm {
    /// TE's current-scaling recipe ([`Fp8Recipe::default`]) on f32 operands.
    fn case(gemm: GroupedGemmCase) -> Fp8GemmCase {
        Fp8GemmCase {
            gemm,
            recipe: Fp8Recipe::default(),
            given_scales: None,
        }
    }
}

impl<O: GemmLike> Through<O> {
    fn call(&self, case: GroupedGemmCase, passes: Passes) -> Result<GemmOutputs, GemmFailure> {
        let case = O::case(case);
        O::validate(&case, passes).map_err(|e| GemmFailure::Failed(format!("{e}")))?;
        self.imp
            .supports(&case, passes)
            .map_err(GemmFailure::Refused)?;
        self.imp
            .run(&case, passes)
            .map_err(|e| GemmFailure::Failed(e.to_string()))
    }
}

/// `Some(array)` of the expected shape, or the failure naming the output.
fn output<D: ndarray::Dimension>(
    got: Option<OutArray<D>>,
    name: &str,
    shape: &[usize],
) -> Result<ndarray::Array<f64, D>, GemmFailure> {
    let a =
        got.ok_or_else(|| GemmFailure::Failed(format!("the implementation wrote no {name}")))?;
    if a.shape() != shape {
        return Err(GemmFailure::Failed(format!(
            "{name} has shape {:?}, expected {shape:?}",
            a.shape()
        )));
    }
    Ok(a.into_f64())
}

impl<O: GemmLike> ExpertGemm for Through<O> {
    fn name(&self) -> String {
        self.imp.name()
    }
    fn is_model(&self) -> bool {
        self.imp.is_model()
    }
    fn forward(
        &self,
        x: ArrayView2<f64>,
        w: ArrayView3<f64>,
        sizes: &[usize],
    ) -> Result<Array2<f64>, GemmFailure> {
        let got = self.call(gemm_case(x, w, sizes, None, self.dtype), Passes::FWD)?;
        output(got.out, "out", &[x.nrows(), w.shape()[2]])
    }
    fn backward(
        &self,
        x: ArrayView2<f64>,
        w: ArrayView3<f64>,
        sizes: &[usize],
        dy: ArrayView2<f64>,
    ) -> Result<(Array2<f64>, Array3<f64>), GemmFailure> {
        let passes = Passes {
            fwd: false,
            dgrad: true,
            wgrad: true,
        };
        let got = self.call(gemm_case(x, w, sizes, Some(dy), self.dtype), passes)?;
        Ok((
            output(got.dlhs, "dlhs", &[x.nrows(), x.ncols()])?,
            output(got.drhs, "drhs", w.shape())?,
        ))
    }
}

/// The format of the expert GEMMs' operands (`--dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmDtype {
    F32,
    Bf16,
    /// TE's FP8 current scaling ([`Fp8Recipe::default`]) on f32 operands.
    Fp8,
}

impl GemmDtype {
    pub fn name(self) -> &'static str {
        match self {
            GemmDtype::F32 => "f32",
            GemmDtype::Bf16 => "bf16",
            GemmDtype::Fp8 => "fp8",
        }
    }
}

/// The expert GEMMs of the registry's `choice` at `dtype`: a grouped-GEMM implementation
/// (f32, bf16) or an FP8 grouped-GEMM implementation (fp8); the error is the registry's one
/// line.
pub fn build(
    choice: &crate::registry::Choice,
    dtype: GemmDtype,
) -> Result<Box<dyn ExpertGemm>, String> {
    use crate::registry;
    if choice.name.trim() == "reference" && dtype != GemmDtype::Fp8 {
        // Refuses the same flags as the registry would, then skips the check's extra work.
        registry::build::<Gemm>(choice)?;
        let format = if dtype == GemmDtype::F32 {
            Format::F32
        } else {
            Format::Bf16
        };
        return Ok(Box::new(Rounded { dtype: format }));
    }
    Ok(match dtype {
        GemmDtype::F32 => Box::new(Through::new(registry::build::<Gemm>(choice)?, Format::F32)),
        GemmDtype::Bf16 => Box::new(Through::new(registry::build::<Gemm>(choice)?, Format::Bf16)),
        GemmDtype::Fp8 => Box::new(Through::new(
            registry::build::<Fp8Gemm>(choice)?,
            Format::F32,
        )),
    })
}
