//! proptest strategies for MoE-layer cases.
//!
//! Cases are small (at most [`MAX_TOKENS`] tokens, [`MAX_EXPERTS`] experts, hidden and FFN
//! sizes up to 6) and biased toward the edges: `k = 1` and `k = E`, more experts than
//! assignments (empty experts), tight capacity factors (dropped assignments, whole tokens
//! dropped), one-expert groups, a shared expert (gated or not) or none, gpt-oss's layer
//! (clamped activation, expert and router biases) or not, a bias or none, every score function.
//! Every value is hashed from a seed, scaled, and rounded to the case dtype.

use moecheck_reference::format::{round_to, Format, Overflow};
use moecheck_reference::moe::ffn::{Activation, ExpertBias};
use moecheck_reference::moe::{MoeCase, SharedExpert};
use moecheck_reference::routing::{Capacity, DropPolicy, GroupLimit, RoutingConfig, ScoreFunction};
use moecheck_reference::seed::mix;
use ndarray::{Array1, Array2, Array3};
use proptest::prelude::*;

/// Most tokens in a case.
pub const MAX_TOKENS: usize = 12;
/// Most experts in a case.
pub const MAX_EXPERTS: usize = 8;
/// Largest hidden size `H`.
pub const MAX_HIDDEN: usize = 6;
/// Largest expert FFN width `F` (and shared width).
pub const MAX_FFN: usize = 5;

/// The arguments a layer case is built from (values derive from `value_seed`).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeArgs {
    pub tokens: usize,
    pub hidden: usize,
    pub experts: usize,
    pub ffn: usize,
    /// Shared-expert width, 0 for none.
    pub shared_ffn: usize,
    /// The shared expert is gated by `σ(x·g)` (Qwen2-MoE); ignored without one.
    pub shared_gate: bool,
    /// The experts' activation (gpt-oss's clamped SwiGLU draws larger `W0`, `W1` so that
    /// some inputs pass its clamps).
    pub activation: Activation,
    /// Per-expert biases of `a`, `b` and `y` (gpt-oss).
    pub expert_bias: bool,
    /// A learned bias on the router logits (gpt-oss).
    pub router_bias: bool,
    pub routing: RoutingConfig,
    pub bias: bool,
    pub dtype: Format,
    pub value_seed: u64,
}

impl MoeArgs {
    /// Value `i` of array `tag`: uniform in `(-scale, scale)`, rounded to the dtype.
    fn value(&self, tag: u64, i: usize, scale: f64) -> f64 {
        let h = mix(self.value_seed ^ mix((tag << 48) ^ i as u64));
        let u = (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
        round_to(u * scale, self.dtype, Overflow::Saturate)
    }

    /// The case.
    pub fn build(&self) -> MoeCase {
        let (t, h, e, f, fs) = (
            self.tokens,
            self.hidden,
            self.experts,
            self.ffn,
            self.shared_ffn,
        );
        let a2 = |tag: u64, r: usize, c: usize, s: f64| {
            Array2::from_shape_fn((r, c), |(i, j)| self.value(tag, i * c + j, s))
        };
        let a3 = |tag: u64, d: (usize, usize, usize), s: f64| {
            Array3::from_shape_fn(d, |(i, j, l)| self.value(tag, (i * d.1 + j) * d.2 + l, s))
        };
        let sh = 1.0 / (h as f64).sqrt();
        let sf = 1.0 / (f.max(1) as f64).sqrt();
        // Clamped: inputs of the activation spread to about ±12, past the clamps at ±7.
        let sw = match self.activation {
            Activation::Swiglu => sh,
            Activation::ClampedSwiglu => 12.0 * sh,
        };
        MoeCase {
            x: a2(0, t, h, 1.0),
            wr: a2(1, h, e, 2.0 * sh),
            bias: self
                .bias
                .then(|| Array1::from_shape_fn(e, |i| self.value(2, i, 0.1))),
            w0: a3(3, (e, h, f), sw),
            w1: a3(4, (e, h, f), sw),
            wo: a3(5, (e, f, h), sf),
            shared: (fs > 0).then(|| SharedExpert {
                w0: a2(6, h, fs, sw),
                w1: a2(7, h, fs, sw),
                wo: a2(8, fs, h, 1.0 / (fs as f64).sqrt()),
                gate: self
                    .shared_gate
                    .then(|| Array1::from_shape_fn(h, |i| self.value(10, i, 2.0 * sh))),
            }),
            dout: a2(9, t, h, 1.0),
            routing: self.routing,
            dtype: self.dtype,
            activation: self.activation,
            router_bias: self
                .router_bias
                .then(|| Array1::from_shape_fn(e, |i| self.value(11, i, 0.5))),
            expert_bias: self.expert_bias.then(|| ExpertBias {
                b0: a2(12, e, f, 1.0),
                b1: a2(13, e, f, 1.0),
                bo: a2(14, e, h, 0.5),
            }),
        }
    }
}

/// What a generated case must have.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MoeRequire {
    /// Capacity dropping with a tight factor.
    pub dropping: bool,
    /// No capacity dropping.
    pub no_dropping: bool,
    /// No shared expert.
    pub no_shared: bool,
}

fn routing_config(e: usize, req: MoeRequire) -> BoxedStrategy<RoutingConfig> {
    let divisors: Vec<usize> = (1..=e).filter(|g| e.is_multiple_of(*g)).collect();
    let capacity: BoxedStrategy<Option<Capacity>> = if req.no_dropping {
        Just(None).boxed()
    } else {
        let cap = (
            prop_oneof![Just(0.25f64), Just(0.5), Just(0.75), Just(1.0), Just(1.5)],
            prop_oneof![Just(DropPolicy::Position), Just(DropPolicy::Probs)],
        )
            .prop_map(|(factor, policy)| {
                Some(Capacity {
                    factor,
                    policy,
                    seq_len: None,
                })
            });
        if req.dropping {
            cap.boxed()
        } else {
            prop_oneof![2 => Just(None), 1 => cap].boxed()
        }
    };
    (
        prop_oneof![3 => 1usize..=e.min(3), 1 => Just(e)],
        prop_oneof![
            Just(ScoreFunction::Softmax),
            Just(ScoreFunction::TopkSoftmax),
            Just(ScoreFunction::Sigmoid)
        ],
        proptest::sample::select(divisors),
        any::<bool>(),
        prop_oneof![3 => Just(1.0f64), 1 => Just(2.5)],
        capacity,
        any::<u8>(),
    )
        .prop_map(move |(k, score, g, norm, alpha, capacity, pick)| {
            let mut c = RoutingConfig::new(k, score);
            c.norm_topk = norm;
            c.scaling_factor = alpha;
            c.capacity = capacity;
            if g > 1 {
                // Kept groups must hold at least k experts.
                let per = e / g;
                let min_tg = k.div_ceil(per);
                let tg = min_tg + (pick as usize) % (g - min_tg + 1);
                c.groups = Some(GroupLimit {
                    groups: g,
                    topk_groups: tg,
                });
            }
            c
        })
        .boxed()
}

/// Layer cases meeting `req`.
pub fn moe_args(req: MoeRequire) -> BoxedStrategy<MoeArgs> {
    (
        1usize..=MAX_TOKENS,
        1usize..=MAX_HIDDEN,
        prop_oneof![1 => Just(1usize), 4 => 2usize..=MAX_EXPERTS],
        1usize..=MAX_FFN,
        if req.no_shared {
            Just(0usize).boxed()
        } else {
            prop_oneof![2 => Just(0usize), 1 => 1usize..=MAX_FFN].boxed()
        },
        any::<bool>(),
        prop_oneof![2 => Just(Format::Bf16), 1 => Just(Format::F32)],
        any::<u64>(),
        any::<bool>(),
        // gpt-oss's three features, each on its own: the clamped activation, expert biases,
        // a router-logit bias.
        [
            prop_oneof![3 => Just(false), 1 => Just(true)],
            prop_oneof![3 => Just(false), 1 => Just(true)],
            prop_oneof![3 => Just(false), 1 => Just(true)],
        ],
    )
        .prop_flat_map(
            move |(t, h, e, f, fs, bias, dtype, seed, gate, [clamped, eb, rb])| {
                routing_config(e, req).prop_map(move |routing| MoeArgs {
                    tokens: t,
                    hidden: h,
                    experts: e,
                    ffn: f,
                    shared_ffn: fs,
                    shared_gate: gate && fs > 0,
                    activation: if clamped {
                        Activation::ClampedSwiglu
                    } else {
                        Activation::Swiglu
                    },
                    expert_bias: eb,
                    router_bias: rb,
                    routing,
                    bias,
                    dtype,
                    value_seed: seed,
                })
            },
        )
        .boxed()
}

/// Any layer case.
pub fn any_case() -> BoxedStrategy<MoeArgs> {
    moe_args(MoeRequire::default())
}
/// Cases with tight capacity dropping and no shared expert.
pub fn dropping() -> BoxedStrategy<MoeArgs> {
    moe_args(MoeRequire {
        dropping: true,
        no_shared: true,
        ..MoeRequire::default()
    })
}
/// Cases without capacity dropping.
pub fn no_dropping() -> BoxedStrategy<MoeArgs> {
    moe_args(MoeRequire {
        no_dropping: true,
        ..MoeRequire::default()
    })
}
