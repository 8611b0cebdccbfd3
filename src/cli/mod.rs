//! Argument parsing and dispatch. Each subcommand lives in its own file.

mod bench;
mod bench_e2e;
mod check;
mod curves;
mod devices;
mod fp8;
mod fp8_block;
mod gemm;
mod gemm_fp8;
mod moe;
mod prop;
mod route;
mod routing_flags;
mod selftest;
mod train;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use moecheck::registry::{Choice, Declared};
use moecheck_reference::format::Format;

/// Exit status of a check that found a mismatch.
pub const EXIT_FAIL: u8 = 1;

#[derive(Debug, Parser)]
#[command(
    name = "moecheck",
    version,
    about = "Checks Mixture-of-Experts kernels against an exact f64 reference",
    after_help = "Exit status: 0 pass, 1 mismatch found (or the implementation failed), 2 usage or input error, 3 inconclusive (every element passed, but the bound would have passed an all-zero output too; curves diff: the curves cannot decide)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate a routed grouped-GEMM case, run an implementation on it, and check every
    /// element of fwd/dgrad/wgrad against its derived error bound.
    Gemm(gemm::GemmFlags),
    /// Re-verify a case directory (protocol v1) that holds inputs and outputs.
    Check(check::CheckArgs),
    /// Run every property against the correct emulation and every planted bug.
    Selftest(selftest::SelftestArgs),
    /// Run every property of one operation against any implementation (a property campaign):
    /// failures are shrunk, their minimal case written as a case directory, and one printed
    /// line reproduces each.
    Prop(prop::PropFlags),
    /// FP8 current scaling (Transformer Engine's recipe): `fp8 quantize`.
    Fp8(fp8::Fp8Args),
    /// Benchmark the f64 reference grouped GEMM against a dense f64 GEMM of equal FLOPs.
    Bench(bench::BenchArgs),
    /// Loss-curve parity: read training logs (MaxText, Megatron, Megatron-Bridge, torchtitan,
    /// nanoGPT, HF, TensorBoard, plain, or any log through --pattern) and give a
    /// PASS/FAIL/INCONCLUSIVE verdict on two runs, with a plot.
    Curves(curves::CurvesArgs),
    /// Show the CUDA devices and libraries (libcuda, libnvrtc, libcublas) moecheck can use,
    /// or one line on why there are none (exit 0 either way).
    Devices(devices::DevicesArgs),
    /// Route tokens to experts (softmax / topk-softmax / sigmoid, DeepSeek-V3 groups and bias,
    /// capacity dropping) with the f64 reference, write the result as .npy, and optionally
    /// check an implementation against it.
    Route(route::RouteFlags),
    /// Check a whole MoE layer (router, routing, permute, SwiGLU experts, combine, shared
    /// expert): the output and every gradient against the f64 reference and its derived bound.
    Moe(moe::MoeFlags),
    /// Train a small MoE language model on the CPU with its expert GEMMs through an
    /// implementation, and log the loss curve (`--compare`: against the reference path's,
    /// with the curves verdict).
    Train(train::TrainFlags),
}

pub fn run() -> anyhow::Result<ExitCode> {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        // Help and version go to stdout with exit 0.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return Ok(ExitCode::SUCCESS);
        }
        // No subcommand: the help, on stderr, exit 2.
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return Ok(ExitCode::from(2));
        }
        // Usage errors: exit 2 with one line, like every other bad input.
        Err(e) => {
            eprintln!("moecheck: error: {}", usage_line(&e.to_string()));
            return Ok(ExitCode::from(2));
        }
    };
    match cli.command {
        Command::Gemm(a) => gemm::run(a),
        Command::Check(a) => check::run(a),
        Command::Selftest(a) => selftest::run(a),
        Command::Prop(a) => prop::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Curves(a) => curves::run(a),
        Command::Fp8(a) => fp8::run(a),
        Command::Devices(a) => devices::run(a),
        Command::Route(a) => route::run(a),
        Command::Moe(a) => moe::run(a),
        Command::Train(a) => train::run(a),
    }
}

/// `--impl`, `--inject`, `--timeout`: which implementation runs (the registry builds it).
#[derive(Debug, Args)]
#[command(next_help_heading = "Implementation")]
pub struct ImplFlags {
    /// Implementation under test (each command lists its own) [default: emulate].
    #[arg(long = "impl")]
    pub implementation: Option<String>,
    /// Planted bug for --impl emulate (`moecheck selftest` lists them).
    #[arg(long)]
    pub inject: Option<String>,
    /// Seconds an exec: or worker: implementation may take per case [default: 600].
    #[arg(long, allow_negative_numbers = true)]
    pub timeout: Option<f64>,
    /// How an exec: or worker: program's inputs are written: float32 .npy files, or compact
    /// (a grouped GEMM's bf16 inputs as uint16 bit patterns, "encodings" in case.json; a
    /// worker may ask for it in its greeting) [default: float32].
    #[arg(long, value_parser = ["float32", "compact"])]
    pub inputs: Option<String>,
}

impl ImplFlags {
    /// The registry's choice, `--impl` defaulting to `emulate`.
    pub fn choice(&self, declared: Declared) -> Choice {
        Choice {
            declared,
            inject: self.inject.clone(),
            timeout: self.timeout,
            compact_inputs: self.inputs.as_deref() == Some("compact"),
            ..Choice::named(self.implementation.as_deref().unwrap_or("emulate"))
        }
    }
}

/// A size as a user gives it: a number of bytes, or with a unit (`512MiB`, `2GiB`, `1.5G`;
/// `K`, `M`, `G`, `T` and their `iB` forms are powers of 1024, `KB`, `MB`, `GB`, `TB` of 1000).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: f64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1.0,
        "K" | "KIB" => 1024.0,
        "M" | "MIB" => 1024f64.powi(2),
        "G" | "GIB" => 1024f64.powi(3),
        "T" | "TIB" => 1024f64.powi(4),
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => {
            return Err(format!(
                "'{s}': expected a size such as 2GiB, 512MiB or 1000000"
            ))
        }
    };
    match number.parse::<f64>() {
        Ok(v) if v.is_finite() && v * scale < u64::MAX as f64 => Ok((v * scale).round() as u64),
        _ => Err(format!(
            "'{s}': expected a size such as 2GiB, 512MiB or 1000000"
        )),
    }
}

/// A number format flag (`f32`, `bf16`, ...).
pub fn parse_format(s: &str) -> Result<Format, String> {
    Format::parse(s).map_err(|e| e.to_string())
}

/// clap's usage error on one line: its text up to the usage block, without the `error:`
/// prefix, lines joined (a list of missing flags stays whole).
fn usage_line(text: &str) -> String {
    let body: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty())
        .collect();
    let line = body.join(" ");
    let line = line.strip_prefix("error: ").unwrap_or(&line).to_string();
    format!("{line} (see --help)")
}

/// An error and its causes on one line, `outer: inner`, each cause once: a cause whose text
/// the line already ends with (an error that displays its source too) is not repeated.
pub fn one_reason(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for c in e.chain().map(|c| c.to_string()) {
        if line.ends_with(&c) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&c);
    }
    line
}

/// Non-FP8 formats: outputs, accumulators, compute formats.
pub const FLOATS: &[Format] = &[Format::F32, Format::Bf16, Format::F16, Format::F64];
/// Input formats of generated layer cases.
pub const INPUTS: &[Format] = &[Format::Bf16, Format::F16, Format::F32];
/// FP8 formats.
pub const FP8: &[Format] = &[Format::E4m3, Format::E5m2];

/// A parser of a format flag that accepts only `allowed`, and names exactly those.
pub fn format_in(
    allowed: &'static [Format],
) -> impl Fn(&str) -> Result<Format, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let names = allowed
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        match Format::parse(s) {
            Ok(f) if allowed.contains(&f) => Ok(f),
            Ok(f) => Err(format!(
                "{f} is not accepted here (expected one of {names})"
            )),
            Err(_) => Err(format!("unknown dtype '{s}' (expected one of {names})")),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_reason_names_each_cause_once() {
        #[derive(Debug)]
        struct Shows(&'static str);
        impl std::fmt::Display for Shows {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for Shows {}
        let inner = anyhow::Error::new(Shows("dout holds NaN at [0, 0]"));
        let twice = inner
            .context("dout holds NaN at [0, 0]")
            .context("case/dir");
        assert_eq!(
            super::one_reason(&twice),
            "case/dir: dout holds NaN at [0, 0]"
        );
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(super::one_reason(&e), "outer: inner");
    }

    #[test]
    fn usage_errors_are_one_line() {
        let text = "error: the following required arguments were not provided:\n  --topk <TOPK>\n  --score <SCORE>\n\nUsage: moecheck route --topk <TOPK>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            super::usage_line(text),
            "the following required arguments were not provided: --topk <TOPK> --score <SCORE> (see --help)"
        );
    }

    #[test]
    fn clap_command_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
