//! Sparse == dense, gradient == finite differences, and the exact zeros, on small fixed cases
//! for every score function (the properties crate runs the same checks on generated cases).

use ndarray::{Array1, Array2, Array3};

use super::*;
use crate::format::Format;
use crate::moe::ffn::{Activation, ExpertBias};
use crate::routing::{Capacity, DropPolicy, GroupLimit, RoutingConfig, ScoreFunction};

fn hash(seed: u64, i: u64) -> f64 {
    let z = crate::seed::mix(seed ^ crate::seed::mix(i));
    (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

pub(crate) fn case(
    seed: u64,
    t: usize,
    h: usize,
    e: usize,
    f: usize,
    cfg: RoutingConfig,
    shared: bool,
) -> MoeCase {
    let mut n = 0u64;
    let mut next = |scale: f64| {
        n += 1;
        hash(seed, n) * scale
    };
    MoeCase {
        x: Array2::from_shape_fn((t, h), |_| next(1.0)),
        wr: Array2::from_shape_fn((h, e), |_| next(1.0)),
        bias: Some(Array1::from_shape_fn(e, |_| next(0.1))),
        w0: Array3::from_shape_fn((e, h, f), |_| next(0.5)),
        w1: Array3::from_shape_fn((e, h, f), |_| next(0.5)),
        wo: Array3::from_shape_fn((e, f, h), |_| next(0.5)),
        shared: shared.then(|| SharedExpert {
            w0: Array2::from_shape_fn((h, 3), |_| next(0.5)),
            w1: Array2::from_shape_fn((h, 3), |_| next(0.5)),
            wo: Array2::from_shape_fn((3, h), |_| next(0.5)),
            gate: None,
        }),
        dout: Array2::from_shape_fn((t, h), |_| next(1.0)),
        routing: cfg,
        dtype: Format::F64,
        router_bias: None,
        expert_bias: None,
        activation: Activation::Swiglu,
    }
}

/// Makes `c` a gpt-oss layer: the clamped SwiGLU, expert biases and a router bias, hashed
/// from `seed`; `scale` multiplies `W0` and `W1` (8 puts some activation inputs past the
/// clamp at ±7).
pub(crate) fn gpt_oss(c: &mut MoeCase, seed: u64, scale: f64) {
    let (e, h, f) = (c.experts(), c.hidden(), c.ffn());
    let mut n = 0u64;
    let mut next = |s: f64| {
        n += 1;
        hash(seed ^ 0x6770, n) * s
    };
    c.activation = Activation::ClampedSwiglu;
    c.router_bias = Some(Array1::from_shape_fn(e, |_| next(0.5)));
    c.expert_bias = Some(ExpertBias {
        b0: Array2::from_shape_fn((e, f), |_| next(1.0)),
        b1: Array2::from_shape_fn((e, f), |_| next(1.0)),
        bo: Array2::from_shape_fn((e, h), |_| next(0.5)),
    });
    c.w0.mapv_inplace(|v| v * scale);
    c.w1.mapv_inplace(|v| v * scale);
}

/// Gives `c`'s shared expert a sigmoid gate (Qwen2-MoE) with weights hashed from `seed`.
pub(crate) fn gate_shared(c: &mut MoeCase, seed: u64) {
    let h = c.hidden();
    if let Some(s) = c.shared.as_mut() {
        s.gate = Some(Array1::from_shape_fn(h, |i| hash(seed ^ 0x9a7e, i as u64)));
    }
}

pub(crate) fn configs() -> Vec<RoutingConfig> {
    let mut v = Vec::new();
    for score in ScoreFunction::ALL {
        let mut c = RoutingConfig::new(2, score);
        v.push(c);
        c.norm_topk = true;
        c.scaling_factor = 2.5;
        c.groups = Some(GroupLimit {
            groups: 3,
            topk_groups: 2,
        });
        v.push(c);
        c.capacity = Some(Capacity {
            factor: 0.5,
            policy: DropPolicy::Probs,
            seq_len: None,
        });
        v.push(c);
        c.capacity = Some(Capacity {
            factor: 0.75,
            policy: DropPolicy::Position,
            seq_len: Some(4),
        });
        v.push(c);
    }
    v
}

const F64: LayerPrecision = LayerPrecision {
    input: Format::F64,
    compute: Format::F64,
    router: None,
    output: Format::F64,
};

#[test]
fn sparse_equals_dense_within_the_f64_bound() {
    for (i, cfg) in configs().into_iter().enumerate() {
        let mut c = case(i as u64, 8, 5, 6, 4, cfg, i % 2 == 0);
        if i % 3 == 1 {
            gpt_oss(&mut c, i as u64, 8.0);
        }
        let fwd = forward(&c).unwrap();
        let sparse = backward(&c, &fwd).grads;
        let dense = dense_layer(&c).unwrap();
        let bound = layer_bound(&c, &fwd, &F64);
        for id in TensorId::of_case(&c) {
            let (a, b) = (sparse.get(id).unwrap(), dense.get(id).unwrap());
            let e = bound.get(id).unwrap();
            for ((x, y), bnd) in a.iter().zip(b.iter()).zip(e.iter()) {
                // Both are f64 evaluations of the same function: within twice the bound.
                assert!(
                    (x - y).abs() <= 2.0 * bnd,
                    "{cfg:?} {id}: {x} vs {y} (bound {bnd})"
                );
            }
        }
    }
}

#[test]
fn gradients_match_finite_differences() {
    let mut checked = 0;
    for (i, cfg) in configs().into_iter().enumerate() {
        for seed in 0..4u64 {
            let mut c = case(100 * i as u64 + seed, 8, 5, 6, 4, cfg, seed % 2 == 1);
            if i % 2 == 0 {
                gate_shared(&mut c, seed);
            }
            if i % 3 == 1 {
                gpt_oss(&mut c, seed, 8.0);
            }
            let fwd = forward(&c).unwrap();
            let grads = backward(&c, &fwd).grads;
            let bound = layer_bound(&c, &fwd, &F64);
            match fd::check_gradients(&c, &grads, Some(&bound), seed).unwrap() {
                fd::FdOutcome::Checked(v) => {
                    for ch in v {
                        assert!(ch.passed(), "{cfg:?}: {ch:?}");
                    }
                    checked += 1;
                    break;
                }
                fd::FdOutcome::NearTie(_) => continue,
            }
        }
    }
    assert!(
        checked >= configs().len() - 1,
        "only {checked} configurations checked"
    );
}

#[test]
fn a_wrong_gradient_fails_finite_differences() {
    let c = case(7, 8, 5, 6, 4, configs()[0], false);
    let fwd = forward(&c).unwrap();
    let mut grads = backward(&c, &fwd).grads;
    grads.dw_router.mapv_inplace(|v| v * 1.01);
    let fd::FdOutcome::Checked(v) = fd::check_gradients(&c, &grads, None, 0).unwrap() else {
        panic!("near tie on a fixed case")
    };
    assert!(v
        .iter()
        .any(|ch| ch.tensor == TensorId::DwRouter && !ch.passed()));
}

#[test]
fn a_gated_shared_expert_is_differentiated_through_its_gate() {
    let mut c = case(7, 8, 5, 6, 4, configs()[0], true);
    gate_shared(&mut c, 7);
    let fwd = forward(&c).unwrap();
    let grads = backward(&c, &fwd).grads;
    let fd::FdOutcome::Checked(v) = fd::check_gradients(&c, &grads, None, 0).unwrap() else {
        panic!("near tie on a fixed case")
    };
    assert!(v.iter().all(|ch| ch.passed()), "{v:?}");
    assert!(v.iter().any(|ch| ch.tensor == TensorId::DsharedGate));
    // The gate scales the output: without it the layer's output is another function.
    let ungated = {
        let mut u = c.clone();
        u.shared.as_mut().unwrap().gate = None;
        forward(&u).unwrap().out
    };
    assert!((&ungated - &fwd.out).iter().any(|d| d.abs() > 1e-3));
    // Two bugs a hand-written backward makes: the gate's gradient off by 1%, and the shared
    // expert's weight gradients taken from the ungated dout.
    let mut wrong = grads.clone();
    wrong
        .dshared_gate
        .as_mut()
        .unwrap()
        .mapv_inplace(|v| v * 1.01);
    let fd::FdOutcome::Checked(v) = fd::check_gradients(&c, &wrong, None, 0).unwrap() else {
        panic!("near tie on a fixed case")
    };
    assert!(v
        .iter()
        .any(|ch| ch.tensor == TensorId::DsharedGate && !ch.passed()));
    let mut u = c.clone();
    u.shared.as_mut().unwrap().gate = None;
    let ungated_grads = backward(&u, &forward(&u).unwrap()).grads;
    let mut wrong = grads;
    wrong.dshared = ungated_grads.dshared;
    let fd::FdOutcome::Checked(v) = fd::check_gradients(&c, &wrong, None, 0).unwrap() else {
        panic!("near tie on a fixed case")
    };
    assert!(v
        .iter()
        .any(|ch| ch.tensor == TensorId::DsharedW0 && !ch.passed()));
}

#[test]
fn dropped_and_empty_get_exact_zeros() {
    // Tight capacity: many assignments dropped; 6 experts with k = 1 and 3 tokens leave some
    // experts empty.
    let mut cfg = RoutingConfig::new(1, ScoreFunction::Softmax);
    cfg.capacity = Some(Capacity {
        factor: 0.5,
        policy: DropPolicy::Position,
        seq_len: None,
    });
    let c = case(3, 6, 5, 6, 4, cfg, false);
    let fwd = forward(&c).unwrap();
    let g = backward(&c, &fwd).grads;
    let r = &fwd.routing;
    assert!(r.kept.iter().any(|k| !k), "the case drops something");
    for t in 0..6 {
        if !r.kept[(t, 0)] {
            assert!(g.out.row(t).iter().all(|v| *v == 0.0));
            assert!(g.dx.row(t).iter().all(|v| *v == 0.0));
        }
    }
    for (e, size) in fwd.perm.group_sizes.iter().enumerate() {
        if *size == 0 {
            for w in [&g.dw0, &g.dw1, &g.dwo] {
                assert!(w.index_axis(ndarray::Axis(0), e).iter().all(|v| *v == 0.0));
            }
        }
    }
}

#[test]
fn an_exact_tie_is_refused_by_both_guards() {
    // Experts 0 and 1 have identical router columns, the others zero columns: every token has
    // a tie inside its top k + 1 (between 0 and 1, or among the zero logits).
    let mut c = case(
        11,
        6,
        5,
        6,
        4,
        RoutingConfig::new(2, ScoreFunction::Softmax),
        false,
    );
    c.bias = None;
    for h in 0..5 {
        c.wr[(h, 1)] = c.wr[(h, 0)];
        for e in 2..6 {
            c.wr[(h, e)] = 0.0;
        }
    }
    let p = LayerPrecision {
        input: Format::F64,
        compute: Format::F32,
        router: None,
        output: Format::F32,
    };
    assert!(tie_guard(&c, &p).unwrap().is_some());
    let fwd = forward(&c).unwrap();
    let grads = backward(&c, &fwd).grads;
    assert!(matches!(
        fd::check_gradients(&c, &grads, None, 0).unwrap(),
        fd::FdOutcome::NearTie(_)
    ));
}

/// The bound has teeth: outputs rounded to bf16 by an implementation that declares f32
/// fail, while the same outputs rounded to f32 pass.
#[test]
fn bf16_rounded_outputs_fail_an_f32_declaration() {
    use crate::format::{round_to, Overflow};
    use crate::op::{verify, Implementation, Reference, RunError, Verdict};

    struct Rounded(Format);
    impl Implementation<MoeLayer> for Rounded {
        fn name(&self) -> String {
            format!("reference rounded to {}", self.0)
        }
        fn is_model(&self) -> bool {
            true
        }
        fn precision(&self, case: &MoeCase) -> LayerPrecision {
            LayerPrecision {
                input: case.dtype,
                compute: Format::F32,
                router: None,
                output: Format::F32,
            }
        }
        fn run(&self, case: &MoeCase, ask: ()) -> Result<MoeOutputs, RunError> {
            let mut g = Implementation::<MoeLayer>::run(&Reference, case, ask)?;
            let r = |v: f64| round_to(v, self.0, Overflow::Ieee);
            g.out.mapv_inplace(r);
            g.dx.mapv_inplace(r);
            g.dw_router.mapv_inplace(r);
            g.dw0.mapv_inplace(r);
            g.dw1.mapv_inplace(r);
            g.dwo.mapv_inplace(r);
            Ok(g)
        }
    }
    let mut checked = 0;
    for (i, cfg) in configs().into_iter().enumerate() {
        let c = case(500 + i as u64, 8, 5, 6, 4, cfg, false);
        let p = Rounded(Format::F32).precision(&c);
        if tie_guard(&c, &p).unwrap().is_some() {
            continue;
        }
        checked += 1;
        assert!(
            verify(&Rounded(Format::F32), &c, ()).verdict.passed(),
            "{cfg:?}"
        );
        let v = verify(&Rounded(Format::Bf16), &c, ()).verdict;
        assert!(
            matches!(v, Verdict::Fail { .. }),
            "{cfg:?}: bf16 outputs did not fail an f32 bound: {v:?}"
        );
    }
    // Near ties may skip a configuration, never all of them.
    assert!(
        checked * 2 >= configs().len(),
        "only {checked} configurations checked"
    );
}

/// The router's precision apart from the layer's: an f64 layer whose router writes its
/// gradient in f32 (as an f64 Hugging Face module with its f32 router does) passes when the
/// router is declared f32 and fails when it is not (the whole layer f64, the default); a
/// router gradient rounded to bf16 fails the f32 router declaration too.
#[test]
fn router_precision_is_declared_apart_from_the_layer() {
    use crate::format::{round_to, Overflow};
    use crate::op::{verify, Implementation, Reference, RunError, Verdict};

    struct RouterRounded {
        declared: Option<Format>,
        to: Format,
    }
    impl Implementation<MoeLayer> for RouterRounded {
        fn name(&self) -> String {
            format!("reference with dw_router rounded to {}", self.to)
        }
        fn is_model(&self) -> bool {
            true
        }
        fn precision(&self, case: &MoeCase) -> LayerPrecision {
            LayerPrecision {
                input: case.dtype,
                compute: Format::F64,
                router: self.declared,
                output: Format::F64,
            }
        }
        fn run(&self, case: &MoeCase, ask: ()) -> Result<MoeOutputs, RunError> {
            let mut g = Implementation::<MoeLayer>::run(&Reference, case, ask)?;
            g.dw_router
                .mapv_inplace(|v| round_to(v, self.to, Overflow::Ieee));
            Ok(g)
        }
    }
    let f32_router = RouterRounded {
        declared: Some(Format::F32),
        to: Format::F32,
    };
    let mut checked = 0;
    for (i, cfg) in configs().into_iter().enumerate() {
        let c = case(700 + i as u64, 8, 5, 6, 4, cfg, false);
        if tie_guard(&c, &f32_router.precision(&c)).unwrap().is_some() {
            continue;
        }
        checked += 1;
        let v = verify(&f32_router, &c, ()).verdict;
        assert!(v.passed(), "{cfg:?}: {:?}", v.failure());
        let undeclared = RouterRounded {
            declared: None,
            to: Format::F32,
        };
        let v = verify(&undeclared, &c, ()).verdict;
        assert!(
            matches!(&v, Verdict::Fail { reason, .. } if reason.contains("dw_router")),
            "{cfg:?}: an f32 router gradient passed an f64 router: {v:?}"
        );
        let bf16 = RouterRounded {
            declared: Some(Format::F32),
            to: Format::Bf16,
        };
        let v = verify(&bf16, &c, ()).verdict;
        assert!(
            matches!(v, Verdict::Fail { .. }),
            "{cfg:?}: a bf16 router gradient passed an f32 router: {v:?}"
        );
    }
    assert!(
        checked * 2 >= configs().len(),
        "only {checked} configurations checked"
    );
}
