//! Host-side layout logic of the CUDA FP8 grouped GEMM ([`super::fp8_impl::CudaFp8`]), pure
//! Rust so that it is tested without a GPU against the reference's own layout
//! (`moecheck_reference::fp8::quantize_operands`).
//!
//! * [`row_bounds`] / [`rhs_bounds`]: the recipe's scopes as the element ranges
//!   `[bounds[s], bounds[s+1])` that kernels/fp8.cu's `fp8_amax_f32`/`fp8_cast_*` take.
//! * [`per_group`]: the GEMM kernels read one `scale_inv` per group (`G` entries); a
//!   tensor-scope operand has one, repeated `G` times.
//! * [`colwise_from_groups`]: the kernel's column-wise copy stores group `g` as a
//!   `(cols, size_g)` block at byte `off_g·cols`; the reference's [`ColumnWise`] is the full
//!   `(cols, rows)` transpose. This converts the first into the second.
//! * [`supports`]: what of the recipe the kernels implement.

use moecheck_reference::format::Format;
use moecheck_reference::fp8::{AccumModel, ColumnWise, Fp8Recipe, ScalingKind, ScopeKind};
use ndarray::Array2;

/// The accumulation the FP8 kernels really perform: FP8 decoded to f32, products exact in
/// f32, summed with `fmaf` in order (no tensor-core fast accumulation).
pub const ACCUMULATION: AccumModel = AccumModel::Exact;

/// Element bounds of the scopes of a row operand `(rows, cols)` whose groups start at
/// `offsets` (`[0, …, Σ sizes]`): one scope per group, or for [`ScopeKind::Tensor`] one scope
/// over the rows in groups (tail rows are in no scope), as `Fp8GemmCase::row_scope`.
pub fn row_bounds(kind: ScopeKind, offsets: &[usize], cols: usize) -> Vec<i64> {
    match kind {
        ScopeKind::Group => offsets.iter().map(|&o| (o * cols) as i64).collect(),
        _ => vec![0, (offsets.last().copied().unwrap_or(0) * cols) as i64],
    }
}

/// Element bounds of the scopes of `rhs (G, K, N)`: one per expert, or one for the tensor.
pub fn rhs_bounds(kind: ScopeKind, g: usize, k: usize, n: usize) -> Vec<i64> {
    match kind {
        ScopeKind::Expert => (0..=g).map(|e| (e * k * n) as i64).collect(),
        _ => vec![0, (g * k * n) as i64],
    }
}

/// One `scale_inv` per group: `sinv` itself when it has `g` entries, its single entry
/// repeated `g` times for a tensor scope. Any other length is an error.
pub fn per_group(sinv: &[f32], g: usize) -> Result<Vec<f32>, String> {
    match sinv.len() {
        l if l == g => Ok(sinv.to_vec()),
        1 => Ok(vec![sinv[0]; g]),
        l => Err(format!(
            "{l} scale_inv entries for {g} groups (want {g} or 1)"
        )),
    }
}

/// The reference's full column-wise copy `(cols, rows)` of the kernel's per-group one:
/// `qt[(c, off_g + j)] = blocks[off_g·cols + c·size_g + j]`; tail columns (rows past
/// `Σ group_sizes`) are 0, as the reference's transpose of their 0 bytes.
pub fn colwise_from_groups(
    blocks: &[u8],
    rows: usize,
    cols: usize,
    group_sizes: &[usize],
) -> Result<Array2<u8>, String> {
    let used: usize = group_sizes.iter().sum();
    if blocks.len() != rows * cols || used > rows {
        return Err(format!(
            "{} bytes for ({rows}, {cols}) with {used} rows in groups",
            blocks.len()
        ));
    }
    let mut qt = Array2::<u8>::zeros((cols, rows));
    let mut off = 0;
    for &size in group_sizes {
        for c in 0..cols {
            for j in 0..size {
                qt[(c, off + j)] = blocks[off * cols + c * size + j];
            }
        }
        off += size;
    }
    Ok(qt)
}

/// [`colwise_from_groups`] with the row-wise scope layout: the reference's [`ColumnWise`].
pub fn columnwise(
    blocks: &[u8],
    rows: usize,
    cols: usize,
    group_sizes: &[usize],
    scope_offsets: Vec<usize>,
    scale_inv: Vec<f32>,
) -> Result<ColumnWise, String> {
    Ok(ColumnWise {
        qt: colwise_from_groups(blocks, rows, cols, group_sizes)?,
        offsets: scope_offsets,
        scale_inv,
    })
}

/// Whether the kernels implement `recipe` (one line naming the CLI flag otherwise): HYBRID
/// formats (E4M3 lhs and rhs, E5M2 dout: the only GEMM kernels there are), saturating casts,
/// current scaling, the kernels' own accumulation ([`ACCUMULATION`]).
pub fn supports(recipe: &Fp8Recipe) -> Result<(), String> {
    for (flag, scope) in [
        ("--lhs-scope", recipe.lhs.scope),
        ("--rhs-scope", recipe.rhs.scope),
        ("--dout-scope", recipe.dout.scope),
    ] {
        if let ScopeKind::Block(b) = scope {
            return Err(format!(
                "{flag} {b}: the CUDA FP8 kernels take one scale per group, expert or tensor"
            ));
        }
    }
    for (flag, got, want) in [
        ("--lhs-format", recipe.lhs.format, Format::E4m3),
        ("--rhs-format", recipe.rhs.format, Format::E4m3),
        ("--dout-format", recipe.dout.format, Format::E5m2),
    ] {
        if got != want {
            return Err(format!(
                "{flag} {got}: the CUDA FP8 kernels take {want} (lhs e4m3, rhs e4m3, dout e5m2)"
            ));
        }
    }
    if !recipe.saturate {
        return Err("--no-saturate: the CUDA FP8 casts saturate (cvt.rn.satfinite)".into());
    }
    if recipe.scaling != ScalingKind::Current {
        return Err("--scaling delayed: the CUDA backend computes current scales itself".into());
    }
    if recipe.accumulation != ACCUMULATION {
        return Err(format!(
            "--accum {}: the CUDA FP8 kernel accumulates in exact f32 (declare --accum exact)",
            recipe.accumulation
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use moecheck_reference::fp8::{quantize_operands, Fp8GemmCase};
    use moecheck_reference::gemm::{GroupedGemmCase, Passes, TailContract};
    use ndarray::Array3;

    /// Groups with an empty one first and one in the middle, a dropped tail row, magnitudes
    /// per group far apart (so that a wrong scale pairing changes bytes).
    fn case(lhs_scope: ScopeKind, rhs_scope: ScopeKind, dout_scope: ScopeKind) -> Fp8GemmCase {
        let sizes = vec![0, 3, 0, 2];
        let (m, k, n) = (6, 3, 2);
        let v = |i: usize, e: i32| ((i * 7919 % 23) as f32 - 11.0) * 2f32.powi(e);
        let row_exp = |r: usize| [-9, -9, -9, 6, 6, 0][r];
        let lhs = Array2::from_shape_fn((m, k), |(r, c)| v(r * k + c, row_exp(r)));
        let dout = Array2::from_shape_fn((m, n), |(r, c)| v(r * n + c + 5, -row_exp(r)));
        let rhs = Array3::from_shape_fn((4, k, n), |(e, a, b)| v(e * 31 + a * n + b, e as i32 * 3));
        let mut recipe = Fp8Recipe::default();
        recipe.lhs.scope = lhs_scope;
        recipe.rhs.scope = rhs_scope;
        recipe.dout.scope = dout_scope;
        Fp8GemmCase {
            gemm: GroupedGemmCase {
                lhs,
                rhs: rhs.into(),
                group_sizes: sizes,
                dout: Some(dout),
                dtype: Format::F32,
                out_dtype: Format::F32,
                tail: TailContract::Zero,
            },
            recipe,
            given_scales: None,
        }
    }

    /// The kernel's per-group layout of row-wise bytes `q (rows, cols)`, transcribed from
    /// kernels/fp8.cu's `fp8_transpose_groups_u8` (`qt[off·cols + c·size + (r-off)]`).
    fn kernel_layout(q: &Array2<u8>, sizes: &[usize]) -> Vec<u8> {
        let cols = q.ncols();
        let mut out = vec![0u8; q.len()];
        let mut off = 0;
        for &size in sizes {
            for r in off..off + size {
                for c in 0..cols {
                    out[off * cols + c * size + (r - off)] = q[(r, c)];
                }
            }
            off += size;
        }
        out
    }

    #[test]
    fn bounds_are_the_reference_scopes_times_cols() {
        for (ls, rs) in [
            (ScopeKind::Group, ScopeKind::Expert),
            (ScopeKind::Tensor, ScopeKind::Tensor),
        ] {
            let c = case(ls, rs, ls);
            let ops = quantize_operands(&c, Passes::ALL);
            let (g, k, n) = c.gemm.rhs.dim();
            let times = |o: &[usize], cols: usize| -> Vec<i64> {
                o.iter().map(|&x| (x * cols) as i64).collect()
            };
            assert_eq!(
                row_bounds(ls, &c.gemm.offsets(), k),
                times(&ops.lhs.offsets, k)
            );
            let d = ops.dout.as_ref().unwrap();
            assert_eq!(row_bounds(ls, &c.gemm.offsets(), n), times(&d.offsets, n));
            assert_eq!(rhs_bounds(rs, g, k, n), times(&ops.rhs.offsets, n));
        }
    }

    #[test]
    fn per_group_scales_are_what_each_groups_rows_use_in_the_reference() {
        for scope in [ScopeKind::Group, ScopeKind::Tensor] {
            let c = case(scope, ScopeKind::Tensor, scope);
            let ops = quantize_operands(&c, Passes::ALL);
            let g = c.gemm.groups();
            let lhs = per_group(&ops.lhs.scale_inv, g).unwrap();
            let rhs = per_group(&ops.rhs.scale_inv, g).unwrap();
            let off = c.gemm.offsets();
            for e in 0..g {
                if off[e + 1] > off[e] {
                    let s = ops.lhs.scope_of_row(off[e]).unwrap();
                    assert_eq!(lhs[e].to_bits(), ops.lhs.scale_inv[s].to_bits());
                }
                assert_eq!(rhs[e].to_bits(), ops.rhs.scale_inv[0].to_bits());
            }
            // Distinct magnitudes per group: per-group scales differ, so a repeated tensor
            // scale is only right for the tensor scope.
            if scope == ScopeKind::Group {
                assert_ne!(lhs[1], lhs[3]);
            }
        }
        assert!(per_group(&[1.0, 2.0], 3).is_err());
        assert_eq!(per_group(&[], 0).unwrap(), Vec::<f32>::new());
    }

    #[test]
    fn kernel_colwise_copy_converts_to_the_reference_transpose() {
        let c = case(ScopeKind::Group, ScopeKind::Expert, ScopeKind::Group);
        let ops = quantize_operands(&c, Passes::ALL);
        let sizes = &c.gemm.group_sizes;
        for (row, col) in [
            (&ops.lhs, &ops.lhs_col),
            (ops.dout.as_ref().unwrap(), ops.dout_col.as_ref().unwrap()),
        ] {
            let (rows, cols) = row.q.dim();
            let blocks = kernel_layout(&row.q, sizes);
            // The kernel layout is not the plain transpose (groups of 3 and 2 rows).
            assert_ne!(blocks, row.q.t().iter().copied().collect::<Vec<_>>());
            let got = columnwise(
                &blocks,
                rows,
                cols,
                sizes,
                row.offsets.clone(),
                row.scale_inv.clone(),
            )
            .unwrap();
            assert_eq!(&got, col);
            got.agrees_with(row).unwrap();
        }
        assert!(colwise_from_groups(&[0; 5], 2, 3, &[1, 1]).is_err());
        assert!(colwise_from_groups(&[0; 6], 2, 3, &[2, 1]).is_err());
    }

    #[test]
    fn only_the_recipe_the_kernels_implement_is_accepted() {
        assert!(supports(&Fp8Recipe::default()).is_ok());
        let mut r = Fp8Recipe::default();
        r.lhs.scope = ScopeKind::Tensor;
        r.rhs.scope = ScopeKind::Tensor;
        assert!(supports(&r).is_ok());
        let mut r = Fp8Recipe::default();
        r.dout.format = Format::E4m3;
        assert!(supports(&r).unwrap_err().contains("--dout-format"));
        let mut r = Fp8Recipe::default();
        r.lhs.format = Format::E5m2;
        assert!(supports(&r).unwrap_err().contains("--lhs-format"));
        let r = Fp8Recipe {
            saturate: false,
            ..Fp8Recipe::default()
        };
        assert!(supports(&r).unwrap_err().contains("--no-saturate"));
        let r = Fp8Recipe {
            accumulation: AccumModel::Fast,
            ..Fp8Recipe::default()
        };
        assert!(supports(&r).unwrap_err().contains("--accum"));
        let r = Fp8Recipe {
            scaling: ScalingKind::Delayed {
                history_len: 4,
                algo: moecheck_reference::fp8::AmaxAlgo::Max,
                margin: 0,
            },
            ..Fp8Recipe::default()
        };
        assert!(supports(&r).unwrap_err().contains("--scaling"));
    }
}
