//! `moecheck gemm`: generate, run, check.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

use moecheck::cases::{generate, GemmSpec, Routing};
use moecheck::impls::emulate::{Bug, Emulate};
use moecheck::impls::exec::Exec;
use moecheck::report::GemmReport;
use moecheck_reference::format::Format;
use moecheck_reference::gemm::{compare_outputs, reference, Accumulator, Passes, TailContract};
use moecheck_reference::implementation::{GroupedGemm, Reference, Verdict};

#[derive(Debug, Args)]
pub struct GemmArgs {
    /// Number of experts G.
    #[arg(long, default_value_t = 8)]
    pub experts: usize,
    /// Tokens routed; rows M = tokens · topk.
    #[arg(long, default_value_t = 512)]
    pub tokens: usize,
    /// Experts per token.
    #[arg(long, default_value_t = 2)]
    pub topk: usize,
    /// Hidden size: the reduction length K of the forward pass.
    #[arg(long, default_value_t = 256)]
    pub hidden: usize,
    /// Expert FFN width N.
    #[arg(long, default_value_t = 128)]
    pub ffn: usize,
    /// Input dtype: f32, bf16, f16. Every input value is exactly representable in it.
    /// `fp8` (or e4m3, e5m2): float32 inputs quantised by the implementation per the FP8
    /// recipe (E4M3 forward, E5M2 dout), checked recipe-exact; see the FP8 flags.
    #[arg(long, default_value = "bf16", value_parser = super::gemm_fp8::parse_gemm_dtype)]
    pub dtype: Format,
    /// Output dtype the implementation writes: f32, bf16, f16, f64.
    #[arg(long, default_value = "f32", value_parser = parse_format)]
    pub out_dtype: Format,
    /// Declared accumulator format (the bound is derived from it).
    #[arg(long, default_value = "f32", value_parser = parse_format)]
    pub acc: Format,
    /// Declared K-block size of the accumulator (partials over this many products, then summed);
    /// omit for "any order".
    #[arg(long)]
    pub acc_block: Option<usize>,
    /// How rows are spread over experts.
    #[arg(long, value_enum, default_value = "skewed")]
    pub routing: Routing,
    /// Experts forced empty (the first, the last and the middle one first).
    #[arg(long, default_value_t = 2)]
    pub empty: usize,
    /// Fraction of rows dropped (tail rows past sum(group_sizes)).
    #[arg(long, default_value_t = 0.05)]
    pub drop_frac: f64,
    /// Seed of the generated case.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Implementation under test: reference | emulate | exec:CMD (CMD gets the case directory
    /// as its last argument, see docs/protocol.md) | cuda | cuda-tiled | cublas |
    /// cublas-grouped (GPU; without a device the run fails saying "no CUDA device"). With
    /// `--dtype fp8`: reference | emulate | exec:CMD | cuda.
    #[arg(long = "impl", default_value = "emulate")]
    pub implementation: String,
    /// Planted bug for `--impl emulate` (see `moecheck selftest`).
    #[arg(long)]
    pub inject: Option<String>,
    /// Passes to run.
    #[arg(long, default_value = "fwd,dgrad,wgrad", value_parser = Passes::parse)]
    pub passes: Passes,
    /// Tail contract: zero (tail rows of out/dlhs must be exactly 0) or ignored.
    #[arg(long, value_enum, default_value = "zero")]
    pub tail: TailArg,
    /// Timeout in seconds for exec: implementations.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    /// Write the case and the implementation's outputs to DIR (protocol layout).
    #[arg(long)]
    pub dump: Option<PathBuf>,
    /// Machine-readable report on stdout, with a top-level "verdict".
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub fp8: super::gemm_fp8::Fp8Flags,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum TailArg {
    Zero,
    Ignored,
}

impl From<TailArg> for TailContract {
    fn from(t: TailArg) -> Self {
        match t {
            TailArg::Zero => TailContract::Zero,
            TailArg::Ignored => TailContract::Ignored,
        }
    }
}

pub fn parse_format(s: &str) -> Result<Format, String> {
    Format::parse(s).map_err(|e| e.to_string())
}

/// Builds the implementation named by `--impl`.
pub fn build_impl(
    name: &str,
    inject: Option<&str>,
    acc: Accumulator,
    timeout: f64,
) -> anyhow::Result<Box<dyn GroupedGemm>> {
    if inject.is_some() && name != "emulate" {
        bail!("--inject needs --impl emulate (got --impl {name})");
    }
    if !(timeout > 0.0 && timeout.is_finite()) {
        bail!("--timeout {timeout} must be a positive number of seconds");
    }
    Ok(match name {
        "reference" => Box::new(Reference),
        "emulate" => {
            let inject = inject
                .map(|b| {
                    b.parse::<Bug>()
                        .map_err(|e| anyhow::anyhow!("--inject {b}: {e}"))
                })
                .transpose()?;
            Box::new(Emulate {
                inject,
                ..Emulate::default()
            })
        }
        _ if moecheck::cuda::IMPL_NAMES.contains(&name) => match moecheck::cuda::build(name) {
            Some(imp) => imp,
            None => bail!("--impl {name}: moecheck was built without the `cuda` feature"),
        },
        _ => match name.strip_prefix("exec:") {
            Some(cmd) if !cmd.trim().is_empty() => Box::new(Exec {
                command: cmd.to_string(),
                timeout: Duration::from_secs_f64(timeout),
                keep_dir: None,
                accumulator: acc,
            }),
            _ => bail!(
                "--impl {name}: expected reference, emulate, exec:CMD, cuda, cuda-tiled, cublas or cublas-grouped"
            ),
        },
    })
}

pub fn run(a: GemmArgs) -> anyhow::Result<ExitCode> {
    if matches!(a.dtype, Format::E4m3 | Format::E5m2) {
        return super::gemm_fp8::run(a);
    }
    if let Some(flag) = a.fp8.first_given() {
        bail!("{flag} needs --dtype fp8");
    }
    let spec = GemmSpec {
        experts: a.experts,
        tokens: a.tokens,
        topk: a.topk,
        hidden: a.hidden,
        ffn: a.ffn,
        dtype: a.dtype,
        out_dtype: a.out_dtype,
        routing: a.routing,
        empty: a.empty,
        drop_frac: a.drop_frac,
        seed: a.seed,
        tail: a.tail.into(),
    };
    spec.validate().map_err(anyhow::Error::msg)?;
    if a.passes.is_empty() {
        bail!("--passes is empty");
    }
    let acc = Accumulator {
        format: a.acc,
        block: a.acc_block,
    };
    let imp = build_impl(&a.implementation, a.inject.as_deref(), acc, a.timeout)?;

    let work = (spec.rows() * a.hidden * a.ffn) as u64;
    let progress = Progress::new(work, 3);
    progress.stage("generating the case");
    let case = generate(&spec);
    progress.stage("computing the f64 reference");
    let want = reference(&case, a.passes).context("generated case")?;
    progress.stage(&format!("running {}", imp.name()));
    let precision = imp.precision(&case);
    let verdict = match imp.run(&case, a.passes) {
        Ok(got) => {
            if let Some(dir) = &a.dump {
                dump(dir, &case, a.passes, &got)?;
            }
            Verdict::Compared(compare_outputs(&case, a.passes, &precision, &want, &got))
        }
        Err(e) => Verdict::RunFailed(e),
    };
    progress.done();
    let report = GemmReport::new(imp.name(), imp.is_model(), &case, precision, &verdict);
    super::finish(&report, a.json)
}

fn dump(
    dir: &std::path::Path,
    case: &moecheck_reference::gemm::GroupedGemmCase,
    passes: Passes,
    got: &moecheck_reference::gemm::GemmOutputs,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("--dump {}", dir.display()))?;
    moecheck::protocol::write_case(dir, case, passes)
        .with_context(|| format!("--dump {}", dir.display()))?;
    moecheck::protocol::write_outputs(dir, got)
        .with_context(|| format!("--dump {}", dir.display()))?;
    Ok(())
}

/// A stage spinner on stderr for large shapes when stderr is a terminal.
struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    fn new(work: u64, stages: u64) -> Progress {
        use std::io::IsTerminal;
        if work < 200_000_000 || !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let pb = indicatif::ProgressBar::new(stages);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {pos}/{len} {msg}",
            )
            .expect("valid template"),
        );
        pb.enable_steady_tick(Duration::from_millis(120));
        Progress(Some(pb))
    }
    fn stage(&self, msg: &str) {
        if let Some(pb) = &self.0 {
            if !pb.message().is_empty() {
                pb.inc(1);
            }
            pb.set_message(msg.to_string());
        }
    }
    fn done(&self) {
        if let Some(pb) = &self.0 {
            pb.finish_and_clear();
        }
    }
}
