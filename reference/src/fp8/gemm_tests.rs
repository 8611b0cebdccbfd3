use super::*;
use crate::fp8::Fp8Recipe;
use crate::gemm::GroupedGemmCase;
use ndarray::{array, Array2};

fn case() -> Fp8GemmCase {
    // Two groups (rows 0-1, row 2), row 3 dropped; experts of very different magnitude.
    let lhs = array![[1.0f32, 2.0], [3.0, -4.0], [0.001, 0.002], [9.0, 9.0]];
    let rhs = Array3::from_shape_vec((2, 2, 1), vec![1.0, -1.0, 1000.0, 3000.0]).unwrap();
    let dout = array![[1.0f32], [0.5], [-2.0], [7.0]];
    Fp8GemmCase {
        gemm: GroupedGemmCase {
            lhs,
            rhs: rhs.into(),
            group_sizes: vec![2, 1],
            dout: Some(dout),
            dtype: Format::F32,
            out_dtype: Format::F32,
            tail: Default::default(),
        },
        recipe: Fp8Recipe::default(),
        given_scales: None,
    }
}

/// Known answers for [`Fp8Bound::at_len`], every term written from the module
/// documentation with literal constants (`γ(n, u) = n·u / (1 - n·u)`, `γ2 = γ(2, 2^-24)`,
/// `u_out`, `η_out` and `η_f32 = 2^-149`), for each accumulation model and output format:
/// a change to any coefficient fails here.
#[test]
fn bound_known_answers() {
    let close = |got: f64, want: f64| {
        assert!(
            (got - want).abs() <= 1e-13 * want.abs(),
            "got {got:e}, want {want:e}"
        )
    };
    let g = |n: f64, u: f64| n * u / (1.0 - n * u);
    let u32_ = 2f64.powi(-24);
    let u_fast = 2f64.powi(-13) + 2f64.powi(-24) + 2f64.powi(-37);
    let g2 = 2.0 * u32_ / (1.0 - 2.0 * u32_);
    // (output, u_out, η_out)
    let outputs = [
        (Format::F32, 2f64.powi(-24), 2f64.powi(-149)),
        (Format::Bf16, 2f64.powi(-8), 2f64.powi(-133)),
        (Format::F16, 2f64.powi(-11), 2f64.powi(-24)),
    ];
    for (output, u_out, eta_out) in outputs {
        for n in [1usize, 16, 200] {
            let nf = n as f64;
            // Worst cases (reference/src/fp8/accum.rs): J = ⌈n/32⌉ additions of k-blocks
            // of b' = min(n, 32) products; under promotion J_c = ⌈min(n, 128)/32⌉ per
            // chunk and nc = ⌈n/128⌉ chunks.
            let inner = g(nf.min(32.0) - 1.0, u32_);
            let j = (nf / 32.0).ceil();
            let jc = (nf.min(128.0) / 32.0).ceil();
            let nc = (nf / 128.0).ceil();
            let c = [
                (AccumModel::Exact, g(nf, u32_)),
                (
                    AccumModel::Fast,
                    (1.0 + g(j, u_fast)) * (inner + j * u_fast),
                ),
                (
                    AccumModel::FastPromote,
                    (1.0 + g(nc, u32_)) * (1.0 + g(jc, u_fast)) * (inner + jc * u_fast)
                        + g(nc, u32_),
                ),
            ];
            for (accumulation, c_acc) in c {
                let b = Fp8Bound {
                    accumulation,
                    output,
                }
                .at_len(n);
                let what = format!("{accumulation} -> {output}, n = {n}");
                let want = c_acc * (1.0 + g2) * (1.0 + u_out) + 3.0 * g(nf, 2f64.powi(-53));
                assert!(
                    (b.coeff_magnitude - want).abs() <= 1e-13 * want,
                    "{what}: {} vs {want}",
                    b.coeff_magnitude
                );
                close(b.coeff_value, u_out + g2 * (1.0 + u_out));
                assert_eq!(b.floor, eta_out / 2.0, "{what}");
                assert_eq!(b.underflow, 2.0 * 2f64.powi(-149) * (1.0 + u_out), "{what}");
                assert_eq!(b.depth, n, "{what}");
            }
        }
    }
    // One worked number: exact f32 accumulation, f32 output, K = 16, S = 1, y = 0.5:
    // γ(16, 2^-24)(1 + γ2)(1 + 2^-24) + 3γ(16, 2^-53) + (2^-24 + γ2(1 + 2^-24))·0.5
    //   + 2^-150 + 2·2^-149(1 + 2^-24) = 1.0430823795825574e-6.
    let b = Fp8Bound {
        accumulation: AccumModel::Exact,
        output: Format::F32,
    }
    .at_len(16);
    close(b.at(1.0, 0.5), 1.0430823795825574e-6);
    // No products (n = 0): no accumulation error, and an exact 0 is demanded.
    let b0 = Fp8Bound {
        accumulation: AccumModel::Exact,
        output: Format::F32,
    }
    .at_len(0);
    assert_eq!(b0.coeff_magnitude, 0.0);
    assert_eq!(b0.at(0.0, 0.0), 0.0);
}

/// Known answers for the running form's coefficients ([`Fp8Bound::effective`]), from the
/// module documentation of `super::running` with literal constants: `k_r = r·(1 + γ2)(1 +
/// u_out)·(1 + γ(T, 2^-53))` and `k_s = s·(1 + γ2)(1 + u_out) + 3γ(n, 2^-53) + k_r'·T·γ(n +
/// 1, 2^-53)` (`k_r'` without its last factor), `T = ⌈n/32⌉ + ⌈n/chunk⌉`; the judged bound
/// takes the magnitude with coefficient 1.
#[test]
fn running_form_known_answers() {
    let g = |n: f64, u: f64| n * u / (1.0 - n * u);
    let (u32_, u64_) = (2f64.powi(-24), 2f64.powi(-53));
    let u_fast = 2f64.powi(-13) + 2f64.powi(-24) + 2f64.powi(-37);
    let g2 = g(2.0, u32_);
    let u_out = 2f64.powi(-8);
    let scale = (1.0 + g2) * (1.0 + u_out);
    let n = 7168usize;
    let nf = n as f64;
    let bound = Fp8Bound {
        accumulation: AccumModel::Fast,
        output: Format::Bf16,
    };
    let (ks, kr) = bound.effective(n);
    let grow = 1.0 + g(224.0, u_fast);
    let terms = 224.0 + 1.0;
    let kr_want = grow * u_fast * scale;
    assert!((kr - kr_want * (1.0 + g(terms, u64_))).abs() <= 1e-13 * kr);
    let ks_want =
        grow * g(31.0, u32_) * scale + 3.0 * g(nf, u64_) + kr_want * terms * g(nf + 1.0, u64_);
    assert!((ks - ks_want).abs() <= 1e-13 * ks, "{ks:e} vs {ks_want:e}");
    let judged = bound.judged(n);
    assert_eq!(judged.coeff_magnitude, 1.0);
    assert_eq!(judged.coeff_value, bound.at_len(n).coeff_value);
    assert!(bound.at_len(n).coeff_magnitude > 0.028);
    // Exact accumulation is judged in S, as before.
    let exact = Fp8Bound {
        accumulation: AccumModel::Exact,
        output: Format::Bf16,
    };
    assert_eq!(exact.judged(n), exact.at_len(n));
    // The effective magnitude: 0 where S = 0, S where the running form is infinite.
    assert_eq!(effective_magnitude(ks, kr, 0.0, 0.0), 0.0);
    assert_eq!(effective_magnitude(f64::INFINITY, kr, 2.0, 5.0), 2.0);
    let m = effective_magnitude(ks, kr, 2.0, 5.0);
    assert!(m >= ks * 2.0 + kr * 5.0 && m <= (ks * 2.0 + kr * 5.0) * (1.0 + 1e-15));
}

#[test]
fn reference_is_gemm_of_dequantised_values() {
    let c = case();
    let r = fp8_reference(&c, Passes::ALL).unwrap();
    let ops = quantize_operands(&c, Passes::ALL);
    assert_eq!(ops.lhs.scale, vec![112.0, 448.0 / 0.002]);
    assert_eq!(ops.rhs.scale, vec![448.0, 448.0 / 3000.0]);
    assert_eq!(ops.dout.as_ref().unwrap().scale, vec![57344.0, 28672.0]);
    let x = ops.lhs.dequantize();
    let out = r.value.out.unwrap();
    // Group 1 (row 2) uses expert 1; the small values round-trip within E4M3 precision.
    let w = ops.rhs.dequantize();
    assert_eq!(out[(2, 0)], x[(2, 0)] * w[(2, 0)] + x[(2, 1)] * w[(3, 0)]);
    assert_eq!(out.row(3).to_vec(), vec![0.0]);
    let drhs = r.value.drhs.unwrap();
    let d = ops.dout.unwrap().dequantize();
    assert_eq!(drhs[(1, 0, 0)], x[(2, 0)] * d[(2, 0)]);
    // dgrad: row 2 (group 1) against expert 1's rows of rhs, N = 1.
    let dlhs = r.value.dlhs.unwrap();
    assert_eq!(dlhs[(2, 0)], d[(2, 0)] * w[(2, 0)]);
    assert_eq!(dlhs[(2, 1)], d[(2, 0)] * w[(3, 0)]);
    assert_eq!(dlhs.row(3).to_vec(), vec![0.0, 0.0]);
    assert!(r.magnitude.out.unwrap().iter().all(|v| *v >= 0.0));
    let _ = Array2::<f64>::zeros((1, 1));
}
