//! The grouped GEMM's case directory (docs/protocol.md, op `grouped_gemm`).
//!
//! Inputs: `case.json`, `lhs.npy (M,K) f32`, `rhs.npy (G,K,N) f32`, `group_sizes.npy (G,)
//! i32` and, when a backward pass is asked, `dout.npy (M,N) f32`. Outputs: `out.npy (M,N)`,
//! `dlhs.npy (M,K)`, `drhs.npy (G,K,N)`, float32 or float64.

use ndarray::{Array1, Ix2, Ix3};
use serde::{Deserialize, Serialize};

use super::case::{GemmOutputs, GroupedGemmCase, Pass, Passes, TailContract};
use super::held::OutArray;
use super::op::Gemm;
use super::weights::Weights;
use crate::format::Format;
use crate::protocol::{dims, FileError, Files, Input, Protocol, Stored};

/// The `case.json` fields of a grouped GEMM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GemmJson {
    /// The passes the implementation must compute: any of `"fwd"`, `"dgrad"`, `"wgrad"`.
    pub passes: Vec<Pass>,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub groups: usize,
    /// Every input value is exactly representable in this format (`f32`, `bf16`, `f16`).
    pub dtype: Format,
    /// The format the implementation is expected to compute its outputs in.
    pub out_dtype: Format,
    /// `"zero"`: tail rows of out/dlhs must be 0; `"ignored"`: they are not checked.
    pub tail: TailContract,
}

/// Reads `(G,)` non-negative group sizes from `file`.
pub fn read_group_sizes(
    files: &mut dyn Files,
    file: &str,
    groups: usize,
) -> Result<Vec<usize>, FileError> {
    let raw = files.int(file, &[groups])?;
    let sizes: Vec<usize> = raw
        .iter()
        .enumerate()
        .map(|(g, &s)| {
            usize::try_from(s)
                .map_err(|_| FileError::new(file, format!("group {g} has negative size {s}")))
        })
        .collect::<Result<_, _>>()?;
    // Every later sum of the sizes (offsets, `sum <= M`) is then safe from wrapping.
    sizes
        .iter()
        .try_fold(0usize, |sum, &s| sum.checked_add(s))
        .ok_or_else(|| {
            FileError::new(
                file,
                format!(
                    "the group sizes sum past {} (usize's largest value)",
                    usize::MAX
                ),
            )
        })?;
    Ok(sizes)
}

impl Protocol for Gemm {
    const PROTOCOL_OP: &'static str = "grouped_gemm";
    type CaseJson = GemmJson;

    fn case_json(case: &GroupedGemmCase, passes: Passes) -> GemmJson {
        GemmJson {
            passes: passes.iter().collect(),
            m: case.m(),
            k: case.k(),
            n: case.n(),
            groups: case.groups(),
            dtype: case.dtype,
            out_dtype: case.out_dtype,
            tail: case.tail,
        }
    }

    fn input_files(case: &GroupedGemmCase, passes: Passes) -> Vec<(String, Stored)> {
        Self::inputs(case, passes, false)
            .into_iter()
            .map(|(name, a)| (name, a.into_stored()))
            .collect()
    }

    /// `lhs`, `rhs` and `dout` lent from the case (a bf16 weight widened as it is written);
    /// `compact` with `--dtype bf16`: all three as bf16 bit patterns (every value of a bf16
    /// case is a bf16 value).
    fn inputs(case: &GroupedGemmCase, passes: Passes, compact: bool) -> Vec<(String, Input<'_>)> {
        let sizes: Array1<i32> = case.group_sizes.iter().map(|s| *s as i32).collect();
        let bits = compact && case.dtype == Format::Bf16;
        fn f32_input(a: ndarray::ArrayViewD<'_, f32>, bits: bool) -> Input<'_> {
            if bits {
                Input::F32AsBf16Bits(a)
            } else {
                Input::F32(a)
            }
        }
        let rhs = match &case.rhs {
            Weights::F32(w) => f32_input(w.view().into_dyn(), bits),
            Weights::Bf16(w) if bits => Input::Bf16Bits(w.view().into_dyn()),
            Weights::Bf16(w) => Input::Bf16AsF32(w.view().into_dyn()),
        };
        let mut files = vec![
            (
                "lhs.npy".into(),
                f32_input(case.lhs.view().into_dyn(), bits),
            ),
            ("rhs.npy".into(), rhs),
            (
                "group_sizes.npy".into(),
                Input::Stored(Stored::I32(sizes.into_dyn())),
            ),
        ];
        if let (true, Some(d)) = (passes.needs_dout(), &case.dout) {
            files.push(("dout.npy".into(), f32_input(d.view().into_dyn(), bits)));
        }
        files
    }

    fn read_case(
        json: GemmJson,
        files: &mut dyn Files,
    ) -> Result<(GroupedGemmCase, Passes), FileError> {
        let mut passes = Passes::default();
        json.passes.iter().for_each(|p| passes.insert(*p));
        if passes.is_empty() {
            return Err(FileError::new("case.json", "passes is empty"));
        }
        let (m, k, n, g) = (json.m, json.k, json.n, json.groups);
        let lhs = dims::<Ix2, _>("lhs.npy", files.f32("lhs.npy", &[m, k])?)?;
        let rhs = dims::<Ix3, _>("rhs.npy", files.f32("rhs.npy", &[g, k, n])?)?;
        // Held in bf16 when the declared dtype is bf16 and every value is one.
        let rhs = Weights::narrowed(rhs, json.dtype);
        let group_sizes = read_group_sizes(files, "group_sizes.npy", g)?;
        let dout = match passes.needs_dout() {
            true => Some(dims::<Ix2, _>("dout.npy", files.f32("dout.npy", &[m, n])?)?),
            false => None,
        };
        let case = GroupedGemmCase {
            lhs,
            rhs,
            group_sizes,
            dout,
            dtype: json.dtype,
            out_dtype: json.out_dtype,
            tail: json.tail,
        };
        Ok((case, passes))
    }

    /// Outputs are written as they are held: float32 or float64.
    fn output_files(got: &GemmOutputs) -> Vec<(String, Stored)> {
        let mut files = Vec::new();
        if let Some(a) = &got.out {
            files.push(("out.npy".into(), a.stored()));
        }
        if let Some(a) = &got.dlhs {
            files.push(("dlhs.npy".into(), a.stored()));
        }
        if let Some(a) = &got.drhs {
            files.push(("drhs.npy".into(), a.stored()));
        }
        files
    }

    /// Outputs are held as they were written: float32 stays float32.
    fn read_outputs(
        case: &GroupedGemmCase,
        passes: Passes,
        files: &mut dyn Files,
    ) -> Result<GemmOutputs, FileError> {
        let (m, k, n, g) = (case.m(), case.k(), case.n(), case.groups());
        let mut got = GemmOutputs::default();
        let mut read = |name: &str, shape: &[usize]| files.float_stored(name, shape);
        if passes.fwd {
            got.out = Some(OutArray::from_stored("out.npy", read("out.npy", &[m, n])?)?);
        }
        if passes.dgrad {
            got.dlhs = Some(OutArray::from_stored(
                "dlhs.npy",
                read("dlhs.npy", &[m, k])?,
            )?);
        }
        if passes.wgrad {
            got.drhs = Some(OutArray::from_stored(
                "drhs.npy",
                read("drhs.npy", &[g, k, n])?,
            )?);
        }
        Ok(got)
    }
}
