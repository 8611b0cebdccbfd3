//! One MoE FFN layer of the training model, forward and hand-written backward, with its expert
//! GEMMs through an [`ExpertGemm`] and everything else in f64 on the reference's own code
//! (routing, permutation, routing VJP).
//!
//! Forward, for `h (B, H)`: router logits `z = h · W_r`; routing ([`route`]) with the
//! configured score function, top-k, groups and capacity; permute the `B·k` assignments by
//! expert (dropped ones last: the GEMM's tail); `[a | b] = xp · W01_e` (`W01 (E, H, 2F)`, the
//! gate and up projections as one GEMM); `s = silu(a) ⊙ b`; `y = s · Wo_e`; combine
//! `out[t] = Σ_{kept} c[t, j] · y[row of (t, j)]`. The layer returns `h + out` (residual).
//!
//! Backward (module docs of `moecheck_reference::moe`): `dyp[r] = c·dout[t]`,
//! `dc = <dout[t], y[r]>`; `(ds, dWo) = GEMM backward`; `da = ds ⊙ b ⊙ silu'(a)`,
//! `db = ds ⊙ silu(a)`; `(dxp, dW01) = GEMM backward`; `dh = dout + scatter(dxp) + dz · W_rᵀ`
//! with `dz` the routing VJP of `dc`, and `dW_r = hᵀ · dz`.
//!
//! The tail rows (dropped assignments) of every GEMM output are set to 0 before anything reads
//! them: the model never reads what a kernel wrote there, so a loss curve cannot see a kernel
//! that leaves them unwritten.

use ndarray::{s, Array2, Array3, ArrayView2, Axis};

use moecheck_reference::moe::layer::{silu, silu_grad};
use moecheck_reference::moe::{combine_vjp, routing_vjp, Permutation};
use moecheck_reference::routing::{route, Routing, RoutingCase, RoutingConfig};

use super::experts::{ExpertGemm, GemmFailure};

/// A layer's weights.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights {
    /// `W_r (H, E)`
    pub router: Array2<f64>,
    /// `W01 (E, H, 2F)`: gate (`..F`) and up (`F..`) projections.
    pub w01: Array3<f64>,
    /// `Wo (E, F, H)`
    pub wo: Array3<f64>,
}

impl LayerWeights {
    pub fn zeros_like(&self) -> LayerWeights {
        LayerWeights {
            router: Array2::zeros(self.router.raw_dim()),
            w01: Array3::zeros(self.w01.raw_dim()),
            wo: Array3::zeros(self.wo.raw_dim()),
        }
    }
    pub fn ffn(&self) -> usize {
        self.wo.shape()[1]
    }
}

/// What the forward keeps for the backward.
#[derive(Debug, Clone)]
pub struct LayerState {
    h: Array2<f64>,
    routing: Routing,
    perm: Permutation,
    xp: Array2<f64>,
    /// `[a | b] (B·k, 2F)`, tail rows 0.
    ab: Array2<f64>,
    /// `silu(a) ⊙ b (B·k, F)`, tail rows 0.
    s: Array2<f64>,
    /// `y (B·k, H)`, tail rows 0.
    y: Array2<f64>,
}

impl LayerState {
    /// The routing of this layer's forward (for the report: tokens per expert).
    pub fn routing(&self) -> &Routing {
        &self.routing
    }
}

/// A layer failure: the routing refused the logits (non-finite after divergence) or a GEMM.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LayerFailure {
    #[error("routing: {0}")]
    Routing(String),
    /// A GEMM wrote NaN or ±inf into a row the model reads: the loss is no longer a number
    /// (the run diverges there, as a real run's would).
    #[error("{0}")]
    NonFinite(String),
    #[error(transparent)]
    Gemm(#[from] GemmFailure),
}

/// Sets the tail rows (from `used`) of a GEMM output to 0, after checking that every row the
/// model reads is finite.
fn read_rows(a: &mut Array2<f64>, used: usize, what: &str) -> Result<(), LayerFailure> {
    if let Some(((r, c), v)) = a
        .slice(s![..used, ..])
        .indexed_iter()
        .find(|(_, v)| !v.is_finite())
    {
        return Err(LayerFailure::NonFinite(format!(
            "the {what} GEMM wrote {v} at [{r}, {c}]"
        )));
    }
    a.slice_mut(s![used.., ..]).fill(0.0);
    Ok(())
}

/// A weight gradient's first non-finite element as a failure.
fn finite_grad(a: &Array3<f64>, what: &str) -> Result<(), LayerFailure> {
    match a.indexed_iter().find(|(_, v)| !v.is_finite()) {
        Some(((g, r, c), v)) => Err(LayerFailure::NonFinite(format!(
            "the {what} GEMM wrote {v} at [{g}, {r}, {c}]"
        ))),
        None => Ok(()),
    }
}

/// `h + layer(h)` and the state for the backward.
pub fn forward(
    gemm: &dyn ExpertGemm,
    w: &LayerWeights,
    config: &RoutingConfig,
    h: Array2<f64>,
) -> Result<(Array2<f64>, LayerState), LayerFailure> {
    let experts = w.router.ncols();
    let f = w.ffn();
    let routing = route(&RoutingCase {
        logits: h.dot(&w.router),
        bias: None,
        config: *config,
    })
    .map_err(|e| LayerFailure::Routing(e.to_string()))?;
    let perm = Permutation::new(&routing.indices, &routing.kept, experts)
        .map_err(|e| LayerFailure::Routing(e.to_string()))?;
    let used = perm.rows_used();
    let xp = perm.permute(h.view());
    let mut ab = gemm.forward(xp.view(), w.w01.view(), &perm.group_sizes)?;
    read_rows(&mut ab, used, "gate/up forward")?;
    let a = ab.slice(s![.., ..f]);
    let b = ab.slice(s![.., f..]);
    let mut act = a.mapv(silu);
    act *= &b;
    let s = act;
    let mut y = gemm.forward(s.view(), w.wo.view(), &perm.group_sizes)?;
    read_rows(&mut y, used, "down forward")?;
    let out = &h + &perm.combine(y.view(), routing.combine.view());
    Ok((
        out,
        LayerState {
            h,
            routing,
            perm,
            xp,
            ab,
            s,
            y,
        },
    ))
}

/// `dh` (the gradient at the layer's input) for `dout` at its output, and the weights'
/// gradients.
pub fn backward(
    gemm: &dyn ExpertGemm,
    w: &LayerWeights,
    st: &LayerState,
    dout: ArrayView2<f64>,
) -> Result<(Array2<f64>, LayerWeights), LayerFailure> {
    let p = &st.perm;
    let used = p.rows_used();
    let f = w.ffn();
    let (dyp, dc) = combine_vjp(p, st.routing.combine.view(), st.y.view(), dout);
    let (mut ds, dwo) = gemm.backward(st.s.view(), w.wo.view(), &p.group_sizes, dyp.view())?;
    read_rows(&mut ds, used, "down dgrad")?;
    finite_grad(&dwo, "down wgrad")?;
    let a = st.ab.slice(s![.., ..f]);
    let b = st.ab.slice(s![.., f..]);
    let mut dab = Array2::zeros(st.ab.raw_dim());
    {
        let (mut da, mut db) = dab.view_mut().split_at(Axis(1), f);
        ndarray::Zip::from(&mut da)
            .and(&ds)
            .and(&a)
            .and(&b)
            .for_each(|o, &d, &a, &b| *o = d * b * silu_grad(a));
        ndarray::Zip::from(&mut db)
            .and(&ds)
            .and(&a)
            .for_each(|o, &d, &a| *o = d * silu(a));
    }
    let (mut dxp, dw01) = gemm.backward(st.xp.view(), w.w01.view(), &p.group_sizes, dab.view())?;
    read_rows(&mut dxp, used, "gate/up dgrad")?;
    finite_grad(&dw01, "gate/up wgrad")?;
    let dz = routing_vjp(&st.routing, dc.view());
    let mut dh = dout.to_owned();
    dh += &p.scatter_add(dxp.view());
    dh += &dz.dot(&w.router.t());
    let grads = LayerWeights {
        router: st.h.t().dot(&dz),
        w01: dw01,
        wo: dwo,
    };
    Ok((dh, grads))
}
