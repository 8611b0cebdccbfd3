//! The f32 GEMM `emulate` models a tensor-core kernel with: `C = A·B` summed in K blocks.
//!
//! Each element is computed as the model states it ([`super::emulate::Emulate`]): for each K
//! block of `tile` products, a partial sum that starts at `0` and adds the block's products in
//! order, in f32, each with one fused multiply-add (`part = fma(a, b, part)`) where the CPU has
//! FMA, a rounded product and a rounded addition where it has not; then the partials are added
//! in f32, in block order, to a running sum that starts at `0`. Every element is written.
//!
//! This replaces one matrixmultiply sgemm call per K block and output panel: that library packs
//! both operands into its own layout on every call, which at a block depth of 32 cost as much
//! as the arithmetic. Here the operands are packed once per chunk of K (several blocks) and
//! panel of columns, the right operand read where it lies (f32, or bf16 widened while
//! packing: an expert's weights are never widened whole), and a register-blocked micro-kernel
//! keeps each block's partials of `MR × NR` outputs in registers (one FMA chain per element,
//! so the order of additions is the model's, whatever the vector width).

use half::bf16;
use ndarray::{s, ArrayView2, ArrayViewMut2};

use moecheck_reference::gemm::weights::bf16_to_f32;

use super::simd::{Plain, Simd};

/// Rows of the output per micro-kernel call.
const MR: usize = 6;
/// Rows of the left operand packed at once (a multiple of [`MR`]).
const MC: usize = 192;
/// Products per chunk of K the micro-kernel takes at once, rounded to a multiple of the block
/// depth: a micro-panel of the right operand (`KC × NR` f32, 16 KiB at `NR = 32`) stays in L1.
const KC: usize = 128;
/// Values of the right operand packed at once (512 KiB of f32, in L2), read in long runs:
/// when its rows are contiguous, a panel of whole rows up to 2048 columns (fwd's weight: 64
/// consecutive rows, one contiguous stretch of memory); when its columns are (dgrad's
/// `rhs_gᵀ`), panels of four stripes (128 columns with AVX-512, 64 with AVX2), each column
/// read 1024 (2048) values at a time (short pieces of columns far apart are read several
/// times slower).
const PANEL: usize = 1 << 17;

/// An element of the right operand: read as f32 exactly.
pub trait Elem: Copy + Send + Sync {
    fn widen(self) -> f32;
}

impl Elem for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Elem for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        bf16_to_f32(self)
    }
}

/// `c ← a·b` summed in K blocks of `tile` products (see the [module docs](self)); `a` is
/// `(rows, depth)`, `b` `(depth, cols)`, `c` `(rows, cols)`, any strides.
///
/// # Panics
/// When the shapes disagree.
pub fn blocked_gemm<B: Elem>(
    a: ArrayView2<f32>,
    b: ArrayView2<B>,
    tile: usize,
    c: ArrayViewMut2<f32>,
) {
    assert_eq!(b.nrows(), a.ncols(), "inner dimensions");
    assert_eq!(c.dim(), (a.nrows(), b.ncols()), "output shape");
    dispatch(a, b, tile.max(1), c)
}

/// [`gemm`] with the widest instructions this CPU has; `tile` = [`CHAIN`] for one chain.
fn dispatch<B: Elem>(a: ArrayView2<f32>, b: ArrayView2<B>, tile: usize, c: ArrayViewMut2<f32>) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { x86::gemm_avx512(a, b, tile, c) };
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            return unsafe { x86::gemm_avx2(a, b, tile, c) };
        }
    }
    // SAFETY: plain arithmetic, no CPU feature needed.
    unsafe { gemm::<B, Plain>(a, b, tile, c) }
}

/// `c ← a·b` with each element one sum in order over the whole depth: starting at `+0`, each
/// product added with one fused multiply-add (`s = fma(a, b, s)`) where the CPU has FMA, a
/// rounded product and a rounded addition where it has not. Where every product `a·b` is
/// exact in f32 (two FP8 values), both are the sum of the exact products rounded after every
/// addition, in order: FP8 `emulate`'s exact accumulator. Shapes and layouts as
/// [`blocked_gemm`].
///
/// # Panics
/// When the shapes disagree.
pub fn chained_gemm<B: Elem>(a: ArrayView2<f32>, b: ArrayView2<B>, c: ArrayViewMut2<f32>) {
    assert_eq!(b.nrows(), a.ncols(), "inner dimensions");
    assert_eq!(c.dim(), (a.nrows(), b.ncols()), "output shape");
    dispatch(a, b, CHAIN, c)
}

/// The block depth that asks [`gemm`] for one chain per element ([`chained_gemm`]).
const CHAIN: usize = 0;

/// Whether [`blocked_gemm`] fuses each multiply-add on this CPU.
#[cfg(test)]
fn fused() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
            || (std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{gemm, Elem};
    use crate::impls::gemm::simd::x86::{Avx2, Avx512};
    use ndarray::{ArrayView2, ArrayViewMut2};

    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gemm_avx512<B: Elem>(
        a: ArrayView2<f32>,
        b: ArrayView2<B>,
        tile: usize,
        c: ArrayViewMut2<f32>,
    ) {
        // SAFETY: the caller checked the feature.
        unsafe { gemm::<B, Avx512>(a, b, tile, c) }
    }

    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gemm_avx2<B: Elem>(
        a: ArrayView2<f32>,
        b: ArrayView2<B>,
        tile: usize,
        c: ArrayViewMut2<f32>,
    ) {
        // SAFETY: the caller checked the features.
        unsafe { gemm::<B, Avx2>(a, b, tile, c) }
    }
}

/// Most columns of a stripe (two vectors of the widest lanes).
const NR_MAX: usize = 32;

thread_local! {
    /// The packed operands, kept for the thread's life.
    static PACKS: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The blocked loops: for each chunk of K (whole blocks), each panel of `NC` columns (packed
/// in stripes of `NR = 2·LANES` columns), each `MC` rows (packed in tiles of `MR`), every tile ×
/// stripe.
///
/// # Safety
/// The CPU has `V`'s features.
#[inline(always)]
unsafe fn gemm<B: Elem, V: Simd>(
    a: ArrayView2<f32>,
    b: ArrayView2<B>,
    tile: usize,
    mut c: ArrayViewMut2<f32>,
) {
    let (rows, depth) = a.dim();
    let cols = b.ncols();
    if rows == 0 || cols == 0 {
        return;
    }
    if depth == 0 {
        c.fill(0.0);
        return;
    }
    let nr = 2 * V::LANES;
    let unit_cols = c.strides()[1] == 1;
    debug_assert!(c.strides()[0] >= 0, "blocked gemm: a negative row stride");
    let ldc = c.strides()[0] as usize;
    // The buffers are taken out of the thread-local and put back: the loops must not run in
    // a closure, which would not inherit the caller's CPU features (nothing would inline).
    let (mut ap, mut bp) = PACKS.with(|p| std::mem::take(&mut *p.borrow_mut()));
    // An edge tile's running sums (never read before written: the first chunk starts them).
    let mut run = [0.0f32; MR * NR_MAX];
    // The right operand's panel: `kd` rows (whole chunks of K) × `nc` columns.
    let by_rows = b.strides()[1] == 1 || cols < 2;
    let nc = if by_rows { cols.min(2048) } else { 4 * nr };
    // A chunk of K is whole blocks (any number of products for one chain).
    let step = tile.max(1);
    let kc = step * (KC.min(PANEL / nc) / step).max(1);
    let kd = kc * (PANEL / nc / kc).max(1);
    // Which rows and depth `ap` holds: a group of at most `MC` rows is packed once per panel
    // depth, not once per panel.
    let mut packed_a = None;
    for d0 in (0..depth).step_by(kd) {
        let d1 = (d0 + kd).min(depth);
        for n0 in (0..cols).step_by(nc) {
            let n1 = (n0 + nc).min(cols);
            let stripes = (n1 - n0).div_ceil(nr);
            pack_b(b, d0, d1, n0, n1, nr, &mut bp);
            for m0 in (0..rows).step_by(MC) {
                let m1 = (m0 + MC).min(rows);
                let tiles = (m1 - m0).div_ceil(MR);
                if packed_a != Some((m0, d0)) {
                    pack_a(a, d0, d1, m0, m1, &mut ap);
                    packed_a = Some((m0, d0));
                }
                for k0 in (d0..d1).step_by(kc) {
                    let k1 = (k0 + kc).min(d1);
                    let kk = k1 - k0;
                    for s in 0..stripes {
                        // The stripe's micro-panel of this chunk: rows k0..k1 of the panel.
                        let bs = &bp[s * (d1 - d0) * nr + (k0 - d0) * nr..][..kk * nr];
                        let j0 = n0 + s * nr;
                        let w = (cols - j0).min(nr);
                        for t in 0..tiles {
                            let at = &ap[t * (d1 - d0) * MR + (k0 - d0) * MR..][..kk * MR];
                            let i0 = m0 + t * MR;
                            let h = (rows - i0).min(MR);
                            // A whole tile of `c` with contiguous rows is summed where it
                            // lies; an edge tile's running sums are copied out and back.
                            let whole = h == MR && w == nr && unit_cols;
                            let (sums, ld) = if whole {
                                // SAFETY: rows i0..i0 + MR and columns j0..j0 + nr lie
                                // inside `c` (a whole tile), whose columns are unit-strided
                                // and rows `ldc` apart. Pointer arithmetic rather than a
                                // slice of the view: this runs once per tile and K chunk.
                                (unsafe { c.as_mut_ptr().add(i0 * ldc + j0) }, ldc)
                            } else {
                                if k0 > 0 {
                                    for i in 0..h {
                                        for j in 0..w {
                                            run[i * nr + j] = c[(i0 + i, j0 + j)];
                                        }
                                    }
                                }
                                (run.as_mut_ptr(), nr)
                            };
                            // SAFETY: `at` holds kk·MR values, `bs` kk·nr; `sums` is MR rows of
                            // nr values `ld` apart (the tile of `c`, or `run`); the CPU has
                            // `V`'s features (the caller's contract).
                            unsafe {
                                micro::<V>(at.as_ptr(), bs.as_ptr(), kk, tile, sums, ld, k0 == 0)
                            };
                            if whole {
                                continue;
                            }
                            for i in 0..h {
                                for j in 0..w {
                                    c[(i0 + i, j0 + j)] = run[i * nr + j];
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    PACKS.with(|p| *p.borrow_mut() = (ap, bp));
}

/// `run += Σ_blocks (Σ_{k in block} a_k·b_k)`: each block's partial from 0 in one FMA chain per
/// element (in registers), added to the running sum at the block's end. `a` is `kk × MR`
/// (k-major), `b` `kk × 2·LANES`, `run` `MR` rows of `2·LANES` values, `ld` apart; with
/// `fresh`, the running sums start at 0 instead of being read. Blocks start every `tile`
/// products (the chunk starts on a block boundary). With `tile` = [`CHAIN`] the running sums
/// themselves continue the chain: `run = fma(a_k, b_k, run)` for each `k` of the chunk.
///
/// # Safety
/// The pointers hold those many values; the CPU has `V`'s features.
#[inline(always)]
unsafe fn micro<V: Simd>(
    a: *const f32,
    b: *const f32,
    kk: usize,
    tile: usize,
    run: *mut f32,
    ld: usize,
    fresh: bool,
) {
    let l = V::LANES;
    // SAFETY: every offset below is inside the caller's buffers.
    unsafe {
        if tile == CHAIN {
            let mut p = [[V::zero(); 2]; MR];
            if !fresh {
                for (i, pi) in p.iter_mut().enumerate() {
                    for (w, v) in pi.iter_mut().enumerate() {
                        *v = V::load(run.add(i * ld + w * l));
                    }
                }
            }
            fma_chains::<V>(a, b, 0..kk, &mut p);
            for (i, pi) in p.iter().enumerate() {
                for (w, v) in pi.iter().enumerate() {
                    v.store(run.add(i * ld + w * l));
                }
            }
            return;
        }
        let mut k = 0;
        while k < kk {
            let end = (k + tile).min(kk);
            let mut p = [[V::zero(); 2]; MR];
            fma_chains::<V>(a, b, k..end, &mut p);
            for (i, pi) in p.iter().enumerate() {
                for (w, v) in pi.iter().enumerate() {
                    let r = run.add(i * ld + w * l);
                    // `0 + p`, not `p`: the model's running sum starts at +0 (so a partial of
                    // -0 gives +0).
                    let before = if fresh && k == 0 {
                        V::zero()
                    } else {
                        V::load(r)
                    };
                    before.add(*v).store(r);
                }
            }
            k = end;
        }
    }
}

/// `p[i] ← fma(a[t, i], b[t, ..], p[i])` for each `t` of `ts` in order: one FMA chain per
/// element of the `MR × 2·LANES` register tile (`a` and `b` as [`micro`] takes them).
///
/// # Safety
/// As [`micro`]: `a` holds `ts.end·MR` values and `b` `ts.end·2·LANES`; the CPU has `V`'s
/// features.
#[inline(always)]
unsafe fn fma_chains<V: Simd>(
    a: *const f32,
    b: *const f32,
    ts: std::ops::Range<usize>,
    p: &mut [[V; 2]; MR],
) {
    let (l, nr) = (V::LANES, 2 * V::LANES);
    // SAFETY: the offsets are inside the caller's buffers (the contract above).
    unsafe {
        for t in ts {
            let (b0, b1) = (V::load(b.add(t * nr)), V::load(b.add(t * nr + l)));
            for (i, pi) in p.iter_mut().enumerate() {
                let x = V::splat(*a.add(t * MR + i));
                pi[0] = V::mul_add(x, b0, pi[0]);
                pi[1] = V::mul_add(x, b1, pi[1]);
            }
        }
    }
}

/// Rows `m0..m1`, columns `k0..k1` of `a` into `out` as tiles of [`MR`] rows, each `k`-major
/// (`out[t·kk·MR + k·MR + i] = a[m0 + t·MR + i, k0 + k]`), the last tile padded with zeros.
fn pack_a(a: ArrayView2<f32>, k0: usize, k1: usize, m0: usize, m1: usize, out: &mut Vec<f32>) {
    let kk = k1 - k0;
    let tiles = (m1 - m0).div_ceil(MR);
    out.clear();
    out.resize(tiles * kk * MR, 0.0);
    let block = a.slice(s![m0..m1, k0..k1]);
    for t in 0..tiles {
        let rows = block.slice(s![t * MR..((t + 1) * MR).min(m1 - m0), ..]);
        let dst = &mut out[t * kk * MR..(t + 1) * kk * MR];
        // `dst[k·MR + i] = rows[i, k]`, read along `a`'s contiguous axis.
        transpose_into(rows.t(), dst, MR, |v| v);
    }
}

/// Rows `k0..k1`, columns `n0..n1` of `b` into `out` as stripes of `nr` columns, each
/// `k`-major (`out[s·kk·nr + k·nr + j] = b[k0 + k, n0 + s·nr + j]`), widened to f32, the last
/// stripe padded with zeros.
fn pack_b<B: Elem>(
    b: ArrayView2<B>,
    k0: usize,
    k1: usize,
    n0: usize,
    n1: usize,
    nr: usize,
    out: &mut Vec<f32>,
) {
    let kk = k1 - k0;
    let stripes = (n1 - n0).div_ceil(nr);
    out.clear();
    out.resize(stripes * kk * nr, 0.0);
    let block = b.slice(s![k0..k1, n0..n1]);
    if block.strides()[1] == 1 || n1 - n0 == 1 {
        // Rows in order (a panel of whole rows is one contiguous stretch), each row dealt to
        // the stripes.
        for (k, row) in block.rows().into_iter().enumerate() {
            let row = row.to_slice().expect("a row of unit stride");
            for (st, src) in row.chunks(nr).enumerate() {
                let dst = &mut out[st * kk * nr + k * nr..][..src.len()];
                for (d, v) in dst.iter_mut().zip(src) {
                    *d = v.widen();
                }
            }
        }
        return;
    }
    for st in 0..stripes {
        let cols = block.slice(s![.., st * nr..((st + 1) * nr).min(n1 - n0)]);
        transpose_into(
            cols,
            &mut out[st * kk * nr..(st + 1) * kk * nr],
            nr,
            Elem::widen,
        );
    }
}

/// `dst[r·ld + c] = f(src[r, c])` for every element of `src` (`ld ≥ src.ncols()`), read along
/// whichever axis of `src` is contiguous (a copy of rows, or a transpose in blocks of 128 rows
/// so that the lines written stay in L1).
fn transpose_into<T: Copy>(src: ArrayView2<T>, dst: &mut [f32], ld: usize, f: impl Fn(T) -> f32) {
    let (rows, cols) = src.dim();
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(
        cols <= ld && (rows - 1) * ld + cols <= dst.len(),
        "dst holds src"
    );
    let (rs, cs) = (src.strides()[0], src.strides()[1]);
    let p = src.as_ptr();
    if cs == 1 || cols == 1 {
        for r in 0..rows {
            // SAFETY: row `r` of `src` is `cols` values from `p + r·rs`, one apart.
            let row = unsafe { std::slice::from_raw_parts(p.offset(r as isize * rs), cols) };
            for (d, v) in dst[r * ld..r * ld + cols].iter_mut().zip(row) {
                *d = f(*v);
            }
        }
    } else {
        for r0 in (0..rows).step_by(128) {
            let r1 = (r0 + 128).min(rows);
            for c in 0..cols {
                // SAFETY: column `c` of `src` has `rows` values from `p + c·cs`, `rs` apart;
                // rows r0..r1 are in it.
                let col = unsafe { p.offset(c as isize * cs) };
                for r in r0..r1 {
                    // SAFETY: as above.
                    dst[r * ld + c] = f(unsafe { *col.offset(r as isize * rs) });
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "blocked_tests.rs"]
mod tests;
