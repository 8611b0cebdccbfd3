//! Checking a grouped GEMM a slice of experts at a time, for implementations that compute
//! their experts independently (the in-process models: the reference and `emulate`).
//!
//! The experts of a grouped GEMM do not share arithmetic: expert `g`'s rows of `out` and
//! `dlhs` and its `drhs[g]` depend only on its rows of `lhs` and `dout` and on `rhs[g]`. A
//! case whose outputs do not fit in memory beside its inputs (DeepSeek-V3's `drhs` alone is
//! 15 GB in f32) can therefore be cut into [`Shard`]s of consecutive experts, each a valid
//! grouped-GEMM case of its own ([`GroupedGemmCase::shard`]): the implementation runs one
//! shard, the shard is compared, its outputs are dropped, and the shards' reports are merged
//! into the report of the whole case ([`merge_case`]), with experts, rows and
//! worst elements numbered as in the whole case. The last shard also holds the tail rows.
//!
//! Under full verification the merged report is the whole case's report, field for field (a
//! test checks it, on right and wrong outputs; the FP8 GEMM's comparison with the unquantised
//! GEMM, information, matches up to the order of its sums, `crate::fp8`'s shards). Under fast verification each shard draws its
//! own random rows, columns and projections, so the merged report is as strong as the whole
//! case's but not the same draw.
//!
//! A kernel under test is never run in shards: a bug that appears only at the whole size (an
//! offset past 2^31 elements, the 200th expert's scale) must see the whole size. Running in
//! shards is for the models that stand in for one, and for the reference checking itself. A
//! kernel's whole outputs may still be *checked* a shard at a time ([`shard_outputs`]), where
//! the whole case's references would not fit (the FP8 GEMM's are held whole).

use std::ops::Range;

use ndarray::s;

use super::case::{GemmOutputs, GroupedGemmCase, Pass, Passes};
use super::compare::{CaseReport, GemmAt, GroupId, GroupStats, PassReport};
use super::fast::{ChunkWorst, FastPass, ProjectionWorst, Verify};
use super::fit::Fit;
use super::op::{ByMode, Gemm, Streamed};
use super::weights::Weights;
use crate::format::Format;
use crate::op::Op;

/// Consecutive experts of a case and the rows they own (the last shard's run to the end of
/// the case, so it holds the tail rows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub experts: Range<usize>,
    pub rows: Range<usize>,
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "experts {}..{}", self.experts.start, self.experts.end)
    }
}

/// Splits `case`'s experts into `parts` shards (as many as there are experts, when fewer) of
/// consecutive experts whose inputs and outputs are about the same size ([`plan_sizes`]).
pub fn plan(case: &GroupedGemmCase, parts: usize) -> Vec<Shard> {
    plan_sizes(&case.group_sizes, case.m(), case.k(), case.n(), parts)
}

/// [`plan`] for a case of `m` rows whose experts have `sizes` rows, `K = k`, `N = n`, before
/// it is made (the memory guard plans with it). An expert costs its `K·N` weight and gradient
/// and its rows' `K + N` inputs and outputs. Every shard has at least one expert; the last
/// one's rows run to `m` (the tail rows); no experts make one empty shard.
pub fn plan_sizes(sizes: &[usize], m: usize, k: usize, n: usize, parts: usize) -> Vec<Shard> {
    let groups = sizes.len();
    let off = super::case::offsets(sizes);
    let parts = parts.clamp(1, groups.max(1));
    let cost = |g: usize| (k * n) as f64 * 6.0 + (sizes[g] * (k + n)) as f64 * 8.0;
    let total: f64 = (0..groups).map(cost).sum();
    let mut shards = Vec::with_capacity(parts);
    let (mut start, mut seen) = (0, 0.0);
    for g in 0..groups {
        seen += cost(g);
        let done = shards.len() + 1;
        // Close the shard once it holds its share of the cost, or when the experts left are
        // just enough for one in each shard still to come.
        let share = total * done as f64 / parts as f64;
        let left = groups - (g + 1);
        if done < parts && left >= parts - done && (seen >= share || left == parts - done) {
            shards.push(Shard {
                experts: start..g + 1,
                rows: off[start]..off[g + 1],
            });
            start = g + 1;
        }
    }
    shards.push(Shard {
        experts: start..groups,
        rows: off[start]..m.max(off[groups]),
    });
    shards
}

impl Weights {
    /// A copy of experts `experts`' weights, held as these are.
    pub fn experts(&self, experts: Range<usize>) -> Weights {
        match self {
            Weights::F32(a) => Weights::F32(a.slice(s![experts, .., ..]).to_owned()),
            Weights::Bf16(a) => Weights::Bf16(a.slice(s![experts, .., ..]).to_owned()),
        }
    }
}

impl GroupedGemmCase {
    /// The case of `shard`'s experts alone: copies of their rows of `lhs` and `dout` and of
    /// their weights, the same formats and tail contract.
    pub fn shard(&self, shard: &Shard) -> GroupedGemmCase {
        let rows = shard.rows.clone();
        GroupedGemmCase {
            lhs: self.lhs.slice(s![rows.clone(), ..]).to_owned(),
            rhs: self.rhs.experts(shard.experts.clone()),
            group_sizes: self.group_sizes[shard.experts.clone()].to_vec(),
            dout: self.dout.as_ref().map(|d| d.slice(s![rows, ..]).to_owned()),
            dtype: self.dtype,
            out_dtype: self.out_dtype,
            tail: self.tail,
        }
    }
}

/// `shard`'s part of outputs written for the whole `case`: its rows of `out` and `dlhs` and
/// its experts' `drhs`, in the precision they were written in. A kernel under test runs on
/// the whole case, and its outputs are checked a shard at a time against each shard's
/// reference (`moecheck gemm` when the whole case's references do not fit; the merged report
/// is the one [`Sharded::merge`] gives for the shards run one by one). Only the `passes`
/// asked are kept (the check reads no other); a missing pass stays missing.
///
/// # Errors
/// When an asked output's shape is not the whole case's (it cannot be cut into shards),
/// naming the pass and both shapes.
pub fn shard_outputs(
    got: &GemmOutputs,
    case: &GroupedGemmCase,
    shard: &Shard,
    passes: Passes,
) -> Result<GemmOutputs, String> {
    fn check(pass: Pass, got: &[usize], want: &[usize]) -> Result<(), String> {
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "{pass}: the output has shape {got:?}, the case's is {want:?}"
            ))
        }
    }
    let (m, k, n, g) = (case.m(), case.k(), case.n(), case.groups());
    let out = got.out.as_ref().filter(|_| passes.fwd);
    let dlhs = got.dlhs.as_ref().filter(|_| passes.dgrad);
    let drhs = got.drhs.as_ref().filter(|_| passes.wgrad);
    if let Some(a) = out {
        check(Pass::Fwd, a.shape(), &[m, n])?;
    }
    if let Some(a) = dlhs {
        check(Pass::Dgrad, a.shape(), &[m, k])?;
    }
    if let Some(a) = drhs {
        check(Pass::Wgrad, a.shape(), &[g, k, n])?;
    }
    Ok(GemmOutputs {
        out: out.map(|a| a.outer_range(shard.rows.clone())),
        dlhs: dlhs.map(|a| a.outer_range(shard.rows.clone())),
        drhs: drhs.map(|a| a.outer_range(shard.experts.clone())),
    })
}

/// Where `shard`'s part of a file of the grouped GEMM's case directory (docs/protocol.md) lies
/// along the file's first axis: its rows of `lhs.npy`, `dout.npy`, `out.npy` and `dlhs.npy`,
/// its experts of `rhs.npy` and `drhs.npy`; `None` for a file no shard cuts
/// (`group_sizes.npy`). A case too large to hold is written and read back this way, a shard at
/// a time.
pub fn file_range(file: &str, shard: &Shard) -> Option<Range<usize>> {
    match file {
        "lhs.npy" | "dout.npy" | "out.npy" | "dlhs.npy" => Some(shard.rows.clone()),
        "rhs.npy" | "drhs.npy" => Some(shard.experts.clone()),
        _ => None,
    }
}

impl Shard {
    /// A shard's group as it is in the whole case.
    fn group(&self, group: GroupId) -> GroupId {
        match group {
            GroupId::Expert(g) => GroupId::Expert(g + self.experts.start),
            GroupId::Tail => GroupId::Tail,
        }
    }

    /// A row of a shard's output of `pass` as it is in the whole case: `drhs` rows are the
    /// `k` index of the expert's gradient, the same in any shard.
    fn row(&self, row: usize, pass: Pass) -> usize {
        if pass == Pass::Wgrad {
            row
        } else {
            row + self.rows.start
        }
    }

    /// A shard's element location as it is in the whole case.
    fn at(&self, at: GemmAt, pass: Pass) -> GemmAt {
        GemmAt {
            group: self.group(at.group),
            row: self.row(at.row, pass),
            col: at.col,
        }
    }
}

/// The shape of `pass`'s output in the whole case.
fn whole_shape(case: &GroupedGemmCase, pass: Pass) -> Vec<usize> {
    match pass {
        Pass::Fwd => vec![case.m(), case.n()],
        Pass::Dgrad => vec![case.m(), case.k()],
        Pass::Wgrad => vec![case.groups(), case.k(), case.n()],
    }
}

/// One pass's report of the whole case from its shards' (in shard order).
fn merge_pass(
    case: &GroupedGemmCase,
    output: Format,
    parts: &[(&Shard, &PassReport)],
) -> PassReport {
    let (_, first) = parts[0];
    let pass = first.pass;
    let shape = whole_shape(case, pass);
    if let Some((shard, p)) = parts.iter().find(|(_, p)| p.error.is_some()) {
        let why = p.error.as_deref().unwrap_or_default();
        return PassReport {
            shape,
            error: Some(format!("{shard}: {why}")),
            groups: Vec::new(),
            ..(*p).clone()
        };
    }
    let last = parts.len() - 1;
    let mut groups: Vec<GroupStats> = Vec::with_capacity(case.groups() + 1);
    let mut fit = Fit::ALL;
    for (i, (shard, p)) in parts.iter().enumerate() {
        fit = fit.and(p.fit);
        for g in &p.groups {
            // The tail rows are the last shard's: the others' tail groups are empty.
            if g.group == GroupId::Tail && i != last {
                continue;
            }
            let mut g = g.clone();
            g.group = shard.group(g.group);
            if let Some(w) = g.stats.worst.as_mut() {
                w.at = shard.at(w.at, pass);
            }
            groups.push(g);
        }
    }
    PassReport {
        pass,
        shape,
        reduction_len: parts
            .iter()
            .map(|(_, p)| p.reduction_len)
            .max()
            .unwrap_or(0),
        bound_depth: parts.iter().map(|(_, p)| p.bound_depth).max().unwrap_or(0),
        bound_vacuous: parts.iter().any(|(_, p)| p.bound_vacuous),
        tail_checked: parts[last].1.tail_checked,
        groups,
        error: None,
        zero_ratio: parts.iter().map(|(_, p)| p.zero_ratio).fold(0.0, f64::max),
        looks_like: fit.narrower_than(output),
        fit,
    }
}

/// The report of the whole case from its shards' reports (in shard order, every one of the
/// same passes and mode): groups, rows and worst elements renumbered as in the whole case;
/// counts summed, maxima taken; the first shard's error, naming the shard, fails its pass.
/// Under fast verification the projections' rows and failures are summed too, the worst
/// projection the one furthest past its threshold.
///
/// # Panics
/// When `parts` is empty.
pub fn merge_case(case: &GroupedGemmCase, parts: &[(Shard, CaseReport)]) -> CaseReport {
    let (_, first) = &parts[0];
    let passes = (0..first.passes.len())
        .map(|i| {
            let of_pass: Vec<(&Shard, &PassReport)> =
                parts.iter().map(|(s, r)| (s, &r.passes[i])).collect();
            merge_pass(case, first.precision.output, &of_pass)
        })
        .collect();
    CaseReport {
        precision: first.precision,
        tail: first.tail,
        verify: first.verify,
        passes,
        fast: merge_projections(parts),
    }
}

/// The shards' projections of fast verification, pass by pass (none under full).
fn merge_projections(parts: &[(Shard, CaseReport)]) -> Vec<FastPass> {
    // A shard whose output of a pass could not be read has no projections for it: the
    // passes are matched by name, and such a pass fails in the sampled report.
    let mut fast: Vec<FastPass> = Vec::new();
    for (shard, r) in parts {
        for p in &r.fast {
            let worst = p.worst.as_ref().map(|w| ProjectionWorst {
                group: w.group + shard.experts.start,
                row: shard.row(w.row, p.pass),
                ..w.clone()
            });
            let chunk_worst = p.chunk_worst.as_ref().map(|w| ChunkWorst {
                group: w.group + shard.experts.start,
                row: shard.row(w.row, p.pass),
                ..w.clone()
            });
            let first_non_finite = p.first_non_finite.map(|at| shard.at(at, p.pass));
            let i = match fast.iter().position(|m| m.pass == p.pass) {
                Some(i) => i,
                None => {
                    fast.push(FastPass {
                        worst: None,
                        first_non_finite: None,
                        rows: 0,
                        failed_rows: 0,
                        non_finite: 0,
                        max_ratio: 0.0,
                        chunks: 0,
                        failed_chunks: 0,
                        chunk_max_ratio: 0.0,
                        chunk_worst: None,
                        ..p.clone()
                    });
                    fast.len() - 1
                }
            };
            let m = &mut fast[i];
            m.rows += p.rows;
            m.failed_rows += p.failed_rows;
            m.chunks += p.chunks;
            m.failed_chunks += p.failed_chunks;
            m.non_finite += p.non_finite;
            m.first_non_finite = m.first_non_finite.or(first_non_finite);
            // As inside one shard: the first of equal ratios stays (a NaN row's is ∞).
            if worst.is_some() && (m.worst.is_none() || p.max_ratio > m.max_ratio) {
                m.max_ratio = p.max_ratio;
                m.worst = worst;
            }
            if chunk_worst.is_some()
                && (m.chunk_worst.is_none() || p.chunk_max_ratio > m.chunk_max_ratio)
            {
                m.chunk_max_ratio = p.chunk_max_ratio;
                m.chunk_worst = chunk_worst;
            }
        }
    }
    fast.sort_by_key(|f| f.pass);
    fast
}

/// A grouped-GEMM check whose case cuts into shards and whose reports merge across them:
/// [`Gemm`] and the FP8 grouped GEMM, in either mode ([`Verify`]).
pub trait Sharded: Op<Ask = Passes, Outputs = GemmOutputs, Check = Verify> {
    /// The grouped GEMM the shards are planned on ([`plan`]).
    fn grouped(case: &Self::Case) -> &GroupedGemmCase;

    /// The case of `shard`'s experts alone.
    fn shard(case: &Self::Case, shard: &Shard) -> Self::Case;

    /// The report of the whole case from its shards' ([`merge_case`]).
    fn merge(case: &Self::Case, parts: &[(Shard, Self::Report)]) -> Self::Report;

    /// What a run checked in shards in mode `check` keeps as its reference: nothing is held
    /// for the whole case, and the grouped GEMM's reports read only its mode.
    fn unheld(check: Verify) -> Self::Expected;
}

impl Sharded for Gemm {
    fn grouped(case: &GroupedGemmCase) -> &GroupedGemmCase {
        case
    }
    fn shard(case: &GroupedGemmCase, shard: &Shard) -> GroupedGemmCase {
        case.shard(shard)
    }
    fn merge(case: &GroupedGemmCase, parts: &[(Shard, CaseReport)]) -> CaseReport {
        merge_case(case, parts)
    }
    fn unheld(check: Verify) -> ByMode<Streamed> {
        ByMode::unheld(check, Streamed)
    }
}

#[cfg(test)]
#[path = "shard_tests.rs"]
mod tests;
