//! Running error analysis, one operation at a time: a value beside a bound on its error
//! ([`Ev`], [`T2`] for arrays), the rules for products, sums, quotients, dot products,
//! Lipschitz functions and grouped GEMMs (the module documentation of [`super`] states
//! them), and the replay of the grouped SwiGLU FFN forward and backward.

use ndarray::{Array2, Array3, ArrayView2, ArrayView3, Axis, Zip};

use crate::gemm::bound::gamma;
use crate::gemm::{grouped_dgrad, grouped_fwd, grouped_wgrad};
use crate::moe::ffn::{sigmoid, silu, silu_grad, Activation, ExpertBias, CLAMP_ALPHA, CLAMP_LIMIT};

/// Relative error, in units of `u`, allowed for one evaluation of `exp`, `σ` or `silu`.
pub const FN_ULPS: f64 = 4.0;
/// `max |silu'|`, rounded up.
const SILU_LIP: f64 = 1.1;
/// `max |silu''|`.
const SILU_GRAD_LIP: f64 = 0.5;

/// A value and a bound on its error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Ev {
    pub(super) v: f64,
    pub(super) e: f64,
}

impl Ev {
    pub(super) fn exact(v: f64) -> Ev {
        Ev { v, e: 0.0 }
    }
    pub(super) fn mag(self) -> f64 {
        self.v.abs() + self.e
    }
    pub(super) fn mul(self, o: Ev, u: f64) -> Ev {
        Ev {
            v: self.v * o.v,
            e: self.v.abs() * o.e + self.e * o.v.abs() + self.e * o.e + u * self.mag() * o.mag(),
        }
    }
    pub(super) fn add(self, o: Ev, u: f64) -> Ev {
        Ev {
            v: self.v + o.v,
            e: self.e + o.e + u * (self.mag() + o.mag()),
        }
    }
    pub(super) fn sub(self, o: Ev, u: f64) -> Ev {
        self.add(Ev { v: -o.v, e: o.e }, u)
    }
    /// `self / d` with `d.e < |d.v|`.
    pub(super) fn div(self, d: Ev, u: f64) -> Ev {
        let q = self.v / d.v;
        let e = (self.e + q.abs() * d.e) / (d.v.abs() - d.e).max(f64::MIN_POSITIVE);
        Ev {
            v: q,
            e: e + u * (q.abs() + e),
        }
    }
    /// `Σ a_i·b_i` of depth `n = pairs.len()`.
    pub(super) fn dot(pairs: &[(Ev, Ev)], u: f64) -> Ev {
        let g = gamma(pairs.len(), u);
        let mut v = 0.0;
        let mut e = 0.0;
        let mut m = 0.0;
        for (a, b) in pairs {
            v += a.v * b.v;
            e += a.v.abs() * b.e + a.e * b.v.abs() + a.e * b.e;
            m += a.mag() * b.mag();
        }
        Ev { v, e: e + g * m }
    }
}

/// An array with its error bound.
#[derive(Debug, Clone)]
pub(super) struct T2 {
    pub(super) v: Array2<f64>,
    pub(super) e: Array2<f64>,
}

impl T2 {
    pub(super) fn exact(v: Array2<f64>) -> T2 {
        let e = Array2::zeros(v.dim());
        T2 { v, e }
    }
    pub(super) fn mag(&self) -> Array2<f64> {
        &self.v.mapv(f64::abs) + &self.e
    }
    pub(super) fn at(&self, i: usize, j: usize) -> Ev {
        Ev {
            v: self.v[(i, j)],
            e: self.e[(i, j)],
        }
    }
    pub(super) fn zip(&self, o: &T2, f: impl Fn(Ev, Ev) -> Ev) -> T2 {
        let mut v = Array2::zeros(self.v.dim());
        let mut e = Array2::zeros(self.v.dim());
        Zip::indexed(&mut v).and(&mut e).for_each(|(i, j), vv, ee| {
            let r = f(self.at(i, j), o.at(i, j));
            *vv = r.v;
            *ee = r.e;
        });
        T2 { v, e }
    }
    pub(super) fn map(&self, f: impl Fn(Ev) -> Ev) -> T2 {
        self.zip(self, |a, _| f(a))
    }
    /// Rounding to the output format.
    pub(super) fn output(&self, u_out: f64) -> Array2<f64> {
        &self.e + &(self.mag() * u_out)
    }
}

/// A Lipschitz function evaluated with `FN_ULPS` relative error.
pub(super) fn lip(a: Ev, value: f64, lip: f64, u: f64) -> Ev {
    let e = lip * a.e;
    Ev {
        v: value,
        e: e + FN_ULPS * u * (value.abs() + e),
    }
}

/// `lhs (M, K) · rhs_g (K, N)` per group, `rhs` exact: depth `K`.
pub(super) fn g_fwd(lhs: &T2, rhs: ArrayView3<f64>, off: &[usize], u: f64) -> T2 {
    let g = gamma(lhs.v.ncols(), u);
    let abs_r = rhs.mapv(f64::abs);
    let v = grouped_fwd(lhs.v.view(), rhs, off);
    let e = grouped_fwd(lhs.e.view(), abs_r.view(), off) * (1.0 + g)
        + grouped_fwd(lhs.v.mapv(f64::abs).view(), abs_r.view(), off) * g;
    T2 { v, e }
}

/// `dout (M, N) · rhs_gᵀ` per group, `rhs` exact: depth `N`.
pub(super) fn g_dgrad(dout: &T2, rhs: ArrayView3<f64>, off: &[usize], u: f64) -> T2 {
    let g = gamma(dout.v.ncols(), u);
    let abs_r = rhs.mapv(f64::abs);
    let v = grouped_dgrad(dout.v.view(), rhs, off);
    let e = grouped_dgrad(dout.e.view(), abs_r.view(), off) * (1.0 + g)
        + grouped_dgrad(dout.v.mapv(f64::abs).view(), abs_r.view(), off) * g;
    T2 { v, e }
}

/// `lhs_gᵀ · dout_g` per group: depth = the group's size.
pub(super) fn g_wgrad(lhs: &T2, dout: &T2, off: &[usize], u: f64) -> (Array3<f64>, Array3<f64>) {
    let v = grouped_wgrad(lhs.v.view(), dout.v.view(), off);
    let (al, ad) = (lhs.v.mapv(f64::abs), dout.v.mapv(f64::abs));
    let mut e = grouped_wgrad(al.view(), dout.e.view(), off)
        + grouped_wgrad(lhs.e.view(), ad.view(), off)
        + grouped_wgrad(lhs.e.view(), dout.e.view(), off);
    let m = grouped_wgrad(lhs.mag().view(), dout.mag().view(), off);
    for (gi, mut eg) in e.outer_iter_mut().enumerate() {
        let g = gamma(off[gi + 1] - off[gi], u);
        eg.scaled_add(g, &m.index_axis(Axis(0), gi));
    }
    (v, e)
}

/// The replayed grouped FFN and its backward: `(y, dx, dW0, dW1, dWo)` with errors.
pub(super) struct FfnReplay {
    pub(super) y: T2,
    pub(super) xp: T2,
    pub(super) a: T2,
    pub(super) b: T2,
    pub(super) act: T2,
    pub(super) h: T2,
    /// The clamped activation: `v + 1` and `α·g` (what its derivative reads).
    pub(super) clamped: Option<(T2, T2)>,
    /// An input of the clamped activation within its error of a clamp, or `None`.
    pub(super) kink: Option<String>,
}

/// `m + bias_g` on the rows of group `g` (`bias` exact): one rounded addition each.
pub(super) fn add_bias(m: &T2, bias: ArrayView2<f64>, off: &[usize], u: f64) -> T2 {
    let mut r = m.clone();
    for g in 0..off.len() - 1 {
        for row in off[g]..off[g + 1] {
            for c in 0..m.v.ncols() {
                let x = m.at(row, c).add(Ev::exact(bias[(g, c)]), u);
                r.v[(row, c)] = x.v;
                r.e[(row, c)] = x.e;
            }
        }
    }
    r
}

/// Per-group column sums of `d` (a bias gradient): depth = the group's size.
pub(super) fn group_sums(d: &T2, off: &[usize], u: f64) -> (Array2<f64>, Array2<f64>) {
    let n = d.v.ncols();
    let mut v = Array2::zeros((off.len() - 1, n));
    let mut e = Array2::zeros((off.len() - 1, n));
    for g in 0..off.len() - 1 {
        let gm = gamma(off[g + 1] - off[g], u);
        for c in 0..n {
            let (mut sv, mut se, mut sm) = (0.0, 0.0, 0.0);
            for row in off[g]..off[g + 1] {
                let x = d.at(row, c);
                sv += x.v;
                se += x.e;
                sm += x.mag();
            }
            v[(g, c)] = sv;
            e[(g, c)] = se + gm * sm;
        }
    }
    (v, e)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn ffn_fwd(
    xp: T2,
    w0: ArrayView3<f64>,
    w1: ArrayView3<f64>,
    wo: ArrayView3<f64>,
    off: &[usize],
    act_fn: Activation,
    bias: Option<&ExpertBias>,
    u: f64,
) -> FfnReplay {
    let mut a = g_fwd(&xp, w0, off, u);
    let mut b = g_fwd(&xp, w1, off, u);
    if let Some(bs) = bias {
        a = add_bias(&a, bs.b0.view(), off, u);
        b = add_bias(&b, bs.b1.view(), off, u);
    }
    let mut kink = None;
    let (act, h, clamped) = match act_fn {
        Activation::Swiglu => {
            let act = a.map(|x| lip(x, silu(x.v), SILU_LIP, u));
            let h = act.zip(&b, |p, q| p.mul(q, u));
            (act, h, None)
        }
        Activation::ClampedSwiglu => {
            // `g = min(a, L)` and `v = clamp(b, ±L)` are exact and 1-Lipschitz.
            let g = a.map(|x| Ev {
                v: x.v.min(CLAMP_LIMIT),
                e: x.e,
            });
            let ag = g.map(|x| Ev::exact(CLAMP_ALPHA).mul(x, u));
            let act = g.zip(&ag, |gx, y| gx.mul(lip(y, sigmoid(y.v), 0.25, u), u));
            let vp1 = b.map(|x| {
                Ev {
                    v: x.v.clamp(-CLAMP_LIMIT, CLAMP_LIMIT),
                    e: x.e,
                }
                .add(Ev::exact(1.0), u)
            });
            let h = vp1.zip(&act, |p, q| p.mul(q, u));
            for ((i, j), x) in a.v.indexed_iter() {
                let (ea, eb, y) = (a.e[(i, j)], b.e[(i, j)], b.v[(i, j)]);
                if (x - CLAMP_LIMIT).abs() <= ea || (y.abs() - CLAMP_LIMIT).abs() <= eb {
                    kink = Some(format!(
                        "row {i}, column {j} of its activation inputs is within its error of the clamp at ±{CLAMP_LIMIT} (a = {x:e}, b = {y:e})"
                    ));
                    break;
                }
            }
            (act, h, Some((vp1, ag)))
        }
    };
    let mut y = g_fwd(&h, wo, off, u);
    if let Some(bs) = bias {
        y = add_bias(&y, bs.bo.view(), off, u);
    }
    FfnReplay {
        y,
        xp,
        a,
        b,
        act,
        h,
        clamped,
        kink,
    }
}

/// `(dx, dW0, dW1, dWo)` with errors, and with biases `[db0, db1, dbo]`.
pub(super) type Grads3 = (
    T2,
    (Array3<f64>, Array3<f64>),
    (Array3<f64>, Array3<f64>),
    (Array3<f64>, Array3<f64>),
    Option<[(Array2<f64>, Array2<f64>); 3]>,
);

#[allow(clippy::too_many_arguments)]
pub(super) fn ffn_bwd(
    f: &FfnReplay,
    dy: &T2,
    w0: ArrayView3<f64>,
    w1: ArrayView3<f64>,
    wo: ArrayView3<f64>,
    off: &[usize],
    bias: bool,
    u: f64,
) -> Grads3 {
    let dh = g_dgrad(dy, wo, off, u);
    let dwo = g_wgrad(&f.h, dy, off, u);
    let (da, db) = match &f.clamped {
        None => {
            let sg = f.a.map(|x| lip(x, silu_grad(x.v), SILU_GRAD_LIP, u));
            let da = dh
                .zip(&f.b, |p, q| p.mul(q, u))
                .zip(&sg, |p, q| p.mul(q, u));
            (da, dh.zip(&f.act, |p, q| p.mul(q, u)))
        }
        Some((vp1, ag)) => {
            // Flat past a clamp: exactly 0 (cases near a kink are refused).
            let sg = ag.map(|y| lip(y, silu_grad(y.v), SILU_GRAD_LIP, u));
            let mut da = dh.zip(vp1, |p, q| p.mul(q, u)).zip(&sg, |p, q| p.mul(q, u));
            let mut db = dh.zip(&f.act, |p, q| p.mul(q, u));
            for ((i, j), x) in f.a.v.indexed_iter() {
                if *x >= CLAMP_LIMIT {
                    (da.v[(i, j)], da.e[(i, j)]) = (0.0, 0.0);
                }
                if f.b.v[(i, j)].abs() >= CLAMP_LIMIT {
                    (db.v[(i, j)], db.e[(i, j)]) = (0.0, 0.0);
                }
            }
            (da, db)
        }
    };
    let dxa = g_dgrad(&da, w0, off, u);
    let dxb = g_dgrad(&db, w1, off, u);
    let dx = dxa.zip(&dxb, |p, q| p.add(q, u));
    let dw0 = g_wgrad(&f.xp, &da, off, u);
    let dw1 = g_wgrad(&f.xp, &db, off, u);
    let dbias = bias.then(|| {
        [
            group_sums(&da, off, u),
            group_sums(&db, off, u),
            group_sums(dy, off, u),
        ]
    });
    (dx, dw0, dw1, dwo, dbias)
}

/// The dense product `a (M, K) · b (K, N)` with `b` exact.
pub(super) fn mm_exact_rhs(a: &T2, b: ArrayView2<f64>, u: f64) -> T2 {
    let g = gamma(a.v.ncols(), u);
    let ab = b.mapv(f64::abs);
    T2 {
        v: a.v.dot(&b),
        e: a.e.dot(&ab) * (1.0 + g) + a.v.mapv(f64::abs).dot(&ab) * g,
    }
}

#[cfg(test)]
mod tests {
    //! Known answers for every rule, worked by hand from the module documentation of
    //! [`super::super`] with `u = 2^-10` and `γ_n = n·u / (1 - n·u)` written out, so a
    //! change to any term of any rule fails.
    use super::*;
    use ndarray::array;

    const U: f64 = 1.0 / 1024.0;

    fn g(n: f64) -> f64 {
        n * U / (1.0 - n * U)
    }

    fn ev(v: f64, e: f64) -> Ev {
        Ev { v, e }
    }

    fn close(got: f64, want: f64) {
        assert!(
            (got - want).abs() <= 1e-14 * want.abs(),
            "got {got:e}, want {want:e}"
        );
    }

    fn close_all<D: ndarray::Dimension>(got: &ndarray::Array<f64, D>, want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            close(*g, *w);
        }
    }

    #[test]
    fn scalar_rules() {
        let (a, b) = (ev(2.0, 0.5), ev(-3.0, 0.25));
        assert_eq!(Ev::exact(1.5), ev(1.5, 0.0));
        assert_eq!(b.mag(), 3.25);
        // a·b: |a|e(b) + e(a)|b| + e(a)e(b) + u(|a|+e(a))(|b|+e(b)).
        let p = a.mul(b, U);
        assert_eq!(p.v, -6.0);
        close(p.e, 2.0 * 0.25 + 0.5 * 3.0 + 0.5 * 0.25 + U * 2.5 * 3.25);
        // a ± b: e(a) + e(b) + u(|a|+e(a)+|b|+e(b)).
        let s = a.add(b, U);
        assert_eq!(s.v, -1.0);
        close(s.e, 0.75 + U * (2.5 + 3.25));
        let d = a.sub(b, U);
        assert_eq!(d.v, 5.0);
        close(d.e, 0.75 + U * (2.5 + 3.25));
        // (3 ± 0.5) / (-2 ± 0.25): (e(g) + |q|e(D)) / (|D| - e(D)) + u(|q| + that).
        let q = ev(3.0, 0.5).div(ev(-2.0, 0.25), U);
        assert_eq!(q.v, -1.5);
        let e0 = (0.5 + 1.5 * 0.25) / (2.0 - 0.25);
        close(q.e, e0 + U * (1.5 + e0));
        // A denominator whose error reaches its value: the bound is huge, not negative.
        let q = ev(1.0, 0.0).div(ev(1.0, 2.0), 0.0);
        assert_eq!(q.e, 2.0 / f64::MIN_POSITIVE);
        // Σ a_i·b_i of depth 2: Σ(|a|e(b) + e(a)|b| + e(a)e(b)) + γ_2·Σ(|a|+e(a))(|b|+e(b)).
        let dt = Ev::dot(&[(a, b), (ev(1.0, 0.0), ev(4.0, 0.125))], U);
        assert_eq!(dt.v, -2.0);
        close(dt.e, 2.125 + 0.125 + g(2.0) * (2.5 * 3.25 + 1.0 * 4.125));
        assert_eq!(Ev::dot(&[], U), ev(0.0, 0.0));
        // A Lipschitz function: L·e(x) + FN_ULPS·u·(|f(x)| + L·e(x)), FN_ULPS = 4.
        for value in [0.75, -0.75] {
            let l = lip(ev(0.5, 0.125), value, 0.25, U);
            assert_eq!(l.v, value);
            close(l.e, 0.25 * 0.125 + 4.0 * U * (0.75 + 0.25 * 0.125));
        }
    }

    #[test]
    fn array_rules() {
        let t = T2 {
            v: array![[1.0, -2.0]],
            e: array![[0.5, 0.25]],
        };
        assert_eq!(t.mag(), array![[1.5, 2.25]]);
        assert_eq!(T2::exact(array![[3.0]]).e, array![[0.0]]);
        assert_eq!(t.at(0, 1), ev(-2.0, 0.25));
        let o = T2 {
            v: array![[4.0, 8.0]],
            e: array![[0.0, 1.0]],
        };
        let z = t.zip(&o, |a, b| ev(a.v - b.v, a.e + 2.0 * b.e));
        assert_eq!(z.v, array![[-3.0, -10.0]]);
        assert_eq!(z.e, array![[0.5, 2.25]]);
        let m = t.map(|a| ev(2.0 * a.v, a.e + 1.0));
        assert_eq!(m.v, array![[2.0, -4.0]]);
        assert_eq!(m.e, array![[1.5, 1.25]]);
        // Rounding to the output: e + u_out(|v| + e).
        close_all(&t.output(U), &[0.5 + U * 1.5, 0.25 + U * 2.25]);
    }

    #[test]
    fn grouped_rules() {
        // Row 0 through expert 0, row 1 through expert 1, row 2 a tail row.
        let lhs = T2 {
            v: array![[1.0, -2.0], [3.0, 0.5], [7.0, 7.0]],
            e: array![[0.1, 0.0], [0.0, 0.2], [1.0, 1.0]],
        };
        let off = [0, 1, 2];
        // fwd, depth K = 2: Σ e(a)|b|·(1 + γ_2) + γ_2·Σ|a||b|.
        let rhs = Array3::from_shape_vec((2, 2, 1), vec![2.0, -1.0, 0.5, 4.0]).unwrap();
        let f = g_fwd(&lhs, rhs.view(), &off, U);
        assert_eq!(f.v, array![[4.0], [3.5], [0.0]]);
        let g2 = g(2.0);
        let want = [
            0.2 * (1.0 + g2) + 4.0 * g2,
            0.8 * (1.0 + g2) + 3.5 * g2,
            0.0,
        ];
        close_all(&f.e, &want);
        // dgrad, depth N = 2, the same numbers with rhs (2, 1, 2).
        let rhs_t = Array3::from_shape_vec((2, 1, 2), vec![2.0, -1.0, 0.5, 4.0]).unwrap();
        let d = g_dgrad(&lhs, rhs_t.view(), &off, U);
        assert_eq!(d.v, array![[4.0], [3.5], [0.0]]);
        close_all(&d.e, &want);
        // wgrad, depth = the group's size: group 0 = rows 0-1 (depth 2), group 1 = row 2.
        let l = T2 {
            v: array![[1.0], [-2.0], [3.0]],
            e: array![[0.5], [0.0], [0.25]],
        };
        let dy = T2 {
            v: array![[2.0], [1.0], [-1.0]],
            e: array![[0.0], [0.125], [0.5]],
        };
        let (v, e) = g_wgrad(&l, &dy, &[0, 2, 3], U);
        assert_eq!(v.into_raw_vec_and_offset().0, vec![0.0, -3.0]);
        // Group 0: Σ(|a|e(b) + e(a)|b| + e(a)e(b)) = (0 + 1 + 0) + (0.25 + 0 + 0) and
        // Σ mag·mag = 1.5·2 + 2·1.125; group 1: 1.5 + 0.25 + 0.125 and 3.25·1.5.
        close_all(&e, &[1.25 + g2 * 5.25, 1.875 + g(1.0) * 4.875]);
        // The dense product with an exact right-hand side, depth 2.
        let a = T2 {
            v: array![[1.0, -2.0]],
            e: array![[0.5, 0.25]],
        };
        let m = mm_exact_rhs(&a, array![[3.0], [-4.0]].view(), U);
        assert_eq!(m.v, array![[11.0]]);
        close_all(&m.e, &[2.5 * (1.0 + g2) + 11.0 * g2]);
    }
}
