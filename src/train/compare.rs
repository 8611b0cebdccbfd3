//! `moecheck train --compare`: the implementation's loss curve against the reference path's,
//! judged by `moecheck curves diff`'s criterion (docs/curves.md).
//!
//! Three runs on the same data (the same data seed, so every step sees the same batch):
//!
//! * `base`: the reference expert GEMMs, init seed `S`;
//! * `base2`: the reference again with init seed `S + 1` — its gap to `base` is the seed noise
//!   `σ_seed` that enters the margin `δ` (`k·σ_seed`, `--baseline2` of `curves diff`);
//! * `test`: the implementation under test, init seed `S`.
//!
//! Each run writes its log into the output directory (`base.log`, `base2.log`, `test.log`),
//! and the verdict comes from reading those files exactly as `moecheck curves diff base.log
//! test.log --baseline2 base2.log` would, so the pair of commands reproduces it.

use std::path::{Path, PathBuf};

use serde::Serialize;

use moecheck_curves::diff::{diff, Criterion, CurvesReport};
use moecheck_curves::Metric;

use super::experts::ExpertGemm;
use super::log::LogWriter;
use super::{train, StepLog, TrainConfig, TrainError, TrainRun};

/// One run of a comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Arm {
    /// `base`, `base2` or `test`.
    pub role: &'static str,
    pub init_seed: u64,
    pub log: PathBuf,
    #[serde(flatten)]
    pub run: TrainRun,
}

/// The runs and the curves verdict.
#[derive(Debug, Clone, Serialize)]
pub struct TrainComparison {
    pub arms: Vec<Arm>,
    pub curves: CurvesReport,
}

/// A comparison that could not finish.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("{role} run: {source}")]
    Train {
        role: &'static str,
        #[source]
        source: TrainError,
    },
    #[error(transparent)]
    Io(#[from] anyhow::Error),
}

/// Runs `base`, `base2` (when `baseline2`) and `test` with their logs in `dir`, then the
/// curves criterion. `on_step(role, step)` sees every step.
pub fn compare(
    config: &TrainConfig,
    base: &dyn ExpertGemm,
    test: &dyn ExpertGemm,
    baseline2: bool,
    dir: &Path,
    mut on_step: impl FnMut(&'static str, &StepLog),
) -> Result<TrainComparison, CompareError> {
    let mut plan = vec![("base", base, config.init_seed)];
    if baseline2 {
        plan.push(("base2", base, config.init_seed.wrapping_add(1)));
    }
    plan.push(("test", test, config.init_seed));
    let mut arms = Vec::new();
    for (role, gemm, init_seed) in plan {
        let path = dir.join(format!("{role}.log"));
        let cfg = TrainConfig {
            init_seed,
            ..config.clone()
        };
        let about = format!("{role}: impl {} init seed {init_seed}", gemm.name());
        let mut log = LogWriter::create(&path, "--out", &about)?;
        let mut write_err = None;
        let run = train(&cfg, gemm, |s| {
            if write_err.is_none() {
                write_err = log.write(s).err();
            }
            on_step(role, s);
        })
        .map_err(|source| CompareError::Train { role, source })?;
        if let Some(e) = write_err {
            return Err(e.into());
        }
        arms.push(Arm {
            role,
            init_seed,
            log: path,
            run,
        });
    }
    // The arms ran in plan order: base, [base2,] test.
    let curve = |a: &Arm| moecheck_curves::read(&a.log, None).map_err(anyhow::Error::from);
    let b = curve(&arms[0])?;
    let t = curve(arms.last().expect("base and test always run"))?;
    let b2 = if baseline2 {
        vec![curve(&arms[1])?]
    } else {
        Vec::new()
    };
    let mut report = diff(&b, &t, &b2, Metric::Loss, &Criterion::default())
        .map_err(anyhow::Error::from)?
        .report;
    say_diverged(&arms, config.lr, &mut report);
    Ok(TrainComparison {
        arms,
        curves: report,
    })
}

/// When every arm diverged (a learning rate too high for the model, say), the curves hold
/// nothing to compare: the report says so first, naming each arm's step and cause.
fn say_diverged(arms: &[Arm], lr: f64, report: &mut CurvesReport) {
    let diverged: Vec<String> = arms
        .iter()
        .filter_map(|a| {
            a.run.diverged_at.map(|s| match &a.run.diverged_because {
                Some(why) => format!("{} at step {s} ({why})", a.role),
                None => format!("{} at step {s}", a.role),
            })
        })
        .collect();
    if diverged.len() == arms.len() {
        report.reasons.insert(
            0,
            format!(
                "the runs diverged: every arm's loss became NaN/Inf — {}; curves that end in NaN cannot be compared",
                diverged.join("; ")
            ),
        );
        report.suggestion = Some(format!(
            "the reference arm diverges too, so the configuration does, not the implementation: lower --lr (now {lr})"
        ));
    }
}
