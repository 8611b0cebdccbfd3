//! The comparison of fast verification: structural checks on every element, the sampled rows
//! and columns against their own bounds, and each row's projections against its threshold
//! (derived in the [module docs](super)).

use super::chunks::{judge_row, width, Threshold};
use super::expected::{lanes, BlockExpected, FastExpected, PassExpected};
use super::flat::{flat, Flat};
use super::mode::{Verify, CHUNK, VECTORS};
use super::projection::{ChunkWorst, FastPass, ProjectionWorst};
use crate::format::Format;
use crate::gemm::bound::{gamma, ErrorBound, Precision};
use crate::gemm::case::{GemmOutputs, GroupedGemmCase, Pass, Passes, TailContract};
use crate::gemm::compare::{zero_ratio, CaseReport, GemmAt, GroupId, GroupStats, PassReport};
use crate::gemm::fit::Fit;
use crate::stats::{ElementStats, StatsAcc};

/// Compares `got` with the fast reference `expected` of `case`, for an implementation that
/// declared `precision` (the per-element bound is [`ErrorBound::new`]).
pub fn fast_compare(
    case: &GroupedGemmCase,
    passes: Passes,
    precision: &Precision,
    expected: &FastExpected,
    got: &GemmOutputs,
) -> CaseReport {
    fast_compare_with_bound(case, passes, precision, expected, got, &|n| {
        ErrorBound::new(precision, n)
    })
}

/// [`fast_compare`] with the per-element bound of reduction length `n` given by `bound(n)`
/// (the FP8 grouped GEMM's, `crate::fp8::fast`); `precision.output` is the format ULP
/// distances are measured in. The thresholds of the projections are derived from `bound`'s
/// coefficients as from [`ErrorBound::new`]'s (module docs).
pub fn fast_compare_with_bound(
    case: &GroupedGemmCase,
    passes: Passes,
    precision: &Precision,
    expected: &FastExpected,
    got: &GemmOutputs,
    bound: &(dyn Fn(usize) -> ErrorBound + Sync),
) -> CaseReport {
    let mut sampled = Vec::new();
    let mut fast = Vec::new();
    for pe in expected.passes.iter().filter(|p| passes.contains(p.pass)) {
        let (report, projections) = compare_pass(case, precision, pe, got, bound);
        sampled.push(report);
        fast.extend(projections);
    }
    CaseReport {
        precision: *precision,
        tail: case.tail,
        verify: Verify::Fast,
        passes: sampled,
        fast,
    }
}

fn compare_pass(
    case: &GroupedGemmCase,
    precision: &Precision,
    pe: &PassExpected,
    got: &GemmOutputs,
    bound_of: &(dyn Fn(usize) -> ErrorBound + Sync),
) -> (PassReport, Option<FastPass>) {
    let pass = pe.pass;
    let out_shape = match pass {
        Pass::Wgrad => vec![case.groups(), case.k(), case.n()],
        _ => vec![pe.shape.0, pe.shape.1],
    };
    let got = match flat(pass, got, pe.shape, &out_shape) {
        Ok(g) => g,
        Err(why) => return (failed_to_read(pass, out_shape, why), None),
    };
    let out = precision.output;
    let group_of = |b: &BlockExpected| GroupId::Expert(b.group);
    let at = |b: &BlockExpected, r: usize, c: usize| GemmAt {
        group: group_of(b),
        row: if pass == Pass::Wgrad { r - b.row0 } else { r },
        col: c,
    };
    let fresh = || FastPass {
        pass,
        vectors: VECTORS,
        rows: 0,
        failed_rows: 0,
        max_ratio: 0.0,
        worst: None,
        chunk: CHUNK,
        chunks: 0,
        failed_chunks: 0,
        chunk_max_ratio: 0.0,
        chunk_worst: None,
        non_finite: 0,
        first_non_finite: None,
    };
    // Each block (an expert) on its own, in parallel; then folded in block order, so the
    // report is the one a walk of the blocks in order makes.
    let judged = crate::par::map_by_cost(
        pe.blocks.iter().collect(),
        |b| (b.magnitude.len() * pe.shape.1).max(1),
        |b| {
            let bound = bound_of(b.n);
            let rows = b.magnitude.len();
            let (mut acc, mut f) = (StatsAcc::new(out), Fit::for_output(out));
            let mut teeth = 0.0f64;
            let push = |acc: &mut StatsAcc<GemmAt>,
                        f: &mut Fit,
                        teeth: &mut f64,
                        (r, c): (usize, usize),
                        want: f64,
                        mag: f64| {
                let bnd = bound.at(mag, want);
                let g = got.at(b.row0 + r, c);
                *teeth = teeth.max(zero_ratio(want, bnd));
                f.push(g, want);
                acc.push(|| at(b, b.row0 + r, c), g, want, bnd);
            };
            if b.n == 0 {
                // Every product is absent: the whole block must be exactly 0 (cheap, every element).
                for r in 0..rows {
                    for c in 0..pe.shape.1 {
                        push(&mut acc, &mut f, &mut teeth, (r, c), 0.0, 0.0);
                    }
                }
            } else {
                // Sampled rows, a whole row at a time (the statistics of pushing its
                // elements one by one, in the same order).
                let (mut wide, mut bounds) = (Vec::new(), Vec::new());
                for (i, &r) in b.rows.index.iter().enumerate() {
                    let row = got.rows(b.row0 + r, b.row0 + r + 1);
                    let g = row.row_f64(0, &mut wide);
                    let want = b.rows.want.row(i);
                    let want = want.as_slice().expect("a fresh array is standard layout");
                    let mag = b.rows.magnitude.row(i);
                    bounds.clear();
                    bounds.extend(want.iter().zip(mag).map(|(&w, &m)| bound.at(m, w)));
                    for ((&x, &w), &bnd) in g.iter().zip(want).zip(&bounds) {
                        teeth = teeth.max(zero_ratio(w, bnd));
                        f.push(x, w);
                    }
                    acc.push_slice(|c| at(b, b.row0 + r, c), g, want, &bounds);
                }
                for (i, &c) in b.cols.index.iter().enumerate() {
                    for r in (0..rows).filter(|r| b.rows.index.binary_search(r).is_err()) {
                        let (w, m) = (b.cols.want[(i, r)], b.cols.magnitude[(i, r)]);
                        push(&mut acc, &mut f, &mut teeth, (r, c), w, m);
                    }
                }
            }
            let stats = GroupStats {
                group: group_of(b),
                stats: acc.finish(),
            };
            let mut projected = fresh();
            project_block(got, pe, b, &bound, &mut projected, &at);
            (bound, stats, teeth, f, projected)
        },
    );
    let mut groups = Vec::new();
    let mut projected = fresh();
    let (mut teeth, mut fit, mut depth, mut vacuous) = (0.0f64, Fit::ALL, 0, false);
    for (bound, stats, t, f, p) in judged {
        depth = depth.max(bound.depth);
        vacuous |= bound.is_vacuous();
        groups.push(stats);
        teeth = teeth.max(t);
        fit = fit.and(f);
        projected.absorb(p);
    }
    let tail_checked = pass != Pass::Wgrad && case.tail == TailContract::Zero;
    if pass != Pass::Wgrad {
        let used = case.rows_used();
        let tail_elems = (pe.shape.0 - used) * pe.shape.1;
        let stats = if tail_checked {
            let mut acc = StatsAcc::new(out);
            for r in used..pe.shape.0 {
                for c in 0..pe.shape.1 {
                    let at = || GemmAt {
                        group: GroupId::Tail,
                        row: r,
                        col: c,
                    };
                    acc.push(at, got.at(r, c), 0.0, 0.0);
                }
            }
            acc.finish()
        } else {
            ElementStats::unchecked(tail_elems)
        };
        groups.push(GroupStats {
            group: GroupId::Tail,
            stats,
        });
    }
    let report = PassReport {
        pass,
        shape: out_shape,
        reduction_len: match pass {
            Pass::Fwd => case.k(),
            Pass::Dgrad => case.n(),
            Pass::Wgrad => case.group_sizes.iter().copied().max().unwrap_or(0),
        },
        bound_depth: depth,
        bound_vacuous: vacuous,
        tail_checked,
        groups,
        error: None,
        zero_ratio: teeth,
        looks_like: fit.narrower_than(out),
        fit,
    };
    (report, Some(projected))
}

/// Checks every row of block `b` against its projections, whole and by chunks, and scans it
/// for NaN/inf.
fn project_block(
    got: Flat<'_>,
    pe: &PassExpected,
    b: &BlockExpected,
    bound: &ErrorBound,
    fp: &mut FastPass,
    at: &dyn Fn(&BlockExpected, usize, usize) -> GemmAt,
) {
    let rows = b.magnitude.len();
    if rows == 0 {
        return;
    }
    let cols = pe.shape.1;
    let roundoff = Roundoff::new(b.n, cols);
    let vectors: Vec<&[f64]> = pe
        .vectors
        .rows()
        .into_iter()
        .map(|v| v.to_slice().expect("the vectors are standard layout"))
        .collect();
    let chunk_x = pe.chunk_vector.as_slice().expect("a fresh vector");
    // A full chunk's threshold and the last one's (narrower where CHUNK does not divide cols).
    let count = b.chunk_projection.ncols();
    let full = Roundoff::new(b.n, CHUNK).linear(bound, CHUNK);
    let last_width = if count == 0 {
        0
    } else {
        width(count - 1, cols)
    };
    let last = Roundoff::new(b.n, last_width).linear(bound, last_width);
    // Each row once, widened to f64 into one reused buffer when held in f32: scanned for
    // NaN/inf, then its chunks (which give its absolute sum) and its projections, each in
    // interleaved partial sums (any order is within the threshold's `γ(C)`).
    let block = got.rows(b.row0, b.row0 + rows);
    let mut buf = Vec::with_capacity(cols);
    for r in 0..rows {
        let row = block.row_f64(r, &mut buf);
        if !row.iter().fold(true, |ok, v| ok & v.is_finite()) {
            for (c, v) in row.iter().enumerate() {
                if !v.is_finite() {
                    fp.non_finite += 1;
                    if fp.first_non_finite.is_none() {
                        fp.first_non_finite = Some(at(b, b.row0 + r, c));
                    }
                }
            }
        }
        let (projection, magnitude) = (b.chunk_projection.row(r), b.chunk_magnitude.row(r));
        let (failed, chunk, g_abs) = judge_row(
            row,
            chunk_x,
            projection
                .as_slice()
                .expect("a fresh array is standard layout"),
            magnitude
                .as_slice()
                .expect("a fresh array is standard layout"),
            (&full, &last),
        );
        fp.chunks += count;
        fp.failed_chunks += failed;
        if let Some(w) = chunk.filter(|w| fp.chunk_worst.is_none() || w.ratio > fp.chunk_max_ratio)
        {
            fp.chunk_max_ratio = w.ratio;
            fp.chunk_worst = Some(ChunkWorst {
                group: b.group,
                row: at(b, b.row0 + r, 0).row,
                col: w.chunk * CHUNK,
                width: width(w.chunk, cols),
                deviation: w.deviation,
                threshold: w.threshold,
            });
        }
        let s = b.magnitude[r];
        let threshold = roundoff.threshold(bound, s, g_abs, cols);
        let deviation = vectors
            .iter()
            .enumerate()
            .map(|(v, x)| (lanes(row, |g, y| g * y, x) - b.projection[(r, v)]).abs())
            .fold(0.0f64, |m, d| {
                if d.is_nan() || m.is_nan() {
                    f64::NAN
                } else {
                    m.max(d)
                }
            });
        fp.rows += 1;
        let ok = deviation <= threshold; // false for NaN
        if !ok {
            fp.failed_rows += 1;
        }
        let ratio = if ok && deviation == 0.0 {
            0.0
        } else if threshold > 0.0 && deviation.is_finite() {
            deviation / threshold
        } else {
            f64::INFINITY
        };
        if fp.worst.is_none() || ratio > fp.max_ratio {
            fp.max_ratio = ratio;
            let row = at(b, b.row0 + r, 0).row;
            fp.worst = Some(ProjectionWorst {
                group: b.group,
                row,
                deviation,
                threshold,
            });
        }
    }
}

/// The f64 roundoff of one block's projections (see the [module docs](super), "The
/// threshold"): `γ(C)` for a sum over the `C` output columns, `γ(n)` over the reduction.
pub(super) struct Roundoff {
    gamma_cols: f64,
    gamma_n: f64,
    /// `1 + 4·γ(n + C + 10)`: every other rounding of the check, with room.
    inflate: f64,
}

impl Roundoff {
    pub fn new(n: usize, cols: usize) -> Roundoff {
        let u = Format::F64.info().unit_roundoff();
        Roundoff {
            gamma_cols: gamma(cols, u),
            gamma_n: gamma(n, u),
            inflate: 1.0 + 4.0 * gamma(n + cols + 10, u),
        }
    }

    /// The threshold of a row with computed magnitude `s = Ŝ_i` and `g_abs = Σ_j |got_ij|`
    /// over `cols` columns, under the per-element bound `bound`:
    /// `([Ŝ > 0]·((c_S + γ_n)·Ŝ + c_y·G + C·(floor + underflow))/(1 − c_y) + (γ_C + γ_n + γ_n·γ_C)·Ŝ + γ_C·G)·inflate`.
    pub fn threshold(&self, bound: &ErrorBound, s: f64, g_abs: f64, cols: usize) -> f64 {
        self.linear(bound, cols).at(s, g_abs)
    }

    /// [`Roundoff::threshold`] as a linear form in `Ŝ` and `G`, its coefficients computed once
    /// (a few more roundings of each term, within `inflate`'s room for "the few operations
    /// combining them").
    pub fn linear(&self, bound: &ErrorBound, cols: usize) -> Threshold {
        let (gc, gn) = (self.gamma_cols, self.gamma_n);
        let keep = 1.0 - bound.coeff_value;
        Threshold {
            magnitude: ((bound.coeff_magnitude + gn) / keep + (gc + gn + gn * gc)) * self.inflate,
            value: (bound.coeff_value / keep + gc) * self.inflate,
            constant: cols as f64 * (bound.floor + bound.underflow) / keep * self.inflate,
        }
    }
}

fn failed_to_read(pass: Pass, shape: Vec<usize>, why: String) -> PassReport {
    PassReport {
        pass,
        shape,
        reduction_len: 0,
        bound_depth: 0,
        bound_vacuous: false,
        tail_checked: false,
        groups: Vec::new(),
        error: Some(why),
        zero_ratio: 0.0,
        looks_like: None,
        fit: Fit::ALL,
    }
}
