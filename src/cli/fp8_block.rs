//! `moecheck fp8 quantize --scope block:RxC | mx:N`: one scale per block (DeepGEMM's
//! per-token / per-block casts, OCP MXFP8), from `moecheck_reference::fp8::block`.

use std::process::ExitCode;

use anyhow::bail;
use ndarray::{Array2, IxDyn};
use serde::Serialize;

use moecheck_reference::format::Format;
use moecheck_reference::fp8::block::{quantize_blocks, BlockRecipe, DeepGemmCast, MxRounding};

use std::path::Path;

use moecheck::npy;

/// What `fp8 quantize` asks of a block scope (its flags).
pub struct BlockJob<'a> {
    pub input: &'a Path,
    pub out: &'a Path,
    pub format: Format,
    pub scope: &'a str,
    pub no_saturate: bool,
    pub force: bool,
    pub json: bool,
}

/// What a block scope writes into `--out`.
pub const BLOCK_OUT_FILES: [&str; 3] = ["q.npy", "scale_inv.npy", "dequant.npy"];

/// A block scope: the block's `(rows, cols)`, its recipe, and the recipe's name as given.
pub type BlockScope = ((usize, usize), BlockRecipe, String);

/// The block shape and recipe of `--scope` (`block:RxC`, `mx:N`) and `--block-recipe`, or
/// `None` when the scope is not a block scope.
pub fn parse(scope: &str, recipe: Option<&str>) -> anyhow::Result<Option<BlockScope>> {
    let positive = |s: &str, what: &str| -> anyhow::Result<usize> {
        match s.parse::<usize>() {
            Ok(v) if v > 0 => Ok(v),
            _ => bail!("--scope {scope}: {what} {s:?} is not a positive integer"),
        }
    };
    if let Some(rc) = scope.strip_prefix("block:") {
        let Some((r, c)) = rc.split_once('x') else {
            bail!("--scope {scope}: expected block:RxC (rows x columns, e.g. block:1x128)");
        };
        let block = (positive(r, "rows")?, positive(c, "columns")?);
        let (cast, ue8m0) = match recipe.unwrap_or("deepgemm") {
            "deepgemm" => (DeepGemmCast::Mul, false),
            "deepgemm-reciprocal" => (DeepGemmCast::Reciprocal, false),
            "deepgemm-ue8m0" => (DeepGemmCast::Reciprocal, true),
            other => bail!(
                "--block-recipe {other}: block:RxC takes deepgemm, deepgemm-reciprocal or deepgemm-ue8m0"
            ),
        };
        let name = recipe.unwrap_or("deepgemm").to_string();
        return Ok(Some((block, BlockRecipe::DeepGemm { cast, ue8m0 }, name)));
    }
    if let Some(n) = scope.strip_prefix("mx:") {
        let n = positive(n, "block size")?;
        let rounding = match recipe.unwrap_or("floor") {
            "floor" => MxRounding::Floor,
            "rceil" => MxRounding::Rceil,
            other => bail!("--block-recipe {other}: mx:N takes floor or rceil"),
        };
        let name = recipe.unwrap_or("floor").to_string();
        return Ok(Some(((1, n), BlockRecipe::Mx { rounding }, name)));
    }
    if let Some(r) = recipe {
        bail!("--block-recipe {r}: only with --scope block:RxC or mx:N");
    }
    Ok(None)
}

/// The `--json` summary of a block quantisation.
#[derive(Debug, Serialize)]
struct BlockSummary {
    input: String,
    shape: Vec<usize>,
    format: Format,
    scope: String,
    recipe: String,
    /// Blocks along each axis.
    blocks: [usize; 2],
    scale_inv_min: f32,
    scale_inv_max: f32,
    zero_blocks: usize,
    out: String,
}

/// Quantises `x2` (`shape` its original shape) in blocks and writes `BLOCK_OUT_FILES`.
pub fn run(
    a: &BlockJob,
    x2: Array2<f32>,
    shape: Vec<usize>,
    (block, recipe, name): BlockScope,
) -> anyhow::Result<ExitCode> {
    if a.no_saturate {
        bail!("--no-saturate: block scopes cast as their recipes do (MX saturates; DeepGEMM's scaled values never pass the maximum)");
    }
    let inputs = [a.input];
    moecheck::pipeline::prepare_out_dir(a.out, &BLOCK_OUT_FILES, &inputs, a.force, "--out")?;
    let q = quantize_blocks(x2.view(), block, a.format, recipe);
    let dyn_shape = IxDyn(&shape);
    let bytes = q.q.clone().into_shape_with_order(dyn_shape.clone())?;
    npy::write_in(a.out, "q.npy", &bytes, "--out")?;
    npy::write_in(a.out, "scale_inv.npy", &q.scale_inv, "--out")?;
    let deq = q
        .dequantize()
        .mapv(|v| v as f32)
        .into_shape_with_order(dyn_shape)?;
    npy::write_in(a.out, "dequant.npy", &deq, "--out")?;
    let (br, bc) = block;
    let zero_blocks = (0..q.scale_inv.nrows())
        .flat_map(|i| (0..q.scale_inv.ncols()).map(move |j| (i, j)))
        .filter(|&(i, j)| {
            let (r1, c1) = (
                ((i + 1) * br).min(x2.nrows()),
                ((j + 1) * bc).min(x2.ncols()),
            );
            x2.slice(ndarray::s![i * br..r1, j * bc..c1])
                .iter()
                .all(|v| *v == 0.0)
        })
        .count();
    let s = BlockSummary {
        input: a.input.display().to_string(),
        shape,
        format: a.format,
        scope: a.scope.to_string(),
        recipe: name,
        blocks: [q.scale_inv.nrows(), q.scale_inv.ncols()],
        scale_inv_min: q.scale_inv.fold(f32::INFINITY, |m, v| m.min(*v)),
        scale_inv_max: q.scale_inv.fold(0f32, |m, v| m.max(*v)),
        zero_blocks,
        out: a.out.display().to_string(),
    };
    if a.json {
        moecheck::outln!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        moecheck::outln!(
            "{} {:?} -> {} ({} {}), {} x {} blocks of {}x{}, scale_inv in [{:e}, {:e}], {} all-zero block(s), written to {}",
            s.input,
            s.shape,
            s.format,
            s.scope,
            s.recipe,
            s.blocks[0],
            s.blocks[1],
            br,
            bc,
            s.scale_inv_min,
            s.scale_inv_max,
            s.zero_blocks,
            s.out
        );
    }
    Ok(ExitCode::SUCCESS)
}
