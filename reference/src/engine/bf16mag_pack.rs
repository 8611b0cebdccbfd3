//! The copies [`super::run`]'s register tile reads: `|a|` and `|b|` rounded up to bf16, held in
//! f32, in the layouts the tile broadcasts and loads them from, and their ranges.

use std::arch::x86_64::*;

use super::super::band::{Band, Shape};
use super::{up, up16, Lanes, Range, MR, NR};

/// `|a|` of `block`'s rows `ic..ic + mc`, columns `pc..pc + kc`, rounded up to bf16 and held
/// in f32, in pairs of consecutive columns (an odd last column paired with 0), for the row
/// tiles that will read them: the tile of rows `ic + t·MR ..` (`mr` of them) at
/// `out[2·t·MR·kp ..]`, its row `i`'s pair `pp` at `2·(pp·mr + i)` (column `2pp`) and the next
/// (column `2pp + 1`). A row whose columns are contiguous is read 16 values at a time, its
/// eight pairs scattered to their places at once.
///
/// # Safety
/// The window must lie inside `s.a`; the CPU must have AVX-512F.
#[inline(always)]
pub(super) unsafe fn pack_a_pairs<B>(
    s: &Shape<B>,
    block: &Band,
    out: &mut [f32],
    vals: &mut [f64],
    range: &mut Range,
) {
    let Band { pc, kc, ic, mc, .. } = *block;
    let kp = kc.div_ceil(2);
    // SAFETY: AVX-512F (the caller's).
    let mut lanes = unsafe { Lanes::new() };
    for i in 0..mc {
        let (t, ti) = (i / MR, i % MR);
        let mr = MR.min(mc - t * MR);
        let at_tile = 2 * t * MR * kp..2 * (t * MR * kp + mr * kp);
        let tile = &mut out[at_tile.clone()];
        let tile_vals = &mut vals[at_tile];
        // SAFETY: row ic + i < m and columns pc..pc + kc <= k of a.
        let row = unsafe { s.a.offset((ic + i) as isize * s.rsa + pc as isize * s.csa) };
        let mut pp = 0;
        if s.csa == 1 {
            // SAFETY: AVX-512F; the pair indices (in 8-byte units) of pairs pp..pp + 8.
            let step = unsafe { _mm512_set1_epi64((8 * mr) as i64) };
            // Pair `q`'s place (8-byte units of `tile`), and its two values' (of
            // `tile_vals`): the first eight columns' and the next eight's.
            let places: [i64; 8] = std::array::from_fn(|q| (q * mr + ti) as i64);
            let halves: [[i64; 8]; 2] = std::array::from_fn(|u| {
                std::array::from_fn(|l| 2 * places[4 * u + l / 2] + l as i64 % 2)
            });
            let (mut index, mut first, mut next) = unsafe {
                (
                    _mm512_loadu_si512(places.as_ptr().cast()),
                    _mm512_loadu_si512(halves[0].as_ptr().cast()),
                    _mm512_loadu_si512(halves[1].as_ptr().cast()),
                )
            };
            let value_step = unsafe { _mm512_set1_epi64((16 * mr) as i64) };
            while 2 * pp + 16 <= kc {
                // SAFETY: columns 2pp..2pp + 16 < kc of the row, contiguous; the eight pairs'
                // places `2·((pp + q)·mr + ti)` lie inside the tile.
                unsafe {
                    let (v0, v1) = (
                        _mm512_loadu_pd(row.add(2 * pp)),
                        _mm512_loadu_pd(row.add(2 * pp + 8)),
                    );
                    _mm512_i64scatter_pd::<8>(tile_vals.as_mut_ptr().cast(), first, v0);
                    _mm512_i64scatter_pd::<8>(tile_vals.as_mut_ptr().cast(), next, v1);
                    first = _mm512_add_epi64(first, value_step);
                    next = _mm512_add_epi64(next, value_step);
                    let bits = up16(v0, v1);
                    lanes.see(bits);
                    let wide = _mm512_slli_epi32::<16>(bits);
                    _mm512_i64scatter_epi64::<8>(tile.as_mut_ptr().cast(), index, wide);
                    index = _mm512_add_epi64(index, step);
                }
                pp += 8;
            }
        }
        let at = |p: usize| unsafe { *row.offset(p as isize * s.csa) };
        for pp in pp..kp {
            let (x, y) = (
                at(2 * pp),
                if 2 * pp + 1 < kc { at(2 * pp + 1) } else { 0.0 },
            );
            let (l, h) = (up(x), up(y));
            range.see(l);
            range.see(h);
            let q = 2 * (pp * mr + ti);
            tile[q] = f32::from_bits(l << 16);
            tile[q + 1] = f32::from_bits(h << 16);
            tile_vals[q] = x;
            tile_vals[q + 1] = y;
        }
    }
    // SAFETY: AVX-512F (the caller's).
    *range = range.join(unsafe { lanes.range() });
}

/// A packed band tile of `b` (`kc` rows of 16): its `|b|` rounded up to bf16 and held in f32,
/// in the same rows (`out[p·16 + j]`; row `kc` zero when `kc` is odd, so that the rows come
/// in pairs). Returns their range.
#[inline(always)]
pub(super) unsafe fn pair_rows(vals: &[f64], kc: usize, out: &mut [f32]) -> Range {
    let rows = kc.next_multiple_of(2);
    assert!(vals.len() >= kc * NR && out.len() >= rows * NR);
    unsafe {
        let mut lanes = Lanes::new();
        for p in 0..rows {
            let bits = if p < kc {
                let at = vals.as_ptr().add(p * NR);
                up16(_mm512_loadu_pd(at), _mm512_loadu_pd(at.add(8)))
            } else {
                _mm512_setzero_si512()
            };
            lanes.see(bits);
            let wide = _mm512_slli_epi32::<16>(bits);
            _mm512_storeu_si512(out.as_mut_ptr().add(p * NR).cast(), wide);
        }
        lanes.range()
    }
}
