//! `moecheck gemm`: the flags of a generated grouped-GEMM check (the FP8 flags are
//! `gemm_fp8`'s); the work is the pipeline's.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use moecheck::generate::fp8::Fp8Spec;
use moecheck::generate::gemm::{GemmSpec, Spread};
use moecheck::registry::{self, Backends, Declared};
use moecheck::{memory, pipeline, report};
use moecheck_reference::format::Format;
use moecheck_reference::fp8::Fp8Gemm;
use moecheck_reference::gemm::{Gemm, GemmFast, Passes, TailContract, Verify};
use moecheck_reference::report::Reported;

use super::ImplFlags;

#[derive(Debug, Args)]
#[command(mut_arg("implementation", |a| a.help(IMPL_HELP)))]
pub struct GemmFlags {
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
    #[arg(long, default_value = "f32", value_parser = super::format_in(super::FLOATS))]
    pub out_dtype: Format,
    /// Accumulator format an exec: or worker: implementation declares (the bound is derived from it)
    /// [default: f32]. Built-in implementations declare their own; FP8 declares its
    /// accumulation with --accum.
    #[arg(long, value_parser = super::format_in(super::FLOATS))]
    pub acc: Option<Format>,
    /// K-block size of an exec: or worker: implementation's accumulator (partials over this many
    /// products, then summed); omit for "any order".
    #[arg(long)]
    pub acc_block: Option<usize>,
    /// How rows are spread over experts.
    #[arg(
        long = "routing",
        value_name = "ROUTING",
        value_enum,
        default_value = "skewed"
    )]
    pub spread: Spread,
    /// Experts forced empty (the first, the last and the middle one first).
    #[arg(long, default_value_t = 2)]
    pub empty: usize,
    /// Fraction of rows dropped (tail rows past sum(group_sizes)).
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    pub drop_frac: f64,
    /// Seed of the generated case.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub imp: ImplFlags,
    /// Passes to run.
    #[arg(long, default_value = "fwd,dgrad,wgrad", value_parser = Passes::parse)]
    pub passes: Passes,
    /// Tail contract: zero (tail rows of out/dlhs must be exactly 0) or ignored.
    #[arg(long, value_enum, default_value = "zero")]
    pub tail: TailArg,
    /// How the outputs are checked: full (every element against its bound, O(M·K·N)) or
    /// fast (random projections of every row, sampled rows and columns at group and tile
    /// edges, NaN/inf, tails and empty experts exactly; see the README) [default: full up
    /// to 2^36 multiply-adds per pass (M·K·N), fast above].
    #[arg(long, value_name = "full|fast", value_parser = Verify::parse)]
    pub verify: Option<Verify>,
    /// Write the case and the outputs that were checked to DIR (protocol layout).
    #[arg(long)]
    pub dump: Option<PathBuf>,
    /// Machine-readable report on stdout, with a top-level "verdict".
    #[arg(long)]
    pub json: bool,
    /// Run even when the case's estimated memory exceeds what this machine has available
    /// (without it such a case is refused with exit 2).
    #[arg(long)]
    pub allow_large: bool,
    #[command(flatten)]
    pub fp8: super::gemm_fp8::Fp8Flags,
}

/// `--impl` of `moecheck gemm`.
const IMPL_HELP: &str = "Implementation under test: reference | emulate (a CPU model of a tiled kernel, never a GPU result) | exec:CMD (CMD gets the case directory as its last argument, see docs/protocol.md) | worker:CMD (CMD started once, one JSON line per case, protocol v2) | cuda | cuda-tiled | cublas | cublas-grouped (GPU; without a device the run fails saying \"no CUDA device\"). With --dtype fp8: reference | emulate | exec:CMD | worker:CMD | cuda [default: emulate]";

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

impl GemmFlags {
    /// The case spec, with `dtype` as the input format.
    pub fn spec(&self, dtype: Format) -> GemmSpec {
        GemmSpec {
            experts: self.experts,
            tokens: self.tokens,
            topk: self.topk,
            hidden: self.hidden,
            ffn: self.ffn,
            dtype,
            out_dtype: self.out_dtype,
            spread: self.spread,
            empty: self.empty,
            drop_frac: self.drop_frac,
            seed: self.seed,
            tail: self.tail.into(),
            passes: self.passes,
        }
    }

    /// Refuses a case larger than the memory available ([`memory`]), unless `--allow-large`;
    /// `verify` is `None` for the FP8 GEMM.
    fn guard_memory(&self, verify: Option<Verify>) -> anyhow::Result<()> {
        let m = self.tokens.saturating_mul(self.topk);
        let (k, n, g) = (self.hidden, self.ffn, self.experts);
        let need = match verify {
            Some(v) => memory::gemm_bytes(
                memory::GemmSize { m, k, n, groups: g },
                self.passes,
                v,
                memory::Formats {
                    dtype: self.dtype,
                    out_dtype: self.out_dtype,
                },
            ),
            None => memory::fp8_gemm_bytes(m, k, n, g),
        };
        memory::guard(
            "--experts/--tokens/--topk/--hidden/--ffn",
            need,
            memory::available(),
            self.allow_large,
        )
        .map_err(anyhow::Error::msg)
    }

    /// `--acc`, `--acc-block`.
    pub fn declared(&self) -> Declared {
        Declared {
            acc: self.acc,
            acc_block: self.acc_block,
            ..Declared::default()
        }
    }
}

pub fn run(a: GemmFlags) -> anyhow::Result<ExitCode> {
    if matches!(a.dtype, Format::E4m3 | Format::E5m2) {
        return run_fp8(a);
    }
    if let Some(flag) = a.fp8.first_given() {
        anyhow::bail!("{flag} needs --dtype fp8");
    }
    let spec = a.spec(a.dtype);
    spec.validate().map_err(|e| anyhow::anyhow!(e.as_flag()))?;
    let verify = a.verify.unwrap_or_else(|| Verify::default_for(spec.work()));
    a.guard_memory(Some(verify))?;
    match verify {
        Verify::Full => check::<Gemm>(&a, &spec),
        Verify::Fast => check::<GemmFast>(&a, &spec),
    }
}

/// The check of `spec` as op `O` ([`Gemm`] or [`GemmFast`]: the same implementations, another
/// comparison).
fn check<O>(a: &GemmFlags, spec: &GemmSpec) -> anyhow::Result<ExitCode>
where
    O: Backends + Reported,
    GemmSpec: pipeline::Generate<O>,
{
    let imp = registry::build::<O>(&a.imp.choice(a.declared())).map_err(anyhow::Error::msg)?;
    let run = pipeline::run(spec, Some(imp.as_ref()), a.dump.as_deref())?;
    report::finish(&pipeline::report(&run), a.json)
}

/// `moecheck gemm --dtype fp8|e4m3|e5m2`.
fn run_fp8(a: GemmFlags) -> anyhow::Result<ExitCode> {
    if a.verify == Some(Verify::Fast) {
        anyhow::bail!("--verify fast: not available for --dtype fp8 yet; the FP8 grouped GEMM is checked in full");
    }
    if matches!(a.out_dtype, Format::E4m3 | Format::E5m2) {
        anyhow::bail!(
            "--out-dtype {}: FP8 GEMM outputs are f32 or bf16",
            a.out_dtype
        );
    }
    let recipe = a.fp8.recipe(a.dtype)?;
    let spec = Fp8Spec {
        gemm: a.spec(Format::F32),
        recipe,
    };
    spec.gemm
        .validate()
        .map_err(|e| anyhow::anyhow!(e.as_flag()))?;
    a.guard_memory(None)?;
    let imp =
        registry::build::<Fp8Gemm>(&a.imp.choice(a.declared())).map_err(anyhow::Error::msg)?;
    let run = pipeline::run(&spec, Some(imp.as_ref()), a.dump.as_deref())?;
    report::finish(&pipeline::report(&run), a.json)
}
