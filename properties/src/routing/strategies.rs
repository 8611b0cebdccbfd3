//! proptest strategies for routing cases.
//!
//! A case is built from named arguments ([`RouteArgs`]): the shape (`T`, `E`, `K`, groups), the
//! configuration (score function, `norm_topk`, scaling, capacity) and a logit *pattern* with a
//! seed. Logits and biases lie on coarse binary grids, so distinct scores are far apart (no
//! accidental near-ties) and equal grid values give exactly equal scores (real ties).
//!
//! Edge-biased: `T ∈ {0, 1}`, `E = 1`, `K = E`, one group, `TG = G`, all logits equal, few
//! distinct values (ties everywhere), one hot expert that every token wants (capacity far
//! below demand), wide logits (softmax weights spanning many orders of magnitude), capacity
//! factors below 1, sequences of one token.

use moecheck_reference::routing::{
    Capacity, DropPolicy, GroupLimit, GroupScore, RoutingCase, RoutingConfig, ScoreFunction,
    SigmoidNorm, SlotOrder, Ties, NORM_EPS,
};
use moecheck_reference::seed::mix;
use ndarray::{Array1, Array2};
use proptest::prelude::*;

/// Most tokens in a case.
pub const MAX_TOKENS: usize = 24;
/// Most experts in a case.
pub const MAX_EXPERTS: usize = 16;
/// Capacity factors drawn (below, at and above 1).
pub const CAPACITY_FACTORS: [f64; 5] = [0.25, 0.5, 1.0, 1.25, 2.0];
/// Scaling factors drawn (`routed_scaling_factor`; 2.5 is DeepSeek-V3's).
pub const SCALING_FACTORS: [f64; 2] = [1.0, 2.5];

/// How the logits are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitPattern {
    /// Integers in `-16..=16` times 1/4.
    Grid,
    /// Integers in `-1..=1` times 1/2: ties everywhere.
    FewValues,
    /// Every logit 1/2: every score ties.
    Equal,
    /// [`LogitPattern::Grid`] plus 6 on expert `hot % E`: every token wants it.
    Hot(usize),
    /// Integers in `-40..=40`: softmax weights spanning many orders of magnitude, the
    /// smallest (`e^-80`, about `1.8e-35`) still above f32's smallest normal, so an f32
    /// router's scores never underflow into ties the checker cannot decide.
    Wide,
}

/// What a generated case must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RouteRequire {
    /// `Some(true)`: capacity dropping with `K >= 2` and often over demand; `Some(false)`: none.
    pub capacity: Option<bool>,
    /// A non-zero selection bias.
    pub bias: bool,
    /// Group-limited selection with `G >= 2`, `E/G >= 2` and `TG < G`.
    pub groups: bool,
    /// A tie-heavy logit pattern.
    pub ties: bool,
    /// Sigmoid scores with `K = 1` and no groups (where `sigmoid_norm` decides the weight).
    pub k1_sigmoid: bool,
    /// Sigmoid scores, any shape.
    pub sigmoid: bool,
}

/// The arguments a routing case is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteArgs {
    pub tokens: usize,
    pub experts: usize,
    pub topk: usize,
    pub score: ScoreFunction,
    /// `(G, TG)`.
    pub groups: Option<(usize, usize)>,
    pub norm_topk: bool,
    pub scaling_factor: f64,
    /// How groups are scored (`top-k-per-group` only where `K >= TG`).
    pub group_score: GroupScore,
    pub sigmoid_norm: SigmoidNorm,
    /// `(cf, policy, S)`.
    pub capacity: Option<(f64, DropPolicy, Option<usize>)>,
    pub logits: LogitPattern,
    /// Bias integers in `-bias_max..=bias_max` times 1/8; `None`: no bias.
    pub bias_max: Option<i32>,
    pub value_seed: u64,
    /// The order of a token's slots the checker accepts: [`SlotOrder::Score`] as drawn, `any`
    /// where the implementation declares it ([`super::RouteDomain`]).
    pub slot_order: SlotOrder,
    /// Which choices among equal values are valid: [`Ties::LowerIndex`] as drawn (the
    /// properties check that order; the checker's `any` is tested on its own), `any` where
    /// the implementation declares it ([`super::RouteDomain`]).
    pub ties: Ties,
}

impl RouteArgs {
    /// An integer in `-max..=max` for element `index` of array `tag`.
    fn int(&self, tag: u64, index: usize, max: i32) -> i32 {
        let h = mix(self.value_seed ^ mix((tag << 56) ^ index as u64));
        let span = 2 * max.max(0) as u64 + 1;
        (h % span) as i32 - max.max(0)
    }

    pub fn config(&self) -> RoutingConfig {
        RoutingConfig {
            topk: self.topk,
            score: self.score,
            groups: self.groups.map(|(groups, topk_groups)| GroupLimit {
                groups,
                topk_groups,
            }),
            norm_topk: self.norm_topk,
            scaling_factor: self.scaling_factor,
            norm_eps: NORM_EPS,
            capacity: self.capacity.map(|(factor, policy, seq_len)| Capacity {
                factor,
                policy,
                seq_len,
            }),
            group_score: self.group_score,
            sigmoid_norm: self.sigmoid_norm,
            ties: self.ties,
            slot_order: self.slot_order,
        }
    }

    pub fn logits(&self) -> Array2<f64> {
        let e = self.experts;
        Array2::from_shape_fn((self.tokens, e), |(t, x)| {
            let i = t * e + x;
            match self.logits {
                LogitPattern::Grid => self.int(0, i, 16) as f64 * 0.25,
                LogitPattern::FewValues => self.int(0, i, 1) as f64 * 0.5,
                LogitPattern::Equal => 0.5,
                LogitPattern::Hot(h) => {
                    self.int(0, i, 16) as f64 * 0.25 + if x == h % e { 6.0 } else { 0.0 }
                }
                LogitPattern::Wide => self.int(0, i, 40) as f64,
            }
        })
    }

    pub fn bias(&self) -> Option<Array1<f64>> {
        self.bias_max
            .map(|m| Array1::from_shape_fn(self.experts, |x| self.int(1, x, m) as f64 * 0.125))
    }

    /// The routing case.
    pub fn build(&self) -> RoutingCase {
        RoutingCase {
            logits: self.logits(),
            bias: self.bias(),
            config: self.config(),
        }
    }
}

fn experts(req: RouteRequire) -> BoxedStrategy<usize> {
    if req.groups {
        prop_oneof![Just(4usize), Just(6), Just(8), Just(12), Just(16)].boxed()
    } else {
        prop_oneof![
            1 => Just(1usize),
            1 => Just(2usize),
            4 => 3usize..=MAX_EXPERTS,
            2 => prop_oneof![Just(8usize), Just(16)],
        ]
        .boxed()
    }
}

fn tokens(req: RouteRequire) -> BoxedStrategy<usize> {
    if req.capacity == Some(true) {
        (2usize..=MAX_TOKENS).boxed()
    } else {
        prop_oneof![1 => Just(0usize), 1 => Just(1usize), 6 => 2usize..=MAX_TOKENS].boxed()
    }
}

fn pattern(req: RouteRequire) -> BoxedStrategy<LogitPattern> {
    if req.ties {
        prop_oneof![
            3 => Just(LogitPattern::FewValues),
            1 => Just(LogitPattern::Equal),
        ]
        .boxed()
    } else if req.capacity == Some(true) {
        prop_oneof![
            3 => (0usize..MAX_EXPERTS).prop_map(LogitPattern::Hot),
            3 => Just(LogitPattern::Grid),
            1 => Just(LogitPattern::FewValues),
            1 => Just(LogitPattern::Equal),
        ]
        .boxed()
    } else {
        prop_oneof![
            5 => Just(LogitPattern::Grid),
            2 => Just(LogitPattern::FewValues),
            1 => Just(LogitPattern::Equal),
            1 => (0usize..MAX_EXPERTS).prop_map(LogitPattern::Hot),
            1 => Just(LogitPattern::Wide),
        ]
        .boxed()
    }
}

fn score() -> impl Strategy<Value = ScoreFunction> {
    prop_oneof![
        Just(ScoreFunction::Softmax),
        Just(ScoreFunction::TopkSoftmax),
        Just(ScoreFunction::Sigmoid),
    ]
}

/// `(G, TG, K)` for `E` experts.
fn shape(e: usize, req: RouteRequire) -> BoxedStrategy<(Option<(usize, usize)>, usize)> {
    let divisors: Vec<usize> = (1..=e).filter(|g| e.is_multiple_of(*g)).collect();
    let min_k = if req.capacity == Some(true) { 2 } else { 1 };
    let plain = (min_k.min(e)..=e)
        .prop_flat_map(move |k| prop_oneof![3 => Just(k), 1 => Just(e)])
        .prop_map(|k| (None, k))
        .boxed();
    let grouped_divs: Vec<usize> = if req.groups {
        divisors
            .iter()
            .copied()
            .filter(|&g| g >= 2 && e / g >= 2)
            .collect()
    } else {
        divisors
    };
    let grouped = proptest::sample::select(grouped_divs)
        .prop_flat_map(move |g| {
            let tg_max = if req.groups { g - 1 } else { g };
            (Just(g), 1usize..=tg_max)
        })
        .prop_flat_map(move |(g, tg)| {
            let allowed = tg * (e / g);
            (Just((g, tg)), min_k.min(allowed)..=allowed)
        })
        .prop_map(|(g, k)| (Some(g), k))
        .boxed();
    if req.groups {
        grouped
    } else {
        prop_oneof![3 => plain, 1 => grouped].boxed()
    }
}

fn capacity(
    t: usize,
    req: RouteRequire,
) -> BoxedStrategy<Option<(f64, DropPolicy, Option<usize>)>> {
    let divisors: Vec<usize> = (1..=t.max(1)).filter(|s| t.is_multiple_of(*s)).collect();
    let some = (
        proptest::sample::select(CAPACITY_FACTORS.to_vec()),
        prop_oneof![
            Just(DropPolicy::Position),
            Just(DropPolicy::Probs),
            Just(DropPolicy::TokenOrder)
        ],
        proptest::sample::select(divisors),
        any::<bool>(),
    )
        .prop_map(move |(cf, policy, s, whole)| {
            let seq = match policy {
                DropPolicy::Probs | DropPolicy::TokenOrder => None,
                DropPolicy::Position if whole || t == 0 => None,
                DropPolicy::Position => Some(s),
            };
            Some((cf, policy, seq))
        });
    match req.capacity {
        Some(true) => some.boxed(),
        Some(false) => Just(None).boxed(),
        None => prop_oneof![2 => Just(None), 1 => some].boxed(),
    }
}

/// The declared conventions: MaxText's more often than the others.
fn conventions() -> impl Strategy<Value = (GroupScore, SigmoidNorm)> {
    (
        prop_oneof![
            2 => Just(GroupScore::Top2),
            1 => Just(GroupScore::TopKPerGroup),
            1 => Just(GroupScore::Max),
        ],
        prop_oneof![
            Just(SigmoidNorm::Always),
            Just(SigmoidNorm::SkipK1),
            Just(SigmoidNorm::Never)
        ],
    )
}

/// Routing cases meeting `req`.
pub fn route_args(req: RouteRequire) -> BoxedStrategy<RouteArgs> {
    (
        experts(req),
        tokens(req),
        if req.k1_sigmoid || req.sigmoid {
            Just(ScoreFunction::Sigmoid).boxed()
        } else {
            score().boxed()
        },
        any::<bool>(),
        proptest::sample::select(SCALING_FACTORS.to_vec()),
        pattern(req),
        if req.bias {
            (1i32..=8).prop_map(Some).boxed()
        } else {
            prop_oneof![2 => Just(None), 1 => (1i32..=8).prop_map(Some)].boxed()
        },
        any::<u64>(),
    )
        .prop_flat_map(
            move |(e, t, score, norm_topk, scale, logits, bias_max, seed)| {
                (
                    Just((e, t, score, norm_topk, scale, logits, bias_max, seed)),
                    if req.k1_sigmoid {
                        Just((None, 1)).boxed()
                    } else {
                        shape(e, req)
                    },
                    capacity(t, req),
                    conventions(),
                )
            },
        )
        .prop_map(
            |(
                (experts, tokens, score, norm_topk, scaling_factor, logits, bias_max, value_seed),
                (groups, topk),
                capacity,
                (group_score, sigmoid_norm),
            )| {
                // Megatron's rule sums the top K/TG scores: at least one.
                let group_score = match groups {
                    Some((_, tg)) if topk < tg && group_score == GroupScore::TopKPerGroup => {
                        GroupScore::Top2
                    }
                    _ => group_score,
                };
                // Wide logits are for softmax weights over many orders of magnitude. Under
                // sigmoid they saturate (sigmoid(16) and sigmoid(17) are both 1 in f32), and
                // with groups the group sums meet within 1e-13 (0.5 + 2e-14 against
                // 0.5 - 2e-14, both 0.5 in f32): near-ties no f32 router can decide, which the
                // checker does not flag as undecidable for group scores. Grid logits there.
                let logits = match (score, groups, logits) {
                    (ScoreFunction::Sigmoid, _, LogitPattern::Wide)
                    | (_, Some(_), LogitPattern::Wide) => LogitPattern::Grid,
                    (_, _, l) => l,
                };
                RouteArgs {
                    group_score,
                    sigmoid_norm,
                    tokens,
                    experts,
                    topk,
                    score,
                    groups,
                    norm_topk,
                    scaling_factor,
                    capacity,
                    logits,
                    bias_max,
                    value_seed,
                    ties: Ties::LowerIndex,
                    slot_order: SlotOrder::Score,
                }
            },
        )
        .boxed()
}
