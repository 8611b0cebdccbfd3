use super::*;
use moecheck_reference::format::decode_fp8;
use rand::{Rng, SeedableRng};

/// The model element by element, as `emulate` computed it before [`segmented_gemm`]: the
/// contraction `0..n` in segments where both scales are constant, each segment's products
/// summed in f32 from +0 (a rounded product, a rounded addition), scaled with the scales read
/// at its start. `at(i) = (a_i, sa_i, b_i, sb_i)`.
fn element(
    n: usize,
    blocks: (Option<usize>, Option<usize>),
    at: impl Fn(usize) -> (f32, f32, f32, f32),
) -> f32 {
    let cut = |i: usize, c: Option<usize>| c.is_some_and(|c| i.is_multiple_of(c));
    let (mut acc, mut part, mut scales) = (0f32, 0f32, (1f32, 1f32));
    for i in 0..n {
        let (a, sa, b, sb) = at(i);
        if i == 0 {
            scales = (sa, sb);
        } else if cut(i, blocks.0) || cut(i, blocks.1) {
            acc += (part * scales.0) * scales.1;
            part = 0.0;
            scales = (sa, sb);
        }
        part += a * b;
    }
    if n > 0 {
        acc += (part * scales.0) * scales.1;
    }
    acc
}

/// Decoded FP8 values (signed zeros, subnormals, both formats' ranges), so every product is
/// exact in f32 as in the model.
fn fp8(rng: &mut impl Rng, shape: (usize, usize), format: Format) -> Array2<f32> {
    Array2::from_shape_fn(shape, |_| {
        let byte = if rng.random_bool(0.1) {
            0x80 * rng.random_range(0..2u8) // ±0
        } else {
            rng.random_range(0..=255u8)
        };
        let v = decode_fp8(byte, format) as f32;
        if v.is_finite() {
            v
        } else {
            1.0
        }
    })
}

/// Powers of two and irregular scales, as block recipes give them (an MX scale may be an
/// f32 subnormal; a DeepGEMM one is `amax / 448`).
fn scales(rng: &mut impl Rng, shape: (usize, usize)) -> Array2<f32> {
    Array2::from_shape_fn(shape, |_| match rng.random_range(0..3) {
        0 => 2f32.powi(rng.random_range(-140..20)),
        1 => rng.random_range(1e-6f32..1e3) / 448.0,
        _ => rng.random_range(0.5f32..2.0),
    })
}

/// The segmented GEMM gives the element-by-element model's bits: left and right operands in
/// either layout (fwd, dgrad's transposed weight, wgrad's transposed activations), segment
/// grids with tails and unequal blocks, outputs past one tile of rows and columns, f32 and
/// bf16 outputs, an empty contraction.
#[test]
fn segmented_gemm_is_the_element_model() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let cases = [
        // (rows, depth, cols, blocks)
        (5, 300, 7, (Some(128), Some(128))),
        (TILE.0 + 3, 100, TILE.1 + 5, (Some(32), Some(48))),
        (9, 64, 33, (None, Some(16))),
        (4, 10, 3, (Some(4), Some(6))),
        (3, 50, 2, (None, None)),
        (2, 0, 3, (Some(32), Some(32))),
    ];
    for (rows, depth, cols, blocks) in cases {
        for (transpose_a, transpose_b) in [(false, false), (false, true), (true, false)] {
            let a = fp8(&mut rng, (rows, depth), Format::E4m3);
            let b = fp8(&mut rng, (depth, cols), Format::E5m2);
            let at = a.t().as_standard_layout().into_owned();
            let bt = b.t().as_standard_layout().into_owned();
            let (av, bv) = (
                if transpose_a { at.t() } else { a.view() },
                if transpose_b { bt.t() } else { b.view() },
            );
            let sa = scales(&mut rng, (rows, depth));
            let sb = scales(&mut rng, (depth, cols));
            for out in [Format::F32, Format::Bf16] {
                let mut got = Array2::<f32>::from_elem((rows, cols), f32::NAN);
                let scale = (|i, j| sa[(i, j)], |j, c| sb[(j, c)]);
                segmented_gemm(av, bv, blocks, scale, out, got.view_mut());
                let want = Array2::from_shape_fn((rows, cols), |(i, c)| {
                    let acc = element(depth, blocks, |j| {
                        (a[(i, j)], sa[(i, j)], b[(j, c)], sb[(j, c)])
                    });
                    finish(out, acc, 1.0, 1.0)
                });
                let bits = |x: &Array2<f32>| x.mapv(f32::to_bits);
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{rows}x{depth}x{cols} {blocks:?} transposed {transpose_a} {transpose_b} {out}"
                );
            }
        }
    }
}

#[test]
fn segments_cut_at_either_grid() {
    assert_eq!(segments(0, (Some(4), None)), vec![]);
    assert_eq!(segments(5, (None, None)), vec![(0, 5)]);
    assert_eq!(
        segments(10, (Some(4), Some(6))),
        vec![(0, 4), (4, 6), (6, 8), (8, 10)]
    );
    assert_eq!(segments(300, (Some(128), Some(128))).len(), 3);
}
