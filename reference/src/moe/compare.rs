//! Element-by-element comparison of a layer's outputs against the reference, per tensor and,
//! for the expert weight gradients, per expert.

use ndarray::ArrayD;
use serde::{Deserialize, Serialize};

use super::bound::{LayerBound, LayerPrecision};
use super::layer::{MoeCase, MoeOutputs, TensorId};
use crate::format::Format;
use crate::stats::{max_of, worst_slice, ElementStats, StatsAcc};

/// Where a layer element is: its index in the tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerAt {
    pub index: Vec<usize>,
}

/// The worst element of a slice.
pub type WorstElement = crate::stats::WorstElement<LayerAt>;

/// Statistics of one tensor, or of one expert's slice of a per-expert tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SliceStats {
    /// The expert, for per-expert tensors; `None` for the whole tensor.
    pub expert: Option<usize>,
    #[serde(flatten)]
    pub stats: ElementStats<LayerAt>,
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
        self.error.is_none() && self.slices.iter().all(|s| s.stats.failed == 0)
    }
    pub fn failed_elements(&self) -> usize {
        self.slices.iter().map(|s| s.stats.failed).sum()
    }
    pub fn max_of(&self, f: impl Fn(&ElementStats<LayerAt>) -> f64) -> f64 {
        max_of(self.slices.iter().map(|s| &s.stats), f)
    }
    /// The slice whose worst element has the largest bound ratio.
    pub fn worst_slice(&self) -> Option<&SliceStats> {
        worst_slice(&self.slices, |s| &s.stats)
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
        let s = worst_slice(t.slices.iter().filter(|s| s.stats.failed > 0), |s| &s.stats)?;
        let w = s.stats.worst.as_ref()?;
        let at = s
            .expert
            .map(|e| format!(" of expert {e}"))
            .unwrap_or_default();
        let (got, want) = crate::report::sci_pair(w.got, w.want);
        Some(format!(
            "{}{at}: {} of {} elements outside the bound; worst at {:?}: got {got}, want {want}, bound {:.3e}",
            t.tensor, s.stats.failed, s.stats.elements, w.at.index, w.bound
        ))
    }
}

fn stats(
    expert: Option<usize>,
    items: impl Iterator<Item = (Vec<usize>, f64, f64, f64)>,
    out: Format,
) -> SliceStats {
    let mut acc = StatsAcc::new(out);
    for (index, got, want, bound) in items {
        acc.push(|| LayerAt { index }, got, want, bound);
    }
    SliceStats {
        expert,
        stats: acc.finish(),
    }
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
    // Contiguous row-major copies (views where they already are), so each expert's slice is
    // reached directly: skipping through one iterator per expert was quadratic in E.
    let (got, want_c, bound_c) = (
        got.as_standard_layout(),
        want.as_standard_layout(),
        bound.as_standard_layout(),
    );
    let (g, w, b) = (
        got.as_slice().expect("standard layout"),
        want_c.as_slice().expect("standard layout"),
        bound_c.as_slice().expect("standard layout"),
    );
    let shape = want.shape();
    let per = want.len() / shape[0].max(1);
    let items = |lo: usize, hi: usize| {
        (lo * per..hi * per).map(move |i| (unravel(i, shape), g[i], w[i], b[i]))
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
