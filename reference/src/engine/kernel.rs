//! An f64 GEMM, `c ← a·b`, for the reference grouped GEMM.
//!
//! ## Why not `general_mat_mul` per group
//! matrixmultiply packs the whole right operand of every call into panels before it computes.
//! A grouped GEMM calls it once per expert with a fresh `(K, N)` weight each time (4 MiB in
//! f64 at K = 1024, N = 512), so for the many experts with a handful of rows the copy costs as
//! much as the product. This kernel reads an f64 `b` with contiguous rows where it lies. A
//! narrower `b` (f32, bf16 weights), a strided one (dgrad's transposed weight, read along its
//! contiguous columns in 8 × 8 blocks) and any `b` when magnitudes are asked for are copied
//! one band's column tile at a time (`KC` rows × the register tile's width) into f64 rows,
//! once per block of `MC` rows of `a` for all its row tiles rather than once per row tile;
//! with magnitudes the copy also holds `|b|`, and the block's `|a|` is copied once too, so
//! that the register tile takes no absolute values.
//!
//! ## The arithmetic
//! `c[i, j] = Σ_p a[i, p]·b[p, j]` in f64. `p` runs in blocks of [`KC`]: inside a block the
//! products are accumulated in registers, in increasing `p`, with one fused multiply-add each
//! where the CPU has FMA (one rounding per step) or a product and a sum otherwise; the block's
//! sum is then stored into `c` (first block) or added to it (later blocks). The order depends
//! only on `p`, never on the tiling, the thread or the instruction set's register width, so a
//! result is the same whichever path ran, up to FMA versus separate rounding.
//!
//! Every product passes through at most `k` roundings (its own block's chain from its position
//! on, plus one addition per later block, and each later block holds at least one product),
//! so `|ĉ - c| <= γ(k, 2^-53)·Σ_p |a[i, p]·b[p, j]|` whatever the block size: the term
//! [`crate::gemm::bound`] already charges the reference. The inputs of moecheck come from f32 values,
//! whose products cannot underflow in f64, so no absolute term is needed. When all products
//! are small integers the sums are exact and the result equals a triple loop bit for bit (the
//! tests check this).
//!
//! ## Instruction sets
//! Chosen at run time: AVX-512F + FMA (8 × 24 register tile), AVX2 + FMA (4 × 12), otherwise
//! portable Rust (4 × 8, no FMA); with magnitudes summed in f64, two accumulators per
//! element, 6 × 16, 2 × 8 and 2 × 8. The tile loops are plain Rust over fixed-size arrays that
//! the compiler vectorises inside `#[target_feature]` functions.
//!
//! With AVX-512F the magnitudes are summed in f32 by default ([`Isa::Avx512F32Mag`]): the
//! values are the same, but the magnitudes come from operands rounded up to bf16, summed by f32
//! fused multiply-adds in the values' register tile ([`super::bf16mag`], written with
//! intrinsics): not the f64 sums, but a certified upper bound of `Σ|a|·|b|` at most about
//! `2γ(k + 1, 2^-23)` above it (5e-4 at K = 2048, 2e-3 at DeepSeek-V3's 7168), at half of the
//! f64 magnitudes' multiply-adds. An error bound grows with its magnitude, so it stays a
//! bound. Operands whose magnitudes could underflow or overflow in f32 fall back to the f64
//! sums, call by call. Where the process may also use AMX tiles ([`Isa::Amx`], the widest path
//! when present), the same bound comes from `tdpbf16ps` ([`super::amx`]) after the values,
//! which then run alone on the 8 × 24 tile: the magnitudes add a quarter of the values' time
//! where the sums are long (fwd, dgrad) and about two thirds where they are short (wgrad, whose
//! outputs cost most to store).

use ndarray::{Array2, ArrayView2, ArrayViewMut2};

use super::band::{column_tile, pack_a_abs, Band, Bufs, Shape};
pub use super::isa::Isa;
pub use super::operand::Operand;

pub use super::band::KC;
use super::band::MC;

/// `c ← a·b` in f64 (see the module doc for the summation order and its error).
///
/// Reads `a (m, k)` (any strides) and `b (k, n)`; overwrites every element of `c (m, n)`
/// without reading it first (with `k = 0`, `c` becomes 0). `b` may have any strides (it is
/// copied into rows a band tile at a time when needed); when `c` does not have contiguous
/// rows (unit column stride) it is computed into a contiguous buffer first (the same sums).
///
/// # Panics
/// If the shapes disagree.
///
/// ```
/// use ndarray::{array, Array2};
/// use moecheck_reference::engine::gemm;
/// let a = array![[1.0, 2.0], [3.0, 4.0]];
/// let b = array![[5.0, 6.0, 7.0], [8.0, 9.0, 10.0]];
/// let mut c = Array2::from_elem((2, 3), f64::NAN);
/// gemm(a.view(), b.view(), c.view_mut());
/// assert_eq!(c, array![[21.0, 24.0, 27.0], [47.0, 54.0, 61.0]]);
/// ```
pub fn gemm<B: Operand>(a: ArrayView2<f64>, b: ArrayView2<B>, c: ArrayViewMut2<f64>) {
    gemm_with(Isa::detect(), a, b, c)
}

/// [`gemm`] on a chosen path.
///
/// # Panics
/// If the shapes disagree, or `isa` is not supported by this CPU.
pub fn gemm_with<B: Operand>(
    isa: Isa,
    a: ArrayView2<f64>,
    b: ArrayView2<B>,
    c: ArrayViewMut2<f64>,
) {
    run(isa, a, b, c, None)
}

/// `c ← a·b` and `s ← |a|·|b|` (every product's magnitude, `s[i, j] = Σ_p |a[i, p]|·|b[p, j]|`)
/// in one sweep over the operands: the values a bound scales with, without absolute-value
/// copies of the operands and without reading them twice.
///
/// Both sums run in the order of [`gemm`], with the same tiles: `c` is bit for bit what
/// [`gemm`] returns, and `s` what [`gemm`] returns for `|a|` and `|b|` (the absolute values are
/// taken in registers; `|x|` is exact), except on [`Isa::Avx512F32Mag`] and [`Isa::Amx`], where
/// `s` is a certified upper bound a little above that sum (see the module doc).
///
/// # Panics
/// If the shapes disagree.
///
/// ```
/// use ndarray::{array, Array2};
/// use moecheck_reference::engine::gemm_magnitude;
/// let a = array![[1.0, -2.0]];
/// let b = array![[5.0], [8.0]];
/// let (mut c, mut s) = (Array2::zeros((1, 1)), Array2::zeros((1, 1)));
/// gemm_magnitude(a.view(), b.view(), c.view_mut(), s.view_mut());
/// assert_eq!(c[(0, 0)], -11.0);
/// // 5 + 16 = 21 exactly, or on the f32-magnitude paths a certified upper bound a hair above.
/// assert!(s[(0, 0)] >= 21.0 && s[(0, 0)] <= 21.0 * (1.0 + 1e-6));
/// ```
pub fn gemm_magnitude<B: Operand>(
    a: ArrayView2<f64>,
    b: ArrayView2<B>,
    c: ArrayViewMut2<f64>,
    s: ArrayViewMut2<f64>,
) {
    gemm_magnitude_with(Isa::detect(), a, b, c, s)
}

/// [`gemm_magnitude`] on a chosen path.
///
/// # Panics
/// If the shapes disagree, or `isa` is not supported by this CPU.
pub fn gemm_magnitude_with<B: Operand>(
    isa: Isa,
    a: ArrayView2<f64>,
    b: ArrayView2<B>,
    c: ArrayViewMut2<f64>,
    s: ArrayViewMut2<f64>,
) {
    run(isa, a, b, c, Some(s))
}

/// What [`gemm_magnitude_with`] returns on `isa` for an element whose sums of `k` magnitudes
/// are exact in f32 and f64 (small integers): the sum itself, or on [`Isa::Avx512F32Mag`] and
/// [`Isa::Amx`] the sum times `F(k)` rounded once. For tests that compare the kernel's magnitudes with sums
/// computed otherwise (in unit tests the bf16 path runs whatever the shape).
#[cfg(test)]
pub(crate) fn exact_sum_as_reported(isa: Isa, sum: f64, k: usize) -> f64 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512F32Mag | Isa::Amx => sum * super::bf16mag::inflation(k),
        _ => sum,
    }
}

/// Checks the shapes and runs the kernel, with the magnitudes into `mag` when given.
fn run<B: Operand>(
    isa: Isa,
    a: ArrayView2<f64>,
    b: ArrayView2<B>,
    mut c: ArrayViewMut2<f64>,
    mut mag: Option<ArrayViewMut2<f64>>,
) {
    let (m, k) = a.dim();
    let n = b.ncols();
    assert_eq!(
        b.nrows(),
        k,
        "gemm: a is {:?} but b is {:?}",
        a.dim(),
        b.dim()
    );
    for out in std::iter::once(&c).chain(mag.as_ref()) {
        assert_eq!(
            out.dim(),
            (m, n),
            "gemm: c is {:?}, expected {:?}",
            out.dim(),
            (m, n)
        );
    }
    assert!(
        Isa::available().contains(&isa),
        "gemm: {isa:?} not supported here"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c.fill(0.0);
        if let Some(s) = mag.as_mut() {
            s.fill(0.0);
        }
        return;
    }
    let rows_contiguous = |cols: usize, stride: isize| cols == 1 || stride == 1;
    // A strided `b` (dgrad's transposed weight) needs no copy here: the kernel packs it one
    // band tile at a time, reading each tile's columns where they are contiguous.
    if !rows_contiguous(n, c.strides()[1]) {
        // A strided `c`: computed into contiguous buffers, copied back.
        let zeros = || Array2::<f64>::zeros((m, n));
        let (mut value, mut magnitude) = (zeros(), mag.as_ref().map(|_| zeros()));
        let s = magnitude.as_mut().map(|s| s.view_mut());
        run(isa, a, b, value.view_mut(), s);
        c.assign(&value);
        if let (Some(s), Some(t)) = (mag.as_mut(), magnitude) {
            s.assign(&t);
        }
        return;
    }
    if let Some(s) = mag.as_mut().filter(|s| !rows_contiguous(n, s.strides()[1])) {
        // Only the magnitudes' window is strided: computed into a contiguous copy, so that
        // `c` still comes from the kernel (the same bits as `gemm`).
        let mut tmp = ndarray::Array2::<f64>::zeros((m, n));
        run(isa, a, b, c, Some(tmp.view_mut()));
        s.assign(&tmp);
        return;
    }
    let (s_ptr, lds) = match mag.as_mut() {
        Some(s) => (s.as_mut_ptr(), s.strides()[0]),
        None => (std::ptr::null_mut(), 0),
    };
    let shape = Shape {
        m,
        n,
        k,
        a: a.as_ptr(),
        rsa: a.strides()[0],
        csa: a.strides()[1],
        b: b.as_ptr(),
        ldb: b.strides()[0],
        csb: b.strides()[1],
        c: c.as_mut_ptr(),
        ldc: c.strides()[0],
        s: s_ptr,
        lds,
    };
    // SAFETY: the pointers and strides come from live views of the shapes checked above, `c`
    // (and `s`, when not null) are borrowed mutably for the call, `c` and `s` have unit
    // column stride (or one column), and `body` only touches `a[i, p]`, `b[p, j]`, `c[i, j]`,
    // `s[i, j]` with `i < m`, `j < n`, `p < k` (`s` only when it is not null). The
    // target-feature paths run only when `Isa::available` found the features.
    unsafe {
        match (isa, mag.is_some()) {
            (Isa::Portable, false) => body::<B, 4, 8, 4, false, false>(&shape),
            (Isa::Portable, true) => body::<B, 2, 8, 4, false, true>(&shape),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, false) => body_avx2(&shape),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, true) => body_avx2_magnitude(&shape),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512, false) => body_avx512(&shape),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512, true) => body_avx512_magnitude(&shape),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512F32Mag, false) => body_avx512(&shape),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512F32Mag, true) => {
                let edge = |s: &Shape<B>| body_avx512_magnitude(s);
                if !super::bf16mag::pays(m, n) || !super::bf16mag::run(&shape, edge) {
                    body_avx512_magnitude(&shape);
                }
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Amx, false) => body_avx512(&shape),
            #[cfg(target_arch = "x86_64")]
            (Isa::Amx, true) => {
                // The values alone on the widest f64 tile, then the magnitudes beside them.
                if !super::bf16mag::pays(m, n) {
                    body_avx512_magnitude(&shape);
                } else {
                    body_avx512(&shape);
                    if !super::amx::run(&shape) {
                        body_avx512_magnitude(&shape);
                    }
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("only Portable is available off x86-64"),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn body_avx512<B: Operand>(s: &Shape<B>) {
    // SAFETY: as for `body`; the caller checked the features.
    unsafe { body::<B, 8, 24, 8, true, false>(s) }
}

/// Two accumulators per element: a 6 × 16 tile, whose 24 accumulators, the band's row and
/// its absolute value (4) and the broadcasts fit the 32 registers (6 × 24 would spill).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn body_avx512_magnitude<B: Operand>(s: &Shape<B>) {
    // SAFETY: as for `body`; the caller checked the features.
    unsafe { body::<B, 6, 16, 8, true, true>(s) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn body_avx2<B: Operand>(s: &Shape<B>) {
    // SAFETY: as for `body`; the caller checked the features.
    unsafe { body::<B, 4, 12, 4, true, false>(s) }
}

/// Two accumulators per element: a 2 × 8 tile, whose 8 accumulators, the band's row and its
/// absolute value (4) and the two broadcasts fit the 16 registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn body_avx2_magnitude<B: Operand>(s: &Shape<B>) {
    // SAFETY: as for `body`; the caller checked the features.
    unsafe { body::<B, 2, 8, 4, true, true>(s) }
}

/// The blocked loops: `KC`-deep bands of `b`, `MC` rows of `a` at a time, then `MR × w` tiles
/// with `w` = `NR`, else `W`, else 1 column at the right edge.
///
/// # Safety
/// `s` must describe valid, non-overlapping `a`, `b`, `c` with `m, n, k >= 1`.
#[inline(always)]
unsafe fn body<
    B: Operand,
    const MR: usize,
    const NR: usize,
    const W: usize,
    const FMA: bool,
    const MAG: bool,
>(
    s: &Shape<B>,
) {
    // A band's column tile is copied into f64 rows once for all the row tiles that read it
    // (instead of converted once per row tile in the tile's loop, where conversions compete
    // with the FMAs for the same ports) when `b` is narrower (f32, bf16), when its columns
    // are strided (a transposed view: the copy reads each column's contiguous run), and with
    // magnitudes (the copy also holds `|b|`, so that the tile takes no absolute values).
    // Otherwise, and for a single edge column of values, `b` is read where it lies.
    // Buffers for the widest band and the tallest block this product has.
    let (depth, rows) = (KC.min(s.k), MC.min(s.m));
    let mut packed = vec![0.0f64; if s.copies_b() || MAG { depth * NR } else { 0 }];
    let mut packed_abs = vec![0.0f64; if MAG { depth * NR } else { 0 }];
    let mut a_abs = vec![0.0f64; if MAG { depth * rows } else { 0 }];
    let mut pc = 0;
    while pc < s.k {
        let kc = KC.min(s.k - pc);
        let mut ic = 0;
        while ic < s.m {
            let mc = MC.min(s.m - ic);
            if MAG {
                // SAFETY: rows ic..ic + mc, columns pc..pc + kc of a.
                unsafe { pack_a_abs::<B, MR>(s, pc, kc, ic, mc, &mut a_abs) };
            }
            let mut jr = 0;
            while jr < s.n {
                let left = s.n - jr;
                let w = if left >= NR {
                    NR
                } else if left >= W {
                    W
                } else {
                    1
                };
                let band = Band { pc, kc, ic, mc, jr };
                let bufs = Bufs {
                    packed: &mut packed,
                    packed_abs: &mut packed_abs,
                    a_abs: &a_abs,
                };
                // SAFETY: as for this function; the buffers hold a band tile and a block.
                unsafe {
                    if w == NR {
                        column_tile::<B, MR, NR, FMA, MAG>(s, &band, bufs)
                    } else if w == W {
                        column_tile::<B, MR, W, FMA, MAG>(s, &band, bufs)
                    } else {
                        column_tile::<B, MR, 1, FMA, MAG>(s, &band, bufs)
                    }
                }
                jr += w;
            }
            ic += mc;
        }
        pc += kc;
    }
}

#[cfg(test)]
#[path = "kernel_tests.rs"]
mod tests;
