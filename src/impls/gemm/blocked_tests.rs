use super::*;
use ndarray::{s, Array2};

/// The model element by element: block partials from 0 in order, FMA chains.
fn element(a: &Array2<f32>, b: &Array2<f32>, tile: usize, fused: bool) -> Array2<f32> {
    let (rows, depth) = a.dim();
    Array2::from_shape_fn((rows, b.ncols()), |(i, j)| {
        let mut run = 0.0f32;
        for k0 in (0..depth).step_by(tile) {
            let mut part = 0.0f32;
            for k in k0..(k0 + tile).min(depth) {
                part = if fused {
                    a[(i, k)].mul_add(b[(k, j)], part)
                } else {
                    part + a[(i, k)] * b[(k, j)]
                };
            }
            run += part;
        }
        run
    })
}

/// One sum per element over the whole depth, from +0, in order.
fn chain(a: &Array2<f32>, b: &Array2<f32>, fused: bool) -> Array2<f32> {
    Array2::from_shape_fn((a.nrows(), b.ncols()), |(i, j)| {
        (0..a.ncols()).fold(0.0f32, |s, k| {
            if fused {
                a[(i, k)].mul_add(b[(k, j)], s)
            } else {
                s + a[(i, k)] * b[(k, j)]
            }
        })
    })
}

/// Inexact values (every product and sum rounds): the blocked kernel gives the element
/// model's bits, over shapes with partial tiles, stripes, panels, chunks of K and blocks,
/// for operands in any layout and bf16 right operands.
#[test]
fn blocked_is_the_element_model() {
    let val = |i: usize, j: usize, s: u64| {
        let h = moecheck_reference::seed::mix((i as u64) << 32 ^ j as u64 ^ s);
        ((h >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.3
    };
    for (rows, depth, cols, tile) in [
        (1, 1, 1, 32),
        (7, 33, 17, 32),
        (200, 300, 290, 32),
        (9, 2100, 70, 32),
        (13, 257, 40, 1),
        (6, 100, 32, 7),
        (5, 40, 3, 300),
        (0, 5, 4, 32),
        (4, 0, 5, 32),
    ] {
        let a = Array2::from_shape_fn((rows, depth), |(i, j)| val(i, j, 1));
        let b = Array2::from_shape_fn((depth, cols), |(i, j)| val(i, j, 2));
        let want = element(&a, &b, tile, fused());
        let mut got = Array2::from_elem((rows, cols), f32::NAN);
        blocked_gemm(a.view(), b.view(), tile, got.view_mut());
        let same = |x: &Array2<f32>, y: &Array2<f32>| {
            x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
        };
        assert!(same(&got, &want), "{rows} x {depth} x {cols} / {tile}");
        // Transposed operands (wgrad's lhsᵀ, dgrad's rhsᵀ) and a strided output.
        // Copies laid out transposed (`to_owned` would keep the views' layout, and `at.t()`
        // would be `a`'s own row-major layout again).
        let (at, bt) = (
            a.t().as_standard_layout().into_owned(),
            b.t().as_standard_layout().into_owned(),
        );
        assert!(at.t().strides()[0] == 1 || rows < 2 || depth < 2);
        let mut wide = Array2::from_elem((rows, cols + 3), f32::NAN);
        blocked_gemm(at.t(), bt.t(), tile, wide.slice_mut(s![.., 1..cols + 1]));
        assert!(same(&wide.slice(s![.., 1..cols + 1]).to_owned(), &want));
        assert!(wide.column(0).iter().all(|v| v.is_nan()), "wrote outside c");
        // bf16 right operand: the same as its f32 widening.
        let b16 = b.mapv(bf16::from_f32);
        let want16 = element(&a, &b16.mapv(f32::from), tile, fused());
        blocked_gemm(a.view(), b16.view(), tile, got.view_mut());
        assert!(
            same(&got, &want16),
            "bf16 {rows} x {depth} x {cols} / {tile}"
        );
        // One chain over the whole depth, across chunks and panels, in any layout.
        let mut got = Array2::from_elem((rows, cols), f32::NAN);
        chained_gemm(a.view(), b.view(), got.view_mut());
        let chained = chain(&a, &b, fused());
        assert!(same(&got, &chained), "chain {rows} x {depth} x {cols}");
        wide.fill(f32::NAN);
        chained_gemm(at.t(), bt.t(), wide.slice_mut(s![.., 1..cols + 1]));
        assert!(same(&wide.slice(s![.., 1..cols + 1]).to_owned(), &chained));
        assert!(wide.column(0).iter().all(|v| v.is_nan()), "wrote outside c");
        // SAFETY: `Plain` needs no CPU feature.
        unsafe { gemm::<f32, Plain>(a.view(), b.view(), CHAIN, got.view_mut()) };
        assert!(same(&got, &chain(&a, &b, false)), "plain chain");
        // The portable fallback (unfused), whatever this CPU has.
        let plain = element(&a, &b, tile, false);
        let mut got = Array2::from_elem((rows, cols), f32::NAN);
        // SAFETY: `Plain` needs no CPU feature.
        unsafe { gemm::<f32, Plain>(a.view(), b.view(), tile, got.view_mut()) };
        assert!(
            same(&got, &plain),
            "plain {rows} x {depth} x {cols} / {tile}"
        );
    }
}
