//! The training model: a small MoE language model over a fixed context window, with its loss
//! and hand-written gradients.
//!
//! * embedding: `h₀[b] = Σ_c E[c, x_c[b]]`, one table `E (C, V, H)` per context position
//!   (`c = 0` the most recent token);
//! * `L` MoE FFN layers with residuals ([`super::layer`]): `h_{l+1} = h_l + moe_l(h_l)`;
//! * output projection `logits = h_L · W_out (B, V)` and the mean softmax cross-entropy
//!   `loss = −(1/B) Σ_b ln softmax(logits[b])[target[b]]` in nats.
//!
//! Everything but the expert GEMMs is f64. The initialisation is a pure function of the seed.

use ndarray::{Array2, Array3};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use moecheck_reference::routing::RoutingConfig;
use moecheck_reference::seed::mix;

use super::data::Batch;
use super::experts::ExpertGemm;
use super::layer::{self, LayerFailure, LayerState, LayerWeights};

/// The model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub vocab: usize,
    pub context: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub experts: usize,
    pub layers: usize,
}

/// Every trainable tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// `E (C, V, H)`
    pub embed: Array3<f64>,
    pub layers: Vec<LayerWeights>,
    /// `W_out (H, V)`
    pub out: Array2<f64>,
}

/// Uniform values with standard deviation `std` (`±√3·std`).
fn uniform<D: ndarray::Dimension, Sh: ndarray::ShapeBuilder<Dim = D>>(
    rng: &mut ChaCha8Rng,
    shape: Sh,
    std: f64,
) -> ndarray::Array<f64, D> {
    let a = 3f64.sqrt() * std;
    ndarray::Array::from_shape_simple_fn(shape, || a * (2.0 * rng.random::<f64>() - 1.0))
}

impl Params {
    /// The initial weights of `seed`: embeddings with std 1/√C (so `h₀` has unit scale), the
    /// router and the gate/up projections 1/√H, the down projection 0.5/√F (each residual
    /// branch starts small), the output projection 1/√H.
    pub fn init(shape: &Shape, seed: u64) -> Params {
        let mut rng = ChaCha8Rng::seed_from_u64(mix(seed ^ 0x696e_6974));
        let (c, v, h, f, e) = (
            shape.context,
            shape.vocab,
            shape.hidden,
            shape.ffn,
            shape.experts,
        );
        let embed = uniform(&mut rng, (c, v, h), 1.0 / (c as f64).sqrt());
        let layers = (0..shape.layers)
            .map(|_| LayerWeights {
                router: uniform(&mut rng, (h, e), 1.0 / (h as f64).sqrt()),
                w01: uniform(&mut rng, (e, h, 2 * f), 1.0 / (h as f64).sqrt()),
                wo: uniform(&mut rng, (e, f, h), 0.5 / (f as f64).sqrt()),
            })
            .collect();
        let out = uniform(&mut rng, (h, v), 1.0 / (h as f64).sqrt());
        Params { embed, layers, out }
    }

    pub fn zeros_like(&self) -> Params {
        Params {
            embed: Array3::zeros(self.embed.raw_dim()),
            layers: self.layers.iter().map(LayerWeights::zeros_like).collect(),
            out: Array2::zeros(self.out.raw_dim()),
        }
    }

    /// Every tensor's values, in one fixed order (for the optimiser and the tests).
    pub fn tensors(&self) -> Vec<&[f64]> {
        let mut v = vec![self.embed.as_slice().expect("standard layout")];
        for l in &self.layers {
            v.push(l.router.as_slice().expect("standard layout"));
            v.push(l.w01.as_slice().expect("standard layout"));
            v.push(l.wo.as_slice().expect("standard layout"));
        }
        v.push(self.out.as_slice().expect("standard layout"));
        v
    }

    /// [`Params::tensors`], writable.
    pub fn tensors_mut(&mut self) -> Vec<&mut [f64]> {
        let mut v = vec![self.embed.as_slice_mut().expect("standard layout")];
        for l in &mut self.layers {
            v.push(l.router.as_slice_mut().expect("standard layout"));
            v.push(l.w01.as_slice_mut().expect("standard layout"));
            v.push(l.wo.as_slice_mut().expect("standard layout"));
        }
        v.push(self.out.as_slice_mut().expect("standard layout"));
        v
    }

    /// The names of [`Params::tensors`], in the same order.
    pub fn names(&self) -> Vec<String> {
        let mut v = vec!["embed".to_string()];
        for l in 0..self.layers.len() {
            v.extend(["router", "w01", "wo"].map(|n| format!("layer{l}.{n}")));
        }
        v.push("out".into());
        v
    }
}

/// One forward and backward: the loss and every gradient, and the routing of each layer.
pub struct StepResult {
    pub loss: f64,
    pub grads: Params,
    /// Kept assignments per expert, per layer.
    pub load: Vec<Vec<usize>>,
}

/// The mean cross-entropy of `batch` under `params`, and its gradient.
pub fn loss_and_grads(
    gemm: &dyn ExpertGemm,
    params: &Params,
    routing: &RoutingConfig,
    batch: &Batch,
) -> Result<StepResult, LayerFailure> {
    let bsz = batch.target.len();
    let hidden = params.embed.shape()[2];
    let mut h = Array2::zeros((bsz, hidden));
    for (b, ctx) in batch.context.iter().enumerate() {
        for (c, &tok) in ctx.iter().enumerate() {
            let mut row = h.row_mut(b);
            row += &params.embed.slice(ndarray::s![c, tok, ..]);
        }
    }
    let mut states: Vec<LayerState> = Vec::with_capacity(params.layers.len());
    for w in &params.layers {
        let (next, st) = layer::forward(gemm, w, routing, h)?;
        states.push(st);
        h = next;
    }
    let logits = h.dot(&params.out);
    // Softmax cross-entropy, rows shifted by their max.
    let mut dlogits = logits;
    let mut loss = 0.0;
    for (b, mut row) in dlogits.outer_iter_mut().enumerate() {
        let max = row.fold(f64::NEG_INFINITY, |m, &v| m.max(v));
        row.mapv_inplace(|v| (v - max).exp());
        let sum = row.sum();
        let target = batch.target[b];
        loss -= (row[target] / sum).ln();
        row.mapv_inplace(|v| v / sum / bsz as f64);
        row[target] -= 1.0 / bsz as f64;
    }
    loss /= bsz as f64;
    let mut grads = params.zeros_like();
    grads.out = h.t().dot(&dlogits);
    let mut dh = dlogits.dot(&params.out.t());
    for (l, st) in states.iter().enumerate().rev() {
        let (dprev, g) = layer::backward(gemm, &params.layers[l], st, dh.view())?;
        grads.layers[l] = g;
        dh = dprev;
    }
    for (b, ctx) in batch.context.iter().enumerate() {
        for (c, &tok) in ctx.iter().enumerate() {
            let mut row = grads.embed.slice_mut(ndarray::s![c, tok, ..]);
            row += &dh.row(b);
        }
    }
    let experts = params.layers.first().map_or(0, |l| l.router.ncols());
    let load = states
        .iter()
        .map(|st| {
            let r = st.routing();
            let mut count = vec![0; experts];
            for ((t, j), &kept) in r.kept.indexed_iter() {
                if kept {
                    count[r.indices[(t, j)]] += 1;
                }
            }
            count
        })
        .collect();
    Ok(StepResult { loss, grads, load })
}
