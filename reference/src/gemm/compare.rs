//! Element-by-element comparison against the reference, reported per pass and per group.
//!
//! Every element is judged against its own bound ([`ErrorBound::at`]); nothing is judged by a
//! whole-tensor metric. Per group (and for the tail rows as their own group) the report keeps
//! the max absolute error, the max error/bound ratio, the max ULP distance in the output
//! format, DeepGEMM's `calc_diff`, NaN/Inf counts and the worst element, so one bad small group
//! cannot hide behind a large good one.

use ndarray::{ArrayView2, ArrayView3};
use serde::{Deserialize, Serialize};

use super::bound::{ErrorBound, Precision};
use super::case::{GemmOutputs, GroupedGemmCase, Pass, Passes, TailContract};
use super::fit::Fit;
use super::grouped::ReferenceResult;
use crate::format::Format;
use crate::stats::{max_of, worst_slice, ElementStats, StatsAcc, WorstElement};

/// Which rows an element belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupId {
    /// Expert `g`'s rows (fwd, dgrad) or its weight gradient (wgrad).
    Expert(usize),
    /// Rows `>= Σ group_sizes` (dropped tokens).
    Tail,
}

impl std::fmt::Display for GroupId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GroupId::Expert(g) => write!(f, "expert {g}"),
            GroupId::Tail => f.write_str("tail"),
        }
    }
}

/// Where a grouped-GEMM element is: the group, and its row and column (for `drhs`, the `k`
/// index of expert `group`'s weight gradient).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GemmAt {
    pub group: GroupId,
    /// Row of `out`/`dlhs` (global index), or the `k` index of `drhs[g]`.
    pub row: usize,
    /// Column.
    pub col: usize,
}

/// The worst element of a group.
pub type Worst = WorstElement<GemmAt>;

/// Statistics of one group of one pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupStats {
    pub group: GroupId,
    #[serde(flatten)]
    pub stats: ElementStats<GemmAt>,
}

impl GroupStats {
    pub fn passed(&self) -> bool {
        self.stats.passed()
    }
}

/// Accumulates one group's statistics, and the bound's teeth ([`PassReport::zero_ratio`]).
struct Acc {
    group: GroupId,
    acc: StatsAcc<GemmAt>,
    teeth: f64,
    fit: Fit,
}

impl Acc {
    fn new(group: GroupId, out: Format) -> Acc {
        Acc {
            group,
            acc: StatsAcc::new(out),
            teeth: 0.0,
            fit: Fit::for_output(out),
        }
    }

    fn push(&mut self, row: usize, col: usize, got: f64, want: f64, bound: f64) {
        let group = self.group;
        self.teeth = self.teeth.max(zero_ratio(want, bound));
        self.fit.push(got, want);
        self.acc
            .push(|| GemmAt { group, row, col }, got, want, bound);
    }

    /// The group's statistics, its `max |want| / bound` and what its outputs fit.
    fn finish(self) -> (GroupStats, f64, Fit) {
        let stats = GroupStats {
            group: self.group,
            stats: self.acc.finish(),
        };
        (stats, self.teeth, self.fit)
    }
}

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
}

/// `|want| / bound` for one element, as [`PassReport::zero_ratio`] takes its maximum (full
/// and fast verification alike).
pub(crate) fn zero_ratio(want: f64, bound: f64) -> f64 {
    let w = want.abs();
    if w == 0.0 || !w.is_finite() {
        0.0
    } else if bound.is_infinite() || bound.is_nan() {
        f64::MIN_POSITIVE
    } else if bound > 0.0 {
        w / bound
    } else {
        f64::INFINITY
    }
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

/// The comparison of every asked pass of a case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseReport {
    pub precision: Precision,
    pub tail: TailContract,
    pub passes: Vec<PassReport>,
}

impl CaseReport {
    pub fn passed(&self) -> bool {
        self.passes.iter().all(PassReport::passed)
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

    /// A one-line description of the first failure, if any.
    pub fn first_failure(&self) -> Option<String> {
        let p = self.passes.iter().find(|p| !p.passed())?;
        if let Some(e) = &p.error {
            return Some(format!("{}: {e}", p.pass));
        }
        let g = worst_slice(p.groups.iter().filter(|g| !g.passed()), |g| &g.stats)?;
        let w = g.stats.worst.as_ref()?;
        Some(format!(
            "{}: {} of {} elements of {} outside the bound; worst at row {} col {}: got {}, want {}, bound {}",
            p.pass, g.stats.failed, g.stats.checked, g.group, w.at.row, w.at.col, crate::report::sci(w.got), crate::report::sci(w.want), crate::report::bound_text(w.bound)
        ))
    }
}

/// Compares `got` against the reference for every pass in `passes`.
///
/// Reads `case` (for the group layout and tail contract), `reference` (values and
/// magnitudes) and `got`. A pass asked but missing from `got`, or of the wrong shape, fails
/// with a reason instead of element statistics.
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
    let off = case.offsets();
    let mut reports = Vec::new();
    for pass in passes.iter() {
        let n = match pass {
            Pass::Fwd => case.k(),
            Pass::Dgrad => case.n(),
            Pass::Wgrad => 0, // per expert, see below
        };
        let report = match pass {
            Pass::Fwd | Pass::Dgrad => {
                let pick = |o: &GemmOutputs| {
                    if pass == Pass::Fwd {
                        o.out.clone()
                    } else {
                        o.dlhs.clone()
                    }
                };
                let want = pick(&reference.value).expect("reference computed the asked pass");
                let mag = pick(&reference.magnitude).expect("reference computed the asked pass");
                let bound = bound(n);
                match pick(got) {
                    None => missing(pass, want.shape(), "the implementation returned no output"),
                    Some(g) if g.shape() != want.shape() => missing(
                        pass,
                        want.shape(),
                        &format!(
                            "{} has shape {:?}, expected {:?}",
                            pass.output_name(),
                            g.shape(),
                            want.shape()
                        ),
                    ),
                    Some(g) => compare_rows(
                        pass,
                        n,
                        g.view(),
                        want.view(),
                        mag.view(),
                        &bound,
                        &off,
                        case.tail,
                        precision.output,
                    ),
                }
            }
            Pass::Wgrad => {
                let want = reference
                    .value
                    .drhs
                    .as_ref()
                    .expect("reference computed the asked pass");
                let mag = reference
                    .magnitude
                    .drhs
                    .as_ref()
                    .expect("reference computed the asked pass");
                match &got.drhs {
                    None => missing(pass, want.shape(), "the implementation returned no output"),
                    Some(g) if g.shape() != want.shape() => missing(
                        pass,
                        want.shape(),
                        &format!(
                            "drhs has shape {:?}, expected {:?}",
                            g.shape(),
                            want.shape()
                        ),
                    ),
                    Some(g) => compare_experts(
                        g.view(),
                        want.view(),
                        mag.view(),
                        precision,
                        &case.group_sizes,
                        bound,
                    ),
                }
            }
        };
        reports.push(report);
    }
    CaseReport {
        precision: *precision,
        tail: case.tail,
        passes: reports,
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
    }
}

#[allow(clippy::too_many_arguments)]
fn compare_rows(
    pass: Pass,
    n: usize,
    got: ArrayView2<f64>,
    want: ArrayView2<f64>,
    mag: ArrayView2<f64>,
    bound: &ErrorBound,
    off: &[usize],
    tail: TailContract,
    out: Format,
) -> PassReport {
    let groups = off.len() - 1;
    let m = want.nrows();
    let mut stats = Vec::with_capacity(groups + 1);
    let mut teeth = 0.0f64;
    let mut fit = Fit::ALL;
    let tail_checked = tail == TailContract::Zero;
    for g in 0..=groups {
        let (id, lo, hi) = if g < groups {
            (GroupId::Expert(g), off[g], off[g + 1])
        } else {
            (GroupId::Tail, off[groups], m)
        };
        if id == GroupId::Tail && !tail_checked {
            stats.push(GroupStats {
                group: id,
                stats: ElementStats::unchecked((hi - lo) * want.ncols()),
            });
            continue;
        }
        let mut acc = Acc::new(id, out);
        for r in lo..hi {
            for c in 0..want.ncols() {
                let (y, s) = (want[(r, c)], mag[(r, c)]);
                acc.push(r, c, got[(r, c)], y, bound.at(s, y));
            }
        }
        let (group, t, f) = acc.finish();
        stats.push(group);
        teeth = teeth.max(t);
        fit = fit.and(f);
    }
    PassReport {
        pass,
        shape: want.shape().to_vec(),
        reduction_len: n,
        bound_depth: bound.depth,
        bound_vacuous: bound.is_vacuous(),
        tail_checked,
        groups: stats,
        error: None,
        zero_ratio: teeth,
        looks_like: fit.narrower_than(out),
    }
}

fn compare_experts(
    got: ArrayView3<f64>,
    want: ArrayView3<f64>,
    mag: ArrayView3<f64>,
    precision: &Precision,
    sizes: &[usize],
    bound_of: &dyn Fn(usize) -> ErrorBound,
) -> PassReport {
    let (groups, k, n) = want.dim();
    let mut stats = Vec::with_capacity(groups);
    let mut teeth = 0.0f64;
    let mut vacuous = false;
    let mut depth = 0;
    let mut fit = Fit::ALL;
    for (g, &size) in sizes.iter().enumerate().take(groups) {
        let bound = bound_of(size);
        vacuous |= bound.is_vacuous();
        depth = depth.max(bound.depth);
        let mut acc = Acc::new(GroupId::Expert(g), precision.output);
        for r in 0..k {
            for c in 0..n {
                let (y, s) = (want[(g, r, c)], mag[(g, r, c)]);
                acc.push(r, c, got[(g, r, c)], y, bound.at(s, y));
            }
        }
        let (group, t, f) = acc.finish();
        stats.push(group);
        teeth = teeth.max(t);
        fit = fit.and(f);
    }
    PassReport {
        pass: Pass::Wgrad,
        shape: vec![groups, k, n],
        reduction_len: sizes.iter().copied().max().unwrap_or(0),
        bound_depth: depth,
        bound_vacuous: vacuous,
        tail_checked: false,
        groups: stats,
        error: None,
        zero_ratio: teeth,
        looks_like: fit.narrower_than(precision.output),
    }
}
