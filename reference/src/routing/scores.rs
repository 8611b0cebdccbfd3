//! Steps 1 and 3: score functions, gates, normalisation and scaling (f64).

use ndarray::{Array1, Array2};

use super::config::{RoutingConfig, ScoreFunction};

/// `softmax(xs)` in f64: `exp(x_i - m) / Σ_j exp(x_j - m)` with `m = max xs`, the sum taken in
/// index order. Reads `xs` (finite), returns a new vector; empty in, empty out.
///
/// ```
/// let p = moecheck_reference::routing::scores::softmax(&[0.0, 0.0]);
/// assert_eq!(p, vec![0.5, 0.5]);
/// ```
pub fn softmax(xs: &[f64]) -> Vec<f64> {
    let m = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = xs.iter().map(|x| (x - m).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|v| v / sum).collect()
}

/// The logistic sigmoid `1 / (1 + exp(-x))` in f64.
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Step 1: the pre-bias scores `s (T, E)` of `logits (T, E)`: row-wise softmax, element-wise
/// sigmoid, or the logits themselves for `topk-softmax`.
pub fn scores(logits: &Array2<f64>, score: ScoreFunction) -> Array2<f64> {
    match score {
        ScoreFunction::TopkSoftmax => logits.clone(),
        ScoreFunction::Sigmoid => logits.mapv(sigmoid),
        ScoreFunction::Softmax => {
            // In row order whatever the input's layout (a Fortran-order array has strided
            // rows), so each row is a slice.
            let mut s = logits.as_standard_layout().into_owned();
            for mut row in s.rows_mut() {
                let p = softmax(row.as_slice().expect("standard layout"));
                row.iter_mut().zip(p).for_each(|(d, v)| *d = v);
            }
            s
        }
    }
}

/// Step 3a: the gates `g (T, K)` from the pre-bias scores `s` of the selected `indices (T, K)`:
/// `g[t, j] = s[t, indices[t, j]]`, or for `topk-softmax` the softmax over the selected
/// logits (`s` holds the logits then).
pub fn gates(scores: &Array2<f64>, indices: &Array2<usize>, score: ScoreFunction) -> Array2<f64> {
    let (t, k) = indices.dim();
    let mut g = Array2::zeros((t, k));
    for ti in 0..t {
        let picked: Vec<f64> = (0..k).map(|j| scores[[ti, indices[[ti, j]]]]).collect();
        let row = match score {
            ScoreFunction::TopkSoftmax => softmax(&picked),
            ScoreFunction::Softmax | ScoreFunction::Sigmoid => picked,
        };
        for (j, v) in row.into_iter().enumerate() {
            g[[ti, j]] = v;
        }
    }
    g
}

/// Step 3b: the weights `w (T, K)` and the per-token denominators `D (T,)`:
/// `w = α·g / D` with `D_t = Σ_j g[t, j] + ε` (sum in slot order) when
/// [`RoutingConfig::normalises`], else `w = α·g` and `D_t = 1`. The division happens before
/// the multiplication by `α`, as in MaxText's `deepseek_scale_weights`.
pub fn normalise_and_scale(
    gates: &Array2<f64>,
    config: &RoutingConfig,
) -> (Array2<f64>, Array1<f64>) {
    let t = gates.nrows();
    let mut w = gates.clone();
    let mut d = Array1::ones(t);
    for ti in 0..t {
        if config.normalises() {
            let sum: f64 = gates.row(ti).iter().sum::<f64>() + config.norm_eps;
            d[ti] = sum;
            w.row_mut(ti).iter_mut().for_each(|v| *v /= sum);
        }
        w.row_mut(ti)
            .iter_mut()
            .for_each(|v| *v *= config.scaling_factor);
    }
    (w, d)
}
