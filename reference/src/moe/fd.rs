//! Central finite differences of the layer in f64, and the near-tie guard.
//!
//! ## What is compared
//! With `L(θ) = Σ dout ⊙ out(θ)` (so `∇L` is exactly what the backward returns), for each input
//! tensor `θ` (x, W_r, W0, W1, Wo, the shared expert and its gate) and a fixed pseudo-random direction `v`
//! (entries in `[-1, 1]`, derived from a seed), the directional derivative `<∇_θ L, v>` of the
//! implementation is compared with a finite-difference estimate.
//!
//! ## Step and tolerance (derivation)
//! `D(h) = (L(θ+hv) − L(θ−hv)) / 2h = <∇L, v> + c·h² + O(h⁴) + ρ(h)`, with the rounding term
//! `|ρ(h)| <= ε_L/h` where `ε_L` bounds the f64 evaluation error of `L` (from
//! [`super::layer_bound`] with an f64 precision: `Σ|dout|·e(out) + γ_{TH}(2^-53)·Σ|dout·out|`,
//! doubled because it is evaluated at `θ`, not at the points `θ ± h·v` themselves).
//! Balancing `c·h²` against `ε_L/h` gives `h ∝ ε^{1/3}`: we take `h = (2^-53)^{1/3}·max|θ|`.
//! Richardson extrapolation `R = (4·D(h/2) − D(h))/3` removes the `h²` term; what is left is
//! `O(h⁴)`, well below `|D(h) − D(h/2)| = (3/4)|c|h² + …`, and the rounding of `R` is at most
//! `(4·2ε_L/h + ε_L/h)/3 = 3ε_L/h`. So
//!
//! `tol_fd = 2·(|D(h) − D(h/2)| + 3ε_L/h)` (a factor 2 of safety on an asymptotic estimate),
//!
//! and an implementation whose gradient carries its own error bound `e(g)` passes when
//! `|<ĝ, v> − R| <= tol_fd + Σ|v|·e(g) + γ_n(2^-53)·Σ|ĝ·v|`.
//!
//! ## The guard
//! The layer is piecewise smooth: the top-k selection, the group choice and (`probs`) the
//! capacity ranking are piecewise constant, and gpt-oss's clamped activation has kinks at
//! its clamps. At a point within `h` of such a boundary `D(h)` measures a jump, not a
//! derivative; a clamp crossed between `θ ± h·v` refuses the point the same way. [`check_gradients`] therefore recomputes the routing at
//! `θ ± h·v` and `θ ± h·v/2`, refuses the point ([`FdOutcome::NearTie`]) if any selection or
//! kept mask differs, and also if any margin at `θ` is within four times the largest change of
//! the selection scores or weights over the segment ([`near_tie`]). Callers resample such
//! cases; they are never counted as passed.

use ndarray::{Array2, ArrayD, IxDyn, Zip};

use super::bound::{layer_bound, LayerPrecision};
use super::ffn::{Activation, CLAMP_LIMIT};
use super::layer::{forward, MoeCase, MoeOutputs, TensorId};
use crate::format::Format;
use crate::gemm::bound::gamma;
use crate::routing::topk::{group_scores, group_terms};
use crate::routing::{DropPolicy, Routing};
use crate::seed::mix;
use crate::Error;

/// Why a point is too close to a non-differentiable boundary, or `None`.
///
/// Reads the routing at the point and bounds `score_err (T, E)` on the selection scores and
/// `weight_err (T, k)` on the weights; a margin passes when it is larger than the sum of the
/// bounds of the two values it separates (for group scores, of the two sums of `n` scores
/// each: `2n` times the token's largest score bound):
///
/// * per token, between consecutive selection scores among the top `k + 1` allowed experts
///   (the chosen set and their slot order);
/// * per token with a group limit, between the `TG`-th and `(TG+1)`-th group scores;
/// * with `probs` capacity, per over-full expert, between the weights of its `C`-th and
///   `(C+1)`-th candidates.
pub fn near_tie(
    routing: &Routing,
    score_err: &Array2<f64>,
    weight_err: &Array2<f64>,
) -> Option<String> {
    let cfg = &routing.config;
    let u = &routing.selection_scores;
    let (t, e) = u.dim();
    let k = cfg.topk;
    for ti in 0..t {
        let row_err = score_err.row(ti).fold(0.0f64, |m, v| m.max(*v));
        let allowed: Vec<usize> = match (&routing.group_mask, cfg.groups) {
            (Some(mask), Some(g)) => (0..e).filter(|x| mask[(ti, x / (e / g.groups))]).collect(),
            _ => (0..e).collect(),
        };
        let mut ranked = allowed.clone();
        ranked.sort_by(|&a, &b| u[(ti, b)].total_cmp(&u[(ti, a)]).then(a.cmp(&b)));
        for w in ranked.windows(2).take(k) {
            let gap = u[(ti, w[0])] - u[(ti, w[1])];
            if gap <= score_err[(ti, w[0])] + score_err[(ti, w[1])] {
                return Some(format!(
                    "token {ti}: selection scores of experts {} and {} differ by {gap:e}, within their error",
                    w[0], w[1]
                ));
            }
        }
        if let Some(g) = cfg.groups {
            if g.topk_groups < g.groups {
                let row: Vec<f64> = u.row(ti).to_vec();
                let terms = group_terms(cfg, e);
                let mut gs = group_scores(&row, g.groups, terms);
                gs.sort_by(|a, b| b.total_cmp(a));
                let gap = gs[g.topk_groups - 1] - gs[g.topk_groups];
                // Each group score sums `terms` selection scores, each within `row_err`.
                if gap <= 2.0 * terms as f64 * row_err {
                    return Some(format!(
                        "token {ti}: group scores {} and {} of the kept/dropped boundary differ by {gap:e}",
                        g.topk_groups - 1,
                        g.topk_groups
                    ));
                }
            }
        }
    }
    if let (Some(cap), Some(c)) = (cfg.capacity, routing.capacity) {
        if cap.policy == DropPolicy::Probs {
            let mut per: Vec<Vec<(usize, usize)>> = vec![Vec::new(); e];
            for ti in 0..t {
                for j in 0..k {
                    per[routing.indices[(ti, j)]].push((ti, j));
                }
            }
            for (ex, list) in per.iter_mut().enumerate() {
                // C = 0 drops every candidate whatever the weights: no boundary.
                if c == 0 || list.len() <= c {
                    continue;
                }
                list.sort_by(|a, b| routing.weights[*b].total_cmp(&routing.weights[*a]));
                let (a, b) = (list[c - 1], list[c]);
                let gap = routing.weights[a] - routing.weights[b];
                if gap <= weight_err[a] + weight_err[b] {
                    return Some(format!(
                        "expert {ex}: the weights of its {c}-th and next candidate differ by {gap:e}, within their error"
                    ));
                }
            }
        }
    }
    None
}

/// The direction for tensor `tag`: entries uniform in `[-1, 1]`, from `seed`.
fn direction(shape: &[usize], seed: u64, tag: u64) -> ArrayD<f64> {
    let mut i = 0u64;
    ArrayD::from_shape_fn(IxDyn(shape), |_| {
        i += 1;
        let h = mix(seed ^ mix(tag << 40 ^ i));
        (h >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    })
}

/// The input tensor a gradient is taken with respect to, mutably.
fn input_mut(case: &mut MoeCase, id: TensorId) -> Option<ndarray::ArrayViewMutD<'_, f64>> {
    Some(match id {
        TensorId::Out => return None,
        TensorId::Dx => case.x.view_mut().into_dyn(),
        TensorId::DwRouter => case.wr.view_mut().into_dyn(),
        TensorId::Dw0 => case.w0.view_mut().into_dyn(),
        TensorId::Dw1 => case.w1.view_mut().into_dyn(),
        TensorId::Dwo => case.wo.view_mut().into_dyn(),
        TensorId::DsharedW0 => case.shared.as_mut()?.w0.view_mut().into_dyn(),
        TensorId::DsharedW1 => case.shared.as_mut()?.w1.view_mut().into_dyn(),
        TensorId::DsharedWo => case.shared.as_mut()?.wo.view_mut().into_dyn(),
        TensorId::DsharedGate => case.shared.as_mut()?.gate.as_mut()?.view_mut().into_dyn(),
        TensorId::DrouterBias => case.router_bias.as_mut()?.view_mut().into_dyn(),
        TensorId::DexpertB0 => case.expert_bias.as_mut()?.b0.view_mut().into_dyn(),
        TensorId::DexpertB1 => case.expert_bias.as_mut()?.b1.view_mut().into_dyn(),
        TensorId::DexpertBo => case.expert_bias.as_mut()?.bo.view_mut().into_dyn(),
    })
}

/// One directional-derivative comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct FdCheck {
    pub tensor: TensorId,
    /// `<ĝ, v>` of the implementation.
    pub analytic: f64,
    /// The Richardson-extrapolated finite difference `R`.
    pub numeric: f64,
    pub tolerance: f64,
}

impl FdCheck {
    pub fn passed(&self) -> bool {
        (self.analytic - self.numeric).abs() <= self.tolerance
    }
}

/// The result of [`check_gradients`].
#[derive(Debug, Clone, PartialEq)]
pub enum FdOutcome {
    /// One comparison per gradient tensor.
    Checked(Vec<FdCheck>),
    /// The point is within the step of a non-differentiable boundary; resample.
    NearTie(String),
}

/// Which activation inputs are past a clamp (`a ≥ L`, `|b| ≥ L`; empty for SwiGLU).
fn clamp_mask(case: &MoeCase, f: &super::layer::Forward) -> Vec<bool> {
    if case.activation != Activation::ClampedSwiglu {
        return Vec::new();
    }
    let ffns = std::iter::once(&f.ffn).chain(f.shared.as_ref());
    ffns.flat_map(|x| {
        let a = x.a.iter().map(|v| *v >= CLAMP_LIMIT);
        let b = x.b.iter().map(|v| v.abs() >= CLAMP_LIMIT);
        a.chain(b).collect::<Vec<bool>>()
    })
    .collect()
}

/// `Σ dout ⊙ out`, the routing and the clamp mask at `case`.
fn loss(case: &MoeCase) -> Result<(f64, Routing, Vec<bool>), Error> {
    let f = forward(case)?;
    let mask = clamp_mask(case, &f);
    Ok(((&f.out * &case.dout).sum(), f.routing, mask))
}

/// Compares the gradients `grads` (with per-element bounds `grad_bound`, if the
/// implementation declares a precision) against central finite differences of the f64
/// reference, one direction per input tensor (module documentation). Validates `case`.
pub fn check_gradients(
    case: &MoeCase,
    grads: &MoeOutputs,
    grad_bound: Option<&super::bound::LayerBound>,
    seed: u64,
) -> Result<FdOutcome, Error> {
    let fwd = forward(case)?;
    let f64p = LayerPrecision {
        input: Format::F64,
        compute: Format::F64,
        router: None,
        output: Format::F64,
    };
    let ref_bound = layer_bound(case, &fwd, &f64p);
    let out_err = ref_bound.get(TensorId::Out).expect("out bound");
    let n_out = case.dout.len();
    let eps_l = 2.0
        * ((&case.dout.mapv(f64::abs).into_dyn() * out_err).sum()
            + gamma(n_out, 2f64.powi(-53)) * (&case.dout * &fwd.out).mapv(f64::abs).sum());
    let mut checks = Vec::new();
    for (tag, id) in TensorId::of_case(case).into_iter().enumerate().skip(1) {
        let theta = input_mut(&mut case.clone(), id)
            .map(|a| a.to_owned())
            .expect("a gradient tensor has an input");
        let v = direction(theta.shape(), seed, tag as u64);
        // An all-zero tensor (a bias initialised to 0) steps as if its entries were 1: a step
        // of 1e-313 would make the tolerance pass anything.
        let scale = match theta.fold(0.0f64, |m, x| m.max(x.abs())) {
            0.0 => 1.0,
            m => m,
        };
        let h = 2f64.powi(-53).cbrt() * scale;
        let at = |step: f64| -> Result<(f64, Routing, Vec<bool>), Error> {
            let mut c = case.clone();
            let mut t = input_mut(&mut c, id).expect("input");
            Zip::from(&mut t).and(&v).for_each(|x, d| *x += step * d);
            loss(&c)
        };
        let (lp, rp, mp) = at(h)?;
        let (lm, rm, mm) = at(-h)?;
        let (lp2, rp2, mp2) = at(h / 2.0)?;
        let (lm2, rm2, mm2) = at(-h / 2.0)?;
        let r0 = &fwd.routing;
        let m0 = clamp_mask(case, &fwd);
        if [&mp, &mm, &mp2, &mm2].iter().any(|m| **m != m0) {
            return Ok(FdOutcome::NearTie(format!(
                "{id}: an activation input crosses its clamp within the finite-difference step"
            )));
        }
        for r in [&rp, &rm, &rp2, &rm2] {
            if r.indices != r0.indices || r.kept != r0.kept {
                return Ok(FdOutcome::NearTie(format!(
                    "{id}: the routing changes within the finite-difference step"
                )));
            }
        }
        let du = [&rp, &rm]
            .iter()
            .map(|r| (&r.selection_scores - &r0.selection_scores).mapv(f64::abs))
            .fold(Array2::zeros(r0.selection_scores.dim()), |a, b| {
                a.max_with(&b)
            });
        let dw = [&rp, &rm]
            .iter()
            .map(|r| (&r.weights - &r0.weights).mapv(f64::abs))
            .fold(Array2::zeros(r0.weights.dim()), |a, b| a.max_with(&b));
        if let Some(why) = near_tie(r0, &(du * 4.0), &(dw * 4.0)) {
            return Ok(FdOutcome::NearTie(format!("{id}: {why}")));
        }
        let d1 = (lp - lm) / (2.0 * h);
        let d2 = (lp2 - lm2) / h;
        let numeric = (4.0 * d2 - d1) / 3.0;
        let tol_fd = 2.0 * ((d1 - d2).abs() + 3.0 * eps_l / h);
        let g = grads.get(id).ok_or_else(|| Error::InvalidMoe {
            what: "gradients",
            reason: format!("{id} is missing"),
        })?;
        if g.shape() != v.shape() {
            return Err(Error::ShapeMismatch {
                op: "finite differences",
                what: id.name(),
                expected: v.shape().to_vec(),
                got: g.shape().to_vec(),
            });
        }
        let analytic = (&g * &v).sum();
        let dot_err = gamma(v.len(), 2f64.powi(-53)) * (&g * &v).mapv(f64::abs).sum();
        let impl_err = grad_bound
            .and_then(|b| b.get(id))
            .map_or(0.0, |e| (e * &v.mapv(f64::abs)).sum());
        checks.push(FdCheck {
            tensor: id,
            analytic,
            numeric,
            tolerance: tol_fd + impl_err + dot_err,
        });
    }
    Ok(FdOutcome::Checked(checks))
}

/// Element-wise maximum, for folding.
trait MaxWith {
    fn max_with(self, o: &Array2<f64>) -> Array2<f64>;
}

impl MaxWith for Array2<f64> {
    fn max_with(mut self, o: &Array2<f64>) -> Array2<f64> {
        Zip::from(&mut self).and(o).for_each(|a, b| *a = a.max(*b));
        self
    }
}
