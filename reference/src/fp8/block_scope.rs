//! Block scopes of the FP8 grouped GEMM (`--lhs-scope block:1x128`, `--rhs-scope
//! block:128x128`, `mx:32`): which tile of which copy of an operand shares one scale, for each
//! pass. The per-block recipe (amax, scale, cast) is [`super::block`]'s.
//!
//! ## Which copy each pass reads
//! Every block runs along the **contraction** dimension of the pass that reads it, so that a
//! kernel can accumulate a block's products in f32 and scale the partial sum once:
//!
//! | pass  | left operand, tiles                          | right operand, tiles                                  |
//! |-------|----------------------------------------------|-------------------------------------------------------|
//! | fwd   | `lhs (M, K)` row-wise, `1 × C` along K        | `rhs_g (K, N)`: `R × C` (DeepGEMM) or `S × 1` along K (MX) |
//! | dgrad | `dout (M, N)` row-wise, `1 × C` along N       | `rhs_g`: the same `R × C` bytes, used transposed (DeepGEMM) or a second copy in `1 × S` tiles along N (MX) |
//! | wgrad | `lhs` column-wise, `C × 1` along M, per group | `dout` column-wise, `C × 1` along M, per group          |
//!
//! * **Column-wise copies** (wgrad) are quantised again from the float32 input, in tiles of
//!   `C` rows that **restart at each group's first row** (a tile never holds two experts'
//!   tokens; the last tile of a group may be partial). DeepSeek-V3's report (§3.3.2) caches
//!   activations in `1 × 128` tiles for the forward pass and `128 × 1` for the backward;
//!   Transformer Engine's MXFP8 quantises its row-wise and column-wise copies separately
//!   from the high-precision tensor ("transposing a quantized tensor is not supported, due
//!   to loss of precision", TE's MXFP8 documentation).
//! * **rhs in dgrad** (the declared convention): a `block:RxC` weight is read with the same
//!   bytes and the transposed scale grid (DeepGEMM's `per_block_cast_to_fp8` weights, square
//!   `128 × 128` blocks, are transposable: the dgrad contraction along N meets blocks of `C`);
//!   an `mx:S` weight is quantised a second time in `1 × S` tiles along N (TE's MXFP8
//!   column-wise copy of the weight). Where both conventions could apply they agree: the
//!   second copy of a `block:RxC` weight in `R × C` tiles is the first one (a test).
//! * Scopes that are not blocks (`tensor`, `group`, `expert`) keep their meaning: one scale
//!   for the scope, the column-wise copy the same bytes.
//! * **Tail rows** (dropped tokens) are in no block: their bytes are 0, as for the other
//!   scopes.
//!
//! `lhs`/`dout` block scopes are `1 × C` (`block:1xC` or `mx:C`); `rhs` takes any `R × C` or
//! `mx:S`. How a recipe names them (`ScopeKind::Block`, `case.json`'s strings) and which
//! recipes are refused is `block_recipe.rs`.

use std::fmt;

use super::block::{BlockRecipe, DeepGemmCast, MxRounding};

/// One operand's block scope: the tile in its own layout (`lhs (M, K)`, `dout (M, N)`, an
/// expert's `rhs (K, N)`) and how a tile's scale and cast are computed. For MX `rows` is 1
/// and `cols` the block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockScope {
    pub rows: usize,
    pub cols: usize,
    pub recipe: BlockRecipe,
}

/// The `--block-recipe` name of a recipe: `deepgemm`, `deepgemm-reciprocal`,
/// `deepgemm-ue8m0`, `floor`, `rceil` (as `moecheck fp8 quantize` takes them).
pub fn recipe_name(r: BlockRecipe) -> &'static str {
    match r {
        BlockRecipe::DeepGemm {
            cast: DeepGemmCast::Mul,
            ue8m0: false,
        } => "deepgemm",
        BlockRecipe::DeepGemm { ue8m0: true, .. } => "deepgemm-ue8m0",
        BlockRecipe::DeepGemm { .. } => "deepgemm-reciprocal",
        BlockRecipe::Mx {
            rounding: MxRounding::Floor,
        } => "floor",
        BlockRecipe::Mx {
            rounding: MxRounding::Rceil,
        } => "rceil",
    }
}

/// The recipe named `name` for a `block:` (`mx = false`) or `mx:` scope; `None` if the name
/// is not one of that kind's.
pub fn parse_recipe(mx: bool, name: &str) -> Option<BlockRecipe> {
    let all = if mx {
        &[
            BlockRecipe::Mx {
                rounding: MxRounding::Floor,
            },
            BlockRecipe::Mx {
                rounding: MxRounding::Rceil,
            },
        ][..]
    } else {
        &[
            BlockRecipe::DeepGemm {
                cast: DeepGemmCast::Mul,
                ue8m0: false,
            },
            BlockRecipe::DeepGemm {
                cast: DeepGemmCast::Reciprocal,
                ue8m0: false,
            },
            BlockRecipe::DeepGemm {
                cast: DeepGemmCast::Reciprocal,
                ue8m0: true,
            },
        ][..]
    };
    all.iter().copied().find(|r| recipe_name(*r) == name)
}

impl BlockScope {
    /// `mx:S` (one E8M0 scale per `S` elements along each pass's contraction).
    pub fn is_mx(&self) -> bool {
        matches!(self.recipe, BlockRecipe::Mx { .. })
    }

    /// `block:RxC` or `mx:S`, with the recipe after a `/` (`/deepgemm` or `/floor` when
    /// absent). The error says what is wrong, without a flag name.
    pub fn parse(s: &str) -> Result<BlockScope, String> {
        let (shape, recipe) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let positive = |v: &str, what: &str| match v.parse::<usize>() {
            Ok(x) if x > 0 => Ok(x),
            _ => Err(format!("{s}: {what} {v:?} is not a positive integer")),
        };
        let (rows, cols, mx) = if let Some(rc) = shape.strip_prefix("block:") {
            let Some((r, c)) = rc.split_once('x') else {
                return Err(format!("{s}: expected block:RxC (e.g. block:1x128)"));
            };
            (positive(r, "rows")?, positive(c, "columns")?, false)
        } else if let Some(n) = shape.strip_prefix("mx:") {
            (1, positive(n, "block size")?, true)
        } else {
            return Err(format!("{s}: not a block scope (block:RxC or mx:N)"));
        };
        let name = recipe.unwrap_or(if mx { "floor" } else { "deepgemm" });
        let recipe = parse_recipe(mx, name).ok_or_else(|| {
            format!(
                "{s}: {name} is not a recipe of {} (expected {})",
                if mx { "mx:N" } else { "block:RxC" },
                if mx {
                    "floor or rceil"
                } else {
                    "deepgemm, deepgemm-reciprocal or deepgemm-ue8m0"
                }
            )
        })?;
        Ok(BlockScope { rows, cols, recipe })
    }

    /// The block length along the contraction of the pass that reads it (module docs'
    /// table): `rows` for a `block:RxC` weight in the forward pass (along K), `cols`
    /// otherwise.
    pub fn contraction_len(&self, rhs_fwd: bool) -> usize {
        if rhs_fwd && !self.is_mx() {
            self.rows
        } else {
            self.cols
        }
    }
}

impl fmt::Display for BlockScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = recipe_name(self.recipe);
        if self.is_mx() {
            write!(f, "mx:{}/{name}", self.cols)
        } else {
            write!(f, "block:{}x{}/{name}", self.rows, self.cols)
        }
    }
}
