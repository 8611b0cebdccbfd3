//! The routing flags `moecheck route` and `moecheck moe` share, as one clap struct flattened
//! into both. `--topk` and `--score` have no default here: `route` requires them and `moe`
//! defaults them to 2 and `topk-softmax`, each in its own command (`mut_arg` on the flattened
//! arguments), so both commands keep the flags they always had.

use clap::Args;

use moecheck_reference::routing::{
    Capacity, Convention, DropPolicy, GroupLimit, GroupScore, RoutingConfig, ScoreFunction,
    SigmoidNorm, SlotOrder, Ties, NORM_EPS,
};

#[derive(Debug, Args)]
pub struct RoutingFlags {
    /// Experts per token K.
    #[arg(long)]
    pub topk: Option<usize>,
    /// Score function.
    #[arg(long, value_enum)]
    pub score: Option<ScoreArg>,
    /// Group-limited selection: number of expert groups G (divides E; DeepSeek-V3 n_group).
    #[arg(long, requires = "topk_groups")]
    pub groups: Option<usize>,
    /// Groups kept per token TG (DeepSeek-V3 topk_group; ranked by --group-score).
    #[arg(long, requires = "groups")]
    pub topk_groups: Option<usize>,
    /// Conventions of a public router: maxtext (default; jax.lax.top_k ties), megatron
    /// (Megatron-Core: top-k-per-group, skip-k1, ties any, position = token-order),
    /// deepseek-v3 (top2, always, ties any), or a Hugging Face transformers family, which also
    /// sets --score, --norm-topk's default, the slot order and (moe) the layer's structure:
    /// hf-deepseek-v3 (sigmoid, top2, ties any, slot order any, norm_topk_prob on: --no-norm-topk
    /// gives --sigmoid-norm never), hf-qwen2-moe (softmax, ties any, norm off, gated shared
    /// expert), hf-qwen3-moe (softmax, ties any, norm off), hf-mixtral (softmax, ties any,
    /// norm on) or hf-gpt-oss (topk-softmax, ties any; moe: clamped SwiGLU, expert and router
    /// biases). The other flags override it.
    #[arg(long, value_enum)]
    pub convention: Option<ConventionArg>,
    /// How a group is scored: top2 (sum of its two largest scores; MaxText, DeepSeek-V3's Gate
    /// with a bias, Hugging Face DeepseekV3TopkRouter with or without one), top-k-per-group
    /// (sum of its topk/topk_groups largest; Megatron-Core) or max (DeepSeek-V3's own
    /// inference Gate without a bias). Default: the convention's.
    #[arg(long, value_enum)]
    pub group_score: Option<GroupScoreArg>,
    /// Sigmoid weights divided by their sum: always (DeepSeek-V3's Gate, MaxText), skip-k1
    /// (not at K = 1; Megatron-Core) or never (the sigmoids times --scaling-factor; Hugging
    /// Face DeepseekV3TopkRouter without norm_topk_prob). Default: the convention's.
    #[arg(long, value_enum)]
    pub sigmoid_norm: Option<SigmoidNormArg>,
    /// Exact ties: lower-index (the lower expert, group or token index wins; jax.lax.top_k)
    /// or any (any choice among exactly equal values is valid, as torch.topk; the check
    /// follows the implementation's choice). Default: the convention's.
    #[arg(long, value_enum)]
    pub ties: Option<TiesArg>,
    /// Order of a token's K slots: score (largest selection score first; jax.lax.top_k,
    /// torch.topk) or any (a token's experts as a set, each weight with its expert;
    /// torch.topk(sorted=False), Hugging Face DeepseekV3TopkRouter). Not with
    /// --drop-policy position. Default: the convention's (score but for hf-deepseek-v3).
    #[arg(long, value_enum)]
    pub slot_order: Option<SlotOrderArg>,
    /// Normalise softmax gates by their sum (norm_topk_prob). Sigmoid weights follow
    /// --sigmoid-norm instead (under hf-deepseek-v3 its default follows this flag).
    /// Default: off, or the Hugging Face family's configuration default.
    #[arg(long, overrides_with = "no_norm_topk")]
    pub norm_topk: bool,
    /// Do not normalise softmax gates (turns off a --norm-topk given earlier, or a family's).
    #[arg(long, overrides_with = "norm_topk")]
    pub no_norm_topk: bool,
    /// routed_scaling_factor: the weights are multiplied by it.
    #[arg(long, default_value_t = 1.0)]
    pub scaling_factor: f64,
    /// Capacity factor: drop assignments over each expert's capacity (needs --drop-policy).
    #[arg(long, requires = "drop_policy")]
    pub capacity_factor: Option<f64>,
    /// Which assignments survive: position (MaxText: per sequence, earlier wins; under
    /// --convention megatron it means token-order), probs (Megatron: per expert, larger
    /// weight wins) or token-order (Megatron's position: per expert, lower token index wins).
    #[arg(long, value_enum, requires = "capacity_factor")]
    pub drop_policy: Option<DropArg>,
    /// Tokens per sequence for --drop-policy position (default: all tokens are one sequence).
    #[arg(long, requires = "drop_policy")]
    pub seq_len: Option<usize>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ScoreArg {
    Softmax,
    TopkSoftmax,
    Sigmoid,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum DropArg {
    Position,
    Probs,
    TokenOrder,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ConventionArg {
    Maxtext,
    Megatron,
    #[value(name = "deepseek-v3")]
    DeepseekV3,
    #[value(name = "hf-deepseek-v3")]
    HfDeepseekV3,
    #[value(name = "hf-qwen2-moe")]
    HfQwen2Moe,
    #[value(name = "hf-qwen3-moe")]
    HfQwen3Moe,
    #[value(name = "hf-mixtral")]
    HfMixtral,
    #[value(name = "hf-gpt-oss")]
    HfGptOss,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum GroupScoreArg {
    Top2,
    TopKPerGroup,
    Max,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum SigmoidNormArg {
    Always,
    SkipK1,
    Never,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum SlotOrderArg {
    Score,
    Any,
}

impl From<SlotOrderArg> for SlotOrder {
    fn from(s: SlotOrderArg) -> Self {
        match s {
            SlotOrderArg::Score => SlotOrder::Score,
            SlotOrderArg::Any => SlotOrder::Any,
        }
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum TiesArg {
    LowerIndex,
    Any,
}

impl From<ConventionArg> for Convention {
    fn from(c: ConventionArg) -> Self {
        match c {
            ConventionArg::Maxtext => Convention::MaxText,
            ConventionArg::Megatron => Convention::Megatron,
            ConventionArg::DeepseekV3 => Convention::DeepSeekV3,
            ConventionArg::HfDeepseekV3 => Convention::HfDeepSeekV3,
            ConventionArg::HfQwen2Moe => Convention::HfQwen2Moe,
            ConventionArg::HfQwen3Moe => Convention::HfQwen3Moe,
            ConventionArg::HfMixtral => Convention::HfMixtral,
            ConventionArg::HfGptOss => Convention::HfGptOss,
        }
    }
}

impl From<GroupScoreArg> for GroupScore {
    fn from(g: GroupScoreArg) -> Self {
        match g {
            GroupScoreArg::Top2 => GroupScore::Top2,
            GroupScoreArg::TopKPerGroup => GroupScore::TopKPerGroup,
            GroupScoreArg::Max => GroupScore::Max,
        }
    }
}

impl From<SigmoidNormArg> for SigmoidNorm {
    fn from(s: SigmoidNormArg) -> Self {
        match s {
            SigmoidNormArg::Always => SigmoidNorm::Always,
            SigmoidNormArg::SkipK1 => SigmoidNorm::SkipK1,
            SigmoidNormArg::Never => SigmoidNorm::Never,
        }
    }
}

impl From<TiesArg> for Ties {
    fn from(t: TiesArg) -> Self {
        match t {
            TiesArg::LowerIndex => Ties::LowerIndex,
            TiesArg::Any => Ties::Any,
        }
    }
}

impl From<ScoreArg> for ScoreFunction {
    fn from(s: ScoreArg) -> Self {
        match s {
            ScoreArg::Softmax => ScoreFunction::Softmax,
            ScoreArg::TopkSoftmax => ScoreFunction::TopkSoftmax,
            ScoreArg::Sigmoid => ScoreFunction::Sigmoid,
        }
    }
}

impl DropArg {
    /// The policy under `convention` (`position` is the convention's own position policy).
    fn policy(self, convention: Convention) -> DropPolicy {
        match self {
            DropArg::Position => convention.position_policy(),
            DropArg::Probs => DropPolicy::Probs,
            DropArg::TokenOrder => DropPolicy::TokenOrder,
        }
    }
}

impl RoutingFlags {
    /// The declared convention (`maxtext` when none is given).
    pub fn convention(&self) -> Convention {
        self.convention.map_or(Convention::MaxText, Into::into)
    }

    /// The routing configuration (validated later, against the logits' shape). `--topk` is
    /// always given (each command requires it or gives it a default); `--score` falls back to
    /// the convention's, then to `default_score` (the command's own default, if it has one).
    pub fn config(&self, default_score: Option<ScoreFunction>) -> anyhow::Result<RoutingConfig> {
        let topk = self
            .topk
            .ok_or_else(|| anyhow::anyhow!("--topk is required"))?;
        let convention = self.convention();
        let score = self
            .score
            .map(ScoreFunction::from)
            .or(convention.score())
            .or(default_score)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--score is required (--convention {} does not set one)",
                    convention.name()
                )
            })?;
        // clap requires --groups and --topk-groups together, and --capacity-factor with
        // --drop-policy.
        let groups = match (self.groups, self.topk_groups) {
            (Some(groups), Some(topk_groups)) => Some(GroupLimit {
                groups,
                topk_groups,
            }),
            _ => None,
        };
        let capacity = match (self.capacity_factor, self.drop_policy) {
            (Some(factor), Some(policy)) => Some(Capacity {
                factor,
                policy: policy.policy(convention),
                seq_len: self.seq_len,
            }),
            _ => None,
        };
        if self.no_norm_topk && convention.always_norm_topk() {
            anyhow::bail!(
                "--no-norm-topk: --convention {} always renormalises its top k (its router has no switch)",
                convention.name()
            );
        }
        // --norm-topk and --no-norm-topk override each other: at most one is set.
        let norm_topk = if self.norm_topk {
            true
        } else if self.no_norm_topk {
            false
        } else {
            convention.norm_topk().unwrap_or(false)
        };
        Ok(RoutingConfig {
            topk,
            score,
            groups,
            norm_topk,
            scaling_factor: self.scaling_factor,
            norm_eps: NORM_EPS,
            capacity,
            group_score: self
                .group_score
                .map_or(convention.group_score(), Into::into),
            sigmoid_norm: self
                .sigmoid_norm
                .map_or(convention.sigmoid_norm_for(norm_topk), Into::into),
            ties: self.ties.map_or(convention.ties(), Into::into),
            slot_order: self.slot_order.map_or(convention.slot_order(), Into::into),
        })
    }
}
