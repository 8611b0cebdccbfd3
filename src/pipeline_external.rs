//! A grouped GEMM run by an `exec:` or `worker:` program at a size moecheck does not hold
//! whole (DeepSeek-V3's expert GEMM, three passes: 8.7 GB of inputs, 16 GB of outputs in
//! float32):
//!
//! 1. the case is **written** to its directory a shard of experts at a time: each shard's
//!    inputs are made on their own ([`ShardSource`]) and appended to the input files
//!    ([`npy::Appender`]), so the whole case is never held;
//! 2. the program **runs once on the whole case**: a bug that appears only at the whole size
//!    (an offset past 2^31 elements, the 200th expert's weights) must see it;
//! 3. its outputs are **read back and checked a shard at a time**: each shard's inputs made
//!    again, its part of each output read from the file and nothing else
//!    ([`protocol::read_output_range`]), compared with the shard's own reference, and the
//!    reports merged into the whole case's ([`Sharded::merge`]): the report
//!    [`crate::pipeline_sharded`] gives.
//!
//! moecheck then holds one shard's inputs, outputs and reference at a time
//! ([`crate::memory::gemm_bytes_sharded`]); the files are the page cache's. Under full
//! verification the verdict is the one a whole check gives; under fast verification each shard
//! draws its own projections (as [`crate::pipeline_sharded`]).

use std::time::Instant;

use anyhow::Context;

use moecheck_reference::gemm::shard::{self, file_range, Shard, Sharded};
use moecheck_reference::gemm::{Gemm, GemmOutputs, GroupedGemmCase, OutArray, Passes, Verify};
use moecheck_reference::op::{Op, RunError, Verdict};
use moecheck_reference::protocol::Protocol;

use crate::impls::scratch::Scratch;
use crate::impls::{no_case_dir, unread, OnDisk};
use crate::npy::Appender;
use crate::pipeline::{Generate, Run, ShardSource};
use crate::pipeline_sharded::{finish, made};
use crate::progress::Progress;
use crate::{memory, npy, protocol};

/// Runs `imp` once on `generator`'s whole case, written and checked in `parts` shards of
/// consecutive experts (module docs), in mode `check`; `estimate` is moecheck's own estimated
/// peak, reported beside the measured one. Nothing is dumped.
///
/// An invalid generated shard, or one `imp` does not support, is an error (exit 2); a program
/// that fails, refuses, or writes an output that cannot be read is a failed run, its first
/// line the reason.
pub fn run(
    generator: &dyn Generate<Gemm>,
    imp: &dyn OnDisk<Gemm>,
    parts: usize,
    check: Verify,
    estimate: u64,
) -> anyhow::Result<Run<Gemm>> {
    let progress = Progress::new(generator.work());
    let source = generator
        .shards()
        .context("this grouped GEMM cannot be made a shard at a time")?;
    progress.stage("planning the case's shards");
    let generated = source.header()?;
    let (case, ask) = (&generated.case, generated.ask);
    let precision = imp.precision(case);
    let plan = shard::plan(case, parts);
    let name = imp.name();
    let mut times = Times::default();
    let failed = |generated, e: RunError| {
        finish(generated, imp, precision, Verdict::RunFailed(e), 0.0, check)
    };

    let start = Instant::now();
    let tmp = match write(source.as_ref(), case, ask, &plan, imp, &progress)? {
        Ok(tmp) => tmp,
        Err(e) => return Ok(failed(generated, e)),
    };
    times.write = start.elapsed().as_secs_f64();

    progress.stage(&format!("running {name} on the whole case"));
    let start = Instant::now();
    let tmp = match imp.run_on(tmp) {
        Ok(tmp) => tmp,
        Err(e) => return Ok(failed(generated, e)),
    };
    times.program = start.elapsed().as_secs_f64();

    let start = Instant::now();
    let mut reports = Vec::with_capacity(plan.len());
    let mut reference_seconds = 0.0;
    // Every output's header first: a missing or ill-shaped file fails before any checking.
    let whole = Shard {
        experts: 0..0,
        rows: 0..0,
    };
    if let Err(e) = read_part(tmp.path(), case, &whole, ask) {
        return Ok(failed(generated, unread(e)));
    }
    for (i, s) in plan.iter().enumerate() {
        progress.phase(
            &format!("checking {name}'s outputs against the f64 reference"),
            &s.to_string(),
            i + 1,
            plan.len(),
            start.elapsed(),
        );
        let sub = made(source.as_ref(), s, ask, imp)?;
        let at = Instant::now();
        let expected =
            Gemm::expected(&sub, ask, check).with_context(|| format!("generated case, {s}"))?;
        reference_seconds += at.elapsed().as_secs_f64();
        let part = match read_part(tmp.path(), case, s, ask) {
            Ok(part) => part,
            Err(e) => return Ok(failed(generated, unread(e))),
        };
        let report = Gemm::compare(&sub, ask, &precision, &expected, &part)
            .map_err(|e| anyhow::anyhow!("generated case, {s}: {e}"))?;
        reports.push((s.clone(), report));
    }
    times.check = start.elapsed().as_secs_f64();
    drop(tmp);
    progress.done();
    times.report(&name, plan.len(), estimate);
    let verdict = Verdict::of(Gemm::merge(case, &reports));
    Ok(finish(
        generated,
        imp,
        precision,
        verdict,
        reference_seconds,
        check,
    ))
}

/// Seconds of each phase, reported on stderr so that moecheck's own time is seen apart from
/// the program's.
#[derive(Debug, Default)]
struct Times {
    write: f64,
    program: f64,
    check: f64,
}

impl Times {
    fn report(&self, name: &str, shards: usize, estimate: u64) {
        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
        let peak = memory::peak_resident()
            .map(|b| {
                format!(
                    "; moecheck's peak resident memory {:.0} MiB (estimated {:.0} MiB)",
                    mib(b),
                    mib(estimate)
                )
            })
            .unwrap_or_default();
        eprintln!(
            "moecheck: case written in {:.1} s, {name} ran {:.1} s, its outputs checked in {:.1} s ({shards} shards of experts){peak}",
            self.write, self.program, self.check
        );
    }
}

/// Writes the case whose header is `case` into a new case directory, a shard of `plan` at a
/// time: `Ok(Err(_))` when the directory or a file cannot be written or the program cannot
/// say how it wants its inputs (a failed run); `Err` for an invalid or unsupported shard.
fn write(
    source: &dyn ShardSource<Gemm>,
    case: &GroupedGemmCase,
    ask: Passes,
    plan: &[Shard],
    imp: &dyn OnDisk<Gemm>,
    progress: &Progress,
) -> anyhow::Result<Result<Scratch, RunError>> {
    let compact = match imp.compact() {
        Ok(c) => c,
        Err(e) => return Ok(Err(e)),
    };
    let tmp = match Scratch::new("moecheck-case-") {
        Ok(t) => t,
        Err(e) => return Ok(Err(no_case_dir(e))),
    };
    let dir = tmp.path().to_path_buf();
    let failed = |path: &std::path::Path, r: String| {
        RunError::new(protocol::file_error(path, r).to_string())
    };
    // The header's arrays are never read: only their shapes and how they are stored.
    let inputs = Gemm::inputs(case, ask, compact);
    if let Err(e) = protocol::write_case_json::<Gemm>(&dir, case, ask, None, &inputs) {
        return Ok(Err(RunError::new(e.to_string())));
    }
    let mut files = Vec::new();
    for (name, input) in inputs {
        let path = dir.join(&name);
        let written = match file_range(&name, &plan[0]) {
            Some(_) => Appender::create(&path, &input, npy::input_shape(&input))
                .map(|a| files.push((name, a))),
            None => npy::write_input(&path, input),
        };
        if let Err(r) = written {
            return Ok(Err(failed(&path, r)));
        }
    }
    let start = Instant::now();
    for (i, s) in plan.iter().enumerate() {
        progress.phase(
            &format!("writing the case to {}", dir.display()),
            &s.to_string(),
            i + 1,
            plan.len(),
            start.elapsed(),
        );
        let sub = made(source, s, ask, imp)?;
        let mut parts = Gemm::inputs(&sub, ask, compact);
        for (name, file) in &mut files {
            let Some(at) = parts.iter().position(|(n, _)| n == name) else {
                continue;
            };
            let (_, input) = parts.swap_remove(at);
            if let Err(r) = file.append(input) {
                return Ok(Err(failed(&dir.join(name.as_str()), r)));
            }
        }
    }
    for (name, file) in files {
        if let Err(r) = file.finish() {
            return Ok(Err(failed(&dir.join(name), r)));
        }
    }
    Ok(Ok(tmp))
}

/// Shard `s`'s part of the asked outputs in `dir`, each checked against the whole case's
/// shape (`case`) and read without the rest of its file.
fn read_part(
    dir: &std::path::Path,
    case: &GroupedGemmCase,
    s: &Shard,
    passes: Passes,
) -> Result<GemmOutputs, protocol::ProtocolError> {
    let (m, k, n, g) = (case.m(), case.k(), case.n(), case.groups());
    let mut got = GemmOutputs::default();
    if passes.fwd {
        got.out = Some(read_range(dir, "out.npy", &[m, n], s)?);
    }
    if passes.dgrad {
        got.dlhs = Some(read_range(dir, "dlhs.npy", &[m, k], s)?);
    }
    if passes.wgrad {
        got.drhs = Some(read_range(dir, "drhs.npy", &[g, k, n], s)?);
    }
    Ok(got)
}

/// Shard `s`'s part of the output `name` of the whole case's `shape`.
fn read_range<D: ndarray::Dimension>(
    dir: &std::path::Path,
    name: &str,
    shape: &[usize],
    s: &Shard,
) -> Result<OutArray<D>, protocol::ProtocolError> {
    let range = file_range(name, s).expect("an output a shard cuts");
    let stored = protocol::read_output_range(dir, name, shape, range)?;
    OutArray::from_stored(name, stored).map_err(|e| protocol::file_error(&dir.join(name), e.reason))
}
