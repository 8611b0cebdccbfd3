//! `moecheck gemm --dtype fp8`: the FP8 flags, turned into a recipe (the command itself is
//! `gemm`'s; the check, recipe-exact with the unquantised GEMM for information, the pipeline's).

use anyhow::bail;
use clap::Args;

use moecheck_reference::format::Format;
use moecheck_reference::fp8::block_scope::parse_recipe;
use moecheck_reference::fp8::{
    AccumModel, AmaxAlgo, Fp8Recipe, RecipeError, RecipeProblem, ScalingKind, ScopeKind,
};

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
    /// TE's current scaling: one scale per scope from its amax.
    Current,
    /// TE's delayed scaling: scales from an amax history.
    Delayed,
    /// DeepSeek-V3 / DeepGEMM fine-grained scaling: E4M3 everywhere, block:1x128 lhs and
    /// dout, block:128x128 rhs.
    Block,
    /// OCP MX v1.0 / TE MXFP8BlockScaling: E4M3 everywhere, mx:32 (E8M0 scales) everywhere.
    Mxfp8,
}

fn parse_accum(s: &str) -> Result<AccumModel, String> {
    AccumModel::parse(s).ok_or_else(|| {
        format!("unknown accumulation model '{s}' (expected exact, fast or fast-promote)")
    })
}

fn parse_scope(s: &str) -> Result<ScopeKind, String> {
    ScopeKind::parse(s)
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
#[command(next_help_heading = "FP8 (with --dtype fp8, e4m3 or e5m2)")]
pub struct Fp8Flags {
    /// FP8: current (amax of this tensor), delayed (amax history), or a block-scaling preset:
    /// block (DeepSeek-V3/DeepGEMM: e4m3, lhs and dout block:1x128, rhs block:128x128) or
    /// mxfp8 (OCP MX v1.0 / TE MXFP8BlockScaling: e4m3, mx:32 everywhere); explicit format
    /// and scope flags override a preset [default: current].
    #[arg(long, value_enum)]
    pub scaling: Option<ScalingArg>,
    /// FP8: accumulation model the bound and emulate use: exact (f32), fast (Hopper, ~14
    /// bits), fast-promote (fast, promoted to f32 every 128) [default: exact].
    #[arg(long, value_parser = parse_accum)]
    pub accum: Option<AccumModel>,
    /// FP8: format of lhs [default: --dtype's, e4m3 for fp8].
    #[arg(long, value_parser = super::format_in(super::FP8))]
    pub lhs_format: Option<Format>,
    /// FP8: format of rhs [default: --dtype's].
    #[arg(long, value_parser = super::format_in(super::FP8))]
    pub rhs_format: Option<Format>,
    /// FP8: format of dout (dgrad, wgrad) [default: e5m2].
    #[arg(long, value_parser = super::format_in(super::FP8))]
    pub dout_format: Option<Format>,
    /// FP8: scaling scope of lhs: group, tensor, block:1xC (one scale per C elements along K;
    /// along M within each group for wgrad's copy) or mx:C [default: group].
    #[arg(long, value_parser = parse_scope)]
    pub lhs_scope: Option<ScopeKind>,
    /// FP8: scaling scope of rhs: expert, tensor, block:RxC (R along K by C along N, read
    /// transposed by dgrad) or mx:S (along K for fwd, a second copy along N for dgrad)
    /// [default: expert].
    #[arg(long, value_parser = parse_scope)]
    pub rhs_scope: Option<ScopeKind>,
    /// FP8: scaling scope of dout: group, tensor, block:1xC (along N; along M within each
    /// group for wgrad's copy) or mx:C [default: group].
    #[arg(long, value_parser = parse_scope)]
    pub dout_scope: Option<ScopeKind>,
    /// FP8 block scopes: how a block's scale and cast are computed: deepgemm,
    /// deepgemm-reciprocal, deepgemm-ue8m0 (for block:RxC) or floor, rceil (for mx:N; TE's
    /// MXFP8 kernels round the exponent up: rceil) [default: deepgemm, floor].
    #[arg(long)]
    pub block_recipe: Option<String>,
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
            (self.block_recipe.is_some(), "--block-recipe"),
            (self.no_saturate, "--no-saturate"),
            (self.amax_history_len.is_some(), "--amax-history-len"),
            (self.amax_algo.is_some(), "--amax-algo"),
            (self.margin.is_some(), "--margin"),
        ]
        .into_iter()
        .find(|(given, _)| *given)
        .map(|(_, name)| name)
    }

    pub fn recipe(&self, dtype: Format) -> anyhow::Result<Fp8Recipe> {
        let mut r = Fp8Recipe::default();
        let preset = self.scaling.and_then(block_preset);
        let (scopes, dout_format) = match preset {
            Some((row, rhs)) => ((row, rhs, row), Format::E4m3),
            None => (
                (ScopeKind::Group, ScopeKind::Expert, ScopeKind::Group),
                Format::E5m2,
            ),
        };
        r.lhs.format = self.lhs_format.unwrap_or(dtype);
        r.rhs.format = self.rhs_format.unwrap_or(dtype);
        r.dout.format = self.dout_format.unwrap_or(dout_format);
        r.lhs.scope = self.lhs_scope.unwrap_or(scopes.0);
        r.rhs.scope = self.rhs_scope.unwrap_or(scopes.1);
        r.dout.scope = self.dout_scope.unwrap_or(scopes.2);
        if let Some(name) = &self.block_recipe {
            apply_block_recipe(&mut r, name)?;
        }
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
            ScalingArg::Current | ScalingArg::Block | ScalingArg::Mxfp8 => {
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
        if let Some((flag, why)) = r.block_refusal() {
            bail!("{flag}: {why}");
        }
        Ok(r)
    }
}

/// The row-operand and rhs scopes of a block-scaling preset (`--scaling block|mxfp8`).
/// `block`: DeepSeek-V3's fine-grained quantisation (technical report §3.3.2; DeepGEMM's
/// `per_token_cast_to_fp8` / `per_block_cast_to_fp8`). `mxfp8`: OCP Microscaling v1.0's
/// MXFP8 (Transformer Engine's `MXFP8BlockScaling`, whose `fp8_format` defaults to E4M3 for
/// every tensor, gradients included).
fn block_preset(s: ScalingArg) -> Option<(ScopeKind, ScopeKind)> {
    let p = |s: &str| ScopeKind::parse(s).expect("a preset scope parses");
    match s {
        ScalingArg::Block => Some((p("block:1x128"), p("block:128x128"))),
        ScalingArg::Mxfp8 => Some((p("mx:32"), p("mx:32"))),
        ScalingArg::Current | ScalingArg::Delayed => None,
    }
}

/// `--block-recipe NAME` on every block scope of its kind (`block:RxC` or `mx:N`).
fn apply_block_recipe(r: &mut Fp8Recipe, name: &str) -> anyhow::Result<()> {
    let mut applied = false;
    for op in [&mut r.lhs, &mut r.rhs, &mut r.dout] {
        if let ScopeKind::Block(b) = &mut op.scope {
            if let Some(recipe) = parse_recipe(b.is_mx(), name) {
                b.recipe = recipe;
                applied = true;
            }
        }
    }
    if !applied {
        let kind = if parse_recipe(true, name).is_some() {
            "an mx:N scope"
        } else if parse_recipe(false, name).is_some() {
            "a block:RxC scope"
        } else {
            bail!("--block-recipe {name}: expected deepgemm, deepgemm-reciprocal, deepgemm-ue8m0 (block:RxC) or floor, rceil (mx:N)");
        };
        bail!("--block-recipe {name}: no operand has {kind} to apply it to");
    }
    Ok(())
}

/// A recipe the library refuses, as the flag that set it (`--rhs-scope`, `--dout-format`).
fn recipe_flag_error(e: &RecipeError) -> String {
    let flag = format!("--{}-{}", e.operand.name(), e.problem.field());
    match e.problem {
        RecipeProblem::NotFp8(f) => format!("{flag} {f}: expected e4m3 or e5m2"),
        RecipeProblem::ScopeDoesNotApply(_) => format!("{flag} {}", e.why()),
    }
}
