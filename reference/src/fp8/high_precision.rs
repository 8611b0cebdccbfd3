//! The FP8 GEMM against the unquantised f64 GEMM, for information only (never a verdict).
//!
//! Per pass, over the checked elements (tail rows excluded): the relative error
//! `‖ŷ - y‖₂ / ‖y‖₂`, DeepGEMM's `calc_diff = 1 - 2Σŷy / Σ(ŷ² + y²)`, the largest absolute
//! error, and how many elements fall outside the expected FP8 envelope
//! `(u_a + u_b + u_a·u_b)·Σ|a·b| + c_acc(n)·Σ|a·b|`: the first-order quantisation error of two
//! normal-range FP8 operands (`u = 2^-4` for E4M3, `2^-3` for E5M2) plus the accumulation
//! model's coefficient at the reduction depth `n`. Subnormal-range and saturated values can
//! exceed it, which is why it is information and not a verdict.

use ndarray::{s, ArrayView2, Axis};
use serde::{Deserialize, Serialize};

use super::case::Fp8GemmCase;
use crate::format::Format;
use crate::gemm::{GemmOutputs, OutView2, Pass, Passes, ReferenceResult};

/// One pass against the unquantised f64 GEMM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HighPrecisionStats {
    /// The sums the statistics are made of, for [`merge_high_precision`] (not serialised).
    #[serde(skip)]
    sums: Sums,
    pub pass: Pass,
    /// Elements compared (tail rows excluded).
    pub elements: usize,
    /// `‖ŷ - y‖₂ / ‖y‖₂` (0 when both are 0).
    pub rel_err: f64,
    /// `1 - 2Σŷy / Σ(ŷ² + y²)`.
    pub calc_diff: f64,
    pub max_abs_err: f64,
    /// Elements outside the expected FP8 envelope (information).
    pub outside_envelope: usize,
    /// `max |ŷ - y| / envelope`.
    pub max_envelope_ratio: f64,
}

/// The statistics of every asked pass whose output `got` holds with the right shape, against
/// `hp`, the unquantised f64 reference of `case.gemm` for `passes`. Each pass is one walk over
/// its checked elements; nothing is copied.
pub fn high_precision(
    case: &Fp8GemmCase,
    passes: Passes,
    hp: &ReferenceResult,
    got: &GemmOutputs,
) -> Vec<HighPrecisionStats> {
    passes
        .iter()
        .filter_map(|pass| pass_stats(case, pass, hp, got))
        .collect()
}

/// The statistics of the elements of several parts of a case (the shards of
/// [`super::shard`]), each part's per pass: a pass's sums are added over the parts that have
/// it, in pass order.
pub fn merge_high_precision(parts: &[&[HighPrecisionStats]]) -> Vec<HighPrecisionStats> {
    let mut merged: Vec<(Pass, Sums)> = Vec::new();
    for stats in parts.iter().flat_map(|p| p.iter()) {
        match merged.iter_mut().find(|(p, _)| *p == stats.pass) {
            Some((_, sums)) => *sums = sums.add(stats.sums),
            None => merged.push((stats.pass, stats.sums)),
        }
    }
    merged.sort_by_key(|(p, _)| *p);
    merged.into_iter().map(|(p, s)| s.finish(p)).collect()
}

/// The envelope's coefficient for operands in formats `fa`, `fb` summed over `n` products.
fn envelope(case: &Fp8GemmCase, fa: Format, fb: Format, n: usize) -> f64 {
    let (ua, ub) = (fa.info().unit_roundoff(), fb.info().unit_roundoff());
    ua + ub + ua * ub + case.recipe.accumulation.coefficient(n)
}

/// One pass's statistics (`None` when `got` lacks it or has the wrong shape): its checked
/// elements in order (fwd/dgrad: the rows used, row by row; wgrad: every expert's gradient).
fn pass_stats(
    case: &Fp8GemmCase,
    pass: Pass,
    hp: &ReferenceResult,
    got: &GemmOutputs,
) -> Option<HighPrecisionStats> {
    let r = &case.recipe;
    let mut sums = Sums::default();
    match pass {
        Pass::Fwd | Pass::Dgrad => {
            let (fa, n, want, mag, got) = if pass == Pass::Fwd {
                (
                    r.lhs.format,
                    case.gemm.k(),
                    &hp.value.out,
                    &hp.magnitude.out,
                    &got.out,
                )
            } else {
                (
                    r.dout.format,
                    case.gemm.n(),
                    &hp.value.dlhs,
                    &hp.magnitude.dlhs,
                    &got.dlhs,
                )
            };
            let (want, mag) = (
                want.as_ref().expect("asked pass"),
                mag.as_ref().expect("asked pass"),
            );
            let got = got.as_ref().filter(|a| a.shape() == want.shape())?;
            let used = case.gemm.rows_used();
            let c = envelope(case, fa, r.rhs.format, n);
            let (want, mag) = (want.slice(s![..used, ..]), mag.slice(s![..used, ..]));
            push_all(&mut sums, got.view().rows(0, used), want, mag, c);
        }
        Pass::Wgrad => {
            let want = hp.value.drhs.as_ref().expect("asked pass");
            let mag = hp.magnitude.drhs.as_ref().expect("asked pass");
            let got = got.drhs.as_ref().filter(|a| a.shape() == want.shape())?;
            for (e, size) in case.gemm.group_sizes.iter().enumerate() {
                let c = envelope(case, r.lhs.format, r.dout.format, *size);
                let (w, m) = (want.index_axis(Axis(0), e), mag.index_axis(Axis(0), e));
                push_all(&mut sums, got.outer(e), w, m, c);
            }
        }
    }
    Some(sums.finish(pass))
}

/// Feeds `sums` the elements of `got`, `want` and `mag` (one shape) in row-major order, `got`
/// widened to f64 as it is read.
fn push_all(
    sums: &mut Sums,
    got: OutView2<'_>,
    want: ArrayView2<f64>,
    mag: ArrayView2<f64>,
    coeff: f64,
) {
    let mut widened = Vec::new();
    for (r, (w, m)) in want.outer_iter().zip(mag.outer_iter()).enumerate() {
        let g = got.row_f64(r, &mut widened);
        for ((g, w), m) in g.iter().zip(w.iter()).zip(m.iter()) {
            sums.push(*g, *w, *m, coeff);
        }
    }
}

/// The larger of `a` and `b`, NaN when either is.
fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// Running sums of one pass, fed its elements in order.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Sums {
    elements: usize,
    num: f64,
    den: f64,
    xy: f64,
    sq: f64,
    max_abs: f64,
    outside: usize,
    ratio: f64,
}

impl Sums {
    /// One element: got `g`, unquantised value `w`, its magnitude and the envelope's
    /// coefficient of it.
    fn push(&mut self, g: f64, w: f64, magnitude: f64, coeff: f64) {
        let e = g - w;
        self.elements += 1;
        self.num += e * e;
        self.den += w * w;
        self.xy += g * w;
        self.sq += g * g + w * w;
        // A NaN error makes the maximum NaN for good (`f64::max` alone would drop it at the
        // next element).
        self.max_abs = nan_max(self.max_abs, e.abs());
        let envelope = coeff * magnitude;
        let q = if e == 0.0 {
            0.0
        } else if envelope > 0.0 {
            e.abs() / envelope
        } else {
            f64::INFINITY
        };
        if e.is_nan() || e.abs() > envelope {
            self.outside += 1;
        }
        self.ratio = nan_max(self.ratio, q);
    }

    /// Both sums' elements together (sums added, maxima taken, NaN kept).
    fn add(self, o: Sums) -> Sums {
        let max = nan_max;
        Sums {
            elements: self.elements + o.elements,
            num: self.num + o.num,
            den: self.den + o.den,
            xy: self.xy + o.xy,
            sq: self.sq + o.sq,
            max_abs: max(self.max_abs, o.max_abs),
            outside: self.outside + o.outside,
            ratio: max(self.ratio, o.ratio),
        }
    }

    fn finish(self, pass: Pass) -> HighPrecisionStats {
        HighPrecisionStats {
            sums: self,
            pass,
            elements: self.elements,
            rel_err: if self.den == 0.0 {
                if self.num == 0.0 {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                (self.num / self.den).sqrt()
            },
            calc_diff: if self.sq == 0.0 {
                0.0
            } else {
                1.0 - 2.0 * self.xy / self.sq
            },
            max_abs_err: self.max_abs,
            outside_envelope: self.outside,
            max_envelope_ratio: self.ratio,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fp8::{Fp8Expected, Fp8Recipe};
    use crate::gemm::{GroupedGemmCase, WideOutputs};
    use ndarray::{Array2, Array3};
    use rand::{Rng, SeedableRng};

    /// The checked elements of one pass, flattened: what was got (`None` when the output is
    /// missing or ill-shaped), the unquantised value, its magnitude `Σ|a·b|`, and the envelope's
    /// coefficient of that magnitude.
    struct Flat {
        got: Option<Vec<f64>>,
        want: Vec<f64>,
        magnitude: Vec<f64>,
        coeff: Vec<f64>,
    }

    /// The statistics as they were computed before, from flattened copies: the oracle.
    fn high_precision_flat(
        case: &Fp8GemmCase,
        passes: Passes,
        hp: &ReferenceResult,
        got: &GemmOutputs,
    ) -> Vec<HighPrecisionStats> {
        passes
            .iter()
            .filter_map(|pass| {
                let flat = flatten(case, pass, hp, &got.to_f64());
                flat.got.as_ref().map(|g| stats(pass, g, &flat))
            })
            .collect()
    }

    fn flatten(case: &Fp8GemmCase, pass: Pass, hp: &ReferenceResult, got: &WideOutputs) -> Flat {
        let r = &case.recipe;
        match pass {
            Pass::Fwd | Pass::Dgrad => {
                let pick = |o: &WideOutputs| {
                    if pass == Pass::Fwd {
                        o.out.clone()
                    } else {
                        o.dlhs.clone()
                    }
                };
                let (fa, n) = if pass == Pass::Fwd {
                    (r.lhs.format, case.gemm.k())
                } else {
                    (r.dout.format, case.gemm.n())
                };
                let want = pick(&hp.value).expect("asked pass");
                let mag = pick(&hp.magnitude).expect("asked pass");
                let used = case.gemm.rows_used();
                let rows = |a: &Array2<f64>| {
                    a.rows()
                        .into_iter()
                        .take(used)
                        .flatten()
                        .copied()
                        .collect::<Vec<_>>()
                };
                let c = envelope(case, fa, r.rhs.format, n);
                let magnitude = rows(&mag);
                Flat {
                    got: pick(got)
                        .filter(|a| a.shape() == want.shape())
                        .map(|a| rows(&a)),
                    want: rows(&want),
                    coeff: vec![c; magnitude.len()],
                    magnitude,
                }
            }
            Pass::Wgrad => {
                let want = hp.value.drhs.as_ref().expect("asked pass");
                let mag = hp.magnitude.drhs.as_ref().expect("asked pass");
                let (_, k, n) = want.dim();
                let coeff = case
                    .gemm
                    .group_sizes
                    .iter()
                    .flat_map(|s| {
                        std::iter::repeat_n(envelope(case, r.lhs.format, r.dout.format, *s), k * n)
                    })
                    .collect();
                Flat {
                    got: got
                        .drhs
                        .as_ref()
                        .filter(|a| a.shape() == want.shape())
                        .map(|a| a.iter().copied().collect()),
                    want: want.iter().copied().collect(),
                    magnitude: mag.iter().copied().collect(),
                    coeff,
                }
            }
        }
    }

    fn stats(pass: Pass, g: &[f64], f: &Flat) -> HighPrecisionStats {
        let w = &f.want;
        let (mut num, mut den, mut xy, mut sq, mut max_abs, mut outside, mut ratio) =
            (0.0, 0.0, 0.0, 0.0, 0.0f64, 0usize, 0.0f64);
        for i in 0..w.len() {
            let e = g[i] - w[i];
            num += e * e;
            den += w[i] * w[i];
            xy += g[i] * w[i];
            sq += g[i] * g[i] + w[i] * w[i];
            max_abs = if e.is_nan() || max_abs.is_nan() {
                f64::NAN
            } else {
                max_abs.max(e.abs())
            };
            let envelope = f.coeff[i] * f.magnitude[i];
            let q = if e == 0.0 {
                0.0
            } else if envelope > 0.0 {
                e.abs() / envelope
            } else {
                f64::INFINITY
            };
            if e.is_nan() || e.abs() > envelope {
                outside += 1;
            }
            ratio = if q.is_nan() || ratio.is_nan() {
                f64::NAN
            } else {
                ratio.max(q)
            };
        }
        HighPrecisionStats {
            sums: Sums {
                elements: w.len(),
                num,
                den,
                xy,
                sq,
                max_abs,
                outside,
                ratio,
            },
            pass,
            elements: w.len(),
            rel_err: if den == 0.0 {
                if num == 0.0 {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                (num / den).sqrt()
            },
            calc_diff: if sq == 0.0 { 0.0 } else { 1.0 - 2.0 * xy / sq },
            max_abs_err: max_abs,
            outside_envelope: outside,
            max_envelope_ratio: ratio,
        }
    }

    /// The single walk gives the flattened copies' statistics bit for bit, in every pass, on
    /// outputs near the reference with a NaN, an infinity and an exact match, a tail row, an
    /// empty expert; a missing or ill-shaped output gives no statistics.
    #[test]
    fn one_walk_is_the_flattened_statistics() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let (m, k, n, sizes) = (23, 17, 9, vec![5, 0, 12, 4]);
        let g = sizes.len();
        let mut draw =
            |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(-2.0f32..2.0)).collect() };
        let case = Fp8GemmCase {
            gemm: GroupedGemmCase {
                lhs: Array2::from_shape_vec((m, k), draw(m * k)).unwrap(),
                rhs: Array3::from_shape_vec((g, k, n), draw(g * k * n))
                    .unwrap()
                    .into(),
                group_sizes: sizes,
                dout: Some(Array2::from_shape_vec((m, n), draw(m * n)).unwrap()),
                dtype: Format::F32,
                out_dtype: Format::F32,
                tail: Default::default(),
            },
            recipe: Fp8Recipe::default(),
            given_scales: None,
        };
        let e = Fp8Expected::of(&case, Passes::ALL).unwrap();
        let mut got: GemmOutputs = e.recipe_exact.value.clone().into();
        got.out.as_mut().unwrap().f64_mut()[(3, 2)] = f64::NAN;
        got.dlhs.as_mut().unwrap().f64_mut()[(1, 1)] = f64::INFINITY;
        got.drhs.as_mut().unwrap().f64_mut()[(2, 3, 4)] =
            e.high_precision.value.drhs.as_ref().unwrap()[(2, 3, 4)];
        let hp = &e.high_precision;
        let new = high_precision(&case, Passes::ALL, hp, &got);
        assert_eq!(new.len(), 3);
        assert_eq!(
            format!("{new:?}"),
            format!("{:?}", high_precision_flat(&case, Passes::ALL, hp, &got))
        );
        got.drhs = None;
        got.dlhs = Some(Array2::<f32>::zeros((2, 2)).into());
        assert_eq!(high_precision(&case, Passes::ALL, hp, &got).len(), 1);
    }
}
