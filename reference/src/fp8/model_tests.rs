use super::*;
use crate::fp8::{compare_fp8, fp8_precision, Fp8Expected, Fp8Recipe};
use crate::gemm::{GroupedGemmCase, Passes};
use ndarray::Array3;
use rand::{Rng, SeedableRng};

/// One group of 8 rows at K = 7168 with positive products, fast accumulation: the
/// per-element bound has no teeth.
fn case() -> Fp8GemmCase {
    let (m, k, n) = (8, 7168, 4);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut draw =
        |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(0.0f32..1.0)).collect() };
    Fp8GemmCase {
        gemm: GroupedGemmCase {
            lhs: Array2::from_shape_vec((m, k), draw(m * k)).unwrap(),
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

fn check(c: &Fp8GemmCase, got: &GemmOutputs) -> (crate::fp8::Fp8Report, ModelGroupCheck) {
    let fwd = Passes {
        fwd: true,
        dgrad: false,
        wgrad: false,
    };
    let e = Fp8Expected::of(c, fwd).unwrap();
    let r = compare_fp8(c, fwd, &fp8_precision(c), &e, got);
    let m = r.model.as_ref();
    let g = m.unwrap_or_else(|| panic!("the bound admits zeros: {:?}", r.recipe_exact.passes));
    let g = g.groups[0].clone();
    (r, g)
}

#[test]
fn the_model_itself_is_at_distance_zero_and_zeros_fail() {
    let c = case();
    let fwd = Passes {
        fwd: true,
        dgrad: false,
        wgrad: false,
    };
    let ops = super::super::quantize_operands(&c, fwd);
    let nominal = Model::new(&c, &ops)
        .block(Pass::Fwd, 0, AccumVariant::NOMINAL)
        .unwrap();
    let out = Array2::from_shape_vec((8, 4), nominal).unwrap();
    let (r, g) = check(
        &c,
        &GemmOutputs {
            out: Some(out.clone().into()),
            ..Default::default()
        },
    );
    assert!(r.recipe_exact.passed() && r.recipe_exact.inconclusive().is_some());
    assert_eq!(g.distance, 0.0);
    assert!(
        g.spread > 0.05,
        "13 bits or blocks of 32 move a K = 7168 sum: {g:?}"
    );
    let u = Format::F32.info().unit_roundoff();
    assert_eq!(g.threshold, 2.0 * g.spread + 2.0 * u + 2f64.powi(-22));
    assert!(!g.failed());
    // Zeros: inside the per-element bound, outside the model check's threshold.
    let (r, g) = check(
        &c,
        &GemmOutputs {
            out: Some(out.mapv(|_| 0.0).into()),
            ..Default::default()
        },
    );
    assert!(r.recipe_exact.passed(), "the worst-case bound admits zeros");
    assert!(g.failed() && g.distance == g.zero_distance, "{g:?}");
    assert!(r
        .model
        .unwrap()
        .failure_line()
        .unwrap()
        .contains("fwd group 0"));
    // Half the output: also further from the model than any plausible accumulator.
    let (_, g) = check(
        &c,
        &GemmOutputs {
            out: Some(out.mapv(|v| v / 2.0).into()),
            ..Default::default()
        },
    );
    assert!(g.failed(), "{g:?}");
    // NaN in the output (the per-element comparison fails it first): infinitely far.
    let mut nan = out.clone();
    nan[(0, 0)] = f64::NAN;
    let e = Fp8Expected::of(&c, fwd).unwrap();
    let got = GemmOutputs {
        out: Some(nan.into()),
        ..Default::default()
    };
    let m = model_check(&c, &ops, &[Pass::Fwd], &e.recipe_exact.value, &got);
    assert!(m.groups[0].distance.is_infinite() && m.groups[0].failed());
}

#[test]
fn it_does_not_run_where_the_bound_has_teeth() {
    let mut c = case();
    c.recipe.accumulation = AccumModel::FastPromote;
    let fwd = Passes {
        fwd: true,
        dgrad: false,
        wgrad: false,
    };
    let e = Fp8Expected::of(&c, fwd).unwrap();
    let got = GemmOutputs {
        out: e.recipe_exact.value.out.clone().map(Into::into),
        ..Default::default()
    };
    let r = compare_fp8(&c, fwd, &fp8_precision(&c), &e, &got);
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
