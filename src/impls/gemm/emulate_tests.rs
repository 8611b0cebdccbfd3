//! The blocked emulation against the element-by-element model it replaced: on inputs whose
//! sums are exact in f32 (small integers), every element of every pass, NaN poison included,
//! must be the same for the clean model and for every planted bug.

use moecheck_reference::format::{round_to, Format, Overflow};
use moecheck_reference::gemm::{GemmOutputs, GroupedGemmCase, Passes, TailContract, Weights};
use moecheck_reference::op::{Implementation, RunError};
use ndarray::{Array2, Array3};

use super::{Bug, Emulate};
use crate::impls::PlantedBug;

/// The element-by-element model: one blocked f32 dot product per output element.
fn scalar(this: &Emulate, case: &GroupedGemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
    let (m, k, n) = (case.m(), case.k(), case.n());
    let g_count = case.groups();
    let off = case.offsets();
    let used = off[g_count];
    let out_fmt = case.out_dtype;
    let round = |x: f32| round_to(x as f64, out_fmt, Overflow::Ieee) as f32;
    let lhs = &case.lhs;
    let rhs = case.rhs.f32();
    let sizes = &case.group_sizes;
    let tail_zero = !this.has(Bug::TailRowsUninitialised);
    let mut result = GemmOutputs::default();

    if passes.fwd {
        let mut out = Array2::<f32>::from_elem((m, n), f32::NAN);
        let k_zero_poison = k == 0 && this.has(Bug::KZeroGarbage);
        let klim = this.k_limit(k);
        for g in 0..g_count {
            let e = this.expert_of(sizes, g);
            for (lo, hi) in this.m_tiles(off[g], off[g + 1]) {
                for r in lo..hi {
                    for c in 0..n {
                        if k_zero_poison {
                            continue;
                        }
                        let v = if e < g_count {
                            this.dot(klim, |i| lhs[(r, i)] * rhs[(e, i, c)])
                        } else {
                            0.0
                        };
                        out[(r, c)] = round(v);
                    }
                }
            }
        }
        if tail_zero && !k_zero_poison {
            out.slice_mut(ndarray::s![used.., ..]).fill(0.0);
        }
        result.out = Some(out.into());
    }

    if passes.needs_dout() {
        let dout = case
            .dout
            .as_ref()
            .ok_or_else(|| RunError::new("dout is missing"))?;
        if passes.dgrad {
            let mut dlhs = Array2::<f32>::from_elem((m, k), f32::NAN);
            let klim = this.k_limit(k);
            for g in 0..g_count {
                let e = this.expert_of(sizes, g);
                for (lo, hi) in this.m_tiles(off[g], off[g + 1]) {
                    for r in lo..hi {
                        for kk in 0..klim {
                            let v = if e < g_count {
                                this.dot(n, |i| dout[(r, i)] * rhs[(e, kk, i)])
                            } else {
                                0.0
                            };
                            dlhs[(r, kk)] = round(v);
                        }
                    }
                }
            }
            if tail_zero {
                dlhs.slice_mut(ndarray::s![used.., ..]).fill(0.0);
            }
            result.dlhs = Some(dlhs.into());
        }
        if passes.wgrad {
            let mut drhs = Array3::<f32>::from_elem((g_count, k, n), f32::NAN);
            let klim = this.k_limit(k);
            for g in 0..g_count {
                let (lo, hi) = (off[g], off[g + 1]);
                if lo == hi {
                    if !this.has(Bug::EmptyExpertWgradNotZeroed) {
                        for kk in 0..k {
                            for c in 0..n {
                                drhs[(g, kk, c)] = 0.0;
                            }
                        }
                    }
                    continue;
                }
                // Rows of the group that this kernel reads: its M tiles, plus the tail
                // for the last expert under `WgradReadsTail`.
                let mut rows: Vec<usize> = this
                    .m_tiles(lo, hi)
                    .into_iter()
                    .flat_map(|(a, b)| a..b)
                    .collect();
                if this.has(Bug::WgradReadsTail) && g + 1 == g_count {
                    rows.extend(used..m);
                }
                for kk in 0..klim {
                    for c in 0..n {
                        let v = this.dot(rows.len(), |i| lhs[(rows[i], kk)] * dout[(rows[i], c)]);
                        drhs[(g, kk, c)] = round(v);
                    }
                }
            }
            if this.has(Bug::WgradReadsTail) && g_count > 0 && off[g_count - 1] == used {
                // The last expert is empty: the tail is still summed into it.
                let g = g_count - 1;
                let rows: Vec<usize> = (used..m).collect();
                if !rows.is_empty() {
                    for kk in 0..k {
                        for c in 0..n {
                            let v =
                                this.dot(rows.len(), |i| lhs[(rows[i], kk)] * dout[(rows[i], c)]);
                            drhs[(g, kk, c)] = round(v);
                        }
                    }
                }
            }
            result.drhs = Some(drhs.into());
        }
    }
    Ok(result)
}

/// Small-integer inputs: every product and partial sum is an integer below 2^24, exact in f32.
fn case(sizes: &[usize], m: usize, k: usize, n: usize) -> GroupedGemmCase {
    let g = sizes.len();
    GroupedGemmCase {
        lhs: Array2::from_shape_fn((m, k), |(i, j)| ((i * 5 + j * 3) % 7) as f32 - 3.0),
        // bf16 values, held in bf16: the weights are read as the kernel finds them.
        rhs: Weights::narrowed(
            Array3::from_shape_fn((g, k, n), |(e, i, j)| {
                ((e * 3 + i + j * 2) % 5) as f32 - 2.0
            }),
            Format::Bf16,
        ),
        group_sizes: sizes.to_vec(),
        dout: Some(Array2::from_shape_fn((m, n), |(i, j)| {
            ((i + 2 * j) % 9) as f32 - 4.0
        })),
        dtype: Format::Bf16,
        out_dtype: Format::F32,
        tail: TailContract::Zero,
    }
}

/// Debug text: NaN poison is compared by position (NaN is not equal to itself).
fn text(o: &GemmOutputs) -> String {
    format!("{o:?}")
}

#[test]
fn blocked_model_is_the_element_model_for_every_bug() {
    let shapes: [(&[usize], usize, usize, usize); 6] = [
        // Partial M and K tiles, empty first/middle/last experts, a tail.
        (&[0, 70, 3, 0, 130, 0], 220, 70, 9),
        // The last expert empty with a tail (wgrad-reads-tail writes it), K = 0.
        (&[5, 64, 0], 80, 0, 4),
        (&[5, 64, 0], 80, 33, 4),
        // Everything in one expert, no tail, K a multiple of the tile.
        (&[128], 128, 64, 3),
        // No rows at all.
        (&[0, 0], 0, 40, 2),
        // Over a panel of output rows and columns (256 × 256), in fwd, dgrad and wgrad.
        (&[300, 0, 20], 330, 280, 270),
    ];
    let bugs = std::iter::once(None).chain(Bug::ALL.iter().copied().map(Some));
    for bug in bugs {
        let e = Emulate::with_bug(bug);
        for (sizes, m, k, n) in shapes {
            let c = case(sizes, m, k, n);
            let blocked = e.run(&c, Passes::ALL).unwrap();
            let element = scalar(&e, &c, Passes::ALL).unwrap();
            assert_eq!(
                text(&blocked),
                text(&element),
                "{bug:?} on {sizes:?} m={m} k={k} n={n}"
            );
        }
    }
}

/// With one product per K block the order of every f32 addition is fixed: on inexact values
/// the blocked model still gives the element model's bits (the first block written directly,
/// the partials added in block order, panels over 256 rows and columns), for every bug.
#[test]
fn one_product_blocks_add_in_the_element_models_order() {
    let v = |i: usize| ((i * 2_654_435_761) % 1000) as f32 / 997.0 - 0.5;
    let (sizes, m, k, n): (&[usize], usize, usize, usize) = (&[0, 270, 5, 0, 40], 330, 37, 260);
    let g = sizes.len();
    let c = GroupedGemmCase {
        lhs: Array2::from_shape_fn((m, k), |(i, j)| v(i * 131 + j)),
        rhs: Weights::F32(Array3::from_shape_fn((g, k, n), |(e, i, j)| {
            v(e * 7919 + i * 31 + j * 7)
        })),
        group_sizes: sizes.to_vec(),
        dout: Some(Array2::from_shape_fn((m, n), |(i, j)| {
            v(i * 17 + j * 3 + 5)
        })),
        dtype: Format::F32,
        out_dtype: Format::F32,
        tail: TailContract::Zero,
    };
    let bugs = std::iter::once(None).chain(Bug::ALL.iter().copied().map(Some));
    for bug in bugs {
        let e = Emulate {
            tile_k: 1,
            ..Emulate::with_bug(bug)
        };
        let blocked = e.run(&c, Passes::ALL).unwrap();
        let element = scalar(&e, &c, Passes::ALL).unwrap();
        assert_eq!(text(&blocked), text(&element), "{bug:?}");
    }
}

/// The check above can fail: the models differ visibly when one of them is changed.
#[test]
fn the_comparison_sees_one_changed_element() {
    let c = case(&[0, 70, 3, 0, 130, 0], 220, 70, 9);
    let e = Emulate::default();
    let mut blocked = e.run(&c, Passes::ALL).unwrap();
    blocked.drhs.as_mut().unwrap().f64_mut()[(4, 69, 8)] += 1.0;
    assert_ne!(text(&blocked), text(&scalar(&e, &c, Passes::ALL).unwrap()));
}
