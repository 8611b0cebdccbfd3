//! The case's values from the seed's stream: each value one 32-bit word at its own position,
//! made in parallel chunks and rounded to the case's format.

use moecheck_reference::format::{round_slice, Format, Overflow};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Value `i` of an array is scaled by `of[i / per]`.
pub(super) struct Scales<'a> {
    pub(super) of: &'a [f64],
    pub(super) per: usize,
}

/// `out[i] = store(round_to(x_i · scales.of[i / scales.per], format))` where `x_i` =
/// [`unit_range`] of the word at position `start + i` of `rng`'s stream; in parallel chunks,
/// each seeking to its start. The stream's words are drawn in bulk (the same words as one
/// `next_u32` at a time), in batches that never straddle a change of scale, and each batch is
/// rounded by [`round_slice`] (`round_to`'s bits, vectorised), or to bf16 by [`bf16_unit`]
/// where that gives the same bits (a batch whose scale is a power of two that keeps its values
/// normal).
pub(super) fn fill<T: Send>(
    rng: &ChaCha8Rng,
    start: u128,
    out: &mut [T],
    scales: &Scales,
    format: Format,
    store: impl Fn(f64) -> T + Sync,
) {
    const CHUNK: usize = 1 << 20;
    const WORDS: usize = 1024;
    let chunks: Vec<(usize, &mut [T])> = out
        .chunks_mut(CHUNK)
        .enumerate()
        .map(|(c, part)| (c * CHUNK, part))
        .collect();
    moecheck_reference::par::map_by_cost(
        chunks,
        |(_, part)| part.len(),
        |(first, part)| {
            let mut r = rng.clone();
            r.set_word_pos(start + first as u128);
            let (mut words, mut xs, mut ys) = ([0u32; WORDS], [0f64; WORDS], [0f64; WORDS]);
            let mut done = 0;
            while done < part.len() {
                let i = first + done;
                let group = i / scales.per;
                let group_end = (group + 1).saturating_mul(scales.per);
                let n = WORDS.min(part.len() - done).min(group_end - i);
                r.fill(&mut words[..n]);
                let scale = scales.of[group];
                match bf16_unit_scale(scale).filter(|_| format == Format::Bf16) {
                    Some(s) => {
                        for (y, w) in ys[..n].iter_mut().zip(&words[..n]) {
                            *y = bf16_unit(*w, s);
                        }
                    }
                    None => {
                        for (x, w) in xs[..n].iter_mut().zip(&words[..n]) {
                            *x = unit_range(*w) * scale;
                        }
                        round_slice(&xs[..n], &mut ys[..n], format, Overflow::Ieee);
                    }
                }
                for (o, y) in part[done..done + n].iter_mut().zip(&ys[..n]) {
                    *o = store(*y);
                }
                done += n;
            }
        },
    );
}

/// A value uniform on `[-1, 1)` from one 32-bit word: its top 24 bits `t` as `t·2^-23 - 1`
/// (exact in f64), a grid of 2^-23, as fine as an f32 near 1 and finer than a bf16 or an f16
/// anywhere their values are not tiny. One word a value rather than the 64 bits of rand's
/// `random_range` for f64: drawing the stream is most of the work of making a case (a
/// DeepSeek-V3 case has 7.5 G values).
#[inline(always)]
pub(super) fn unit_range(w: u32) -> f64 {
    f64::from(w >> 8) * 2f64.powi(-23) - 1.0
}

/// `scale` as an f32 where [`bf16_unit`] gives `round_to`'s bits for it: a power of two
/// between 2^-100 and 2^100, so that every `unit_range(w)·scale` is an f32 (a multiple of
/// `2^-23·scale` below `scale` in magnitude) far from bf16's overflow and subnormals.
pub(super) fn bf16_unit_scale(scale: f64) -> Option<f32> {
    // A power of two has no significand bits; `log2` alone would also take a scale a few
    // ulps off one (it rounds `log2(16·(1 + 2^-52))` to 4).
    let power = scale > 0.0 && scale.to_bits() & ((1 << 52) - 1) == 0;
    (power && scale.log2().abs() <= 100.0).then_some(scale as f32)
}

/// `round_to(unit_range(w)·scale, Bf16, Ieee)` for a scale of [`bf16_unit_scale`], without the
/// general rounding: the product is exact in f32 (24 significant bits at most), and rounding
/// an f32 to bf16, nearest with ties to even, adds `0x7fff` plus the kept part's lowest bit
/// to its bits and clears the low 16 (finite and normal here, so the carry at most steps the
/// exponent, as rounding up does).
#[inline(always)]
pub(super) fn bf16_unit(w: u32, scale: f32) -> f64 {
    let x = ((w >> 8) as f32 * 2f32.powi(-23) - 1.0) * scale;
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
    f64::from(f32::from_bits(rounded))
}

#[cfg(test)]
#[path = "fill_tests.rs"]
mod tests;
