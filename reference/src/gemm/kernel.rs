//! A packing-free f64 GEMM, `c ← a·b`, for the reference grouped GEMM.
//!
//! ## Why not `general_mat_mul` per group
//! matrixmultiply packs the whole right operand of every call into panels before it computes.
//! A grouped GEMM calls it once per expert with a fresh `(K, N)` weight each time (4 MiB in
//! f64 at K = 1024, N = 512), so for the many experts with a handful of rows the copy costs as
//! much as the product. This kernel reads `b` where it lies, row by row, as long as its rows
//! are contiguous (unit column stride), and needs no buffer at all.
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

pub use super::operand::Operand;

/// Depth of one accumulation block along `p` (the shared dimension).
pub const KC: usize = 256;
/// Rows of `a` walked per sweep over a `KC`-deep band of `b`.
const MC: usize = 256;

/// The instruction-set paths of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust, separate multiply and add; runs everywhere.
    Portable,
    /// x86-64 AVX2 with FMA.
    Avx2,
    /// x86-64 AVX-512F with FMA.
    Avx512,
}

impl Isa {
    /// The widest path this CPU supports.
    pub fn detect() -> Isa {
        *Isa::available().last().unwrap_or(&Isa::Portable)
    }

    /// Every path this CPU can run, narrowest first (the tests run each of them).
    pub fn available() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut paths = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                paths.push(Isa::Avx2);
                if has!("avx512f") {
                    paths.push(Isa::Avx512);
                }
            }
        }
        paths
    }
}

/// `c ← a·b` in f64 (see the module doc for the summation order and its error).
///
/// Reads `a (m, k)` (any strides) and `b (k, n)`; overwrites every element of `c (m, n)`
/// without reading it first (with `k = 0`, `c` becomes 0). When `b` or `c` does not have
/// contiguous rows (unit column stride), falls back to ndarray's `general_mat_mul`, whose
/// error obeys the same bound.
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
    if !rows_contiguous(n, b.strides()[1]) || !rows_contiguous(n, c.strides()[1]) {
        // A strided `b` or `c`: `b` copied into rows, the kernel into contiguous outputs
        // copied back; on this thread (callers run inside parallel workers, beside which
        // matrixmultiply's own pool would spin), the same sums as for contiguous operands.
        let (b, zeros) = (b.as_standard_layout(), || Array2::<f64>::zeros((m, n)));
        let (mut value, mut magnitude) = (zeros(), mag.as_ref().map(|_| zeros()));
        let s = magnitude.as_mut().map(|s| s.view_mut());
        run(isa, a, b.view(), value.view_mut(), s);
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
    let at = |i: usize, p: usize| (i as isize) * s.rsa + (p as isize) * s.csa;
    let mut pc = 0;
    while pc < s.k {
        let kc = KC.min(s.k - pc);
        let first = pc == 0;
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
                let mut ir = ic;
                while ir < ic + mc {
                    let mr = MR.min(ic + mc - ir);
                    let t = Tile {
                        kc,
                        a: unsafe { s.a.offset(at(ir, pc)) },
                        rsa: s.rsa,
                        csa: s.csa,
                        b: bp,
                        ldb: s.ldb,
                        c: unsafe { s.c.offset(ir as isize * s.ldc + jr as isize) },
                        ldc: s.ldc,
                        s: if MAG {
                            unsafe { s.s.offset(ir as isize * s.lds + jr as isize) }
                        } else {
                            std::ptr::null_mut()
                        },
                        lds: s.lds,
                        first,
                    };
                    unsafe {
                        if w == NR {
                            tile_rows::<B, MR, NR, FMA, MAG>(mr, &t)
                        } else if w == W {
                            tile_rows::<B, MR, W, FMA, MAG>(mr, &t)
                        } else {
                            tile_rows::<B, MR, 1, FMA, MAG>(mr, &t)
                        }
                    }
                    ir += MR;
                }
                jr += w;
            }
            ic += mc;
        }
        pc += kc;
    }
}

/// One `mr × NR` tile over one `kc`-deep band, `c` pointing at its top-left element.
struct Tile<B> {
    kc: usize,
    a: *const f64,
    rsa: isize,
    csa: isize,
    b: *const B,
    ldb: isize,
    c: *mut f64,
    ldc: isize,
    /// The magnitudes' tile (used only by `MAG` tiles).
    s: *mut f64,
    lds: isize,
    first: bool,
}

/// Dispatches `mr in 1..=MR` to a tile with that many rows as a constant.
#[inline(always)]
unsafe fn tile_rows<
    B: Operand,
    const MR: usize,
    const NR: usize,
    const FMA: bool,
    const MAG: bool,
>(
    mr: usize,
    t: &Tile<B>,
) {
    unsafe {
        match mr {
            1 => tile::<B, 1, NR, FMA, MAG>(t),
            2 => tile::<B, 2, NR, FMA, MAG>(t),
            3 if MR >= 3 => tile::<B, 3, NR, FMA, MAG>(t),
            4 if MR >= 4 => tile::<B, 4, NR, FMA, MAG>(t),
            5 if MR >= 5 => tile::<B, 5, NR, FMA, MAG>(t),
            6 if MR >= 6 => tile::<B, 6, NR, FMA, MAG>(t),
            7 if MR >= 7 => tile::<B, 7, NR, FMA, MAG>(t),
            8 if MR >= 8 => tile::<B, 8, NR, FMA, MAG>(t),
            _ => unreachable!("tile with {mr} rows, at most {MR}"),
        }
    }
}

/// `c[i, j] (=|+=) Σ_{p < kc} a[i, p]·b[p, j]` for `i < R`, `j < C`, accumulated in registers
/// in increasing `p`; `=` for the first band, `+=` for later ones. With `MAG`, the same for
/// `s[i, j]` and `|a[i, p]|·|b[p, j]|`, in the same order.
#[inline(always)]
unsafe fn tile<B: Operand, const R: usize, const C: usize, const FMA: bool, const MAG: bool>(
    t: &Tile<B>,
) {
    let step = |a: f64, b: f64, x: f64| if FMA { a.mul_add(b, x) } else { a * b + x };
    let mut acc = [[0.0f64; C]; R];
    let mut mag = [[0.0f64; C]; R];
    for p in 0..t.kc {
        // SAFETY: row p of the band, columns [jr, jr + C) are inside b (C <= n - jr).
        let raw: [B; C] =
            unsafe { std::ptr::read_unaligned(t.b.offset(p as isize * t.ldb) as *const [B; C]) };
        let bv: [f64; C] = raw.map(Operand::wide);
        let babs = bv.map(f64::abs);
        for (i, (row, mrow)) in acc.iter_mut().zip(mag.iter_mut()).enumerate() {
            let av = unsafe { *t.a.offset(i as isize * t.rsa + p as isize * t.csa) };
            for (x, bj) in row.iter_mut().zip(bv) {
                *x = step(av, bj, *x);
            }
            if MAG {
                let aa = av.abs();
                for (x, bj) in mrow.iter_mut().zip(babs) {
                    *x = step(aa, bj, *x);
                }
            }
        }
    }
    // SAFETY: rows i < R, columns [jr, jr + C) of the tile are inside c (and s).
    unsafe {
        store::<R, C>(&acc, t.c, t.ldc, t.first);
        if MAG {
            store::<R, C>(&mag, t.s, t.lds, t.first);
        }
    }
}

/// Writes (`first`) or adds a tile's sums into the `R × C` window at `c` (row stride `ldc`).
///
/// # Safety
/// The window must lie inside a live, mutably borrowed array.
#[inline(always)]
unsafe fn store<const R: usize, const C: usize>(
    acc: &[[f64; C]; R],
    c: *mut f64,
    ldc: isize,
    first: bool,
) {
    for (i, row) in acc.iter().enumerate() {
        let cp = unsafe { c.offset(i as isize * ldc) } as *mut [f64; C];
        // SAFETY: row i of the window, by the caller's contract.
        unsafe {
            if first {
                std::ptr::write_unaligned(cp, *row);
            } else {
                let mut old: [f64; C] = std::ptr::read_unaligned(cp);
                for (o, x) in old.iter_mut().zip(row) {
                    *o += x;
                }
                std::ptr::write_unaligned(cp, old);
            }
        }
    }
}

#[cfg(test)]
#[path = "kernel_tests.rs"]
mod tests;
