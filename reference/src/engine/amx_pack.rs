//! The AMX path's copies ([`super::run`]): `|a|` and `|b|` rounded up to bf16 in the layouts
//! the tiles load, and their ranges.

use std::arch::x86_64::*;

use super::super::band::Shape;
use super::super::bf16mag::{up, up16, Lanes, Range};
use super::super::operand::Operand;
use super::{DEPTH, TILE};

/// `|a|` of rows `ic..ic + mc`, columns `pc..pc + kc`, rounded up to bf16, in rows of `depth`
/// (the columns past `kc` and the rows past `mc` zero): row `i` at `out[i·depth ..]`, 16
/// values at a time where a row is contiguous. Their range joins `range`.
///
/// # Safety
/// The window must lie inside `s.a`; the CPU must have AVX-512F.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn pack_a_rows<B>(
    s: &Shape<B>,
    pc: usize,
    kc: usize,
    depth: usize,
    ic: usize,
    mc: usize,
    out: &mut [u16],
    range: &mut Range,
) {
    // SAFETY: AVX-512F (the caller's).
    let mut lanes = unsafe { Lanes::new() };
    for (i, row) in out.chunks_exact_mut(depth).enumerate() {
        if i >= mc {
            row.fill(0);
            continue;
        }
        // SAFETY: row ic + i < m and columns pc..pc + kc <= k of a.
        let from = unsafe { s.a.offset((ic + i) as isize * s.rsa + pc as isize * s.csa) };
        let mut p = 0;
        if s.csa == 1 {
            while p + TILE <= kc {
                // SAFETY: columns pc + p .. pc + p + 16 of the row, contiguous; 16 bf16 out.
                unsafe {
                    let bits = up16(
                        _mm512_loadu_pd(from.add(p)),
                        _mm512_loadu_pd(from.add(p + 8)),
                    );
                    lanes.see(bits);
                    let halves = _mm512_cvtepi32_epi16(bits);
                    _mm256_storeu_si256(row.as_mut_ptr().add(p).cast(), halves);
                }
                p += TILE;
            }
        }
        for (p, x) in row[..kc].iter_mut().enumerate().skip(p) {
            // SAFETY: column pc + p < pc + kc of the row.
            let bits = up(unsafe { *from.offset(p as isize * s.csa) });
            range.see(bits);
            *x = bits as u16;
        }
        row[kc..].fill(0);
    }
    // SAFETY: AVX-512F (the caller's).
    *range = range.join(unsafe { lanes.range() });
}

/// Band `pc..pc + kc` of `b`, every column, as `|b|` rounded up to bf16 pairs of consecutive
/// rows, by column tiles of 16: tile `t`'s pair row `pp` at `out[(t·rows + pp)·16 ..]` (`rows`
/// = `kc` rounded up to 32, halved), column `j`'s pair the low half row `2pp`; the columns
/// past `n` and the pair rows past the band zero. Read where it lies: rows 16 values at a time
/// where they are contiguous, else a transposed view down its contiguous columns, 16 pairs
/// at a time for bf16. Returns the range.
///
/// # Safety
/// The band must lie inside `s.b`; `out` must hold `n` rounded up to 16 times `rows` pairs;
/// the CPU must have AVX-512F.
#[inline(always)]
pub(super) unsafe fn pack_b_band<B: Operand>(
    s: &Shape<B>,
    pc: usize,
    kc: usize,
    out: &mut [u32],
) -> Range {
    let (pairs, rows) = (kc.div_ceil(2), kc.next_multiple_of(DEPTH) / 2);
    // Every tile `out` holds (one past the columns, when their number is odd, stays zero).
    let tiles = out.len() / (rows * TILE);
    assert!(
        tiles >= s.n.div_ceil(TILE),
        "pack_b_band: {tiles} column tiles"
    );
    // Per lane, the largest bits and the smallest of `bits - 1` (wrapping: a zero becomes the
    // largest), so that both are plain minima and maxima.
    let (mut lo, mut hi) = ([u32::MAX; TILE], [0u32; TILE]);
    let mut see = |w: &[u32; TILE]| {
        for j in 0..TILE {
            let (l, h) = (w[j] & 0xffff, w[j] >> 16);
            lo[j] = lo[j].min(l.wrapping_sub(1)).min(h.wrapping_sub(1));
            hi[j] = hi[j].max(l).max(h);
        }
    };
    let at = |p: usize, j: usize| -> u32 {
        if p < kc {
            // SAFETY: row pc + p < k, column j < n of b.
            unsafe { *s.b.offset((pc + p) as isize * s.ldb + j as isize * s.csb) }.up_bf16()
        } else {
            0
        }
    };
    let full = s.n - s.n % TILE;
    let is_bf16 = std::any::TypeId::of::<B>() == std::any::TypeId::of::<half::bf16>();
    if s.csb == 1 {
        for pp in 0..pairs {
            let row = |p: usize, j: usize| -> [u32; TILE] {
                if p < kc {
                    // SAFETY: row pc + p < k, columns j..j + 16 <= n of b, contiguous.
                    let raw: [B; TILE] = unsafe {
                        let at = s.b.offset((pc + p) as isize * s.ldb + j as isize);
                        std::ptr::read_unaligned(at as *const [B; TILE])
                    };
                    raw.map(Operand::up_bf16)
                } else {
                    [0; TILE]
                }
            };
            for j0 in (0..full).step_by(TILE) {
                let (l, h) = (row(2 * pp, j0), row(2 * pp + 1, j0));
                let w: [u32; TILE] = std::array::from_fn(|j| l[j] | (h[j] << 16));
                see(&w);
                let at = (j0 / TILE * rows + pp) * TILE;
                out[at..at + TILE].copy_from_slice(&w);
            }
        }
    } else if is_bf16 && s.ldb == 1 {
        // A transposed bf16 view: a pair is two adjacent values of a column, one 32-bit word;
        // 16 words down a column at a time, each to its pair row.
        for j in 0..full {
            let column = s.b.wrapping_offset(pc as isize + j as isize * s.csb) as *const u16;
            let mut pp = 0;
            while pp + TILE <= kc / 2 {
                // SAFETY: rows pc + 2pp .. pc + 2pp + 32 <= pc + kc of column j, contiguous.
                let raw: [u32; TILE] =
                    unsafe { std::ptr::read_unaligned(column.add(2 * pp) as *const [u32; TILE]) };
                let w = raw.map(|x| x & 0x7fff_7fff);
                see(&w);
                for (t, &x) in w.iter().enumerate() {
                    out[(j / TILE * rows + pp + t) * TILE + j % TILE] = x;
                }
                pp += TILE;
            }
            for pp in pp..pairs {
                let x = at(2 * pp, j) | (at(2 * pp + 1, j) << 16);
                let mut w = [0; TILE];
                w[0] = x;
                see(&w);
                out[(j / TILE * rows + pp) * TILE + j % TILE] = x;
            }
        }
    } else {
        for j in 0..full {
            for pp in 0..pairs {
                let x = at(2 * pp, j) | (at(2 * pp + 1, j) << 16);
                let mut w = [0; TILE];
                w[0] = x;
                see(&w);
                out[(j / TILE * rows + pp) * TILE + j % TILE] = x;
            }
        }
    }
    // The last, partial column tile (zero past n), and every tile's pair rows past the band.
    if full < s.n {
        let t = full / TILE;
        for pp in 0..pairs {
            let w: [u32; TILE] = std::array::from_fn(|jj| {
                let j = full + jj;
                if j < s.n {
                    at(2 * pp, j) | (at(2 * pp + 1, j) << 16)
                } else {
                    0
                }
            });
            see(&w);
            out[(t * rows + pp) * TILE..(t * rows + pp + 1) * TILE].copy_from_slice(&w);
        }
    }
    for t in 0..tiles {
        let from = if t < s.n.div_ceil(TILE) { pairs } else { 0 };
        out[(t * rows + from) * TILE..(t + 1) * rows * TILE].fill(0);
    }
    let below = lo.into_iter().min().unwrap_or(u32::MAX);
    Range {
        lo: if below == u32::MAX {
            u32::MAX
        } else {
            below + 1
        },
        hi: hi.into_iter().max().unwrap_or(0),
    }
}
