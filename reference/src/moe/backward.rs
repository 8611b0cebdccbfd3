//! The hand-written VJP of the MoE layer (module documentation of [`super`]).

use ndarray::{Array1, Array2, Array3, ArrayView2, Axis};

pub use super::ffn::{ffn_backward, FfnGrads};
use super::layer::{
    shared_as_group, shared_gate_values, FfnForward, FfnSpec, Forward, MoeCase, MoeOutputs,
    SharedExpert,
};
use super::permute::Permutation;
use crate::routing::{Routing, ScoreFunction};

/// The VJP of the routing from the combine weights to the router logits.
///
/// Reads the forward `routing` and `dc (T, k)` = ∂L/∂combine; returns `dz (T, E)`:
///
/// * `dw = dc ⊙ kept` (a dropped slot's weight is the constant 0);
/// * normalisation and scaling, `w = α·g/D`, `D = Σ g + ε`:
///   `dg[t,j] = α·(dw[t,j] − Σ_i dw[t,i]·g[t,i]/D_t)/D_t`; without it `dg = α·dw`;
/// * `softmax`: `ds[e] = Σ_{j: indices[t,j]=e} dg[t,j]`, `dz = s ⊙ (ds − <s, ds>)`;
/// * `sigmoid`: `dz[t, indices[t,j]] = dg[t,j]·s·(1 − s)`;
/// * `topk-softmax`: `dz[t, indices[t,j]] = g[t,j]·(dg[t,j] − Σ_i g[t,i]·dg[t,i])`.
///
/// The bias, the selection and the capacity mask get no gradient. Sums in slot / expert
/// order, f64.
pub fn routing_vjp(routing: &Routing, dc: ArrayView2<f64>) -> Array2<f64> {
    let cfg = &routing.config;
    let (t, k) = routing.indices.dim();
    let e = routing.scores.ncols();
    let mut dz = Array2::zeros((t, e));
    for ti in 0..t {
        let g = routing.gates.row(ti);
        let dw: Vec<f64> = (0..k)
            .map(|j| {
                if routing.kept[(ti, j)] {
                    dc[(ti, j)]
                } else {
                    0.0
                }
            })
            .collect();
        let alpha = cfg.scaling_factor;
        let dg: Vec<f64> = if cfg.normalises() {
            let d = routing.denominators[ti];
            let dot: f64 = (0..k).map(|i| dw[i] * g[i]).sum::<f64>() / d;
            dw.iter().map(|v| alpha * (v - dot) / d).collect()
        } else {
            dw.iter().map(|v| alpha * v).collect()
        };
        let s = routing.scores.row(ti);
        let idx = routing.indices.row(ti);
        match cfg.score {
            ScoreFunction::Softmax => {
                let mut ds = vec![0.0; e];
                for j in 0..k {
                    ds[idx[j]] += dg[j];
                }
                let dot: f64 = (0..e).map(|f| s[f] * ds[f]).sum();
                for f in 0..e {
                    dz[(ti, f)] = s[f] * (ds[f] - dot);
                }
            }
            ScoreFunction::Sigmoid => {
                for j in 0..k {
                    let sv = s[idx[j]];
                    dz[(ti, idx[j])] += dg[j] * sv * (1.0 - sv);
                }
            }
            ScoreFunction::TopkSoftmax => {
                let dot: f64 = (0..k).map(|i| g[i] * dg[i]).sum();
                for j in 0..k {
                    dz[(ti, idx[j])] += g[j] * (dg[j] - dot);
                }
            }
        }
    }
    dz
}

/// The backward's intermediates besides the gradients.
#[derive(Debug, Clone, PartialEq)]
pub struct Backward {
    pub grads: MoeOutputs,
    /// `dc (T, k)`: `<dout[t], yp[row of (t, s)]>` for kept slots, 0 for dropped.
    pub dcombine: Array2<f64>,
    /// `dz (T, E)`: the gradient at the router logits.
    pub dlogits: Array2<f64>,
}

/// The VJP of the combine ([`Permutation::combine`]) for `dout (T, H)`: the expert outputs'
/// gradient `dyp[r] = c[t, s]·dout[t]` (kept rows; tail rows 0) and the combine-weight
/// gradient `dc[t, s] = <dout[t], yp[inverse[t·k+s]]>` (kept slots; 0 for dropped ones),
/// summed over `H` in f64. Reads the permutation, the combine weights `c (T, k)` and the
/// expert outputs `yp (T·k, H)`.
pub fn combine_vjp(
    p: &Permutation,
    combine: ArrayView2<f64>,
    yp: ArrayView2<f64>,
    dout: ArrayView2<f64>,
) -> (Array2<f64>, Array2<f64>) {
    let mut dyp = Array2::zeros((p.rows(), dout.ncols()));
    for r in 0..p.rows_used() {
        let a = p.order[r];
        let c = combine[(a / p.topk, a % p.topk)];
        dyp.row_mut(r).assign(&dout.row(a / p.topk).mapv(|v| c * v));
    }
    let dc = Array2::from_shape_fn((p.tokens, p.topk), |(t, s)| {
        let a = t * p.topk + s;
        if p.kept[a] {
            dout.row(t).dot(&yp.row(p.inverse[a]))
        } else {
            0.0
        }
    });
    (dyp, dc)
}

/// The shared expert's share of the backward (module documentation of [`super`]): its `dx`
/// contribution, the gradients of `S0, S1, So` and, gated, of `g`. `sf` is its forward over
/// all `T` tokens (the gate not applied).
pub fn shared_backward(
    x: ArrayView2<f64>,
    s: &SharedExpert,
    sf: &FfnForward,
    dout: ArrayView2<f64>,
    spec: FfnSpec,
) -> (Array2<f64>, [Array2<f64>; 3], Option<Array1<f64>>) {
    let [w0, w1, wo] = shared_as_group(s);
    let gate = s.gate.as_ref().map(|g| (g, shared_gate_values(x, g)));
    let dys = match &gate {
        Some((_, gv)) => &dout * &gv.view().insert_axis(Axis(1)),
        None => dout.to_owned(),
    };
    let t = x.nrows();
    let grads = ffn_backward(
        x,
        w0.view(),
        w1.view(),
        wo.view(),
        sf,
        dys.view(),
        &[0, t],
        spec,
    );
    let mut dx = grads.dx;
    let dg = gate.map(|(g, gv)| {
        let dl = Array1::from_shape_fn(t, |ti| {
            dout.row(ti).dot(&sf.y.row(ti)) * gv[ti] * (1.0 - gv[ti])
        });
        dx += &(&dl.view().insert_axis(Axis(1)) * &g.view().insert_axis(Axis(0)));
        x.t().dot(&dl)
    });
    let first = |a: &Array3<f64>| a.index_axis(Axis(0), 0).to_owned();
    let [d0, d1, d_o] = &grads.dw;
    (dx, [first(d0), first(d1), first(d_o)], dg)
}

/// The layer's gradients with respect to `x`, `W_r`, `W0`, `W1`, `Wo` and the shared expert,
/// for `dout = case.dout` (module documentation of [`super`]). Reads `case` and `fwd`.
pub fn backward(case: &MoeCase, fwd: &Forward) -> Backward {
    let p = &fwd.perm;
    let off = p.offsets();
    let dout = case.dout.view();
    let (dyp, dcombine) = combine_vjp(p, fwd.routing.combine.view(), fwd.ffn.y.view(), dout);
    let grads = ffn_backward(
        fwd.xp.view(),
        case.w0.view(),
        case.w1.view(),
        case.wo.view(),
        &fwd.ffn,
        dyp.view(),
        &off,
        case.experts_spec(),
    );
    let mut dx = p.scatter_add(grads.dx.view());
    let dlogits = routing_vjp(&fwd.routing, dcombine.view());
    dx += &dlogits.dot(&case.wr.t());
    let dw_router = case.x.t().dot(&dlogits);
    let drouter_bias = case.router_bias.as_ref().map(|_| dlogits.sum_axis(Axis(0)));
    let (dshared, dshared_gate) = match (&case.shared, &fwd.shared) {
        (Some(s), Some(sf)) => {
            let (dxs, d, dg) = shared_backward(case.x.view(), s, sf, dout, case.shared_spec());
            dx += &dxs;
            (Some(d), dg)
        }
        _ => (None, None),
    };
    let [dw0, dw1, dwo] = grads.dw;
    Backward {
        grads: MoeOutputs {
            out: fwd.out.clone(),
            dx,
            dw_router,
            dw0,
            dw1,
            dwo,
            dshared,
            dshared_gate,
            drouter_bias,
            dexpert_bias: grads.dbias,
        },
        dcombine,
        dlogits,
    }
}
