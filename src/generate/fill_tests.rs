use moecheck_reference::format::{round_to, Format, Overflow};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

/// The bf16 shortcut gives `round_to`'s bits for every scale the generator draws (2^-6 to
/// 2^6) and the extremes it accepts, on the stream's words and on the words at the ends of
/// the range, around zero and on rounding ties.
#[test]
fn bf16_by_bits_is_round_to() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut words: Vec<u32> = (0..200_000).map(|_| rng.next_u32()).collect();
    // The ends, zero (t = 2^23) and its neighbours, and ties: x = ±(1/2 + m·2^-24) with the
    // low 16 bits of m exactly 0x8000 (t = 3·2^22 + m/2, or 2^22 - m/2).
    words.extend([
        0,
        1 << 8,
        u32::MAX,
        1 << 31,
        (1 << 31) + 256,
        (1 << 31) - 256,
    ]);
    words.extend((0..128u32).map(|j| (0xc0_0000 + 0x4000 + j * 0x8000) << 8));
    words.extend((0..127u32).map(|j| (0x40_0000 - 0x4000 - j * 0x8000) << 8));
    for e in [-100, -6, -3, 0, 1, 6, 100] {
        let scale = 2f64.powi(e);
        let s = bf16_unit_scale(scale).expect("a power of two in range");
        for &w in &words {
            let want = round_to(unit_range(w) * scale, Format::Bf16, Overflow::Ieee);
            let got = bf16_unit(w, s);
            assert_eq!(got.to_bits(), want.to_bits(), "word {w:#x}, scale 2^{e}");
        }
    }
}

/// Scales the shortcut would get wrong are refused: not powers of two (a few ulps off one
/// included, which `log2` rounds to an integer), or far enough out that products leave
/// bf16's normal range.
#[test]
fn other_scales_take_the_general_rounding() {
    let off = |x: f64| f64::from_bits(x.to_bits() + 1);
    for scale in [
        off(16.0),
        off(2f64.powi(100)),
        off(2f64.powi(-7)),
        3.0,
        0.1,
        2f64.powi(-120),
        2f64.powi(120),
        0.0,
        -1.0,
        f64::NAN,
    ] {
        assert_eq!(bf16_unit_scale(scale), None, "{scale}");
    }
}

/// A case filled through the shortcut holds the values the general rounding gives.
#[test]
fn a_bf16_fill_is_the_general_fill() {
    let rng = ChaCha8Rng::seed_from_u64(11);
    // Powers of two take the shortcut, 3 the general rounding, batch by batch.
    let of = [0.25, 4.0, 3.0, 1.0];
    let scales = Scales { of: &of, per: 1000 };
    let mut fast = vec![0f64; 4000];
    fill(&rng, 5, &mut fast, &scales, Format::Bf16, |x| x);
    let mut r = rng.clone();
    r.set_word_pos(5);
    for (i, got) in fast.iter().enumerate() {
        let want = round_to(
            unit_range(r.next_u32()) * of[i / 1000],
            Format::Bf16,
            Overflow::Ieee,
        );
        assert_eq!(got.to_bits(), want.to_bits(), "value {i}");
    }
}
