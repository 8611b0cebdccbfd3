//! The chunked projections of fast verification: every row of a pass's output projected chunk
//! by chunk ([`CHUNK`] consecutive columns, the last chunk of a row possibly narrower) on one
//! `±1` vector. The reference side is the chunk sums of the right operand's rows (values on
//! the vector and absolute values), then one product of the left operand with them per block;
//! the comparison judges each chunk of a row against its threshold, derived in the
//! [module docs](super) ("Chunks of columns").

use ndarray::{Array1, Array2};

use super::mode::CHUNK;

/// Chunks of a row of `cols` columns.
pub(super) fn chunks(cols: usize) -> usize {
    cols.div_ceil(CHUNK)
}

/// Width of chunk `c` of a row of `cols` columns.
pub(super) fn width(c: usize, cols: usize) -> usize {
    CHUNK.min(cols - c * CHUNK)
}

/// The chunk sums of one row `w` (in f64) on the vector `x`: `signed[c] = Σ_{j∈c} w_j·x_j` and
/// `abs[c] = Σ_{j∈c} |w_j|`, each in its own order (any order is within `γ(CHUNK)`); returns
/// `Σ_j |w_j|` (the chunks' absolute sums added in order).
#[inline(always)]
pub(super) fn chunk_sums(w: &[f64], x: &[f64], signed: &mut [f64], abs: &mut [f64]) -> f64 {
    let mut total = 0.0;
    for (((w, x), s), a) in w
        .chunks(CHUNK)
        .zip(x.chunks(CHUNK))
        .zip(signed.iter_mut())
        .zip(abs.iter_mut())
    {
        let (v, m) = sum2(w, x);
        *s = v;
        *a = m;
        total += m;
    }
    total
}

/// `(Σ w_j·x_j, Σ |w_j|)` over one chunk: a full chunk in two eight-lane halves, added lane by
/// lane and then pairwise (a vectorisable order); a short one in order.
#[inline(always)]
fn sum2(w: &[f64], x: &[f64]) -> (f64, f64) {
    if let (Ok(w), Ok(x)) = (<&[f64; CHUNK]>::try_from(w), <&[f64; CHUNK]>::try_from(x)) {
        let (mut s, mut m) = ([0.0f64; 8], [0.0f64; 8]);
        for l in 0..8 {
            s[l] = w[l] * x[l] + w[l + 8] * x[l + 8];
            m[l] = w[l].abs() + w[l + 8].abs();
        }
        let fold = |a: [f64; 8]| ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
        (fold(s), fold(m))
    } else {
        w.iter()
            .zip(x)
            .fold((0.0, 0.0), |(s, m), (w, x)| (s + w * x, m + w.abs()))
    }
}

/// The right operand's chunk sums for every row `t` of a block, `(n, chunks)` each:
/// `signed_tc = Σ_{j∈c} b_tj·x_j` and `abs_tc = Σ_{j∈c} |b_tj|`, built row by row
/// ([`ChunkRows`]) or column by column ([`ChunkSumsByColumn`]: then held column-major, which
/// the kernel reads in place of a copy).
pub(super) struct ChunkSums {
    signed: Array2<f64>,
    abs: Array2<f64>,
}

/// [`ChunkSums`] built a row at a time, where the operand's rows are contiguous (fwd's weight,
/// wgrad's rows of `dout`): each row's chunks written once, nothing cleared before.
pub(super) struct ChunkRows {
    count: usize,
    signed: Vec<f64>,
    abs: Vec<f64>,
}

impl ChunkRows {
    pub fn new(n: usize, cols: usize) -> ChunkRows {
        let count = chunks(cols);
        ChunkRows {
            count,
            signed: Vec::with_capacity(n * count),
            abs: Vec::with_capacity(n * count),
        }
    }

    /// The next row, widened to f64, on the vector `x`; returns `Σ_j |w_j|`.
    pub fn push(&mut self, w: &[f64], x: &[f64]) -> f64 {
        let at = self.signed.len();
        self.signed.resize(at + self.count, 0.0);
        self.abs.resize(at + self.count, 0.0);
        chunk_sums(w, x, &mut self.signed[at..], &mut self.abs[at..])
    }

    /// The sums of the `n` rows pushed (`n` given: with no chunks, no row leaves a trace).
    pub fn finish(self, n: usize) -> ChunkSums {
        let array = |v| Array2::from_shape_vec((n, self.count), v).expect("n rows of chunks");
        ChunkSums {
            signed: array(self.signed),
            abs: array(self.abs),
        }
    }
}

/// [`ChunkSums`] of an operand whose columns are contiguous (dgrad's `rhs_gᵀ`, whose
/// columns are the rows of `rhs_g`): held transposed, `(chunks, n)`, so that each column is
/// added to its chunk's row in one contiguous sweep.
pub(super) struct ChunkSumsByColumn {
    signed: Array2<f64>,
    abs: Array2<f64>,
}

impl ChunkSumsByColumn {
    pub fn zeros(n: usize, cols: usize) -> ChunkSumsByColumn {
        ChunkSumsByColumn {
            signed: Array2::zeros((chunks(cols), n)),
            abs: Array2::zeros((chunks(cols), n)),
        }
    }

    /// Column `j` of the operand, `col[t] = b_tj` for every `t`, added to its chunk with sign
    /// `x_j` (the columns of a chunk added in increasing `j`).
    pub fn add_column(&mut self, j: usize, col: &[f64], x_j: f64) {
        let c = j / CHUNK;
        let mut signed = self.signed.row_mut(c);
        let mut abs = self.abs.row_mut(c);
        let (s, a) = (
            signed
                .as_slice_mut()
                .expect("a fresh array is standard layout"),
            abs.as_slice_mut()
                .expect("a fresh array is standard layout"),
        );
        for ((s, a), v) in s.iter_mut().zip(a.iter_mut()).zip(col) {
            *s += v * x_j;
            *a += v.abs();
        }
    }

    /// The sums, `(n, chunks)` column-major (no copy), and `Σ_j |b_tj|` for every `t` (the
    /// chunks' absolute sums added in order).
    pub fn finish(self) -> (ChunkSums, Array1<f64>) {
        let row_sums = self.abs.sum_axis(ndarray::Axis(0));
        let sums = ChunkSums {
            signed: self.signed.reversed_axes(),
            abs: self.abs.reversed_axes(),
        };
        (sums, row_sums)
    }
}

/// The reference side of one block's chunks: `p̂_ic = Σ_t a_it·signed_tc` and
/// `Ŝ_ic = Σ_t |a_it|·abs_tc`, `(rows, chunks)` each, through the f64 kernel (single-threaded:
/// this runs inside a parallel worker). Leaves `a` as `|a|`: the magnitudes are computed from
/// it, made in place after the values, so that a block's left operand is never copied.
///
/// (The magnitudes alone on AMX tiles, a certified upper bound, were tried: with `cols/16`
/// columns the tiles' copies of `a` cost about what they save, 0.45 s against 0.5 s on a
/// DeepSeek-V3 slice.)
pub(super) fn chunk_products(a: &mut Array2<f64>, sums: &ChunkSums) -> (Array2<f64>, Array2<f64>) {
    use crate::engine::gemm;
    let shape = (a.nrows(), sums.signed.ncols());
    let (mut p, mut s) = (Array2::zeros(shape), Array2::zeros(shape));
    gemm(a.view(), sums.signed.view(), p.view_mut());
    a.mapv_inplace(f64::abs);
    gemm(a.view(), sums.abs.view(), s.view_mut());
    (p, s)
}

/// The worst chunk of one row: its index, `|q̂_ic − p̂_ic|` and threshold.
#[derive(Debug, Clone, Copy)]
pub(super) struct RowChunk {
    pub chunk: usize,
    pub deviation: f64,
    pub threshold: f64,
    /// `deviation / threshold` (0 for a zero deviation, ∞ where it cannot be divided).
    pub ratio: f64,
}

/// One row's chunks judged: `row` (the output, f64), `x` the chunk vector, `projection` and
/// `magnitude` the reference's `p̂_ic` and `Ŝ_ic`, `full` and `last` the thresholds of a
/// [`CHUNK`]-wide chunk and of the last one. Returns the failed chunks, the worst one, and
/// `Σ_j |row_j|`.
pub(super) fn judge_row(
    row: &[f64],
    x: &[f64],
    projection: &[f64],
    magnitude: &[f64],
    (full, last): (&Threshold, &Threshold),
) -> (usize, Option<RowChunk>, f64) {
    let count = projection.len();
    let (mut failed, mut worst, mut g_total) = (0, None::<RowChunk>, 0.0);
    for (c, ((g, x), (&p, &s))) in row
        .chunks(CHUNK)
        .zip(x.chunks(CHUNK))
        .zip(projection.iter().zip(magnitude))
        .enumerate()
    {
        let (q, g_abs) = sum2(g, x);
        g_total += g_abs;
        let threshold = if c + 1 == count { last } else { full }.at(s, g_abs);
        let deviation = (q - p).abs();
        let ok = deviation <= threshold; // false for NaN
        if ok && worst.is_some_and(|w| deviation <= w.ratio * threshold) {
            continue; // neither failed nor possibly worse than the worst so far
        }
        failed += usize::from(!ok);
        let ratio = if ok && deviation == 0.0 {
            0.0
        } else if threshold > 0.0 && deviation.is_finite() {
            deviation / threshold
        } else {
            f64::INFINITY
        };
        if worst.is_none_or(|w| ratio > w.ratio) {
            worst = Some(RowChunk {
                chunk: c,
                deviation,
                threshold,
                ratio,
            });
        }
    }
    (failed, worst, g_total)
}

/// The chunk vector of a pass: `±1` per column, seeded ([`super::sample::sign`]).
pub(super) fn chunk_vector(cols: usize, seed: u64) -> Array1<f64> {
    Array1::from_shape_fn(cols, |j| super::sample::sign(seed, j as u64))
}

/// A threshold `magnitude·Ŝ + value·G + constant` where `Ŝ > 0`, and 0 where `Ŝ = 0`
/// (`check::Roundoff::linear`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Threshold {
    pub magnitude: f64,
    pub value: f64,
    pub constant: f64,
}

impl Threshold {
    #[inline(always)]
    pub fn at(&self, s: f64, g_abs: f64) -> f64 {
        if s == 0.0 {
            // Every product is 0: the elements must be exactly 0, so must their projections.
            return 0.0;
        }
        self.magnitude * s + self.value * g_abs + self.constant
    }
}
