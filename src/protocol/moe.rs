//! Protocol v1, op `moe_layer` (docs/protocol.md, "Op moe_layer"): a whole-layer case
//! directory.
//!
//! Inputs (float32, every value exactly representable in `dtype`): `x.npy (T,H)`,
//! `w_router.npy (H,E)`, `bias.npy (E,)` (with a bias), `w0.npy (E,H,F)`, `w1.npy (E,H,F)`,
//! `wo.npy (E,F,H)`, `shared_w0.npy (H,Fs)`, `shared_w1.npy (H,Fs)`, `shared_wo.npy (Fs,H)`
//! (with a shared expert), `dout.npy (T,H)`. Outputs (float32 or float64): `out.npy (T,H)`,
//! `dx.npy (T,H)`, `dw_router.npy (H,E)`, `dw0.npy`, `dw1.npy`, `dwo.npy` and, with a shared
//! expert, `dshared_w0.npy`, `dshared_w1.npy`, `dshared_wo.npy`, each of its input's shape.

use std::path::Path;

use ndarray::{Array2, Array3};
use serde::{Deserialize, Serialize};

use moecheck_reference::format::Format;
use moecheck_reference::moe::{MoeCase, MoeOutputs, TensorId};
use moecheck_reference::routing::{DropPolicy, RoutingCase, ScoreFunction};

use super::route::RouteCaseJson;
use super::{file_err, read_float, write_npy, ProtocolError, PROTOCOL_VERSION};

/// `case.json` of op `moe_layer`. The routing fields are those of op `route`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeCaseJson {
    /// Always 1.
    pub protocol: u32,
    /// Always `"moe_layer"`.
    pub op: String,
    pub tokens: usize,
    pub hidden: usize,
    pub experts: usize,
    /// Expert FFN width `F`.
    pub ffn: usize,
    /// Shared-expert width `Fs` (0: no shared expert).
    pub shared_ffn: usize,
    /// Every input value is exactly representable in this format.
    pub dtype: Format,
    pub topk: usize,
    pub score: ScoreFunction,
    pub groups: Option<usize>,
    pub topk_groups: Option<usize>,
    pub norm_topk: bool,
    pub scaling_factor: f64,
    pub norm_eps: f64,
    pub capacity_factor: Option<f64>,
    pub drop_policy: Option<DropPolicy>,
    pub seq_len: Option<usize>,
    /// Whether `bias.npy` is present.
    pub bias: bool,
}

impl MoeCaseJson {
    pub fn of(case: &MoeCase) -> MoeCaseJson {
        let r = RouteCaseJson::of(
            &RoutingCase {
                logits: Array2::zeros((case.tokens(), case.experts())),
                bias: case.bias.clone(),
                config: case.routing,
            },
            Format::F32,
        );
        MoeCaseJson {
            protocol: PROTOCOL_VERSION,
            op: "moe_layer".into(),
            tokens: case.tokens(),
            hidden: case.hidden(),
            experts: case.experts(),
            ffn: case.ffn(),
            shared_ffn: case.shared.as_ref().map_or(0, |s| s.w0.ncols()),
            dtype: case.dtype,
            topk: r.topk,
            score: r.score,
            groups: r.groups,
            topk_groups: r.topk_groups,
            norm_topk: r.norm_topk,
            scaling_factor: r.scaling_factor,
            norm_eps: r.norm_eps,
            capacity_factor: r.capacity_factor,
            drop_policy: r.drop_policy,
            seq_len: r.seq_len,
            bias: r.bias,
        }
    }
}

/// Writes `case.json` and the inputs of `case` into `dir` (which must exist).
pub fn write_moe_case(dir: &Path, case: &MoeCase) -> Result<(), ProtocolError> {
    let path = dir.join("case.json");
    let text =
        serde_json::to_string_pretty(&MoeCaseJson::of(case)).map_err(|e| file_err(&path, e))?;
    std::fs::write(&path, text + "\n").map_err(|e| file_err(&path, e))?;
    for (name, a) in case.named_inputs() {
        let a32 = a.mapv(|v| v as f32);
        write_npy(&dir.join(format!("{name}.npy")), &a32)?;
    }
    Ok(())
}

/// Writes `got` as float64 `.npy` files (the names of [`TensorId::name`]).
pub fn write_moe_outputs(dir: &Path, got: &MoeOutputs) -> Result<(), ProtocolError> {
    for id in TensorId::ALL {
        if let Some(a) = got.get(id) {
            write_npy(&dir.join(format!("{}.npy", id.name())), &a)?;
        }
    }
    Ok(())
}

/// Reads every output of `case` (float32 or float64) and checks its shape.
pub fn read_moe_outputs(dir: &Path, case: &MoeCase) -> Result<MoeOutputs, ProtocolError> {
    let f2 = |id: TensorId| -> Result<Array2<f64>, ProtocolError> {
        read_float(&dir.join(format!("{}.npy", id.name())), &id.shape(case))
    };
    let f3 = |id: TensorId| -> Result<Array3<f64>, ProtocolError> {
        read_float(&dir.join(format!("{}.npy", id.name())), &id.shape(case))
    };
    let dshared = match case.shared {
        Some(_) => Some([
            f2(TensorId::DsharedW0)?,
            f2(TensorId::DsharedW1)?,
            f2(TensorId::DsharedWo)?,
        ]),
        None => None,
    };
    Ok(MoeOutputs {
        out: f2(TensorId::Out)?,
        dx: f2(TensorId::Dx)?,
        dw_router: f2(TensorId::DwRouter)?,
        dw0: f3(TensorId::Dw0)?,
        dw1: f3(TensorId::Dw1)?,
        dwo: f3(TensorId::Dwo)?,
        dshared,
    })
}
