//! `moecheck gemm`: the flags of a generated grouped-GEMM check (the FP8 flags are
//! `gemm_fp8`'s), parsed into a [`GemmCheck`]; how it runs (which check, whole or in shards,
//! the memory guard) is `moecheck::gemm_check`'s.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use moecheck::gemm_check::{self, GemmCheck};
use moecheck::generate::gemm::{GemmSpec, Spread};
use moecheck::registry::Declared;
use moecheck_reference::format::Format;
use moecheck_reference::gemm::{Passes, TailContract, Verify};

use super::ImplFlags;

#[derive(Debug, Args)]
#[command(mut_arg("implementation", |a| a.help(IMPL_HELP)))]
pub struct GemmFlags {
    /// Number of experts G.
    #[arg(long, default_value_t = 8, help_heading = "Case")]
    pub experts: usize,
    /// Tokens routed; rows M = tokens · topk.
    #[arg(long, default_value_t = 512, help_heading = "Case")]
    pub tokens: usize,
    /// Experts per token.
    #[arg(long, default_value_t = 2, help_heading = "Case")]
    pub topk: usize,
    /// Hidden size: the reduction length K of the forward pass.
    #[arg(long, default_value_t = 256, help_heading = "Case")]
    pub hidden: usize,
    /// Expert FFN width N.
    #[arg(long, default_value_t = 128, help_heading = "Case")]
    pub ffn: usize,
    /// Input dtype: f32, bf16, f16. Every input value is exactly representable in it.
    /// `fp8` (or e4m3, e5m2): float32 inputs quantised by the implementation per the FP8
    /// recipe (E4M3 forward, E5M2 dout), checked recipe-exact; see the FP8 flags.
    #[arg(long, default_value = "bf16", value_parser = super::gemm_fp8::parse_gemm_dtype, help_heading = "Case")]
    pub dtype: Format,
    /// Output dtype the implementation writes: f32, bf16, f16, f64.
    #[arg(long, default_value = "f32", value_parser = super::format_in(super::FLOATS), help_heading = "Case")]
    pub out_dtype: Format,
    /// Accumulator format an exec: or worker: implementation declares (the bound is derived from it)
    /// [default: f32]. Built-in implementations declare their own; FP8 declares its
    /// accumulation with --accum.
    #[arg(long, value_parser = super::format_in(super::FLOATS), help_heading = "Declaration (exec: and worker:)")]
    pub acc: Option<Format>,
    /// K-block size of an exec: or worker: implementation's accumulator (partials over this many
    /// products, then summed); omit for "any order".
    #[arg(long, help_heading = "Declaration (exec: and worker:)")]
    pub acc_block: Option<usize>,
    /// How rows are spread over experts.
    #[arg(
        long = "routing",
        value_name = "ROUTING",
        value_enum,
        default_value = "skewed",
        help_heading = "Case"
    )]
    pub spread: Spread,
    /// Experts forced empty (the first, the last and the middle one first).
    #[arg(long, default_value_t = 2, help_heading = "Case")]
    pub empty: usize,
    /// Fraction of rows dropped (tail rows past sum(group_sizes)).
    #[arg(
        long,
        default_value_t = 0.05,
        allow_negative_numbers = true,
        help_heading = "Case"
    )]
    pub drop_frac: f64,
    /// Seed of the generated case.
    #[arg(long, default_value_t = 0, help_heading = "Case")]
    pub seed: u64,
    #[command(flatten)]
    pub imp: ImplFlags,
    /// Passes to run.
    #[arg(long, default_value = "fwd,dgrad,wgrad", value_parser = Passes::parse, help_heading = "Case")]
    pub passes: Passes,
    /// Tail contract: zero (tail rows of out/dlhs must be exactly 0) or ignored.
    #[arg(
        long,
        value_enum,
        default_value = "zero",
        help_heading = "Declaration (exec: and worker:)"
    )]
    pub tail: TailArg,
    /// How the outputs are checked: full (every element against its bound, O(M·K·N)) or
    /// fast (random projections of every row and of every 16 columns of it, sampled rows and
    /// columns at group and tile edges, NaN/inf, tails and empty experts exactly; see
    /// docs/contract.md), for --dtype fp8 too
    /// (but full only for IEEE casts under delayed scaling) [default: full up to 2^36
    /// multiply-adds per pass (M·K·N), fast above].
    #[arg(long, value_name = "full|fast", value_parser = Verify::parse, help_heading = "Verification")]
    pub verify: Option<Verify>,
    /// Write the case and the outputs that were checked to DIR (protocol layout).
    #[arg(long, help_heading = "Output")]
    pub dump: Option<PathBuf>,
    /// Machine-readable report on stdout, with a top-level "verdict".
    #[arg(long, help_heading = "Output")]
    pub json: bool,
    /// Check the case N shards of consecutive experts at a time, holding one shard's inputs
    /// and outputs at a time (the in-process models, reference and emulate, run a shard at a
    /// time; an exec: or worker: program runs once on the whole case, written a shard at a
    /// time, and its outputs are read back and checked a shard at a time; with --dtype fp8 a
    /// kernel under test runs on the whole case and its outputs are checked N shards at a
    /// time, one shard's references held at once). The report is the whole case's.
    /// [default: 1 when the case is estimated to need at most 2 GiB, else the fewest shards
    /// estimated to need at most 2 GiB each (or what the largest expert needs alone), or else
    /// at most half of the memory available, or else at most 85% of it; with --dtype fp8,
    /// shards of about 512 MiB but at least two experts per core; an exec: or worker: program
    /// is counted beside moecheck, see --impl-memory]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), help_heading = "Verification")]
    pub shards: Option<u64>,
    /// Run even when the case's estimated memory exceeds what this machine has available
    /// (without it such a case is refused with exit 2).
    #[arg(long, help_heading = "Verification")]
    pub allow_large: bool,
    /// The peak memory of an exec: or worker: program on this case, when you know it (e.g.
    /// 4GiB for an adapter that memory-maps its inputs and outputs, docs/protocol.md), for the
    /// memory guard, which counts the program beside moecheck [default: every input and output
    /// held whole, as a program that loads them holds them].
    #[arg(long, value_name = "SIZE", value_parser = super::parse_size, help_heading = "Verification")]
    pub impl_memory: Option<u64>,
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
    let fp8 = matches!(a.dtype, Format::E4m3 | Format::E5m2);
    let recipe = match (fp8, a.fp8.first_given()) {
        (true, _) => Some(a.fp8.recipe(a.dtype)?),
        (false, Some(flag)) => anyhow::bail!("{flag} needs --dtype fp8"),
        (false, None) => None,
    };
    let check = GemmCheck {
        // An FP8 case's inputs are float32, quantised by the implementation.
        spec: a.spec(if fp8 { Format::F32 } else { a.dtype }),
        dtype: a.dtype,
        fp8: recipe,
        verify: a.verify,
        shards: a.shards,
        allow_large: a.allow_large,
        impl_memory: a.impl_memory,
        dump: a.dump.clone(),
        json: a.json,
        choice: a.imp.choice(a.declared()),
    };
    gemm_check::run(&check)
}
