//! Element-by-element comparison against the reference, reported per pass and per group.
//!
//! Every element is judged against its own bound ([`ErrorBound::at`]); nothing is judged by a
//! whole-tensor metric. Per group (and for the tail rows as their own group) the report keeps
//! the max absolute error, the max error/bound ratio, the max ULP distance in the output
//! format, DeepGEMM's `calc_diff`, NaN/Inf counts and the worst element, so one bad small group
//! cannot hide behind a large good one.

use ndarray::ArrayView2;
use serde::{Deserialize, Serialize};

use super::bound::{ErrorBound, Precision};
use super::case::{GemmOutputs, GroupedGemmCase, Pass, Passes, TailContract};
use super::fast::{FastPass, Verify};
use super::fit::Fit;
use super::grouped::ReferenceResult;
pub(crate) use super::judge::zero_ratio;
use super::judge::Acc;
pub use super::judge::{GemmAt, GroupId, GroupStats, Worst};
use super::stream::{group_blocks, group_work};
use crate::format::Format;
use crate::stats::{max_of, worst_slice, ElementStats};

/// The comparison of one pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PassReport {
    pub pass: Pass,
    /// The output's shape.
    pub shape: Vec<usize>,
    /// The reduction length `n` of this pass and the depth the bound used.
    pub reduction_len: usize,
    pub bound_depth: usize,
    /// Whether the bound is infinite (the declared accumulator cannot resolve this length).
    pub bound_vacuous: bool,
    /// Whether tail rows were checked (false under [`TailContract::Ignored`]; wgrad has none).
    pub tail_checked: bool,
    /// One entry per expert, then (fwd, dgrad) one for the tail rows.
    pub groups: Vec<GroupStats>,
    /// Why the pass failed without element statistics (e.g. the implementation returned no
    /// output or one of the wrong shape).
    pub error: Option<String>,
    /// The bound's teeth: `max |want| / bound` over the checked elements (0 only where every
    /// value is 0; a non-zero value under an infinite bound counts as the smallest positive
    /// ratio, ∞ where the bound is 0 and the value is not). At most 1 with some `want ≠ 0` means an
    /// all-zero output would have passed this pass too: the verdict is then INCONCLUSIVE.
    #[serde(default)]
    pub zero_ratio: f64,
    /// A format narrower than the declared output in which every non-zero output of this
    /// pass is exactly representable (at least 16 of them): the implementation probably
    /// writes that format, and should declare it (`--out-dtype`).
    #[serde(default)]
    pub looks_like: Option<Format>,
    /// The evidence `looks_like` is read from, kept so that the reports of a case checked
    /// a slice of experts at a time ([`super::shard`]) merge into the whole case's.
    #[serde(skip)]
    pub(crate) fit: Fit,
}

impl PassReport {
    /// Whether an all-zero output would have passed this pass although some reference value
    /// is not 0: the bound cannot tell a right answer from a plainly wrong one.
    pub fn admits_zero(&self) -> bool {
        // `zero_ratio` is 0 only when every reference value is 0 (then zeros are right).
        self.error.is_none() && self.zero_ratio > 0.0 && self.zero_ratio <= 1.0
    }
    pub fn passed(&self) -> bool {
        self.error.is_none() && self.groups.iter().all(GroupStats::passed)
    }
    pub fn failed_elements(&self) -> usize {
        self.groups.iter().map(|g| g.stats.failed).sum()
    }
    /// The group whose worst element has the largest bound ratio.
    pub fn worst_group(&self) -> Option<&GroupStats> {
        worst_slice(&self.groups, |g| &g.stats)
    }
    /// Max over groups of a statistic (NaN-propagating).
    pub fn max_of(&self, f: impl Fn(&ElementStats<GemmAt>) -> f64) -> f64 {
        max_of(self.groups.iter().map(|g| &g.stats), f)
    }
}

/// The comparison of every asked pass of a case, in either mode ([`Verify`]).
///
/// Full verification: `passes` holds every element, `fast` is empty. Fast verification
/// ([`super::fast`]): `passes` holds the sampled rows and columns, tail rows and zero-length
/// reductions (per group, as full mode reports them), and `fast` per pass the random
/// projections of every row and the NaN/inf scan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseReport {
    pub precision: Precision,
    pub tail: TailContract,
    /// The mode that made this report.
    #[serde(default = "full")]
    pub verify: Verify,
    pub passes: Vec<PassReport>,
    /// Fast verification only: per pass the projections and the NaN/inf scan.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fast: Vec<FastPass>,
}

fn full() -> Verify {
    Verify::Full
}

impl CaseReport {
    /// Every pass held, and under fast verification every projection and every element's
    /// finiteness.
    pub fn passed(&self) -> bool {
        self.passes.iter().all(PassReport::passed) && self.fast.iter().all(FastPass::passed)
    }
    /// When every pass passed but one admits an all-zero output, one line naming it.
    pub fn inconclusive(&self) -> Option<String> {
        let p = self.passes.iter().find(|p| p.admits_zero())?;
        Some(format!(
            "{}: the bound admits an all-zero output (max |want|/bound = {:.3}{}): the declared accumulator's worst-case bound at this reduction length is looser than the values themselves, so a pass would say nothing",
            p.pass,
            p.zero_ratio,
            if p.bound_vacuous { ", the bound is infinite" } else { "" }
        ))
    }

    /// A one-line description of the first failure, if any: under fast verification
    /// non-finite elements first, then the sampled elements, then the projections.
    pub fn first_failure(&self) -> Option<String> {
        let non_finite = self.fast.iter().find(|f| f.non_finite > 0);
        non_finite
            .and_then(FastPass::failure)
            .or_else(|| self.element_failure())
            .or_else(|| self.fast.iter().find_map(FastPass::failure))
    }

    /// The first pass with an element outside its bound (or unreadable), in one line.
    fn element_failure(&self) -> Option<String> {
        let p = self.passes.iter().find(|p| !p.passed())?;
        if let Some(e) = &p.error {
            return Some(format!("{}: {e}", p.pass));
        }
        let g = worst_slice(p.groups.iter().filter(|g| !g.passed()), |g| &g.stats)?;
        let w = g.stats.worst.as_ref()?;
        let (got, want) = crate::report::sci_pair(w.got, w.want);
        Some(format!(
            "{}: {} of {} elements of {} outside the bound; worst at row {} col {}: got {}, want {}, bound {}",
            p.pass, g.stats.failed, g.stats.checked, g.group, w.at.row, w.at.col, got, want, crate::report::bound_text(w.bound)
        ))
    }
}

/// Compares `got` against the reference for every pass in `passes`, with the reference's
/// values and magnitudes computed whole beforehand.
///
/// Reads `case` (for the group layout and tail contract), `reference` (values and
/// magnitudes) and `got`. A pass asked but missing from `got`, or of the wrong shape, fails
/// with a reason instead of element statistics. [`compare_streamed`] gives the same report
/// without holding the reference.
pub fn compare_outputs(
    case: &GroupedGemmCase,
    passes: Passes,
    precision: &Precision,
    reference: &ReferenceResult,
    got: &GemmOutputs,
) -> CaseReport {
    compare_outputs_with_bound(case, passes, precision, reference, got, &|n| {
        ErrorBound::new(precision, n)
    })
}

/// [`compare_outputs`] with the per-element bound of reduction length `n` given by `bound(n)`
/// instead of [`ErrorBound::new`] (used by the FP8 grouped GEMM, whose bound depends on the
/// scaling and the accumulation model, see `crate::fp8::gemm`). `precision.output` is the
/// format ULP distances are measured in.
pub fn compare_outputs_with_bound(
    case: &GroupedGemmCase,
    passes: Passes,
    precision: &Precision,
    reference: &ReferenceResult,
    got: &GemmOutputs,
    bound: &dyn Fn(usize) -> ErrorBound,
) -> CaseReport {
    compare_with(
        case,
        passes,
        precision,
        Source::Whole(reference),
        got,
        bound,
    )
}

/// [`compare_outputs`] with the reference computed expert by expert as the comparison reaches
/// it ([`super::stream`]), in parallel over experts: memory beyond `case` and `got` is one
/// expert's widened operand and a few row blocks per core. The report is the same as [`compare_outputs`]'s (a test checks it).
///
/// # Panics
/// When `case` is invalid for `passes` (validate it first).
pub fn compare_streamed(
    case: &GroupedGemmCase,
    passes: Passes,
    precision: &Precision,
    got: &GemmOutputs,
) -> CaseReport {
    compare_with(case, passes, precision, Source::Streamed, got, &|n| {
        ErrorBound::new(precision, n)
    })
}

/// `visit(first, want, magnitude)`: one row block of the reference, from row `first`.
type BlockVisit<'v> = dyn FnMut(usize, ArrayView2<f64>, ArrayView2<f64>) + 'v;

/// Where the reference side of a comparison comes from.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// Values and magnitudes computed whole beforehand (the FP8 references).
    Whole(&'a ReferenceResult),
    /// Computed group by group, in row blocks, as the comparison reaches them.
    Streamed,
}

impl Source<'_> {
    /// Calls `visit(first, want, magnitude)` for consecutive row blocks of group `g` of
    /// `pass` (rows of the output for fwd/dgrad, of `drhs[g]` for wgrad).
    fn group(
        self,
        case: &GroupedGemmCase,
        off: &[usize],
        pass: Pass,
        g: usize,
        visit: &mut BlockVisit<'_>,
    ) {
        match self {
            Source::Whole(r) => {
                let asked = "reference computed the asked pass";
                let first = if pass == Pass::Wgrad { 0 } else { off[g] };
                let want = r.value.group(pass, g, off).expect(asked).f64();
                let mag = r.magnitude.group(pass, g, off).expect(asked).f64();
                visit(first, want.view(), mag.view());
            }
            Source::Streamed => group_blocks(case, off, pass, g, true, &mut |b| {
                let mag = b.magnitude.expect("magnitudes were asked for");
                visit(b.first, b.value, mag)
            }),
        }
    }
}

fn compare_with(
    case: &GroupedGemmCase,
    passes: Passes,
    precision: &Precision,
    source: Source<'_>,
    got: &GemmOutputs,
    bound: &dyn Fn(usize) -> ErrorBound,
) -> CaseReport {
    let off = case.offsets();
    let (m, k, n, groups) = (case.m(), case.k(), case.n(), case.groups());
    let mut reports = Vec::new();
    for pass in passes.iter() {
        let (shape, got_shape) = match pass {
            Pass::Fwd => (vec![m, n], got.out.as_ref().map(|a| a.shape().to_vec())),
            Pass::Dgrad => (vec![m, k], got.dlhs.as_ref().map(|a| a.shape().to_vec())),
            Pass::Wgrad => (
                vec![groups, k, n],
                got.drhs.as_ref().map(|a| a.shape().to_vec()),
            ),
        };
        let report = match got_shape {
            None => missing(pass, &shape, "the implementation returned no output"),
            Some(g) if g != shape => missing(
                pass,
                &shape,
                &format!("{} has shape {g:?}, expected {shape:?}", pass.output_name()),
            ),
            Some(_) => {
                // One bound per group: the reduction length is the pass's (fwd K, dgrad N)
                // or, for wgrad, the group's size.
                let bounds: Vec<ErrorBound> = (0..groups)
                    .map(|g| match pass {
                        Pass::Fwd => bound(k),
                        Pass::Dgrad => bound(n),
                        Pass::Wgrad => bound(case.group_sizes[g]),
                    })
                    .collect();
                let outcomes = crate::par::map_by_cost(
                    (0..groups).collect(),
                    |g| group_work(case, &off, pass, *g),
                    |g| {
                        let got_rows = match pass {
                            Pass::Fwd => got.out.as_ref().map(|a| a.view()),
                            Pass::Dgrad => got.dlhs.as_ref().map(|a| a.view()),
                            Pass::Wgrad => got.drhs.as_ref().map(|a| a.outer(g)),
                        }
                        .expect("the shape was checked");
                        let mut acc = Acc::new(GroupId::Expert(g), precision.output);
                        let b = &bounds[g];
                        source.group(case, &off, pass, g, &mut |first, want, mag| {
                            acc.push_rows(first, got_rows, want, mag, b);
                        });
                        acc.finish()
                    },
                );
                let tail_bound = bound(0);
                pass_report(
                    pass,
                    shape,
                    case,
                    &bounds,
                    &tail_bound,
                    outcomes,
                    precision.output,
                    got,
                )
            }
        };
        reports.push(report);
    }
    CaseReport {
        precision: *precision,
        tail: case.tail,
        verify: Verify::Full,
        passes: reports,
        fast: Vec::new(),
    }
}

/// The report of a pass from its groups' outcomes, with the tail rows (fwd, dgrad) checked
/// here against exact zeros, or counted as unchecked under [`TailContract::Ignored`].
#[allow(clippy::too_many_arguments)]
fn pass_report(
    pass: Pass,
    shape: Vec<usize>,
    case: &GroupedGemmCase,
    bounds: &[ErrorBound],
    tail_bound: &ErrorBound,
    outcomes: Vec<(GroupStats, f64, Fit)>,
    out: Format,
    got: &GemmOutputs,
) -> PassReport {
    let mut stats = Vec::with_capacity(outcomes.len() + 1);
    let mut teeth = 0.0f64;
    let mut fit = Fit::ALL;
    for (group, t, f) in outcomes {
        stats.push(group);
        teeth = teeth.max(t);
        fit = fit.and(f);
    }
    let tail_checked = pass != Pass::Wgrad && case.tail == TailContract::Zero;
    if pass != Pass::Wgrad {
        let used = case.rows_used();
        let whole = match pass {
            Pass::Fwd => got.out.as_ref(),
            _ => got.dlhs.as_ref(),
        }
        .expect("the shape was checked")
        .view();
        let rows = whole.nrows() - used;
        if tail_checked {
            // Every product is zero there, so the bound is 0: only an exact 0 passes.
            let mut acc = Acc::new(GroupId::Tail, out);
            let zeros = ndarray::Array2::<f64>::zeros((rows, whole.ncols()));
            acc.push_rows(used, whole, zeros.view(), zeros.view(), tail_bound);
            let (group, t, f) = acc.finish();
            stats.push(group);
            teeth = teeth.max(t);
            fit = fit.and(f);
        } else {
            stats.push(GroupStats {
                group: GroupId::Tail,
                stats: ElementStats::unchecked(rows * whole.ncols()),
            });
        }
    }
    let reduction_len = match pass {
        Pass::Fwd => case.k(),
        Pass::Dgrad => case.n(),
        Pass::Wgrad => case.group_sizes.iter().copied().max().unwrap_or(0),
    };
    PassReport {
        pass,
        shape,
        reduction_len,
        bound_depth: bounds.iter().map(|b| b.depth).max().unwrap_or(0),
        bound_vacuous: bounds.iter().any(ErrorBound::is_vacuous),
        tail_checked,
        groups: stats,
        error: None,
        zero_ratio: teeth,
        looks_like: fit.narrower_than(out),
        fit,
    }
}

fn missing(pass: Pass, shape: &[usize], why: &str) -> PassReport {
    PassReport {
        pass,
        shape: shape.to_vec(),
        reduction_len: 0,
        bound_depth: 0,
        bound_vacuous: false,
        tail_checked: false,
        groups: Vec::new(),
        error: Some(why.to_string()),
        zero_ratio: 0.0,
        looks_like: None,
        fit: Fit::ALL,
    }
}
