//! The routing reference on hand-computed cases, and the comparison's bound and near-tie
//! diagnosis.

use approx::assert_relative_eq;
use moecheck_reference::format::Format;
use moecheck_reference::op::Op;
use moecheck_reference::routing::{
    route, Capacity, DropPolicy, GroupLimit, Route, RouteOutputs, RoutePrecision, RouteReport,
    Routing, RoutingCase, RoutingConfig, ScoreFunction,
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

/// The reference's own outputs for `c`, as an implementation returns them.
fn outputs(c: &RoutingCase, r: &Routing) -> RouteOutputs {
    Route::reference_outputs(c, (), r.clone())
}

/// The comparison of `got` with the reference `r` of `c`, for an f32 implementation.
fn compare(c: &RoutingCase, r: &Routing, got: &RouteOutputs) -> RouteReport {
    Route::compare(c, (), &F32, r, got).expect("a valid case")
}

#[test]
fn softmax_then_topk_keeps_the_full_softmax_probabilities() {
    let c = case(
        array![[0.0, (2.0f64).ln(), 0.0, 0.0]],
        RoutingConfig::new(2, ScoreFunction::Softmax),
    );
    let r = route(&c).unwrap();
    // exp = [1, 2, 1, 1] / 5; top-2: expert 1 (0.4), then expert 0 (0.2, lower index of the tie).
    assert_eq!(r.indices.row(0).to_vec(), vec![1, 0]);
    assert_relative_eq!(r.combine[[0, 0]], 0.4, max_relative = 1e-15);
    assert_relative_eq!(r.combine[[0, 1]], 0.2, max_relative = 1e-15);
    // With norm_topk: 0.4 / 0.6 and 0.2 / 0.6.
    let mut cfg = RoutingConfig::new(2, ScoreFunction::Softmax);
    cfg.norm_topk = true;
    let r = route(&case(c.logits.clone(), cfg)).unwrap();
    assert_relative_eq!(r.combine[[0, 0]], 2.0 / 3.0, max_relative = 1e-15);
}

#[test]
fn topk_softmax_is_a_softmax_over_the_selected_logits() {
    let c = case(
        array![[3.0, 1.0, 3.0 + (3.0f64).ln(), -5.0]],
        RoutingConfig::new(2, ScoreFunction::TopkSoftmax),
    );
    let r = route(&c).unwrap();
    assert_eq!(r.indices.row(0).to_vec(), vec![2, 0]);
    assert_relative_eq!(r.combine[[0, 0]], 0.75, max_relative = 1e-15);
    assert_relative_eq!(r.combine[[0, 1]], 0.25, max_relative = 1e-15);
}

#[test]
fn deepseek_v3_bias_selects_but_weights_come_from_pre_bias_sigmoids() {
    // E = 4 in G = 2 groups of two, TG = 1. Sigmoids: [0.5, 0.5, 0.5, 0.75]; the bias lifts
    // expert 2 to a tie with expert 3.
    let mut cfg = RoutingConfig::new(2, ScoreFunction::Sigmoid);
    cfg.groups = Some(GroupLimit {
        groups: 2,
        topk_groups: 1,
    });
    cfg.scaling_factor = 2.5;
    let c = RoutingCase {
        logits: array![[0.0, 0.0, 0.0, (3.0f64).ln()]],
        bias: Some(array![0.0, 0.0, 0.25, 0.0]),
        config: cfg,
    };
    let r = route(&c).unwrap();
    // u = [0.5, 0.5, 0.75, 0.75]: group 1 (1.5) beats group 0 (1.0); ties -> expert 2 first.
    assert_eq!(r.indices.row(0).to_vec(), vec![2, 3]);
    // Pre-bias: 0.5 and 0.75, normalised (sum 1.25) and scaled by 2.5: 1.0 and 1.5.
    assert_relative_eq!(r.combine[[0, 0]], 1.0, max_relative = 1e-15);
    assert_relative_eq!(r.combine[[0, 1]], 1.5, max_relative = 1e-15);
    assert_eq!(r.group_mask.unwrap().row(0).to_vec(), vec![false, true]);
}

#[test]
fn dropped_assignments_are_zero_and_survivors_keep_their_weight() {
    let mut cfg = RoutingConfig::new(2, ScoreFunction::Sigmoid);
    cfg.capacity = Some(Capacity {
        factor: 1.0,
        policy: DropPolicy::Position,
        seq_len: None,
    });
    // Both tokens want experts 0 and 1; E = 4, S = 2: C = ceil(2·2/4) = 1.
    let c = case(array![[2.0, 1.0, -1.0, -2.0], [2.0, 1.0, -1.0, -2.0]], cfg);
    let r = route(&c).unwrap();
    assert_eq!(r.capacity, Some(1));
    assert_eq!(r.kept, array![[true, true], [false, false]]);
    assert_eq!(r.combine.row(1).to_vec(), vec![0.0, 0.0]);
    assert_eq!(r.combine.row(0), r.weights.row(0));
    assert_eq!(r.group_sizes, vec![1, 1, 0, 0]);
}

#[test]
fn weight_bound_accepts_f32_rounding_and_rejects_a_real_error() {
    let c = case(
        Array2::from_shape_fn((8, 16), |(t, e)| ((t * 7 + e * 5) % 11) as f64 * 0.37 - 2.0),
        RoutingConfig::new(4, ScoreFunction::Softmax),
    );
    let r = route(&c).unwrap();
    let mut got = outputs(&c, &r);
    got.weights.mapv_inplace(|w| w as f32 as f64);
    assert!(compare(&c, &r, &got).passed());
    got.weights[[3, 1]] *= 1.0 + 1e-4;
    let rep = compare(&c, &r, &got);
    assert_eq!(rep.weight_failures, 1);
    assert!(rep.first_failure().unwrap().starts_with("weights[3, 1]"));
}

#[test]
fn index_mismatch_says_whether_it_is_a_near_tie() {
    let near = case(
        array![[1.0, 1.0 + 1e-9, -3.0]],
        RoutingConfig::new(1, ScoreFunction::Sigmoid),
    );
    let r = route(&near).unwrap();
    assert_eq!(r.indices[[0, 0]], 1);
    let mut got = outputs(&near, &r);
    got.indices[[0, 0]] = 0;
    got.group_sizes = vec![1, 0, 0];
    let rep = compare(&near, &r, &got);
    assert!(!rep.passed());
    assert!(
        rep.first_failure().unwrap().contains("near-tie"),
        "{:?}",
        rep.first_failure()
    );
    let far = case(
        array![[1.0, 2.0, -3.0]],
        RoutingConfig::new(1, ScoreFunction::Sigmoid),
    );
    let r = route(&far).unwrap();
    let mut got = outputs(&far, &r);
    got.indices[[0, 0]] = 0;
    let rep = compare(&far, &r, &got);
    assert!(!rep.first_failure().unwrap().contains("near-tie"));
}

#[test]
fn invalid_configurations_name_the_parameter() {
    let l = Array2::zeros((4, 8));
    let mut cfg = RoutingConfig::new(2, ScoreFunction::Softmax);
    cfg.groups = Some(GroupLimit {
        groups: 3,
        topk_groups: 1,
    });
    let e = route(&case(l.clone(), cfg)).unwrap_err().to_string();
    assert!(e.starts_with("groups:"), "{e}");
    let mut nan = l.clone();
    nan[[1, 2]] = f64::NAN;
    let e = route(&case(nan, RoutingConfig::new(2, ScoreFunction::Softmax)))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("logits") && e.contains("[1, 2]"), "{e}");
}

#[test]
fn probs_boundary_between_equal_weights_is_a_near_tie_not_a_failure() {
    let cfg = || {
        let mut c = RoutingConfig::new(1, ScoreFunction::Softmax);
        c.capacity = Some(Capacity {
            factor: 0.5,
            policy: DropPolicy::Probs,
            seq_len: None,
        });
        c
    };
    // T = 2, K = 1, E = 2, cf = 0.5: C = 1. Both tokens want expert 0 with equal weight.
    let tie = case(array![[1.0, 0.0], [1.0, 0.0]], cfg());
    let r = route(&tie).unwrap();
    assert_eq!(r.kept, array![[true], [false]]);
    let mut got = outputs(&tie, &r);
    got.kept = array![[false], [true]];
    got.weights = array![[0.0], [r.weights[[1, 0]]]];
    let rep = compare(&tie, &r, &got);
    assert!(rep.passed(), "{:?}", rep.first_failure());
    assert_eq!(rep.near_tie_assignments, 2);
    // A clear winner (token 1's weight is larger) decided the other way is a failure.
    let clear = case(array![[1.0, 0.0], [2.0, 0.0]], cfg());
    let r = route(&clear).unwrap();
    assert_eq!(r.kept, array![[false], [true]]);
    let mut got = outputs(&clear, &r);
    got.kept = array![[true], [false]];
    got.weights = array![[r.weights[[0, 0]]], [0.0]];
    let rep = compare(&clear, &r, &got);
    assert!(!rep.passed());
    assert_eq!(rep.near_tie_assignments, 0);
}
