//! One metric of one log as the criterion reads it ([`Series`]: a value and a quantum per
//! step, duplicates and restarts counted), the logging precision of a comparison
//! ([`pair_precision`]) and the input summary of the report.

use std::collections::BTreeMap;

use crate::report::InputSummary;
use crate::stats::upper_median;
use crate::{Curve, CurveError, Metric};

/// One metric of one log, one value per step.
#[derive(Debug, Clone)]
pub struct Series {
    pub values: BTreeMap<u64, f64>,
    /// The quantum of each value kept in `values`.
    pub quanta: BTreeMap<u64, f64>,
    /// Steps logged more than once (the last value is kept).
    pub duplicate_steps: Vec<u64>,
    /// Times the step number went backwards (a restart from a checkpoint).
    pub restarts: usize,
    /// [`Curve::precision`]: the median quantum over the whole log.
    pub precision: f64,
}

impl Series {
    pub fn of(curve: &Curve, metric: Metric) -> Result<Series, CurveError> {
        let samples = curve
            .metrics
            .get(&metric)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| CurveError::NoMetric {
                path: curve.path.clone(),
                metric: metric.name(),
                format: curve.format,
                found: curve.metrics_found().join(", "),
            })?;
        let mut values = BTreeMap::new();
        let mut quanta = BTreeMap::new();
        let mut duplicate_steps = Vec::new();
        let mut restarts = 0;
        let mut last: Option<u64> = None;
        for s in samples {
            if last.is_some_and(|l| s.step < l) {
                restarts += 1;
            }
            if values.insert(s.step, s.value).is_some() {
                duplicate_steps.push(s.step);
            }
            quanta.insert(s.step, s.quantum);
            last = Some(s.step);
        }
        duplicate_steps.sort_unstable();
        duplicate_steps.dedup();
        Ok(Series {
            values,
            quanta,
            duplicate_steps,
            restarts,
            precision: curve.precision(metric),
        })
    }
}

impl Series {
    /// The upper median of this log's quanta at `steps` (its precision over the whole log
    /// when `steps` is empty).
    pub fn precision_at(&self, steps: &[u64]) -> f64 {
        let q: Vec<f64> = steps
            .iter()
            .filter_map(|s| self.quanta.get(s))
            .copied()
            .collect();
        if q.is_empty() {
            self.precision
        } else {
            upper_median(&q)
        }
    }
}

/// The logging precision of the comparison: the upper median, over the compared steps, of the
/// coarser quantum of each pair (0 when nothing is compared).
pub fn pair_precision(eval: &[(u64, f64, f64)], bs: &Series, ts: &Series) -> f64 {
    let q: Vec<f64> = eval
        .iter()
        .map(|p| {
            let at = |s: &Series| s.quanta.get(&p.0).copied().unwrap_or(0.0);
            at(bs).max(at(ts))
        })
        .collect();
    if q.is_empty() {
        0.0
    } else {
        upper_median(&q)
    }
}

impl InputSummary {
    /// `compared`: the steps the criterion compares, whose quanta give `logging_precision`.
    pub fn new(curve: &Curve, s: &Series, compared: &[u64]) -> InputSummary {
        InputSummary {
            path: curve.path.display().to_string(),
            format: curve.format.name().to_string(),
            metrics_found: curve.metrics_found(),
            steps: s.values.len(),
            logging_precision: s.precision_at(compared),
            duplicate_steps: s.duplicate_steps.clone(),
            restarts: s.restarts,
        }
    }
}
