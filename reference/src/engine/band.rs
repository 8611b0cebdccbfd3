//! The f64 kernel's band level ([`super::kernel`]): one `KC`-deep band's column tile of `b`
//! against the `MR`-row tiles of a block of `a`, with the copies that feed the register tiles
//! (a band tile of `b` widened, or read along a transposed view's columns; `|b|` and `|a|`
//! for the magnitudes).

use super::operand::Operand;
use super::tile::{tile_rows, Tile};

/// Depth of one accumulation block along `p` (the shared dimension).
pub const KC: usize = 256;
/// Rows of `a` walked per sweep over a `KC`-deep band of `b`.
pub(super) const MC: usize = 256;

/// Raw view of one `c ← a·b` problem: `a[i, p] = *a.offset(i·rsa + p·csa)`,
/// `b[p, j] = *b.offset(p·ldb + j·csb)`, `c[i, j] = *c.offset(i·ldc + j)`, and the magnitudes
/// `s[i, j] = *s.offset(i·lds + j)` when `s` is not null.
pub(super) struct Shape<B> {
    pub(super) m: usize,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) a: *const f64,
    pub(super) rsa: isize,
    pub(super) csa: isize,
    pub(super) b: *const B,
    pub(super) ldb: isize,
    pub(super) csb: isize,
    pub(super) c: *mut f64,
    pub(super) ldc: isize,
    pub(super) s: *mut f64,
    pub(super) lds: isize,
}

impl<B> Shape<B> {
    /// Whether every band tile of `b` wider than one column is copied into f64 rows even for
    /// values alone: `b` is narrower than f64 (f32, bf16), or its columns are strided.
    pub(super) fn copies_b(&self) -> bool {
        let narrow = std::mem::size_of::<B>() < std::mem::size_of::<f64>();
        narrow || (self.n > 1 && self.csb != 1)
    }
}

/// The kernel's buffers: a band's column tile copied into f64 rows, its absolute values
/// (`MAG`), and the row block's `|a|` by row tiles (`MAG`, see [`pack_a_abs`]).
pub(super) struct Bufs<'a> {
    pub(super) packed: &'a mut [f64],
    pub(super) packed_abs: &'a mut [f64],
    pub(super) a_abs: &'a [f64],
}

/// One `C`-wide column tile of `band` against all its row tiles: `b` read where it lies when
/// it can be (values only, rows of `C` contiguous values of f64 or a single column), else
/// copied into `bufs` first (see [`body`]).
///
/// # Safety
/// As for [`body`]; `bufs` must hold `band.kc·C` values (`packed`, and `packed_abs` with
/// `MAG`) and the block's `|a|` with `MAG`.
#[inline(always)]
pub(super) unsafe fn column_tile<
    B: Operand,
    const MR: usize,
    const C: usize,
    const FMA: bool,
    const MAG: bool,
>(
    s: &Shape<B>,
    band: &Band,
    bufs: Bufs<'_>,
) {
    let Band { pc, jr, .. } = *band;
    // SAFETY: rows pc..pc + kc, columns jr..jr + C of b.
    let bp = unsafe { s.b.offset(pc as isize * s.ldb + jr as isize * s.csb) };
    if MAG || (C > 1 && s.copies_b()) {
        // SAFETY: as for this function.
        unsafe { pack_b::<B, C, MAG>(s, band, bufs.packed, bufs.packed_abs) };
        let (b, babs) = (bufs.packed.as_ptr(), bufs.packed_abs.as_ptr());
        unsafe { rows_of::<f64, B, MR, C, FMA, MAG>(s, band, b, C as isize, babs, bufs.a_abs) }
    } else {
        // Values only (MAG packs), so no absolute values are read.
        let babs = std::ptr::null();
        unsafe { rows_of::<B, B, MR, C, FMA, MAG>(s, band, bp, s.ldb, babs, bufs.a_abs) }
    }
}

/// Band `band`'s `C`-wide column tile of `b` copied into f64 rows (`out[p·C + j]`), and with
/// `MAG` its absolute values the same way into `abs`: rows of `C` values read where they lie,
/// or a transposed (strided) view read along its columns in 8 × 8 blocks.
///
/// # Safety
/// As for [`column_tile`]; `out` (and `abs` with `MAG`) must hold `band.kc·C` values.
#[inline(always)]
pub(super) unsafe fn pack_b<B: Operand, const C: usize, const MAG: bool>(
    s: &Shape<B>,
    band: &Band,
    out: &mut [f64],
    abs: &mut [f64],
) {
    let Band { pc, kc, jr, .. } = *band;
    // SAFETY: rows pc..pc + kc, columns jr..jr + C of b.
    let bp = unsafe { s.b.offset(pc as isize * s.ldb + jr as isize * s.csb) };
    let out = &mut out[..kc * C];
    if s.csb == 1 || C == 1 {
        for (p, row) in out.chunks_exact_mut(C).enumerate() {
            // SAFETY: row pc + p of the window, C values from column jr.
            let raw: [B; C] =
                unsafe { std::ptr::read_unaligned(bp.offset(p as isize * s.ldb) as *const [B; C]) };
            let v = raw.map(Operand::wide);
            row.copy_from_slice(&v);
            if MAG {
                abs[p * C..(p + 1) * C].copy_from_slice(&v.map(f64::abs));
            }
        }
    } else {
        // A transposed view (or another strided one): 8 × 8 blocks, each read as eight
        // runs of eight values down a column (contiguous when the row stride is 1) and
        // written as eight rows of eight; what the blocks leave, value by value.
        let get = |p: usize, j: usize| {
            // SAFETY: row pc + p, column jr + j of the window (p < kc, j < C).
            unsafe { *bp.offset(p as isize * s.ldb + j as isize * s.csb) }.wide()
        };
        let (full_p, full_j) = (kc - kc % 8, C - C % 8);
        // A transposed bf16 view (dgrad's weight): eight columns' eight contiguous values
        // transposed as 16-bit words in registers, then widened a row at a time.
        #[cfg(target_arch = "x86_64")]
        let words =
            s.ldb == 1 && std::any::TypeId::of::<B>() == std::any::TypeId::of::<half::bf16>();
        #[cfg(not(target_arch = "x86_64"))]
        let words = false;
        for j0 in (0..full_j).step_by(8) {
            for p0 in (0..full_p).step_by(8) {
                let mut t = [[0.0f64; 8]; 8];
                #[cfg(target_arch = "x86_64")]
                if words {
                    // SAFETY: rows pc + p0 .. + 8 of columns jr + j0 .. + 8 of the window, each
                    // column's eight contiguous (unit row stride); B is bf16, 16 bits.
                    let rows = unsafe {
                        transpose_words(
                            bp.offset(p0 as isize + j0 as isize * s.csb) as *const u16,
                            s.csb,
                        )
                    };
                    for (row, bits) in t.iter_mut().zip(rows) {
                        *row = bits.map(|b| half::bf16::from_bits(b).wide());
                    }
                }
                if !words {
                    // Columns outside, so that each column's eight values are read in a row.
                    for jj in 0..8 {
                        for (pp, row) in t.iter_mut().enumerate() {
                            row[jj] = get(p0 + pp, j0 + jj);
                        }
                    }
                }
                for (pp, row) in t.iter().enumerate() {
                    let at = (p0 + pp) * C + j0;
                    out[at..at + 8].copy_from_slice(row);
                    if MAG {
                        abs[at..at + 8].copy_from_slice(&row.map(f64::abs));
                    }
                }
            }
        }
        for p in 0..kc {
            let j_from = if p < full_p { full_j } else { 0 };
            for j in j_from..C {
                let v = get(p, j);
                out[p * C + j] = v;
                if MAG {
                    abs[p * C + j] = v.abs();
                }
            }
        }
    }
}

/// The 8 × 8 block of 16-bit words whose column `j` is the eight contiguous words at
/// `at + j·stride`: row `p` of the result holds word `p` of every column.
///
/// # Safety
/// The eight runs of eight words must be readable.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transpose_words(at: *const u16, stride: isize) -> [[u16; 8]; 8] {
    use std::arch::x86_64::*;
    // SAFETY: SSE2 is part of x86-64; the loads read the caller's eight runs.
    unsafe {
        let c: [__m128i; 8] =
            std::array::from_fn(|j| _mm_loadu_si128(at.offset(j as isize * stride).cast()));
        // Pairs of columns interleaved by word, then by pairs of words, then by quadruples.
        let w: [__m128i; 8] = std::array::from_fn(|i| {
            let (x, y) = (c[2 * (i % 4)], c[2 * (i % 4) + 1]);
            if i < 4 {
                _mm_unpacklo_epi16(x, y)
            } else {
                _mm_unpackhi_epi16(x, y)
            }
        });
        // w[0..4]: words 0-3 of column pairs (0,1) (2,3) (4,5) (6,7); w[4..8]: words 4-7.
        let d: [__m128i; 8] = std::array::from_fn(|i| {
            let h = 4 * (i / 4);
            let (x, y) = if i % 4 < 2 {
                (w[h], w[h + 1])
            } else {
                (w[h + 2], w[h + 3])
            };
            if i % 2 == 0 {
                _mm_unpacklo_epi32(x, y)
            } else {
                _mm_unpackhi_epi32(x, y)
            }
        });
        // d[h + 0/1]: words (0,1)/(2,3) of columns 0-3 (h = 0) or words (4,5)/(6,7) (h = 4);
        // d[h + 2/3]: the same of columns 4-7.
        let mut out = [[0u16; 8]; 8];
        for (p, row) in out.iter_mut().enumerate() {
            let (h, q) = (4 * (p / 4), (p % 4) / 2);
            let (x, y) = (d[h + q], d[h + 2 + q]);
            let r = if p % 2 == 0 {
                _mm_unpacklo_epi64(x, y)
            } else {
                _mm_unpackhi_epi64(x, y)
            };
            _mm_storeu_si128(row.as_mut_ptr().cast(), r);
        }
        out
    }
}

/// `|a|` of rows `ic..ic + mc`, columns `pc..pc + kc`, for the row tiles that will read it:
/// the tile of rows `ic + t·MR ..` (`mr` of them) at `out[t·MR·kc ..]`, its element `[i, p]`
/// at `p·mr + i` (the order the tile broadcasts them in).
///
/// # Safety
/// The window must lie inside `s.a`; `out` must hold `mc·kc` values.
#[inline(always)]
pub(super) unsafe fn pack_a_abs<B, const MR: usize>(
    s: &Shape<B>,
    pc: usize,
    kc: usize,
    ic: usize,
    mc: usize,
    out: &mut [f64],
) {
    for i in 0..mc {
        let (t, ti) = (i / MR, i % MR);
        let mr = MR.min(mc - t * MR);
        let tile = &mut out[t * MR * kc..t * MR * kc + mr * kc];
        // SAFETY: row ic + i < m and columns pc..pc + kc < k of a.
        let row = unsafe { s.a.offset((ic + i) as isize * s.rsa + pc as isize * s.csa) };
        for p in 0..kc {
            tile[p * mr + ti] = unsafe { *row.offset(p as isize * s.csa) }.abs();
        }
    }
}

/// Where one column tile of one band lies: band rows `pc..pc + kc` of `b`, rows
/// `ic..ic + mc` of `a`, columns from `jr`.
#[derive(Clone, Copy)]
pub(super) struct Band {
    pub(super) pc: usize,
    pub(super) kc: usize,
    pub(super) ic: usize,
    pub(super) mc: usize,
    pub(super) jr: usize,
}

/// The `MR`-row tiles of `band` against a `C`-wide column tile `b` (`kc` rows `ldb` apart):
/// the band of `s.b` itself, or its packed copy, then with magnitudes `babs` holding the
/// copy's absolute values the same way, and `a_abs` the block's `|a|` by row tiles (see
/// [`pack_a_abs`]): the tile broadcasts them from memory rather than taking an absolute
/// value of every broadcast.
///
/// # Safety
/// As for [`body`]; `b` (and `babs` with `MAG`) must hold `band.kc` rows of `C` values,
/// `ldb` apart, and `a_abs` the block's `mc·kc` values with `MAG`.
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
    babs: *const f64,
    a_abs: &[f64],
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
            babs,
            a_abs: if MAG {
                a_abs[(ir - ic) * kc..].as_ptr()
            } else {
                std::ptr::null()
            },
            first: pc == 0,
        };
        unsafe { tile_rows::<T, MR, C, FMA, MAG>(mr, &t) };
        ir += MR;
    }
}
