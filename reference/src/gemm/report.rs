//! The report of a grouped-GEMM check: the readable table and the `--json` document.
//!
//! JSON schema ([`GemmDocument`]): `verdict` (`"pass"`/`"fail"`/`"inconclusive"`: every
//! element passed but a pass's bound admits an all-zero output), `implementation`, `is_model`
//! (true for the CPU emulation, which is never a GPU result), `dtype`, `out_dtype`, `shape`
//! (`m`, `k`, `n`, `groups`, `rows_used`, `empty_groups`), `precision` (declared
//! input/accumulator/output), `tail` (`"zero"`/`"ignored"`), `run_error` (one line when the
//! implementation produced nothing), `failure`, `verification` (`mode`: `"full"` or `"fast"`,
//! and its `guarantee` in one line), `fast` (fast mode only: per pass `vectors`, `rows`
//! projected, `failed_rows`, `max_ratio`, the `worst` row; `chunk` columns per chunk, `chunks`
//! projected, `failed_chunks`, `chunk_max_ratio`, the `chunk_worst` chunk (`group`, `row`,
//! first `col`, `width`, `deviation`, `threshold`); `non_finite` elements), and `passes`: per pass the bound depth,
//! `bound_vacuous`, `zero_ratio` (`max |want| / bound`: at most 1 means zeros would pass) and
//! per-group statistics (`elements`, `checked`, `failed`, `max_abs_err`, `max_bound_ratio`,
//! `max_ulp` in the output format, `calc_diff`, `nan`, `inf`, `exact_non_finite` (NaN/inf in
//! the reference matched exactly), `overflowed` (±inf where rounding to the output format
//! overflows within the bound, `crate::stats::StatsAcc::push`), `worst` element). Non-finite
//! numbers are written as `null`.

use std::fmt::Write as _;

use serde::Serialize;

use super::bound::Precision;
use super::case::{GroupedGemmCase, TailContract};
use super::compare::PassReport;
use super::fast::mode::Verification;
use super::fast::FastPass;
use super::op::Gemm;
use crate::op::Op;
use crate::report::{
    bound_text, sci, verdict_line, Reported, RunHead, RunInfo, RunOutcome, StatsRow, StatsTable,
};

/// The case's shape.
#[derive(Debug, Clone, Serialize)]
pub struct Shape {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub groups: usize,
    pub rows_used: usize,
    pub empty_groups: usize,
}

impl Shape {
    pub fn of(case: &GroupedGemmCase) -> Shape {
        Shape {
            m: case.m(),
            k: case.k(),
            n: case.n(),
            groups: case.groups(),
            rows_used: case.rows_used(),
            empty_groups: case.group_sizes.iter().filter(|s| **s == 0).count(),
        }
    }
}

/// The `--json` document of `moecheck gemm` and `moecheck check`.
#[derive(Debug, Clone, Serialize)]
pub struct GemmDocument {
    #[serde(flatten)]
    pub head: RunHead,
    pub dtype: String,
    pub out_dtype: String,
    pub shape: Shape,
    pub precision: Precision,
    pub tail: TailContract,
    /// The mode that ran (`full`, `fast`) and its guarantee in one line.
    pub verification: Verification,
    #[serde(flatten)]
    pub outcome: RunOutcome,
    /// Full mode: every element. Fast mode: the sampled rows and columns, tail rows and
    /// zero-length reductions (`checked` says how many).
    pub passes: Vec<PassReport>,
    /// Fast mode only: per pass the random projections of every row and the NaN/inf scan.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fast: Vec<FastPass>,
    /// One line per likely cause of a failure that a declaration would change (tail rows
    /// only; outputs of a narrower dtype than declared).
    pub hints: Vec<String>,
}

impl GemmDocument {
    /// The document of `run` (of [`Gemm`], or of another operation whose run is a grouped
    /// GEMM's), with the compared passes, the projections of a fast check (none for a full
    /// one) and its mode.
    pub fn of<O: Op<Case = GroupedGemmCase, Precision = Precision>>(
        run: &RunInfo<O>,
        passes: Vec<PassReport>,
        fast: Vec<FastPass>,
        verification: Verification,
    ) -> GemmDocument {
        GemmDocument {
            head: RunHead::of(run),
            dtype: run.case.dtype.to_string(),
            out_dtype: run.case.out_dtype.to_string(),
            shape: Shape::of(run.case),
            precision: *run.precision,
            tail: run.case.tail,
            verification,
            outcome: RunOutcome::of(run),
            hints: hints(&passes, run.precision.output),
            passes,
            fast,
        }
    }
}

impl Reported for Gemm {
    type Document = GemmDocument;

    fn document(run: &RunInfo<Gemm>) -> GemmDocument {
        let report = run.report();
        GemmDocument::of(
            run,
            report.map_or_else(Vec::new, |r| r.passes.clone()),
            report.map_or_else(Vec::new, |r| r.fast.clone()),
            Verification::of(run.expected.mode()),
        )
    }

    fn render(doc: &GemmDocument) -> String {
        let mut s = String::new();
        doc.head.render(&mut s);
        render_case(&mut s, doc);
        let v = &doc.verification;
        let _ = writeln!(s, "verification: {}: {}", v.mode, v.guarantee);
        doc.outcome.render(&mut s);
        render_kinds(&mut s, &doc.passes);
        render_passes(&mut s, &doc.passes);
        render_fast(&mut s, &doc.fast);
        render_hints(&mut s, &doc.hints);
        doc.outcome.render_inconclusive(&mut s, doc.head.verdict);
        verdict_line(&mut s, doc.head.verdict);
        s
    }
}

/// What a declaration would change about a failure: only tail rows failed (`--tail
/// ignored`), or a pass's outputs are all exactly values of a narrower format than declared.
pub fn hints(passes: &[PassReport], declared_out: crate::format::Format) -> Vec<String> {
    let failed: Vec<&PassReport> = passes.iter().filter(|p| !p.passed()).collect();
    let mut hints = Vec::new();
    let only_tail = !failed.is_empty()
        && failed.iter().all(|p| {
            p.error.is_none()
                && p.groups
                    .iter()
                    .all(|g| g.passed() || g.group == super::compare::GroupId::Tail)
        });
    if only_tail {
        hints.push("only tail rows failed (rows past sum(group_sizes), which the default contract requires to be exactly 0): if the kernel leaves them unwritten, declare --tail ignored, and then nothing downstream may read those rows".into());
    }
    for p in failed {
        if let Some(f) = p.looks_like {
            hints.push(format!(
                "every non-zero {} output is exactly a {f} value, but {declared_out} was declared: if the kernel rounds to {f}, declare it with --out-dtype {f} on moecheck check or prop (on moecheck gemm, --out-dtype {f} asks the kernel for {f})",
                p.pass
            ));
        }
    }
    hints
}

fn render_hints(s: &mut String, hints: &[String]) {
    for h in hints {
        let _ = writeln!(s, "hint: {h}");
    }
}

/// One line before the table on what kinds of failure there are, per failed pass.
pub fn render_kinds(s: &mut String, passes: &[PassReport]) {
    let kinds: Vec<String> = passes
        .iter()
        .filter(|p| !p.passed())
        .map(|p| {
            if let Some(e) = &p.error {
                return format!("{}: {e}", p.pass);
            }
            let failed = |tail: bool| {
                p.groups.iter().filter(move |g| {
                    !g.passed() && (g.group == super::compare::GroupId::Tail) == tail
                })
            };
            let mut k = Vec::new();
            let experts = failed(false).count();
            if experts > 0 {
                k.push(format!("{experts} expert group(s) outside the bound"));
            }
            let tail: usize = failed(true).map(|g| g.stats.failed).sum();
            if tail > 0 {
                k.push(format!("{tail} tail element(s) not 0"));
            }
            let nan: usize = p.groups.iter().map(|g| g.stats.nan).sum();
            if nan > 0 {
                k.push(format!("{nan} NaN"));
            }
            format!("{}: {}", p.pass, k.join(", "))
        })
        .collect();
    if !kinds.is_empty() {
        let _ = writeln!(s, "failures: {}", kinds.join("; "));
    }
}

/// The case line and the declared precision.
pub fn render_case(s: &mut String, doc: &GemmDocument) {
    let sh = &doc.shape;
    let _ = writeln!(
        s,
        "case: M={} K={} N={} experts={} (empty {}), rows used {} (tail {}), dtype {} -> out {}",
        sh.m,
        sh.k,
        sh.n,
        sh.groups,
        sh.empty_groups,
        sh.rows_used,
        sh.m - sh.rows_used,
        doc.dtype,
        doc.out_dtype
    );
    let acc = &doc.precision.accumulator;
    let _ = writeln!(
        s,
        "declared accumulator: {}{}{}; tail contract: {}",
        acc.format,
        acc.block
            .map(|b| format!(" in K blocks of {b}"))
            .unwrap_or_default(),
        if doc.precision.output.to_string() != doc.out_dtype {
            format!(
                "; declared output: {} (the implementation rounds to it, not to the case's {})",
                doc.precision.output, doc.out_dtype
            )
        } else {
            String::new()
        },
        match doc.tail {
            TailContract::Zero => "tail rows must be exactly 0",
            TailContract::Ignored => "tail rows of out/dlhs NOT CHECKED (--tail ignored)",
        }
    );
}

/// One row per pass, then its failing groups.
pub fn render_passes(s: &mut String, passes: &[PassReport]) {
    let table = StatsTable {
        label: "pass",
        width: 6,
        worst_label: "(group, row, col)",
        indent: 7,
        slice_noun: "groups",
    };
    if !passes.is_empty() {
        table.header(s);
    }
    for p in passes {
        let worst = p
            .worst_group()
            .and_then(|g| g.stats.worst.as_ref())
            .map(|w| format!("({}, {}, {})", w.at.group, w.at.row, w.at.col))
            .unwrap_or_else(|| "-".into());
        let failing = p
            .groups
            .iter()
            .filter(|g| !g.passed())
            .map(|g| {
                let w = g.stats.worst.as_ref().expect("a failed group has a worst element");
                let (got, want) = crate::report::sci_pair(w.got, w.want);
                format!(
                    "{}: {} of {} elements outside the bound; worst row {} col {}: got {got}, want {want}, bound {}",
                    g.group, g.stats.failed, g.stats.checked, w.at.row, w.at.col, bound_text(w.bound)
                )
            })
            .collect();
        let mut notes: Vec<String> = if p.bound_vacuous {
            vec!["WARNING: the declared accumulator cannot resolve sums this long; the bound is infinite".into()]
        } else {
            Vec::new()
        };
        let overflowed: usize = p.groups.iter().map(|g| g.stats.overflowed).sum();
        if overflowed > 0 {
            notes.push(format!(
                "NOTE: {overflowed} element(s) are ±inf where rounding to the output format overflows within the bound: correct, and left out of the statistics above"
            ));
        }
        table.row(
            s,
            &StatsRow {
                name: p.pass.name(),
                passed: p.passed(),
                slices: p.groups.iter().map(|g| &g.stats).collect(),
                worst,
                error: p.error.as_deref(),
                failing,
                notes,
            },
        );
    }
}

/// The projection lines of a fast report (nothing for a full one).
pub fn render_fast(s: &mut String, fast: &[FastPass]) {
    for f in fast {
        let worst = f
            .worst
            .as_ref()
            .map(|w| {
                format!(
                    "; worst expert {} row {}: deviation {} of threshold {}",
                    w.group,
                    w.row,
                    sci(w.deviation),
                    sci(w.threshold)
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "projections {}: {} rows x {} vectors, {} outside their threshold, {} NaN/inf element(s){worst}",
            f.pass, f.rows, f.vectors, f.failed_rows, f.non_finite
        );
        let worst = f
            .chunk_worst
            .as_ref()
            .map(|w| {
                format!(
                    "; worst expert {} row {} cols {}..{}: deviation {} of threshold {}",
                    w.group,
                    w.row,
                    w.col,
                    w.col + w.width,
                    sci(w.deviation),
                    sci(w.threshold)
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "chunks {}: {} chunks of {} columns x 1 vector, {} outside their threshold{worst}",
            f.pass, f.chunks, f.chunk, f.failed_chunks
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{round_to, Format, Overflow};
    use crate::gemm::{compare_outputs, reference, Accumulator, Passes};
    use ndarray::{Array2, Array3};

    /// Two experts of 16 rows each and 8 tail rows; inputs exact in bf16, outputs not.
    fn case() -> GroupedGemmCase {
        let v = |i: usize| ((i * 7919) % 23) as f32 / 8.0 - 1.0 + ((i % 5) as f32) / 128.0;
        GroupedGemmCase {
            lhs: Array2::from_shape_fn((40, 8), |(r, c)| v(r * 8 + c)),
            rhs: Array3::from_shape_fn((2, 8, 4), |(g, k, n)| v(g * 32 + k * 4 + n + 5)).into(),
            group_sizes: vec![16, 16],
            dout: None,
            dtype: Format::Bf16,
            out_dtype: Format::F32,
            tail: TailContract::Zero,
        }
    }

    fn f32_precision() -> Precision {
        Precision {
            input: Format::Bf16,
            accumulator: Accumulator::any_order(Format::F32),
            output: Format::F32,
        }
    }

    fn check(got: Array2<f64>) -> Vec<String> {
        let c = case();
        let fwd = Passes {
            fwd: true,
            dgrad: false,
            wgrad: false,
        };
        let r = reference(&c, fwd).unwrap();
        let got = crate::gemm::GemmOutputs {
            out: Some(got.into()),
            ..Default::default()
        };
        let report = compare_outputs(&c, fwd, &f32_precision(), &r, &got);
        hints(&report.passes, Format::F32)
    }

    fn want() -> Array2<f64> {
        let c = case();
        let fwd = Passes {
            fwd: true,
            dgrad: false,
            wgrad: false,
        };
        reference(&c, fwd).unwrap().value.out.unwrap()
    }

    #[test]
    fn a_pass_says_nothing() {
        assert!(check(want()).is_empty());
    }

    #[test]
    fn tail_only_failures_name_tail_ignored() {
        let mut got = want();
        got.row_mut(35).fill(f64::NAN);
        let h = check(got);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h[0].starts_with("only tail rows failed") && h[0].contains("--tail ignored"));
        // A failure in an expert's rows too: no tail hint.
        let mut got = want();
        got.row_mut(35).fill(1.0);
        got[(3, 1)] += 1.0;
        assert!(check(got).is_empty());
    }

    #[test]
    fn outputs_rounded_to_bf16_name_out_dtype() {
        let got = want().mapv(|v| round_to(v, Format::Bf16, Overflow::Ieee));
        let h = check(got);
        assert!(
            h.iter()
                .any(|l| l.contains("exactly a bf16 value") && l.contains("--out-dtype bf16")),
            "{h:?}"
        );
    }
}
