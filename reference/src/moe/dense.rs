//! The dense formulation of the layer: every expert on every token, the routing's combine
//! weights scattered into a `(T, E)` matrix that is 0 wherever a token did not select (or
//! lost to capacity) an expert, differentiated by hand the same way.
//!
//! `C[t, e] = c[t, s]` if `indices[t, s] = e` (kept), else 0;
//! `out = Σ_e C[:, e] ⊙ FFN_e(x) + shared(x)` (the shared expert, gated or not, and its
//! backward are the sparse path's);
//! backward: `dy_e = C[:, e] ⊙ dout`, `dC[t, e] = <dout[t], FFN_e(x)[t]>`, then each expert's
//! FFN backward on all `T` tokens, `dc[t, s] = dC[t, indices[t, s]]` for kept slots, and the
//! same [`super::routing_vjp`] and router step as the sparse path.
//!
//! No permutation, no grouped GEMM, no tail: it shares only the routing (and its VJP) with the
//! sparse path, so sparse == dense checks permute, unpermute, group sizes, the tail and the
//! combine. Its cost is `E/k` times the sparse layer's: small cases only.

use ndarray::{s, Array2, Array3, Axis};

use super::backward::{ffn_backward, routing_vjp, shared_backward};
use super::layer::{
    ffn_forward, shared_as_group, shared_gate_values, ExpertBias, FfnSpec, MoeCase, MoeOutputs,
};
use crate::routing::route;
use crate::Error;

/// The layer output and all gradients through the dense formulation. Validates `case`.
pub fn dense_layer(case: &MoeCase) -> Result<MoeOutputs, Error> {
    case.validate()?;
    let (t, h) = case.x.dim();
    let (e, f) = (case.experts(), case.ffn());
    let routing = route(&case.routing_case(case.logits()))?;
    let k = case.topk();
    let mut cd = Array2::<f64>::zeros((t, e));
    for ti in 0..t {
        for j in 0..k {
            if routing.kept[(ti, j)] {
                cd[(ti, routing.indices[(ti, j)])] = routing.combine[(ti, j)];
            }
        }
    }
    let mut out = Array2::<f64>::zeros((t, h));
    let mut dx = Array2::<f64>::zeros((t, h));
    let mut dcd = Array2::<f64>::zeros((t, e));
    let mut dw0 = Array3::<f64>::zeros((e, h, f));
    let mut dw1 = Array3::<f64>::zeros((e, h, f));
    let mut dwo = Array3::<f64>::zeros((e, f, h));
    let mut dbias = case.expert_bias.as_ref().map(|_| {
        [
            Array2::zeros((e, f)),
            Array2::zeros((e, f)),
            Array2::zeros((e, h)),
        ]
    });
    let all = [0, t];
    for ex in 0..e {
        let w0 = case.w0.slice(s![ex..ex + 1, .., ..]);
        let w1 = case.w1.slice(s![ex..ex + 1, .., ..]);
        let wo = case.wo.slice(s![ex..ex + 1, .., ..]);
        // Expert `ex` alone, with its own row of each bias.
        let own = case.expert_bias.as_ref().map(|b| ExpertBias {
            b0: b.b0.slice(s![ex..ex + 1, ..]).to_owned(),
            b1: b.b1.slice(s![ex..ex + 1, ..]).to_owned(),
            bo: b.bo.slice(s![ex..ex + 1, ..]).to_owned(),
        });
        let spec = FfnSpec {
            act: case.activation,
            bias: own.as_ref(),
        };
        let ffn = ffn_forward(case.x.view(), w0, w1, wo, &all, spec);
        let ce = cd.column(ex).insert_axis(Axis(1)).to_owned();
        out += &(&ffn.y * &ce);
        for ti in 0..t {
            dcd[(ti, ex)] = case.dout.row(ti).dot(&ffn.y.row(ti));
        }
        let dy = &case.dout * &ce;
        let g = ffn_backward(case.x.view(), w0, w1, wo, &ffn, dy.view(), &all, spec);
        let [d0, d1, d_o] = &g.dw;
        dx += &g.dx;
        if let (Some(acc), Some(d)) = (dbias.as_mut(), &g.dbias) {
            for (a, b) in acc.iter_mut().zip(d) {
                a.row_mut(ex).assign(&b.row(0));
            }
        }
        dw0.index_axis_mut(Axis(0), ex)
            .assign(&d0.index_axis(Axis(0), 0));
        dw1.index_axis_mut(Axis(0), ex)
            .assign(&d1.index_axis(Axis(0), 0));
        dwo.index_axis_mut(Axis(0), ex)
            .assign(&d_o.index_axis(Axis(0), 0));
    }
    let dc = Array2::from_shape_fn((t, k), |(ti, j)| {
        if routing.kept[(ti, j)] {
            dcd[(ti, routing.indices[(ti, j)])]
        } else {
            0.0
        }
    });
    let dz = routing_vjp(&routing, dc.view());
    dx += &dz.dot(&case.wr.t());
    let dw_router = case.x.t().dot(&dz);
    let drouter_bias = case.router_bias.as_ref().map(|_| dz.sum_axis(Axis(0)));
    let mut dshared_gate = None;
    let dshared = case.shared.as_ref().map(|sh| {
        let [w0, w1, wo] = shared_as_group(sh);
        let spec = case.shared_spec();
        let ffn = ffn_forward(case.x.view(), w0.view(), w1.view(), wo.view(), &all, spec);
        match &sh.gate {
            Some(g) => {
                let gv = shared_gate_values(case.x.view(), g);
                out += &(&ffn.y * &gv.insert_axis(Axis(1)));
            }
            None => out += &ffn.y,
        }
        let (dxs, d, dg) = shared_backward(case.x.view(), sh, &ffn, case.dout.view(), spec);
        dx += &dxs;
        dshared_gate = dg;
        d
    });
    Ok(MoeOutputs {
        out,
        dx,
        dw_router,
        dw0,
        dw1,
        dwo,
        dshared,
        dshared_gate,
        drouter_bias,
        dexpert_bias: dbias,
    })
}
