//! Routing conventions on hand-worked cases: each value of `group_score`, `sigmoid_norm`,
//! `ties` and the `token-order` drop policy changes the reference exactly where the upstream
//! code it names differs, and `ties = any` accepts every tie order and nothing else.

use moecheck_reference::format::Format;
use moecheck_reference::op::Op;
use moecheck_reference::routing::{
    route, Capacity, DropPolicy, GroupLimit, GroupScore, Route, RouteOutputs, RoutePrecision,
    RouteReport, RoutingCase, RoutingConfig, ScoreFunction, SigmoidNorm, SlotOrder, Ties,
};
use ndarray::{array, Array2};

fn case(logits: Array2<f64>, config: RoutingConfig) -> RoutingCase {
    RoutingCase {
        logits,
        bias: None,
        config,
    }
}

const F32: RoutePrecision = RoutePrecision {
    compute: Format::F32,
    output: Format::F32,
};

/// The reference's outputs of `c` (ties to the lower index).
fn reference(c: &RoutingCase) -> RouteOutputs {
    Route::reference_outputs(c, (), route(c).expect("a valid case"))
}

fn compare(c: &RoutingCase, got: &RouteOutputs) -> RouteReport {
    let r = route(c).expect("a valid case");
    Route::compare(c, (), &F32, &r, got).expect("a valid case")
}

/// `got` with token `t`'s slots `j1` and `j2` swapped (indices, weights and kept).
fn swap(got: &RouteOutputs, t: usize, j1: usize, j2: usize) -> RouteOutputs {
    let mut g = got.clone();
    let x = g.indices[[t, j1]];
    g.indices[[t, j1]] = g.indices[[t, j2]];
    g.indices[[t, j2]] = x;
    let w = g.weights[[t, j1]];
    g.weights[[t, j1]] = g.weights[[t, j2]];
    g.weights[[t, j2]] = w;
    let k = g.kept[[t, j1]];
    g.kept[[t, j1]] = g.kept[[t, j2]];
    g.kept[[t, j2]] = k;
    g
}

fn grouped(topk: usize, groups: usize, topk_groups: usize, rule: GroupScore) -> RoutingConfig {
    let mut c = RoutingConfig::new(topk, ScoreFunction::TopkSoftmax);
    c.groups = Some(GroupLimit {
        groups,
        topk_groups,
    });
    c.group_score = rule;
    c
}

/// Three groups of three experts, one kept, K = 3. Group 0 has one very high score, group 1
/// a high pair, group 2 three medium ones: top-2 keeps group 1 (5 + 5 > 8 + 0), max keeps
/// group 0 (8), top-(K/TG = 3) keeps group 2 (4 + 4 + 4 = 12 > 10).
#[test]
fn each_group_score_keeps_its_own_group() {
    let logits = array![[8.0, 0.0, 0.0, 5.0, 5.0, 0.0, 4.0, 4.0, 4.0]];
    for (rule, group) in [
        (GroupScore::Top2, 1),
        (GroupScore::Max, 0),
        (GroupScore::TopKPerGroup, 2),
    ] {
        let r = route(&case(logits.clone(), grouped(3, 3, 1, rule))).unwrap();
        let mut picked: Vec<usize> = r.indices.row(0).iter().map(|&x| x / 3).collect();
        picked.dedup();
        assert_eq!(picked, vec![group], "{}", rule.name());
    }
}

#[test]
fn top_k_per_group_needs_at_least_one_term() {
    let c = case(
        Array2::zeros((1, 8)),
        grouped(1, 4, 2, GroupScore::TopKPerGroup),
    );
    let err = route(&c).unwrap_err().to_string();
    assert!(
        err.contains("topk") && err.contains("top-k-per-group"),
        "{err}"
    );
    // Top-2 has no such constraint.
    assert!(route(&case(
        Array2::zeros((1, 8)),
        grouped(1, 4, 2, GroupScore::Top2)
    ))
    .is_ok());
}

/// At K = 1 a sigmoid weight is `α·s/(s + ε)` (`always`: α itself) or `α·s` (`skip-k1`,
/// `never`); at K = 2 `always` and `skip-k1` normalise, `never` does not.
#[test]
fn sigmoid_norm_at_k1_and_never() {
    let l = array![[0.0, -1.0, 2.0]];
    let s2 = 1.0 / (1.0 + (-2.0f64).exp());
    for (k, norm, want) in [
        (1, SigmoidNorm::Always, s2 / (s2 + 1e-20) * 2.5),
        (1, SigmoidNorm::SkipK1, 2.5 * s2),
        (1, SigmoidNorm::Never, 2.5 * s2),
    ] {
        let mut cfg = RoutingConfig::new(k, ScoreFunction::Sigmoid);
        cfg.scaling_factor = 2.5;
        cfg.sigmoid_norm = norm;
        let r = route(&case(l.clone(), cfg)).unwrap();
        assert_eq!(r.indices[[0, 0]], 2);
        assert_eq!(r.combine[[0, 0]], want, "{}", norm.name());
    }
    for norm in [SigmoidNorm::Always, SigmoidNorm::SkipK1] {
        let mut cfg = RoutingConfig::new(2, ScoreFunction::Sigmoid);
        cfg.sigmoid_norm = norm;
        let r = route(&case(l.clone(), cfg)).unwrap();
        // Experts 2 and 0 (sigmoids s2 and 1/2), each divided by their sum + ε, in slot order.
        let d = s2 + 0.5 + 1e-20;
        assert_eq!(r.indices.row(0).to_vec(), vec![2, 0]);
        assert_eq!(
            r.combine.row(0).to_vec(),
            vec![s2 / d, 0.5 / d],
            "{}",
            norm.name()
        );
    }
}

/// `never` (Hugging Face's `DeepseekV3TopkRouter` without `norm_topk_prob`) is needed: its
/// weights, the sigmoids times α at K = 2, fail every weight under `always`, and the failure
/// names `--sigmoid-norm`; under `never` they pass, and normalised weights (the planted
/// `normalise-sigmoid-despite-never`) fail.
#[test]
fn sigmoid_norm_never_is_needed_and_still_catches_normalising() {
    let l = array![[0.0, -1.0, 2.0, 1.0], [1.5, 0.5, -2.0, 0.0]];
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    let mut cfg = RoutingConfig::new(2, ScoreFunction::Sigmoid);
    cfg.scaling_factor = 2.5;
    cfg.sigmoid_norm = SigmoidNorm::Never;
    let never = case(l.clone(), cfg);
    let hf = reference(&never);
    assert_eq!(hf.indices.row(0).to_vec(), vec![2, 3]);
    assert_eq!(
        hf.weights.row(0).to_vec(),
        vec![2.5 * sig(2.0), 2.5 * sig(1.0)]
    );
    assert!(compare(&never, &hf).passed());
    let mut always = never.clone();
    always.config.sigmoid_norm = SigmoidNorm::Always;
    let r = compare(&always, &hf);
    assert_eq!(r.weight_failures, 4, "{:?}", r.first_failure());
    let line = r.first_failure().unwrap();
    assert!(
        line.contains("--sigmoid-norm") && line.contains("never"),
        "{line}"
    );
    // Normalised weights under never: caught.
    assert!(!compare(&never, &reference(&always)).passed());
}

/// `slot_order = any` (`torch.topk(sorted=False)`): a token's slots in another order, each
/// weight with its expert, fail under `score` with a message naming `--slot-order` and pass
/// under `any`; experts reordered without their weights still fail under `any`; and `any`
/// with the slot-ranked `position` drop policy is refused.
#[test]
fn slot_order_any_accepts_permuted_slots_and_nothing_else() {
    let l = array![
        [0.0, -1.0, 2.0, 1.0],
        [1.5, 0.5, -2.0, 0.0],
        [3.0, 2.0, 1.0, 0.0]
    ];
    let mut cfg = RoutingConfig::new(3, ScoreFunction::Softmax);
    cfg.norm_topk = true;
    let sorted = case(l.clone(), cfg);
    let want = reference(&sorted);
    let shuffled = swap(&swap(&want, 0, 0, 2), 2, 1, 2);
    let r = compare(&sorted, &shuffled);
    assert_eq!(r.index_mismatch_tokens, 2);
    let line = r.first_failure().unwrap();
    assert!(line.contains("--slot-order any"), "{line}");
    let mut any = sorted.clone();
    any.config.slot_order = SlotOrder::Any;
    let r = compare(&any, &shuffled);
    assert!(r.passed(), "{:?}", r.first_failure());
    // Experts moved, weights left in place: a weight now belongs to another expert.
    let mut wrong = want.clone();
    wrong.indices.swap([0, 0], [0, 2]);
    let r = compare(&any, &wrong);
    assert!(!r.passed() && r.weight_failures > 0, "{r:?}");
    // Another expert set is still a mismatch.
    let mut other = want.clone();
    let unused = (0..4)
        .find(|x| !want.indices.row(1).iter().any(|y| y == x))
        .unwrap();
    other.indices[[1, 2]] = unused;
    assert_eq!(compare(&any, &other).index_mismatch_tokens, 1);
    let mut position = any.clone();
    position.config.capacity = Some(Capacity {
        factor: 1.0,
        policy: DropPolicy::Position,
        seq_len: None,
    });
    let e = route(&position).unwrap_err().to_string();
    assert!(e.contains("slot_order") && e.contains("position"), "{e}");
}

/// Four tokens that all pick expert 0 (K = 1, E = 2, softmax), with token-order dropping at
/// factor 1: `C = ceil(4·1/2·1) = 2`.
fn all_to_expert_0() -> (Array2<f64>, RoutingConfig) {
    let logits = array![[0.0, -1.0], [3.0, 0.0], [5.0, 0.0], [1.0, 0.0]];
    let mut cfg = RoutingConfig::new(1, ScoreFunction::Softmax);
    cfg.capacity = Some(Capacity {
        factor: 1.0,
        policy: DropPolicy::TokenOrder,
        seq_len: None,
    });
    (logits, cfg)
}

/// `token-order`: per expert, the first `C = ceil(T·K/E·cf)` tokens over the whole batch,
/// whatever their weights; `position` (MaxText) counts per sequence with its own `C`.
#[test]
fn token_order_keeps_the_lowest_tokens_over_the_batch() {
    let (logits, mut cfg) = all_to_expert_0();
    let r = route(&case(logits.clone(), cfg)).unwrap();
    assert_eq!(r.capacity, Some(2));
    assert_eq!(r.kept.column(0).to_vec(), vec![true, true, false, false]);
    // probs keeps the two largest weights instead: tokens 2 and 1.
    cfg.capacity = Some(Capacity {
        factor: 1.0,
        policy: DropPolicy::Probs,
        seq_len: None,
    });
    let r = route(&case(logits, cfg)).unwrap();
    assert_eq!(r.kept.column(0).to_vec(), vec![false, true, true, false]);
}

/// Softmax, K = 2, every token with an exact tie: a router that orders and selects the
/// tied experts the other way fails under `lower-index`, with the tie named, and passes under
/// `any`.
#[test]
fn ties_any_accepts_the_other_tie_order() {
    // Token 0: experts 1 and 2 tie for the first slot. Token 1: experts 0 and 3 tie for the
    // second slot (expert 2 is first).
    let logits = array![[0.0, 1.0, 1.0, -1.0], [0.5, -1.0, 2.0, 0.5]];
    let mut cfg = RoutingConfig::new(2, ScoreFunction::Softmax);
    let lower = reference(&case(logits.clone(), cfg));
    assert_eq!(lower.indices, array![[1, 2], [2, 0]]);
    // The other order: token 0 lists 2 before 1, token 1 selects 3 instead of 0.
    let mut higher = swap(&lower, 0, 0, 1);
    higher.indices[[1, 1]] = 3;
    higher.group_sizes = vec![0, 1, 2, 1];
    let rep = compare(&case(logits.clone(), cfg), &higher);
    assert!(!rep.passed());
    assert_eq!(rep.index_mismatch_tokens, 2);
    assert!(
        rep.mismatches[0].detail.contains("exact tie")
            && rep.mismatches[0].detail.contains("--ties any"),
        "{:?}",
        rep.mismatches[0]
    );
    cfg.ties = Ties::Any;
    let rep = compare(&case(logits.clone(), cfg), &higher);
    assert!(rep.passed(), "{rep:?}");
    // The lower-index answer is valid under any too.
    assert!(compare(&case(logits, cfg), &lower).passed());
}

/// Under `any`, only tie choices are free: a selection that skips a strictly larger score,
/// slots out of descending order, or group sizes that do not follow the choice, still fail.
#[test]
fn ties_any_rejects_what_no_tie_order_gives() {
    let logits = array![[0.0, 1.0, 1.0, -1.0], [0.5, -1.0, 2.0, 0.5]];
    let mut cfg = RoutingConfig::new(2, ScoreFunction::Softmax);
    cfg.ties = Ties::Any;
    let c = case(logits, cfg);
    let good = reference(&c);
    // Token 1 selects expert 1 (score below the tied 0.5s).
    let mut bad = good.clone();
    bad.indices[[1, 1]] = 1;
    bad.group_sizes = vec![0, 2, 2, 0];
    assert_eq!(compare(&c, &bad).index_mismatch_tokens, 1);
    // Token 1 lists its second-best expert first.
    let bad = swap(&good, 1, 0, 1);
    assert_eq!(compare(&c, &bad).index_mismatch_tokens, 1);
    // The other tie order with the group sizes of the first.
    let mut bad = good.clone();
    bad.indices[[1, 1]] = 3;
    let rep = compare(&c, &bad);
    assert_eq!(rep.group_size_mismatches, 2, "{rep:?}");
}

/// Groups whose scores tie: under `any` the router may keep either group, and the check
/// follows the kept group when it compares the experts.
#[test]
fn ties_any_follows_a_tied_group_choice() {
    // Two groups of two, one kept, K = 2: both groups score 1 + 0 = 1.
    let logits = array![[1.0, 0.0, 1.0, 0.0]];
    let mut cfg = grouped(2, 2, 1, GroupScore::Top2);
    let lower = reference(&case(logits.clone(), cfg));
    assert_eq!(lower.indices, array![[0, 1]]);
    let mut other = lower.clone();
    other.indices = array![[2, 3]];
    other.group_sizes = vec![0, 0, 1, 1];
    assert!(!compare(&case(logits.clone(), cfg), &other).passed());
    cfg.ties = Ties::Any;
    let rep = compare(&case(logits.clone(), cfg), &other);
    assert!(rep.passed(), "{rep:?}");
    // Mixing the groups is no tie order: experts 0 and 2 lie in different groups.
    let mut mixed = lower.clone();
    mixed.indices = array![[0, 2]];
    mixed.group_sizes = vec![1, 0, 1, 0];
    assert!(!compare(&case(logits, cfg), &mixed).passed());
}

/// `token-order` under `any` (Megatron ranks an expert's tokens with `torch.topk` over a 0/1
/// map): any `C` of the expert's tokens may be kept, never more.
#[test]
fn ties_any_lets_token_order_keep_any_c_tokens() {
    let (logits, mut cfg) = all_to_expert_0();
    let lower = reference(&case(logits.clone(), cfg));
    // Keep tokens 2 and 3 instead of 0 and 1.
    let mut other = reference(&case(logits.clone(), {
        let mut c = cfg;
        c.capacity = None;
        c
    }));
    other.kept = array![[false], [false], [true], [true]];
    other.weights[[0, 0]] = 0.0;
    other.weights[[1, 0]] = 0.0;
    other.group_sizes = vec![2, 0];
    let rep = compare(&case(logits.clone(), cfg), &other);
    assert_eq!(rep.kept_mismatches, 4);
    assert!(
        rep.mismatches[0].detail.contains("--ties any"),
        "{:?}",
        rep.mismatches[0]
    );
    cfg.ties = Ties::Any;
    assert!(compare(&case(logits.clone(), cfg), &other).passed());
    assert!(compare(&case(logits.clone(), cfg), &lower).passed());
    // Three kept with C = 2 is no tie order.
    let mut over = other.clone();
    over.kept[[1, 0]] = true;
    over.weights[[1, 0]] = lower.weights[[1, 0]];
    over.group_sizes = vec![3, 0];
    assert!(!compare(&case(logits, cfg), &over).passed());
}

/// Review: the MoE near-tie guard (`moe::fd::near_tie`) must refuse a point whose kept/dropped
/// group scores are within the sum of their error bounds. A group score sums `n` selection
/// scores (`n = K/TG = 3` here), so each carries up to `n·δ` and the margin must exceed
/// `2n·δ = 6δ`; the guard still uses `4δ` (top-2's), so a gap of `5δ`, which an
/// implementation within its precision may decide either way, is checked as if decidable.
#[test]
fn moe_near_tie_guard_scales_with_group_score_terms() {
    // E = 6, two groups of three, one kept, K = 3, top-k-per-group (3 terms): group 0 sums
    // 10 + 5 + 0 = 15, group 1 9.5 + 5 + 0 = 14.5: gap 0.5 = 5δ with δ = 0.1.
    let logits = array![[10.0, 5.0, 0.0, 9.5, 5.0, 0.0]];
    let c = case(logits, grouped(3, 2, 1, GroupScore::TopKPerGroup));
    let r = route(&c).unwrap();
    assert_eq!(r.indices, array![[0, 1, 2]]);
    let score_err = Array2::from_elem((1, 6), 0.1);
    let weight_err = Array2::zeros((1, 3));
    // Group 0 can be as low as 15 - 0.3, group 1 as high as 14.5 + 0.3: either may be kept.
    assert!(
        moecheck_reference::moe::fd::near_tie(&r, &score_err, &weight_err).is_some(),
        "a group-score margin of 5δ with 3-term sums (error up to 3δ each) is a near tie"
    );
}

/// Review: `ties = any` is accepted by the MoE layer (only `token-order` is refused), but the
/// layer never follows a tie choice: its reference is always lower-index. A case read from a
/// directory (`moecheck check DIR`; no tie guard there) with an exact tie fails a router that
/// breaks it the other way, although the case declares that choice valid.
#[test]
fn moe_layer_refuses_ties_any_on_an_exact_tie() {
    use moecheck_reference::moe::{LayerFormats, MoeCase, MoeLayer, MoeOutputs};
    use ndarray::{Array3, Axis};
    // K = 1, E = 2, experts 0 and 1 tie on every token (identical router columns).
    let mut cfg = RoutingConfig::new(1, ScoreFunction::Softmax);
    cfg.ties = Ties::Any;
    let w = |seed: f64| {
        Array3::from_shape_fn((2, 2, 2), |(e, i, j)| {
            ((e * 4 + i * 2 + j) as f64 * 0.37 + seed).sin() * 0.5
        })
    };
    let a = MoeCase {
        x: array![[0.5, -0.25], [1.0, 0.75]],
        wr: array![[1.0, 1.0], [0.5, 0.5]],
        bias: None,
        w0: w(0.1),
        w1: w(0.7),
        wo: w(1.3),
        shared: None,
        expert_bias: None,
        router_bias: None,
        activation: Default::default(),
        dout: array![[1.0, -0.5], [0.25, 2.0]],
        routing: cfg,
        dtype: Format::F64,
    };
    // The same layer with experts 0 and 1 exchanged: its lower-index routing picks (new)
    // expert 0, i.e. what a router choosing expert 1 of `a` computes.
    let swap3 = |t: &Array3<f64>| {
        let mut s = t.clone();
        s.index_axis_mut(Axis(0), 0)
            .assign(&t.index_axis(Axis(0), 1));
        s.index_axis_mut(Axis(0), 1)
            .assign(&t.index_axis(Axis(0), 0));
        s
    };
    let mut b = a.clone();
    b.w0 = swap3(&a.w0);
    b.w1 = swap3(&a.w1);
    b.wo = swap3(&a.wo);
    let eb = MoeLayer::expected(&b, (), ()).unwrap();
    let g = &eb.grads;
    let mut dwr = g.dw_router.clone();
    dwr.column_mut(0).assign(&g.dw_router.column(1));
    dwr.column_mut(1).assign(&g.dw_router.column(0));
    let other = MoeOutputs {
        out: g.out.clone(),
        dx: g.dx.clone(),
        dw_router: dwr,
        dw0: swap3(&g.dw0),
        dw1: swap3(&g.dw1),
        dwo: swap3(&g.dwo),
        dshared: None,
        dshared_gate: None,
        drouter_bias: None,
        dexpert_bias: None,
    };
    let ea = MoeLayer::expected(&a, (), ()).unwrap();
    // The other tie choice really is different, and the lower-index reference fails it: so
    // under ties = any such a case cannot be checked from the layer's outputs.
    assert_ne!(ea.grads.out, other.out);
    let p = MoeLayer::declared_precision(&a, &LayerFormats::default());
    let rep = MoeLayer::compare(&a, (), &p, &ea, &other).unwrap();
    assert!(!moecheck_reference::op::Comparison::passed(&rep));
    // It is refused as input, naming the tie; under lower-index it is checked.
    let err = MoeLayer::validate(&a, ()).unwrap_err().to_string();
    assert!(err.contains("ties") && err.contains("exact tie"), "{err}");
    let mut lower = a.clone();
    lower.routing.ties = Ties::LowerIndex;
    assert!(MoeLayer::validate(&lower, ()).is_ok());
}

/// `slot_order = any` with `ties = any` and a capacity policy that prefers among equals
/// (`token-order`): a correct unsorted implementation that kept expert 1 for token 0 and
/// expert 0 for token 1 passes (the tie order is read by expert, not by its unsorted slot);
/// expert 0 keeping both tokens is no tie order and fails.
#[test]
fn slot_order_any_reads_capacity_ties_by_expert() {
    let logits = array![[1.0, 0.0], [1.0, 0.0]];
    let mut cfg = RoutingConfig::new(2, ScoreFunction::Softmax);
    cfg.capacity = Some(Capacity {
        factor: 0.5,
        policy: DropPolicy::TokenOrder,
        seq_len: None,
    });
    cfg.ties = Ties::Any;
    cfg.slot_order = SlotOrder::Any;
    let c = case(logits, cfg);
    let want = reference(&c);
    assert_eq!(want.indices, array![[0, 1], [0, 1]]);
    // Each expert keeps one token (C = 1): here expert 1 token 0, expert 0 token 1, written
    // with each token's slots reversed.
    let mut got = swap(&swap(&want, 0, 0, 1), 1, 0, 1);
    let full = reference(&case(c.logits.clone(), {
        let mut u = cfg;
        u.capacity = None;
        u
    }));
    got.kept = array![[true, false], [false, true]];
    got.weights = array![[full.weights[[0, 1]], 0.0], [0.0, full.weights[[1, 0]]]];
    got.group_sizes = vec![1, 1];
    let r = compare(&c, &got);
    assert!(r.passed(), "{:?}", r.first_failure());
    // Expert 0 keeping both tokens (2 > C) is no tie order.
    let mut over = got.clone();
    over.kept = array![[false, true], [false, true]];
    over.weights = array![[0.0, full.weights[[0, 0]]], [0.0, full.weights[[1, 0]]]];
    over.group_sizes = vec![2, 0];
    assert!(!compare(&c, &over).passed());
}
