//! Protocol v1, op `route` (docs/protocol.md, "Op route"): a routing case directory.
//!
//! Inputs: `case.json`, `logits.npy (T, E)` float32 (float64 when a logit is not exactly an
//! f32) and, with a bias, `bias.npy (E,)` of the same dtype. Outputs: `indices.npy (T, K)`
//! int32/int64, `weights.npy (T, K)` float32/float64, `kept.npy (T, K)` uint8/bool,
//! `group_sizes.npy (E,)` int32/int64.

use std::path::Path;

use ndarray::{Array1, Array2, Ix1, Ix2};
use serde::{Deserialize, Serialize};

use moecheck_reference::format::Format;
use moecheck_reference::routing::{
    Capacity, DropPolicy, GroupLimit, RouteOutputs, Routing, RoutingCase, RoutingConfig,
    ScoreFunction,
};

use super::{file_err, is_type_error, read_shaped, write_npy, ProtocolError, PROTOCOL_VERSION};

/// `case.json` of op `route`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteCaseJson {
    /// Always 1.
    pub protocol: u32,
    /// Always `"route"`.
    pub op: String,
    pub tokens: usize,
    pub experts: usize,
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
    /// `position` or `probs` (`null` without capacity).
    pub drop_policy: Option<DropPolicy>,
    /// Tokens per sequence for `position` (`null`: all tokens are one sequence).
    pub seq_len: Option<usize>,
    /// Whether `bias.npy` is present.
    pub bias: bool,
    /// `f32` or `f64`: the dtype of `logits.npy` (and `bias.npy`).
    pub logits_dtype: Format,
}

impl RouteCaseJson {
    /// The `case.json` of `case`, with `dtype` the logits' file dtype.
    pub fn of(case: &RoutingCase, dtype: Format) -> RouteCaseJson {
        let c = &case.config;
        RouteCaseJson {
            protocol: PROTOCOL_VERSION,
            op: "route".into(),
            tokens: case.tokens(),
            experts: case.experts(),
            topk: c.topk,
            score: c.score,
            groups: c.groups.map(|g| g.groups),
            topk_groups: c.groups.map(|g| g.topk_groups),
            norm_topk: c.norm_topk,
            scaling_factor: c.scaling_factor,
            norm_eps: c.norm_eps,
            capacity_factor: c.capacity.map(|k| k.factor),
            drop_policy: c.capacity.map(|k| k.policy),
            seq_len: c.capacity.and_then(|k| k.seq_len),
            bias: case.bias.is_some(),
            logits_dtype: dtype,
        }
    }

    /// The routing configuration it describes (validated later with the logits).
    pub fn config(&self, path: &Path) -> Result<RoutingConfig, ProtocolError> {
        let groups = match (self.groups, self.topk_groups) {
            (Some(groups), Some(topk_groups)) => Some(GroupLimit {
                groups,
                topk_groups,
            }),
            (None, None) => None,
            _ => {
                return Err(file_err(
                    path,
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
            _ => return Err(file_err(
                path,
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
        })
    }
}

/// The file dtype for `case`'s logits and bias: f32 when every value is exactly an f32.
pub fn logits_dtype(case: &RoutingCase) -> Format {
    let exact = |v: &f64| (*v as f32) as f64 == *v;
    if case.logits.iter().all(exact) && case.bias.iter().flatten().all(exact) {
        Format::F32
    } else {
        Format::F64
    }
}

/// Writes `case.json`, `logits.npy` and `bias.npy` of `case` into `dir` (which must exist).
pub fn write_route_case(dir: &Path, case: &RoutingCase) -> Result<(), ProtocolError> {
    let dtype = logits_dtype(case);
    let json = RouteCaseJson::of(case, dtype);
    let path = dir.join("case.json");
    let text = serde_json::to_string_pretty(&json).map_err(|e| file_err(&path, e))?;
    std::fs::write(&path, text + "\n").map_err(|e| file_err(&path, e))?;
    let logits = dir.join("logits.npy");
    match dtype {
        Format::F32 => write_npy(&logits, &case.logits.mapv(|v| v as f32))?,
        _ => write_npy(&logits, &case.logits)?,
    }
    if let Some(b) = &case.bias {
        let bias = dir.join("bias.npy");
        match dtype {
            Format::F32 => write_npy(&bias, &b.mapv(|v| v as f32))?,
            _ => write_npy(&bias, b)?,
        }
    }
    Ok(())
}

/// Writes the four routing outputs: `indices.npy (T,K) int32`, `weights.npy (T,K) float32`
/// (the combine weights, 0 where dropped), `kept.npy (T,K) uint8`, `group_sizes.npy (E,) int32`.
pub fn write_route_outputs(dir: &Path, r: &Routing) -> Result<(), ProtocolError> {
    write_npy(&dir.join("indices.npy"), &r.indices.mapv(|v| v as i32))?;
    write_npy(&dir.join("weights.npy"), &r.combine.mapv(|v| v as f32))?;
    write_npy(&dir.join("kept.npy"), &r.kept.mapv(u8::from))?;
    let sizes: Array1<i32> = r.group_sizes.iter().map(|&v| v as i32).collect();
    write_npy(&dir.join("group_sizes.npy"), &sizes)
}

/// Reads a float32 or float64 array of `shape` as f64, with the format it was stored in.
pub fn read_float_tagged<D: ndarray::Dimension>(
    path: &Path,
    shape: &[usize],
) -> Result<(ndarray::Array<f64, D>, Format), ProtocolError> {
    match read_shaped::<f32, D>(path, shape) {
        Ok(a) => Ok((a.mapv(f64::from), Format::F32)),
        Err(ProtocolError::File { reason, .. }) if is_type_error(&reason) => {
            read_shaped::<f64, D>(path, shape)
                .map(|a| (a, Format::F64))
                .map_err(|e| match e {
                    ProtocolError::File { reason, .. } if is_type_error(&reason) => {
                        file_err(path, "expected a float32 or float64 array")
                    }
                    other => other,
                })
        }
        Err(e) => Err(e),
    }
}

/// Reads an int32 or int64 array of `shape` as i64.
fn read_int<D: ndarray::Dimension>(
    path: &Path,
    shape: &[usize],
) -> Result<ndarray::Array<i64, D>, ProtocolError> {
    match read_shaped::<i32, D>(path, shape) {
        Ok(a) => Ok(a.mapv(i64::from)),
        Err(ProtocolError::File { reason, .. }) if is_type_error(&reason) => {
            read_shaped::<i64, D>(path, shape).map_err(|e| match e {
                ProtocolError::File { reason, .. } if is_type_error(&reason) => {
                    file_err(path, "expected an int32 or int64 array")
                }
                other => other,
            })
        }
        Err(e) => Err(e),
    }
}

/// The shape in the header of the `.npy` file at `path` (format versions 1–3), read without
/// loading the data, so a header that claims more data than the file holds is refused before
/// anything is allocated.
pub fn npy_shape(path: &Path) -> Result<Vec<usize>, ProtocolError> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| file_err(path, e))?;
    let mut pre = [0u8; 8];
    f.read_exact(&mut pre)
        .map_err(|_| file_err(path, "malformed .npy: too short for a header"))?;
    if &pre[..6] != b"\x93NUMPY" {
        return Err(file_err(path, "malformed .npy: bad magic"));
    }
    let len = if pre[6] == 1 {
        let mut b = [0u8; 2];
        f.read_exact(&mut b)
            .map_err(|_| file_err(path, "malformed .npy: truncated header"))?;
        u16::from_le_bytes(b) as usize
    } else {
        let mut b = [0u8; 4];
        f.read_exact(&mut b)
            .map_err(|_| file_err(path, "malformed .npy: truncated header"))?;
        u32::from_le_bytes(b) as usize
    };
    if len > 1 << 20 {
        return Err(file_err(path, "malformed .npy: header too long"));
    }
    let mut h = vec![0u8; len];
    f.read_exact(&mut h)
        .map_err(|_| file_err(path, "malformed .npy: truncated header"))?;
    let h = String::from_utf8_lossy(&h);
    let start = h
        .find("'shape'")
        .and_then(|i| h[i..].find('(').map(|j| i + j + 1))
        .ok_or_else(|| file_err(path, "malformed .npy header: no shape"))?;
    let end = h[start..]
        .find(')')
        .map(|j| start + j)
        .ok_or_else(|| file_err(path, "malformed .npy header: no shape"))?;
    h[start..end]
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            d.trim_end_matches('L')
                .parse::<usize>()
                .map_err(|_| file_err(path, format!("malformed .npy header: dimension '{d}'")))
        })
        .collect()
}

/// Reads the logits `(T, E)` from `path` (float32 or float64; `T` and `E` from the file).
pub fn read_logits(path: &Path) -> Result<(Array2<f64>, Format), ProtocolError> {
    let shape = npy_shape(path)?;
    if shape.len() != 2 {
        return Err(file_err(
            path,
            format!("has shape {shape:?}, expected 2 dimensions (tokens, experts)"),
        ));
    }
    read_float_tagged::<Ix2>(path, &shape)
}

/// Reads a bias `(E,)` from `path` (float32 or float64).
pub fn read_bias(path: &Path, experts: usize) -> Result<Array1<f64>, ProtocolError> {
    read_float_tagged::<Ix1>(path, &[experts]).map(|(a, _)| a)
}

/// Reads a routing case directory written by [`write_route_case`] (the configuration is
/// validated with the logits; the error names `case.json` or the file).
pub fn read_route_case(dir: &Path) -> Result<RoutingCase, ProtocolError> {
    if !dir.is_dir() {
        return Err(file_err(dir, "not a directory"));
    }
    let path = dir.join("case.json");
    let text = std::fs::read_to_string(&path).map_err(|e| file_err(&path, e))?;
    let json: RouteCaseJson = serde_json::from_str(&text).map_err(|e| file_err(&path, e))?;
    if json.protocol != PROTOCOL_VERSION || json.op != "route" {
        return Err(file_err(
            &path,
            format!(
                "protocol {} op '{}' is not a routing case",
                json.protocol, json.op
            ),
        ));
    }
    let config = json.config(&path)?;
    let (logits, _) =
        read_float_tagged::<Ix2>(&dir.join("logits.npy"), &[json.tokens, json.experts])?;
    let bias = if json.bias {
        Some(read_bias(&dir.join("bias.npy"), json.experts)?)
    } else {
        None
    };
    let case = RoutingCase {
        logits,
        bias,
        config,
    };
    case.validate().map_err(|source| ProtocolError::Invalid {
        path: dir.to_path_buf(),
        source,
    })?;
    Ok(case)
}

/// Reads an implementation's routing outputs for `case` from `dir`, with the format its
/// weights were written in. Indices outside `0..E`, negative sizes and kept values other than
/// 0/1 are errors naming the file.
pub fn read_route_outputs(
    dir: &Path,
    case: &RoutingCase,
) -> Result<(RouteOutputs, Format), ProtocolError> {
    let (t, e, k) = (case.tokens(), case.experts(), case.config.topk);
    let ipath = dir.join("indices.npy");
    let raw = read_int::<Ix2>(&ipath, &[t, k])?;
    if let Some(((ti, j), v)) = raw.indexed_iter().find(|(_, v)| !(0..e as i64).contains(v)) {
        return Err(file_err(
            &ipath,
            format!("indices[{ti}, {j}] = {v} is not an expert index (0..{e})"),
        ));
    }
    let indices = raw.mapv(|v| v as usize);
    let (weights, wfmt) = read_float_tagged::<Ix2>(&dir.join("weights.npy"), &[t, k])?;
    let kpath = dir.join("kept.npy");
    let kept: Array2<bool> = match read_shaped::<u8, Ix2>(&kpath, &[t, k]) {
        Ok(a) => {
            if let Some(((ti, j), v)) = a.indexed_iter().find(|(_, v)| **v > 1) {
                return Err(file_err(
                    &kpath,
                    format!("kept[{ti}, {j}] = {v}, expected 0 or 1"),
                ));
            }
            a.mapv(|v| v == 1)
        }
        Err(ProtocolError::File { reason, .. }) if is_type_error(&reason) => {
            read_shaped::<bool, Ix2>(&kpath, &[t, k]).map_err(|e| match e {
                ProtocolError::File { reason, .. } if is_type_error(&reason) => {
                    file_err(&kpath, "expected a uint8 or bool array")
                }
                other => other,
            })?
        }
        Err(err) => return Err(err),
    };
    let gpath = dir.join("group_sizes.npy");
    let sizes = read_int::<Ix1>(&gpath, &[e])?;
    let group_sizes = sizes
        .iter()
        .enumerate()
        .map(|(x, &v)| {
            usize::try_from(v)
                .map_err(|_| file_err(&gpath, format!("expert {x} has negative size {v}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((
        RouteOutputs {
            indices,
            weights,
            kept,
            group_sizes,
        },
        wfmt,
    ))
}
