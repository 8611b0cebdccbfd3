//! The routing flags `moecheck route` and `moecheck moe` share, as one clap struct flattened
//! into both. `--topk` and `--score` have no default here: `route` requires them and `moe`
//! defaults them to 2 and `topk-softmax`, each in its own command (`mut_arg` on the flattened
//! arguments), so both commands keep the flags they always had.

use clap::Args;

use moecheck_reference::routing::{
    Capacity, DropPolicy, GroupLimit, RoutingConfig, ScoreFunction, NORM_EPS,
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
    /// Groups kept per token TG (DeepSeek-V3 topk_group; ranked by the sum of their top-2
    /// scores).
    #[arg(long, requires = "groups")]
    pub topk_groups: Option<usize>,
    /// Normalise the gates by their sum (norm_topk_prob; sigmoid always normalises).
    #[arg(long)]
    pub norm_topk: bool,
    /// routed_scaling_factor: the weights are multiplied by it.
    #[arg(long, default_value_t = 1.0)]
    pub scaling_factor: f64,
    /// Capacity factor: drop assignments over each expert's capacity (needs --drop-policy).
    #[arg(long, requires = "drop_policy")]
    pub capacity_factor: Option<f64>,
    /// Which assignments survive: position (MaxText: per sequence, earlier wins) or probs
    /// (Megatron: per expert, larger weight wins).
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

impl From<DropArg> for DropPolicy {
    fn from(d: DropArg) -> Self {
        match d {
            DropArg::Position => DropPolicy::Position,
            DropArg::Probs => DropPolicy::Probs,
        }
    }
}

impl RoutingFlags {
    /// The routing configuration (validated later, against the logits' shape). `--topk` and
    /// `--score` always have a value: each command requires them or gives them a default.
    pub fn config(&self) -> anyhow::Result<RoutingConfig> {
        let topk = self
            .topk
            .ok_or_else(|| anyhow::anyhow!("--topk is required"))?;
        let score = self
            .score
            .ok_or_else(|| anyhow::anyhow!("--score is required"))?;
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
                policy: policy.into(),
                seq_len: self.seq_len,
            }),
            _ => None,
        };
        Ok(RoutingConfig {
            topk,
            score: score.into(),
            groups,
            norm_topk: self.norm_topk,
            scaling_factor: self.scaling_factor,
            norm_eps: NORM_EPS,
            capacity,
        })
    }
}
