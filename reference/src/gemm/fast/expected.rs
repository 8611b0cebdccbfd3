//! What fast verification computes from the case alone, before any implementation runs: per
//! pass the reference side of each row's projections and its magnitude, and the sampled rows
//! and columns in f64 with their magnitudes. Nothing here is `O(M·K·N)`.

use ndarray::{s, Array1, Array2, ArrayView2, Axis};

use super::mode::VECTORS;
use super::sample::{sampled, seed_of, sign};
use crate::gemm::case::{GroupedGemmCase, Pass, Passes};
use crate::gemm::weights::{WeightView, Weights};
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
    pub blocks: Vec<BlockExpected>,
}

/// What [`super::GemmFast`] computes before comparing: one entry per asked pass.
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
            // Experts in parallel, largest first; each widens its own operands.
            let blocks = crate::par::map_by_cost(
                inputs.blocks(pass, &off),
                |b| {
                    let (rows, cols) = b.b.dim();
                    b.a.len() * cols + rows * cols
                },
                |b| block_expected(&b, &vectors, p),
            );
            PassExpected {
                pass,
                shape,
                vectors,
                blocks,
            }
        })
        .collect();
    Ok(FastExpected { passes })
}

fn block_expected(block: &Block, vectors: &Array2<f64>, pass: usize) -> BlockExpected {
    let (a, b) = (block.a.mapv(f64::from), block.b.to_f64());
    let abs_a = a.mapv(f64::abs);
    let abs_b = b.mapv(f64::abs);
    let magnitude = abs_a.dot(&abs_b.sum_axis(Axis(1)));
    let projection = a.dot(&b.dot(&vectors.t()));
    let rows = sampled(a.nrows(), seed_of(pass, block.group, 0x726f_7773));
    let cols = sampled(b.ncols(), seed_of(pass, block.group, 0x636f_6c73));
    // Both as small dense products (matrixmultiply packs its operands, so a strided `B` costs
    // nothing extra); any summation order keeps the reference's error within `γ(n)·Σ|a·b|`.
    let (ra, abs_ra) = (a.select(Axis(0), &rows), abs_a.select(Axis(0), &rows));
    let rows = Sampled {
        want: ra.dot(&b),
        magnitude: abs_ra.dot(&abs_b),
        index: rows,
    };
    let (cb, abs_cb) = (b.select(Axis(1), &cols), abs_b.select(Axis(1), &cols));
    let cols = Sampled {
        want: a.dot(&cb).reversed_axes(),
        magnitude: abs_a.dot(&abs_cb).reversed_axes(),
        index: cols,
    };
    BlockExpected {
        group: block.group,
        row0: block.row0,
        n: a.ncols(),
        magnitude,
        projection,
        rows,
        cols,
    }
}
