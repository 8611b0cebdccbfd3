//! `moecheck train`: a small MoE language model trained on the CPU with its expert GEMMs
//! through the implementation under test, so that a loss curve made through a kernel can be
//! diffed against the reference path's — and it can be measured which kernel bugs a matching
//! loss curve hides.
//!
//! * [`data`]: a seeded Markov chain whose entropy rate (the best achievable loss) is exact;
//! * [`model`], [`layer`]: the model, its loss and hand-written gradients;
//! * [`experts`]: the expert GEMMs through any grouped-GEMM or FP8 implementation;
//! * [`adam`]: the optimiser;
//! * [`log`]: the loss log (`step loss tokens_per_s`, or MaxText-style JSONL), which
//!   `moecheck curves diff` reads without options.
//!
//! A run is a pure function of its configuration and its implementation's outputs: the data
//! of step `s` depends on the data seed and `s` only, the initial weights on the init seed,
//! and everything outside the expert GEMMs is deterministic f64.

pub mod adam;
pub mod compare;
pub mod data;
pub mod experts;
pub mod layer;
pub mod log;
pub mod model;

use std::time::Instant;

use serde::Serialize;

use moecheck_reference::routing::RoutingConfig;

use adam::Adam;
use data::MarkovChain;
use experts::{ExpertGemm, GemmFailure};
use layer::LayerFailure;
use model::{loss_and_grads, Params, Shape};

/// Everything that decides a run besides the implementation.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    pub shape: Shape,
    pub routing: RoutingConfig,
    /// Examples (predicted tokens) per step.
    pub batch: usize,
    pub steps: u64,
    pub lr: f64,
    /// Seed of the initial weights.
    pub init_seed: u64,
    /// Seed of the Markov chain and of every batch.
    pub data_seed: u64,
}

/// One logged step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepLog {
    pub step: u64,
    /// Mean cross-entropy of the step's batch before the update (nats); NaN once diverged.
    pub loss: f64,
    pub step_time_s: f64,
    pub tokens_per_s: f64,
}

/// A finished run.
#[derive(Debug, Clone, Serialize)]
pub struct TrainRun {
    /// The implementation of the expert GEMMs.
    pub implementation: String,
    pub is_model: bool,
    pub steps: Vec<StepLog>,
    /// The entropy rate of the data: the lowest expected loss any model can reach.
    pub loss_floor: f64,
    /// `ln V`: the loss of a uniform prediction.
    pub uniform_loss: f64,
    /// The first step whose loss was NaN or infinite (every later step is logged NaN).
    pub diverged_at: Option<u64>,
    /// Why: the loss or a GEMM output the model reads was NaN or infinite.
    pub diverged_because: Option<String>,
    /// Kept assignments per expert of each layer at the last step that ran.
    pub last_load: Vec<Vec<usize>>,
    pub wall_s: f64,
}

impl TrainRun {
    /// The mean loss of the last `n` steps (all finite ones if fewer).
    pub fn final_loss(&self, n: usize) -> f64 {
        let tail: Vec<f64> = self.steps.iter().rev().take(n).map(|s| s.loss).collect();
        tail.iter().sum::<f64>() / tail.len().max(1) as f64
    }
    /// Tokens per second over the whole run.
    pub fn tokens_per_s(&self, batch: usize) -> f64 {
        self.steps.len() as f64 * batch as f64 / self.wall_s.max(1e-9)
    }
}

/// Why a run stopped without a curve.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TrainError {
    /// The implementation cannot run the model's GEMMs as configured (exit 2).
    #[error("{0}")]
    Refused(String),
    /// The implementation failed at a step (exit 1).
    #[error("step {step}: {reason}")]
    Failed { step: u64, reason: String },
}

/// Trains `config` with the expert GEMMs through `gemm`; `on_step` sees every step as it ends.
pub fn train(
    config: &TrainConfig,
    gemm: &dyn ExpertGemm,
    mut on_step: impl FnMut(&StepLog),
) -> Result<TrainRun, TrainError> {
    let start = Instant::now();
    let chain = MarkovChain::new(config.shape.vocab, config.data_seed);
    let mut params = Params::init(&config.shape, config.init_seed);
    let mut adam = Adam::new(&params, config.lr);
    let mut steps = Vec::with_capacity(config.steps as usize);
    let mut diverged_at = None;
    let mut diverged_because = None;
    let mut last_load = Vec::new();
    for step in 0..config.steps {
        let t0 = Instant::now();
        let loss = if diverged_at.is_some() {
            f64::NAN
        } else {
            let batch = chain.batch(step, config.batch, config.shape.context);
            match loss_and_grads(gemm, &params, &config.routing, &batch) {
                Ok(r) if r.loss.is_finite() => {
                    adam.update(&mut params, &r.grads);
                    last_load = r.load;
                    r.loss
                }
                Ok(r) => {
                    diverged_at = Some(step);
                    diverged_because = Some(format!("the loss is {}", r.loss));
                    r.loss
                }
                // Non-finite router logits (the weights have diverged), or a GEMM output the
                // model reads that is not a number.
                Err(e @ (LayerFailure::Routing(_) | LayerFailure::NonFinite(_))) => {
                    diverged_at = Some(step);
                    diverged_because = Some(e.to_string());
                    f64::NAN
                }
                Err(LayerFailure::Gemm(GemmFailure::Refused(why))) => {
                    return Err(TrainError::Refused(why))
                }
                Err(LayerFailure::Gemm(GemmFailure::Failed(reason))) => {
                    return Err(TrainError::Failed { step, reason })
                }
            }
        };
        let dt = t0.elapsed().as_secs_f64();
        let log = StepLog {
            step,
            loss,
            step_time_s: dt,
            tokens_per_s: config.batch as f64 / dt.max(1e-9),
        };
        on_step(&log);
        steps.push(log);
    }
    Ok(TrainRun {
        implementation: gemm.name(),
        is_model: gemm.is_model(),
        steps,
        loss_floor: chain.entropy_rate,
        uniform_loss: (config.shape.vocab as f64).ln(),
        diverged_at,
        diverged_because,
        last_load,
        wall_s: start.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests;
