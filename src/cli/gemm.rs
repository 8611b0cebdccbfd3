//! `moecheck gemm`: the flags of a generated grouped-GEMM check (the FP8 flags are
//! `gemm_fp8`'s); the work is the pipeline's.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use moecheck::generate::fp8::Fp8Spec;
use moecheck::generate::gemm::{sizes_of, GemmSpec, Spread};
use moecheck::registry::{self, Backends, Declared};
use moecheck::{memory, pipeline, pipeline_sharded, report};
use moecheck_reference::format::Format;
use moecheck_reference::fp8::{Fp8Gemm, Fp8GemmFast};
use moecheck_reference::gemm::shard::{self, Sharded};
use moecheck_reference::gemm::{Gemm, GemmFast, Passes, TailContract, Verify};
use moecheck_reference::op::{Implementation, Op};
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
    /// edges, NaN/inf, tails and empty experts exactly; see the README), for --dtype fp8 too
    /// (but full only for IEEE casts under delayed scaling) [default: full up to 2^36
    /// multiply-adds per pass (M·K·N), fast above].
    #[arg(long, value_name = "full|fast", value_parser = Verify::parse)]
    pub verify: Option<Verify>,
    /// Write the case and the outputs that were checked to DIR (protocol layout).
    #[arg(long)]
    pub dump: Option<PathBuf>,
    /// Machine-readable report on stdout, with a top-level "verdict".
    #[arg(long)]
    pub json: bool,
    /// Check the case N shards of consecutive experts at a time, holding one shard's inputs
    /// and outputs at a time (the in-process models, reference and emulate, only; a kernel
    /// under test runs on the whole case, and with --dtype fp8 its outputs are then checked N
    /// shards at a time, one shard's references held at once). The report is the whole case's.
    /// [default: 1 when the case is estimated to need at most 2 GiB, else the fewest shards
    /// estimated to need at most 2 GiB each (or what the largest expert needs alone), or else
    /// at most half of the memory available, or else at most 85% of it; with --dtype fp8,
    /// shards of about 512 MiB but at least two experts per core]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub shards: Option<u64>,
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

    fn size(&self) -> memory::GemmSize {
        memory::GemmSize {
            m: self.tokens.saturating_mul(self.topk),
            k: self.hidden,
            n: self.ffn,
            groups: self.experts,
        }
    }

    fn formats(&self) -> memory::Formats {
        memory::Formats {
            dtype: self.dtype,
            out_dtype: self.out_dtype,
        }
    }

    /// The estimated peak of the check ([`memory`]) in `parts` shards planned from the case's
    /// group sizes `sizes` as [`shard::plan`] will plan them (`None`: the whole case, unplanned).
    fn need(&self, check: Estimate, sizes: Option<&[usize]>, parts: usize) -> u64 {
        let size = self.size();
        let plan = match sizes {
            Some(sizes) => shard::plan_sizes(sizes, size.m, size.k, size.n, parts),
            None => Vec::new(),
        };
        match check {
            Estimate::Gemm(verify) => {
                memory::gemm_bytes_sharded(size, self.passes, verify, self.formats(), &plan)
            }
            Estimate::Fp8 { whole_inputs } => {
                memory::fp8_gemm_bytes_sharded(size, &plan, whole_inputs)
            }
            Estimate::Fp8RunWhole => memory::fp8_kernel_bytes_sharded(size, &plan),
        }
    }

    /// How many shards of consecutive experts the case is checked in (`--shards`, or chosen
    /// so that it fits in memory, [`memory::shards_for`]), after the memory guard. `imp` is
    /// checked whole unless it is shardable ([`Implementation::shardable`]) or a kernel under
    /// test of the FP8 GEMM, which runs whole and is checked in shards
    /// ([`Estimate::Fp8RunWhole`]), and a dumped case is checked whole.
    fn shards<O: Op>(
        &self,
        spec: &GemmSpec,
        check: Estimate,
        imp: &dyn Implementation<O>,
        case_whole: Option<String>,
    ) -> anyhow::Result<usize> {
        let whole = if let Some(why) = case_whole {
            Some(why)
        } else if !imp.shardable() && !matches!(check, Estimate::Fp8RunWhole) {
            Some(format!(
                "--impl {} is checked whole, at the size it is given (only the in-process models that compute each expert on its own are checked a shard of experts at a time: reference, and emulate without group-offset-after-empty, which reads across experts; with --dtype fp8 any implementation's outputs may be checked in shards)",
                imp.name()
            ))
        } else if self.dump.is_some() {
            Some("--dump writes every output of the case, so the case is checked whole".into())
        } else {
            None
        };
        let asked = self
            .shards
            .map(|p| usize::try_from(p).unwrap_or(usize::MAX));
        match (asked, &whole) {
            (Some(p), Some(why)) if p > 1 => anyhow::bail!("--shards {p}: {why}"),
            (Some(p), _) if p > self.experts.max(1) => anyhow::bail!(
                "--shards {p}: more shards than experts (--experts {})",
                self.experts
            ),
            _ => {}
        }
        let available = memory::available();
        // Checked whole, decided without planning (which draws every expert's size): when
        // asked, when it must be, when the whole case is small enough to be one shard
        // (memory::GEMM_SHARD_BYTES) and fits, or when no number of shards could make it fit
        // (the guard refuses it whole).
        let whole_need = self.need(check, None, 1);
        let held = match check {
            Estimate::Gemm(_) => self.dtype,
            Estimate::Fp8 { .. } | Estimate::Fp8RunWhole => memory::FP8_INPUTS,
        };
        // An FP8 case is checked in small shards whenever it may be (memory::FP8_SHARD_BYTES).
        let small = matches!(check, Estimate::Fp8 { .. } | Estimate::Fp8RunWhole);
        let at_once = match asked {
            Some(p) => p == 1,
            None => {
                whole.is_some()
                    || (!small && memory::whole_by_default(whole_need, available))
                    || memory::inputs_too_large(self.size(), held, available)
            }
        };
        if at_once {
            self.guard(whole_need)?;
            return Ok(1);
        }
        // The group sizes are the seed's first draws: the shards are planned on them.
        let sizes = sizes_of(spec);
        let parts = asked.unwrap_or_else(|| match check {
            Estimate::Fp8 { .. } | Estimate::Fp8RunWhole => {
                let size = self.size();
                let largest = |p| {
                    let plan = shard::plan_sizes(&sizes, size.m, size.k, size.n, p);
                    let bytes = |s: &shard::Shard| {
                        memory::fp8_gemm_bytes(s.rows.len(), size.k, size.n, s.experts.len())
                    };
                    plan.iter().map(bytes).max().unwrap_or(0)
                };
                let small =
                    memory::fewest_shards(self.experts, |p| largest(p) <= memory::FP8_SHARD_BYTES)
                        .unwrap_or(self.experts.max(1));
                // No fewer experts per shard than keep every core busy, when that fits.
                let busy = self
                    .experts
                    .div_ceil(memory::FP8_EXPERTS_PER_CORE * memory::cores())
                    .max(1);
                let p = small.min(busy);
                if memory::fits(self.need(check, Some(&sizes), p), available) {
                    p
                } else {
                    memory::shards_for(available, self.experts, |p| {
                        self.need(check, Some(&sizes), p)
                    })
                }
            }
            // Shards of at most memory::GEMM_SHARD_BYTES, or of what the largest expert
            // holds alone when that is more (a hot expert), or as few as fit.
            Estimate::Gemm(_) => {
                let need = |p| self.need(check, Some(&sizes), p);
                let budget = memory::GEMM_SHARD_BYTES.max(need(self.experts.max(1)));
                let small = memory::fewest_shards(self.experts, |p| need(p) <= budget)
                    .unwrap_or(self.experts.max(1));
                if memory::fits(need(small), available) {
                    small
                } else {
                    memory::shards_for(available, self.experts, need)
                }
            }
        });
        // The refusal names the shards, which a user may change.
        self.guard(self.need(check, Some(&sizes), parts))
            .map_err(|e| anyhow::anyhow!("{e} (checked in {parts} shards of experts, --shards)"))?;
        Ok(parts)
    }

    /// Refuses `need` bytes when more than the memory available ([`memory`]), unless
    /// `--allow-large`.
    fn guard(&self, need: u64) -> anyhow::Result<()> {
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
    match verify {
        Verify::Full => check::<Gemm, _>(&a, &spec, &spec, Estimate::Gemm(verify), None),
        Verify::Fast => check::<GemmFast, _>(&a, &spec, &spec, Estimate::Gemm(verify), None),
    }
}

/// The check of `spec` (whose grouped GEMM is `gemm`) as op `O` ([`Gemm`], [`GemmFast`],
/// [`Fp8Gemm`] or [`Fp8GemmFast`]: the same implementations, another comparison), whole or in
/// shards of experts ([`GemmFlags::shards`]; `case_whole` says why the case cannot be sharded).
fn check<O, S>(
    a: &GemmFlags,
    spec: &S,
    gemm: &GemmSpec,
    estimate: Estimate,
    case_whole: Option<String>,
) -> anyhow::Result<ExitCode>
where
    O: Backends + Reported + Sharded,
    S: pipeline::Generate<O>,
{
    let imp = registry::build::<O>(&a.imp.choice(a.declared())).map_err(anyhow::Error::msg)?;
    // An FP8 implementation that is not run in shards (a kernel under test) runs on the whole
    // case; its outputs may still be checked in shards. Shards the generator cannot make on
    // their own are cut from the whole case's inputs, held throughout.
    let estimate = match estimate {
        Estimate::Fp8 { .. } if !imp.shardable() => Estimate::Fp8RunWhole,
        Estimate::Fp8 { .. } => Estimate::Fp8 {
            whole_inputs: spec.shards().is_none(),
        },
        other => other,
    };
    let parts = a.shards(gemm, estimate, imp.as_ref(), case_whole)?;
    let run = if parts > 1 && matches!(estimate, Estimate::Fp8RunWhole) {
        eprintln!(
            "moecheck: running {} on the whole FP8 case, then checking its outputs in {parts} shards of consecutive experts, one shard's references held at a time (the report is the whole case's)",
            imp.name()
        );
        pipeline_sharded::run_whole_checked_in_shards(spec, imp.as_ref(), parts)?
    } else if parts > 1 {
        let what = match estimate {
            Estimate::Gemm(_) => "case",
            Estimate::Fp8 { .. } | Estimate::Fp8RunWhole => "FP8 case",
        };
        eprintln!(
            "moecheck: checking the {what} in {parts} shards of consecutive experts, one shard's outputs held at a time ({} computes each expert on its own; the report is the whole case's)",
            imp.name()
        );
        pipeline_sharded::run_sharded(spec, imp.as_ref(), parts)?
    } else {
        pipeline::run(spec, Some(imp.as_ref()), a.dump.as_deref())?
    };
    report::finish(&pipeline::report(&run), a.json)
}

/// `moecheck gemm --dtype fp8|e4m3|e5m2`.
fn run_fp8(a: GemmFlags) -> anyhow::Result<ExitCode> {
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
    let fast_applies = spec.recipe.fast_applies();
    let verify = match (a.verify, fast_applies) {
        (Some(Verify::Fast), Some(why)) => anyhow::bail!("--verify fast: {why}"),
        (Some(v), _) => v,
        (None, Some(_)) => Verify::Full,
        (None, None) => Verify::default_for(spec.gemm.work()),
    };
    let whole = spec.recipe.shard_local();
    // Whether the inputs are held whole is the generator's to say (`check`).
    let fp8 = Estimate::Fp8 { whole_inputs: true };
    match verify {
        Verify::Full => check::<Fp8Gemm, _>(&a, &spec, &spec.gemm, fp8, whole),
        Verify::Fast => check::<Fp8GemmFast, _>(&a, &spec, &spec.gemm, fp8, whole),
    }
}

/// Which memory model sizes a check ([`memory`]).
#[derive(Debug, Clone, Copy)]
enum Estimate {
    /// The grouped GEMM under a verification mode.
    Gemm(Verify),
    /// The FP8 grouped GEMM, its shards made on their own or (`whole_inputs`) cut from the
    /// whole case's inputs.
    Fp8 { whole_inputs: bool },
    /// The FP8 grouped GEMM of an implementation that is not run in shards (a kernel under
    /// test, or a model whose planted bug reads across experts): it runs on the whole case,
    /// whose outputs are held whole while they are checked a shard at a time.
    Fp8RunWhole,
}
