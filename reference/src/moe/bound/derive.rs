//! The rules of the module documentation of [`super`], written out again on `(value, error)`
//! pairs with scalar loops and literal constants, for [`super::tests`]' second derivation.

use ndarray::{Array2, Array3, ArrayView3};

use crate::moe::ffn::{silu, silu_grad, Activation, ExpertBias};

/// `(value, bound on its error)`.
pub(super) type P = (f64, f64);

pub(super) const EXACT0: P = (0.0, 0.0);

pub(super) fn gm(n: usize, u: f64) -> f64 {
    let nu = n as f64 * u;
    if nu >= 1.0 {
        f64::INFINITY
    } else {
        nu / (1.0 - nu)
    }
}
pub(super) fn mag(a: P) -> f64 {
    a.0.abs() + a.1
}
pub(super) fn mul(a: P, b: P, u: f64) -> P {
    let e = a.0.abs() * b.1 + a.1 * b.0.abs() + a.1 * b.1 + u * mag(a) * mag(b);
    (a.0 * b.0, e)
}
pub(super) fn add(a: P, b: P, u: f64) -> P {
    (a.0 + b.0, a.1 + b.1 + u * (mag(a) + mag(b)))
}
pub(super) fn sub(a: P, b: P, u: f64) -> P {
    add(a, (-b.0, b.1), u)
}
pub(super) fn div(a: P, d: P, u: f64) -> P {
    let q = a.0 / d.0;
    let e = (a.1 + q.abs() * d.1) / (d.0.abs() - d.1);
    (q, e + u * (q.abs() + e))
}
pub(super) fn dot(pairs: &[(P, P)], u: f64) -> P {
    let (mut v, mut e, mut m) = (0.0, 0.0, 0.0);
    for &(a, b) in pairs {
        v += a.0 * b.0;
        e += a.0.abs() * b.1 + a.1 * b.0.abs() + a.1 * b.1;
        m += mag(a) * mag(b);
    }
    (v, e + gm(pairs.len(), u) * m)
}
pub(super) fn lipf(a: P, value: f64, l: f64, u: f64) -> P {
    let e = l * a.1;
    (value, e + 4.0 * u * (value.abs() + e))
}
pub(super) fn ex(v: f64) -> P {
    (v, 0.0)
}
pub(super) fn group_of(off: &[usize], r: usize) -> Option<usize> {
    (0..off.len() - 1).find(|&g| off[g] <= r && r < off[g + 1])
}

/// The FFN over grouped rows (SwiGLU or gpt-oss's clamped SwiGLU, biases or not), forward
/// and backward, with errors.
pub(super) struct Ffn {
    pub(super) a: Array2<P>,
    pub(super) b: Array2<P>,
    pub(super) act: Array2<P>,
    pub(super) h: Array2<P>,
    pub(super) y: Array2<P>,
    /// Clamped: `clamp(b) + 1` and `α·min(a, L)`.
    pub(super) vp1: Array2<P>,
    pub(super) ag: Array2<P>,
    pub(super) clamped: bool,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn ffn_fwd(
    xp: &Array2<P>,
    w0: ArrayView3<f64>,
    w1: ArrayView3<f64>,
    wo: ArrayView3<f64>,
    off: &[usize],
    act_fn: Activation,
    bias: Option<&ExpertBias>,
    u: f64,
) -> Ffn {
    let (m, hd) = xp.dim();
    let f = w0.shape()[2];
    let mut a = Array2::from_elem((m, f), EXACT0);
    let mut b = a.clone();
    let mut act = a.clone();
    let mut h = a.clone();
    let mut vp1 = a.clone();
    let mut ag = a.clone();
    let mut y = Array2::from_elem((m, hd), EXACT0);
    let clamped = act_fn == Activation::ClampedSwiglu;
    for r in 0..m {
        let Some(g) = group_of(off, r) else { continue };
        for j in 0..f {
            let pa: Vec<(P, P)> = (0..hd).map(|i| (xp[(r, i)], ex(w0[(g, i, j)]))).collect();
            let pb: Vec<(P, P)> = (0..hd).map(|i| (xp[(r, i)], ex(w1[(g, i, j)]))).collect();
            a[(r, j)] = dot(&pa, u);
            b[(r, j)] = dot(&pb, u);
            if let Some(bs) = bias {
                a[(r, j)] = add(a[(r, j)], ex(bs.b0[(g, j)]), u);
                b[(r, j)] = add(b[(r, j)], ex(bs.b1[(g, j)]), u);
            }
            if clamped {
                let gg = (a[(r, j)].0.min(7.0), a[(r, j)].1);
                ag[(r, j)] = mul(ex(1.702), gg, u);
                let sig = lipf(ag[(r, j)], 1.0 / (1.0 + (-ag[(r, j)].0).exp()), 0.25, u);
                act[(r, j)] = mul(gg, sig, u);
                vp1[(r, j)] = add((b[(r, j)].0.clamp(-7.0, 7.0), b[(r, j)].1), ex(1.0), u);
                h[(r, j)] = mul(vp1[(r, j)], act[(r, j)], u);
            } else {
                act[(r, j)] = lipf(a[(r, j)], silu(a[(r, j)].0), 1.1, u);
                h[(r, j)] = mul(act[(r, j)], b[(r, j)], u);
            }
        }
        for c in 0..hd {
            let p: Vec<(P, P)> = (0..f).map(|j| (h[(r, j)], ex(wo[(g, j, c)]))).collect();
            y[(r, c)] = dot(&p, u);
            if let Some(bs) = bias {
                y[(r, c)] = add(y[(r, c)], ex(bs.bo[(g, c)]), u);
            }
        }
    }
    Ffn {
        a,
        b,
        act,
        h,
        y,
        vp1,
        ag,
        clamped,
    }
}

/// Per-group column sums, each a sum of the group's size.
fn group_sum(d: &Array2<P>, off: &[usize], u: f64) -> Array2<P> {
    Array2::from_shape_fn((off.len() - 1, d.ncols()), |(g, c)| {
        let rows = off[g]..off[g + 1];
        let v: f64 = rows.clone().map(|r| d[(r, c)].0).sum();
        let e: f64 = rows.clone().map(|r| d[(r, c)].1).sum();
        let m: f64 = rows.clone().map(|r| mag(d[(r, c)])).sum();
        (v, e + gm(off[g + 1] - off[g], u) * m)
    })
}

/// `(dx, dw0, dw1, dwo)` and, with `bias`, `[db0, db1, dbo]`.
pub(super) type Derived3 = (
    Array2<P>,
    Array3<P>,
    Array3<P>,
    Array3<P>,
    Option<[Array2<P>; 3]>,
);

#[allow(clippy::too_many_arguments)]
pub(super) fn ffn_bwd(
    fw: &Ffn,
    xp: &Array2<P>,
    dy: &Array2<P>,
    w0: ArrayView3<f64>,
    w1: ArrayView3<f64>,
    wo: ArrayView3<f64>,
    off: &[usize],
    bias: bool,
    u: f64,
) -> Derived3 {
    let (m, hd) = dy.dim();
    let (ng, f) = (w0.shape()[0], w0.shape()[2]);
    let mut dx = Array2::from_elem((m, hd), EXACT0);
    let mut da = Array2::from_elem((m, f), EXACT0);
    let mut db = da.clone();
    for r in 0..m {
        let Some(g) = group_of(off, r) else { continue };
        for j in 0..f {
            let p: Vec<(P, P)> = (0..hd).map(|c| (dy[(r, c)], ex(wo[(g, j, c)]))).collect();
            let dh = dot(&p, u);
            if fw.clamped {
                let sg = lipf(fw.ag[(r, j)], silu_grad(fw.ag[(r, j)].0), 0.5, u);
                if fw.a[(r, j)].0 < 7.0 {
                    da[(r, j)] = mul(mul(dh, fw.vp1[(r, j)], u), sg, u);
                }
                if fw.b[(r, j)].0.abs() < 7.0 {
                    db[(r, j)] = mul(dh, fw.act[(r, j)], u);
                }
            } else {
                let sg = lipf(fw.a[(r, j)], silu_grad(fw.a[(r, j)].0), 0.5, u);
                da[(r, j)] = mul(mul(dh, fw.b[(r, j)], u), sg, u);
                db[(r, j)] = mul(dh, fw.act[(r, j)], u);
            }
        }
        for i in 0..hd {
            let pa: Vec<(P, P)> = (0..f).map(|j| (da[(r, j)], ex(w0[(g, i, j)]))).collect();
            let pb: Vec<(P, P)> = (0..f).map(|j| (db[(r, j)], ex(w1[(g, i, j)]))).collect();
            dx[(r, i)] = add(dot(&pa, u), dot(&pb, u), u);
        }
    }
    let wgrad = |l: &Array2<P>, d: &Array2<P>| {
        Array3::from_shape_fn((ng, l.ncols(), d.ncols()), |(g, i, j)| {
            let p: Vec<(P, P)> = (off[g]..off[g + 1])
                .map(|r| (l[(r, i)], d[(r, j)]))
                .collect();
            dot(&p, u)
        })
    };
    let dbias = bias.then(|| {
        [
            group_sum(&da, off, u),
            group_sum(&db, off, u),
            group_sum(dy, off, u),
        ]
    });
    (dx, wgrad(xp, &da), wgrad(xp, &db), wgrad(&fw.h, dy), dbias)
}
