//! `moecheck curves`: read training logs (`read`) and decide whether two loss curves agree
//! (`diff`). The criterion and its defaults are documented in docs/curves.md.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use moecheck::curves::diff::{diff, Criterion, Verdict};
use moecheck::curves::{self, Curve, CurveError, LinePattern, LogFormat, Metric};

/// Exit status of an inconclusive comparison.
pub const EXIT_INCONCLUSIVE: u8 = 3;

#[derive(Debug, Args)]
pub struct CurvesArgs {
    #[command(subcommand)]
    pub command: CurvesCommand,
}

#[derive(Debug, Subcommand)]
pub enum CurvesCommand {
    /// Compare TEST's curve with BASE's: PASS (exit 0), FAIL (1), INCONCLUSIVE (3); bad input 2.
    Diff(DiffArgs),
    /// Read one log and print what was found: format, metrics, steps, logging precision.
    Read(ReadArgs),
}

#[derive(Debug, Args)]
#[command(
    after_help = "Criterion (docs/curves.md): skip the warm-up; average the paired gap TEST − BASE \
over non-overlapping windows; δ = max(rel·|mean BASE|, k·σ_seed, 2·logging precision), and δ_fail the \
same with σ_seed at its upper confidence limit (chi-square, from BASE and every --baseline2). FAIL when \
the interval of the mean windowed gap, the tail gap's or any window's (Bonferroni over windows) lies \
outside ±δ_fail — naming the diverging steps, even if the curves meet again — or TEST is NaN/Inf where \
BASE is finite. PASS when the mean and tail intervals lie inside ±δ, the gap does not drift and BASE is \
finite throughout. Otherwise INCONCLUSIVE with a suggestion (more steps, or n more seeds).\n\nExit status: 0 pass, 1 fail, 3 inconclusive, 2 bad input or flags."
)]
pub struct DiffArgs {
    /// The baseline log.
    pub base: PathBuf,
    /// The log of the run under test.
    pub test: PathBuf,
    /// BASE rerun with another seed; repeat it for several seeds. σ_seed, the spread of the
    /// windowed gap between runs of the same code, comes from BASE and all of them, with a
    /// chi-square interval for how few seeds estimate it.
    #[arg(long, value_name = "FILE", action = clap::ArgAction::Append)]
    pub baseline2: Vec<PathBuf>,
    /// Metric to compare: loss (the training loss), val_loss, step_time_s, tokens_per_s,
    /// tflops. With --pattern: the name of the values the pattern reads.
    #[arg(long, default_value = "loss", value_parser = parse_metric)]
    pub metric: Metric,
    /// Read every log as this format instead of detecting it.
    #[arg(long, value_parser = parse_format)]
    pub format: Option<LogFormat>,
    /// Read every log line by line with this regular expression instead of a format: named
    /// groups `step` and `value` (e.g. 'it (?P<step>\d+) .*loss=(?P<value>\S+)'); lines that do
    /// not match are skipped; the values are the --metric.
    #[arg(long, value_name = "REGEX", conflicts_with = "format")]
    pub pattern: Option<String>,
    /// Machine-readable report with a top-level "verdict".
    #[arg(long)]
    pub json: bool,
    /// Write a plot of both curves, the gap and the ±δ band (.svg or .png).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Bitwise comparison of every common step instead of the statistical criterion.
    #[arg(long)]
    pub exact: bool,
    /// Fraction of the common steps skipped at the start.
    #[arg(long, default_value_t = 0.1, value_parser = parse_fraction)]
    pub warmup: f64,
    /// Steps per window [default: max(1, compared steps / 10)].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub window: Option<u64>,
    /// Relative part of δ: rel · |mean BASE value|.
    #[arg(long, default_value_t = 0.001, value_parser = parse_nonneg)]
    pub rel: f64,
    /// Seed part of δ: k · σ_seed (with --baseline2).
    #[arg(long, default_value_t = 3.0, value_parser = parse_nonneg)]
    pub k: f64,
    /// Joint confidence of the statements that can raise a FAIL (mean-gap, tail-gap and
    /// per-window intervals, and σ_seed's upper limit with baselines: each at 1 − (1 − c)/s);
    /// also the level of the slope test and of the speed-up interval.
    #[arg(long, default_value_t = 0.95, value_parser = parse_confidence)]
    pub confidence: f64,
    /// Fraction of the windows that form the tail (at least one window).
    #[arg(long, default_value_t = 0.2, value_parser = parse_fraction)]
    pub tail: f64,
    /// A significant slope counts as drift when it moves the gap by more than this · δ.
    #[arg(long, default_value_t = 0.5, value_parser = parse_nonneg)]
    pub drift: f64,
}

#[derive(Debug, Args)]
pub struct ReadArgs {
    /// The log to read.
    pub log: PathBuf,
    /// Read as this format instead of detecting it.
    #[arg(long, value_parser = parse_format)]
    pub format: Option<LogFormat>,
    /// Read the log line by line with this regular expression instead of a format: named
    /// groups `step` and `value`; lines that do not match are skipped.
    #[arg(long, value_name = "REGEX", conflicts_with = "format")]
    pub pattern: Option<String>,
    /// With --pattern: the name of the values it reads [default: loss].
    #[arg(long, value_parser = parse_metric, requires = "pattern")]
    pub metric: Option<Metric>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

fn parse_metric(s: &str) -> Result<Metric, String> {
    Metric::parse(s).ok_or_else(|| {
        format!(
            "unknown metric `{s}`; one of: {}",
            Metric::ALL.map(|m| m.name()).join(", ")
        )
    })
}

fn parse_format(s: &str) -> Result<LogFormat, String> {
    LogFormat::parse(s).ok_or_else(|| {
        format!(
            "unknown format `{s}`; one of: {}",
            LogFormat::ALL.map(|f| f.name()).join(", ")
        )
    })
}

fn parse_f64(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| format!("`{s}` is not a finite number"))
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    parse_f64(s).and_then(|v| {
        if (0.0..1.0).contains(&v) {
            Ok(v)
        } else {
            Err(format!("{v} is not a fraction in [0, 1)"))
        }
    })
}

fn parse_nonneg(s: &str) -> Result<f64, String> {
    parse_f64(s).and_then(|v| {
        if v >= 0.0 {
            Ok(v)
        } else {
            Err(format!("{v} is negative"))
        }
    })
}

fn parse_confidence(s: &str) -> Result<f64, String> {
    parse_f64(s).and_then(|v| {
        if v > 0.0 && v < 1.0 {
            Ok(v)
        } else {
            Err(format!("{v} is not in (0, 1)"))
        }
    })
}

/// How one command reads every log it is given: by a named or detected format, or with a line
/// pattern whose values are `metric`.
struct Reader {
    format: Option<LogFormat>,
    pattern: Option<LinePattern>,
    metric: Metric,
}

impl Reader {
    /// Compiles `pattern` first: a bad one is refused before any file is read.
    fn new(
        format: Option<LogFormat>,
        pattern: Option<&str>,
        metric: Metric,
    ) -> Result<Reader, CurveError> {
        Ok(Reader {
            format,
            pattern: pattern.map(LinePattern::new).transpose()?,
            metric,
        })
    }

    fn read(&self, path: &std::path::Path) -> Result<Curve, CurveError> {
        match &self.pattern {
            Some(p) => curves::read_pattern(path, p, self.metric),
            None => curves::read(path, self.format),
        }
    }
}

pub fn run(a: CurvesArgs) -> anyhow::Result<ExitCode> {
    match a.command {
        CurvesCommand::Diff(d) => run_diff(d),
        CurvesCommand::Read(r) => run_read(r),
    }
}

fn run_diff(a: DiffArgs) -> anyhow::Result<ExitCode> {
    if let Some(p) = &a.plot {
        // Refuse a bad extension, or a file that cannot be written, before reading anything.
        curves::plot::Kind::of(p)?;
        moecheck::user_file::check(p, "--plot")?;
    }
    let reader = Reader::new(a.format, a.pattern.as_deref(), a.metric)?;
    let base = reader.read(&a.base)?;
    let test = reader.read(&a.test)?;
    let base2 = a
        .baseline2
        .iter()
        .map(|p| reader.read(p))
        .collect::<Result<Vec<_>, _>>()?;
    for c in [&base, &test].into_iter().chain(&base2) {
        warn(c);
    }
    let criterion = Criterion {
        warmup_frac: a.warmup,
        window_steps: a.window.map(|w| w as usize),
        rel: a.rel,
        k_seed: a.k,
        confidence: a.confidence,
        tail_frac: a.tail,
        drift_frac: a.drift,
        exact: a.exact,
    };
    let d = diff(&base, &test, &base2, a.metric, &criterion)?;
    let mut plotted = Ok(());
    if let Some(p) = &a.plot {
        let bytes = curves::plot::render(&d, curves::plot::Kind::of(p)?);
        plotted = moecheck::user_file::write(p, "--plot", &bytes);
    }
    // The report is printed even when the plot could not be written; the exit status then
    // says that it was not (2).
    if a.json {
        moecheck::outln!("{}", serde_json::to_string_pretty(&d.report)?);
    } else {
        moecheck::out!("{}", curves::render::text(&d.report));
        if let (Some(p), Ok(())) = (&a.plot, &plotted) {
            moecheck::outln!("plot: {}", p.display());
        }
    }
    plotted?;
    Ok(match d.report.verdict {
        Verdict::Pass => ExitCode::SUCCESS,
        Verdict::Fail => ExitCode::from(super::EXIT_FAIL),
        Verdict::Inconclusive => ExitCode::from(EXIT_INCONCLUSIVE),
    })
}

/// Prints each of `curve`'s read warnings on stderr, naming its file.
fn warn(curve: &curves::Curve) {
    for w in &curve.warnings {
        eprintln!("warning: {}: {w}", curve.path.display());
    }
}

fn run_read(a: ReadArgs) -> anyhow::Result<ExitCode> {
    let reader = Reader::new(
        a.format,
        a.pattern.as_deref(),
        a.metric.unwrap_or(Metric::Loss),
    )?;
    let c = reader.read(&a.log)?;
    warn(&c);
    // Refused before anything is printed: stdout holds a whole report or nothing.
    if c.metrics.is_empty() {
        anyhow::bail!(
            "{}: no metric found (read as {})",
            c.path.display(),
            c.format
        );
    }
    let metrics: Vec<serde_json::Value> = c
        .metrics
        .iter()
        .map(|(m, s)| {
            let first = s.first().map(|x| x.step);
            let last = s.last().map(|x| x.step);
            serde_json::json!({
                "metric": m.name(),
                "samples": s.len(),
                "first_step": first,
                "last_step": last,
                "logging_precision": c.precision(*m),
                "first_value": s.first().map(|x| x.value),
                "last_value": s.last().map(|x| x.value),
            })
        })
        .collect();
    if a.json {
        let doc = serde_json::json!({
            "path": c.path.display().to_string(),
            "format": c.format.name(),
            "metrics": metrics,
        });
        moecheck::outln!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        moecheck::outln!("{}: {}", c.path.display(), c.format);
        for m in &metrics {
            moecheck::outln!(
                "  {:<13} {:>6} samples, steps {}..={}, logging precision {:.1e}, first {} last {}",
                m["metric"].as_str().unwrap_or(""),
                m["samples"],
                m["first_step"],
                m["last_step"],
                m["logging_precision"].as_f64().unwrap_or(0.0),
                m["first_value"],
                m["last_value"]
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
