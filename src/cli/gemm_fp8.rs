//! `moecheck gemm --dtype fp8`: the FP8 grouped GEMM, checked recipe-exact, and compared with
//! the unquantised GEMM for information.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;

use moecheck::fp8_cases::generate_fp8;
use moecheck::generate::gemm::GemmSpec;
use moecheck::impls::emulate_fp8::{EmulateFp8, Fp8Bug};
use moecheck::impls::exec::Program;
use moecheck::impls::exec_fp8::ExecFp8;
use moecheck_reference::format::Format;
use moecheck_reference::fp8::{
    compare_fp8, fp8_precision, AccumModel, AmaxAlgo, Fp8Expected, Fp8GemmCase, Fp8GroupedGemm,
    Fp8Recipe, Fp8Reference, Fp8Verdict, HighPrecisionStats, RecipeError, RecipeProblem,
    ScalingKind, ScopeKind,
};
use moecheck_reference::gemm::Gemm;
use moecheck_reference::gemm::GemmReport;
use moecheck_reference::gemm::Passes;
use moecheck_reference::op::{Verdict, VerdictKind};
use moecheck_reference::report::{Implemented, Reported, RunInfo};

use super::gemm::GemmFlags;
use super::parse_format;

/// `--dtype`: a number format, or `fp8` (= E4M3 forward operands, the FP8 path).
pub fn parse_gemm_dtype(s: &str) -> Result<Format, String> {
    if s.eq_ignore_ascii_case("fp8") {
        return Ok(Format::E4m3);
    }
    parse_format(s).map_err(|e| format!("{e}; or fp8 for the FP8 recipe"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ScalingArg {
    Current,
    Delayed,
}

fn parse_accum(s: &str) -> Result<AccumModel, String> {
    AccumModel::parse(s).ok_or_else(|| {
        format!("unknown accumulation model '{s}' (expected exact, fast or fast-promote)")
    })
}

fn parse_scope(s: &str) -> Result<ScopeKind, String> {
    match s {
        "tensor" => Ok(ScopeKind::Tensor),
        "group" => Ok(ScopeKind::Group),
        "expert" => Ok(ScopeKind::Expert),
        _ => Err(format!(
            "unknown scope '{s}' (expected tensor, group or expert)"
        )),
    }
}

fn parse_algo(s: &str) -> Result<AmaxAlgo, String> {
    match s {
        "max" => Ok(AmaxAlgo::Max),
        "most-recent" | "most_recent" => Ok(AmaxAlgo::MostRecent),
        _ => Err(format!(
            "unknown amax algorithm '{s}' (expected max or most-recent)"
        )),
    }
}

/// FP8 flags of `moecheck gemm` (only with `--dtype fp8|e4m3|e5m2`).
#[derive(Debug, Args)]
pub struct Fp8Flags {
    /// FP8: current (amax of this tensor) or delayed (amax history) scaling [default: current].
    #[arg(long, value_enum)]
    pub scaling: Option<ScalingArg>,
    /// FP8: accumulation model the bound and emulate use: exact (f32), fast (Hopper, ~14
    /// bits), fast-promote (fast, promoted to f32 every 128) [default: exact].
    #[arg(long, value_parser = parse_accum)]
    pub accum: Option<AccumModel>,
    /// FP8: format of lhs [default: --dtype's, e4m3 for fp8].
    #[arg(long, value_parser = parse_format)]
    pub lhs_format: Option<Format>,
    /// FP8: format of rhs [default: --dtype's].
    #[arg(long, value_parser = parse_format)]
    pub rhs_format: Option<Format>,
    /// FP8: format of dout (dgrad, wgrad) [default: e5m2].
    #[arg(long, value_parser = parse_format)]
    pub dout_format: Option<Format>,
    /// FP8: scaling scope of lhs: group or tensor [default: group].
    #[arg(long, value_parser = parse_scope)]
    pub lhs_scope: Option<ScopeKind>,
    /// FP8: scaling scope of rhs: expert or tensor [default: expert].
    #[arg(long, value_parser = parse_scope)]
    pub rhs_scope: Option<ScopeKind>,
    /// FP8: scaling scope of dout: group or tensor [default: group].
    #[arg(long, value_parser = parse_scope)]
    pub dout_scope: Option<ScopeKind>,
    /// FP8: IEEE casts (ml_dtypes: E4M3 overflow -> NaN) instead of saturating ones.
    #[arg(long)]
    pub no_saturate: bool,
    /// FP8 delayed scaling: amax history length [default: 16].
    #[arg(long)]
    pub amax_history_len: Option<usize>,
    /// FP8 delayed scaling: max or most-recent [default: max].
    #[arg(long, value_parser = parse_algo)]
    pub amax_algo: Option<AmaxAlgo>,
    /// FP8 delayed scaling: margin m, scale = fp8_max / amax / 2^m [default: 0].
    #[arg(long)]
    pub margin: Option<i32>,
}

impl Fp8Flags {
    /// The first FP8 flag given, if any (an error without an FP8 `--dtype`).
    pub fn first_given(&self) -> Option<&'static str> {
        [
            (self.scaling.is_some(), "--scaling"),
            (self.accum.is_some(), "--accum"),
            (self.lhs_format.is_some(), "--lhs-format"),
            (self.rhs_format.is_some(), "--rhs-format"),
            (self.dout_format.is_some(), "--dout-format"),
            (self.lhs_scope.is_some(), "--lhs-scope"),
            (self.rhs_scope.is_some(), "--rhs-scope"),
            (self.dout_scope.is_some(), "--dout-scope"),
            (self.no_saturate, "--no-saturate"),
            (self.amax_history_len.is_some(), "--amax-history-len"),
            (self.amax_algo.is_some(), "--amax-algo"),
            (self.margin.is_some(), "--margin"),
        ]
        .into_iter()
        .find(|(given, _)| *given)
        .map(|(_, name)| name)
    }

    fn recipe(&self, dtype: Format) -> anyhow::Result<Fp8Recipe> {
        let mut r = Fp8Recipe::default();
        r.lhs.format = self.lhs_format.unwrap_or(dtype);
        r.rhs.format = self.rhs_format.unwrap_or(dtype);
        r.dout.format = self.dout_format.unwrap_or(Format::E5m2);
        r.lhs.scope = self.lhs_scope.unwrap_or(ScopeKind::Group);
        r.rhs.scope = self.rhs_scope.unwrap_or(ScopeKind::Expert);
        r.dout.scope = self.dout_scope.unwrap_or(ScopeKind::Group);
        r.saturate = !self.no_saturate;
        r.accumulation = self.accum.unwrap_or_default();
        let delayed_flag = [
            (self.amax_history_len.is_some(), "--amax-history-len"),
            (self.amax_algo.is_some(), "--amax-algo"),
            (self.margin.is_some(), "--margin"),
        ]
        .into_iter()
        .find(|(g, _)| *g);
        r.scaling = match self.scaling.unwrap_or(ScalingArg::Current) {
            ScalingArg::Current => {
                if let Some((_, flag)) = delayed_flag {
                    bail!("{flag} needs --scaling delayed");
                }
                ScalingKind::Current
            }
            ScalingArg::Delayed => {
                let history_len = self.amax_history_len.unwrap_or(16);
                if history_len == 0 {
                    bail!("--amax-history-len must be at least 1");
                }
                ScalingKind::Delayed {
                    history_len,
                    algo: self.amax_algo.unwrap_or(AmaxAlgo::Max),
                    margin: self.margin.unwrap_or(0),
                }
            }
        };
        r.validate()
            .map_err(|e| anyhow::anyhow!(recipe_flag_error(&e)))?;
        Ok(r)
    }
}

/// A recipe the library refuses, as the flag that set it (`--rhs-scope`, `--dout-format`).
fn recipe_flag_error(e: &RecipeError) -> String {
    let flag = format!("--{}-{}", e.operand.name(), e.problem.field());
    match e.problem {
        RecipeProblem::NotFp8(f) => format!("{flag} {f}: expected e4m3 or e5m2"),
        RecipeProblem::ScopeDoesNotApply(_) => format!("{flag} {}", e.why()),
    }
}

#[derive(Debug, Serialize)]
struct Fp8Extra {
    recipe: Fp8Recipe,
    /// What the verdict is: the recipe-exact comparison.
    verdict_from: &'static str,
    /// Against the unquantised f64 GEMM, for information (never a verdict).
    high_precision: Vec<HighPrecisionStats>,
}

#[derive(Debug, Serialize)]
struct Fp8Json<'a> {
    #[serde(flatten)]
    report: &'a GemmReport,
    fp8: Fp8Extra,
}

pub fn run(a: GemmFlags) -> anyhow::Result<ExitCode> {
    if matches!(a.out_dtype, Format::E4m3 | Format::E5m2) {
        bail!(
            "--out-dtype {}: FP8 GEMM outputs are f32 or bf16",
            a.out_dtype
        );
    }
    let recipe = a.fp8.recipe(a.dtype)?;
    let spec = GemmSpec {
        experts: a.experts,
        tokens: a.tokens,
        topk: a.topk,
        hidden: a.hidden,
        ffn: a.ffn,
        dtype: Format::F32,
        out_dtype: a.out_dtype,
        spread: a.spread,
        passes: a.passes,
        empty: a.empty,
        drop_frac: a.drop_frac,
        seed: a.seed,
        tail: a.tail.into(),
    };
    spec.validate().map_err(anyhow::Error::msg)?;
    if a.passes.is_empty() {
        bail!("--passes is empty");
    }
    let timeout = a.imp.timeout.unwrap_or(600.0);
    if !(timeout > 0.0 && timeout.is_finite()) {
        bail!("--timeout {timeout} must be a positive number of seconds");
    }
    let implementation = a
        .imp
        .implementation
        .clone()
        .unwrap_or_else(|| "emulate".into());
    if a.imp.inject.is_some() && implementation != "emulate" {
        bail!("--inject needs --impl emulate (got --impl {implementation})");
    }
    let imp: Box<dyn Fp8GroupedGemm> = match implementation.as_str() {
        "reference" => Box::new(Fp8Reference),
        "emulate" => {
            let inject = a
                .imp
                .inject
                .as_deref()
                .map(|b| {
                    b.parse::<Fp8Bug>()
                        .map_err(|e| anyhow::anyhow!("--inject {b}: {e}"))
                })
                .transpose()?;
            Box::new(EmulateFp8 { inject })
        }
        "cuda" => cuda_fp8(&recipe)?,
        name => match name.strip_prefix("exec:") {
            Some(cmd) if !cmd.trim().is_empty() => Box::new(ExecFp8(Program {
                command: cmd.to_string(),
                timeout: Duration::from_secs_f64(timeout),
            })),
            _ => bail!("--impl {name}: FP8 runs on reference, emulate, cuda or exec:CMD"),
        },
    };
    let spinner = spinner((spec.rows() * a.hidden * a.ffn) as u64, &imp.name());
    let case = generate_fp8(&spec, recipe);
    case.validate(a.passes)?;
    let ran = imp.run(&case, a.passes);
    if let Some(pb) = &spinner {
        pb.set_message("comparing with the recipe-exact and the unquantised f64 references");
    }
    let verdict = match ran {
        Ok(got) => {
            if let Some(dir) = &a.dump {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("--dump {}", dir.display()))?;
                moecheck::protocol::fp8::write_fp8_case(dir, &case, a.passes)
                    .with_context(|| format!("--dump {}", dir.display()))?;
                moecheck::protocol::write_outputs::<Gemm>(dir, &got)
                    .with_context(|| format!("--dump {}", dir.display()))?;
            }
            let expected = Fp8Expected::of(&case, a.passes)?;
            let precision = fp8_precision(&case);
            Fp8Verdict::Compared(Box::new(compare_fp8(
                &case, a.passes, &precision, &expected, &got,
            )))
        }
        Err(e) => Fp8Verdict::RunFailed(e),
    };
    if let Some(pb) = spinner {
        pb.finish_and_clear();
    }
    finish(imp.name(), imp.is_model(), &case, &verdict, a.json)
}

/// `--impl cuda` for FP8: the recipe must be the one the kernels implement (exit 2 otherwise,
/// naming the flag); without a device the run itself fails ("no CUDA device").
#[cfg(feature = "cuda")]
fn cuda_fp8(recipe: &Fp8Recipe) -> anyhow::Result<Box<dyn Fp8GroupedGemm>> {
    moecheck::cuda::fp8_host::supports(recipe).map_err(anyhow::Error::msg)?;
    Ok(Box::new(moecheck::cuda::fp8_impl::CudaFp8))
}

#[cfg(not(feature = "cuda"))]
fn cuda_fp8(_recipe: &Fp8Recipe) -> anyhow::Result<Box<dyn Fp8GroupedGemm>> {
    bail!("--impl cuda: moecheck was built without the `cuda` feature")
}

/// A spinner on stderr for large shapes when stderr is a terminal.
fn spinner(work: u64, name: &str) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if work < 50_000_000 || !std::io::stderr().is_terminal() {
        return None;
    }
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
            .expect("valid template"),
    );
    pb.enable_steady_tick(Duration::from_millis(120));
    pb.set_message(format!("generating, quantising and running {name}"));
    Some(pb)
}

/// `moecheck check DIR` on an FP8 case directory: the outputs against the recipe.
pub fn check(
    dir: &std::path::Path,
    case: Fp8GemmCase,
    passes: Passes,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let got = moecheck::protocol::read_outputs::<Gemm>(dir, &case.gemm, passes)?;
    let expected = Fp8Expected::of(&case, passes)?;
    let report = compare_fp8(&case, passes, &fp8_precision(&case), &expected, &got);
    let verdict = Fp8Verdict::Compared(Box::new(report));
    finish(
        format!("outputs in {}", dir.display()),
        false,
        &case,
        &verdict,
        json,
    )
}

fn finish(
    name: String,
    is_model: bool,
    case: &Fp8GemmCase,
    verdict: &Fp8Verdict,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let recipe = case.recipe;
    let (plain, hp) = match verdict {
        Fp8Verdict::Compared(r) => (
            Verdict::of(r.recipe_exact.clone()),
            r.high_precision.clone(),
        ),
        Fp8Verdict::RunFailed(e) => (Verdict::RunFailed(e.clone()), Vec::new()),
    };
    let implemented = Implemented { name, is_model };
    let unused = moecheck_reference::gemm::ReferenceResult {
        value: Default::default(),
        magnitude: Default::default(),
    };
    let report = <Gemm as Reported>::document(&RunInfo {
        implementation: Some(&implemented),
        case: &case.gemm,
        ask: Passes::ALL,
        expected: &unused,
        precision: &fp8_precision(case),
        verdict: Some(&plain),
        draws: 1,
        reference_seconds: 0.0,
    });
    if json {
        let j = Fp8Json {
            report: &report,
            fp8: Fp8Extra {
                recipe,
                verdict_from: "recipe-exact",
                high_precision: hp,
            },
        };
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        print!("{}", render(&report, &recipe, &hp));
    }
    Ok(if report.verdict == VerdictKind::Pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(super::EXIT_FAIL)
    })
}

fn render(report: &GemmReport, r: &Fp8Recipe, hp: &[HighPrecisionStats]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let scaling = match r.scaling {
        ScalingKind::Current => "current scaling".to_string(),
        ScalingKind::Delayed {
            history_len,
            algo,
            margin,
        } => {
            format!("delayed scaling (history {history_len}, {algo:?}, margin {margin})")
        }
    };
    let _ =
        writeln!(
        s,
        "FP8 recipe: lhs {} per {:?}, rhs {} per {:?}, dout {} per {:?}; {}; {}; accumulation {}",
        r.lhs.format,
        r.lhs.scope,
        r.rhs.format,
        r.rhs.scope,
        r.dout.format,
        r.dout.scope,
        if r.saturate { "saturating casts" } else { "IEEE casts" },
        scaling,
        r.accumulation
    );
    let _ = writeln!(s, "verdict below: recipe-exact (the GEMM of the recipe's dequantised operands, bound from the accumulation model)");
    s.push_str(&<Gemm as Reported>::render(report));
    if !hp.is_empty() {
        let _ = writeln!(
            s,
            "against the unquantised f64 GEMM (information, not a verdict):"
        );
        let _ = writeln!(
            s,
            "{:<6} {:>11} {:>11} {:>11} {:>16} {:>12}",
            "pass", "rel err", "calc_diff", "max|err|", "outside envelope", "max env ratio"
        );
        for h in hp {
            let _ = writeln!(
                s,
                "{:<6} {:>11.3e} {:>11.3e} {:>11.3e} {:>16} {:>12.3}",
                h.pass.name(),
                h.rel_err,
                h.calc_diff,
                h.max_abs_err,
                format!("{}/{}", h.outside_envelope, h.elements),
                h.max_envelope_ratio
            );
        }
    }
    s
}
