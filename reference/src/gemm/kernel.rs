//! An f64 GEMM, `c ← a·b`, for the reference grouped GEMM.
//!
//! ## Why not `general_mat_mul` per group
//! matrixmultiply packs the whole right operand of every call into panels before it computes.
//! A grouped GEMM calls it once per expert with a fresh `(K, N)` weight each time (4 MiB in
//! f64 at K = 1024, N = 512), so for the many experts with a handful of rows the copy costs as
//! much as the product. This kernel reads `b` where it lies, row by row, as long as its rows
//! are contiguous (unit column stride). Only a narrower `b` (f32, bf16 weights) is copied,
//! one band's column tile at a time (`KC` rows × the register tile's width), widened to f64
//! once per block of `MC` rows of `a` for all its row tiles rather than once per row tile.
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
//! [`super::bound`] already charges the reference. The inputs of moecheck come from f32 values,
//! whose products cannot underflow in f64, so no absolute term is needed. When all products
//! are small integers the sums are exact and the result equals a triple loop bit for bit (the
//! tests check this).
//!
//! ## Instruction sets
//! Chosen at run time: AVX-512F + FMA (8 × 24 register tile), AVX2 + FMA (4 × 12), otherwise
//! portable Rust (4 × 8, no FMA); with magnitudes, two accumulators per element, 4 × 24, 2 × 8
//! and 2 × 8. The tile loops are plain Rust over fixed-size arrays that the
//! compiler vectorises inside `#[target_feature]` functions; no intrinsics beyond feature
//! detection are used.

use ndarray::{Array2, ArrayView2, ArrayViewMut2};

pub use super::isa::Isa;
use super::layout::widen;
pub use super::operand::Operand;
use super::tile::{tile_rows, Tile};

/// Depth of one accumulation block along `p` (the shared dimension).
pub const KC: usize = 256;
/// Rows of `a` walked per sweep over a `KC`-deep band of `b`.
const MC: usize = 256;

/// `c ← a·b` in f64 (see the module doc for the summation order and its error).
///
/// Reads `a (m, k)` (any strides) and `b (k, n)`; overwrites every element of `c (m, n)`
/// without reading it first (with `k = 0`, `c` becomes 0). When `b` or `c` does not have
/// contiguous rows (unit column stride), `b` is copied into rows and `c` computed into a
/// contiguous buffer first (the same sums).
///
/// # Panics
/// If the shapes disagree.
///
/// ```
/// use ndarray::{array, Array2};
/// use moecheck_reference::gemm::kernel::gemm;
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
/// taken in registers; `|x|` is exact).
///
/// # Panics
/// If the shapes disagree.
///
/// ```
/// use ndarray::{array, Array2};
/// use moecheck_reference::gemm::kernel::gemm_magnitude;
/// let a = array![[1.0, -2.0]];
/// let b = array![[5.0], [8.0]];
/// let (mut c, mut s) = (Array2::zeros((1, 1)), Array2::zeros((1, 1)));
/// gemm_magnitude(a.view(), b.view(), c.view_mut(), s.view_mut());
/// assert_eq!((c[(0, 0)], s[(0, 0)]), (-11.0, 21.0));
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
    if !rows_contiguous(n, b.strides()[1]) {
        // A strided `b`: copied into f64 rows (by 8 × 8 tiles when it is a transposed view),
        // then the kernel, on this thread (callers run inside parallel workers, beside which
        // matrixmultiply's own pool would spin): the same sums as for contiguous rows.
        let mut rows = Vec::new();
        widen(b, &mut rows, Operand::wide);
        let b = ArrayView2::from_shape((k, n), &rows[..k * n]).expect("widen fills k·n values");
        run(isa, a, b, c, mag);
        return;
    }
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
        c: c.as_mut_ptr(),
        ldc: c.strides()[0],
        s: s_ptr,
        lds,
    };
    // SAFETY: the pointers and strides come from live views of the shapes checked above, `c`
    // (and `s`, when not null) are borrowed mutably for the call, `b`, `c` and `s` have unit
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
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("only Portable is available off x86-64"),
        }
    }
}

/// Raw view of one `c ← a·b` problem: `a[i, p] = *a.offset(i·rsa + p·csa)`,
/// `b[p, j] = *b.offset(p·ldb + j)`, `c[i, j] = *c.offset(i·ldc + j)`, and the magnitudes
/// `s[i, j] = *s.offset(i·lds + j)` when `s` is not null.
struct Shape<B> {
    m: usize,
    n: usize,
    k: usize,
    a: *const f64,
    rsa: isize,
    csa: isize,
    b: *const B,
    ldb: isize,
    c: *mut f64,
    ldc: isize,
    s: *mut f64,
    lds: isize,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn body_avx512<B: Operand>(s: &Shape<B>) {
    // SAFETY: as for `body`; the caller checked the features.
    unsafe { body::<B, 8, 24, 8, true, false>(s) }
}

/// Two accumulators per element: half the rows of [`body_avx512`]'s tile, so the 24
/// accumulators, the band's row and its absolute value fit the 32 registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn body_avx512_magnitude<B: Operand>(s: &Shape<B>) {
    // SAFETY: as for `body`; the caller checked the features.
    unsafe { body::<B, 4, 24, 8, true, true>(s) }
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
    // A band's column tile of a narrower `b` (f32, bf16), widened to f64 once for all the
    // row tiles that read it, instead of once per row tile in the tile's loop (conversions
    // compete with the FMAs for the same ports); f64 `b` is read where it lies.
    let pack = std::mem::size_of::<B>() < std::mem::size_of::<f64>();
    let mut packed = if pack {
        vec![0.0f64; KC * NR]
    } else {
        Vec::new()
    };
    let mut pc = 0;
    while pc < s.k {
        let kc = KC.min(s.k - pc);
        let mut ic = 0;
        while ic < s.m {
            let mc = MC.min(s.m - ic);
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
                let bp = unsafe { s.b.offset(pc as isize * s.ldb + jr as isize) };
                let band = Band { pc, kc, ic, mc, jr };
                if pack && w > 1 {
                    for p in 0..kc {
                        for j in 0..w {
                            // SAFETY: row pc + p, column jr + j of b (p < kc, j < w).
                            packed[p * w + j] =
                                unsafe { *bp.offset(p as isize * s.ldb + j as isize) }.wide();
                        }
                    }
                    let b = packed.as_ptr();
                    unsafe {
                        if w == NR {
                            rows_of::<f64, B, MR, NR, FMA, MAG>(s, &band, b, w as isize)
                        } else {
                            rows_of::<f64, B, MR, W, FMA, MAG>(s, &band, b, w as isize)
                        }
                    }
                } else {
                    unsafe {
                        if w == NR {
                            rows_of::<B, B, MR, NR, FMA, MAG>(s, &band, bp, s.ldb)
                        } else if w == W {
                            rows_of::<B, B, MR, W, FMA, MAG>(s, &band, bp, s.ldb)
                        } else {
                            rows_of::<B, B, MR, 1, FMA, MAG>(s, &band, bp, s.ldb)
                        }
                    }
                }
                jr += w;
            }
            ic += mc;
        }
        pc += kc;
    }
}

/// Where one column tile of one band lies: band rows `pc..pc + kc` of `b`, rows
/// `ic..ic + mc` of `a`, columns from `jr`.
#[derive(Clone, Copy)]
struct Band {
    pc: usize,
    kc: usize,
    ic: usize,
    mc: usize,
    jr: usize,
}

/// The `MR`-row tiles of `band` against a `C`-wide column tile `b` (row stride `ldb`): the
/// band of `s.b` itself, or its widened copy.
///
/// # Safety
/// As for [`body`]; `b` must hold `band.kc` rows of `C` values, `ldb` apart.
#[inline(always)]
unsafe fn rows_of<
    T: Operand,
    B,
    const MR: usize,
    const C: usize,
    const FMA: bool,
    const MAG: bool,
>(
    s: &Shape<B>,
    band: &Band,
    b: *const T,
    ldb: isize,
) {
    let Band { pc, kc, ic, mc, jr } = *band;
    let at = |i: usize, p: usize| (i as isize) * s.rsa + (p as isize) * s.csa;
    let mut ir = ic;
    while ir < ic + mc {
        let mr = MR.min(ic + mc - ir);
        let t = Tile {
            kc,
            a: unsafe { s.a.offset(at(ir, pc)) },
            rsa: s.rsa,
            csa: s.csa,
            b,
            ldb,
            c: unsafe { s.c.offset(ir as isize * s.ldc + jr as isize) },
            ldc: s.ldc,
            s: if MAG {
                unsafe { s.s.offset(ir as isize * s.lds + jr as isize) }
            } else {
                std::ptr::null_mut()
            },
            lds: s.lds,
            first: pc == 0,
        };
        unsafe { tile_rows::<T, MR, C, FMA, MAG>(mr, &t) };
        ir += MR;
    }
}

#[cfg(test)]
#[path = "kernel_tests.rs"]
mod tests;
