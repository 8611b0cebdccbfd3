//! The MoE layer's case directory (docs/protocol.md, op `moe_layer`).
//!
//! Inputs (float32, every value exactly representable in `dtype`): `x.npy (T,H)`,
//! `w_router.npy (H,E)`, `bias.npy (E,)` (with a bias), `w0.npy (E,H,F)`, `w1.npy (E,H,F)`,
//! `wo.npy (E,F,H)`, `shared_w0.npy (H,Fs)`, `shared_w1.npy (H,Fs)`, `shared_wo.npy (Fs,H)`
//! (with a shared expert), `shared_gate.npy (H,)` (with a gated one), `router_bias.npy (E,)`
//! and `expert_b0.npy (E,F)`, `expert_b1.npy (E,F)`, `expert_bo.npy (E,H)` (with those
//! biases), `dout.npy (T,H)`. Outputs (float32 or float64): `out.npy (T,H)`,
//! `dx.npy (T,H)`, `dw_router.npy (H,E)`, `dw0.npy`, `dw1.npy`, `dwo.npy` and, with a shared
//! expert, `dshared_w0.npy`, `dshared_w1.npy`, `dshared_wo.npy`, and with a gated one
//! `dshared_gate.npy`, and `drouter_bias.npy`, `dexpert_b0.npy`, ... with those biases, each
//! of its input's shape.
//! The routing fields of `case.json` are op `route`'s ([`RoutingJson`]).

use ndarray::{ArrayD, Dimension, Ix1, Ix2, Ix3};
use serde::{Deserialize, Serialize};

use super::layer::{Activation, ExpertBias, MoeCase, MoeOutputs, SharedExpert, TensorId};
use super::op::MoeLayer;
use crate::format::Format;
use crate::protocol::{dims, FileError, Files, Protocol, Stored};
use crate::routing::RoutingJson;

/// The `case.json` fields of op `moe_layer`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeJson {
    pub tokens: usize,
    pub hidden: usize,
    pub experts: usize,
    /// Expert FFN width `F`.
    pub ffn: usize,
    /// Shared-expert width `Fs` (0: no shared expert).
    pub shared_ffn: usize,
    /// The shared expert's gate: `none` (absent in JSON: none) or `sigmoid` (Qwen2-MoE,
    /// input `shared_gate.npy (H,)`, output `dshared_gate.npy (H,)`).
    #[serde(default, skip_serializing_if = "SharedGate::is_none")]
    pub shared_gate: SharedGate,
    /// `swiglu` (absent in JSON: swiglu) or `clamped-swiglu` (gpt-oss, `alpha` 1.702,
    /// `limit` 7).
    #[serde(default, skip_serializing_if = "is_swiglu")]
    pub activation: Activation,
    /// Per-expert biases `expert_b0.npy (E,F)`, `expert_b1.npy (E,F)`, `expert_bo.npy (E,H)`
    /// (gpt-oss), with their gradients `dexpert_b0.npy`, `dexpert_b1.npy`, `dexpert_bo.npy`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expert_bias: bool,
    /// A bias added to the router logits, `router_bias.npy (E,)`, with its gradient
    /// `drouter_bias.npy` (gpt-oss's router).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub router_bias: bool,
    /// Every input value is exactly representable in this format.
    pub dtype: Format,
    #[serde(flatten)]
    pub routing: RoutingJson,
}

/// How a shared expert's output is gated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SharedGate {
    /// `out += shared(x)` (DeepSeek-V3, Qwen3-MoE has no shared expert).
    #[default]
    None,
    /// `out += σ(x·g) ⊙ shared(x)` (Qwen2-MoE's `shared_expert_gate`).
    Sigmoid,
}

fn is_swiglu(a: &Activation) -> bool {
    *a == Activation::Swiglu
}

impl SharedGate {
    pub fn is_none(&self) -> bool {
        *self == SharedGate::None
    }
}

/// The float32 input `name.npy` of `shape`, widened to f64.
fn input<D: Dimension>(
    files: &mut dyn Files,
    name: &str,
    shape: &[usize],
) -> Result<ndarray::Array<f64, D>, FileError> {
    let file = format!("{name}.npy");
    let a: ArrayD<f64> = files.f32(&file, shape)?.mapv(f64::from);
    dims::<D, _>(&file, a)
}

/// The output `id` of `case`, float32 or float64, widened to f64.
fn output<D: Dimension>(
    files: &mut dyn Files,
    case: &MoeCase,
    id: TensorId,
) -> Result<ndarray::Array<f64, D>, FileError> {
    let file = format!("{}.npy", id.name());
    dims::<D, _>(&file, files.float(&file, &id.shape(case))?.0)
}

impl Protocol for MoeLayer {
    const PROTOCOL_OP: &'static str = "moe_layer";
    type CaseJson = MoeJson;

    fn case_json(case: &MoeCase, _: ()) -> MoeJson {
        MoeJson {
            tokens: case.tokens(),
            hidden: case.hidden(),
            experts: case.experts(),
            ffn: case.ffn(),
            shared_ffn: case.shared.as_ref().map_or(0, |s| s.w0.ncols()),
            shared_gate: match case.shared.as_ref().and_then(|s| s.gate.as_ref()) {
                Some(_) => SharedGate::Sigmoid,
                None => SharedGate::None,
            },
            activation: case.activation,
            expert_bias: case.expert_bias.is_some(),
            router_bias: case.router_bias.is_some(),
            dtype: case.dtype,
            routing: RoutingJson::of(&case.routing, case.bias.is_some()),
        }
    }

    /// Every input as float32 (exact: the values are representable in `dtype`).
    fn input_files(case: &MoeCase, _: ()) -> Vec<(String, Stored)> {
        case.named_inputs()
            .into_iter()
            .map(|(name, a)| (format!("{name}.npy"), Stored::F32(a.mapv(|v| v as f32))))
            .collect()
    }

    fn read_case(json: MoeJson, files: &mut dyn Files) -> Result<(MoeCase, ()), FileError> {
        let routing = json.routing.config()?;
        let (t, h, e, f, fs) = (
            json.tokens,
            json.hidden,
            json.experts,
            json.ffn,
            json.shared_ffn,
        );
        let bias = match json.routing.bias {
            true => Some(input::<Ix1>(files, "bias", &[e])?),
            false => None,
        };
        let shared = match (fs, json.shared_gate) {
            (0, SharedGate::Sigmoid) => {
                return Err(FileError::new(
                    "case.json",
                    "shared_gate \"sigmoid\" needs a shared expert (shared_ffn > 0)",
                ))
            }
            (0, SharedGate::None) => None,
            (_, gate) => Some(SharedExpert {
                w0: input::<Ix2>(files, "shared_w0", &[h, fs])?,
                w1: input::<Ix2>(files, "shared_w1", &[h, fs])?,
                wo: input::<Ix2>(files, "shared_wo", &[fs, h])?,
                gate: match gate {
                    SharedGate::Sigmoid => Some(input::<Ix1>(files, "shared_gate", &[h])?),
                    SharedGate::None => None,
                },
            }),
        };
        let router_bias = match json.router_bias {
            true => Some(input::<Ix1>(files, "router_bias", &[e])?),
            false => None,
        };
        let expert_bias = match json.expert_bias {
            true => Some(ExpertBias {
                b0: input::<Ix2>(files, "expert_b0", &[e, f])?,
                b1: input::<Ix2>(files, "expert_b1", &[e, f])?,
                bo: input::<Ix2>(files, "expert_bo", &[e, h])?,
            }),
            false => None,
        };
        let case = MoeCase {
            x: input::<Ix2>(files, "x", &[t, h])?,
            wr: input::<Ix2>(files, "w_router", &[h, e])?,
            bias,
            router_bias,
            expert_bias,
            activation: json.activation,
            w0: input::<Ix3>(files, "w0", &[e, h, f])?,
            w1: input::<Ix3>(files, "w1", &[e, h, f])?,
            wo: input::<Ix3>(files, "wo", &[e, f, h])?,
            shared,
            dout: input::<Ix2>(files, "dout", &[t, h])?,
            routing,
            dtype: json.dtype,
        };
        Ok((case, ()))
    }

    /// Every tensor as float64 (the names of [`TensorId::name`]).
    fn output_files(got: &MoeOutputs) -> Vec<(String, Stored)> {
        TensorId::ALL
            .into_iter()
            .filter_map(|id| Some((format!("{}.npy", id.name()), Stored::F64(got.get(id)?))))
            .collect()
    }

    fn read_outputs(case: &MoeCase, _: (), files: &mut dyn Files) -> Result<MoeOutputs, FileError> {
        let dshared = match case.shared {
            Some(_) => Some([
                output::<Ix2>(files, case, TensorId::DsharedW0)?,
                output::<Ix2>(files, case, TensorId::DsharedW1)?,
                output::<Ix2>(files, case, TensorId::DsharedWo)?,
            ]),
            None => None,
        };
        let dshared_gate = match case.shared.as_ref().and_then(|s| s.gate.as_ref()) {
            Some(_) => Some(output::<Ix1>(files, case, TensorId::DsharedGate)?),
            None => None,
        };
        let drouter_bias = match case.router_bias {
            Some(_) => Some(output::<Ix1>(files, case, TensorId::DrouterBias)?),
            None => None,
        };
        let dexpert_bias = match case.expert_bias {
            Some(_) => Some([
                output::<Ix2>(files, case, TensorId::DexpertB0)?,
                output::<Ix2>(files, case, TensorId::DexpertB1)?,
                output::<Ix2>(files, case, TensorId::DexpertBo)?,
            ]),
            None => None,
        };
        Ok(MoeOutputs {
            out: output::<Ix2>(files, case, TensorId::Out)?,
            dx: output::<Ix2>(files, case, TensorId::Dx)?,
            dw_router: output::<Ix2>(files, case, TensorId::DwRouter)?,
            dw0: output::<Ix3>(files, case, TensorId::Dw0)?,
            dw1: output::<Ix3>(files, case, TensorId::Dw1)?,
            dwo: output::<Ix3>(files, case, TensorId::Dwo)?,
            dshared,
            dshared_gate,
            drouter_bias,
            dexpert_bias,
        })
    }
}
