//! Fast verification against full verification on planted errors: what it always catches
//! (a lone element 64 times its bound anywhere, by the chunks' projections), what it catches
//! with probability, and what only full mode sees.

use ndarray::{Array2, Array3};

use super::check::Roundoff;
use super::*;
use crate::format::Format;
use crate::gemm::{
    compare_outputs, reference, Accumulator, ErrorBound, GemmOutputs, GroupedGemmCase, OutArray,
    Pass, Passes, Precision, ReferenceResult, TailContract, Weights,
};
use crate::seed::mix;

/// Experts of 0, 700, 3, 0 and 37 rows and 5 tail rows; K = 200 and N = 150 (neither a
/// multiple of any tile size); values exact in bf16.
fn case() -> GroupedGemmCase {
    let v = |i: u64| ((mix(i) % 255) as f32 - 127.0) / 64.0;
    let sizes = vec![0, 700, 3, 0, 37];
    let m = sizes.iter().sum::<usize>() + 5;
    let (k, n, g) = (200, 150, sizes.len());
    GroupedGemmCase {
        lhs: Array2::from_shape_fn((m, k), |(r, c)| v((r * k + c) as u64)),
        // bf16 values, held in bf16.
        rhs: Weights::narrowed(
            Array3::from_shape_fn((g, k, n), |(e, r, c)| {
                v((1 << 20) + ((e * k + r) * n + c) as u64)
            }),
            Format::Bf16,
        ),
        group_sizes: sizes,
        dout: Some(Array2::from_shape_fn((m, n), |(r, c)| {
            v((1 << 30) + (r * n + c) as u64)
        })),
        dtype: Format::Bf16,
        out_dtype: Format::F32,
        tail: TailContract::Zero,
    }
}

fn precision() -> Precision {
    Precision {
        input: Format::Bf16,
        accumulator: Accumulator::any_order(Format::F32),
        output: Format::F32,
    }
}

/// The reference rounded to f32, held in f32: inside every bound (the error is at most
/// `u_out·|y|`).
fn good(case: &GroupedGemmCase) -> GemmOutputs {
    let f32s = |a: Array2<f64>| a.mapv(|x| x as f32).into();
    let r = reference(case, Passes::ALL).unwrap().value;
    GemmOutputs {
        out: r.out.map(f32s),
        dlhs: r.dlhs.map(f32s),
        drhs: r.drhs.map(|a| a.mapv(|x| x as f32).into()),
    }
}

fn fast_passes(case: &GroupedGemmCase, got: &GemmOutputs) -> (bool, Option<String>) {
    let e = fast_expected(case, Passes::ALL).unwrap();
    let r = fast_compare(case, Passes::ALL, &precision(), &e, got);
    (r.passed(), r.first_failure())
}

fn full_passes(case: &GroupedGemmCase, got: &GemmOutputs) -> bool {
    let r = reference(case, Passes::ALL).unwrap();
    compare_outputs(case, Passes::ALL, &precision(), &r, got).passed()
}

/// Expert 1 (rows 0..700), row 300 and column 100 of `out`: neither is sampled.
const ROW: usize = 300;
const COL: usize = 100;

/// The per-element bound of `out[row, col]` and the projection threshold `τ` of its row.
fn bound_and_threshold(
    case: &GroupedGemmCase,
    got: &GemmOutputs,
    row: usize,
    col: usize,
) -> (f64, f64) {
    let r = reference(case, Passes::FWD).unwrap();
    let b = ErrorBound::new(&precision(), case.k());
    let (y, s) = (
        r.value.out.unwrap()[(row, col)],
        r.magnitude.out.unwrap()[(row, col)],
    );
    let e = fast_expected(case, Passes::FWD).unwrap();
    let block = &e.passes[0].blocks[1];
    let s_row = block.magnitude[row - block.row0];
    let g_row: f64 = got
        .out
        .as_ref()
        .unwrap()
        .f64()
        .row(row)
        .iter()
        .map(|v| v.abs())
        .sum();
    let tau = Roundoff::new(case.k(), case.n()).threshold(&b, s_row, g_row, case.n());
    (b.at(s, y), tau)
}

#[test]
fn outputs_that_pass_full_pass_fast() {
    let c = case();
    let got = good(&c);
    assert!(full_passes(&c, &got));
    assert_eq!(fast_passes(&c, &got), (true, None));
    // The reference itself, exactly.
    let exact = reference(&c, Passes::ALL).unwrap().value;
    assert_eq!(fast_passes(&c, &exact.into()), (true, None));
}

#[test]
fn the_planted_place_is_not_sampled() {
    let c = case();
    let e = fast_expected(&c, Passes::FWD).unwrap();
    let b = &e.passes[0].blocks[1];
    assert!(
        !b.rows.index.contains(&(ROW - b.row0)),
        "{:?}",
        b.rows.index
    );
    assert!(!b.cols.index.contains(&COL), "{:?}", b.cols.index);
    assert!(b.rows.index.contains(&7) && b.rows.index.contains(&699));
}

/// A single element just above its own bound: full mode catches it anywhere; fast mode where
/// it lies in a sampled row or column, and not elsewhere (the documented limit: its chunk's
/// threshold sums 16 bounds).
#[test]
fn one_element_just_above_its_bound() {
    let c = case();
    let base = good(&c);
    let plant = |row: usize, col: usize, by: f64| {
        let mut got = base.clone();
        let r = reference(&c, Passes::FWD).unwrap().value.out.unwrap();
        got.out.as_mut().unwrap().f64_mut()[(row, col)] = r[(row, col)] + by;
        got
    };
    let (bound, _) = bound_and_threshold(&c, &base, ROW, COL);
    // Unsampled: full fails, fast passes.
    let got = plant(ROW, COL, 1.5 * bound);
    assert!(!full_passes(&c, &got));
    assert!(
        fast_passes(&c, &got).0,
        "below the row threshold, unsampled"
    );
    // A sampled row (offset 7 within expert 1: the edge of an 8-row tile), and a sampled
    // column (the last) in an unsampled row: fast fails on the element itself.
    for (row, col) in [(7, COL), (ROW, c.n() - 1)] {
        let (bound, _) = bound_and_threshold(&c, &base, row, col);
        let got = plant(row, col, 1.5 * bound);
        let (ok, why) = fast_passes(&c, &got);
        assert!(!ok, "({row}, {col})");
        let why = why.unwrap();
        assert!(
            why.starts_with("fwd: 1 of") && why.contains(&format!("row {row} col {col}")),
            "{why}"
        );
    }
}

/// Above twice the row's threshold, a lone bad element is caught by the projections with
/// certainty; above the threshold, with probability at least `1 − 2^-8` (this draw catches
/// it); two errors that cancel in some projections too.
#[test]
fn one_element_above_its_rows_threshold() {
    let c = case();
    let base = good(&c);
    let (bound, tau) = bound_and_threshold(&c, &base, ROW, COL);
    assert!(
        tau > 20.0 * bound,
        "the threshold sums a row's bounds: {tau} vs {bound}"
    );
    for by in [2.01 * tau, -2.01 * tau, 1.2 * tau] {
        let mut got = base.clone();
        got.out.as_mut().unwrap().f64_mut()[(ROW, COL)] += by;
        let (ok, why) = fast_passes(&c, &got);
        assert!(!ok, "{by}");
        let why = why.unwrap();
        assert!(
            why.contains("random projections") && why.contains(&format!("row {ROW}")),
            "{why}"
        );
    }
    let mut got = base.clone();
    got.out.as_mut().unwrap().f64_mut()[(ROW, COL)] += 1.2 * tau;
    got.out.as_mut().unwrap().f64_mut()[(ROW, COL + 1)] -= 1.2 * tau;
    assert!(!fast_passes(&c, &got).0);
}

#[test]
fn structural_errors_anywhere_are_caught() {
    let c = case();
    let base = good(&c);
    let fails = |f: &dyn Fn(&mut GemmOutputs), needle: &str| {
        let mut got = base.clone();
        f(&mut got);
        let (ok, why) = fast_passes(&c, &got);
        assert!(!ok, "{needle}");
        let why = why.unwrap();
        assert!(why.contains(needle), "{needle}: {why}");
    };
    // Planted where they lie: in f32 (the outputs are held in f32; NaN, inf and 1e-30 are f32
    // values), and once more in an f64 copy.
    fn f32s<D: ndarray::Dimension>(a: &mut Option<OutArray<D>>) -> &mut ndarray::Array<f32, D> {
        match a.as_mut().unwrap() {
            OutArray::F32(a) => a,
            OutArray::F64(_) => panic!("held in f32"),
        }
    }
    fails(
        &|g| f32s(&mut g.out)[(ROW, COL)] = f32::NAN,
        "fwd: 1 NaN/inf",
    );
    fails(
        &|g| g.out.as_mut().unwrap().f64_mut()[(ROW, COL)] = f64::NAN,
        "fwd: 1 NaN/inf",
    );
    fails(
        &|g| f32s(&mut g.dlhs)[(ROW, 33)] = f32::INFINITY,
        "dgrad: 1 NaN/inf",
    );
    fails(
        &|g| f32s(&mut g.drhs)[(1, 101, 33)] = f32::NAN,
        "wgrad: 1 NaN/inf",
    );
    // A tail row (the last row), an empty expert's drhs: exactly 0 demanded.
    let m = c.m();
    fails(&|g| f32s(&mut g.out)[(m - 1, 3)] = 1e-30, "tail");
    fails(
        &|g| g.out.as_mut().unwrap().f64_mut()[(m - 1, 3)] = 1e-300,
        "tail",
    );
    fails(&|g| f32s(&mut g.drhs)[(3, 150, 77)] = 1e-30, "expert 3");
    // A wrong shape is a failed pass, not a panic: one with as many rows of N as G·K too.
    fails(
        &|g| g.drhs = Some(Array3::<f32>::zeros((1, 2, 3)).into()),
        "drhs has shape",
    );
    let (groups, k, n) = (c.groups(), c.k(), c.n());
    assert_eq!(k % 2, 0);
    fails(
        &|g| g.drhs = Some(Array3::<f32>::zeros((2 * groups, k / 2, n)).into()),
        "drhs has shape",
    );
    fails(&|g| g.dlhs = None, "no output");
}

/// The whole of a pass is what the wgrad and dgrad projections read too: a wrong expert
/// (every element of a group off) fails them.
#[test]
fn a_wrong_group_fails_every_backward_pass() {
    let c = case();
    let mut got = good(&c);
    got.drhs
        .as_mut()
        .unwrap()
        .f64_mut()
        .index_axis_mut(ndarray::Axis(0), 4)
        .mapv_inplace(|v| v * 1.1);
    got.dlhs
        .as_mut()
        .unwrap()
        .f64_mut()
        .row_mut(705)
        .mapv_inplace(|v| v * 1.1);
    let e = fast_expected(&c, Passes::ALL).unwrap();
    let r = fast_compare(&c, Passes::ALL, &precision(), &e, &got);
    let failed: Vec<Pass> = r
        .fast
        .iter()
        .filter(|f| f.failed_rows > 0)
        .map(|f| f.pass)
        .collect();
    assert_eq!(failed, vec![Pass::Dgrad, Pass::Wgrad]);
}

/// `(y_ref, Σ|a·b|)` of element `(row, col)` of `pass`'s output seen as a matrix
/// ([`flat_shape`]), and the reduction length of its bound.
fn element(
    c: &GroupedGemmCase,
    r: &ReferenceResult,
    pass: Pass,
    row: usize,
    col: usize,
) -> (f64, f64, usize) {
    let (v, m) = (&r.value, &r.magnitude);
    match pass {
        Pass::Fwd => (
            v.out.as_ref().unwrap()[(row, col)],
            m.out.as_ref().unwrap()[(row, col)],
            c.k(),
        ),
        Pass::Dgrad => (
            v.dlhs.as_ref().unwrap()[(row, col)],
            m.dlhs.as_ref().unwrap()[(row, col)],
            c.n(),
        ),
        Pass::Wgrad => {
            let (g, k) = (row / c.k(), row % c.k());
            let at = (g, k, col);
            (
                v.drhs.as_ref().unwrap()[at],
                m.drhs.as_ref().unwrap()[at],
                c.group_sizes[g],
            )
        }
    }
}

/// Sets element `(row, col)` of `pass`'s output (as a matrix) to `value`, held in f64.
fn set(c: &GroupedGemmCase, got: &mut GemmOutputs, pass: Pass, row: usize, col: usize, value: f64) {
    match pass {
        Pass::Fwd => got.out.as_mut().unwrap().f64_mut()[(row, col)] = value,
        Pass::Dgrad => got.dlhs.as_mut().unwrap().f64_mut()[(row, col)] = value,
        Pass::Wgrad => {
            got.drhs.as_mut().unwrap().f64_mut()[(row / c.k(), row % c.k(), col)] = value
        }
    }
}

/// The per-element bound of full mode (`β`) of `(row, col)`.
fn own_bound(c: &GroupedGemmCase, r: &ReferenceResult, pass: Pass, row: usize, col: usize) -> f64 {
    let (y, s, n) = element(c, r, pass, row, col);
    ErrorBound::new(&precision(), n).at(s, y)
}

/// The rule of the chunks, in every pass: one element moved by 64 times its own bound
/// (either sign), at every column of a row in the middle of the 700-row expert that is not
/// sampled (every position in a chunk, the last, narrower, chunk included) and of a row of the
/// 37-row expert, fails fast verification, and the chunk holding it is what fails: its
/// row's whole-row projections pass (their threshold sums the whole row's bounds) and so does
/// every sampled element where the column is not sampled.
#[test]
fn a_lone_element_64_times_its_bound_fails_anywhere() {
    let c = case();
    let base = good(&c);
    let full = reference(&c, Passes::ALL).unwrap();
    let e = fast_expected(&c, Passes::ALL).unwrap();
    for pe in &e.passes {
        let pass = pe.pass;
        let cols = pe.shape.1;
        assert!(cols % CHUNK != 0, "a narrower last chunk");
        for group in [1, 4] {
            let b = pe.blocks.iter().find(|b| b.group == group).unwrap();
            let rows = b.magnitude.len();
            let r = (rows / 2..rows)
                .find(|r| !b.rows.index.contains(r))
                .unwrap();
            let row = b.row0 + r;
            for col in 0..cols {
                let (y, _, _) = element(&c, &full, pass, row, col);
                let by =
                    if col % 2 == 0 { 64.0 } else { -64.0 } * own_bound(&c, &full, pass, row, col);
                let mut got = base.clone();
                set(&c, &mut got, pass, row, col, y + by);
                let report = fast_compare(&c, Passes::only(pass), &precision(), &e, &got);
                let f = &report.fast[0];
                let at = format!("{pass} row {row} col {col}");
                assert_eq!((f.failed_chunks, f.failed_rows), (1, 0), "{at}");
                let w = f.chunk_worst.as_ref().unwrap();
                let reported_row = if pass == Pass::Wgrad {
                    row - b.row0
                } else {
                    row
                };
                assert_eq!(
                    (w.group, w.row, w.col / CHUNK),
                    (group, reported_row, col / CHUNK),
                    "{at}"
                );
                assert!(w.col + w.width == (w.col + CHUNK).min(cols), "{at}");
                if !b.cols.index.contains(&col) {
                    assert!(report.passes[0].passed(), "{at}: sampled");
                }
                let why = f.failure().unwrap();
                assert!(why.contains("1 chunk(s) of 16 columns"), "{why}");
            }
        }
    }
}

/// No false failures at the edge: every element of every pass moved by 0.99 of its own bound
/// with the sign of the chunk vector at its column, so that every chunk's errors add up, passes
/// full mode and fast mode; moved by 1.01 of the chunk's summed bounds in one element it fails
/// (where the row's projections do not).
#[test]
fn errors_inside_their_bounds_that_add_up_in_a_chunk_pass() {
    let c = case();
    let full = reference(&c, Passes::ALL).unwrap();
    let e = fast_expected(&c, Passes::ALL).unwrap();
    let mut got: GemmOutputs = full.value.clone().into();
    for pe in &e.passes {
        let (rows, cols) = pe.shape;
        let used = if pe.pass == Pass::Wgrad {
            rows
        } else {
            c.rows_used()
        };
        for row in 0..used {
            for col in 0..cols {
                let (y, _, _) = element(&c, &full, pe.pass, row, col);
                let by = 0.99 * own_bound(&c, &full, pe.pass, row, col) * pe.chunk_vector[col];
                set(&c, &mut got, pe.pass, row, col, y + by);
            }
        }
    }
    assert!(full_passes(&c, &got));
    let report = fast_compare(&c, Passes::ALL, &precision(), &e, &got);
    assert!(report.passed(), "{:?}", report.first_failure());
    // Some chunk came within a few percent of its threshold: the thresholds are tight.
    for f in &report.fast {
        assert!(
            f.chunk_max_ratio > 0.9 && f.chunk_max_ratio <= 1.0,
            "{}: {}",
            f.pass,
            f.chunk_max_ratio
        );
    }
}

/// The width of the chunks against the promise ([`LONE`]): for every precision a grouped GEMM
/// is declared with, twice a chunk's threshold is at most `LONE` times the mean per-element
/// bound of its chunk, with the check's own rounding counted; an f64 accumulator needs 11
/// terms or more (module docs), and at 10 with an f64 output the promise would not hold.
#[test]
fn twice_a_chunks_threshold_is_within_the_promise() {
    let prec = |acc: Format, out: Format| Precision {
        input: Format::Bf16,
        accumulator: Accumulator::any_order(acc),
        output: out,
    };
    // `2·τ_c / b̄_c` for a chunk of CHUNK elements of magnitude 1 and |got| = 1.
    let factor = |p: &Precision, n: usize| {
        let b = ErrorBound::new(p, n);
        let gamma_n = crate::gemm::bound::gamma(n, 2f64.powi(-53));
        let one = ((b.coeff_magnitude + gamma_n) + b.coeff_value + b.floor + b.underflow)
            / (1.0 - b.coeff_value);
        let w = CHUNK as f64;
        let tau = Roundoff::new(n, CHUNK).threshold(&b, w, w, CHUNK);
        2.0 * tau / one
    };
    let narrow = [Format::Bf16, Format::F16, Format::F32];
    for n in [1, 2, 11, 200, 7168, 1 << 20] {
        for acc in narrow {
            for out in narrow.into_iter().chain([Format::F64]) {
                if ErrorBound::new(&prec(acc, out), n).is_vacuous() {
                    continue; // an accumulator that cannot resolve a sum this long
                }
                let f = factor(&prec(acc, out), n);
                assert!(
                    f <= 2.0 * CHUNK as f64 * 1.000_001,
                    "{acc:?} {out:?} {n}: {f}"
                );
            }
        }
    }
    for n in [11, 12, 100, 7168] {
        for out in narrow.into_iter().chain([Format::F64]) {
            let f = factor(&prec(Format::F64, out), n);
            assert!(f <= LONE as f64, "f64 {out:?} {n}: {f}");
        }
    }
    assert!(factor(&prec(Format::F64, Format::F64), 10) > LONE as f64);
}
