//! What fast verification computes from the case alone, before any implementation runs: per
//! pass the reference side of each row's projections and its magnitude, and the sampled rows
//! and columns in f64 with their magnitudes. Nothing here is `O(M·K·N)`.

use ndarray::{s, Array1, Array2, ArrayView2, ArrayViewMut2, Axis};

use super::chunks::{chunk_products, chunk_vector, ChunkRows, ChunkSumsByColumn};
use super::mode::VECTORS;
use super::sample::{sampled, seed_of, sign};
use crate::engine::{gemm, gemm_magnitude, Operand};
use crate::gemm::case::{GroupedGemmCase, Pass, Passes};
use crate::gemm::weights::{bf16_to_f32, WeightView, Weights};
use crate::Error;

/// One dense product of a pass, `C = A·B` with `A (rows × n)` and `B (n × cols)`, whose rows
/// are rows `row0..row0 + rows` of the pass's output seen as a matrix ([`flat_shape`]).
pub(super) struct Block<'a> {
    pub group: usize,
    pub a: ArrayView2<'a, f32>,
    pub b: WeightView<'a>,
    pub row0: usize,
}

/// The case's inputs, where they lie (in f32); each block is widened to f64 when its turn
/// comes, so no whole-case f64 copy is made.
pub(super) struct Inputs<'c> {
    lhs: ArrayView2<'c, f32>,
    rhs: &'c Weights,
    dout: Option<ArrayView2<'c, f32>>,
}

impl<'c> Inputs<'c> {
    pub fn of(case: &'c GroupedGemmCase) -> Inputs<'c> {
        Inputs {
            lhs: case.lhs.view(),
            rhs: &case.rhs,
            dout: case.dout.as_ref().map(|d| d.view()),
        }
    }

    /// The blocks of `pass`, one per expert (empty experts included):
    /// fwd `lhs_g · rhs_g`, dgrad `dout_g · rhs_gᵀ`, wgrad `lhs_gᵀ · dout_g`.
    ///
    /// # Panics
    /// When a backward pass is asked of a case without `dout` (validation refuses it).
    pub fn blocks(&self, pass: Pass, off: &[usize]) -> Vec<Block<'c>> {
        let (lhs, rhs, dout) = (self.lhs, self.rhs, self.dout);
        let k = lhs.ncols();
        (0..off.len() - 1)
            .map(|g| {
                let (lo, hi) = (off[g], off[g + 1]);
                let dout = || {
                    dout.expect("validated: dout is present")
                        .slice_move(s![lo..hi, ..])
                };
                let w = rhs.expert(g);
                let rows = lhs.slice_move(s![lo..hi, ..]);
                let (a, b, row0) = match pass {
                    Pass::Fwd => (rows, w, lo),
                    Pass::Dgrad => (dout(), w.t(), lo),
                    Pass::Wgrad => (rows.reversed_axes(), WeightView::F32(dout()), g * k),
                };
                Block {
                    group: g,
                    a,
                    b,
                    row0,
                }
            })
            .collect()
    }
}

/// A pass's output as a matrix: `out (M, N)`, `dlhs (M, K)`, `drhs (G·K, N)` (row `g·K + k`
/// is `drhs[g, k, :]`).
pub fn flat_shape(case: &GroupedGemmCase, pass: Pass) -> (usize, usize) {
    match pass {
        Pass::Fwd => (case.m(), case.n()),
        Pass::Dgrad => (case.m(), case.k()),
        Pass::Wgrad => (case.groups() * case.k(), case.n()),
    }
}

/// Sampled rows or columns of one block in f64: `index[i]` (a row or column of the block) has
/// values `want` and magnitudes `Σ|a·b|` `magnitude`, both `(index.len(), len)` (for columns,
/// row `i` of them is column `index[i]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub index: Vec<usize>,
    pub want: Array2<f64>,
    pub magnitude: Array2<f64>,
}

/// The reference side of one block.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockExpected {
    pub group: usize,
    pub row0: usize,
    /// The reduction length `n` (the bound's).
    pub n: usize,
    /// `Ŝ_i = Σ_t |a_it|·Σ_j |b_tj|` per row, in f64 (`Σ_j` of the row's magnitudes).
    pub magnitude: Array1<f64>,
    /// `p̂_i = Σ_t a_it·(Σ_j b_tj·x_j)` per row and vector, `(rows, VECTORS)`.
    pub projection: Array2<f64>,
    /// `p̂_ic = Σ_t a_it·(Σ_{j∈c} b_tj·x_j)` per row and chunk `c` of [`super::CHUNK`]
    /// columns, on the pass's chunk vector, `(rows, chunks)`.
    pub chunk_projection: Array2<f64>,
    /// `Ŝ_ic = Σ_t |a_it|·Σ_{j∈c} |b_tj|` per row and chunk, `(rows, chunks)`.
    pub chunk_magnitude: Array2<f64>,
    pub rows: Sampled,
    pub cols: Sampled,
}

/// The reference side of one pass.
#[derive(Debug, Clone, PartialEq)]
pub struct PassExpected {
    pub pass: Pass,
    /// The output as a matrix ([`flat_shape`]).
    pub shape: (usize, usize),
    /// The `±1` vectors, `(VECTORS, cols)`.
    pub vectors: Array2<f64>,
    /// The chunks' `±1` vector, `(cols)` (one more seeded draw).
    pub chunk_vector: Array1<f64>,
    pub blocks: Vec<BlockExpected>,
}

/// What fast verification computes before comparing ([`super::ByMode::Fast`]): one entry per
/// asked pass.
#[derive(Debug, Clone, PartialEq)]
pub struct FastExpected {
    pub passes: Vec<PassExpected>,
}

/// Computes the fast reference of `case` for `passes` (validating the case first).
pub fn fast_expected(case: &GroupedGemmCase, passes: Passes) -> Result<FastExpected, Error> {
    case.validate(passes)?;
    let inputs = Inputs::of(case);
    let off = case.offsets();
    let passes = passes
        .iter()
        .map(|pass| {
            let shape = flat_shape(case, pass);
            let p = pass as usize;
            let vectors = Array2::from_shape_fn((VECTORS, shape.1), |(v, j)| {
                sign(seed_of(p, v, 0x7665_6374), j as u64)
            });
            let chunk_vector = chunk_vector(shape.1, seed_of(p, VECTORS, 0x6368_756e));
            // Experts in parallel, largest first; each widens its own operands.
            let blocks = crate::par::map_by_cost(
                inputs.blocks(pass, &off),
                |b| {
                    let (rows, cols) = b.b.dim();
                    b.a.len() * cols + rows * cols
                },
                |b| block_expected(&b, &vectors, &chunk_vector, p),
            );
            PassExpected {
                pass,
                shape,
                vectors,
                chunk_vector,
                blocks,
            }
        })
        .collect();
    Ok(FastExpected { passes })
}

/// Rows of a strided right operand (dgrad's `rhs_gᵀ`) widened to f64 at once in
/// [`block_expected`]: a block of the weight (256 × K f64, 14 MiB at DeepSeek-V3's size)
/// instead of all of it.
const B_ROWS: usize = 256;

/// Rows `t0..t1` of `b` in f64, with the logical shape `(t1 - t0, cols)`, read in `b`'s own
/// memory order (a transposed weight's block is widened column-major, so each of its rows
/// is read contiguously).
fn widened_rows(b: WeightView<'_>, t0: usize, t1: usize) -> Array2<f64> {
    fn rows<T: Copy>(v: ArrayView2<T>, t0: usize, t1: usize, f: impl Fn(T) -> f64) -> Array2<f64> {
        let v = v.slice_move(s![t0..t1, ..]);
        if v.strides()[1] == 1 || v.ncols() < 2 {
            v.mapv(f)
        } else {
            v.reversed_axes().mapv(f).reversed_axes()
        }
    }
    match b {
        WeightView::F32(v) => rows(v, t0, t1, f64::from),
        WeightView::Bf16(v) => rows(v, t0, t1, |x| f64::from(bf16_to_f32(x))),
    }
}

/// `want ← a·b` and `mag ← |a|·|b|` in one sweep of the f64 kernel, `b` read where it lies
/// (f32 or bf16, widened in registers).
fn product_magnitude(
    a: ArrayView2<f64>,
    b: WeightView<'_>,
    want: ArrayViewMut2<f64>,
    mag: ArrayViewMut2<f64>,
) {
    match b {
        WeightView::F32(b) => gemm_magnitude(a, b, want, mag),
        WeightView::Bf16(b) => gemm_magnitude(a, b, want, mag),
    }
}

/// `bx[t, v] = Σ_j b[t, j]·x[v, j]`, `sums[t] = Σ_j |b[t, j]|` and the chunk sums of row `t` on
/// `chunk_x` ([`ChunkRows::push`]) for every row `t` of `b` (rows contiguous: fwd's weight,
/// wgrad's rows of `dout`), in one sweep over `b` where it lies: each row widened into one
/// reused buffer, then its chunks (which give `sums[t]`) and eight sums over it, each in eight
/// interleaved partial sums (a vectorisable order; any order is within `γ(n)·Σ|a·b|`).
fn project_rows<T: Operand>(
    b: ArrayView2<T>,
    x: &Array2<f64>,
    chunk_x: &Array1<f64>,
    bx: &mut Array2<f64>,
    sums: &mut Array1<f64>,
    chunked: &mut ChunkRows,
) {
    let mut wide = vec![0.0f64; b.ncols()];
    let x: Vec<&[f64]> = x
        .rows()
        .into_iter()
        .map(|r| r.to_slice().expect("the vectors are standard layout"))
        .collect();
    let chunk_x = chunk_x.as_slice().expect("a fresh vector");
    for (t, row) in b.rows().into_iter().enumerate() {
        for (w, v) in wide.iter_mut().zip(row) {
            *w = v.wide();
        }
        sums[t] = chunked.push(&wide, chunk_x);
        for (v, xv) in x.iter().enumerate() {
            bx[(t, v)] = lanes(&wide, |w, y| w * y, xv);
        }
    }
}

/// `Σ_j f(a_j, b_j)` in eight interleaved partial sums, added pairwise at the end.
#[inline(always)]
pub(super) fn lanes(a: &[f64], f: impl Fn(f64, f64) -> f64, b: &[f64]) -> f64 {
    let mut acc = [0.0f64; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (ca, cb) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += f(ca[l], cb[l]);
        }
    }
    for (l, (x, y)) in ar.iter().zip(br).enumerate() {
        acc[l] += f(*x, *y);
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// `|a|·s` without an absolute-value copy of `a`: row by row where `a`'s rows are contiguous,
/// else a column at a time (wgrad's `lhs_gᵀ`, widened in its own memory order).
fn abs_times(a: &Array2<f64>, s: &Array1<f64>) -> Array1<f64> {
    let s = s.as_slice().expect("a fresh vector is contiguous");
    if a.is_standard_layout() {
        a.rows()
            .into_iter()
            .map(|row| {
                lanes(
                    row.to_slice().expect("standard layout"),
                    |x, y| x.abs() * y,
                    s,
                )
            })
            .collect()
    } else {
        let mut out = Array1::<f64>::zeros(a.nrows());
        for (col, &w) in a.columns().into_iter().zip(s) {
            out.zip_mut_with(&col, |o, x| *o += x.abs() * w);
        }
        out
    }
}

/// Columns `index` of `b` in f64, in standard layout (so the kernel reads its rows in place;
/// a few columns: the copy is small).
fn widened_cols(b: WeightView<'_>, index: &[usize]) -> Array2<f64> {
    let rows = b.dim().0;
    match b {
        WeightView::F32(b) => {
            Array2::from_shape_fn((rows, index.len()), |(i, j)| f64::from(b[(i, index[j])]))
        }
        WeightView::Bf16(b) => Array2::from_shape_fn((rows, index.len()), |(i, j)| {
            f64::from(bf16_to_f32(b[(i, index[j])]))
        }),
    }
}

/// The reference side of one block. The sampled rows (when the right operand's rows are
/// contiguous: fwd's weight, wgrad's rows of `dout`, read where they lie) and the sampled
/// columns (widened, a few of them) go through the f64 kernel, values and magnitudes in one
/// sweep. The projections' `B·x` and the magnitudes' `Σ_j |b_tj|` read the right operand's
/// rows once where they lie ([`project_rows`]) when they are contiguous; dgrad's `rhs_gᵀ` is
/// strided, and is widened [`B_ROWS`] rows at a time for those and for its sampled rows, each
/// block adding its share. The sums are in f64 in other orders than one dense product's,
/// within the same `γ(n)·Σ|a·b|`.
fn block_expected(
    block: &Block,
    vectors: &Array2<f64>,
    chunk_x: &Array1<f64>,
    pass: usize,
) -> BlockExpected {
    let mut a = block.a.mapv(f64::from);
    let (n, cols) = block.b.dim();
    let row_index = sampled(a.nrows(), seed_of(pass, block.group, 0x726f_7773));
    let col_index = sampled(cols, seed_of(pass, block.group, 0x636f_6c73));
    let ra = a.select(Axis(0), &row_index);
    let mut rows_want = Array2::<f64>::zeros((row_index.len(), cols));
    let mut rows_mag = Array2::<f64>::zeros((row_index.len(), cols));
    let in_place = match block.b {
        WeightView::F32(b) => b.strides()[1] == 1 || cols < 2,
        WeightView::Bf16(b) => b.strides()[1] == 1 || cols < 2,
    };
    if in_place {
        product_magnitude(
            ra.view(),
            block.b,
            rows_want.view_mut(),
            rows_mag.view_mut(),
        );
    }
    let mut cols_want = Array2::<f64>::zeros((a.nrows(), col_index.len()));
    let mut cols_mag = Array2::<f64>::zeros((a.nrows(), col_index.len()));
    let cb = widened_cols(block.b, &col_index);
    gemm_magnitude(
        a.view(),
        cb.view(),
        cols_want.view_mut(),
        cols_mag.view_mut(),
    );
    let mut bx = Array2::<f64>::zeros((n, VECTORS));
    let (chunked, row_sums) = if in_place {
        // Every row of the right operand read once, where it lies.
        let (mut chunked, mut row_sums) = (ChunkRows::new(n, cols), Array1::zeros(n));
        let (x, s) = (vectors, &mut row_sums);
        match block.b {
            WeightView::F32(b) => project_rows(b, x, chunk_x, &mut bx, s, &mut chunked),
            WeightView::Bf16(b) => project_rows(b, x, chunk_x, &mut bx, s, &mut chunked),
        }
        (chunked.finish(n), row_sums)
    } else {
        // dgrad's `rhs_gᵀ`: its transpose `rhs_g` has contiguous rows `j` (one per output
        // column, each the reduction's `n` values). Blocks of them are widened to f64, and each
        // block adds its share: the sampled rows' columns `j` (values and magnitudes in one
        // sweep of the kernel), `B·x`, and the chunk sums (which give the row magnitudes).
        let w = block.b.t();
        let ra_t = ra.t().as_standard_layout().into_owned();
        let x_t = vectors.t().as_standard_layout().into_owned();
        let mut share = Array2::<f64>::zeros((n, VECTORS));
        let mut by_column = ChunkSumsByColumn::zeros(n, cols);
        for j0 in (0..cols).step_by(B_ROWS) {
            let j1 = (j0 + B_ROWS).min(cols);
            let wb = widened_rows(w, j0, j1);
            let mut want = Array2::<f64>::zeros((j1 - j0, ra_t.ncols()));
            let mut mag = want.clone();
            gemm_magnitude(wb.view(), ra_t.view(), want.view_mut(), mag.view_mut());
            rows_want.slice_mut(s![.., j0..j1]).assign(&want.t());
            rows_mag.slice_mut(s![.., j0..j1]).assign(&mag.t());
            gemm(wb.t(), x_t.slice(s![j0..j1, ..]), share.view_mut());
            bx += &share;
            for (j, row) in (j0..j1).zip(wb.rows()) {
                let row = row.to_slice().expect("a fresh array is standard layout");
                by_column.add_column(j, row, chunk_x[j]);
            }
        }
        by_column.finish()
    };
    // `A·(B·x)` through the single-threaded kernel: this runs inside a parallel worker, where
    // ndarray's `dot` would hand it to matrixmultiply's own thread pool, whose idle workers
    // spin on `sched_yield` beside ours (6% of a DeepSeek-V3 slice's CPU time).
    let mut projection = Array2::<f64>::zeros((a.nrows(), VECTORS));
    gemm(a.view(), bx.view(), projection.view_mut());
    // The chunks' values need `a`, their magnitudes `|a|`: `a` becomes `|a|` in place (no
    // copy of a block's left operand), which is all that is read of it after.
    let (chunk_projection, chunk_magnitude) = chunk_products(&mut a, &chunked);
    BlockExpected {
        group: block.group,
        row0: block.row0,
        n,
        magnitude: abs_times(&a, &row_sums),
        projection,
        chunk_projection,
        chunk_magnitude,
        rows: Sampled {
            want: rows_want,
            magnitude: rows_mag,
            index: row_index,
        },
        cols: Sampled {
            want: cols_want.reversed_axes(),
            magnitude: cols_mag.reversed_axes(),
            index: col_index,
        },
    }
}

#[cfg(test)]
mod block_tests {
    use super::*;
    use crate::gemm::weights::bf16_of;
    use ndarray::Array3;

    /// The dense, whole-operand computation [`block_expected`] replaced: the oracle.
    fn dense(block: &Block, vectors: &Array2<f64>, x: &Array1<f64>, pass: usize) -> BlockExpected {
        use crate::engine::{exact_sum_as_reported, Isa};
        let (a, b) = (block.a.mapv(f64::from), block.b.to_f64());
        // The sampled rows' and columns' magnitudes come from the kernel (small integers:
        // exact sums, as it reports them on this CPU).
        let k = a.ncols();
        let reported = |s: Array2<f64>| s.mapv(|x| exact_sum_as_reported(Isa::detect(), x, k));
        let (abs_a, abs_b) = (a.mapv(f64::abs), b.mapv(f64::abs));
        let rows = sampled(a.nrows(), seed_of(pass, block.group, 0x726f_7773));
        let cols = sampled(b.ncols(), seed_of(pass, block.group, 0x636f_6c73));
        let (ra, abs_ra) = (a.select(Axis(0), &rows), abs_a.select(Axis(0), &rows));
        let (cb, abs_cb) = (b.select(Axis(1), &cols), abs_b.select(Axis(1), &cols));
        // The chunks as a product: column `c` of `chunk` holds `x_j` at the rows `j` of chunk
        // `c` and 0 elsewhere.
        let chunk = |x: &dyn Fn(usize) -> f64| {
            Array2::from_shape_fn(
                (b.ncols(), b.ncols().div_ceil(super::super::CHUNK)),
                |(j, c)| {
                    if j / super::super::CHUNK == c {
                        x(j)
                    } else {
                        0.0
                    }
                },
            )
        };
        BlockExpected {
            group: block.group,
            row0: block.row0,
            n: a.ncols(),
            magnitude: abs_a.dot(&abs_b.sum_axis(Axis(1))),
            projection: a.dot(&b.dot(&vectors.t())),
            chunk_projection: a.dot(&b.dot(&chunk(&|j| x[j]))),
            chunk_magnitude: abs_a.dot(&abs_b.dot(&chunk(&|_| 1.0))),
            rows: Sampled {
                want: ra.dot(&b),
                magnitude: reported(abs_ra.dot(&abs_b)),
                index: rows,
            },
            cols: Sampled {
                want: a.dot(&cb).reversed_axes(),
                magnitude: reported(abs_a.dot(&abs_cb)).reversed_axes(),
                index: cols,
            },
        }
    }

    /// Widening the right operand a block of rows at a time gives the dense computation's
    /// values, on small integers (every sum exact in any order): over several blocks, with
    /// the operand in f32 and in bf16, read in place and transposed (dgrad's `rhs_gᵀ`), with
    /// `cols` over [`B_ROWS`] and not a multiple of the chunks' width.
    #[test]
    fn blocks_of_rows_are_the_dense_computation() {
        let (rows, n, cols) = (70, 600, 300);
        let a = Array2::from_shape_fn((rows, n), |(i, j)| ((i * 5 + j * 3) % 7) as f32 - 3.0);
        let w = Array3::from_shape_fn((1, n, cols), |(_, i, j)| ((i + 2 * j) % 9) as f32 - 4.0);
        let wt = Array3::from_shape_fn((1, cols, n), |(_, i, j)| w[(0, j, i)]);
        let held = [
            Weights::F32(w.clone()),
            Weights::Bf16(w.mapv(bf16_of)),
            Weights::F32(wt.clone()),
            Weights::Bf16(wt.mapv(bf16_of)),
        ];
        let vectors = Array2::from_shape_fn((VECTORS, cols), |(v, j)| {
            sign(seed_of(1, v, 0x7665_6374), j as u64)
        });
        let x = chunk_vector(cols, seed_of(1, VECTORS, 0x6368_756e));
        for (i, h) in held.iter().enumerate() {
            // The last two hold the operand transposed: its transpose is the (n, cols) view.
            let b = if i < 2 { h.expert(0) } else { h.expert(0).t() };
            assert_eq!(b.dim(), (n, cols));
            let block = Block {
                group: 3,
                a: a.view(),
                b,
                row0: 11,
            };
            let got = block_expected(&block, &vectors, &x, 1);
            assert_eq!(got, dense(&block, &vectors, &x, 1), "operand {i}");
            assert!(got.rows.index.len() > 4 && got.projection.iter().any(|p| *p != 0.0));
            assert_eq!(got.chunk_projection.dim(), (rows, 19));
            assert!(got.chunk_projection.iter().any(|p| *p != 0.0));
        }
    }
}
