use super::*;
use crate::fp8::{compare_fp8, fp8_precision, Fp8Expected, Fp8Recipe};
use crate::gemm::{GroupedGemmCase, Passes};
use ndarray::Array3;
use rand::{Rng, SeedableRng};

/// One group of 8 rows at K = 7168, fast accumulation, lhs in (-1, 1) (`signed`) or (0, 1),
/// rhs in (0, 1). With signed products the worst-case bound has no teeth, the running form has.
fn case_of(signed: bool) -> Fp8GemmCase {
    let (m, k, n) = (8, 7168, 4);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut draw =
        |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(0.0f32..1.0)).collect() };
    let lhs = draw(m * k)
        .into_iter()
        .map(|x| if signed { 2.0 * x - 1.0 } else { x })
        .collect();
    Fp8GemmCase {
        gemm: GroupedGemmCase {
            lhs: Array2::from_shape_vec((m, k), lhs).unwrap(),
            rhs: Array3::from_shape_vec((1, k, n), draw(k * n))
                .unwrap()
                .into(),
            group_sizes: vec![m],
            dout: None,
            dtype: Format::F32,
            out_dtype: Format::F32,
            tail: Default::default(),
        },
        recipe: Fp8Recipe {
            accumulation: AccumModel::Fast,
            ..Fp8Recipe::default()
        },
        given_scales: None,
    }
}

fn case() -> Fp8GemmCase {
    case_of(true)
}

/// [`case_of`] with positive products and every sum cancelling: the second half of K is the first half negated (lhs)
/// against the same weights, but for its last 32 columns, which are 0. The partial sums climb
/// to about S/2 and come back: the running form's `R` is large, the values small, and the
/// bound admits zero.
fn cancelling() -> Fp8GemmCase {
    let mut c = case_of(false);
    let (k, h) = (7168, 3584);
    let lhs = &mut c.gemm.lhs;
    for r in 0..lhs.nrows() {
        for i in 0..h {
            lhs[(r, h + i)] = if i >= h - 32 { 0.0 } else { -lhs[(r, i)] };
        }
    }
    let w = c.gemm.rhs.f32().into_owned();
    let mut w = w.into_shape_with_order((k, 4)).unwrap();
    for i in 0..h {
        for col in 0..4 {
            w[(h + i, col)] = w[(i, col)];
        }
    }
    c.gemm.rhs = w.into_shape_with_order((1, k, 4)).unwrap().into();
    c
}

const FWD: Passes = Passes {
    fwd: true,
    dgrad: false,
    wgrad: false,
};

fn compare(c: &Fp8GemmCase, out: &Array2<f64>) -> crate::fp8::Fp8Report {
    let e = Fp8Expected::of(c, FWD).unwrap();
    let got = GemmOutputs {
        out: Some(out.clone().into()),
        ..Default::default()
    };
    compare_fp8(c, FWD, &fp8_precision(c), &e, &got)
}

/// The model-based check of group 0, called directly.
fn model_of(c: &Fp8GemmCase, out: &Array2<f64>) -> ModelGroupCheck {
    let e = Fp8Expected::of(c, FWD).unwrap();
    let got = GemmOutputs {
        out: Some(out.clone().into()),
        ..Default::default()
    };
    let ops = super::super::quantize_operands(c, FWD);
    model_check(c, &ops, &[Pass::Fwd], &e.recipe_exact.value, &got).groups[0].clone()
}

fn nominal(c: &Fp8GemmCase) -> Array2<f64> {
    let ops = super::super::quantize_operands(c, FWD);
    let out = Model::new(c, &ops)
        .block(Pass::Fwd, 0, AccumVariant::NOMINAL)
        .unwrap();
    Array2::from_shape_vec((8, 4), out).unwrap()
}

/// At K = 7168 the running form decides: the model's own output passes with teeth, zeros
/// and half the output fail it, and the model-based check does not run.
#[test]
fn the_running_bound_decides_at_k_7168() {
    let c = case();
    let out = nominal(&c);
    let r = compare(&c, &out);
    assert!(
        r.recipe_exact.passed(),
        "{:?}",
        r.recipe_exact.first_failure()
    );
    assert!(r.recipe_exact.inconclusive().is_none() && r.model.is_none());
    assert!(
        r.recipe_exact.passes[0].zero_ratio > 10.0,
        "{:?}",
        r.recipe_exact.passes
    );
    // The worst-case bound alone would have admitted zeros.
    let worst = crate::fp8::Fp8Bound {
        accumulation: AccumModel::Fast,
        output: Format::F32,
    }
    .at_len(7168);
    let e = Fp8Expected::of(&c, FWD).unwrap();
    let y = e.recipe_exact.value.out.as_ref().unwrap();
    let mags = &e.recipe_exact.magnitude;
    assert!(mags.out.is_some());
    let s = crate::fp8::reference_from_operands(
        &Fp8GemmCase {
            recipe: Fp8Recipe::default(),
            ..c.clone()
        },
        &super::super::quantize_operands(&c, FWD),
        FWD,
    )
    .magnitude
    .out
    .unwrap();
    // Signed products: |y| is about Σ|a·b|/√K·(4/3), so the worst case (2.8% of Σ|a·b|)
    // holds most elements to more than their value and barely has teeth; the running form
    // holds them to a few percent of it.
    let teeth = y
        .iter()
        .zip(&s)
        .map(|(y, s)| y.abs() / worst.at(*s, *y))
        .fold(0.0f64, f64::max);
    let loose = y
        .iter()
        .zip(&s)
        .filter(|(y, s)| worst.at(**s, **y) >= y.abs())
        .count();
    assert!(teeth < 2.0 && loose * 2 > y.len(), "{teeth} {loose}");
    for bad in [
        out.mapv(|_| 0.0),
        out.mapv(|v| v / 2.0),
        out.mapv(|v| v * 1.05),
    ] {
        let r = compare(&c, &bad);
        assert!(!r.recipe_exact.passed() && r.model.is_none());
    }
    // The exact sums (f32 accumulation, or none) pass too: a kernel that accumulates better
    // than the model is within the bound.
    assert!(compare(&c, y).recipe_exact.passed());
}

/// The outputs of other plausible accumulators (13 and 15 bits, k-blocks of 16, and the
/// covering one: 13 bits, k-blocks of 4) are never a FAIL: within the nominal bound they pass,
/// beyond it but within the covering bound they are INCONCLUSIVE. The all-zero output fails
/// beyond the covering bound too.
#[test]
fn plausible_accumulators_are_never_a_failure() {
    use crate::op::Comparison;
    let c = case();
    let ops = super::super::quantize_operands(&c, FWD);
    let model = Model::new(&c, &ops);
    let mut inconclusive = 0;
    for v in AccumVariant::SPREAD
        .into_iter()
        .chain([AccumVariant::COVER])
    {
        let out = Array2::from_shape_vec((8, 4), model.block(Pass::Fwd, 0, v).unwrap()).unwrap();
        let r = compare(&c, &out);
        assert!(r.passed(), "{v:?}: {:?}", r.first_failure());
        if r.inconclusive().is_some() {
            assert!(r.covered(), "{v:?}");
            inconclusive += 1;
        }
    }
    // The covering accumulator itself is beyond the nominal bound here.
    assert!(inconclusive >= 1);
    let zeros = compare(&c, &Array2::zeros((8, 4)));
    assert!(!zeros.passed() && !zeros.covered());
    let cover = zeros
        .cover
        .as_ref()
        .expect("judged against the covering bound");
    assert!(!cover.passed());
    assert!(zeros
        .first_failure()
        .unwrap()
        .contains("beyond the covering bound"));
}

/// Called directly, the model-based check puts the model at distance 0, within a threshold
/// made of the variants' spread, and zeros, half the output and NaN outside it.
#[test]
fn the_model_itself_is_at_distance_zero_and_zeros_fail() {
    let c = case();
    let out = nominal(&c);
    let g = model_of(&c, &out);
    assert_eq!(g.distance, 0.0);
    assert!(
        g.spread > 0.002,
        "13 bits or blocks of 16 move a K = 7168 sum: {g:?}"
    );
    let u = Format::F32.info().unit_roundoff();
    assert_eq!(g.threshold, 2.0 * g.spread + 2.0 * u + 2f64.powi(-22));
    assert!(!g.failed());
    let g = model_of(&c, &out.mapv(|_| 0.0));
    assert!(g.failed() && g.distance == g.zero_distance, "{g:?}");
    assert!(model_of(&c, &out.mapv(|v| v / 2.0)).failed());
    let mut nan = out.clone();
    nan[(0, 0)] = f64::NAN;
    let g = model_of(&c, &nan);
    assert!(g.distance.is_infinite() && g.failed());
}

/// Where sums cancel, the running form admits zero: the comparison is INCONCLUSIVE and the
/// model-based check runs (it can fail an answer, never pass one); with promotion every 128
/// products the bound has teeth again and the check does not run.
#[test]
fn it_runs_only_where_the_running_bound_admits_zero() {
    let c = cancelling();
    let out = nominal(&c);
    let r = compare(&c, &out);
    assert!(
        r.recipe_exact.passed(),
        "{:?}",
        r.recipe_exact.first_failure()
    );
    assert!(
        r.recipe_exact.inconclusive().is_some(),
        "{:?}",
        r.recipe_exact.passes
    );
    let m = r.model.expect("the model-based check ran");
    assert!(m.failure_line().is_none() && m.undecided_line().is_some());
    let mut p = cancelling();
    p.recipe.accumulation = AccumModel::FastPromote;
    let e = Fp8Expected::of(&p, FWD).unwrap();
    let exact = e.recipe_exact.value.out.clone().unwrap();
    let r = compare(&p, &exact);
    assert!(r.model.is_none() && r.recipe_exact.inconclusive().is_none());
}

impl Model<'_> {
    /// The model one element at a time, as it was before [`AccumModel::dot_lanes`]: the
    /// oracle of `lanes_are_the_element_by_element_model`.
    fn block_scalar(&self, pass: Pass, e: usize, v: AccumVariant) -> Option<Vec<f64>> {
        let g = &self.case.gemm;
        let (k, n) = (g.k(), g.n());
        let off = g.offsets();
        let (lo, hi) = (off[e], off[e + 1]);
        let (l, r) = (&self.lhs, &self.rhs);
        let mut out = Vec::new();
        match pass {
            Pass::Fwd => {
                let sb = if k > 0 { r.sinv[e * k] } else { 1.0 };
                for row in lo..hi {
                    for c in 0..n {
                        let sum = self
                            .acc
                            .dot_variant(v, k, |i| l.vals[(row, i)] * r.vals[(e * k + i, c)]);
                        out.push(self.finish(sum, l.sinv[row], sb));
                    }
                }
            }
            Pass::Dgrad => {
                let d = self.dout.as_ref()?;
                for row in lo..hi {
                    for c in 0..k {
                        let sum = self
                            .acc
                            .dot_variant(v, n, |j| d.vals[(row, j)] * r.vals[(e * k + c, j)]);
                        out.push(self.finish(sum, d.sinv[row], r.sinv[e * k + c]));
                    }
                }
            }
            Pass::Wgrad => {
                let (lc, dc) = (&self.lhs_col, self.dout_col.as_ref()?);
                for a in 0..k {
                    for b in 0..n {
                        let sum = self.acc.dot_variant(v, hi - lo, |i| {
                            lc.vals[(a, lo + i)] * dc.vals[(b, lo + i)]
                        });
                        out.push(if hi > lo {
                            self.finish(sum, lc.sinv[lo], dc.sinv[lo])
                        } else {
                            0.0
                        });
                    }
                }
            }
        }
        Some(out)
    }
}

/// The lane-wise model gives the element-by-element model's bits for every pass, every
/// accumulation model and variant, on groups that are empty, shorter and longer than the
/// lanes and the promotion interval, with column counts that leave a remainder.
#[test]
fn lanes_are_the_element_by_element_model() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    for (m, k, n, sizes) in [
        (40, 37, 19, vec![0, 17, 3, 0, 20]),
        (9, 300, 33, vec![9]),
        (6, 16, 16, vec![2, 0, 4]),
    ] {
        let g = sizes.len();
        let mut draw =
            |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(-2.0f32..3.0)).collect() };
        for accumulation in [AccumModel::Exact, AccumModel::Fast, AccumModel::FastPromote] {
            let c = Fp8GemmCase {
                gemm: GroupedGemmCase {
                    lhs: Array2::from_shape_vec((m, k), draw(m * k)).unwrap(),
                    rhs: Array3::from_shape_vec((g, k, n), draw(g * k * n))
                        .unwrap()
                        .into(),
                    group_sizes: sizes.clone(),
                    dout: Some(Array2::from_shape_vec((m, n), draw(m * n)).unwrap()),
                    dtype: Format::F32,
                    out_dtype: Format::Bf16,
                    tail: Default::default(),
                },
                recipe: Fp8Recipe {
                    accumulation,
                    ..Fp8Recipe::default()
                },
                given_scales: None,
            };
            let ops = super::super::quantize_operands(&c, Passes::ALL);
            let model = Model::new(&c, &ops);
            for v in std::iter::once(AccumVariant::NOMINAL).chain(AccumVariant::SPREAD) {
                for pass in Pass::ALL {
                    for e in 0..g {
                        let bits = |b: Option<Vec<f64>>| {
                            b.map(|b| b.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                        };
                        let lanes = model.block(pass, e, v);
                        assert!(lanes.is_some(), "{pass}: every operand is there");
                        assert_eq!(
                            bits(lanes),
                            bits(model.block_scalar(pass, e, v)),
                            "{accumulation:?} {v:?} {pass} group {e} of {sizes:?}"
                        );
                    }
                }
            }
        }
    }
}
