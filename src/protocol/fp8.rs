//! The FP8 extension of the case-directory protocol (docs/protocol.md, "FP8 cases").
//!
//! An FP8 case is a v1 case directory whose `case.json` has an `fp8` object (the
//! [`Fp8Recipe`]: per-operand format and scaling scope, saturation, accumulation model,
//! current or delayed scaling). Inputs stay float32 high-precision values (`dtype` is `f32`);
//! the implementation quantises them itself. For delayed scaling the scales to use are given
//! as `lhs_scale.npy`, `rhs_scale.npy`, `dout_scale.npy` (float32, one per scope).

use std::path::Path;

use ndarray::{Array1, Ix1};

use moecheck_reference::fp8::{Fp8GemmCase, Fp8Recipe, GivenScales, ScalingKind};
use moecheck_reference::gemm::Passes;

use super::{file_err, read_shaped, write_npy, ProtocolError};

/// Writes an FP8 case: the v1 files, `case.json` with the `fp8` object, and the given scales.
pub fn write_fp8_case(dir: &Path, case: &Fp8GemmCase, passes: Passes) -> Result<(), ProtocolError> {
    super::legacy::write_case(dir, &case.gemm, passes)?;
    let path = dir.join("case.json");
    let text = std::fs::read_to_string(&path).map_err(|e| file_err(&path, e))?;
    let mut json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| file_err(&path, e))?;
    json["fp8"] = serde_json::to_value(case.recipe).map_err(|e| file_err(&path, e))?;
    let text = serde_json::to_string_pretty(&json).map_err(|e| file_err(&path, e))?;
    std::fs::write(&path, text + "\n").map_err(|e| file_err(&path, e))?;
    if let Some(g) = &case.given_scales {
        write_npy(&dir.join("lhs_scale.npy"), &Array1::from(g.lhs.clone()))?;
        write_npy(&dir.join("rhs_scale.npy"), &Array1::from(g.rhs.clone()))?;
        if passes.needs_dout() {
            write_npy(&dir.join("dout_scale.npy"), &Array1::from(g.dout.clone()))?;
        }
    }
    Ok(())
}

/// Reads an FP8 case: `None` when `case.json` has no `fp8` object (a plain v1 case).
pub fn read_fp8_case(dir: &Path) -> Result<Option<(Fp8GemmCase, Passes)>, ProtocolError> {
    let path = dir.join("case.json");
    if !path.is_file() {
        return Ok(None); // read_case reports the missing directory or file
    }
    let text = std::fs::read_to_string(&path).map_err(|e| file_err(&path, e))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| file_err(&path, e))?;
    let Some(fp8) = json.get("fp8") else {
        return Ok(None);
    };
    let recipe: Fp8Recipe =
        serde_json::from_value(fp8.clone()).map_err(|e| file_err(&path, format!("fp8: {e}")))?;
    recipe.validate().map_err(|e| file_err(&path, e))?;
    let (gemm, passes) = super::legacy::read_case(dir)?;
    let mut case = Fp8GemmCase {
        gemm,
        recipe,
        given_scales: None,
    };
    if let ScalingKind::Delayed { .. } = recipe.scaling {
        let n_row = |kind| case.row_scope(kind).offsets(case.gemm.m()).len() - 1;
        let n_rhs = case
            .rhs_scope()
            .offsets(case.gemm.groups() * case.gemm.k())
            .len()
            - 1;
        let read = |name: &str, n: usize| -> Result<Vec<f32>, ProtocolError> {
            let p = dir.join(name);
            let a: Array1<f32> = read_shaped::<f32, Ix1>(&p, &[n])?;
            if let Some(bad) = a.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
                return Err(file_err(
                    &p,
                    format!("scale {bad} is not a positive finite number"),
                ));
            }
            Ok(a.to_vec())
        };
        let lhs = read("lhs_scale.npy", n_row(recipe.lhs.scope))?;
        let rhs = read("rhs_scale.npy", n_rhs)?;
        let dout = if passes.needs_dout() {
            read("dout_scale.npy", n_row(recipe.dout.scope))?
        } else {
            Vec::new()
        };
        case.given_scales = Some(GivenScales { lhs, rhs, dout });
    }
    Ok(Some((case, passes)))
}
