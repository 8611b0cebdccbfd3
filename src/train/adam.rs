//! Adam (Kingma and Ba, 2015) with bias correction, in f64, on every tensor of [`Params`]:
//! `m ← β₁m + (1−β₁)g`, `v ← β₂v + (1−β₂)g²`, `θ ← θ − lr·m̂/(√v̂ + ε)` with
//! `m̂ = m/(1−β₁ᵗ)`, `v̂ = v/(1−β₂ᵗ)`. No weight decay, no clipping.

use super::model::Params;

pub const BETA1: f64 = 0.9;
/// 0.99 rather than the paper's 0.999: runs here are a few hundred steps.
pub const BETA2: f64 = 0.99;
pub const EPS: f64 = 1e-8;

/// The optimiser's state.
pub struct Adam {
    lr: f64,
    t: i32,
    m: Vec<Vec<f64>>,
    v: Vec<Vec<f64>>,
}

impl Adam {
    pub fn new(params: &Params, lr: f64) -> Adam {
        let zeros: Vec<Vec<f64>> = params
            .tensors()
            .iter()
            .map(|t| vec![0.0; t.len()])
            .collect();
        Adam {
            lr,
            t: 0,
            m: zeros.clone(),
            v: zeros,
        }
    }

    /// One step on `params` with gradients `grads` (the same shapes).
    pub fn update(&mut self, params: &mut Params, grads: &Params) {
        self.t += 1;
        let c1 = 1.0 - BETA1.powi(self.t);
        let c2 = 1.0 - BETA2.powi(self.t);
        let lr = self.lr;
        for (((p, g), m), v) in params
            .tensors_mut()
            .into_iter()
            .zip(grads.tensors())
            .zip(&mut self.m)
            .zip(&mut self.v)
        {
            for i in 0..p.len() {
                m[i] = BETA1 * m[i] + (1.0 - BETA1) * g[i];
                v[i] = BETA2 * v[i] + (1.0 - BETA2) * g[i] * g[i];
                p[i] -= lr * (m[i] / c1) / ((v[i] / c2).sqrt() + EPS);
            }
        }
    }
}
