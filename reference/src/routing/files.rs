//! Routing's case directory (docs/protocol.md, op `route`), and the routing fields of
//! `case.json` that op `moe_layer` shares ([`RoutingJson`]).
//!
//! Inputs: `case.json`, `logits.npy (T, E)` float32 (float64 when a logit is not exactly an
//! f32) and, with a bias, `bias.npy (E,)` of the same dtype. Outputs: `indices.npy (T, K)`
//! int32/int64, `weights.npy (T, K)` float32/float64, `kept.npy (T, K)` uint8/bool,
//! `group_sizes.npy (E,)` int32/int64.

use ndarray::{Array1, Array2, ArrayD, Ix1, Ix2};
use serde::{Deserialize, Serialize};

use super::bound::RouteOutputs;
use super::config::{Capacity, DropPolicy, GroupLimit, RoutingConfig, ScoreFunction};
use super::convention::{GroupScore, SigmoidNorm, SlotOrder, Ties};
use super::op::Route;
use super::route::RoutingCase;
use crate::format::Format;
use crate::gemm::read_group_sizes;
use crate::protocol::{dims, FileError, Files, Protocol, Stored};

/// The routing fields of `case.json`, the same for op `route` and op `moe_layer` (flattened
/// into both).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutingJson {
    pub topk: usize,
    /// `softmax`, `topk-softmax` or `sigmoid`.
    pub score: ScoreFunction,
    /// Group-limited selection: number of groups (`null`: none).
    pub groups: Option<usize>,
    /// Groups kept per token (`null` without groups).
    pub topk_groups: Option<usize>,
    /// `norm_topk_prob` (sigmoid always normalises).
    pub norm_topk: bool,
    /// `routed_scaling_factor`.
    pub scaling_factor: f64,
    /// The `ε` of `g / (Σg + ε)`.
    pub norm_eps: f64,
    /// Capacity factor (`null`: no dropping).
    pub capacity_factor: Option<f64>,
    /// `position`, `probs` or `token-order` (`null` without capacity).
    pub drop_policy: Option<DropPolicy>,
    /// Tokens per sequence for `position` (`null`: all tokens are one sequence).
    pub seq_len: Option<usize>,
    /// `top2` (default when absent), `top-k-per-group` or `max`.
    #[serde(default)]
    pub group_score: GroupScore,
    /// `always` (default when absent), `skip-k1` or `never`.
    #[serde(default)]
    pub sigmoid_norm: SigmoidNorm,
    /// `lower-index` (default when absent) or `any`: what the checker accepts; an
    /// implementation needs not read it.
    #[serde(default)]
    pub ties: Ties,
    /// `score` (default when absent: largest selection score first) or `any` (a token's
    /// experts as a set): what the checker accepts.
    #[serde(default)]
    pub slot_order: SlotOrder,
    /// Whether `bias.npy` is present.
    pub bias: bool,
}

impl RoutingJson {
    /// The fields of `config`, with or without a bias.
    pub fn of(config: &RoutingConfig, bias: bool) -> RoutingJson {
        RoutingJson {
            topk: config.topk,
            score: config.score,
            groups: config.groups.map(|g| g.groups),
            topk_groups: config.groups.map(|g| g.topk_groups),
            norm_topk: config.norm_topk,
            scaling_factor: config.scaling_factor,
            norm_eps: config.norm_eps,
            capacity_factor: config.capacity.map(|c| c.factor),
            drop_policy: config.capacity.map(|c| c.policy),
            seq_len: config.capacity.and_then(|c| c.seq_len),
            group_score: config.group_score,
            sigmoid_norm: config.sigmoid_norm,
            ties: config.ties,
            slot_order: config.slot_order,
            bias,
        }
    }

    /// The routing configuration the fields describe (validated later, against the shape).
    /// Fields that come in pairs and are not paired are an error naming `case.json`.
    pub fn config(&self) -> Result<RoutingConfig, FileError> {
        let groups = match (self.groups, self.topk_groups) {
            (Some(groups), Some(topk_groups)) => Some(GroupLimit {
                groups,
                topk_groups,
            }),
            (None, None) => None,
            _ => {
                return Err(FileError::new(
                    "case.json",
                    "groups and topk_groups must be given together",
                ))
            }
        };
        let capacity = match (self.capacity_factor, self.drop_policy) {
            (Some(factor), Some(policy)) => Some(Capacity {
                factor,
                policy,
                seq_len: self.seq_len,
            }),
            (None, None) if self.seq_len.is_none() => None,
            _ => return Err(FileError::new(
                "case.json",
                "capacity_factor and drop_policy must be given together (seq_len only with them)",
            )),
        };
        Ok(RoutingConfig {
            topk: self.topk,
            score: self.score,
            groups,
            norm_topk: self.norm_topk,
            scaling_factor: self.scaling_factor,
            norm_eps: self.norm_eps,
            capacity,
            group_score: self.group_score,
            sigmoid_norm: self.sigmoid_norm,
            ties: self.ties,
            slot_order: self.slot_order,
        })
    }
}

/// The `case.json` fields of op `route`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteJson {
    pub tokens: usize,
    pub experts: usize,
    #[serde(flatten)]
    pub routing: RoutingJson,
    /// `f32` or `f64`: the dtype of `logits.npy` (and `bias.npy`).
    pub logits_dtype: Format,
}

/// Whether every value is exactly an f32.
fn all_f32<'a>(mut values: impl Iterator<Item = &'a f64>) -> bool {
    values.all(|v| (*v as f32) as f64 == *v)
}

/// The file dtype of `case`'s logits and bias: f32 when every value is exactly an f32.
pub fn logits_dtype(case: &RoutingCase) -> Format {
    if all_f32(case.logits.iter()) && all_f32(case.bias.iter().flatten()) {
        Format::F32
    } else {
        Format::F64
    }
}

/// `a` stored in `dtype` (f32 or f64; exact by the choice of `dtype`).
fn stored(a: ArrayD<f64>, dtype: Format) -> Stored {
    match dtype {
        Format::F32 => Stored::F32(a.mapv(|v| v as f32)),
        _ => Stored::F64(a),
    }
}

impl RouteOutputs {
    /// The outputs with every weight rounded to f32 (nearest even): the reference's routing
    /// as `moecheck route --out` writes it (`weights.npy` float32).
    pub fn with_f32_weights(mut self) -> RouteOutputs {
        self.weights.mapv_inplace(|w| w as f32 as f64);
        self
    }
}

impl Protocol for Route {
    const PROTOCOL_OP: &'static str = "route";
    type CaseJson = RouteJson;

    fn case_json(case: &RoutingCase, _: ()) -> RouteJson {
        RouteJson {
            tokens: case.tokens(),
            experts: case.experts(),
            routing: RoutingJson::of(&case.config, case.bias.is_some()),
            logits_dtype: logits_dtype(case),
        }
    }

    fn input_files(case: &RoutingCase, _: ()) -> Vec<(String, Stored)> {
        let dtype = logits_dtype(case);
        let mut files = vec![(
            "logits.npy".into(),
            stored(case.logits.clone().into_dyn(), dtype),
        )];
        if let Some(b) = &case.bias {
            files.push(("bias.npy".into(), stored(b.clone().into_dyn(), dtype)));
        }
        files
    }

    fn read_case(json: RouteJson, files: &mut dyn Files) -> Result<(RoutingCase, ()), FileError> {
        let config = json.routing.config()?;
        let (t, e) = (json.tokens, json.experts);
        let logits = dims::<Ix2, _>("logits.npy", files.float("logits.npy", &[t, e])?.0)?;
        let bias = match json.routing.bias {
            true => Some(dims::<Ix1, _>(
                "bias.npy",
                files.float("bias.npy", &[e])?.0,
            )?),
            false => None,
        };
        let case = RoutingCase {
            logits,
            bias,
            config,
        };
        Ok((case, ()))
    }

    /// `indices.npy` int32, `weights.npy` float32 when every weight is exactly an f32 (else
    /// float64, so the file holds exactly the weights that were checked), `kept.npy` uint8,
    /// `group_sizes.npy` int32.
    fn output_files(got: &RouteOutputs) -> Vec<(String, Stored)> {
        let dtype = match all_f32(got.weights.iter()) {
            true => Format::F32,
            false => Format::F64,
        };
        let sizes: Array1<i32> = got.group_sizes.iter().map(|&v| v as i32).collect();
        vec![
            (
                "indices.npy".into(),
                Stored::I32(got.indices.mapv(|v| v as i32).into_dyn()),
            ),
            (
                "weights.npy".into(),
                stored(got.weights.clone().into_dyn(), dtype),
            ),
            (
                "kept.npy".into(),
                Stored::U8(got.kept.mapv(u8::from).into_dyn()),
            ),
            ("group_sizes.npy".into(), Stored::I32(sizes.into_dyn())),
        ]
    }

    /// Indices outside `0..E`, negative sizes and kept values other than 0/1 are errors
    /// naming the file.
    fn read_outputs(
        case: &RoutingCase,
        _: (),
        files: &mut dyn Files,
    ) -> Result<RouteOutputs, FileError> {
        let (t, e, k) = (case.tokens(), case.experts(), case.config.topk);
        let file = "indices.npy";
        let raw = dims::<Ix2, _>(file, files.int(file, &[t, k])?)?;
        if let Some(((ti, j), v)) = raw.indexed_iter().find(|(_, v)| !(0..e as i64).contains(v)) {
            return Err(FileError::new(
                file,
                format!("indices[{ti}, {j}] = {v} is not an expert index (0..{e})"),
            ));
        }
        let indices: Array2<usize> = raw.mapv(|v| v as usize);
        let (weights, weights_format) = files.float("weights.npy", &[t, k])?;
        let weights = dims::<Ix2, _>("weights.npy", weights)?;
        let kept = dims::<Ix2, _>("kept.npy", files.flags("kept.npy", &[t, k])?)?;
        let group_sizes = read_group_sizes(files, "group_sizes.npy", e)?;
        Ok(RouteOutputs {
            indices,
            weights,
            kept,
            group_sizes,
            weights_format: Some(weights_format),
        })
    }
}
