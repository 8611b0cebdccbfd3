//! Routing conventions: where public routers legitimately differ, the user declares which
//! behaviour the implementation follows. Each value names the upstream code it follows; the
//! defaults are MaxText's (and DeepSeek-V3's with a bias), which is what moecheck checked
//! before conventions could be declared.
//!
//! | convention | `group_score` | `sigmoid_norm` | `ties` | `--drop-policy position` means ([`Convention::position_policy`]) |
//! |---|---|---|---|---|
//! | `maxtext` (default) | `top2` | `always` | `lower-index` | `position` |
//! | `megatron` | `top-k-per-group` | `skip-k1` | `any` | `token-order` |
//! | `deepseek-v3` | `top2` | `always` | `any` | `position` |
//!
//! * MaxText selects with `jax.lax.top_k`, which documents that equal elements come out lower
//!   index first; Megatron-Core and DeepSeek-V3's reference `Gate` use `torch.topk`, which
//!   promises no order among equal values, so their users declare `ties = any`.
//! * DeepSeek-V3's own `Gate` (its inference code) scores groups by their top-2 sum when it
//!   has a bias (V3 always does) and by their maximum without one: declare `--group-score
//!   max` for the latter. Hugging Face's `DeepseekV3TopkRouter` always sums the top 2.
//! * Hugging Face's `DeepseekV3TopkRouter` normalises sigmoid weights only with
//!   `norm_topk_prob`: without it, declare `--sigmoid-norm never`.

use serde::{Deserialize, Serialize};

/// How a group of experts is scored for group-limited selection (the groups with the largest
/// scores are kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GroupScore {
    /// The sum of the group's two largest selection scores (one with groups of one expert).
    /// MaxText `expert_group_mask`, DeepSeek-V3 `Gate.forward` with a bias.
    #[default]
    Top2,
    /// The sum of the group's `topk / topk_groups` (integer division) largest selection
    /// scores. Megatron-Core `group_limited_topk`.
    TopKPerGroup,
    /// The group's largest selection score. DeepSeek-V3's own inference code
    /// (`inference/model.py`, `Gate.forward`) without a bias. Not Hugging Face transformers'
    /// `DeepseekV3TopkRouter`, which sums each group's top 2 with or without a bias: its
    /// users declare `top2`.
    Max,
}

impl GroupScore {
    pub const ALL: [GroupScore; 3] = [GroupScore::Top2, GroupScore::TopKPerGroup, GroupScore::Max];

    /// The name used on the command line and in `case.json`.
    pub fn name(self) -> &'static str {
        match self {
            GroupScore::Top2 => "top2",
            GroupScore::TopKPerGroup => "top-k-per-group",
            GroupScore::Max => "max",
        }
    }

    /// How many of a group's largest selection scores are summed, for groups of `per`
    /// experts, `topk` experts per token and `topk_groups` kept groups.
    pub fn terms(self, per: usize, topk: usize, topk_groups: usize) -> usize {
        match self {
            GroupScore::Top2 => per.min(2),
            GroupScore::TopKPerGroup => (topk / topk_groups.max(1)).min(per),
            GroupScore::Max => per.min(1),
        }
    }
}

/// Whether sigmoid gates are normalised by their sum (`g / (Σ g + ε)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SigmoidNorm {
    /// Always: with `K = 1` the weight is `α·g/(g + ε)`, i.e. `α`. DeepSeek-V3 `Gate`,
    /// MaxText.
    #[default]
    Always,
    /// Not when `K = 1`: the weight is `α·g`. Megatron-Core
    /// `topk_routing_with_score_function` (`if topk > 1`).
    SkipK1,
    /// Never: the weights are the selected sigmoids times `α`. Hugging Face transformers'
    /// `DeepseekV3TopkRouter` with `norm_topk_prob = False` (it divides by the sum only when
    /// `norm_topk_prob` is set).
    Never,
}

impl SigmoidNorm {
    pub const ALL: [SigmoidNorm; 3] =
        [SigmoidNorm::Always, SigmoidNorm::SkipK1, SigmoidNorm::Never];

    pub fn name(self) -> &'static str {
        match self {
            SigmoidNorm::Always => "always",
            SigmoidNorm::SkipK1 => "skip-k1",
            SigmoidNorm::Never => "never",
        }
    }
}

/// Which choices among exactly equal values an implementation may make: in the top-k, among
/// equal group scores, and at a capacity boundary between equal weights (`probs`) or between
/// the tokens of an expert (`token-order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ties {
    /// The lower index wins (expert, group, token), and equal selection scores come out lower
    /// index first. `jax.lax.top_k` (MaxText).
    #[default]
    LowerIndex,
    /// Any choice among exactly equal values is valid (`torch.topk`: Megatron-Core,
    /// DeepSeek-V3). The checker follows the implementation's choice for everything that
    /// depends on it (weights, capacity, group sizes); a choice no tie order explains still
    /// fails.
    Any,
}

impl Ties {
    pub const ALL: [Ties; 2] = [Ties::LowerIndex, Ties::Any];

    pub fn name(self) -> &'static str {
        match self {
            Ties::LowerIndex => "lower-index",
            Ties::Any => "any",
        }
    }
}

/// The order of a token's `K` slots (its selected experts, with their weights and kept flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SlotOrder {
    /// Largest selection score first (`jax.lax.top_k`, `torch.topk(sorted=True)`).
    #[default]
    Score,
    /// Any order: a token's experts are compared as a set, each weight and kept flag with its
    /// expert. `torch.topk(sorted=False)`: Hugging Face transformers'
    /// `DeepseekV3TopkRouter`. Not with capacity dropping, whose `position` policy ranks
    /// assignments by slot.
    Any,
}

impl SlotOrder {
    pub const ALL: [SlotOrder; 2] = [SlotOrder::Score, SlotOrder::Any];

    pub fn name(self) -> &'static str {
        match self {
            SlotOrder::Score => "score",
            SlotOrder::Any => "any",
        }
    }
}

/// A named set of conventions (`--convention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Convention {
    MaxText,
    Megatron,
    DeepSeekV3,
}

impl Convention {
    pub const ALL: [Convention; 3] = [
        Convention::MaxText,
        Convention::Megatron,
        Convention::DeepSeekV3,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Convention::MaxText => "maxtext",
            Convention::Megatron => "megatron",
            Convention::DeepSeekV3 => "deepseek-v3",
        }
    }

    pub fn group_score(self) -> GroupScore {
        match self {
            Convention::Megatron => GroupScore::TopKPerGroup,
            Convention::MaxText | Convention::DeepSeekV3 => GroupScore::Top2,
        }
    }

    pub fn sigmoid_norm(self) -> SigmoidNorm {
        match self {
            Convention::Megatron => SigmoidNorm::SkipK1,
            Convention::MaxText | Convention::DeepSeekV3 => SigmoidNorm::Always,
        }
    }

    pub fn ties(self) -> Ties {
        match self {
            Convention::MaxText => Ties::LowerIndex,
            Convention::Megatron | Convention::DeepSeekV3 => Ties::Any,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_score_terms() {
        // Groups of 8, K = 8, TG = 4: top-2, top-(8/4 = 2), top-1.
        assert_eq!(GroupScore::Top2.terms(8, 8, 4), 2);
        assert_eq!(GroupScore::TopKPerGroup.terms(8, 8, 4), 2);
        assert_eq!(GroupScore::TopKPerGroup.terms(8, 6, 2), 3);
        assert_eq!(GroupScore::TopKPerGroup.terms(8, 4, 4), 1);
        assert_eq!(GroupScore::Max.terms(8, 8, 4), 1);
        // Groups of one expert: one term whatever the rule.
        assert_eq!(GroupScore::Top2.terms(1, 4, 2), 1);
        assert_eq!(GroupScore::TopKPerGroup.terms(1, 4, 2), 1);
    }
}
