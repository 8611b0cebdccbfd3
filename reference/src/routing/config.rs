//! The routing configuration and its validation.

use serde::{Deserialize, Serialize};

use super::convention::{Convention, GroupScore, SigmoidNorm, SlotOrder, Ties};
use crate::Error;

/// The `ε` in the normalisation `g / (Σ g + ε)` (Megatron, HF DeepSeek-V3).
pub const NORM_EPS: f64 = 1e-20;

/// The score function applied to the router logits (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScoreFunction {
    /// Softmax over all experts, then top-k on the probabilities.
    Softmax,
    /// Top-k on the logits, then softmax over the k selected (MaxText default, Mixtral).
    TopkSoftmax,
    /// Element-wise sigmoid, top-k, weights normalised by their sum (DeepSeek-V3).
    Sigmoid,
}

impl ScoreFunction {
    pub const ALL: [ScoreFunction; 3] = [
        ScoreFunction::Softmax,
        ScoreFunction::TopkSoftmax,
        ScoreFunction::Sigmoid,
    ];

    /// The name used on the command line and in `case.json`.
    pub fn name(self) -> &'static str {
        match self {
            ScoreFunction::Softmax => "softmax",
            ScoreFunction::TopkSoftmax => "topk-softmax",
            ScoreFunction::Sigmoid => "sigmoid",
        }
    }

    pub fn parse(s: &str) -> Option<ScoreFunction> {
        ScoreFunction::ALL.into_iter().find(|f| f.name() == s)
    }
}

impl std::fmt::Display for ScoreFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which assignments win when an expert is over capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DropPolicy {
    /// MaxText dense path: per sequence, earlier (token-major, slot-minor) assignments win.
    Position,
    /// Megatron `drop_policy="probs"`: per expert, the assignments with the largest weight
    /// win.
    Probs,
    /// Megatron `drop_policy="position"`: per expert, over all tokens, the lowest token
    /// indices win (capacity as `probs`).
    TokenOrder,
}

impl DropPolicy {
    pub fn name(self) -> &'static str {
        match self {
            DropPolicy::Position => "position",
            DropPolicy::Probs => "probs",
            DropPolicy::TokenOrder => "token-order",
        }
    }
}

impl Convention {
    /// The score function a family always uses (`None`: the router's choice).
    pub fn score(self) -> Option<ScoreFunction> {
        match self {
            Convention::HfDeepSeekV3 => Some(ScoreFunction::Sigmoid),
            Convention::HfQwen2Moe | Convention::HfQwen3Moe | Convention::HfMixtral => {
                Some(ScoreFunction::Softmax)
            }
            Convention::HfGptOss => Some(ScoreFunction::TopkSoftmax),
            _ => None,
        }
    }

    /// What the convention's own configuration calls `drop_policy = "position"`: Megatron's
    /// keeps the lowest token indices over the whole batch ([`DropPolicy::TokenOrder`]),
    /// MaxText's counts per sequence ([`DropPolicy::Position`]).
    pub fn position_policy(self) -> DropPolicy {
        match self {
            Convention::Megatron => DropPolicy::TokenOrder,
            _ => DropPolicy::Position,
        }
    }
}

/// Capacity dropping.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    /// The capacity factor `cf` (> 0, finite).
    pub factor: f64,
    pub policy: DropPolicy,
    /// Tokens per sequence `S` for [`DropPolicy::Position`] (`None`: all `T` tokens are one
    /// sequence). Must be `None` for the other policies.
    pub seq_len: Option<usize>,
}

/// Group-limited selection (DeepSeek-V3 `n_group` / `topk_group`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupLimit {
    /// Number of groups `G` (divides E).
    pub groups: usize,
    /// Groups kept per token `TG` (`1 <= TG <= G`).
    pub topk_groups: usize,
}

/// Everything that defines a routing besides the logits and the bias.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RoutingConfig {
    /// Experts per token `K`.
    pub topk: usize,
    pub score: ScoreFunction,
    /// Group-limited selection, if any.
    pub groups: Option<GroupLimit>,
    /// `norm_topk_prob`: normalise the gates by their sum (always on for sigmoid).
    pub norm_topk: bool,
    /// `routed_scaling_factor` `α` (finite, > 0, at most float32's largest value: the weights are
    /// float32; 1 for none).
    pub scaling_factor: f64,
    /// The `ε` of the normalisation; [`NORM_EPS`].
    pub norm_eps: f64,
    /// Capacity dropping, if any.
    pub capacity: Option<Capacity>,
    /// How groups are scored (with a group limit; [`GroupScore`]).
    pub group_score: GroupScore,
    /// Whether sigmoid gates are normalised ([`SigmoidNorm`]).
    pub sigmoid_norm: SigmoidNorm,
    /// Which choices among exactly equal values are valid ([`Ties`]).
    pub ties: Ties,
    /// The order of a token's slots the checker accepts ([`SlotOrder`]).
    pub slot_order: SlotOrder,
}

impl RoutingConfig {
    /// Plain top-`topk` routing with `score`: no groups, no normalisation beyond the score
    /// function's own, scaling 1, no dropping.
    pub fn new(topk: usize, score: ScoreFunction) -> RoutingConfig {
        RoutingConfig {
            topk,
            score,
            groups: None,
            norm_topk: false,
            scaling_factor: 1.0,
            norm_eps: NORM_EPS,
            capacity: None,
            group_score: GroupScore::default(),
            sigmoid_norm: SigmoidNorm::default(),
            ties: Ties::default(),
            slot_order: SlotOrder::default(),
        }
    }

    /// Whether the gates are divided by `Σ g + ε`: sigmoid as [`SigmoidNorm`] says (always;
    /// but at `K = 1` under [`SigmoidNorm::SkipK1`]; never under [`SigmoidNorm::Never`]), the
    /// others with `norm_topk`.
    pub fn normalises(&self) -> bool {
        match self.score {
            ScoreFunction::Sigmoid => match self.sigmoid_norm {
                SigmoidNorm::Always => true,
                SigmoidNorm::SkipK1 => self.topk != 1,
                SigmoidNorm::Never => false,
            },
            ScoreFunction::Softmax | ScoreFunction::TopkSoftmax => self.norm_topk,
        }
    }

    /// Checks the configuration against `tokens` and `experts`. The error names the parameter
    /// as `case.json` spells it (`topk`, `topk_groups`, `seq_len`, …); the CLI turns it into
    /// its flag.
    pub fn validate(&self, tokens: usize, experts: usize) -> Result<(), Error> {
        let bad = |what: &'static str, reason: String| Err(Error::InvalidRouting { what, reason });
        if experts == 0 {
            return bad("logits", "has 0 experts (columns)".into());
        }
        if self.topk == 0 {
            return bad("topk", "must be at least 1".into());
        }
        if self.topk > experts {
            return bad(
                "topk",
                format!("{} is more than the {experts} experts", self.topk),
            );
        }
        if let Some(g) = self.groups {
            if g.groups == 0 {
                return bad("groups", "must be at least 1".into());
            }
            if !experts.is_multiple_of(g.groups) {
                return bad(
                    "groups",
                    format!("{} does not divide the {experts} experts", g.groups),
                );
            }
            if g.topk_groups == 0 {
                return bad("topk_groups", "must be at least 1".into());
            }
            if g.topk_groups > g.groups {
                return bad(
                    "topk_groups",
                    format!("{} is more than the {} groups", g.topk_groups, g.groups),
                );
            }
            if self.group_score == GroupScore::TopKPerGroup && self.topk < g.topk_groups {
                return bad(
                    "topk",
                    format!(
                        "{} is less than the {} kept groups: group score top-k-per-group sums \
                         the top topk/topk_groups = 0 scores of each group",
                        self.topk, g.topk_groups
                    ),
                );
            }
            let allowed = g.topk_groups * (experts / g.groups);
            if self.topk > allowed {
                return bad(
                    "topk",
                    format!(
                        "{} is more than the {allowed} experts in the {} kept groups",
                        self.topk, g.topk_groups
                    ),
                );
            }
        }
        if !(self.scaling_factor.is_finite() && self.scaling_factor > 0.0) {
            return bad(
                "scaling_factor",
                format!("{} must be finite and positive", self.scaling_factor),
            );
        }
        // Weights are at most α (gates are probabilities, normalised weights sum to at most 1)
        // and are written as float32: a larger α would write infinite weights.
        if self.scaling_factor > f64::from(f32::MAX) {
            return bad(
                "scaling_factor",
                format!(
                    "{:e} is above float32's largest value ({:e}): the weights are float32 and would be infinite",
                    self.scaling_factor,
                    f32::MAX
                ),
            );
        }
        if !(self.norm_eps.is_finite() && self.norm_eps >= 0.0) {
            return bad(
                "norm_eps",
                format!("{} must be finite and >= 0", self.norm_eps),
            );
        }
        if let Some(c) = self.capacity {
            if !(c.factor.is_finite() && c.factor > 0.0) {
                return bad(
                    "capacity_factor",
                    format!("{} must be finite and positive", c.factor),
                );
            }
            match (c.policy, c.seq_len) {
                (DropPolicy::Probs | DropPolicy::TokenOrder, Some(_)) => {
                    return bad(
                        "seq_len",
                        format!(
                        "only applies to MaxText's per-sequence position drop policy, not to {}",
                        c.policy.name()
                    ),
                    )
                }
                (DropPolicy::Position, Some(0)) => {
                    return bad("seq_len", "must be at least 1".into())
                }
                (DropPolicy::Position, _) if self.slot_order == SlotOrder::Any => {
                    return bad(
                        "slot_order",
                        "any cannot be checked with drop_policy position, which ranks a token's \
                         assignments by slot"
                            .into(),
                    )
                }
                (DropPolicy::Position, Some(s)) if !tokens.is_multiple_of(s) => {
                    return bad(
                        "seq_len",
                        format!("{s} does not divide the {tokens} tokens"),
                    )
                }
                _ => {}
            }
        }
        Ok(())
    }
}
