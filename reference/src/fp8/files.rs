//! The FP8 grouped GEMM's case directory (docs/protocol.md, "FP8 cases"): a grouped-GEMM
//! case directory (op `grouped_gemm`) whose `case.json` also holds an `fp8` object, the
//! [`Fp8Recipe`]. Its presence is what marks the case as FP8.
//!
//! Inputs stay float32 high-precision values (`dtype` is `f32`) in the grouped GEMM's files;
//! the implementation quantises them itself. For delayed scaling the scales to use are given
//! as `lhs_scale.npy`, `rhs_scale.npy` and, when a backward pass is asked, `dout_scale.npy`:
//! float32, one per scope, each positive and finite. Block-scoped cases also carry their
//! quantised operands and block scales (`super::block_files`). Outputs are the grouped GEMM's.

use ndarray::Array1;
use serde::{Deserialize, Serialize};

use super::case::{Fp8GemmCase, Fp8Recipe, GivenScales, ScalingKind};
use super::op::Fp8Gemm;
use crate::gemm::{Gemm, GemmJson, GemmOutputs, Passes};
use crate::protocol::{FileError, Files, Protocol, Stored};

/// The `case.json` fields of an FP8 case: the grouped GEMM's, and the recipe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fp8Json {
    #[serde(flatten)]
    pub gemm: GemmJson,
    pub fp8: Fp8Recipe,
}

/// The files of the given scales, in the order they are written.
const SCALE_FILES: [&str; 3] = ["lhs_scale.npy", "rhs_scale.npy", "dout_scale.npy"];

impl Protocol for Fp8Gemm {
    const PROTOCOL_OP: &'static str = "grouped_gemm";
    const MARKER: Option<&'static str> = Some("fp8");
    type CaseJson = Fp8Json;

    fn case_json(case: &Fp8GemmCase, passes: Passes) -> Fp8Json {
        Fp8Json {
            gemm: <Gemm as Protocol>::case_json(&case.gemm, passes),
            fp8: case.recipe,
        }
    }

    fn input_files(case: &Fp8GemmCase, passes: Passes) -> Vec<(String, Stored)> {
        let mut files = <Gemm as Protocol>::input_files(&case.gemm, passes);
        if let Some(g) = &case.given_scales {
            let scales = [&g.lhs, &g.rhs, &g.dout];
            let asked = if passes.needs_dout() { 3 } else { 2 };
            for (name, s) in SCALE_FILES.iter().zip(scales).take(asked) {
                let a = Array1::from(s.clone()).into_dyn();
                files.push((name.to_string(), Stored::F32(a)));
            }
        }
        // Block scopes: the quantised operands too, for kernels that take them.
        files.extend(super::block_files::block_input_files(case, passes));
        files
    }

    /// The recipe is checked before any array is read; the given scales after the grouped
    /// GEMM's arrays (their counts depend on the group sizes).
    fn read_case(json: Fp8Json, files: &mut dyn Files) -> Result<(Fp8GemmCase, Passes), FileError> {
        let recipe = json.fp8;
        recipe
            .validate()
            .map_err(|e| FileError::new("case.json", e.to_string()))?;
        let (gemm, passes) = <Gemm as Protocol>::read_case(json.gemm, files)?;
        let mut case = Fp8GemmCase {
            gemm,
            recipe,
            given_scales: None,
        };
        if let ScalingKind::Delayed { .. } = recipe.scaling {
            let m = case.gemm.m();
            let n_row = |kind| case.row_scope(kind).offsets(m).len() - 1;
            let n_rhs = case
                .rhs_scope()
                .offsets(case.gemm.groups() * case.gemm.k())
                .len()
                - 1;
            let lhs = read_scales(files, SCALE_FILES[0], n_row(recipe.lhs.scope))?;
            let rhs = read_scales(files, SCALE_FILES[1], n_rhs)?;
            let dout = match passes.needs_dout() {
                true => read_scales(files, SCALE_FILES[2], n_row(recipe.dout.scope))?,
                false => Vec::new(),
            };
            case.given_scales = Some(GivenScales { lhs, rhs, dout });
        }
        Ok((case, passes))
    }

    fn output_files(outputs: &GemmOutputs) -> Vec<(String, Stored)> {
        <Gemm as Protocol>::output_files(outputs)
    }

    fn read_outputs(
        case: &Fp8GemmCase,
        passes: Passes,
        files: &mut dyn Files,
    ) -> Result<GemmOutputs, FileError> {
        <Gemm as Protocol>::read_outputs(&case.gemm, passes, files)
    }
}

/// `n` float32 scales from `file`, each positive and finite.
fn read_scales(files: &mut dyn Files, file: &str, n: usize) -> Result<Vec<f32>, FileError> {
    let a = files.f32(file, &[n])?;
    if let Some(bad) = a.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
        return Err(FileError::new(
            file,
            format!("scale {bad} is not a positive finite number"),
        ));
    }
    Ok(a.iter().copied().collect())
}
