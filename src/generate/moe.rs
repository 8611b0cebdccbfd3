//! Whole-layer cases for `moecheck moe`: the shape, the routing and the input dtype of the
//! flags, values hashed from the seed ([`moecheck_properties::moe::MoeArgs`], the cases the
//! layer properties draw), redrawn until the case has no near tie.
//!
//! A case whose top-k, group or `probs`-capacity margins are within the selection-score error
//! of the implementation's declared precision ([`tie_guard`]) cannot decide: a correct
//! implementation may route it differently. Draw `d` uses the value seed
//! `mix(seed ^ mix(d))`; the first draw without a near tie is checked, and the report says
//! how many were drawn.

use anyhow::Context;

use moecheck_properties::moe::MoeArgs;
use moecheck_reference::format::Format;
use moecheck_reference::moe::ffn::Activation;
use moecheck_reference::moe::{tie_guard, LayerPrecision, MoeCase, MoeLayer};
use moecheck_reference::routing::RoutingConfig;
use moecheck_reference::seed::mix;

use super::route::as_flag;
use super::ParamError;
use crate::pipeline::{Generate, Generated};

/// Most cases drawn while looking for one without a near tie.
pub const MAX_DRAWS: usize = 64;

/// Everything that defines a generated layer case.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeSpec {
    pub tokens: usize,
    pub hidden: usize,
    pub experts: usize,
    pub ffn: usize,
    /// Shared-expert width, 0 for none.
    pub shared_ffn: usize,
    /// Gate the shared expert by `σ(x·g)` (Qwen2-MoE).
    pub shared_gate: bool,
    /// The experts' activation.
    pub activation: Activation,
    /// Per-expert biases and a router-logit bias (gpt-oss).
    pub expert_bias: bool,
    pub router_bias: bool,
    pub routing: RoutingConfig,
    /// A per-expert selection bias.
    pub bias: bool,
    /// Every input value is exactly representable in it.
    pub dtype: Format,
    pub seed: u64,
}

impl MoeSpec {
    /// Checks the parameters; the error names the parameter (a routing one as its flag).
    pub fn validate(&self) -> anyhow::Result<()> {
        for (param, v) in [
            ("experts", self.experts),
            ("tokens", self.tokens),
            ("hidden", self.hidden),
            ("ffn", self.ffn),
        ] {
            if v == 0 {
                anyhow::bail!(ParamError::new(param, "must be at least 1").as_flag());
            }
        }
        if self.shared_gate && self.shared_ffn == 0 {
            let why = "sigmoid needs a shared expert (--shared-ffn > 0)";
            anyhow::bail!(ParamError::new("shared-gate", why).as_flag());
        }
        if !matches!(self.dtype, Format::Bf16 | Format::F32 | Format::F16) {
            let why = format!("expected bf16, f16 or f32, got {}", self.dtype);
            anyhow::bail!(ParamError::new("dtype", why).as_flag());
        }
        self.routing
            .validate(self.tokens, self.experts)
            .map_err(as_flag)
    }

    /// The case of draw `draw`.
    pub fn draw(&self, draw: usize) -> MoeCase {
        MoeArgs {
            tokens: self.tokens,
            hidden: self.hidden,
            experts: self.experts,
            ffn: self.ffn,
            shared_ffn: self.shared_ffn,
            shared_gate: self.shared_gate,
            activation: self.activation,
            expert_bias: self.expert_bias,
            router_bias: self.router_bias,
            routing: self.routing,
            bias: self.bias,
            dtype: self.dtype,
            value_seed: mix(self.seed ^ mix(draw as u64)),
        }
        .build()
    }
}

impl Generate<MoeLayer> for MoeSpec {
    fn work(&self) -> u64 {
        [self.tokens, self.routing.topk, self.hidden, self.ffn]
            .iter()
            .map(|&v| v as u64)
            .product()
    }

    /// The first draw without a near tie at the precision the implementation declares.
    fn generate(
        &self,
        precision: &dyn Fn(&MoeCase) -> LayerPrecision,
    ) -> anyhow::Result<Generated<MoeLayer>> {
        self.validate()?;
        let mut last = String::new();
        for draw in 0..MAX_DRAWS {
            let case = self.draw(draw);
            match tie_guard(&case, &precision(&case)).context("generated case")? {
                None => {
                    return Ok(Generated {
                        case,
                        ask: (),
                        draws: draw + 1,
                    })
                }
                Some(why) => last = why,
            }
        }
        // Another seed draws from the same distribution: with this many tokens per draw a near
        // tie is all but certain, so say what does change the odds.
        anyhow::bail!(
            "--tokens {}: every one of {MAX_DRAWS} draws has a top-k/group/capacity near tie or an activation input at a clamp, at the declared precision (the last: {last}); the chance of one grows with the number of tokens and experts, so another --seed rarely helps: use fewer --tokens (each draw is one chance per token) or a more precise --compute",
            self.tokens
        )
    }
}
