//! The layer bound against a second, plain derivation: every rule of the module documentation
//! of [`super`] written out again element by element (scalar loops over `(value, error)`
//! pairs, no [`super::replay`] helper, `γ_n = n·u / (1 - n·u)` and the constants `2^-53`,
//! `FN_ULPS = 4`, the Lipschitz constants `1/4`, `1.1`, `1/2` as literals), on small cases
//! of every score function, with and without normalisation, bias, capacity dropping and a
//! shared expert (gated or not), gpt-oss's clamped activation, expert and router biases, for an f64 and a bf16 declaration. Every tensor, the selection error and
//! the weight error must agree to 1e-10 relative, so a change to any term of
//! [`super::layer_bound`] (or an index that reads the wrong element) fails here.
//!
//! One mutant survives, and no test can catch it on realistic cases: the normalisation's
//! `m = Σ(|g| + e(g)) + ε` with `ε = 1e-20` made `- ε` (layer.rs, the weights). `m` is a sum of
//! gate magnitudes, far above `ε·2^52`, so `m + ε`, `m - ε` and `m` are the same f64; only gates
//! of about 1e-20 in total could tell them apart.

use ndarray::{Array2, Array3};

use super::derive::*;
use super::*;
use crate::format::Format;
use crate::moe::layer::{forward, TensorId};
use crate::moe::tests::{case, configs, gate_shared, gpt_oss};
use crate::routing::ScoreFunction;

/// `(tensors, selection error, weight error)`.
type Derived = (Vec<(TensorId, Vec<f64>)>, Array2<f64>, Array2<f64>);

/// The documented bound, derived again.
fn derive(case: &crate::moe::MoeCase, precision: &LayerPrecision) -> Derived {
    let fwd = forward(case).unwrap();
    let u = precision.compute.info().unit_roundoff() + 2f64.powi(-53);
    let ur = precision.router().info().unit_roundoff() + 2f64.powi(-53);
    let separate = precision.router() != precision.compute;
    let u_out = precision.output.info().unit_roundoff();
    let r = &fwd.routing;
    let cfg = &r.config;
    let (t, e) = r.scores.dim();
    let (k, hd) = (cfg.topk, case.hidden());
    let alpha = ex(cfg.scaling_factor);
    let eps = cfg.norm_eps;
    // z = x·W_r (+ b_r), x, W_r and b_r exact: depth H, then one addition.
    let z = Array2::from_shape_fn((t, e), |(ti, j)| {
        let p: Vec<(P, P)> = (0..hd)
            .map(|i| (ex(case.x[(ti, i)]), ex(case.wr[(i, j)])))
            .collect();
        match &case.router_bias {
            Some(rb) => add(dot(&p, ur), ex(rb[j]), ur),
            None => dot(&p, ur),
        }
    });
    // Scores.
    let s = Array2::from_shape_fn((t, e), |(ti, j)| match cfg.score {
        ScoreFunction::TopkSoftmax => (r.scores[(ti, j)], z[(ti, j)].1),
        ScoreFunction::Sigmoid => {
            let zz = z[(ti, j)];
            lipf(zz, 1.0 / (1.0 + (-zz.0).exp()), 0.25, ur)
        }
        ScoreFunction::Softmax => {
            let d = (0..e).map(|f| z[(ti, f)].1).fold(0.0, f64::max);
            let f = (2.0 * d).exp_m1() + gm(e + 4 + 1, ur) * (2.0 * d).exp();
            (r.scores[(ti, j)], r.scores[(ti, j)] * f)
        }
    });
    let selection = Array2::from_shape_fn((t, e), |(ti, j)| match &case.bias {
        Some(b) => s[(ti, j)].1 + ur * (s[(ti, j)].0.abs() + s[(ti, j)].1 + b[j].abs()),
        None => s[(ti, j)].1,
    });
    // Gates, the normalisation's denominator, weights, combine weights.
    let mut gates = Vec::new();
    let mut denom = Vec::new();
    let mut w = Array2::from_elem((t, k), EXACT0);
    let mut c = w.clone();
    for ti in 0..t {
        let idx = r.indices.row(ti);
        let g: Vec<P> = match cfg.score {
            ScoreFunction::TopkSoftmax => {
                let d = (0..k).map(|j| z[(ti, idx[j])].1).fold(0.0, f64::max);
                let f = (2.0 * d).exp_m1() + gm(k + 4 + 1, ur) * (2.0 * d).exp();
                (0..k)
                    .map(|j| (r.gates[(ti, j)], r.gates[(ti, j)] * f))
                    .collect()
            }
            _ => (0..k).map(|j| s[(ti, idx[j])]).collect(),
        };
        let dd: P = (
            g.iter().map(|x| x.0).sum::<f64>() + eps,
            g.iter().map(|x| x.1).sum::<f64>()
                + gm(k, ur) * (g.iter().map(|x| mag(*x)).sum::<f64>() + eps),
        );
        for j in 0..k {
            w[(ti, j)] = if cfg.normalises() {
                mul(div(g[j], dd, ur), alpha, ur)
            } else {
                mul(g[j], alpha, ur)
            };
            if r.kept[(ti, j)] {
                c[(ti, j)] = w[(ti, j)];
            }
        }
        gates.push(g);
        denom.push(dd);
    }
    // Weights made in another format than the experts' enter them rounded once more.
    if separate {
        c.mapv_inplace(|x| (x.0, x.1 + u * (x.0.abs() + x.1)));
    }
    // Experts and the combine.
    let p = &fwd.perm;
    let off = p.offsets();
    let xp = fwd.xp.mapv(ex);
    let eb = case.expert_bias.as_ref();
    let act = case.activation;
    let fw = ffn_fwd(
        &xp,
        case.w0.view(),
        case.w1.view(),
        case.wo.view(),
        &off,
        act,
        eb,
        u,
    );
    let mut out = Array2::from_shape_fn((t, hd), |(ti, col)| {
        let pairs: Vec<(P, P)> = (0..k)
            .filter(|&j| r.kept[(ti, j)])
            .map(|j| (c[(ti, j)], fw.y[(p.inverse[ti * k + j], col)]))
            .collect();
        dot(&pairs, u)
    });
    let sh = case.shared.as_ref().map(|sw| {
        let w3 = |a: &Array2<f64>| a.clone().insert_axis(ndarray::Axis(0));
        let (w0, w1, wo) = (w3(&sw.w0), w3(&sw.w1), w3(&sw.wo));
        let x = case.x.mapv(ex);
        let f = ffn_fwd(&x, w0.view(), w1.view(), wo.view(), &[0, t], act, None, u);
        (x, w0, w1, wo, f)
    });
    // The gate `γ[t] = σ(x[t]·g)`, a depth-H dot and a 1/4-Lipschitz evaluation.
    let gate: Option<(Vec<P>, &ndarray::Array1<f64>)> =
        case.shared.as_ref().and_then(|s| s.gate.as_ref()).map(|g| {
            let gv = (0..t)
                .map(|ti| {
                    let pairs: Vec<(P, P)> =
                        (0..hd).map(|i| (ex(case.x[(ti, i)]), ex(g[i]))).collect();
                    let l = dot(&pairs, u);
                    lipf(l, 1.0 / (1.0 + (-l.0).exp()), 0.25, u)
                })
                .collect();
            (gv, g)
        });
    if let Some((.., f)) = &sh {
        out = Array2::from_shape_fn((t, hd), |(ti, c)| {
            let y = match &gate {
                Some((gv, _)) => mul(gv[ti], f.y[(ti, c)], u),
                None => f.y[(ti, c)],
            };
            add(out[(ti, c)], y, u)
        });
    }
    // Backward: the permuted output gradient, the combine weights' gradient.
    let dout = case.dout.mapv(ex);
    let mut dyp = Array2::from_elem((p.rows(), hd), EXACT0);
    for rr in 0..p.rows_used() {
        let a = p.order[rr];
        for col in 0..hd {
            dyp[(rr, col)] = mul(c[(a / k, a % k)], dout[(a / k, col)], u);
        }
    }
    let dc = Array2::from_shape_fn((t, k), |(ti, j)| {
        if !r.kept[(ti, j)] {
            return EXACT0;
        }
        let rr = p.inverse[ti * k + j];
        let pairs: Vec<(P, P)> = (0..hd)
            .map(|col| (dout[(ti, col)], fw.y[(rr, col)]))
            .collect();
        dot(&pairs, u)
    });
    let (dxp, dw0, dw1, dwo, dbias) = ffn_bwd(
        &fw,
        &xp,
        &dyp,
        case.w0.view(),
        case.w1.view(),
        case.wo.view(),
        &off,
        eb.is_some(),
        u,
    );
    let mut dx = Array2::from_shape_fn((t, hd), |(ti, col)| {
        let parts: Vec<P> = (0..k).map(|j| dxp[(p.inverse[ti * k + j], col)]).collect();
        let v = parts.iter().map(|x| x.0).sum::<f64>();
        let e0 = parts.iter().map(|x| x.1).sum::<f64>();
        let m = parts.iter().map(|x| mag(*x)).sum::<f64>();
        (v, e0 + gm(k, u) * m)
    });
    // The routing VJP.
    let mut dz = Array2::from_elem((t, e), EXACT0);
    for ti in 0..t {
        let (g, dd, idx) = (&gates[ti], denom[ti], r.indices.row(ti));
        // `<dout, y>` enters a router of another format rounded once more.
        let entry = if separate { ur } else { 0.0 };
        let dcr: Vec<P> = (0..k)
            .map(|j| (dc[(ti, j)].0, dc[(ti, j)].1 + entry * mag(dc[(ti, j)])))
            .collect();
        let dg: Vec<P> = if cfg.normalises() {
            let pairs: Vec<(P, P)> = (0..k).map(|i| (dcr[i], g[i])).collect();
            let d = div(dot(&pairs, ur), dd, ur);
            (0..k)
                .map(|j| div(mul(alpha, sub(dcr[j], d, ur), ur), dd, ur))
                .collect()
        } else {
            (0..k).map(|j| mul(alpha, dcr[j], ur)).collect()
        };
        match cfg.score {
            ScoreFunction::Softmax => {
                let mut ds = vec![EXACT0; e];
                for j in 0..k {
                    ds[idx[j]] = add(ds[idx[j]], dg[j], ur);
                }
                let pairs: Vec<(P, P)> = (0..e).map(|f| (s[(ti, f)], ds[f])).collect();
                let d = dot(&pairs, ur);
                for f in 0..e {
                    dz[(ti, f)] = mul(s[(ti, f)], sub(ds[f], d, ur), ur);
                }
            }
            ScoreFunction::Sigmoid => {
                for j in 0..k {
                    let sv = s[(ti, idx[j])];
                    dz[(ti, idx[j])] = mul(mul(dg[j], sv, ur), sub(ex(1.0), sv, ur), ur);
                }
            }
            ScoreFunction::TopkSoftmax => {
                let pairs: Vec<(P, P)> = (0..k).map(|i| (g[i], dg[i])).collect();
                let d = dot(&pairs, ur);
                for j in 0..k {
                    dz[(ti, idx[j])] = mul(g[j], sub(dg[j], d, ur), ur);
                }
            }
        }
    }
    // dx += dz·W_rᵀ (depth E); dW_r = xᵀ·dz (depth T).
    for ti in 0..t {
        for col in 0..hd {
            let pairs: Vec<(P, P)> = (0..e)
                .map(|j| (dz[(ti, j)], ex(case.wr[(col, j)])))
                .collect();
            let share = dot(&pairs, ur);
            // Rounded once more into the experts' format when the router's differs.
            let share = if separate {
                (share.0, share.1 + u * mag(share))
            } else {
                share
            };
            dx[(ti, col)] = add(dx[(ti, col)], share, u);
        }
    }
    let dwr = Array2::from_shape_fn((hd, e), |(i, j)| {
        let pairs: Vec<(P, P)> = (0..t)
            .map(|ti| (ex(case.x[(ti, i)]), dz[(ti, j)]))
            .collect();
        dot(&pairs, ur)
    });
    let round = |a: &P| a.1 + u_out * (a.0.abs() + a.1);
    let flat2 = |a: &Array2<P>| a.iter().map(round).collect::<Vec<f64>>();
    let flat3 = |a: &Array3<P>| a.iter().map(round).collect::<Vec<f64>>();
    let mut shared_grads = None;
    let mut gate_grad = None;
    if let Some((x, w0, w1, wo, f)) = &sh {
        let dys = match &gate {
            Some((gv, _)) => {
                Array2::from_shape_fn((t, hd), |(ti, c)| mul(gv[ti], dout[(ti, c)], u))
            }
            None => dout.clone(),
        };
        let (dxs, d0, d1, d_o, _) = ffn_bwd(
            f,
            x,
            &dys,
            w0.view(),
            w1.view(),
            wo.view(),
            &[0, t],
            false,
            u,
        );
        dx = Array2::from_shape_fn((t, hd), |i| add(dx[i], dxs[i], u));
        if let Some((gv, g)) = &gate {
            // dℓ[t] = <dout[t], ys[t]>·γ·(1 − γ); dx += dℓ·gᵀ; dg = xᵀ·dℓ (depth T).
            let dl: Vec<P> = (0..t)
                .map(|ti| {
                    let pairs: Vec<(P, P)> =
                        (0..hd).map(|c| (dout[(ti, c)], f.y[(ti, c)])).collect();
                    mul(mul(dot(&pairs, u), gv[ti], u), sub(ex(1.0), gv[ti], u), u)
                })
                .collect();
            dx = Array2::from_shape_fn((t, hd), |(ti, c)| {
                add(dx[(ti, c)], mul(dl[ti], ex(g[c]), u), u)
            });
            gate_grad = Some(
                (0..hd)
                    .map(|c| {
                        let pairs: Vec<(P, P)> =
                            (0..t).map(|ti| (ex(case.x[(ti, c)]), dl[ti])).collect();
                        round(&dot(&pairs, u))
                    })
                    .collect::<Vec<f64>>(),
            );
        }
        shared_grads = Some([flat3(&d0), flat3(&d1), flat3(&d_o)]);
    }
    let mut tensors = vec![
        (TensorId::Out, flat2(&out)),
        (TensorId::Dx, flat2(&dx)),
        (TensorId::DwRouter, flat2(&dwr)),
        (TensorId::Dw0, flat3(&dw0)),
        (TensorId::Dw1, flat3(&dw1)),
        (TensorId::Dwo, flat3(&dwo)),
    ];
    if let Some([d0, d1, d_o]) = shared_grads {
        tensors.push((TensorId::DsharedW0, d0));
        tensors.push((TensorId::DsharedW1, d1));
        tensors.push((TensorId::DsharedWo, d_o));
    }
    if let Some(dg) = gate_grad {
        tensors.push((TensorId::DsharedGate, dg));
    }
    if case.router_bias.is_some() {
        // Σ_t dz[t, j]: a sum of T terms in the router's format.
        let db: Vec<f64> = (0..e)
            .map(|j| {
                let v: f64 = (0..t).map(|ti| dz[(ti, j)].0).sum();
                let er: f64 = (0..t).map(|ti| dz[(ti, j)].1).sum();
                let m: f64 = (0..t).map(|ti| mag(dz[(ti, j)])).sum();
                round(&(v, er + gm(t, ur) * m))
            })
            .collect();
        tensors.push((TensorId::DrouterBias, db));
    }
    if let Some([b0, b1, bo]) = dbias {
        tensors.push((TensorId::DexpertB0, flat2(&b0)));
        tensors.push((TensorId::DexpertB1, flat2(&b1)));
        tensors.push((TensorId::DexpertBo, flat2(&bo)));
    }
    (tensors, selection, w.mapv(|x| x.1))
}

fn agree(what: &str, got: impl IntoIterator<Item = f64>, want: &[f64]) {
    let got: Vec<f64> = got.into_iter().collect();
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-10 * w.abs() || (g == w),
            "{what} [{i}]: layer_bound {g:e}, derived {w:e}"
        );
    }
}

#[test]
fn layer_bound_matches_the_documented_derivation() {
    let precisions = [
        LayerPrecision {
            input: Format::F64,
            compute: Format::F64,
            router: None,
            output: Format::F64,
        },
        LayerPrecision {
            input: Format::Bf16,
            compute: Format::Bf16,
            router: None,
            output: Format::F32,
        },
        // An f64 layer with an f32 router (Hugging Face), and an f32 router in a bf16 layer.
        LayerPrecision {
            input: Format::Bf16,
            compute: Format::F64,
            router: Some(Format::F32),
            output: Format::F64,
        },
        LayerPrecision {
            input: Format::Bf16,
            compute: Format::Bf16,
            router: Some(Format::F32),
            output: Format::F32,
        },
    ];
    for (i, cfg) in configs().into_iter().enumerate() {
        let mut c = case(900 + i as u64, 8, 3, 6, 2, cfg, i % 2 == 0);
        if i % 4 == 0 {
            gate_shared(&mut c, 900 + i as u64);
        }
        if i % 3 == 1 {
            gpt_oss(&mut c, 900 + i as u64, 8.0);
        }
        let fwd = forward(&c).unwrap();
        for p in &precisions {
            let what = format!("{cfg:?} {p:?}");
            let b = layer_bound(&c, &fwd, p);
            let (tensors, selection, weight) = derive(&c, p);
            assert_eq!(
                b.tensors.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
                tensors.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
                "{what}"
            );
            for ((id, got), (_, want)) in b.tensors.iter().zip(&tensors) {
                agree(&format!("{what} {id}"), got.iter().copied(), want);
                assert_eq!(b.get(*id), Some(got));
            }
            agree(
                &format!("{what} selection"),
                b.selection_err.iter().copied(),
                &selection.into_raw_vec_and_offset().0,
            );
            agree(
                &format!("{what} weight"),
                b.weight_err.iter().copied(),
                &weight.into_raw_vec_and_offset().0,
            );
        }
    }
}
