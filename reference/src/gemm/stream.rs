//! The f64 reference computed where it is compared: one expert at a time, in row blocks,
//! never held whole.
//!
//! Full verification needs, for every output element, the f64 value `y = Σ a·b` and the
//! magnitude `s = Σ|a·b|` its bound scales with. Held whole they are two f64 copies of every
//! output (for `drhs` of 256 experts at 7168 × 2048, 60 GB), plus f64 and absolute-value copies
//! of every input. Here one expert at a time is computed in per-thread buffers that are reused
//! from expert to expert: the right operand is read where it lies (fwd's weight, wgrad's rows
//! of `dout`; the kernel widens the f32 values in registers) or, for dgrad, copied transposed
//! in f32 so that its rows are contiguous; the left operand is widened to f64 a block of at
//! most [`BLOCK`] rows at a time; `y` and `s` are computed together for that block through
//! [`super::kernel::gemm_magnitude`] (one read of the operands, the absolute values taken in
//! registers), and the block is handed to the comparison before the next one is computed.
//! Memory beyond the case and the outputs under test is, per core, dgrad's transposed weight
//! (a `K × N` f32 copy) and a few blocks; the buffers are kept for the thread's life and
//! reused (the calling thread's too, when the work is too small to spread).
//!
//! The values are the same bit for bit as [`super::grouped`]'s for fwd and wgrad (the kernel's
//! summation order depends only on the reduction index, not on how rows are blocked). dgrad
//! copies `rhs_gᵀ` into a contiguous buffer, so it runs through the same kernel instead of
//! matrixmultiply: its values may differ from [`super::grouped_dgrad`] in the last bits, and
//! both are inside the reference's own error term of the bound.

use std::cell::RefCell;

use ndarray::{s, Array2, Array3, ArrayView2, ArrayViewMut2, Axis};

use super::case::{offsets, GemmOutputs, GroupedGemmCase, Outputs, Pass, Passes, WideOutputs};
use super::kernel::{gemm, gemm_magnitude, Operand};
use crate::format::{round_to, Format, Overflow};

/// Most output rows computed at once per core (of `out`/`dlhs`, or `k` rows of `drhs[g]`).
pub const BLOCK: usize = 256;

/// One computed block of a group's output: its first row (of the whole output for fwd and
/// dgrad, of `drhs[g]` for wgrad), the values, and the magnitudes when they were asked for.
pub struct Block<'a> {
    pub first: usize,
    pub value: ArrayView2<'a, f64>,
    pub magnitude: Option<ArrayView2<'a, f64>>,
}

/// Per-thread buffers: the left block widened, dgrad's weight transposed (still f32), and the
/// two products.
#[derive(Default)]
struct Scratch {
    a: Vec<f64>,
    b: Vec<f32>,
    value: Vec<f64>,
    magnitude: Vec<f64>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// `buf` as a `(rows, cols)` matrix (grown when needed, never shrunk; not cleared).
fn matrix<T: Copy + Default>(buf: &mut Vec<T>, rows: usize, cols: usize) -> ArrayViewMut2<'_, T> {
    let len = rows * cols;
    if buf.len() < len {
        buf.resize(len, T::default());
    }
    ArrayViewMut2::from_shape((rows, cols), &mut buf[..len]).expect("the buffer holds rows·cols")
}

/// Copies `src` into `dst` (widened to f64, or as f32), laid out row-major with the shape of
/// `src`.
fn widen<T: From<f32> + Copy + Default>(src: ArrayView2<f32>, dst: &mut Vec<T>) {
    let (rows, cols) = src.dim();
    let mut d = matrix(dst, rows, cols);
    if src.strides()[1] == 1 || rows < 2 || cols < 2 {
        d.zip_mut_with(&src, |d, s| *d = T::from(*s));
    } else {
        // A transposed operand (dgrad's rhs_gᵀ, wgrad's lhs_gᵀ): copied by square tiles, so
        // both the strided reads and the writes stay in cache.
        const TILE: usize = 32;
        for r0 in (0..rows).step_by(TILE) {
            for c0 in (0..cols).step_by(TILE) {
                let (r1, c1) = ((r0 + TILE).min(rows), (c0 + TILE).min(cols));
                for c in c0..c1 {
                    for r in r0..r1 {
                        // SAFETY: r < rows and c < cols, the shape of both views.
                        unsafe { *d.uget_mut((r, c)) = T::from(*src.uget((r, c))) };
                    }
                }
            }
        }
    }
}

/// `value ← a·b`, and `mag ← |a|·|b|` when asked.
fn product<B: Operand>(
    a: ArrayView2<f64>,
    b: ArrayView2<B>,
    value: ArrayViewMut2<f64>,
    mag: Option<ArrayViewMut2<f64>>,
) {
    match mag {
        Some(m) => gemm_magnitude(a, b, value, m),
        None => gemm(a, b, value),
    }
}

/// Calls `visit` with consecutive blocks of group `g`'s output of `pass`, in increasing row
/// order, computed in f64 from the case's inputs (and, with `magnitude`, their `Σ|a·b|`).
///
/// Group `g` of fwd and dgrad is rows `off[g]..off[g + 1]`; of wgrad it is `drhs[g]`, all `K`
/// rows (zero for an empty expert). Reads `case` only; uses this thread's buffers.
///
/// # Panics
/// When a backward pass is asked of a case without `dout` (validation refuses it), or from
/// inside `visit` (the buffers are in use).
pub fn group_blocks(
    case: &GroupedGemmCase,
    off: &[usize],
    pass: Pass,
    g: usize,
    magnitude: bool,
    visit: &mut dyn FnMut(Block<'_>),
) {
    SCRATCH.with(|scratch| {
        let sc = &mut *scratch.borrow_mut();
        let (lo, hi) = (off[g], off[g + 1]);
        let dout = || {
            case.dout
                .as_ref()
                .expect("validated: a backward pass has dout")
                .slice(s![lo..hi, ..])
        };
        let weight = case.rhs.index_axis(Axis(0), g);
        // The right operand, whole: rhs_g (fwd), rhs_gᵀ (dgrad), dout_g (wgrad).
        let right = match pass {
            Pass::Fwd => weight,
            Pass::Dgrad => weight.reversed_axes(),
            Pass::Wgrad => dout(),
        };
        // Read where it lies when its rows are contiguous (fwd's weight, wgrad's rows of dout):
        // the kernel widens it in registers. dgrad's transposed weight is copied (in f32) so
        // that its rows are.
        let in_place = right.ncols() < 2 || right.strides()[1] == 1;
        if !in_place {
            widen(right, &mut sc.b);
        }
        // The left operand, by blocks of output rows: lhs_g (fwd), dout_g (dgrad), lhs_gᵀ
        // (wgrad, whose output rows are the K columns of lhs).
        let left = match pass {
            Pass::Fwd => case.lhs.slice(s![lo..hi, ..]),
            Pass::Dgrad => dout(),
            Pass::Wgrad => case.lhs.slice(s![lo..hi, ..]).reversed_axes(),
        };
        let (rows, depth) = left.dim();
        let cols = right.ncols();
        let first_row = if pass == Pass::Wgrad { 0 } else { lo };
        let mut start = 0;
        while start < rows {
            let end = (start + BLOCK).min(rows);
            let a = left.slice(s![start..end, ..]);
            widen(a, &mut sc.a);
            let n = end - start;
            let a64 = ArrayView2::from_shape((n, depth), &sc.a[..n * depth])
                .expect("the buffer holds the block");
            let value = matrix(&mut sc.value, n, cols);
            let mag = magnitude.then(|| matrix(&mut sc.magnitude, n, cols));
            if in_place {
                product(a64, right, value, mag);
            } else {
                let b = ArrayView2::from_shape((depth, cols), &sc.b[..depth * cols])
                    .expect("the buffer holds the operand");
                product(a64, b, value, mag);
            }
            let len = n * cols;
            visit(Block {
                first: first_row + start,
                value: ArrayView2::from_shape((n, cols), &sc.value[..len])
                    .expect("the buffer holds the block"),
                magnitude: magnitude.then(|| {
                    ArrayView2::from_shape((n, cols), &sc.magnitude[..len])
                        .expect("the buffer holds the block")
                }),
            });
            start = end;
        }
    });
}

/// The multiply-adds of group `g` of `pass` (at least 1: an empty group still has its
/// outputs to look at), the cost the work is scheduled by.
pub fn group_work(case: &GroupedGemmCase, off: &[usize], pass: Pass, g: usize) -> usize {
    let (rows, k, n) = (off[g + 1] - off[g], case.k(), case.n());
    match pass {
        // An empty expert's drhs is K × N zeros to compare.
        Pass::Wgrad => (rows * k * n).max(k * n),
        _ => rows * k * n,
    }
    .max(1)
}

/// Runs `f(g, rows)` for every group `g` with its rows `off[g]..off[g + 1]` of `all` (the
/// output of a fwd or dgrad pass), the groups in parallel by `cost(g)`
/// ([`crate::par::map_by_cost`]); the tail rows past the last group are not visited.
pub fn by_group_rows<T: Send>(
    mut all: ArrayViewMut2<T>,
    off: &[usize],
    cost: impl Fn(usize) -> usize,
    f: impl Fn(usize, ArrayViewMut2<T>) + Sync,
) {
    let groups = off.len().saturating_sub(1);
    let mut views = Vec::with_capacity(groups);
    for g in 0..groups {
        let (head, tail) = all.split_at(Axis(0), off[g + 1] - off[g]);
        views.push((g, head));
        all = tail;
    }
    crate::par::map_by_cost(views, |(g, _)| cost(*g), |(g, rows)| f(g, rows));
}

/// The reference's f64 values of the asked passes (no magnitudes), computed expert by expert
/// in parallel. Tail rows are 0.
///
/// # Panics
/// As [`group_blocks`] (call it on a validated case).
pub fn reference_values(case: &GroupedGemmCase, passes: Passes) -> WideOutputs {
    values_as(case, passes, |v| v)
}

/// What the reference writes when it runs as an implementation: its f64 values rounded once
/// (to nearest, ties to even; overflow to infinity) to the case's output format, held in f32
/// unless that format is f64.
///
/// # Panics
/// As [`group_blocks`] (call it on a validated case).
pub fn reference_written(case: &GroupedGemmCase, passes: Passes) -> GemmOutputs {
    let narrow = |o: Outputs<Array2<f32>, Array3<f32>>| GemmOutputs {
        out: o.out.map(Into::into),
        dlhs: o.dlhs.map(Into::into),
        drhs: o.drhs.map(Into::into),
    };
    match case.out_dtype {
        Format::F64 => reference_values(case, passes).into(),
        // `as` rounds to nearest, ties to even, and overflows to infinity.
        Format::F32 => narrow(values_as(case, passes, |v| v as f32)),
        out => narrow(values_as(case, passes, |v| {
            round_to(v, out, Overflow::Ieee) as f32
        })),
    }
}

/// The reference's values of the asked passes, each converted by `conv` as it is stored.
fn values_as<T: Copy + Default + Send + Sync>(
    case: &GroupedGemmCase,
    passes: Passes,
    conv: impl Fn(f64) -> T + Sync,
) -> Outputs<Array2<T>, Array3<T>> {
    let off = offsets(&case.group_sizes);
    let (m, k, n, groups) = (case.m(), case.k(), case.n(), case.groups());
    let store = |dst: &mut ArrayViewMut2<T>, at: usize, b: &Block<'_>| {
        dst.slice_mut(s![at..at + b.value.nrows(), ..])
            .zip_mut_with(&b.value, |d, v| *d = conv(*v));
    };
    let rows_of = |pass: Pass, cols: usize| {
        // Tail rows stay 0 (the default of the element type).
        let mut all = Array2::<T>::default((m, cols));
        // Each expert writes its own rows.
        by_group_rows(
            all.view_mut(),
            &off,
            |g| group_work(case, &off, pass, g),
            |g, mut dst| {
                group_blocks(case, &off, pass, g, false, &mut |b| {
                    store(&mut dst, b.first - off[g], &b)
                });
            },
        );
        all
    };
    let wgrad = || {
        let mut drhs = Array3::<T>::default((groups, k, n));
        // Each expert writes its own slice of drhs.
        crate::par::map_by_cost(
            drhs.outer_iter_mut().enumerate().collect(),
            |(g, _)| group_work(case, &off, Pass::Wgrad, *g),
            |(g, mut dst)| {
                group_blocks(case, &off, Pass::Wgrad, g, false, &mut |b| {
                    store(&mut dst, b.first, &b)
                });
            },
        );
        drhs
    };
    Outputs {
        out: passes.fwd.then(|| rows_of(Pass::Fwd, n)),
        dlhs: (passes.dgrad && case.dout.is_some()).then(|| rows_of(Pass::Dgrad, k)),
        drhs: (passes.wgrad && case.dout.is_some()).then(wgrad),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Format;
    use crate::gemm::case::TailContract;
    use crate::gemm::grouped::reference;

    /// A case with groups larger than a block, empty experts, a tail, small-integer values
    /// (every sum exact, so every summation order gives the same bits).
    fn case(sizes: &[usize], m: usize, k: usize, n: usize) -> GroupedGemmCase {
        let g = sizes.len();
        GroupedGemmCase {
            lhs: Array2::from_shape_fn((m, k), |(i, j)| ((i * 5 + j * 3) % 7) as f32 - 3.0),
            rhs: Array3::from_shape_fn((g, k, n), |(e, i, j)| {
                ((e * 3 + i + j * 2) % 5) as f32 - 2.0
            }),
            group_sizes: sizes.to_vec(),
            dout: Some(Array2::from_shape_fn((m, n), |(i, j)| {
                ((i + 2 * j) % 9) as f32 - 4.0
            })),
            dtype: Format::Bf16,
            out_dtype: Format::F32,
            tail: TailContract::Zero,
        }
    }

    /// Streamed values and magnitudes equal the whole-tensor reference's exactly, block by
    /// block, on shapes with groups over a block, empty experts, a tail, K = 0 and M = 0.
    #[test]
    fn blocks_are_the_whole_reference() {
        let shapes: [(&[usize], usize, usize, usize); 4] = [
            (&[0, 300, 1, 0, 9, 600, 0], 1000, 300, 27),
            (&[2, 0, 1], 4, 0, 3),
            (&[0, 0], 0, 4, 3),
            (&[517], 600, 5, 1),
        ];
        for (sizes, m, k, n) in shapes {
            let c = case(sizes, m, k, n);
            let whole = reference(&c, Passes::ALL).unwrap();
            assert_eq!(reference_values(&c, Passes::ALL), whole.value, "{sizes:?}");
            let off = offsets(sizes);
            for pass in Pass::ALL {
                for (g, &size) in sizes.iter().enumerate() {
                    let mut seen = 0;
                    group_blocks(&c, &off, pass, g, true, &mut |b| {
                        let rows = b.value.nrows();
                        // The same rows of the whole pass's output (of drhs[g] for wgrad).
                        let rows_of = |o: &WideOutputs| match pass {
                            Pass::Fwd => o
                                .out
                                .as_ref()
                                .unwrap()
                                .slice(s![b.first..b.first + rows, ..])
                                .to_owned(),
                            Pass::Dgrad => o
                                .dlhs
                                .as_ref()
                                .unwrap()
                                .slice(s![b.first..b.first + rows, ..])
                                .to_owned(),
                            Pass::Wgrad => o
                                .drhs
                                .as_ref()
                                .unwrap()
                                .slice(s![g, b.first..b.first + rows, ..])
                                .to_owned(),
                        };
                        let (want, mag) = (rows_of(&whole.value), rows_of(&whole.magnitude));
                        assert!(rows <= BLOCK);
                        assert_eq!(b.value, want, "{pass} group {g} from {}", b.first);
                        assert_eq!(b.magnitude.unwrap(), mag, "{pass} group {g}");
                        seen += rows;
                    });
                    let expect = if pass == Pass::Wgrad { k } else { size };
                    assert_eq!(seen, expect, "{pass} group {g}: every row once");
                }
            }
        }
    }

    /// The reference as an implementation writes its f64 values rounded once to the output
    /// format: held in f64 for f64 output (the values themselves), in f32 otherwise, each
    /// element the format's rounding of the f64 value; values that round (not small integers)
    /// and one that overflows bf16's neighbour f16.
    #[test]
    fn written_outputs_are_the_values_rounded_once() {
        let mut c = case(&[0, 300, 1, 0, 9, 600, 0], 1000, 30, 27);
        c.lhs.mapv_inplace(|v| v * 1.0078125 + 0.01171875);
        c.lhs[(5, 0)] = 3.0e4;
        c.rhs.mapv_inplace(|v| v * 3.0);
        let values = reference_values(&c, Passes::ALL);
        for out in [Format::F64, Format::F32, Format::Bf16, Format::F16] {
            c.out_dtype = out;
            let written = reference_written(&c, Passes::ALL);
            let pairs = [
                (
                    written.out.as_ref().unwrap().f64(),
                    values.out.as_ref().unwrap(),
                ),
                (
                    written.dlhs.as_ref().unwrap().f64(),
                    values.dlhs.as_ref().unwrap(),
                ),
            ];
            assert_eq!(written.out.as_ref().unwrap().is_f32(), out != Format::F64);
            let mut inexact = 0;
            for (w, v) in pairs {
                ndarray::Zip::from(&*w).and(v).for_each(|w, v| {
                    let want = round_to(*v, out, Overflow::Ieee);
                    assert_eq!(w.to_bits(), want.to_bits(), "{out:?}: {v:e}");
                    inexact += usize::from(w != v);
                });
            }
            let d = written.drhs.as_ref().unwrap().f64();
            ndarray::Zip::from(&*d)
                .and(values.drhs.as_ref().unwrap())
                .for_each(|w, v| assert_eq!(*w, round_to(*v, out, Overflow::Ieee)));
            // The values do round (and overflow f16), except in f64.
            assert_eq!(inexact == 0, out == Format::F64, "{out:?}");
        }
        let f16 = reference_written(&c, Passes::FWD)
            .out
            .unwrap()
            .f64()
            .into_owned();
        assert!(f16.iter().any(|v| v.is_infinite()), "3e4·6 overflows f16");
    }

    /// The streamed comparison reports what the whole-tensor one does, element for element:
    /// on right outputs, and on outputs with an error in one element of a large group, a NaN,
    /// a non-zero tail row, a non-zero empty expert's drhs and a missing pass.
    #[test]
    fn streamed_comparison_is_the_whole_comparison() {
        use crate::gemm::bound::{Accumulator, Precision};
        use crate::gemm::compare::{compare_outputs, compare_streamed};
        let c = case(&[0, 300, 1, 0, 9, 600, 0], 1000, 300, 27);
        let whole = reference(&c, Passes::ALL).unwrap();
        let precision = Precision {
            input: Format::Bf16,
            accumulator: Accumulator::any_order(Format::F32),
            output: Format::F32,
        };
        let same = |got: &GemmOutputs, passes: Passes| {
            let a = compare_outputs(&c, passes, &precision, &whole, got);
            let b = compare_streamed(&c, passes, &precision, got);
            // Debug text, since NaN statistics are not equal to themselves.
            assert_eq!(format!("{a:?}"), format!("{b:?}"));
            a
        };
        let right: GemmOutputs = whole.value.clone().into();
        assert!(same(&right, Passes::ALL).passed());
        let mut wrong = right.clone();
        wrong.out.as_mut().unwrap().f64_mut()[(500, 3)] += 1.0;
        wrong.dlhs.as_mut().unwrap().f64_mut()[(2, 7)] = f64::NAN;
        wrong.dlhs.as_mut().unwrap().f64_mut()[(995, 0)] = 1e-30;
        wrong.drhs.as_mut().unwrap().f64_mut()[(3, 299, 26)] = 1e-30;
        let r = same(&wrong, Passes::ALL);
        assert!(!r.passed());
        for p in &r.passes {
            assert!(p.failed_elements() > 0, "{:?} caught", p.pass);
        }
        // Held in f32 (1e-30 is an f32 value; NaN stays NaN), the same outputs get the same
        // report as their f64 copy, failures and all.
        let narrow = |o: &GemmOutputs| GemmOutputs {
            out: o.out.as_ref().map(|a| a.f64().mapv(|v| v as f32).into()),
            dlhs: o.dlhs.as_ref().map(|a| a.f64().mapv(|v| v as f32).into()),
            drhs: o.drhs.as_ref().map(|a| a.f64().mapv(|v| v as f32).into()),
        };
        for o in [&right, &wrong] {
            let held = narrow(o);
            assert!(held.drhs.as_ref().unwrap().is_f32());
            let wide: GemmOutputs = held.to_f64().into();
            assert_eq!(
                format!("{:?}", same(&held, Passes::ALL)),
                format!("{:?}", same(&wide, Passes::ALL))
            );
        }
        assert!(!same(&narrow(&wrong), Passes::ALL).passed());
        wrong.drhs = None;
        let r = same(&wrong, Passes::ALL);
        assert!(r.passes[2].error.is_some());
    }
}
