//! The launch plans, checked without a GPU: coverage (every output element exactly once),
//! cuBLAS argument constraints, and CPU executions of both plans against the f64 reference
//! on small-integer cases (where the reference is exact, so equality is demanded).

use super::*;
use moecheck_reference::format::Format;
use moecheck_reference::gemm::{reference, GroupedGemmCase, Passes, TailContract};
use ndarray::{Array2, Array3};
use proptest::prelude::*;

/// Edge shapes: sizes around the 64-row tile, empty experts first/middle/last, tails, zeros.
fn edge_table() -> Vec<(Vec<usize>, usize, usize, usize)> {
    vec![
        (vec![], 0, 0, 0),
        (vec![0], 0, 5, 3),
        (vec![0, 0, 0], 7, 5, 3),
        (vec![1], 1, 1, 1),
        (vec![63, 0, 64, 65], 200, 17, 9),
        (vec![0, 127, 128, 129, 0], 390, 65, 64),
        (vec![3, 0, 2], 9, 0, 4),
        (vec![3, 0, 2], 9, 4, 0),
        (vec![64], 64, 130, 129),
        (vec![5, 5], 10, 64, 1),
    ]
}

fn check_coverage(pass: Pass, sizes: &[usize], m: usize, k: usize, n: usize) {
    let plan = plan_tiles(pass, sizes, m, k, n).unwrap();
    let off = offsets(sizes);
    let used = off[sizes.len()];
    for t in &plan.tiles {
        assert!(
            t[2] >= 1 && t[2] as usize <= TILE_M,
            "{pass}: tile {t:?} has bad rows"
        );
    }
    match pass {
        Pass::Fwd | Pass::Dgrad => {
            let mut hits = vec![0u32; m];
            for &[g, r0, rows] in &plan.tiles {
                let (lo, hi) = if g < 0 {
                    (used, m)
                } else {
                    (off[g as usize], off[g as usize + 1])
                };
                let (r0, rows) = (r0 as usize, rows as usize);
                assert!(
                    r0 >= lo && r0 + rows <= hi,
                    "{pass}: tile straddles its group"
                );
                for h in &mut hits[r0..r0 + rows] {
                    *h += 1;
                }
            }
            assert!(
                hits.iter().all(|&h| h == 1),
                "{pass} {sizes:?}: rows {hits:?}"
            );
        }
        Pass::Wgrad => {
            let mut hits = vec![vec![0u32; k]; sizes.len()];
            for &[g, k0, rows] in &plan.tiles {
                assert!(g >= 0, "wgrad has no tail tiles");
                for h in &mut hits[g as usize][k0 as usize..(k0 + rows) as usize] {
                    *h += 1;
                }
            }
            assert!(hits.iter().flatten().all(|&h| h == 1), "wgrad {sizes:?}");
        }
    }
    let elements = match pass {
        Pass::Fwd => m * n,
        Pass::Dgrad => m * k,
        Pass::Wgrad => sizes.len() * k * n,
    };
    assert_eq!(
        plan.grid().is_none(),
        elements == 0,
        "{pass} {sizes:?} m{m} k{k} n{n}"
    );
    if let Some((x, y)) = plan.grid() {
        assert_eq!(x as usize, plan.tiles.len());
        assert_eq!(y as usize, plan.cols.div_ceil(TILE_N));
    }
}

#[test]
fn tiles_cover_every_output_element_once_on_the_edge_table() {
    for (sizes, m, k, n) in edge_table() {
        for pass in Pass::ALL {
            check_coverage(pass, &sizes, m, k, n);
        }
    }
}

#[test]
fn too_many_rows_and_oversized_shapes_are_refused() {
    assert!(matches!(
        plan_tiles(Pass::Fwd, &[3, 4], 6, 1, 1),
        Err(PlanError::GroupsExceedRows { sum: 7, m: 6 })
    ));
    assert!(plan_tiles(Pass::Fwd, &[1], 1, 1usize << 31, 1).is_err());
    assert!(plan_tiles(Pass::Fwd, &[1], 1, 1, 64 * 65_536).is_err());
    assert!(plan_blas(Pass::Wgrad, &[3, 4], 6, 1, 1).is_err());
}

#[test]
fn grid_1d_never_launches_nothing() {
    assert_eq!(grid_1d(0, 256, 1024), None);
    assert_eq!(grid_1d(1, 256, 1024), Some((1, 256)));
    assert_eq!(grid_1d(257, 256, 1024), Some((2, 256)));
    assert_eq!(grid_1d(1 << 40, 256, 1024), Some((1024, 256)));
}

/// Small-integer case (exact in f64 and bf16).
fn int_case(sizes: &[usize], tail: usize, k: usize, n: usize, seed: u64) -> GroupedGemmCase {
    let m = sizes.iter().sum::<usize>() + tail;
    let g = sizes.len();
    let v =
        |i: usize| (((i as u64).wrapping_mul(2654435761).wrapping_add(seed) >> 7) % 9) as f32 - 4.0;
    GroupedGemmCase {
        lhs: Array2::from_shape_fn((m, k), |(r, c)| v(r * 31 + c)),
        rhs: Array3::from_shape_fn((g, k, n), |(a, b, c)| v(a * 977 + b * 13 + c + 5)).into(),
        group_sizes: sizes.to_vec(),
        dout: Some(Array2::from_shape_fn((m, n), |(r, c)| {
            v(r * 7 + c * 3 + 11)
        })),
        dtype: Format::Bf16,
        out_dtype: Format::F32,
        tail: TailContract::Zero,
    }
}

/// Column-major `C = op(A) op(B)` over flat row-major storage, as cuBLAS would do it.
fn exec_blas(case: &GroupedGemmCase, pass: Pass) -> Vec<f64> {
    let (m, k, n) = (case.m(), case.k(), case.n());
    let plan = plan_blas(pass, &case.group_sizes, m, k, n).unwrap();
    let lhs: Vec<f64> = case.lhs.iter().map(|&x| x as f64).collect();
    let rhs: Vec<f64> = case.rhs.f32().iter().map(|&x| x as f64).collect();
    let dout: Vec<f64> = case
        .dout
        .as_ref()
        .unwrap()
        .iter()
        .map(|&x| x as f64)
        .collect();
    let len = match pass {
        Pass::Fwd => m * n,
        Pass::Dgrad => m * k,
        Pass::Wgrad => case.groups() * k * n,
    };
    let mut out = vec![f64::NAN; len];
    let input = |i: Input| match i {
        Input::Lhs => &lhs,
        Input::Rhs => &rhs,
        Input::Dout => &dout,
    };
    for c in &plan.calls {
        // cuBLAS's argument rules (lda >= rows of A as stored, etc.).
        assert!(c.m > 0 && c.n > 0 && c.k > 0, "{c:?}");
        assert!(c.lda >= if c.trans_a { c.k } else { c.m }, "{c:?}");
        assert!(c.ldb >= if c.trans_b { c.n } else { c.k }, "{c:?}");
        assert!(c.ldc >= c.m, "{c:?}");
        let (a, b) = (input(c.a.0), input(c.b.0));
        for j in 0..c.n as usize {
            for i in 0..c.m as usize {
                let mut s = 0.0;
                for p in 0..c.k as usize {
                    let av = if c.trans_a {
                        a[c.a.1 + p + i * c.lda as usize]
                    } else {
                        a[c.a.1 + i + p * c.lda as usize]
                    };
                    let bv = if c.trans_b {
                        b[c.b.1 + j + p * c.ldb as usize]
                    } else {
                        b[c.b.1 + p + j * c.ldb as usize]
                    };
                    s += av * bv;
                }
                let idx = c.c.1 + i + j * c.ldc as usize;
                assert!(out[idx].is_nan(), "{pass}: element {idx} written twice");
                out[idx] = s;
            }
        }
    }
    for z in &plan.zeros {
        for x in &mut out[z.offset..z.offset + z.len] {
            assert!(x.is_nan(), "{pass}: zero fill overlaps a GEMM");
            *x = 0.0;
        }
    }
    out
}

/// The tile schedule executed with the kernels' indexing formulas (gemm_tile.cuh's
/// fwd_problem / dgrad_problem / wgrad_problem), transcribed.
#[allow(clippy::type_complexity)]
fn exec_tiles(case: &GroupedGemmCase, pass: Pass) -> Vec<f64> {
    let (m, k, n) = (case.m(), case.k(), case.n());
    let plan = plan_tiles(pass, &case.group_sizes, m, k, n).unwrap();
    let off = case.offsets();
    let lhs: Vec<f64> = case.lhs.iter().map(|&x| x as f64).collect();
    let rhs: Vec<f64> = case.rhs.f32().iter().map(|&x| x as f64).collect();
    let dout: Vec<f64> = case
        .dout
        .as_ref()
        .unwrap()
        .iter()
        .map(|&x| x as f64)
        .collect();
    let len = match pass {
        Pass::Fwd => m * n,
        Pass::Dgrad => m * k,
        Pass::Wgrad => case.groups() * k * n,
    };
    let mut out = vec![f64::NAN; len];
    let Some((gx, gy)) = plan.grid() else {
        assert!(len == 0);
        return out;
    };
    for bx in 0..gx as usize {
        let [g, row0, rows] = plan.tiles[bx];
        let (row0, rows) = (row0 as usize, rows as usize);
        let gu = g.max(0) as usize;
        // (a, a_rs, a_is, b, b_is, b_cs, c, c_rs, cols, red, zero)
        let (a, ars, ais, bb, bis, bcs, c, crs, cols, red, zero): (
            (&Vec<f64>, usize),
            usize,
            usize,
            (&Vec<f64>, usize),
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            bool,
        ) = match pass {
            Pass::Fwd => (
                (&lhs, row0 * k),
                k,
                1,
                (&rhs, gu * k * n),
                n,
                1,
                row0 * n,
                n,
                n,
                k,
                g < 0,
            ),
            Pass::Dgrad => (
                (&dout, row0 * n),
                n,
                1,
                (&rhs, gu * k * n),
                1,
                n,
                row0 * k,
                k,
                k,
                n,
                g < 0,
            ),
            Pass::Wgrad => {
                let (lo, hi) = (off[gu], off[gu + 1]);
                (
                    (&lhs, lo * k + row0),
                    1,
                    k,
                    (&dout, lo * n),
                    n,
                    1,
                    gu * k * n + row0 * n,
                    n,
                    n,
                    hi - lo,
                    false,
                )
            }
        };
        for by in 0..gy as usize {
            for r in 0..TILE_M {
                for cc in 0..TILE_N {
                    let col = by * TILE_N + cc;
                    if r >= rows || col >= cols {
                        continue;
                    }
                    let mut s = 0.0;
                    if !zero {
                        for i in 0..red {
                            s += a.0[a.1 + r * ars + i * ais] * bb.0[bb.1 + i * bis + col * bcs];
                        }
                    }
                    let idx = c + r * crs + col;
                    assert!(out[idx].is_nan(), "{pass}: element {idx} written twice");
                    out[idx] = s;
                }
            }
        }
    }
    out
}

fn want(case: &GroupedGemmCase, pass: Pass) -> Vec<f64> {
    let r = reference(case, Passes::only(pass)).unwrap().value;
    match pass {
        Pass::Fwd => r.out.unwrap().iter().copied().collect(),
        Pass::Dgrad => r.dlhs.unwrap().iter().copied().collect(),
        Pass::Wgrad => r.drhs.unwrap().iter().copied().collect(),
    }
}

fn assert_same(what: &str, pass: Pass, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || g == w,
            "{what} {pass}: element {i}: {g} vs {w}"
        );
    }
}

#[test]
fn both_plans_reproduce_the_reference_on_the_edge_table() {
    for (i, (sizes, m, k, n)) in edge_table().into_iter().enumerate() {
        let tail = m - sizes.iter().sum::<usize>();
        let case = int_case(&sizes, tail, k, n, i as u64);
        for pass in Pass::ALL {
            let w = want(&case, pass);
            assert_same("blas", pass, &exec_blas(&case, pass), &w);
            assert_same("tiles", pass, &exec_tiles(&case, pass), &w);
        }
    }
}

#[test]
fn pointer_arrays_point_at_each_problem() {
    let plan = plan_blas(Pass::Wgrad, &[2, 0, 3], 7, 4, 5).unwrap();
    assert_eq!(
        plan.calls.len(),
        2,
        "the empty expert gets a zero fill, not a call"
    );
    assert_eq!(
        plan.zeros,
        vec![ZeroFill {
            output: Output::Drhs,
            offset: 20,
            len: 20
        }]
    );
    let base = |i: Input| match i {
        Input::Lhs => 0x1000,
        Input::Rhs => 0x2000,
        Input::Dout => 0x3000,
    };
    let arr = grouped_arrays(&plan.calls, base, 2, |_| 0x9000, 4);
    assert_eq!(arr.group_size, vec![1, 1]);
    // Expert 2 starts at row 2: dout offset 2*5 elements, lhs 2*4, drhs[2] at 2*4*5.
    assert_eq!(arr.a_ptrs, vec![0x3000, 0x3000 + 10 * 2]);
    assert_eq!(arr.b_ptrs, vec![0x1000, 0x1000 + 8 * 2]);
    assert_eq!(arr.c_ptrs, vec![0x9000, 0x9000 + 40 * 4]);
    assert_eq!(arr.k, vec![2, 3]);
    assert_eq!((arr.m.clone(), arr.n.clone()), (vec![5, 5], vec![4, 4]));
}

#[test]
fn nothing_to_do_means_no_call_and_no_launch() {
    for pass in Pass::ALL {
        let p = plan_blas(pass, &[0, 0], 0, 3, 4).unwrap();
        assert!(p.calls.is_empty(), "{pass}");
        // Only wgrad has elements (two empty experts' drhs): zero fills, never calls.
        let filled: usize = p.zeros.iter().map(|z| z.len).sum();
        assert_eq!(filled, if pass == Pass::Wgrad { 24 } else { 0 }, "{pass}");
        let t = plan_tiles(pass, &[0, 0], 0, 3, 4).unwrap();
        assert_eq!(t.grid().is_none(), pass != Pass::Wgrad);
    }
    // K = 0: fwd is all zero fills, wgrad has nothing to write.
    let p = plan_blas(Pass::Fwd, &[2, 1], 4, 0, 3).unwrap();
    assert!(p.calls.is_empty());
    assert_eq!(p.zeros.iter().map(|z| z.len).sum::<usize>(), 12);
    assert!(plan_tiles(Pass::Wgrad, &[2, 1], 4, 0, 3)
        .unwrap()
        .grid()
        .is_none());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn plans_match_the_reference_on_random_layouts(
        sizes in proptest::collection::vec(prop_oneof![Just(0usize), 1usize..5, 60usize..70], 0..5),
        tail in 0usize..70,
        k in 0usize..70,
        n in 0usize..70,
        seed in any::<u64>(),
    ) {
        let case = int_case(&sizes, tail, k, n, seed);
        for pass in Pass::ALL {
            check_coverage(pass, &sizes, case.m(), k, n);
            let w = want(&case, pass);
            assert_same("blas", pass, &exec_blas(&case, pass), &w);
            assert_same("tiles", pass, &exec_tiles(&case, pass), &w);
        }
    }
}
