//! The experts' FFN over grouped rows, forward and backward: the activation (SwiGLU, or
//! gpt-oss's clamped SwiGLU) and the optional per-expert biases.
//!
//! `a = x·W0_g (+ b0_g)`, `b = x·W1_g (+ b1_g)`, `h = act(a, b)`, `y = h·Wo_g (+ bo_g)`, with
//!
//! * `swiglu`: `act(a, b) = silu(a)·b`, `silu(a) = a·σ(a)`;
//! * `clamped-swiglu` (gpt-oss `GptOssExperts`, `α = 1.702`, `L = 7`): `g = min(a, L)`,
//!   `v = clamp(b, −L, L)`, `act(a, b) = (v + 1)·g·σ(α·g)`. Its derivative in `a` is 0 past the
//!   clamp (`a ≥ L`), in `b` 0 past `|b| ≥ L`; cases within the error bound of a clamp's
//!   kink are refused by the tie guard ([`super::tie_guard`]), like routing near-ties.
//!
//! Rows past `off_G` (the tail) give exactly 0 in every intermediate, biases included (a
//! bias belongs to an expert's rows only), and no row of an empty group reaches its weight or
//! bias gradients, which are exactly 0.

use ndarray::{s, Array2, Array3, ArrayView2, ArrayView3};
use serde::{Deserialize, Serialize};

use crate::gemm::{grouped_dgrad, grouped_fwd, grouped_wgrad};

/// `σ(x) = 1 / (1 + exp(−x))` in f64.
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `silu(x) = x·σ(x)`.
pub fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

/// `silu'(x) = σ(x)·(1 + x·(1 − σ(x)))`.
pub fn silu_grad(x: f64) -> f64 {
    let s = sigmoid(x);
    s * (1.0 + x * (1.0 - s))
}

/// gpt-oss's `alpha`: the gate is `g·σ(α·g)`.
pub const CLAMP_ALPHA: f64 = 1.702;
/// gpt-oss's `limit`: `g = min(a, L)`, `v = clamp(b, −L, L)`.
pub const CLAMP_LIMIT: f64 = 7.0;

/// The experts' (and the shared expert's) activation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Activation {
    /// `silu(a)·b` (DeepSeek-V3, Qwen, Mixtral, MaxText).
    #[default]
    Swiglu,
    /// `(clamp(b, −7, 7) + 1)·g·σ(1.702·g)`, `g = min(a, 7)` (gpt-oss).
    ClampedSwiglu,
}

impl Activation {
    pub const ALL: [Activation; 2] = [Activation::Swiglu, Activation::ClampedSwiglu];

    pub fn name(self) -> &'static str {
        match self {
            Activation::Swiglu => "swiglu",
            Activation::ClampedSwiglu => "clamped-swiglu",
        }
    }

    /// The gate part `φ` (`silu(a)`, or `g·σ(α·g)` of the clamped `g`) and `h`.
    pub fn eval(self, a: f64, b: f64) -> (f64, f64) {
        match self {
            Activation::Swiglu => {
                let act = silu(a);
                (act, act * b)
            }
            Activation::ClampedSwiglu => {
                let g = a.min(CLAMP_LIMIT);
                let act = g * sigmoid(CLAMP_ALPHA * g);
                (act, (b.clamp(-CLAMP_LIMIT, CLAMP_LIMIT) + 1.0) * act)
            }
        }
    }

    /// `(∂h/∂a, ∂h/∂b)` at `(a, b)` (one-sided 0 on a clamp's flat side).
    pub fn grad(self, a: f64, b: f64) -> (f64, f64) {
        match self {
            Activation::Swiglu => (b * silu_grad(a), silu(a)),
            Activation::ClampedSwiglu => {
                let g = a.min(CLAMP_LIMIT);
                let dg = if a < CLAMP_LIMIT {
                    (b.clamp(-CLAMP_LIMIT, CLAMP_LIMIT) + 1.0) * silu_grad(CLAMP_ALPHA * g)
                } else {
                    0.0
                };
                let db = if b.abs() < CLAMP_LIMIT {
                    g * sigmoid(CLAMP_ALPHA * g)
                } else {
                    0.0
                };
                (dg, db)
            }
        }
    }
}

/// Per-expert biases (gpt-oss `gate_up_proj_bias`, `down_proj_bias`).
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertBias {
    /// `(E, F)`: added to `a`.
    pub b0: Array2<f64>,
    /// `(E, F)`: added to `b`.
    pub b1: Array2<f64>,
    /// `(E, H)`: added to `y`.
    pub bo: Array2<f64>,
}

/// How an FFN is built beyond its weights.
#[derive(Debug, Clone, Copy, Default)]
pub struct FfnSpec<'a> {
    pub act: Activation,
    pub bias: Option<&'a ExpertBias>,
}

/// The intermediates of the FFN over grouped rows: `a`, `b` (biases included), `act` (the
/// gate part `φ`), `h`, `y`.
#[derive(Debug, Clone, PartialEq)]
pub struct FfnForward {
    pub a: Array2<f64>,
    pub b: Array2<f64>,
    pub act: Array2<f64>,
    pub h: Array2<f64>,
    pub y: Array2<f64>,
}

/// Adds row `g` of `bias (G, N)` to rows `[off_g, off_g+1)` of `m (M, N)`.
pub fn add_group_bias(m: &mut Array2<f64>, bias: ArrayView2<f64>, off: &[usize]) {
    for g in 0..off.len() - 1 {
        let mut rows = m.slice_mut(s![off[g]..off[g + 1], ..]);
        rows += &bias.row(g);
    }
}

/// The gradient of a per-group bias: row `g` is the sum of rows `[off_g, off_g+1)` of `d`
/// (exactly 0 for an empty group).
pub fn group_bias_grad(d: ArrayView2<f64>, off: &[usize]) -> Array2<f64> {
    let mut out = Array2::zeros((off.len() - 1, d.ncols()));
    for g in 0..off.len() - 1 {
        for r in off[g]..off[g + 1] {
            let mut row = out.row_mut(g);
            row += &d.row(r);
        }
    }
    out
}

/// The grouped FFN: rows `[off_g, off_g+1)` of `x (M, H)` through expert `g` of
/// `w0, w1 (G, H, F)`, `wo (G, F, H)`. Reads its arguments, returns new arrays.
pub fn ffn_forward(
    x: ArrayView2<f64>,
    w0: ArrayView3<f64>,
    w1: ArrayView3<f64>,
    wo: ArrayView3<f64>,
    off: &[usize],
    spec: FfnSpec,
) -> FfnForward {
    let mut a = grouped_fwd(x, w0, off);
    let mut b = grouped_fwd(x, w1, off);
    if let Some(bias) = spec.bias {
        add_group_bias(&mut a, bias.b0.view(), off);
        add_group_bias(&mut b, bias.b1.view(), off);
    }
    let (act, h) = match spec.act {
        Activation::Swiglu => {
            let act = a.mapv(silu);
            let h = &act * &b;
            (act, h)
        }
        _ => {
            let mut act = Array2::zeros(a.dim());
            let mut h = Array2::zeros(a.dim());
            ndarray::Zip::from(&mut act)
                .and(&mut h)
                .and(&a)
                .and(&b)
                .for_each(|p, q, &av, &bv| (*p, *q) = spec.act.eval(av, bv));
            // Tail rows stay exactly 0: act(0, 0) is 0 for both activations.
            (act, h)
        }
    };
    let mut y = grouped_fwd(h.view(), wo, off);
    if let Some(bias) = spec.bias {
        add_group_bias(&mut y, bias.bo.view(), off);
    }
    FfnForward { a, b, act, h, y }
}

/// The gradients of [`ffn_forward`] given `dy (M, H)`: `dx (M, H)`, `[dW0, dW1, dWo]` and,
/// with biases, `[db0, db1, dbo]`. Tail rows of `dy` are never read.
#[allow(clippy::too_many_arguments)]
pub fn ffn_backward(
    x: ArrayView2<f64>,
    w0: ArrayView3<f64>,
    w1: ArrayView3<f64>,
    wo: ArrayView3<f64>,
    fwd: &FfnForward,
    dy: ArrayView2<f64>,
    off: &[usize],
    spec: FfnSpec,
) -> FfnGrads {
    let dh = grouped_dgrad(dy, wo, off);
    let dwo = grouped_wgrad(fwd.h.view(), dy, off);
    let (da, db) = match spec.act {
        Activation::Swiglu => (&dh * &fwd.b * &fwd.a.mapv(silu_grad), &dh * &fwd.act),
        _ => {
            let mut da = Array2::zeros(dh.dim());
            let mut db = Array2::zeros(dh.dim());
            ndarray::Zip::from(&mut da)
                .and(&mut db)
                .and(&dh)
                .and(&fwd.a)
                .and(&fwd.b)
                .for_each(|p, q, &d, &av, &bv| {
                    let (ga, gb) = spec.act.grad(av, bv);
                    *p = d * ga;
                    *q = d * gb;
                });
            (da, db)
        }
    };
    let dx = grouped_dgrad(da.view(), w0, off) + grouped_dgrad(db.view(), w1, off);
    let dw0 = grouped_wgrad(x, da.view(), off);
    let dw1 = grouped_wgrad(x, db.view(), off);
    let dbias = spec.bias.map(|_| {
        [
            group_bias_grad(da.view(), off),
            group_bias_grad(db.view(), off),
            group_bias_grad(dy, off),
        ]
    });
    FfnGrads {
        dx,
        dw: [dw0, dw1, dwo],
        dbias,
    }
}

/// What [`ffn_backward`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct FfnGrads {
    pub dx: Array2<f64>,
    /// `[dW0, dW1, dWo]`
    pub dw: [Array3<f64>; 3],
    /// `[db0 (G, F), db1 (G, F), dbo (G, H)]` with biases.
    pub dbias: Option<[Array2<f64>; 3]>,
}
