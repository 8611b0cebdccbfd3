//! The bound of every tensor of a layer: the forward and backward replayed with
//! [`super::replay`]'s rules beside the reference values (the derivation is in
//! [`super`]'s documentation).

use ndarray::{Array2, Array3, ArrayD, Axis, Zip};
use serde::{Deserialize, Serialize};

use super::replay::{ffn_bwd, ffn_fwd, group_sums, lip, mm_exact_rhs, Ev, FN_ULPS, T2};
use crate::format::Format;
use crate::gemm::bound::gamma;
use crate::moe::layer::{shared_as_group, sigmoid, Forward, MoeCase, TensorId};
use crate::routing::ScoreFunction;

/// The precision an MoE-layer implementation declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerPrecision {
    /// The format of every input value.
    pub input: Format,
    /// The format of every intermediate operation of the experts, the combine and the
    /// shared expert (GEMM accumulation included).
    pub compute: Format,
    /// The format of the router's operations: its logits GEMM, scores, gates and weights, and
    /// in the backward their gradients (`dz`, `dw_router`, the router's share of `dx`). Hugging
    /// Face transformers' routers compute in f32 even inside an f64 module. Absent in JSON
    /// written before it existed: the same as `compute`.
    #[serde(default)]
    pub router: Option<Format>,
    /// The format the outputs are written in.
    pub output: Format,
}

impl LayerPrecision {
    /// The router's format: [`LayerPrecision::router`], else `compute`.
    pub fn router(&self) -> Format {
        self.router.unwrap_or(self.compute)
    }
}

/// The bound of every output tensor, and the errors the tie guard needs.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerBound {
    /// Per-element bounds, in [`TensorId::of_case`] order.
    pub tensors: Vec<(TensorId, ArrayD<f64>)>,
    /// `e(u) (T, E)`: the error of the selection scores `u = s + b`.
    pub selection_err: Array2<f64>,
    /// `e(w) (T, k)`: the error of the weights before dropping (what `probs` ranks).
    pub weight_err: Array2<f64>,
    /// An input of a clamped activation within its error of the clamp (the tie guard
    /// refuses such a case), or `None`.
    pub kink: Option<String>,
}

impl LayerBound {
    pub fn get(&self, id: TensorId) -> Option<&ArrayD<f64>> {
        self.tensors.iter().find(|(t, _)| *t == id).map(|(_, a)| a)
    }
}

/// Per-element error bounds of every output of an implementation declaring `precision`, on
/// `case` with the reference forward `fwd` (module documentation).
pub fn layer_bound(case: &MoeCase, fwd: &Forward, precision: &LayerPrecision) -> LayerBound {
    let u = precision.compute.info().unit_roundoff() + Format::F64.info().unit_roundoff();
    // The router's own operations (module docs): `ur` wherever `u` would be, `u` elsewhere.
    let ur = precision.router().info().unit_roundoff() + Format::F64.info().unit_roundoff();
    let u_out = precision.output.info().unit_roundoff();
    let r = &fwd.routing;
    let cfg = &r.config;
    let (t, e) = r.scores.dim();
    let k = cfg.topk;
    // Router logits, and a router bias added to each (one rounding).
    let mut z = mm_exact_rhs(&T2::exact(case.x.clone()), case.wr.view(), ur);
    if let Some(rb) = &case.router_bias {
        Zip::indexed(&mut z.v)
            .and(&mut z.e)
            .for_each(|(_, j), v, e| {
                let r = Ev { v: *v, e: *e }.add(Ev::exact(rb[j]), ur);
                (*v, *e) = (r.v, r.e);
            });
    }
    // Scores and the selection scores.
    let mut s = T2::exact(r.scores.clone());
    match cfg.score {
        ScoreFunction::TopkSoftmax => s.e.assign(&z.e),
        ScoreFunction::Sigmoid => s = z.map(|x| lip(x, sigmoid(x.v), 0.25, ur)),
        ScoreFunction::Softmax => {
            let g = gamma(e + FN_ULPS as usize + 1, ur);
            for ti in 0..t {
                let d = z.e.row(ti).fold(0.0f64, |m, v| m.max(*v));
                let f = (2.0 * d).exp_m1() + g * (2.0 * d).exp();
                for j in 0..e {
                    s.e[(ti, j)] = r.scores[(ti, j)] * f;
                }
            }
        }
    }
    let mut selection_err = s.e.clone();
    if let Some(b) = &case.bias {
        Zip::indexed(&mut selection_err).for_each(|(ti, j), v| {
            *v += ur * (s.v[(ti, j)].abs() + *v + b[j].abs());
        });
    }
    // Gates, weights, combine weights.
    let mut w = T2::exact(Array2::zeros((t, k)));
    let mut c = T2::exact(Array2::zeros((t, k)));
    let alpha = Ev::exact(cfg.scaling_factor);
    let mut gates_ev: Vec<Vec<Ev>> = Vec::with_capacity(t);
    for ti in 0..t {
        let idx = r.indices.row(ti);
        let g: Vec<Ev> = match cfg.score {
            ScoreFunction::TopkSoftmax => {
                let d = (0..k).map(|j| z.e[(ti, idx[j])]).fold(0.0f64, f64::max);
                let f = (2.0 * d).exp_m1() + gamma(k + FN_ULPS as usize + 1, ur) * (2.0 * d).exp();
                (0..k)
                    .map(|j| Ev {
                        v: r.gates[(ti, j)],
                        e: r.gates[(ti, j)] * f,
                    })
                    .collect()
            }
            _ => (0..k).map(|j| s.at(ti, idx[j])).collect(),
        };
        for j in 0..k {
            let wj = if cfg.normalises() {
                let mut d = Ev::exact(cfg.norm_eps);
                let m: f64 = g.iter().map(|x| x.mag()).sum::<f64>() + cfg.norm_eps;
                d.v += g.iter().map(|x| x.v).sum::<f64>();
                d.e += g.iter().map(|x| x.e).sum::<f64>() + gamma(k, ur) * m;
                g[j].div(d, ur).mul(alpha, ur)
            } else {
                g[j].mul(alpha, ur)
            };
            w.v[(ti, j)] = wj.v;
            w.e[(ti, j)] = wj.e;
            if r.kept[(ti, j)] {
                c.v[(ti, j)] = wj.v;
                c.e[(ti, j)] = wj.e;
            }
        }
        gates_ev.push(g);
    }
    // Combine weights made in the router's format enter the experts' operations rounded to
    // theirs once more (exact when the router's format is the narrower).
    let separate_router = precision.router() != precision.compute;
    if separate_router {
        Zip::from(&mut c.e)
            .and(&c.v)
            .for_each(|e, v| *e += u * (v.abs() + *e));
    }
    // Experts.
    let p = &fwd.perm;
    let off = p.offsets();
    let ffn = ffn_fwd(
        T2::exact(fwd.xp.clone()),
        case.w0.view(),
        case.w1.view(),
        case.wo.view(),
        &off,
        case.activation,
        case.expert_bias.as_ref(),
        u,
    );
    let hidden = case.hidden();
    let mut out = T2::exact(Array2::zeros((t, hidden)));
    for ti in 0..t {
        for col in 0..hidden {
            let pairs: Vec<(Ev, Ev)> = (0..k)
                .filter(|&j| r.kept[(ti, j)])
                .map(|j| (c.at(ti, j), ffn.y.at(p.inverse[ti * k + j], col)))
                .collect();
            let o = Ev::dot(&pairs, u);
            out.v[(ti, col)] = o.v;
            out.e[(ti, col)] = o.e;
        }
    }
    let shared_w = case.shared.as_ref().map(shared_as_group);
    let all = [0, t];
    let shared = shared_w.as_ref().map(|[w0, w1, wo]| {
        ffn_fwd(
            T2::exact(case.x.clone()),
            w0.view(),
            w1.view(),
            wo.view(),
            &all,
            case.activation,
            None,
            u,
        )
    });
    // A gated shared expert: `γ = σ(x·g)` per token (a depth-`H` dot of exact inputs).
    let gate = case.shared.as_ref().and_then(|s| s.gate.as_ref()).map(|g| {
        let gcol = g.view().insert_axis(Axis(1));
        mm_exact_rhs(&T2::exact(case.x.clone()), gcol, u).map(|l| lip(l, sigmoid(l.v), 0.25, u))
    });
    if let Some(sf) = &shared {
        let ys = match &gate {
            Some(gv) => row_scale(gv, &sf.y, u),
            None => sf.y.clone(),
        };
        out = out.zip(&ys, |a, b| a.add(b, u));
    }
    // Backward.
    let dout = T2::exact(case.dout.clone());
    let mut dyp = T2::exact(Array2::zeros((p.rows(), hidden)));
    for rr in 0..p.rows_used() {
        let a = p.order[rr];
        let (ti, j) = (a / k, a % k);
        for col in 0..hidden {
            let v = c.at(ti, j).mul(dout.at(ti, col), u);
            dyp.v[(rr, col)] = v.v;
            dyp.e[(rr, col)] = v.e;
        }
    }
    let mut dc = T2::exact(Array2::zeros((t, k)));
    for ti in 0..t {
        for j in 0..k {
            if r.kept[(ti, j)] {
                let rr = p.inverse[ti * k + j];
                let pairs: Vec<(Ev, Ev)> = (0..hidden)
                    .map(|col| (dout.at(ti, col), ffn.y.at(rr, col)))
                    .collect();
                let v = Ev::dot(&pairs, u);
                dc.v[(ti, j)] = v.v;
                dc.e[(ti, j)] = v.e;
            }
        }
    }
    let (dxp, dw0, dw1, dwo, dbias) = ffn_bwd(
        &ffn,
        &dyp,
        case.w0.view(),
        case.w1.view(),
        case.wo.view(),
        &off,
        case.expert_bias.is_some(),
        u,
    );
    let mut dx = T2::exact(Array2::zeros((t, hidden)));
    for ti in 0..t {
        for col in 0..hidden {
            let mut acc = Ev::exact(0.0);
            let mut m = 0.0;
            for j in 0..k {
                let x = dxp.at(p.inverse[ti * k + j], col);
                acc.v += x.v;
                acc.e += x.e;
                m += x.mag();
            }
            acc.e += gamma(k, u) * m;
            dx.v[(ti, col)] = acc.v;
            dx.e[(ti, col)] = acc.e;
        }
    }
    // Routing VJP.
    let mut dz = T2::exact(Array2::zeros((t, e)));
    for (ti, g) in gates_ev.iter().enumerate() {
        let idx = r.indices.row(ti);
        // `<dout, y>` is computed with the experts (`u`) and enters a router of another
        // format rounded once more there.
        let entry = if separate_router { ur } else { 0.0 };
        let dw: Vec<Ev> = (0..k)
            .map(|j| {
                let x = dc.at(ti, j);
                Ev {
                    v: x.v,
                    e: x.e + entry * x.mag(),
                }
            })
            .collect();
        let dg: Vec<Ev> = if cfg.normalises() {
            let m: f64 = g.iter().map(|x| x.mag()).sum::<f64>() + cfg.norm_eps;
            let d = Ev {
                v: g.iter().map(|x| x.v).sum::<f64>() + cfg.norm_eps,
                e: g.iter().map(|x| x.e).sum::<f64>() + gamma(k, ur) * m,
            };
            let pairs: Vec<(Ev, Ev)> = (0..k).map(|i| (dw[i], g[i])).collect();
            let dot = Ev::dot(&pairs, ur).div(d, ur);
            dw.iter()
                .map(|x| alpha.mul(x.sub(dot, ur), ur).div(d, ur))
                .collect()
        } else {
            dw.iter().map(|x| alpha.mul(*x, ur)).collect()
        };
        match cfg.score {
            ScoreFunction::Softmax => {
                let mut ds = vec![Ev::exact(0.0); e];
                for j in 0..k {
                    ds[idx[j]] = ds[idx[j]].add(dg[j], ur);
                }
                let pairs: Vec<(Ev, Ev)> = (0..e).map(|f| (s.at(ti, f), ds[f])).collect();
                let dot = Ev::dot(&pairs, ur);
                for (f, dsf) in ds.iter().enumerate() {
                    let v = s.at(ti, f).mul(dsf.sub(dot, ur), ur);
                    dz.v[(ti, f)] = v.v;
                    dz.e[(ti, f)] = v.e;
                }
            }
            ScoreFunction::Sigmoid => {
                for j in 0..k {
                    let sv = s.at(ti, idx[j]);
                    let v = dg[j].mul(sv, ur).mul(Ev::exact(1.0).sub(sv, ur), ur);
                    dz.v[(ti, idx[j])] = v.v;
                    dz.e[(ti, idx[j])] = v.e;
                }
            }
            ScoreFunction::TopkSoftmax => {
                let pairs: Vec<(Ev, Ev)> = (0..k).map(|i| (g[i], dg[i])).collect();
                let dot = Ev::dot(&pairs, ur);
                for j in 0..k {
                    let v = g[j].mul(dg[j].sub(dot, ur), ur);
                    dz.v[(ti, idx[j])] = v.v;
                    dz.e[(ti, idx[j])] = v.e;
                }
            }
        }
    }
    let dx_router = mm_exact_rhs(&dz, case.wr.t(), ur);
    // The router's share of `dx`, made in its format, enters the experts' `dx` rounded once
    // more to theirs (exact when the router's is the narrower).
    let entry_dx = if separate_router { u } else { 0.0 };
    dx = dx.zip(&dx_router, |a, b| {
        let b = Ev {
            v: b.v,
            e: b.e + entry_dx * b.mag(),
        };
        a.add(b, u)
    });
    let gt = gamma(t, ur);
    let ax = case.x.mapv(f64::abs);
    let dwr_e = ax.t().dot(&dz.e) * (1.0 + gt) + ax.t().dot(&dz.v.mapv(f64::abs)) * gt;
    let dwr_v = case.x.t().dot(&dz.v);
    // A router bias's gradient: the column sums of `dz` (depth `T`).
    let drouter_bias = case
        .router_bias
        .as_ref()
        .map(|_| group_sums(&dz, &[0, t], ur));
    let mut dshared = None;
    let mut dgate = None;
    if let (Some(sf), Some([w0, w1, wo])) = (&shared, &shared_w) {
        let dys = match &gate {
            Some(gv) => row_scale(gv, &dout, u),
            None => dout.clone(),
        };
        let (dxs, d0, d1, d_o, _) =
            ffn_bwd(sf, &dys, w0.view(), w1.view(), wo.view(), &all, false, u);
        dx = dx.zip(&dxs, |a, b| a.add(b, u));
        if let (Some(gv), Some(g)) = (&gate, case.shared.as_ref().and_then(|s| s.gate.as_ref())) {
            // `dℓ[t] = <dout[t], ys[t]>·γ(1 − γ)`, `dx += dℓ·gᵀ`, `dg = xᵀ·dℓ` (depth `T`).
            let dl: Vec<Ev> = (0..t)
                .map(|ti| {
                    let pairs: Vec<(Ev, Ev)> = (0..hidden)
                        .map(|col| (dout.at(ti, col), sf.y.at(ti, col)))
                        .collect();
                    let gt = gv.at(ti, 0);
                    Ev::dot(&pairs, u)
                        .mul(gt, u)
                        .mul(Ev::exact(1.0).sub(gt, u), u)
                })
                .collect();
            let mut dxg = T2::exact(Array2::zeros((t, hidden)));
            Zip::indexed(&mut dxg.v)
                .and(&mut dxg.e)
                .for_each(|(ti, col), v, e| {
                    let p = dl[ti].mul(Ev::exact(g[col]), u);
                    *v = p.v;
                    *e = p.e;
                });
            dx = dx.zip(&dxg, |a, b| a.add(b, u));
            let dg: Vec<Ev> = (0..hidden)
                .map(|col| {
                    let pairs: Vec<(Ev, Ev)> = (0..t)
                        .map(|ti| (Ev::exact(case.x[(ti, col)]), dl[ti]))
                        .collect();
                    Ev::dot(&pairs, u)
                })
                .collect();
            dgate = Some(dg);
        }
        dshared = Some([d0, d1, d_o]);
    }
    let out3 =
        |(v, e): (Array3<f64>, Array3<f64>)| (&e + &((v.mapv(f64::abs) + &e) * u_out)).into_dyn();
    let mut tensors = vec![
        (TensorId::Out, out.output(u_out).into_dyn()),
        (TensorId::Dx, dx.output(u_out).into_dyn()),
        (
            TensorId::DwRouter,
            T2 { v: dwr_v, e: dwr_e }.output(u_out).into_dyn(),
        ),
        (TensorId::Dw0, out3(dw0)),
        (TensorId::Dw1, out3(dw1)),
        (TensorId::Dwo, out3(dwo)),
    ];
    if let Some([d0, d1, d_o]) = dshared {
        let first = |(v, e): (Array3<f64>, Array3<f64>)| out3((v, e)).index_axis_move(Axis(0), 0);
        tensors.push((TensorId::DsharedW0, first(d0)));
        tensors.push((TensorId::DsharedW1, first(d1)));
        tensors.push((TensorId::DsharedWo, first(d_o)));
    }
    if let Some(dg) = dgate {
        let b: Vec<f64> = dg.iter().map(|x| x.e + u_out * x.mag()).collect();
        tensors.push((TensorId::DsharedGate, ndarray::Array1::from(b).into_dyn()));
    }
    let row0 = |(v, e): (Array2<f64>, Array2<f64>)| {
        (&e + &((v.mapv(f64::abs) + &e) * u_out))
            .index_axis_move(Axis(0), 0)
            .into_dyn()
    };
    if let Some(rb) = drouter_bias {
        tensors.push((TensorId::DrouterBias, row0(rb)));
    }
    if let Some([b0, b1, bo]) = dbias {
        let out2 = |(v, e): (Array2<f64>, Array2<f64>)| {
            (&e + &((v.mapv(f64::abs) + &e) * u_out)).into_dyn()
        };
        tensors.push((TensorId::DexpertB0, out2(b0)));
        tensors.push((TensorId::DexpertB1, out2(b1)));
        tensors.push((TensorId::DexpertBo, out2(bo)));
    }
    LayerBound {
        tensors,
        selection_err,
        weight_err: w.e,
        kink: ffn.kink.map(|k| format!("the experts' FFN: {k}")).or(shared
            .and_then(|sf| sf.kink)
            .map(|k| format!("the shared expert: {k}"))),
    }
}

/// `γ[t]·m[t, col]` for a per-token `γ (T, 1)`, one product each.
fn row_scale(gamma_t: &T2, m: &T2, u: f64) -> T2 {
    let mut r = T2::exact(Array2::zeros(m.v.dim()));
    Zip::indexed(&mut r.v)
        .and(&mut r.e)
        .for_each(|(ti, col), v, e| {
            let p = gamma_t.at(ti, 0).mul(m.at(ti, col), u);
            *v = p.v;
            *e = p.e;
        });
    r
}
