//! The training model's own tests: hand-written gradients against finite differences, a run
//! is bit-reproducible, and the reference arm's loss falls toward the data's floor.

use ndarray::{Array2, Array3};

use moecheck_reference::gemm::bound::gamma;
use moecheck_reference::routing::{RoutingConfig, ScoreFunction};
use moecheck_reference::seed::mix;

use super::data::MarkovChain;
use super::experts::{Exact, ExpertGemm, Through};
use super::model::{loss_and_grads, Params, Shape};
use super::{train, TrainConfig};

fn tiny() -> (Shape, RoutingConfig) {
    (
        Shape {
            vocab: 5,
            context: 2,
            hidden: 4,
            ffn: 3,
            experts: 4,
            layers: 2,
        },
        RoutingConfig::new(2, ScoreFunction::Softmax),
    )
}

/// The loss at `params`, and the selected experts of every layer (to refuse a step that
/// crosses a routing boundary).
fn loss_at(p: &Params, routing: &RoutingConfig, batch: &super::data::Batch) -> (f64, Vec<usize>) {
    let r = loss_and_grads(&Exact, p, routing, batch).expect("exact GEMMs do not fail");
    (r.loss, r.load.concat())
}

/// A direction with entries in [-1, 1] from `seed`.
fn direction(len: usize, seed: u64) -> Vec<f64> {
    (0..len as u64)
        .map(|i| (mix(seed ^ mix(i)) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0)
        .collect()
}

/// Per tensor, the directional derivative `<g, v>` of the hand-written backward against the
/// Richardson-extrapolated central difference of the loss (the derivation of the step and
/// the tolerance is the one of `moecheck_reference::moe::fd`): `h = (2^-53)^{1/3}·max|θ|`,
/// `R = (4·D(h/2) − D(h))/3`, `tol = 2·(|D(h) − D(h/2)| + 3·ε_L/h)`, with `ε_L` the f64
/// evaluation error of the loss, `γ_n(2^-53)·(|L| + Σ|logits|/B)` for `n` the longest chain
/// of roundings through the model (embedding sum, per layer the router, gate/up, down and
/// combine reductions, the output projection and the log-sum-exp).
fn fd_mismatches(
    p: &Params,
    grads: &Params,
    routing: &RoutingConfig,
    batch: &super::data::Batch,
    shape: &Shape,
) -> Vec<String> {
    let (l0, sel0) = loss_at(p, routing, batch);
    let chain = shape.context
        + shape.layers * (2 * shape.hidden + shape.ffn + routing.topk + shape.experts)
        + shape.hidden
        + 2 * shape.vocab;
    let logits_abs = 20.0 * (1.0 + l0.abs());
    let eps_l = gamma(chain, 2f64.powi(-53)) * (l0.abs() + logits_abs);
    let mut bad = Vec::new();
    let names = p.names();
    for (ti, name) in names.iter().enumerate() {
        let theta = p.tensors()[ti].to_vec();
        let v = direction(theta.len(), ti as u64 + 1);
        let scale = theta.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let h = 2f64.powi(-53).cbrt() * scale;
        let at = |step: f64| {
            let mut q = p.clone();
            for (x, d) in q.tensors_mut()[ti].iter_mut().zip(&v) {
                *x += step * d;
            }
            loss_at(&q, routing, batch)
        };
        let pts = [at(h), at(-h), at(h / 2.0), at(-h / 2.0)];
        assert!(
            pts.iter().all(|(_, sel)| *sel == sel0),
            "{name}: the routing changes within the step; pick another seed"
        );
        let d1 = (pts[0].0 - pts[1].0) / (2.0 * h);
        let d2 = (pts[2].0 - pts[3].0) / h;
        let numeric = (4.0 * d2 - d1) / 3.0;
        let g = grads.tensors()[ti];
        let analytic: f64 = g.iter().zip(&v).map(|(a, b)| a * b).sum();
        let dot_err = gamma(v.len(), 2f64.powi(-53))
            * g.iter().zip(&v).map(|(a, b)| (a * b).abs()).sum::<f64>();
        let tol = 2.0 * ((d1 - d2).abs() + 3.0 * eps_l / h) + dot_err;
        if (analytic - numeric).abs() > tol {
            bad.push(format!(
                "{name}: analytic {analytic:e}, numeric {numeric:e}, tol {tol:e}"
            ));
        }
        // The check has teeth: a 1% error in the directional derivative would be seen.
        assert!(
            tol < 0.01 * numeric.abs(),
            "{name}: tol {tol:e} vs {numeric:e}"
        );
    }
    bad
}

#[test]
fn hand_written_gradients_match_finite_differences() {
    let (shape, routing) = tiny();
    for seed in 0..3 {
        let p = Params::init(&shape, seed);
        let batch = MarkovChain::new(shape.vocab, seed).batch(0, 6, shape.context);
        let grads = loss_and_grads(&Exact, &p, &routing, &batch).unwrap().grads;
        let bad = fd_mismatches(&p, &grads, &routing, &batch, &shape);
        assert!(bad.is_empty(), "seed {seed}: {bad:#?}");
    }
}

/// Planted bugs in the gradient (a router gradient that misses the routing VJP, a
/// down-projection gradient off by 1%, a gate/up gradient with one element's sign flipped):
/// each is caught on the tensor it touches.
#[test]
fn finite_differences_catch_wrong_gradients() {
    let (shape, routing) = tiny();
    let p = Params::init(&shape, 0);
    let batch = MarkovChain::new(shape.vocab, 0).batch(0, 6, shape.context);
    let good = loss_and_grads(&Exact, &p, &routing, &batch).unwrap().grads;
    type Plant = fn(&mut Params);
    let plants: [(&str, Plant); 3] = [
        ("layer1.router", |g| g.layers[1].router.fill(0.0)),
        ("layer0.wo", |g| g.layers[0].wo *= 1.01),
        ("layer0.w01", |g| {
            let i = g.layers[0]
                .w01
                .indexed_iter()
                .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
                .map(|(i, _)| i)
                .unwrap();
            g.layers[0].w01[i] *= -1.0;
        }),
    ];
    for (tensor, plant) in plants {
        let mut g = good.clone();
        plant(&mut g);
        let bad = fd_mismatches(&p, &g, &routing, &batch, &shape);
        assert!(
            bad.len() == 1 && bad[0].starts_with(tensor),
            "{tensor}: {bad:#?}"
        );
    }
}

fn small_config(steps: u64) -> TrainConfig {
    TrainConfig {
        shape: Shape {
            vocab: 8,
            context: 2,
            hidden: 16,
            ffn: 16,
            experts: 4,
            layers: 1,
        },
        routing: RoutingConfig::new(2, ScoreFunction::Softmax),
        batch: 128,
        steps,
        lr: 0.02,
        init_seed: 0,
        data_seed: 0,
    }
}

/// Two runs of one configuration through the registry's emulation model give the same losses
/// bit for bit; another init seed does not.
#[test]
fn a_seeded_run_is_bit_reproducible() {
    use moecheck_reference::format::Format;
    let gemm = || -> Box<dyn ExpertGemm> {
        Box::new(Through::new(
            Box::new(crate::impls::gemm::emulate::Emulate::with_bug(None)),
            Format::Bf16,
        ))
    };
    let cfg = small_config(5);
    let losses = |c: &TrainConfig| -> Vec<u64> {
        train(c, gemm().as_ref(), |_| {})
            .unwrap()
            .steps
            .iter()
            .map(|s| s.loss.to_bits())
            .collect()
    };
    let a = losses(&cfg);
    assert_eq!(a, losses(&cfg));
    let other = TrainConfig {
        init_seed: 1,
        ..cfg.clone()
    };
    assert_ne!(a, losses(&other));
}

/// The reference arm learns the chain: its loss closes most of the gap between a uniform
/// prediction (`ln V`) and the entropy rate, and stays above the floor by more than the
/// batch noise allows.
#[test]
fn reference_loss_falls_toward_the_floor() {
    let cfg = small_config(150);
    let run = train(&cfg, &Exact, |_| {}).unwrap();
    let last = run.final_loss(30);
    let closed = (run.uniform_loss - last) / (run.uniform_loss - run.loss_floor);
    assert!(
        closed > 0.8,
        "loss {last}, floor {}, uniform {}",
        run.loss_floor,
        run.uniform_loss
    );
    // 30 steps × 128 examples: the mean of −ln p has a standard error well under 0.05.
    assert!(
        last > run.loss_floor - 0.05,
        "{last} below the floor {}",
        run.loss_floor
    );
}

#[test]
fn an_exact_gemm_is_the_reference_gemm_on_f32_operands() {
    // Through the registry's reference at f32 and the exact GEMM agree to f32 rounding of
    // the operands: the same model, only the operands' format differs.
    use moecheck_reference::format::Format;
    use moecheck_reference::op::Reference;
    let x = Array2::from_shape_fn((5, 3), |(i, j)| (i as f64 - j as f64) / 3.0);
    let w = Array3::from_shape_fn((2, 3, 4), |(g, i, j)| (g + i * j) as f64 / 7.0);
    let sizes = [2, 2];
    let exact = Exact.forward(x.view(), w.view(), &sizes).unwrap();
    let through = Through::<moecheck_reference::gemm::Gemm>::new(Box::new(Reference), Format::F32)
        .forward(x.view(), w.view(), &sizes)
        .unwrap();
    let diff = (&exact - &through)
        .mapv(f64::abs)
        .fold(0.0f64, |m, &d| m.max(d));
    assert!(diff > 0.0 && diff < 1e-6, "{diff}");
    assert_eq!(through.row(4).sum(), 0.0, "the tail row");
}

/// The in-process reference of `train --impl reference` gives the registry reference's
/// values bit for bit, at f32 and bf16 (tail rows 0 in both).
#[test]
fn rounded_reference_is_the_registry_reference() {
    use super::experts::Rounded;
    use moecheck_reference::format::Format;
    use moecheck_reference::gemm::Gemm;
    use moecheck_reference::op::Reference;
    let x = Array2::from_shape_fn((7, 5), |(i, j)| ((i * 5 + j) as f64 * 0.377).sin());
    let w = Array3::from_shape_fn((3, 5, 4), |(g, i, j)| {
        ((g * 20 + i * 4 + j) as f64 * 0.91).cos()
    });
    let dy = Array2::from_shape_fn((7, 4), |(i, j)| ((i * 4 + j) as f64 * 1.3).sin());
    let sizes = [3, 0, 3];
    for dtype in [Format::F32, Format::Bf16] {
        let a = Rounded { dtype };
        let b = Through::<Gemm>::new(Box::new(Reference), dtype);
        let fa = a.forward(x.view(), w.view(), &sizes).unwrap();
        let fb = b.forward(x.view(), w.view(), &sizes).unwrap();
        assert_eq!(fa, fb, "{dtype}");
        let ga = a.backward(x.view(), w.view(), &sizes, dy.view()).unwrap();
        let gb = b.backward(x.view(), w.view(), &sizes, dy.view()).unwrap();
        assert_eq!(ga, gb, "{dtype}");
        // Rounding happened: bf16 and f32 operands give different products.
        assert_ne!(
            fa,
            Exact.forward(x.view(), w.view(), &sizes).unwrap(),
            "{dtype}"
        );
    }
}
