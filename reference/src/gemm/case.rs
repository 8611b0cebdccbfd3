//! A grouped-GEMM case: inputs, declared formats, the tail contract, and validation.

use ndarray::{Array2, Array3, Axis, Ix2, Ix3};
use serde::{Deserialize, Serialize};

use super::held::{Held, OutArray, OutArray2, OutArray3, OutView, OutView2};
use super::weights::{bf16_to_f32, Weights};
use crate::format::Format;
use crate::Error;

/// One of the three passes of a grouped GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pass {
    /// `out = lhs_g · rhs_g`
    Fwd,
    /// `dlhs = dout_g · rhs_gᵀ`
    Dgrad,
    /// `drhs = lhs_gᵀ · dout_g`
    Wgrad,
}

impl Pass {
    pub const ALL: [Pass; 3] = [Pass::Fwd, Pass::Dgrad, Pass::Wgrad];

    pub fn name(self) -> &'static str {
        match self {
            Pass::Fwd => "fwd",
            Pass::Dgrad => "dgrad",
            Pass::Wgrad => "wgrad",
        }
    }

    /// The name of the output this pass writes (`out`, `dlhs`, `drhs`).
    pub fn output_name(self) -> &'static str {
        match self {
            Pass::Fwd => "out",
            Pass::Dgrad => "dlhs",
            Pass::Wgrad => "drhs",
        }
    }

    pub fn parse(s: &str) -> Option<Pass> {
        match s.trim() {
            "fwd" | "forward" => Some(Pass::Fwd),
            "dgrad" => Some(Pass::Dgrad),
            "wgrad" => Some(Pass::Wgrad),
            _ => None,
        }
    }
}

impl std::fmt::Display for Pass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Passes {
    pub fwd: bool,
    pub dgrad: bool,
    pub wgrad: bool,
}

impl Passes {
    pub const ALL: Passes = Passes {
        fwd: true,
        dgrad: true,
        wgrad: true,
    };
    pub const FWD: Passes = Passes {
        fwd: true,
        dgrad: false,
        wgrad: false,
    };

    pub fn only(pass: Pass) -> Passes {
        let mut p = Passes::default();
        p.insert(pass);
        p
    }
    pub fn insert(&mut self, pass: Pass) {
        match pass {
            Pass::Fwd => self.fwd = true,
            Pass::Dgrad => self.dgrad = true,
            Pass::Wgrad => self.wgrad = true,
        }
    }
    pub fn contains(&self, pass: Pass) -> bool {
        match pass {
            Pass::Fwd => self.fwd,
            Pass::Dgrad => self.dgrad,
            Pass::Wgrad => self.wgrad,
        }
    }
    /// Whether a backward pass (which needs `dout`) is asked.
    pub fn needs_dout(&self) -> bool {
        self.dgrad || self.wgrad
    }
    pub fn is_empty(&self) -> bool {
        !(self.fwd || self.dgrad || self.wgrad)
    }
    pub fn iter(self) -> impl Iterator<Item = Pass> {
        Pass::ALL.into_iter().filter(move |p| self.contains(*p))
    }
    /// Parses `fwd,dgrad,wgrad` (any subset, any order, or `all`).
    pub fn parse(s: &str) -> Result<Passes, String> {
        if s.trim() == "all" {
            return Ok(Passes::ALL);
        }
        let mut p = Passes::default();
        for part in s.split(',') {
            let pass = Pass::parse(part).ok_or_else(|| {
                format!(
                    "unknown pass '{}' (expected fwd, dgrad, wgrad or all)",
                    part.trim()
                )
            })?;
            p.insert(pass);
        }
        Ok(p)
    }
    /// The names, comma-separated.
    pub fn names(&self) -> Vec<&'static str> {
        self.iter().map(Pass::name).collect()
    }
}

impl std::fmt::Display for Passes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.names().join(","))
    }
}

/// What the check demands of tail rows (rows `>= Σ group_sizes`) of `out` and `dlhs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TailContract {
    /// Tail rows of `out` and `dlhs` must be exactly zero (the default; what JAX's
    /// `ragged_dot` does).
    #[default]
    Zero,
    /// Tail rows of `out` and `dlhs` are not checked (for implementations that document
    /// uninitialised tails). `drhs` must still ignore tail `dout`.
    Ignored,
}

/// Inputs of a grouped GEMM, with the formats the implementation declares.
///
/// Values are stored as f32 (the weights as bf16 when they are bf16 values, [`Weights`]) and
/// must be exactly representable in `dtype` ([`GroupedGemmCase::validate`] checks it). `dout` is present when a backward pass is asked.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupedGemmCase {
    /// `(M, K)`
    pub lhs: Array2<f32>,
    /// `(G, K, N)`, held in bf16 when its values are bf16 values ([`Weights`]).
    pub rhs: Weights,
    /// `(G,)`, summing to at most `M`.
    pub group_sizes: Vec<usize>,
    /// `(M, N)`, needed by dgrad and wgrad.
    pub dout: Option<Array2<f32>>,
    /// The format every input value is representable in.
    pub dtype: Format,
    /// The format the implementation writes its outputs in.
    pub out_dtype: Format,
    pub tail: TailContract,
}

impl GroupedGemmCase {
    pub fn m(&self) -> usize {
        self.lhs.nrows()
    }
    pub fn k(&self) -> usize {
        self.lhs.ncols()
    }
    pub fn n(&self) -> usize {
        self.rhs.shape()[2]
    }
    pub fn groups(&self) -> usize {
        self.group_sizes.len()
    }
    /// `[off_0 = 0, off_1, …, off_G = Σ size_g]`, length `G + 1`.
    pub fn offsets(&self) -> Vec<usize> {
        offsets(&self.group_sizes)
    }
    /// `Σ size_g`: the first tail row.
    pub fn rows_used(&self) -> usize {
        self.group_sizes.iter().sum()
    }

    /// Checks shapes, `Σ size_g <= M`, finiteness, and that every value is representable in
    /// `dtype`. The first violation found is returned, naming the array and index.
    pub fn validate(&self, passes: Passes) -> Result<(), Error> {
        let (m, k) = self.lhs.dim();
        let (g, rk, n) = self.rhs.dim();
        if g != self.group_sizes.len() || rk != k {
            return Err(Error::ShapeMismatch {
                op: "grouped_gemm",
                what: "rhs",
                expected: vec![self.group_sizes.len(), k, n],
                got: vec![g, rk, n],
            });
        }
        let sum = self.rows_used();
        if sum > m {
            return Err(Error::GroupSizesExceedRows { sum, m });
        }
        if passes.needs_dout() {
            let pass = if passes.dgrad { "dgrad" } else { "wgrad" };
            let dout = self
                .dout
                .as_ref()
                .ok_or(Error::MissingOperand { pass, what: "dout" })?;
            if dout.dim() != (m, n) {
                return Err(Error::ShapeMismatch {
                    op: "grouped_gemm",
                    what: "dout",
                    expected: vec![m, n],
                    got: dout.shape().to_vec(),
                });
            }
            if !all_representable(dout.view(), self.dtype) {
                check_values(
                    "dout",
                    dout.indexed_iter().map(|((i, j), v)| (vec![i, j], *v)),
                    self.dtype,
                )?;
            }
        }
        if !all_representable(self.lhs.view(), self.dtype) {
            check_values(
                "lhs",
                self.lhs.indexed_iter().map(|((i, j), v)| (vec![i, j], *v)),
                self.dtype,
            )?;
        }
        let rhs_ok = match &self.rhs {
            Weights::F32(a) => all_representable(a.view(), self.dtype),
            // bf16 values are f32 values: every bf16 is a bf16, f32 and f64 value.
            Weights::Bf16(a) => all_representable_bf16(a, self.dtype),
        };
        if !rhs_ok {
            let at = |((a, b, c), v): ((usize, usize, usize), f32)| (vec![a, b, c], v);
            match &self.rhs {
                Weights::F32(w) => check_values(
                    "rhs",
                    w.indexed_iter().map(|(i, v)| at((i, *v))),
                    self.dtype,
                )?,
                Weights::Bf16(w) => check_values(
                    "rhs",
                    w.indexed_iter().map(|(i, v)| at((i, bf16_to_f32(*v)))),
                    self.dtype,
                )?,
            }
        }
        Ok(())
    }
}

/// Prefix sums of `sizes`: `[0, s0, s0+s1, …]`.
pub fn offsets(sizes: &[usize]) -> Vec<usize> {
    let mut off = Vec::with_capacity(sizes.len() + 1);
    let mut acc = 0;
    off.push(0);
    for s in sizes {
        acc += s;
        off.push(acc);
    }
    off
}

/// Whether every value is finite and exactly representable in `dtype`: one read of the
/// array, by bit tests where the format allows (an f32 is a bf16 value exactly when its low 16
/// bits are 0, bf16 having f32's exponent range). Only when this fails is the array walked
/// again, by [`check_values`], to name the first bad element.
fn all_representable<D: ndarray::Dimension>(
    values: ndarray::ArrayView<f32, D>,
    dtype: Format,
) -> bool {
    // Each block is tested without stopping at its first bad value, so the bit tests
    // vectorise; the blocks run on every core.
    let block_ok = |b: &[f32]| match dtype {
        Format::F32 | Format::F64 => b.iter().fold(true, |ok, v| ok & v.is_finite()),
        Format::Bf16 => b.iter().fold(true, |ok, v| {
            ok & v.is_finite() & (v.to_bits() & 0xFFFF == 0)
        }),
        _ => b.iter().all(|v| dtype.represents(f64::from(*v))),
    };
    match values.as_slice_memory_order() {
        Some(all) => crate::par::all(all, block_ok),
        None => values.iter().all(|v| block_ok(std::slice::from_ref(v))),
    }
}

/// Whether every bf16 weight is finite (and, for a format narrower than bf16, representable
/// in `dtype`): [`all_representable`] for weights held in bf16.
fn all_representable_bf16(w: &Array3<half::bf16>, dtype: Format) -> bool {
    let block_ok = |b: &[half::bf16]| match dtype {
        // A bf16 is finite unless its exponent bits are all ones.
        Format::Bf16 | Format::F32 | Format::F64 => b
            .iter()
            .fold(true, |ok, v| ok & (v.to_bits() & 0x7F80 != 0x7F80)),
        _ => b.iter().all(|v| dtype.represents(f64::from(*v))),
    };
    match w.as_slice_memory_order() {
        Some(all) => crate::par::all(all, block_ok),
        None => w.iter().all(|v| block_ok(std::slice::from_ref(v))),
    }
}

fn check_values(
    what: &'static str,
    values: impl Iterator<Item = (Vec<usize>, f32)>,
    dtype: Format,
) -> Result<(), Error> {
    for (index, v) in values {
        let v = v as f64;
        if !v.is_finite() {
            return Err(Error::NonFinite {
                what,
                index,
                value: v,
            });
        }
        if !dtype.represents(v) {
            return Err(Error::NotRepresentable {
                what,
                index,
                value: v,
                format: dtype.name(),
            });
        }
    }
    Ok(())
}

/// The outputs of the asked passes; a pass that was not run is `None`.
#[derive(Debug, Clone, PartialEq)]
pub struct Outputs<A2, A3> {
    /// `(M, N)`
    pub out: Option<A2>,
    /// `(M, K)`
    pub dlhs: Option<A2>,
    /// `(G, K, N)`
    pub drhs: Option<A3>,
}

impl<A2, A3> Default for Outputs<A2, A3> {
    fn default() -> Self {
        Outputs {
            out: None,
            dlhs: None,
            drhs: None,
        }
    }
}

/// Outputs of an implementation, each held in the precision it was written in
/// ([`OutArray`]: f32, or f64).
pub type GemmOutputs = Outputs<OutArray2, OutArray3>;

/// Outputs computed in f64: the reference's values and magnitudes.
pub type WideOutputs = Outputs<Array2<f64>, Array3<f64>>;

impl From<WideOutputs> for GemmOutputs {
    fn from(w: WideOutputs) -> GemmOutputs {
        GemmOutputs {
            out: w.out.map(OutArray::F64),
            dlhs: w.dlhs.map(OutArray::F64),
            drhs: w.drhs.map(OutArray::F64),
        }
    }
}

impl<A2: Held<Ix2>, A3: Held<Ix3>> Outputs<A2, A3> {
    /// Group `g`'s part of `pass`'s output: rows `off[g]..off[g + 1]` of `out` (fwd) or `dlhs`
    /// (dgrad), `drhs[g]` (wgrad); `None` when the pass is missing.
    ///
    /// # Panics
    /// When the output is smaller than `off` or `g` says.
    pub fn group(&self, pass: Pass, g: usize, off: &[usize]) -> Option<OutView2<'_>> {
        Some(match pass {
            Pass::Fwd => self.out.as_ref()?.held().rows(off[g], off[g + 1]),
            Pass::Dgrad => self.dlhs.as_ref()?.held().rows(off[g], off[g + 1]),
            Pass::Wgrad => {
                let d = self.drhs.as_ref()?.held();
                match d {
                    OutView::F32(a) => OutView::F32(a.index_axis_move(Axis(0), g)),
                    OutView::F64(a) => OutView::F64(a.index_axis_move(Axis(0), g)),
                }
            }
        })
    }
}

impl GemmOutputs {
    /// Every output widened to f64 (a copy of those held in f32).
    pub fn to_f64(&self) -> WideOutputs {
        WideOutputs {
            out: self.out.as_ref().map(|a| a.f64().into_owned()),
            dlhs: self.dlhs.as_ref().map(|a| a.f64().into_owned()),
            drhs: self.drhs.as_ref().map(|a| a.f64().into_owned()),
        }
    }
}

#[cfg(test)]
#[path = "case_tests.rs"]
mod tests;
