use ndarray::{s, Array2, ArrayView2};

use super::*;
use crate::engine::{gemm_magnitude_with, gemm_with, Isa};

/// The paths with bf16 magnitudes this CPU runs: f32 sums in the AVX-512 register tile, and AMX
/// tiles ([`super::super::amx`]), which share this module's bound and rules. A missing one prints
/// one SKIPPED line (the tests pass without it: the f64 path they stand beside is tested
/// everywhere). In unit tests they run whatever the shape ([`pays`]).
fn paths(test: &str) -> Vec<Isa> {
    let wanted = [
        (Isa::Avx512F32Mag, "AVX-512 f32 magnitudes"),
        (Isa::Amx, "AMX-BF16 tiles, or the permission to use them"),
    ];
    let mut here = vec![];
    for (isa, what) in wanted {
        if Isa::available().contains(&isa) {
            here.push(isa);
        } else {
            eprintln!("SKIPPED {test} on {isa:?}: this CPU has no {what} (the f64 magnitudes ran instead)");
        }
    }
    here
}

/// `Σ_p |a[i, p]|·|b[p, j]|` in f64, and the most it can be below the exact sum's
/// relative: `γ(k, 2^-53)`.
fn exact_magnitudes(a: ArrayView2<f64>, b: ArrayView2<f64>) -> (Array2<f64>, f64) {
    let k = a.ncols();
    let s = Array2::from_shape_fn((a.nrows(), b.ncols()), |(i, j)| {
        (0..k).map(|p| (a[(i, p)] * b[(p, j)]).abs()).sum()
    });
    (s, gamma(k, 2f64.powi(-53)))
}

/// `isa`'s values and magnitudes of `a·b`.
fn product<B: Operand>(
    isa: Isa,
    a: ArrayView2<f64>,
    b: ArrayView2<B>,
) -> (Array2<f64>, Array2<f64>) {
    let nan = || Array2::from_elem((a.nrows(), b.ncols()), f64::NAN);
    let (mut c, mut s) = (nan(), nan());
    gemm_magnitude_with(isa, a, b, c.view_mut(), s.view_mut());
    (c, s)
}

/// `isa` gives the f64 path's bits, values and magnitudes: it handed the product over.
fn assert_f64_path<B: Operand>(isa: Isa, a: ArrayView2<f64>, b: ArrayView2<B>, what: &str) {
    let bits = |(c, s): (Array2<f64>, Array2<f64>)| (c.mapv(f64::to_bits), s.mapv(f64::to_bits));
    let (got, want) = (bits(product(isa, a, b)), bits(product(Isa::Avx512, a, b)));
    assert_eq!(got.0, want.0, "{what}: values");
    assert_eq!(got.1, want.1, "{what}: magnitudes");
}

/// `x` with the element at `at` replaced by `v`.
fn with(x: &Array2<f64>, at: (usize, usize), v: f64) -> Array2<f64> {
    let mut x = x.clone();
    x[at] = v;
    x
}

/// Runs `isa` on `a·b` (b as `bv`, any type or layout) and checks: the values are the
/// f64 kernel's bits; every magnitude is at least the exact `S` and at most `S` times `over`
/// (the rounding up of the operands) times `F²` (the f32 sums may round up as much as `F`
/// covers them rounding down), and the f64 sum's own error.
fn check_against<B: Operand>(
    isa: Isa,
    a: ArrayView2<f64>,
    b: ArrayView2<f64>,
    bv: ArrayView2<B>,
    over: f64,
    what: &str,
) {
    let (m, n) = (a.nrows(), b.ncols());
    let k = a.ncols();
    let mut want = Array2::zeros((m, n));
    gemm_with(Isa::Avx512, a, b, want.view_mut());
    let (c, s) = product(isa, a, bv);
    let what = format!("{what} on {isa:?}");
    assert_eq!(
        c.mapv(f64::to_bits),
        want.mapv(f64::to_bits),
        "{what}: values"
    );
    let (exact, g) = exact_magnitudes(a, b);
    let f = inflation(k);
    for ((i, j), &x) in s.indexed_iter() {
        let e = exact[(i, j)];
        assert!(
            x >= e * (1.0 + g),
            "{what} ({i}, {j}): {x:e} below S = {e:e}"
        );
        assert!(
            x <= e * (1.0 + g) * over * f * f,
            "{what} ({i}, {j}): {x:e} too far above S = {e:e}"
        );
        assert_eq!(
            x == 0.0,
            e == 0.0,
            "{what} ({i}, {j}): zero iff every product is"
        );
    }
}

/// Magnitudes of order 1 spread over a few binades, with exact zeros, in bf16 (`cut`) or not.
fn values(rows: usize, cols: usize, seed: u64, cut: bool) -> Array2<f64> {
    Array2::from_shape_fn((rows, cols), |(i, j)| {
        let h = (i as u64 * 0x9e37_79b9 + j as u64 * 0x85eb_ca6b + seed * 0xc2b2_ae35) % 1_000_003;
        if h.is_multiple_of(17) {
            return 0.0;
        }
        let x = ((h as f64) * 0.618_033_988_75).fract() * 2.0 - 1.0;
        let x = x * 2f64.powi((h % 7) as i32 - 3);
        if cut {
            f64::from(half::bf16::from_f64(x))
        } else {
            x
        }
    })
}

/// The largest factor rounding two operands up to bf16 can add: `(1 + 2^-7)²`.
const UP: f64 = (1.0 + 1.0 / 128.0) * (1.0 + 1.0 / 128.0);

#[test]
fn magnitudes_bound_the_sum_from_above_and_closely() {
    // Odd depths (a pair padded with 0), across KC (256) and MC (256), column tails (n % 16:
    // the f64 path's on AVX-512 f32 magnitudes, padded tiles on AMX), an odd number of column tiles, a
    // single row and column.
    let shapes = [
        (1, 1, 1),
        (7, 3, 16),
        (13, 257, 49),
        (260, 61, 33),
        (6, 600, 32),
        (5, 2, 15),
    ];
    for isa in paths("magnitudes_bound_the_sum_from_above_and_closely") {
        for (m, k, n) in shapes {
            for cut in [false, true] {
                let (a, b) = (values(m, k, 1, cut), values(k, n, 2, cut));
                let over = if cut { 1.0 } else { UP };
                let what = format!("{m}x{k}x{n} bf16={cut}");
                let (av, bv) = (a.view(), b.view());
                check_against(isa, av, bv, bv, over, &what);
                // b transposed (dgrad's layout), held in f64, f32 and bf16, both ways.
                let bt = b.t().as_standard_layout().into_owned();
                check_against(isa, av, bv, bt.t(), over, &format!("{what} transposed"));
                let (b32, b32t) = (b.mapv(|x| x as f32), bt.mapv(|x| x as f32));
                let b32v = b32.mapv(f64::from);
                check_against(
                    isa,
                    av,
                    b32v.view(),
                    b32.view(),
                    over,
                    &format!("{what} f32"),
                );
                let what_t = format!("{what} f32 transposed");
                check_against(isa, av, b32v.view(), b32t.t(), over, &what_t);
                if cut {
                    let (b16, b16t) = (b.mapv(half::bf16::from_f64), bt.mapv(half::bf16::from_f64));
                    check_against(isa, av, bv, b16.view(), 1.0, &format!("{what} bf16 held"));
                    let what_t = format!("{what} bf16 held transposed");
                    check_against(isa, av, bv, b16t.t(), 1.0, &what_t);
                }
            }
        }
    }
}

/// Sums whose f32 rounding is large: 2048 terms just above 1 in bf16, where each step loses
/// its low bits. Without the factor `F` (or with `|x|` rounded to nearest instead of up) the
/// magnitudes fall below `S`.
#[test]
fn long_sums_need_the_inflation() {
    let k = 2048;
    let a = Array2::from_shape_fn((6, k), |(i, p)| 1.0 + ((i + 3 * p) % 5) as f64 / 128.0);
    let b = Array2::from_shape_fn((k, 16), |(p, j)| 1.0 + ((p * 7 + j) % 3) as f64 / 128.0);
    // Just above a bf16: rounded up, never to nearest.
    let above = a.mapv(|x| x * (1.0 + 2f64.powi(-20)));
    for isa in paths("long_sums_need_the_inflation") {
        check_against(isa, a.view(), b.view(), b.view(), 1.0, "long");
        check_against(isa, above.view(), b.view(), b.view(), UP, "long, not bf16");
    }
}

/// Operands outside step 2's range go to the f64 path: the magnitudes are then its bits.
#[test]
fn out_of_range_operands_take_the_f64_path() {
    let base = values(9, 40, 3, false);
    let b = values(40, 32, 4, false);
    let tiny = base.mapv(|x| x * 1e-20); // products with b near 1e-20: in range
    let cases = [
        ("products under 2^-126", tiny.clone(), b.mapv(|x| x * 1e-20)),
        ("subnormal in f32", base.mapv(|x| x * 1e-40), b.clone()),
        (
            "sums past f32",
            base.mapv(|x| x * 1e20),
            b.mapv(|x| x * 1e19),
        ),
        ("an infinity", with(&base, (2, 3), f64::INFINITY), b.clone()),
        ("a NaN", base.clone(), with(&b, (5, 31), f64::NAN)),
    ];
    for isa in paths("out_of_range_operands_take_the_f64_path") {
        for (what, a, b) in &cases {
            assert_f64_path(isa, a.view(), b.view(), &format!("{what} on {isa:?}"));
        }
        // In range again: the path itself (not the f64 bits, which it does not reproduce).
        let (_, s) = product(isa, tiny.view(), b.view());
        let (_, s64) = product(Isa::Avx512, tiny.view(), b.view());
        assert_ne!(s, s64, "in range, {isa:?} ran");
        check_against(
            isa,
            tiny.view(),
            b.view(),
            b.view(),
            UP,
            "tiny but in range",
        );
    }
}

#[test]
fn only_wide_products_take_the_path_outside_tests() {
    assert!(pays(1, 1), "unit tests run it on every shape");
    assert!(worth_it(8, 256) && worth_it(4096, 7168));
    // Fast verification's sampled columns (a few dozen) and rows, and an expert of 7 rows.
    assert!(!worth_it(4096, 40) && !worth_it(7, 2048) && !worth_it(40, 255));
}

#[test]
fn certification_limits() {
    let r = |lo: f64, hi: f64| Range {
        lo: up(lo),
        hi: up(hi),
    };
    let one = r(1.0, 1.0);
    assert!(certified(one, one, 1000));
    assert!(
        certified(Range::EMPTY, one, 1000),
        "all zero: nothing to flush"
    );
    // 2^-63 · 2^-63 = 2^-126: the smallest product kept; one binade less is refused.
    assert!(certified(
        r(2f64.powi(-63), 1.0),
        r(2f64.powi(-63), 1.0),
        10
    ));
    assert!(!certified(
        r(2f64.powi(-64), 1.0),
        r(2f64.powi(-63), 1.0),
        10
    ));
    // A subnormal input (bf16 has f32's exponent range) is refused whatever it multiplies.
    assert!(!certified(
        r(2f64.powi(-127), 1.0),
        r(1.0, 2f64.powi(100)),
        10
    ));
    // k·max·max < 2^127.
    assert!(certified(one, r(1.0, 2f64.powi(100)), 1 << 20));
    assert!(!certified(r(1.0, 2f64.powi(64)), r(1.0, 2f64.powi(63)), 1));
    assert!(!certified(one, r(1.0, f64::INFINITY), 1));
    assert!(!certified(one, r(1.0, f64::NAN), 1));
    // (k + 1)·2^-23 <= 1/2.
    assert!(certified(one, one, (1 << 22) - 1));
    assert!(!certified(one, one, 1 << 22));
}

#[test]
fn rounding_up_to_bf16() {
    let (tiny, inf) = (2f64.powi(-126), f64::INFINITY);
    for x in [0.0, 1.0, -1.5, 3.0e38, tiny, 1e-3, -7.25, 65280.0] {
        let b = half::bf16::from_f64(x);
        if f64::from(b) == x.abs() || f64::from(b) == -x.abs() {
            assert_eq!(up(x), u32::from(b.to_bits() & 0x7fff), "{x} is a bf16");
        }
    }
    let (p30, p9) = (1.0 + 2f64.powi(-30), 1.0 + 2f64.powi(-9));
    for x in [p30, p9, 0.1, -0.3, 1e-39, 3.3e38] {
        let v = f64::from(f32::from_bits(up(x) << 16));
        assert!(v >= x.abs(), "{x}: {v} below");
        // The next bf16 down is below |x|: the smallest bf16 at or above.
        let below = f64::from(f32::from_bits((up(x) - 1) << 16));
        assert!(below < x.abs(), "{x}: {below} also at or above");
    }
    assert_eq!(up(inf), 0x7f80);
    assert!(up(f64::NAN) > 0x7f80);
    assert_eq!(up(1e39), 0x7f80, "past f32: infinity");
}

/// A column window of a wider `s` (the f64 path computes into a copy): still bounded, and the
/// columns beside it untouched.
#[test]
fn strided_magnitudes_window() {
    let (a, b) = (values(9, 300, 5, false), values(300, 18, 6, false));
    let (exact, g) = exact_magnitudes(a.view(), b.view());
    for isa in paths("strided_magnitudes_window") {
        let mut c = Array2::zeros((9, 18));
        let mut wide = Array2::from_elem((9, 36), -1.0);
        gemm_magnitude_with(
            isa,
            a.view(),
            b.view(),
            c.view_mut(),
            wide.slice_mut(s![.., ..;2]),
        );
        for ((i, j), &e) in exact.indexed_iter() {
            let x = wide[(i, 2 * j)];
            let f = inflation(300);
            assert!(
                x >= e * (1.0 + g) && x <= e * (1.0 + g) * UP * f * f,
                "({i}, {j}) on {isa:?}"
            );
        }
        assert!(wide.slice(s![.., 1..;2]).iter().all(|v| *v == -1.0));
    }
}

/// The vector rounding ([`up16`], packing `b`) gives the scalar rule's bits ([`up`], packing
/// `a`), infinities and values past bf16 included.
#[test]
fn rounding_up_sixteen_at_a_time() {
    if !paths("rounding_up_sixteen_at_a_time").contains(&Isa::Avx512F32Mag) {
        return;
    }
    let (p30, tiny, inf) = (1.0 + 2f64.powi(-30), 2f64.powi(-126), f64::INFINITY);
    let xs: [f64; 16] = [
        0.0, -0.0, 1.0, p30, 0.1, -0.3, 1e-39, 3.3e38, inf, -1e39, 65280.0, tiny, -1.5, 1e-300,
        1e-3, 3.0e38,
    ];
    // SAFETY: the CPU has AVX-512 (checked by `here`), and the loads read 8 values each.
    let got: [u32; 16] = unsafe {
        let v = up16(
            _mm512_loadu_pd(xs.as_ptr()),
            _mm512_loadu_pd(xs.as_ptr().add(8)),
        );
        std::mem::transmute(v)
    };
    assert_eq!(got, xs.map(up));
}

/// An operand out of range anywhere is seen, however far from the last tile: a subnormal or a
/// NaN in the first band's first column tile of the first row block, on a product with
/// several bands (k > 256) and row blocks (m > 256), in the column tail, and in `a`'s second
/// band and row block past the columns packed 16 at a time; with `b` as it lies, held in bf16
/// and transposed, and transposed in f64 (AMX's three ways of packing it), and `a` read down
/// its columns (packed one value at a time); and in `b`'s second band past the pairs packed
/// 16 at a time.
#[test]
fn the_ranges_cover_every_band_tile_and_block() {
    // 49 columns: three whole column tiles and a tail.
    let (a, b) = (values(260, 300, 7, true), values(300, 49, 8, true));
    let poisoned = [
        (
            "NaN b in the column tail",
            a.clone(),
            with(&b, (3, 48), f64::NAN),
        ),
        ("subnormal b", a.clone(), with(&b, (0, 0), 1e-40)),
        ("NaN b", a.clone(), with(&b, (1, 2), f64::NAN)),
        ("subnormal a", with(&a, (0, 1), 1e-40), b.clone()),
        ("subnormal a, late", with(&a, (258, 297), 1e-40), b.clone()),
        ("subnormal b, late", a.clone(), with(&b, (290, 5), 1e-40)),
    ];
    for isa in paths("the_ranges_cover_every_band_tile_and_block") {
        for (what, a, b) in &poisoned {
            if isa == Isa::Avx512F32Mag && what.contains("tail") {
                // There the tail's 1 column is the f64 path's already (NaN in that column
                // only), the full tiles' bounds the bf16 path's.
                continue;
            }
            let what = format!("{what} on {isa:?}");
            assert_f64_path(isa, a.view(), b.view(), &what);
            // b held in bf16 and transposed (dgrad's weight), read 16 pairs at a time on AMX.
            let bt = b.t().as_standard_layout().into_owned();
            let b16t = bt.mapv(half::bf16::from_f64);
            assert_f64_path(isa, a.view(), b16t.t(), &format!("{what}, bf16 transposed"));
            assert_f64_path(isa, a.view(), bt.t(), &format!("{what}, transposed"));
            let at = a.t().as_standard_layout().into_owned();
            assert_f64_path(
                isa,
                at.t(),
                b.view(),
                &format!("{what}, a down its columns"),
            );
        }
    }
}

/// Where every product is 0 (a zero row of `a`, a zero column of `b`, inside full tiles) the
/// magnitude is exactly 0, and nowhere else.
#[test]
fn exact_zeros_stay_zero() {
    let (mut a, mut b) = (values(13, 301, 9, true), values(301, 32, 10, true));
    a.row_mut(2).fill(0.0);
    b.column_mut(3).fill(0.0);
    b.column_mut(20).fill(-0.0);
    for isa in paths("exact_zeros_stay_zero") {
        check_against(
            isa,
            a.view(),
            b.view(),
            b.view(),
            1.0,
            "zero row and columns",
        );
        let (_, s) = product(isa, a.view(), b.view());
        for ((i, j), &x) in s.indexed_iter() {
            assert_eq!(
                x == 0.0,
                i == 2 || j == 3 || j == 20,
                "({i}, {j}) on {isa:?}: {x:e}"
            );
        }
    }
}

/// A thread that flushes subnormals (MXCSR's FTZ and DAZ, as code built with `-ffast-math`
/// sets them) takes the f64 path: there the rounding of `b` would turn a value in f32's
/// subnormal range into 0 and drop its product.
#[test]
fn a_thread_that_flushes_subnormals_takes_the_f64_path() {
    let a = values(9, 40, 11, true).mapv(|x| x * 1e20);
    let mut b = values(40, 32, 12, true);
    b[(4, 5)] = 1e-39; // f32 subnormal; times 1e20, far from underflow in f64
    let set = |csr: u32| {
        // SAFETY: `ldmxcsr` loads the 32-bit control word from the given address: here this
        // thread's own word with FTZ and DAZ set, then restored.
        unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, preserves_flags)) }
    };
    for isa in paths("a_thread_that_flushes_subnormals_takes_the_f64_path") {
        let old = control_word();
        set(old | (1 << 15) | (1 << 6));
        assert!(flushes_subnormals());
        let (got, want) = (
            product(isa, a.view(), b.view()),
            product(Isa::Avx512, a.view(), b.view()),
        );
        set(old);
        assert!(!flushes_subnormals());
        let s = got.1;
        assert_eq!(s.mapv(f64::to_bits), want.1.mapv(f64::to_bits), "{isa:?}");
        assert!(
            s[(0, 5)] >= (a[(0, 4)] * 1e-39).abs(),
            "the subnormal's product counted on {isa:?}"
        );
    }
}
