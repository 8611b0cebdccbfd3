//! The f64 reference computed where it is compared: one expert at a time, in row blocks,
//! never held whole.
//!
//! Full verification needs, for every output element, the f64 value `y = Σ a·b` and the
//! magnitude `s = Σ|a·b|` its bound scales with. Held whole they are two f64 copies of every
//! output (for `drhs` of 256 experts at 7168 × 2048, 60 GB), plus f64 and absolute-value copies
//! of every input. Here one expert at a time is computed in per-thread buffers that are reused
//! from expert to expert: the right operand is read where it lies (fwd's weight, wgrad's rows
//! of `dout`, dgrad's transposed weight; the kernel copies one band tile at a time into f64
//! rows, and reads a transposed view along its contiguous columns); the left operand is
//! widened to f64 a block of at most [`BLOCK`] rows at a time; `y` and `s` are computed
//! together for that block through [`crate::engine::gemm_magnitude`] (one read of the
//! operands), and the block is handed to the comparison before the next one is computed.
//! Memory beyond the case and the outputs under test is, per core, a few blocks; the buffers
//! are kept for the thread's life and reused (the calling thread's too, when the work is too
//! small to spread).
//!
//! The values are the same bit for bit as [`super::grouped`]'s (the kernel's summation order
//! depends only on the reduction index, not on how rows are blocked or how `b` is laid out):
//! both run the same kernel on the same operands.

use std::cell::RefCell;

use ndarray::{s, Array2, Array3, ArrayView2, ArrayViewMut2, Axis};

use super::case::{offsets, GemmOutputs, GroupedGemmCase, Outputs, Pass, Passes, WideOutputs};
use super::weights::WeightView;
use crate::engine::{gemm, gemm_magnitude, matrix, widen, Operand};
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

/// Per-thread buffers: the left block widened, and the two products.
#[derive(Default)]
struct Scratch {
    a: Vec<f64>,
    value: Vec<f64>,
    magnitude: Vec<f64>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
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
        // The right operand, whole: rhs_g (fwd), rhs_gᵀ (dgrad), dout_g (wgrad).
        let right = match pass {
            Pass::Fwd => case.rhs.expert(g),
            Pass::Dgrad => case.rhs.expert(g).t(),
            Pass::Wgrad => WeightView::F32(dout()),
        };
        // The left operand, by blocks of output rows: lhs_g (fwd), dout_g (dgrad), lhs_gᵀ
        // (wgrad, whose output rows are the K columns of lhs).
        let left = match pass {
            Pass::Fwd => case.lhs.slice(s![lo..hi, ..]),
            Pass::Dgrad => dout(),
            Pass::Wgrad => case.lhs.slice(s![lo..hi, ..]).reversed_axes(),
        };
        let first = if pass == Pass::Wgrad { 0 } else { lo };
        match right {
            WeightView::F32(b) => blocks_of(sc, left, b, first, magnitude, visit),
            WeightView::Bf16(b) => blocks_of(sc, left, b, first, magnitude, visit),
        }
    });
}

/// [`group_blocks`]' work, once the operands are known: `left · right` by blocks of
/// [`BLOCK`] rows of `left`, the first at output row `first_row`.
fn blocks_of<B: Operand>(
    sc: &mut Scratch,
    left: ArrayView2<f32>,
    right: ArrayView2<B>,
    first_row: usize,
    magnitude: bool,
    visit: &mut dyn FnMut(Block<'_>),
) {
    // Read where it lies: the kernel copies each band's column tile into f64 rows as it
    // goes, reading a transposed view (dgrad's weight) along its contiguous columns.
    let rows = left.nrows();
    let cols = right.ncols();
    let mut start = 0;
    while start < rows {
        let end = (start + BLOCK).min(rows);
        let a64 = widen(left.slice(s![start..end, ..]), &mut sc.a, f64::from);
        let n = end - start;
        let value = matrix(&mut sc.value, n, cols);
        let mag = magnitude.then(|| matrix(&mut sc.magnitude, n, cols));
        product(a64, right, value, mag);
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
        let mut all = zeroed((m, cols));
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
        let mut drhs = zeroed((groups, k, n));
        // Each expert writes its own slice of drhs.
        crate::par::map_by_cost(
            drhs.outer_iter_mut().enumerate().collect(),
            |(g, _)| group_work(case, &off, Pass::Wgrad, *g),
            |(g, mut dst)| {
                // An empty expert's gradient is 0, which `drhs` already holds: not written
                // (for a large case, pages never touched).
                if off[g + 1] == off[g] {
                    return;
                }
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

/// An array of `T::default()` (0 for the float types) from one `vec!`, which allocates zeroed
/// memory for a zero element instead of writing it: the pages are cleared as the experts
/// first write them, in parallel, not one element at a time by the calling thread first.
fn zeroed<T: Copy + Default, D: ndarray::Dimension>(
    shape: impl ndarray::ShapeBuilder<Dim = D>,
) -> ndarray::Array<T, D> {
    let shape = shape.into_shape_with_order();
    let len = shape.raw_dim().size();
    ndarray::Array::from_shape_vec(shape, vec![T::default(); len])
        .expect("a vec of the shape's size")
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
