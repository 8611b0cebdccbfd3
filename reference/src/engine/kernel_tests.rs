use super::*;
use ndarray::{s, Array2};

/// Small integers: every product and partial sum is exact, so any order must agree with a
/// triple loop bit for bit.
fn int_matrix(rows: usize, cols: usize, seed: usize) -> Array2<f64> {
    Array2::from_shape_fn((rows, cols), |(i, j)| {
        ((i * 7 + j * 13 + seed * 5) % 17) as f64 - 8.0
    })
}

fn naive(a: ArrayView2<f64>, b: ArrayView2<f64>) -> Array2<f64> {
    let (m, k) = a.dim();
    Array2::from_shape_fn((m, b.ncols()), |(i, j)| {
        (0..k).map(|p| a[(i, p)] * b[(p, j)]).sum()
    })
}

/// `a·x` and `a·y` give the same bits, values (`gemm`) and values and magnitudes
/// (`gemm_magnitude`): `x` and `y` hold the same values, in other types or layouts.
fn assert_same_bits<X: Operand, Y: Operand>(
    isa: Isa,
    a: ArrayView2<f64>,
    x: ArrayView2<X>,
    y: ArrayView2<Y>,
    what: &str,
) {
    let (m, n) = (a.nrows(), x.ncols());
    let bits = |z: &Array2<f64>| z.mapv(f64::to_bits);
    let zeros = || Array2::<f64>::zeros((m, n));
    let (mut cx, mut cy, mut sx, mut sy) = (zeros(), zeros(), zeros(), zeros());
    gemm_with(isa, a, x, cx.view_mut());
    gemm_with(isa, a, y, cy.view_mut());
    assert_eq!(bits(&cx), bits(&cy), "{isa:?} {what} values");
    gemm_magnitude_with(isa, a, x, cx.view_mut(), sx.view_mut());
    gemm_magnitude_with(isa, a, y, cy.view_mut(), sy.view_mut());
    assert_eq!(bits(&cx), bits(&cy), "{isa:?} {what} fused values");
    assert_eq!(bits(&sx), bits(&sy), "{isa:?} {what} magnitudes");
}

fn check(isa: Isa, m: usize, k: usize, n: usize) {
    let a = int_matrix(m, k, 1);
    let b = int_matrix(k, n, 2);
    let mut c = Array2::from_elem((m, n), f64::NAN);
    gemm_with(isa, a.view(), b.view(), c.view_mut());
    assert_eq!(c, naive(a.view(), b.view()), "{isa:?} m={m} k={k} n={n}");
}

const EDGES: [usize; 9] = [0, 1, 7, 8, 9, 23, 25, 127, 129];

#[test]
fn edge_sizes_match_triple_loops_on_every_path() {
    for isa in Isa::available() {
        for &m in &EDGES {
            for &n in &EDGES {
                check(isa, m, 5, n);
            }
            check(isa, m, 0, 9);
            check(isa, 9, m, 3);
        }
        // Across KC (256) block edges, with column tails of every kind.
        check(isa, 128, 257, 49);
        check(isa, 257, 9, 25); // across MC (256)
        check(isa, 65, 513, 31);
        check(isa, 129, 128, 129);
    }
}

#[test]
fn strided_and_transposed_operands() {
    for isa in Isa::available() {
        // a transposed (unit row stride), c a column window of a wider array.
        let at = int_matrix(300, 10, 3);
        let b = int_matrix(300, 26, 4);
        let mut wide = Array2::from_elem((10, 40), -1.0);
        gemm_with(isa, at.t(), b.view(), wide.slice_mut(s![.., 5..31]));
        assert_eq!(
            wide.slice(s![.., 5..31]),
            naive(at.t(), b.view()),
            "{isa:?}"
        );
        assert!(wide.slice(s![.., ..5]).iter().all(|v| *v == -1.0));
        assert!(wide.slice(s![.., 31..]).iter().all(|v| *v == -1.0));
        // b transposed: not row-contiguous, the fallback path.
        let bt = int_matrix(26, 300, 5);
        let mut c = Array2::from_elem((10, 26), f64::NAN);
        gemm_with(isa, at.t(), bt.t(), c.view_mut());
        assert_eq!(c, naive(at.t(), bt.t()), "{isa:?} fallback");
        // Only c strided (a transposed output), then c and b both; and b with a negative
        // column stride.
        let mut ct = Array2::from_elem((26, 10), f64::NAN);
        gemm_with(isa, at.t(), b.view(), ct.view_mut().reversed_axes());
        assert_eq!(ct.t(), naive(at.t(), b.view()), "{isa:?} c strided");
        let mut ct = Array2::from_elem((26, 10), f64::NAN);
        gemm_with(isa, at.t(), bt.t(), ct.view_mut().reversed_axes());
        assert_eq!(ct.t(), naive(at.t(), bt.t()), "{isa:?} b and c strided");
        let mut c = Array2::from_elem((10, 26), f64::NAN);
        gemm_with(isa, at.t(), b.slice(s![.., ..;-1]), c.view_mut());
        assert_eq!(
            c,
            naive(at.t(), b.slice(s![.., ..;-1])),
            "{isa:?} b reversed"
        );
        // Negative strides.
        let a = int_matrix(9, 30, 6);
        let mut c = Array2::from_elem((9, 26), f64::NAN);
        gemm_with(
            isa,
            a.slice(s![..;-1, ..]),
            b.slice(s![..30, ..]),
            c.view_mut(),
        );
        assert_eq!(c, naive(a.slice(s![..;-1, ..]), b.slice(s![..30, ..])));
    }
}

/// Values that are not exact: every path stays within `γ(k, 2^-53)·Σ|a·b|` of an
/// exactly-summed (two-sum compensated) reference.
#[test]
fn rounding_stays_inside_the_reference_bound() {
    let (m, k, n) = (13, 700, 27);
    let a = Array2::from_shape_fn((m, k), |(i, p)| ((i * 31 + p * 17) as f64).sin() * 1e3);
    let b = Array2::from_shape_fn((k, n), |(p, j)| ((p * 7 + j * 11) as f64).cos() / 3.0);
    let gamma = crate::format::gamma(k, 2f64.powi(-53));
    for isa in Isa::available() {
        let mut c = Array2::zeros((m, n));
        gemm_with(isa, a.view(), b.view(), c.view_mut());
        for i in 0..m {
            for j in 0..n {
                let (mut hi, mut lo, mut mag) = (0.0f64, 0.0f64, 0.0f64);
                for p in 0..k {
                    let x = a[(i, p)] * b[(p, j)];
                    let err = a[(i, p)].mul_add(b[(p, j)], -x);
                    // TwoSum: t + e == hi + x exactly.
                    let t = hi + x;
                    let bv = t - hi;
                    lo += (hi - (t - bv)) + (x - bv) + err;
                    hi = t;
                    mag += x.abs();
                }
                let exact = hi + lo;
                assert!(
                    (c[(i, j)] - exact).abs() <= gamma * mag,
                    "{isa:?} ({i},{j})"
                );
            }
        }
    }
}

/// Whether `isa`'s magnitudes are the f64 sums (every path but [`Isa::Avx512F32Mag`] and
/// [`Isa::Amx`], whose upper bounds `bf16mag`'s tests check against these same sums).
fn exact_magnitudes(isa: Isa) -> bool {
    !matches!(isa, Isa::Avx512F32Mag | Isa::Amx)
}

/// The fused kernel's values are [`gemm`]'s bit for bit and its magnitudes are [`gemm`] of
/// the absolute values, on every path with f64 magnitudes, on inexact values, edge shapes,
/// across KC and MC blocks, and with `b` transposed.
#[test]
fn magnitudes_are_the_gemm_of_absolute_values() {
    let real = |rows: usize, cols: usize, seed: usize| {
        Array2::from_shape_fn((rows, cols), |(i, j)| {
            ((i * 31 + j * 17 + seed * 7) as f64).sin() * 10f64.powi((i + j) as i32 % 5 - 2)
        })
    };
    let shapes = [
        (1, 1, 1),
        (9, 5, 25),
        (13, 257, 49),
        (257, 9, 23),
        (3, 0, 4),
        (0, 3, 4),
    ];
    for isa in Isa::available() {
        for (m, k, n) in shapes {
            let (a, b) = (real(m, k, 1), real(k, n, 2));
            let mut want = Array2::from_elem((m, n), f64::NAN);
            let mut want_mag = want.clone();
            gemm_with(isa, a.view(), b.view(), want.view_mut());
            gemm_with(
                isa,
                a.mapv(f64::abs).view(),
                b.mapv(f64::abs).view(),
                want_mag.view_mut(),
            );
            let (mut c, mut s) = (Array2::from_elem((m, n), f64::NAN), want.clone());
            s.fill(f64::NAN);
            gemm_magnitude_with(isa, a.view(), b.view(), c.view_mut(), s.view_mut());
            let bits = |x: &Array2<f64>| x.mapv(f64::to_bits);
            assert_eq!(bits(&c), bits(&want), "{isa:?} values {m}x{k}x{n}");
            if exact_magnitudes(isa) {
                assert_eq!(bits(&s), bits(&want_mag), "{isa:?} magnitudes {m}x{k}x{n}");
            }
        }
        // Only the magnitudes strided: the values still come from the kernel, bit for bit.
        let (a, b) = (real(9, 300, 5), real(300, 13, 6));
        let mut want = Array2::zeros((9, 13));
        gemm_with(isa, a.view(), b.view(), want.view_mut());
        let mut want_mag = Array2::zeros((9, 13));
        gemm_with(
            isa,
            a.mapv(f64::abs).view(),
            b.mapv(f64::abs).view(),
            want_mag.view_mut(),
        );
        let (mut c, mut wide) = (Array2::zeros((9, 13)), Array2::from_elem((9, 26), -1.0));
        gemm_magnitude_with(
            isa,
            a.view(),
            b.view(),
            c.view_mut(),
            wide.slice_mut(s![.., ..;2]),
        );
        assert_eq!(c.mapv(f64::to_bits), want.mapv(f64::to_bits), "{isa:?}");
        if exact_magnitudes(isa) {
            assert_eq!(wide.slice(s![.., ..;2]), want_mag, "{isa:?}");
        }
        assert!(wide.slice(s![.., 1..;2]).iter().all(|v| *v == -1.0));
        // b transposed (packed along its columns), exact values.
        let (a, bt) = (int_matrix(10, 30, 3), int_matrix(26, 30, 4));
        let (mut c, mut s) = (Array2::zeros((10, 26)), Array2::zeros((10, 26)));
        gemm_magnitude_with(isa, a.view(), bt.t(), c.view_mut(), s.view_mut());
        assert_eq!(c, naive(a.view(), bt.t()));
        if exact_magnitudes(isa) {
            assert_eq!(
                s,
                naive(a.mapv(f64::abs).view(), bt.t().mapv(f64::abs).view())
            );
        }
    }
}

/// A right operand held in f32 or bf16 gives the bits of the same operand widened to f64
/// first, values and magnitudes, on every path, across KC and MC blocks and column tails, and as a
/// transposed view.
#[test]
fn f32_right_operands_are_widened_exactly() {
    let real32 = |rows: usize, cols: usize, seed: usize| {
        Array2::from_shape_fn((rows, cols), |(i, j)| {
            (((i * 13 + j * 29 + seed) as f32).sin() * 3.0).powi(3)
        })
    };
    for isa in Isa::available() {
        for (m, k, n) in [(3, 7, 5), (257, 300, 49), (9, 1, 25), (17, 256, 1)] {
            let a = real32(m, k, 1).mapv(f64::from);
            let b32 = real32(k, n, 2);
            let shape = format!("{m}x{k}x{n}");
            assert_same_bits(
                isa,
                a.view(),
                b32.view(),
                b32.mapv(f64::from).view(),
                &shape,
            );
            // Held in bf16 (the values cut to bf16 first): the same bits as their f64 copy.
            let b16 = b32.mapv(half::bf16::from_f32);
            let b64 = b16.mapv(f64::from);
            assert!(b64 != b32.mapv(f64::from), "the cut changes values");
            assert_same_bits(isa, a.view(), b16.view(), b64.view(), &(shape + " bf16"));
        }
        // Transposed f32 (packed along its columns), exact values.
        let (a, bt) = (int_matrix(10, 30, 3), int_matrix(26, 30, 4));
        let bt32 = bt.mapv(|x| x as f32);
        let mut c = Array2::zeros((10, 26));
        gemm_with(isa, a.view(), bt32.t(), c.view_mut());
        assert_eq!(c, naive(a.view(), bt.t()));
    }
}

/// A transposed right operand (dgrad's `rhs_gᵀ`), packed by the kernel one band tile at a
/// time in 8 × 8 blocks, gives the bits of the same operand copied into rows first: values
/// and magnitudes, f64 and bf16, across KC (300 = 256 + 44: a block remainder of 4 rows)
/// and MC, with column tiles of 16, 8 and 1 (and 24 on the values' AVX-512 path).
#[test]
fn transposed_right_operands_give_the_bits_of_a_copy() {
    let real = |rows: usize, cols: usize, seed: usize| {
        Array2::from_shape_fn((rows, cols), |(i, j)| {
            ((i * 37 + j * 11 + seed) as f64).sin() * 10f64.powi((i + 2 * j) as i32 % 7 - 3)
        })
    };
    for isa in Isa::available() {
        for (m, k, n) in [(5, 300, 57), (260, 19, 41), (3, 8, 8), (2, 7, 3)] {
            let a = real(m, k, 1);
            let bt = real(n, k, 2);
            let shape = format!("{m}x{k}x{n}");
            // Copied into rows (`to_owned` would keep the transposed layout, and then both
            // sides would go through the same packing).
            let rows = bt.t().as_standard_layout().into_owned();
            assert!(rows.is_standard_layout());
            assert_same_bits(isa, a.view(), bt.t(), rows.view(), &shape);
            let bt16 = bt.mapv(half::bf16::from_f64);
            let rows16 = bt16.mapv(f64::from).t().as_standard_layout().into_owned();
            assert_same_bits(isa, a.view(), bt16.t(), rows16.view(), &(shape + " bf16"));
        }
    }
}

#[test]
fn detection_is_consistent() {
    let all = Isa::available();
    assert_eq!(all.first(), Some(&Isa::Portable));
    assert_eq!(all.last(), Some(&Isa::detect()));
}
