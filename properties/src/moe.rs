//! Strategies and properties for MoE-layer implementations ([`MoeLayer`]).
//!
//! Cases are small (at most [`MAX_TOKENS`] tokens, [`MAX_EXPERTS`] experts, hidden and FFN
//! sizes up to 6) and biased toward the edges: `k = 1` and `k = E`, more experts than
//! assignments (empty experts), tight capacity factors (dropped assignments, whole tokens
//! dropped), one-expert groups, a shared expert or none, a bias or none, every score function.
//! Every value is hashed from a seed, scaled, and rounded to the case dtype.
//!
//! A case within the selection-score error of a top-k, group or capacity tie (for the
//! implementation's declared precision, [`tie_guard`], or for the finite-difference step) is
//! **rejected** and proptest draws another; it never counts as passed.

use moecheck_reference::format::{round_to, Format, Overflow};
use moecheck_reference::moe::fd::{check_gradients, FdOutcome};
use moecheck_reference::moe::{
    dense_layer, forward, layer_bound, tie_guard, verify_layer, LayerPrecision, MoeCase, MoeLayer,
    MoeOutputs, SharedExpert, TensorId,
};
use moecheck_reference::routing::{Capacity, DropPolicy, GroupLimit, RoutingConfig, ScoreFunction};
use ndarray::{Array1, Array2, Array3, ArrayD, Axis, Dimension};
use proptest::prelude::*;

use crate::runner::{Outcome, RunConfig};

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
    pub routing: RoutingConfig,
    pub bias: bool,
    pub dtype: Format,
    pub value_seed: u64,
}

/// splitmix64.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
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
        MoeCase {
            x: a2(0, t, h, 1.0),
            wr: a2(1, h, e, 2.0 * sh),
            bias: self
                .bias
                .then(|| Array1::from_shape_fn(e, |i| self.value(2, i, 0.1))),
            w0: a3(3, (e, h, f), sh),
            w1: a3(4, (e, h, f), sh),
            wo: a3(5, (e, f, h), sf),
            shared: (fs > 0).then(|| SharedExpert {
                w0: a2(6, h, fs, sh),
                w1: a2(7, h, fs, sh),
                wo: a2(8, fs, h, 1.0 / (fs as f64).sqrt()),
            }),
            dout: a2(9, t, h, 1.0),
            routing: self.routing,
            dtype: self.dtype,
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
    let divisors: Vec<usize> = (1..=e).filter(|g| e % g == 0).collect();
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
    )
        .prop_flat_map(move |(t, h, e, f, fs, bias, dtype, seed)| {
            routing_config(e, req).prop_map(move |routing| MoeArgs {
                tokens: t,
                hidden: h,
                experts: e,
                ffn: f,
                shared_ffn: fs,
                routing,
                bias,
                dtype,
                value_seed: seed,
            })
        })
        .boxed()
}

pub use crate::runner::CaseResult;

/// A property of an MoE-layer implementation.
#[derive(Clone, Copy)]
pub struct LayerProperty {
    pub name: &'static str,
    pub description: &'static str,
    pub strategy: fn() -> BoxedStrategy<MoeArgs>,
    pub test: fn(&dyn MoeLayer, &MoeArgs) -> CaseResult,
}

impl std::fmt::Debug for LayerProperty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

fn any_case() -> BoxedStrategy<MoeArgs> {
    moe_args(MoeRequire::default())
}
fn dropping() -> BoxedStrategy<MoeArgs> {
    moe_args(MoeRequire {
        dropping: true,
        no_shared: true,
        ..MoeRequire::default()
    })
}
fn no_dropping() -> BoxedStrategy<MoeArgs> {
    moe_args(MoeRequire {
        no_dropping: true,
        ..MoeRequire::default()
    })
}

/// Every layer property, in a fixed order.
pub fn layer_properties() -> Vec<LayerProperty> {
    vec![
        LayerProperty {
            name: "layer-matches-reference",
            description: "out and every gradient inside the derived bound of the f64 reference",
            strategy: any_case,
            test: matches_reference,
        },
        LayerProperty {
            name: "sparse-equals-dense",
            description: "out and every gradient equal the dense formulation (all experts, masked weights)",
            strategy: any_case,
            test: sparse_equals_dense,
        },
        LayerProperty {
            name: "dropped-contribute-zero",
            description: "fully dropped tokens: out and dx exactly 0, and their dout changes no gradient",
            strategy: dropping,
            test: dropped_contribute_zero,
        },
        LayerProperty {
            name: "permute-round-trip",
            description: "unpermute(permute(x)) == x on every slot, dropped ones included",
            strategy: any_case,
            test: permute_round_trip,
        },
        LayerProperty {
            name: "gradient-matches-fd",
            description: "every gradient matches central finite differences of the f64 layer",
            strategy: any_case,
            test: gradient_matches_fd,
        },
        LayerProperty {
            name: "empty-expert-zero-wgrad",
            description: "dW0, dW1, dWo of every expert with no kept assignment are exactly 0",
            strategy: any_case,
            test: empty_expert_zero_wgrad,
        },
        LayerProperty {
            name: "token-order-equivariance",
            description: "permuting the tokens permutes out and dx and leaves the weight gradients (nothing dropped)",
            strategy: no_dropping,
            test: token_order_equivariance,
        },
    ]
}

/// Builds the case and applies the tie guard at the implementation's precision.
fn guarded(imp: &dyn MoeLayer, args: &MoeArgs) -> Result<MoeCase, CaseResult> {
    let case = args.build();
    match tie_guard(&case, &imp.precision(&case)) {
        Err(e) => Err(CaseResult::Fail(format!("invalid generated case: {e}"))),
        Ok(Some(why)) => Err(CaseResult::Reject(why)),
        Ok(None) => Ok(case),
    }
}

fn run(imp: &dyn MoeLayer, case: &MoeCase) -> Result<MoeOutputs, CaseResult> {
    imp.run(case)
        .map_err(|e| CaseResult::Fail(format!("run failed: {e}")))
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(r) => return r,
        }
    };
}

fn matches_reference(imp: &dyn MoeLayer, args: &MoeArgs) -> CaseResult {
    let case = tri!(guarded(imp, args));
    match verify_layer(imp, &case) {
        Err(e) => CaseResult::Fail(format!("invalid generated case: {e}")),
        Ok(v) => match v.failure() {
            None => CaseResult::Pass,
            Some(f) => CaseResult::Fail(f),
        },
    }
}

/// `|a − b| <= bound` element-wise for every tensor, or the first violation.
fn within(
    case: &MoeCase,
    a: &MoeOutputs,
    b: &MoeOutputs,
    bound: impl Fn(TensorId) -> ArrayD<f64>,
    what: &str,
) -> CaseResult {
    for id in TensorId::of_case(case) {
        let (Some(x), Some(y)) = (a.get(id), b.get(id)) else {
            return CaseResult::Fail(format!("{id} is missing"));
        };
        if x.shape() != y.shape() {
            return CaseResult::Fail(format!(
                "{id} has shape {:?}, want {:?}",
                x.shape(),
                y.shape()
            ));
        }
        let bd = bound(id);
        for (((i, p), q), e) in x.indexed_iter().zip(y.iter()).zip(bd.iter()) {
            let ok = (p - q).abs() <= *e; // false for NaN
            if !ok {
                return CaseResult::Fail(format!(
                    "{id}{:?}: {p:e} vs {q:e} ({what}), bound {e:e}",
                    i.slice()
                ));
            }
        }
    }
    CaseResult::Pass
}

fn sparse_equals_dense(imp: &dyn MoeLayer, args: &MoeArgs) -> CaseResult {
    let case = tri!(guarded(imp, args));
    let got = tri!(run(imp, &case));
    let dense = match dense_layer(&case) {
        Ok(d) => d,
        Err(e) => return CaseResult::Fail(format!("invalid generated case: {e}")),
    };
    let f = forward(&case).expect("validated");
    let b_imp = layer_bound(&case, &f, &imp.precision(&case));
    let b_ref = layer_bound(&case, &f, &F64);
    within(
        &case,
        &got,
        &dense,
        |id| b_imp.get(id).expect("bound") + b_ref.get(id).expect("bound"),
        "implementation vs dense",
    )
}

const F64: LayerPrecision = LayerPrecision {
    input: Format::F64,
    compute: Format::F64,
    output: Format::F64,
};

fn dropped_contribute_zero(imp: &dyn MoeLayer, args: &MoeArgs) -> CaseResult {
    let case = tri!(guarded(imp, args));
    let f = forward(&case).expect("validated");
    let k = case.topk();
    let dropped: Vec<usize> = (0..case.tokens())
        .filter(|&t| (0..k).all(|s| !f.routing.kept[(t, s)]))
        .collect();
    if dropped.is_empty() {
        return CaseResult::Reject("no fully dropped token".into());
    }
    let got = tri!(run(imp, &case));
    for &t in &dropped {
        for (what, a) in [("out", &got.out), ("dx", &got.dx)] {
            if let Some((c, v)) = a.row(t).indexed_iter().find(|(_, v)| **v != 0.0) {
                return CaseResult::Fail(format!(
                    "token {t} is fully dropped but {what}[{t}, {c}] = {v:e}, want exactly 0"
                ));
            }
        }
    }
    // Another dout on the dropped tokens must not change any gradient, bit for bit.
    let mut other = case.clone();
    for &t in &dropped {
        other.dout.row_mut(t).mapv_inplace(|v| -2.0 * v + 0.5);
    }
    let got2 = tri!(run(imp, &other));
    for id in TensorId::of_case(&case).into_iter().skip(1) {
        let (a, b) = (got.get(id).expect("present"), got2.get(id));
        let Some(b) = b else {
            return CaseResult::Fail(format!("{id} is missing"));
        };
        if let Some(((i, x), y)) = a
            .indexed_iter()
            .zip(b.iter())
            .find(|((_, x), y)| x.to_bits() != y.to_bits())
        {
            return CaseResult::Fail(format!(
                "{id}{:?} changed from {x:e} to {y:e} when only the dout of fully dropped tokens changed",
                i.slice()
            ));
        }
    }
    CaseResult::Pass
}

fn permute_round_trip(imp: &dyn MoeLayer, args: &MoeArgs) -> CaseResult {
    let case = args.build();
    let f = match forward(&case) {
        Ok(f) => f,
        Err(e) => return CaseResult::Fail(format!("invalid generated case: {e}")),
    };
    let Some(u) = imp.permute_round_trip(&f.perm, &case.x) else {
        return CaseResult::Pass; // not exposed by this implementation (documented)
    };
    if u.dim() != (case.tokens(), case.topk(), case.hidden()) {
        return CaseResult::Fail(format!("round trip has shape {:?}", u.shape()));
    }
    for ((t, s, c), v) in u.indexed_iter() {
        if v.to_bits() != case.x[(t, c)].to_bits() {
            return CaseResult::Fail(format!(
                "unpermute(permute(x))[{t}, {s}, {c}] = {v:e}, want x[{t}, {c}] = {:e}",
                case.x[(t, c)]
            ));
        }
    }
    CaseResult::Pass
}

fn gradient_matches_fd(imp: &dyn MoeLayer, args: &MoeArgs) -> CaseResult {
    let case = tri!(guarded(imp, args));
    let got = tri!(run(imp, &case));
    let f = forward(&case).expect("validated");
    let bound = layer_bound(&case, &f, &imp.precision(&case));
    match check_gradients(&case, &got, Some(&bound), args.value_seed) {
        Err(e) => CaseResult::Fail(format!("finite differences: {e}")),
        Ok(FdOutcome::NearTie(why)) => CaseResult::Reject(why),
        Ok(FdOutcome::Checked(v)) => match v.iter().find(|c| !c.passed()) {
            None => CaseResult::Pass,
            Some(c) => CaseResult::Fail(format!(
                "<d{}, v> = {:e} but finite differences give {:e} (tolerance {:e})",
                c.tensor, c.analytic, c.numeric, c.tolerance
            )),
        },
    }
}

fn empty_expert_zero_wgrad(imp: &dyn MoeLayer, args: &MoeArgs) -> CaseResult {
    let case = tri!(guarded(imp, args));
    let f = forward(&case).expect("validated");
    let empty: Vec<usize> = (0..case.experts())
        .filter(|&e| f.perm.group_sizes[e] == 0)
        .collect();
    if empty.is_empty() {
        return CaseResult::Reject("no empty expert".into());
    }
    let got = tri!(run(imp, &case));
    for (name, w) in [("dw0", &got.dw0), ("dw1", &got.dw1), ("dwo", &got.dwo)] {
        for &e in &empty {
            if e >= w.shape()[0] {
                return CaseResult::Fail(format!("{name} has shape {:?}", w.shape()));
            }
            if let Some(((i, j), v)) = w
                .index_axis(Axis(0), e)
                .indexed_iter()
                .find(|(_, v)| **v != 0.0)
            {
                return CaseResult::Fail(format!(
                    "expert {e} is empty but {name}[{e}, {i}, {j}] = {v:e}, want exactly 0"
                ));
            }
        }
    }
    CaseResult::Pass
}

fn token_order_equivariance(imp: &dyn MoeLayer, args: &MoeArgs) -> CaseResult {
    let case = tri!(guarded(imp, args));
    let t = case.tokens();
    // π: a seeded shuffle; token i of the new case is token pi[i] of the old one.
    let mut pi: Vec<usize> = (0..t).collect();
    for i in (1..t).rev() {
        let j = (mix(args.value_seed ^ i as u64) % (i as u64 + 1)) as usize;
        pi.swap(i, j);
    }
    let mut other = case.clone();
    for (i, &p) in pi.iter().enumerate() {
        other.x.row_mut(i).assign(&case.x.row(p));
        other.dout.row_mut(i).assign(&case.dout.row(p));
    }
    let a = tri!(run(imp, &case));
    let b = tri!(run(imp, &other));
    let prec = imp.precision(&case);
    let ba = layer_bound(&case, &forward(&case).expect("validated"), &prec);
    let bb = layer_bound(&other, &forward(&other).expect("validated"), &prec);
    // Bring b back to the original token order.
    let mut back = b.clone();
    for (i, &p) in pi.iter().enumerate() {
        back.out.row_mut(p).assign(&b.out.row(i));
        back.dx.row_mut(p).assign(&b.dx.row(i));
    }
    let mut bb_back = bb.clone();
    for (id, arr) in bb_back.tensors.iter_mut() {
        if matches!(id, TensorId::Out | TensorId::Dx) {
            let src = bb.get(*id).expect("bound").clone();
            for (i, &p) in pi.iter().enumerate() {
                arr.index_axis_mut(Axis(0), p)
                    .assign(&src.index_axis(Axis(0), i));
            }
        }
    }
    within(
        &case,
        &a,
        &back,
        |id| ba.get(id).expect("bound") + bb_back.get(id).expect("bound"),
        "original vs token-permuted",
    )
}

/// Most shrink steps after a layer property fails.
pub const LAYER_SHRINK_ITERS: u32 = 32;

/// Checks `prop` on `config.cases` cases from `config.seed`; rejected (near-tie) cases are
/// redrawn; a failure is shrunk.
pub fn check_layer(prop: &LayerProperty, imp: &dyn MoeLayer, config: &RunConfig) -> Outcome {
    // Each layer case runs the whole layer (the FD property ~30 times): shrinking is capped at
    // LAYER_SHRINK_ITERS steps, which still reaches a small case.
    let config = RunConfig {
        max_shrink_iters: config.max_shrink_iters.min(LAYER_SHRINK_ITERS),
        ..*config
    };
    let max_rejects = 64 * config.cases.max(16);
    crate::runner::run_property_with_rejects(
        &(prop.strategy)(),
        |args| (prop.test)(imp, args),
        &config,
        max_rejects,
    )
}
