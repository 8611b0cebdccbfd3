//! `emulate` for op `moe_layer`: a CPU **model** of a fused MoE-layer kernel, with planted bugs.
//!
//! The model runs the same decomposition as the reference (`moecheck_reference::moe`) but
//! rounds every intermediate to f32 as a kernel that keeps f32 intermediates does (router
//! logits, combine weights, `a`, `b`, `silu(a)`, `h`, `y`, the combine, and every backward
//! intermediate), so it also exercises the layer bound. It declares `compute = f32`,
//! `output = f32`. It is never a GPU result.
//!
//! [`MoeBug`] plants one realistic defect of a hand-written MoE backward; `moecheck selftest`
//! checks that the layer properties catch each of them.

use ndarray::{Array1, Array2, Array3, ArrayView2, Axis};

use moecheck_reference::format::{round_to, Format, Overflow};
use moecheck_reference::gemm::{grouped_dgrad, grouped_fwd, grouped_wgrad};
use moecheck_reference::moe::backward::routing_vjp;
use moecheck_reference::moe::ffn::{
    add_group_bias, group_bias_grad, Activation, FfnSpec, CLAMP_ALPHA, CLAMP_LIMIT,
};
use moecheck_reference::moe::layer::{shared_as_group, sigmoid, silu, silu_grad, FfnForward};
use moecheck_reference::moe::{
    LayerPrecision, MoeCase, MoeLayer, MoeOutputs, Permutation, RoundTrip,
};
use moecheck_reference::op::{Implementation, RunError};
use moecheck_reference::routing::{route, Routing};

use crate::impls::{model_name, PlantedBug};

/// A defect that can be planted in [`MoeEmulate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MoeBug {
    /// The backward of the sort decomposes assignment `a` slot-major, `(a mod T, a div T)`,
    /// while the forward is token-major `(a div k, a mod k)`: the same for `k = 1`, not the
    /// inverse permutation for `k > 1` (MaxText's custom-VJP sort bug).
    SortBackwardNotInverse,
    /// The backward recomputes the routing without capacity: dropped assignments get their
    /// pre-drop weight and send gradient into the experts and `dx`.
    DroppedLeakGradient,
    /// The weight gradients of empty experts are never written: they keep the previous
    /// expert's values (a stale workspace).
    EmptyExpertStaleWgrad,
    /// The combine-weight gradient `<dout, y>` is not computed (treated as zero): the router
    /// gets no gradient from the main loss (MaxText `ring_ragged_unsort`, PR 5042).
    CombineGradMissing,
    /// A gated shared expert's backward takes its weight gradients and `dx` from the ungated
    /// `dout` (the gate applied in the forward only).
    SharedGateUngatedBackward,
    /// gpt-oss's clamped activation differentiated as if nothing were clamped: gradient flows
    /// through `a ≥ 7` and `|b| ≥ 7`.
    ClampGradIgnored,
    /// The router-logit bias gets no gradient (treated as a buffer, as DeepSeek-V3's
    /// selection bias is).
    RouterBiasGradMissing,
    /// The down projection's bias gradient sums `dout` without the combine weight (as if the
    /// bias were added after the combine).
    DownBiasUnweighted,
}

impl PlantedBug for MoeBug {
    const ALL: &'static [MoeBug] = &[
        MoeBug::SortBackwardNotInverse,
        MoeBug::DroppedLeakGradient,
        MoeBug::EmptyExpertStaleWgrad,
        MoeBug::CombineGradMissing,
        MoeBug::SharedGateUngatedBackward,
        MoeBug::ClampGradIgnored,
        MoeBug::RouterBiasGradMissing,
        MoeBug::DownBiasUnweighted,
    ];

    fn name(self) -> &'static str {
        match self {
            MoeBug::SortBackwardNotInverse => "sort-backward-not-inverse",
            MoeBug::DroppedLeakGradient => "dropped-leak-gradient",
            MoeBug::EmptyExpertStaleWgrad => "empty-expert-stale-wgrad",
            MoeBug::CombineGradMissing => "combine-grad-missing",
            MoeBug::SharedGateUngatedBackward => "shared-gate-ungated-backward",
            MoeBug::ClampGradIgnored => "clamp-grad-ignored",
            MoeBug::RouterBiasGradMissing => "router-bias-grad-missing",
            MoeBug::DownBiasUnweighted => "down-bias-unweighted",
        }
    }

    fn description(self) -> &'static str {
        match self {
            MoeBug::SortBackwardNotInverse => {
                "the backward of the sort is not the inverse permutation for k > 1"
            }
            MoeBug::DroppedLeakGradient => "dropped assignments get gradient in the backward",
            MoeBug::EmptyExpertStaleWgrad => "empty experts' dW0/dW1/dWo are stale, not zero",
            MoeBug::CombineGradMissing => "the combine-weight gradient <dout, y> is missing",
            MoeBug::SharedGateUngatedBackward => {
                "a gated shared expert's backward ignores the gate"
            }
            MoeBug::ClampGradIgnored => "the clamped activation's gradient ignores the clamps",
            MoeBug::RouterBiasGradMissing => "the router-logit bias gets no gradient",
            MoeBug::DownBiasUnweighted => "dbo sums dout without the combine weight",
        }
    }
}

/// The CPU model of a fused MoE-layer kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MoeEmulate {
    pub inject: Option<MoeBug>,
}

fn r32(v: f64) -> f64 {
    round_to(v, Format::F32, Overflow::Ieee)
}

fn r<D: ndarray::Dimension>(a: ndarray::Array<f64, D>) -> ndarray::Array<f64, D> {
    a.mapv(r32)
}

impl MoeEmulate {
    /// The model with `bug` planted.
    pub fn with_bug(inject: Option<MoeBug>) -> MoeEmulate {
        MoeEmulate { inject }
    }

    fn has(&self, b: MoeBug) -> bool {
        self.inject == Some(b)
    }

    /// The routing of f32-rounded router logits and its permutation.
    fn route(case: &MoeCase) -> Result<(Routing, Permutation), moecheck_reference::Error> {
        let mut logits = r(case.x.dot(&case.wr));
        if let Some(b) = &case.router_bias {
            logits = r(logits + b);
        }
        let routing = route(&case.routing_case(logits))?;
        let perm = Permutation::new(&routing.indices, &routing.kept, case.experts())?;
        Ok((routing, perm))
    }

    /// `(token, slot)` of assignment `a` as the backward decomposes it.
    fn bwd_slot(&self, a: usize, tokens: usize, k: usize) -> (usize, usize) {
        if self.has(MoeBug::SortBackwardNotInverse) {
            (a % tokens, a / tokens)
        } else {
            (a / k, a % k)
        }
    }

    /// The backward of the sort: `dx[t] = Σ` of the rows the backward maps to `t`, in f32.
    fn unsort_sum(&self, p: &Permutation, dxp: ArrayView2<f64>) -> Array2<f64> {
        let mut dx = Array2::zeros((p.tokens, dxp.ncols()));
        for r in 0..p.rows() {
            let (t, _) = self.bwd_slot(p.order[r], p.tokens, p.topk);
            dx.row_mut(t)
                .zip_mut_with(&dxp.row(r), |d, v| *d = r32(*d + v));
        }
        dx
    }

    fn ffn(
        x: ArrayView2<f64>,
        w: [ndarray::ArrayView3<f64>; 3],
        off: &[usize],
        spec: FfnSpec,
    ) -> FfnForward {
        let mut a = r(grouped_fwd(x, w[0], off));
        let mut b = r(grouped_fwd(x, w[1], off));
        if let Some(bias) = spec.bias {
            add_group_bias(&mut a, bias.b0.view(), off);
            add_group_bias(&mut b, bias.b1.view(), off);
            (a, b) = (r(a), r(b));
        }
        let (act, h) = match spec.act {
            Activation::Swiglu => {
                let act = a.mapv(|v| r32(silu(v)));
                let h = r(&act * &b);
                (act, h)
            }
            Activation::ClampedSwiglu => {
                let act = a.mapv(|v| {
                    let g = v.min(CLAMP_LIMIT);
                    r32(g * r32(sigmoid(r32(CLAMP_ALPHA * g))))
                });
                let vp1 = b.mapv(|v| r32(v.clamp(-CLAMP_LIMIT, CLAMP_LIMIT) + 1.0));
                (act.clone(), r(&vp1 * &act))
            }
        };
        let mut y = r(grouped_fwd(h.view(), w[2], off));
        if let Some(bias) = spec.bias {
            add_group_bias(&mut y, bias.bo.view(), off);
            y = r(y);
        }
        FfnForward { a, b, act, h, y }
    }

    /// `(dx, [dW0, dW1, dWo], [db0, db1, dbo] with biases)`.
    #[allow(clippy::type_complexity)]
    fn ffn_bwd(
        &self,
        x: ArrayView2<f64>,
        w: [ndarray::ArrayView3<f64>; 3],
        f: &FfnForward,
        dy: ArrayView2<f64>,
        off: &[usize],
        spec: FfnSpec,
    ) -> (Array2<f64>, [Array3<f64>; 3], Option<[Array2<f64>; 3]>) {
        let dh = r(grouped_dgrad(dy, w[2], off));
        let dwo = r(grouped_wgrad(f.h.view(), dy, off));
        let (da, db) = match spec.act {
            Activation::Swiglu => {
                let sg = f.a.mapv(|v| r32(silu_grad(v)));
                (r(&r(&dh * &f.b) * &sg), r(&dh * &f.act))
            }
            Activation::ClampedSwiglu => {
                let ignore = self.has(MoeBug::ClampGradIgnored);
                let mut da = Array2::zeros(dh.dim());
                let mut db = Array2::zeros(dh.dim());
                ndarray::Zip::from(&mut da)
                    .and(&mut db)
                    .and(&dh)
                    .and(&f.a)
                    .and(&f.b)
                    .and(&f.act)
                    .for_each(|p, q, &d, &av, &bv, &act| {
                        let vp1 = r32(bv.clamp(-CLAMP_LIMIT, CLAMP_LIMIT) + 1.0);
                        let sg = r32(silu_grad(r32(CLAMP_ALPHA * av.min(CLAMP_LIMIT))));
                        if ignore || av < CLAMP_LIMIT {
                            *p = r32(r32(d * vp1) * sg);
                        }
                        if ignore || bv.abs() < CLAMP_LIMIT {
                            *q = r32(d * act);
                        }
                    });
                (da, db)
            }
        };
        let dx = r(r(grouped_dgrad(da.view(), w[0], off)) + r(grouped_dgrad(db.view(), w[1], off)));
        let dw0 = r(grouped_wgrad(x, da.view(), off));
        let dw1 = r(grouped_wgrad(x, db.view(), off));
        let dbias = spec.bias.map(|_| {
            [
                r(group_bias_grad(da.view(), off)),
                r(group_bias_grad(db.view(), off)),
                r(group_bias_grad(dy, off)),
            ]
        });
        (dx, [dw0, dw1, dwo], dbias)
    }
}

impl Implementation<MoeLayer> for MoeEmulate {
    fn name(&self) -> String {
        model_name(self.inject)
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

    fn run(&self, case: &MoeCase, _: ()) -> Result<MoeOutputs, RunError> {
        let err = |e: moecheck_reference::Error| RunError::new(e.to_string());
        let (t, k, e) = (case.tokens(), case.topk(), case.experts());
        let (routing, perm) = Self::route(case).map_err(err)?;
        let combine = r(routing.combine.clone());
        let experts = [case.w0.view(), case.w1.view(), case.wo.view()];
        let off = perm.offsets();
        let xp = perm.permute(case.x.view());
        let ffn = Self::ffn(xp.view(), experts, &off, case.experts_spec());
        let mut out = r(perm.combine(ffn.y.view(), combine.view()));
        let shared_w = case.shared.as_ref().map(shared_as_group);
        let all = [0, t];
        let shared = shared_w.as_ref().map(|[a, b, c]| {
            let w = [a.view(), b.view(), c.view()];
            Self::ffn(case.x.view(), w, &all, case.shared_spec())
        });
        // A gated shared expert: `σ(x·g)` per token, in f32.
        let gate = case.shared.as_ref().and_then(|s| s.gate.as_ref()).map(|g| {
            let gv = r(case.x.dot(g)).mapv(|v| r32(sigmoid(v)));
            (g, gv)
        });
        if let Some(s) = &shared {
            match &gate {
                Some((_, gv)) => out = r(out + r(&s.y * &gv.view().insert_axis(Axis(1)))),
                None => out = r(out + &s.y),
            }
        }
        // Backward. With the leak bug it recomputes the routing without capacity.
        let leak = self.has(MoeBug::DroppedLeakGradient);
        let (bperm, bw, bffn, bxp);
        if leak {
            let all_kept = Array2::from_elem(routing.indices.dim(), true);
            bperm = Permutation::new(&routing.indices, &all_kept, e).map_err(err)?;
            bw = r(routing.weights.clone());
            bxp = bperm.permute(case.x.view());
            bffn = Self::ffn(bxp.view(), experts, &bperm.offsets(), case.experts_spec());
        } else {
            bperm = perm.clone();
            bw = combine.clone();
            bxp = xp;
            bffn = ffn;
        }
        let boff = bperm.offsets();
        let mut dyp = Array2::zeros((bperm.rows(), case.hidden()));
        let mut dc = Array2::zeros((t, k));
        for rr in 0..bperm.rows_used() {
            let (ti, s) = self.bwd_slot(bperm.order[rr], t, k);
            let w = bw[(ti, s)];
            dyp.row_mut(rr)
                .assign(&case.dout.row(ti).mapv(|v| r32(w * v)));
            if !self.has(MoeBug::CombineGradMissing) {
                dc[(ti, s)] = r32(case.dout.row(ti).dot(&bffn.y.row(rr)));
            }
        }
        let (dxp, mut dw, mut dbias) = self.ffn_bwd(
            bxp.view(),
            experts,
            &bffn,
            dyp.view(),
            &boff,
            case.experts_spec(),
        );
        if let (true, Some(db)) = (self.has(MoeBug::DownBiasUnweighted), dbias.as_mut()) {
            // dbo from dout itself, not the combine-weighted dyp.
            db[2].fill(0.0);
            for ex in 0..e {
                for rr in boff[ex]..boff[ex + 1] {
                    let (ti, _) = self.bwd_slot(bperm.order[rr], t, k);
                    let mut row = db[2].row_mut(ex);
                    row += &case.dout.row(ti);
                }
            }
            db[2] = r(db[2].clone());
        }
        if self.has(MoeBug::EmptyExpertStaleWgrad) {
            for g in dw.iter_mut() {
                for ex in 1..e {
                    if bperm.group_sizes[ex] == 0 {
                        let prev = g.index_axis(Axis(0), ex - 1).to_owned();
                        g.index_axis_mut(Axis(0), ex).assign(&prev);
                    }
                }
            }
        }
        let mut dx = self.unsort_sum(&bperm, dxp.view());
        let dz = r(routing_vjp(&routing, dc.view()));
        dx = r(dx + r(dz.dot(&case.wr.t())));
        let dw_router = r(case.x.t().dot(&dz));
        let drouter_bias = case.router_bias.as_ref().map(|b| {
            if self.has(MoeBug::RouterBiasGradMissing) {
                Array1::zeros(b.len())
            } else {
                r(dz.sum_axis(Axis(0)))
            }
        });
        let mut dshared_gate = None;
        let dshared = match (&shared, &shared_w) {
            (Some(sf), Some([a, b, c])) => {
                let dys = match &gate {
                    Some((_, gv)) if !self.has(MoeBug::SharedGateUngatedBackward) => {
                        r(&case.dout * &gv.view().insert_axis(Axis(1)))
                    }
                    _ => case.dout.clone(),
                };
                let (dxs, [d0, d1, d_o], _) = self.ffn_bwd(
                    case.x.view(),
                    [a.view(), b.view(), c.view()],
                    sf,
                    dys.view(),
                    &all,
                    case.shared_spec(),
                );
                dx = r(dx + dxs);
                if let Some((g, gv)) = &gate {
                    let dl = Array1::from_shape_fn(t, |ti| {
                        let d = r32(case.dout.row(ti).dot(&sf.y.row(ti)));
                        r32(r32(d * gv[ti]) * r32(1.0 - gv[ti]))
                    });
                    let outer = &dl.view().insert_axis(Axis(1)) * &g.view().insert_axis(Axis(0));
                    dx = r(dx + r(outer));
                    dshared_gate = Some(r(case.x.t().dot(&dl)));
                }
                let first = |a: Array3<f64>| a.index_axis_move(Axis(0), 0);
                Some([first(d0), first(d1), first(d_o)])
            }
            _ => None,
        };
        let [dw0, dw1, dwo] = dw;
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

    /// Its own permutation of `case.x`, undone by its own unpermute (the backward's
    /// decomposition of the assignments).
    fn internals(&self, case: &MoeCase, _: ()) -> Option<RoundTrip> {
        let (_, perm) = Self::route(case).ok()?;
        let x = &case.x;
        let xp = perm.permute(x.view());
        let mut u = Array3::zeros((perm.tokens, perm.topk, x.ncols()));
        for rr in 0..perm.rows() {
            let (t, s) = self.bwd_slot(perm.order[rr], perm.tokens, perm.topk);
            u.slice_mut(ndarray::s![t, s, ..]).assign(&xp.row(rr));
        }
        Some(u)
    }
}
