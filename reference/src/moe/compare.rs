//! Element-by-element comparison of a layer's outputs against the reference, per tensor and,
//! for the expert weight gradients, per expert.

use ndarray::ArrayD;
use serde::{Deserialize, Serialize};

use super::bound::{LayerBound, LayerPrecision};
use super::layer::{MoeCase, MoeOutputs, TensorId};
use crate::format::{ulp, Format};

/// The element with the largest error/bound ratio.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorstElement {
    pub index: Vec<usize>,
    pub got: f64,
    pub want: f64,
    pub bound: f64,
}

/// Statistics of one tensor, or of one expert's slice of a per-expert tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SliceStats {
    /// The expert, for per-expert tensors; `None` for the whole tensor.
    pub expert: Option<usize>,
    pub elements: usize,
    /// Elements outside their bound (NaN included).
    pub failed: usize,
    pub max_abs_err: f64,
    /// `max |ŷ − y| / bound` (∞ where the bound is 0 and the error is not).
    pub max_bound_ratio: f64,
    /// `max |ŷ − y| / ulp_out(y)`.
    pub max_ulp: f64,
    /// DeepGEMM's `calc_diff`: `1 − 2Σŷy / Σ(ŷ² + y²)`.
    pub calc_diff: f64,
    pub nan: usize,
    pub inf: usize,
    pub worst: Option<WorstElement>,
}

/// One output tensor's comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorReport {
    pub tensor: TensorId,
    pub shape: Vec<usize>,
    /// One entry (`expert: None`), or one per expert for `dw0`, `dw1`, `dwo`.
    pub slices: Vec<SliceStats>,
    /// Why the tensor failed without statistics (missing, wrong shape).
    pub error: Option<String>,
}

impl TensorReport {
    pub fn passed(&self) -> bool {
        self.error.is_none() && self.slices.iter().all(|s| s.failed == 0)
    }
    pub fn failed_elements(&self) -> usize {
        self.slices.iter().map(|s| s.failed).sum()
    }
    pub fn max_of(&self, f: impl Fn(&SliceStats) -> f64) -> f64 {
        self.slices.iter().map(f).fold(0.0, |a, b| {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        })
    }
    /// The slice whose worst element has the largest bound ratio.
    pub fn worst_slice(&self) -> Option<&SliceStats> {
        self.slices
            .iter()
            .filter(|s| s.worst.is_some())
            .max_by(|a, b| a.max_bound_ratio.total_cmp(&b.max_bound_ratio))
    }
}

/// Every tensor of a layer case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerReport {
    pub precision: LayerPrecision,
    pub tensors: Vec<TensorReport>,
}

impl LayerReport {
    pub fn passed(&self) -> bool {
        self.tensors.iter().all(TensorReport::passed)
    }
    /// One line on the first failing tensor.
    pub fn first_failure(&self) -> Option<String> {
        let t = self.tensors.iter().find(|t| !t.passed())?;
        if let Some(e) = &t.error {
            return Some(format!("{}: {e}", t.tensor));
        }
        let s = t
            .slices
            .iter()
            .filter(|s| s.failed > 0)
            .max_by(|a, b| a.max_bound_ratio.total_cmp(&b.max_bound_ratio))?;
        let w = s.worst.as_ref()?;
        let at = s
            .expert
            .map(|e| format!(" of expert {e}"))
            .unwrap_or_default();
        Some(format!(
            "{}{at}: {} of {} elements outside the bound; worst at {:?}: got {:e}, want {:e}, bound {:e}",
            t.tensor, s.failed, s.elements, w.index, w.got, w.want, w.bound
        ))
    }
}

fn stats(
    expert: Option<usize>,
    items: impl Iterator<Item = (Vec<usize>, f64, f64, f64)>,
    out: Format,
) -> SliceStats {
    let mut s = SliceStats {
        expert,
        elements: 0,
        failed: 0,
        max_abs_err: 0.0,
        max_bound_ratio: 0.0,
        max_ulp: 0.0,
        calc_diff: 0.0,
        nan: 0,
        inf: 0,
        worst: None,
    };
    let (mut xy, mut sq) = (0.0, 0.0);
    for (index, got, want, bound) in items {
        s.elements += 1;
        if got.is_nan() {
            s.nan += 1;
        } else if got.is_infinite() {
            s.inf += 1;
        }
        let err = (got - want).abs();
        let ok = err <= bound; // false for NaN
        if !ok {
            s.failed += 1;
        }
        let ratio = if err.is_nan() {
            f64::INFINITY
        } else if bound > 0.0 {
            err / bound
        } else if err == 0.0 {
            0.0
        } else {
            f64::INFINITY
        };
        if err.is_nan() || err > s.max_abs_err {
            s.max_abs_err = if err.is_nan() { f64::NAN } else { err };
        }
        let u = err / ulp(want, out);
        if u.is_nan() || u > s.max_ulp {
            s.max_ulp = u;
        }
        if s.worst.is_none() || ratio > s.max_bound_ratio {
            s.max_bound_ratio = ratio;
            s.worst = Some(WorstElement {
                index,
                got,
                want,
                bound,
            });
        }
        xy += got * want;
        sq += got * got + want * want;
    }
    s.calc_diff = if sq == 0.0 { 0.0 } else { 1.0 - 2.0 * xy / sq };
    s
}

fn compare_tensor(
    id: TensorId,
    got: Option<ArrayD<f64>>,
    want: &ArrayD<f64>,
    bound: &ArrayD<f64>,
    out: Format,
) -> TensorReport {
    let fail = |why: String| TensorReport {
        tensor: id,
        shape: want.shape().to_vec(),
        slices: Vec::new(),
        error: Some(why),
    };
    let Some(got) = got else {
        return fail("the implementation returned no output".into());
    };
    if got.shape() != want.shape() {
        return fail(format!(
            "{id} has shape {:?}, expected {:?}",
            got.shape(),
            want.shape()
        ));
    }
    let items = |lo: usize, hi: usize| {
        let per = want.len() / want.shape()[0].max(1);
        got.iter()
            .zip(want.iter())
            .zip(bound.iter())
            .enumerate()
            .skip(lo * per)
            .take((hi - lo) * per)
            .map(|(i, ((g, w), b))| (unravel(i, want.shape()), *g, *w, *b))
            .collect::<Vec<_>>()
            .into_iter()
    };
    let slices = if id.per_expert() {
        (0..want.shape()[0])
            .map(|e| stats(Some(e), items(e, e + 1), out))
            .collect()
    } else {
        vec![stats(None, items(0, want.shape()[0]), out)]
    };
    TensorReport {
        tensor: id,
        shape: want.shape().to_vec(),
        slices,
        error: None,
    }
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (d, &n) in shape.iter().enumerate().rev() {
        idx[d] = i % n.max(1);
        i /= n.max(1);
    }
    idx
}

/// Compares every tensor of `got` with `want` (the reference) under `bound`.
pub fn compare_layer(
    case: &MoeCase,
    precision: &LayerPrecision,
    want: &MoeOutputs,
    bound: &LayerBound,
    got: &MoeOutputs,
) -> LayerReport {
    let tensors = TensorId::of_case(case)
        .into_iter()
        .map(|id| {
            let w = want.get(id).expect("the reference computes every tensor");
            let b = bound.get(id).expect("the bound covers every tensor");
            compare_tensor(id, got.get(id), &w, b, precision.output)
        })
        .collect();
    LayerReport {
        precision: *precision,
        tensors,
    }
}
