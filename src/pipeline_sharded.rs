//! The grouped GEMM's runs of [`crate::pipeline`] in shards of experts
//! ([`moecheck_reference::gemm::shard`]): an implementation run a shard at a time
//! ([`run_sharded`]), or run once on the whole case and checked a shard at a time
//! ([`run_whole_checked_in_shards`]).

use std::time::Instant;

use anyhow::{bail, Context};

use moecheck_reference::gemm::shard::{self, Shard, Sharded};
use moecheck_reference::gemm::Verify;
use moecheck_reference::op::{verify_against, Implementation, Op, RunError, Verdict, Verified};
use moecheck_reference::report::Implemented;

use crate::pipeline::{prepare, Generate, Generated, Run, ShardSource};
use crate::progress::Progress;
use crate::registry::Backends;

/// [`crate::pipeline::run`] for a grouped GEMM checked `parts` shards of consecutive experts
/// at a time ([`moecheck_reference::gemm::shard`]): each shard's case is made (by the
/// generator on its own where it can, [`Generate::shards`], so the whole case's inputs are
/// never held; otherwise cut from the whole case), run by `imp`, checked and dropped with
/// its inputs and outputs, and the shards' reports are merged into the whole case's. Only
/// for an implementation that is [`Implementation::shardable`]; nothing is dumped (no
/// shard's outputs are kept).
///
/// An implementation that fails on a shard fails the run, naming the shard; the shards after
/// it are not run.
pub fn run_sharded<O: Backends + Sharded>(
    generator: &dyn Generate<O>,
    imp: &dyn Implementation<O>,
    parts: usize,
    check: Verify,
) -> anyhow::Result<Run<O>> {
    debug_assert!(imp.shardable(), "{} is checked whole", imp.name());
    in_shards(generator, imp, parts, check, false)
}

/// Runs `imp` on the whole generated case once, then checks its outputs a shard of experts at
/// a time ([`shard::shard_outputs`]), each against its shard's reference, and merges the
/// shards' reports into the whole case's ([`Sharded::merge`]): the same report as
/// [`run_sharded`] gives for an implementation that computes each expert on its own, with the
/// implementation seeing the whole case. For a kernel under test whose case fits in memory
/// but whose whole references do not (the FP8 GEMM holds its references whole). Nothing is
/// dumped.
///
/// An output whose shape is not the whole case's cannot be cut into shards: the run fails,
/// naming the pass and both shapes.
pub fn run_whole_checked_in_shards<O: Backends + Sharded>(
    generator: &dyn Generate<O>,
    imp: &dyn Implementation<O>,
    parts: usize,
    check: Verify,
) -> anyhow::Result<Run<O>> {
    in_shards(generator, imp, parts, check, true)
}

/// Both runs: `imp` run once on the whole case (`run_whole`) or once per shard, each shard
/// checked in mode `check` against its own reference, the reports merged.
fn in_shards<O: Backends + Sharded>(
    generator: &dyn Generate<O>,
    imp: &dyn Implementation<O>,
    parts: usize,
    check: Verify,
    run_whole: bool,
) -> anyhow::Result<Run<O>> {
    let progress = Progress::new(generator.work());
    // A kernel run on the whole case needs it whole; a model run a shard at a time needs one
    // shard's inputs at a time, made directly where the generator can.
    let source = if run_whole { None } else { generator.shards() };
    let generated = match &source {
        Some(source) => {
            progress.stage("planning the case's shards");
            source.header()?
        }
        None => prepare(generator, Some(imp), &progress)?,
    };
    let (case, ask) = (&generated.case, generated.ask);
    let precision = imp.precision(case);
    let whole = if run_whole {
        progress.stage(&format!("running {} on the whole case", imp.name()));
        match imp.run(case, ask) {
            Ok(got) => Some(got),
            Err(e) => {
                return Ok(finish(
                    generated,
                    imp,
                    precision,
                    Verdict::RunFailed(e),
                    0.0,
                    check,
                ))
            }
        }
    } else {
        None
    };
    let doing = match whole {
        Some(_) => format!(
            "checking {}'s outputs against the f64 reference",
            imp.name()
        ),
        None => format!(
            "running {} and checking it against the f64 reference",
            imp.name()
        ),
    };
    let plan = shard::plan(O::grouped(case), parts);
    let mut reports = Vec::with_capacity(plan.len());
    let mut reference_seconds = 0.0;
    let mut failed = None;
    for (i, s) in plan.iter().enumerate() {
        progress.stage(&format!("{s} ({} of {}): {doing}", i + 1, plan.len()));
        let cut = whole
            .as_ref()
            .map(|got| shard::shard_outputs(got, O::grouped(case), s, ask));
        let part = match cut.transpose() {
            Ok(part) => part,
            Err(e) => {
                failed = Some(RunError::new(e));
                break;
            }
        };
        let sub = match &source {
            Some(source) => made(source.as_ref(), s, ask, imp)?,
            None => O::shard(case, s),
        };
        let start = Instant::now();
        let expected =
            O::expected(&sub, ask, check).with_context(|| format!("generated case, {s}"))?;
        reference_seconds += start.elapsed().as_secs_f64();
        let report = match part {
            Some(part) => O::compare(&sub, ask, &precision, &expected, &part)
                .map_err(|e| anyhow::anyhow!("generated case, {s}: {e}"))?,
            None => match verify_against(imp, &sub, ask, &expected).verdict {
                Verdict::BadInput(e) => bail!("generated case, {s}: {e}"),
                Verdict::RunFailed(e) => {
                    failed = Some(RunError::new(format!("{s}: {e}")));
                    break;
                }
                Verdict::Pass(r)
                | Verdict::Fail { report: r, .. }
                | Verdict::Inconclusive { report: r, .. } => r,
            },
        };
        reports.push((s.clone(), report));
    }
    let verdict = match failed {
        Some(e) => Verdict::RunFailed(e),
        None => Verdict::of(O::merge(case, &reports)),
    };
    Ok(finish(
        generated,
        imp,
        precision,
        verdict,
        reference_seconds,
        check,
    ))
}

/// Shard `s` made on its own (not cut from a whole case), checked as
/// [`crate::pipeline::prepare`] checks a generated case: valid, and supported by `imp`.
pub(crate) fn made<O: Op>(
    source: &dyn ShardSource<O>,
    s: &Shard,
    ask: O::Ask,
    imp: &dyn Implementation<O>,
) -> anyhow::Result<O::Case> {
    let sub = source.shard(s);
    O::validate(&sub, ask).with_context(|| format!("generated case, {s}"))?;
    if let Err(reason) = imp.supports(&sub, ask) {
        bail!("{reason}");
    }
    Ok(sub)
}

/// The run of `imp` on `generated` with `verdict`, checked in mode `check`; no reference or
/// outputs are held.
pub(crate) fn finish<O: Backends + Sharded>(
    generated: Generated<O>,
    imp: &dyn Implementation<O>,
    precision: O::Precision,
    verdict: Verdict<O::Report>,
    reference_seconds: f64,
    check: Verify,
) -> Run<O> {
    let implemented = Implemented {
        name: imp.name(),
        is_model: imp.is_model(),
    };
    let verified = Verified {
        precision,
        outputs: None,
        verdict,
    };
    Run {
        generated,
        expected: O::unheld(check),
        reference_seconds,
        checked: Some((implemented, verified)),
        unwritten: None,
    }
}
