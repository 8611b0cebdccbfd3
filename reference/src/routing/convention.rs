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
//! | `hf-deepseek-v3` | `top2` | `always` with `norm_topk_prob`, else `never` | `any` | `position` |
//! | `hf-qwen2-moe`, `hf-qwen3-moe`, `hf-mixtral`, `hf-gpt-oss` | `top2` | `always` | `any` | `position` |
//!
//! The Hugging Face families (transformers 5.25) also set the slot order (`any` for
//! `hf-deepseek-v3`: `torch.topk(sorted=False)`), the score function (sigmoid for DeepSeek-V3,
//! a softmax over the top k for gpt-oss, over all experts for the others) and the default of `norm_topk_prob` (their
//! configuration classes': true for DeepSeek-V3 and Mixtral, whose router always
//! renormalises; false for Qwen2-MoE and Qwen3-MoE). Explicit flags override each.
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

/// A named set of conventions (`--convention`): a public router's choices where routers
/// legitimately differ, and, for the Hugging Face families, the defaults of the score function
/// and `norm_topk_prob` their configuration classes set (transformers 5.25, `modeling_*.py`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Convention {
    MaxText,
    Megatron,
    DeepSeekV3,
    /// transformers `DeepseekV3TopkRouter`: sigmoid, groups by their top-2 sum,
    /// `torch.topk(sorted=False)`, sigmoid weights normalised only with `norm_topk_prob`
    /// (`DeepseekV3Config` default: true).
    HfDeepSeekV3,
    /// transformers `Qwen2MoeTopKRouter`: softmax over all experts, `torch.topk`,
    /// `norm_topk_prob` (`Qwen2MoeConfig` default: false); the layer's shared expert is gated
    /// (`shared_expert_gate`).
    HfQwen2Moe,
    /// transformers `Qwen3MoeTopKRouter`: as Qwen2-MoE's (`Qwen3MoeConfig` default
    /// `norm_topk_prob`: false; the released checkpoints set true); no shared expert.
    HfQwen3Moe,
    /// transformers `MixtralTopKRouter`: softmax over all experts, `torch.topk`, the top-k
    /// always renormalised.
    HfMixtral,
    /// transformers `GptOssTopKRouter`: `torch.topk` of the biased logits, softmax over the
    /// top k; its layer (`GptOssExperts`) has the clamped SwiGLU and expert biases.
    HfGptOss,
}

impl Convention {
    pub const ALL: [Convention; 8] = [
        Convention::MaxText,
        Convention::Megatron,
        Convention::DeepSeekV3,
        Convention::HfDeepSeekV3,
        Convention::HfQwen2Moe,
        Convention::HfQwen3Moe,
        Convention::HfMixtral,
        Convention::HfGptOss,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Convention::MaxText => "maxtext",
            Convention::Megatron => "megatron",
            Convention::DeepSeekV3 => "deepseek-v3",
            Convention::HfDeepSeekV3 => "hf-deepseek-v3",
            Convention::HfQwen2Moe => "hf-qwen2-moe",
            Convention::HfQwen3Moe => "hf-qwen3-moe",
            Convention::HfMixtral => "hf-mixtral",
            Convention::HfGptOss => "hf-gpt-oss",
        }
    }

    /// Whether this is one of transformers' families whose router scores in f32 whatever the
    /// module's dtype (all but gpt-oss's, which runs in the module's dtype).
    pub fn router_in_f32(self) -> bool {
        !matches!(
            self,
            Convention::MaxText
                | Convention::Megatron
                | Convention::DeepSeekV3
                | Convention::HfGptOss
        )
    }

    pub fn group_score(self) -> GroupScore {
        match self {
            Convention::Megatron => GroupScore::TopKPerGroup,
            _ => GroupScore::Top2,
        }
    }

    /// The sigmoid normalisation when `norm_topk` is the declared `norm_topk_prob`: only
    /// `hf-deepseek-v3` ties it to `norm_topk_prob` (`never` without it).
    pub fn sigmoid_norm_for(self, norm_topk: bool) -> SigmoidNorm {
        match self {
            Convention::HfDeepSeekV3 if !norm_topk => SigmoidNorm::Never,
            _ => self.sigmoid_norm(),
        }
    }

    pub fn sigmoid_norm(self) -> SigmoidNorm {
        match self {
            Convention::Megatron => SigmoidNorm::SkipK1,
            _ => SigmoidNorm::Always,
        }
    }

    pub fn ties(self) -> Ties {
        match self {
            Convention::MaxText => Ties::LowerIndex,
            _ => Ties::Any,
        }
    }

    /// `torch.topk(sorted=False)` in `hf-deepseek-v3`; largest first elsewhere.
    pub fn slot_order(self) -> SlotOrder {
        match self {
            Convention::HfDeepSeekV3 => SlotOrder::Any,
            _ => SlotOrder::Score,
        }
    }

    /// Whether the family's router always renormalises its top k whatever
    /// `norm_topk_prob` says (`MixtralTopKRouter` has no switch).
    pub fn always_norm_topk(self) -> bool {
        self == Convention::HfMixtral
    }

    /// `norm_topk_prob` as the family's configuration class sets it by default (`None`: off
    /// unless declared).
    pub fn norm_topk(self) -> Option<bool> {
        match self {
            Convention::HfDeepSeekV3 | Convention::HfMixtral => Some(true),
            Convention::HfQwen2Moe | Convention::HfQwen3Moe | Convention::HfGptOss => Some(false),
            _ => None,
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
