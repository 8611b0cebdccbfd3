//! Host wrappers of kernels/fp8.cu on plain slices (device 0): the recipe over contiguous
//! scopes ([`quantize`]), the per-group column-wise copy ([`transpose_groups`]) and one pass of
//! the FP8 grouped GEMM ([`fp8_grouped_gemm`]). The kernels themselves are checked on the CPU
//! (tests/host_kernels/fp8.rs); these wrappers only run with a GPU.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use moecheck_reference::format::Format;

use super::device::{device, CudaError};
use super::gemm::upload;
use super::kernels::{kernel_name, KernelModule};

/// The recipe's outputs for each scope (see kernels/fp8.cu for the formulas).
#[derive(Debug, Clone, PartialEq)]
pub struct Quantized {
    /// FP8 bit patterns, one per element of `x` (elements outside every scope are 0).
    pub q: Vec<u8>,
    pub amax: Vec<f32>,
    pub scale: Vec<f32>,
    pub scale_inv: Vec<f32>,
}

/// Checks that `bounds` are scope boundaries of an array of `len` elements: at least two
/// entries, non-decreasing, starting at 0, ending at most at `len`, at most 65535 scopes.
pub fn check_bounds(bounds: &[i64], len: usize) -> Result<(), String> {
    if bounds.len() < 2 {
        return Err("bounds need at least two entries (one scope)".into());
    }
    if bounds.len() - 1 > super::plan::MAX_GRID_Y {
        return Err(format!(
            "{} scopes, at most {}",
            bounds.len() - 1,
            super::plan::MAX_GRID_Y
        ));
    }
    if bounds[0] != 0 {
        return Err(format!("bounds start at {}, not 0", bounds[0]));
    }
    if let Some(w) = bounds.windows(2).find(|w| w[1] < w[0]) {
        return Err(format!("bounds decrease from {} to {}", w[0], w[1]));
    }
    let last = *bounds.last().expect("two entries");
    if last as u64 > len as u64 {
        return Err(format!("bounds end at {last}, past the {len} elements"));
    }
    Ok(())
}

/// Quantises `x` per scope to `format` (E4M3 or E5M2) with the saturating recipe.
pub fn quantize(x: &[f32], bounds: &[i64], format: Format) -> Result<Quantized, CudaError> {
    let fp8_max: f32 = match format {
        Format::E4m3 => 448.0,
        Format::E5m2 => 57344.0,
        other => {
            return Err(CudaError::Driver(format!(
                "{} is not an FP8 format",
                other.name()
            )))
        }
    };
    check_bounds(bounds, x.len()).map_err(CudaError::Driver)?;
    let dev = device()?;
    let scopes = (bounds.len() - 1) as i32;
    let xs = upload(&dev, x)?;
    let bs = upload(&dev, bounds)?;
    let mut amax = dev.stream.alloc_zeros::<f32>(scopes as usize)?;
    let mut scale = dev.stream.alloc_zeros::<f32>(scopes as usize)?;
    let mut scale_inv = dev.stream.alloc_zeros::<f32>(scopes as usize)?;
    let mut q = dev.stream.alloc_zeros::<u8>(x.len().max(1))?;

    let f = dev.function(KernelModule::Fp8, "fp8_amax_f32")?;
    let mut b = dev.stream.launch_builder(&f);
    // fp8_amax_f32(x [device f32, len], bounds [device i64, scopes+1], scopes, amax [device f32, scopes])
    b.arg(&xs).arg(&bs).arg(&scopes).arg(&mut amax);
    // SAFETY: one block per scope; each reads x inside [bounds[s], bounds[s+1]) (checked to lie
    // within x) and writes amax[s], s < scopes.
    unsafe {
        b.launch(LaunchConfig {
            grid_dim: (scopes as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;

    let f = dev.function(KernelModule::Fp8, "fp8_scale_f32")?;
    let mut b = dev.stream.launch_builder(&f);
    // fp8_scale_f32(amax [device, n], n, fp8_max, scale [device, n], scale_inv [device, n])
    b.arg(&amax)
        .arg(&scopes)
        .arg(&fp8_max)
        .arg(&mut scale)
        .arg(&mut scale_inv);
    // SAFETY: threads i < n read amax[i] and write scale[i], scale_inv[i]; all have n entries.
    unsafe {
        b.launch(LaunchConfig {
            grid_dim: ((scopes as u32).div_ceil(256), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;

    let widest = bounds
        .windows(2)
        .map(|w| (w[1] - w[0]) as usize)
        .max()
        .unwrap_or(0);
    if let Some((blocks, threads)) = super::plan::grid_1d(widest, 256, 4096) {
        let f = dev.function(KernelModule::Fp8, &kernel_name("fp8_cast", format))?;
        let mut b = dev.stream.launch_builder(&f);
        // fp8_cast_<fmt>(x [device f32], bounds [device i64], scopes, scale [device f32, scopes], q [device u8, len])
        b.arg(&xs).arg(&bs).arg(&scopes).arg(&scale).arg(&mut q);
        // SAFETY: blockIdx.y = scope < scopes; each thread touches x[i], q[i] for i inside its
        // scope's range, which lies within x and q (same length).
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (blocks, scopes as u32, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            })
        }?;
    }
    let mut qv = dev.stream.clone_dtoh(&q)?;
    qv.truncate(x.len());
    Ok(Quantized {
        q: qv,
        amax: dev.stream.clone_dtoh(&amax)?,
        scale: dev.stream.clone_dtoh(&scale)?,
        scale_inv: dev.stream.clone_dtoh(&scale_inv)?,
    })
}

fn launch_cfg(grid: (u32, u32), threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.0, grid.1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The column-wise copy of a `(rows, cols)` byte array `q` whose first `Σ group_sizes` rows are
/// grouped: group g's `(size_g, cols)` block becomes `(cols, size_g)` at the same offset.
/// Tail bytes are 0.
pub fn transpose_groups(
    q: &[u8],
    cols: usize,
    group_sizes: &[usize],
) -> Result<Vec<u8>, CudaError> {
    let used: usize = group_sizes.iter().sum();
    if cols == 0 || !q.len().is_multiple_of(cols) || used * cols > q.len() {
        return Err(CudaError::Driver(format!(
            "transpose_groups: {} bytes do not hold the {used} grouped rows of {cols} columns",
            q.len()
        )));
    }
    let dev = device()?;
    let offs: Vec<i32> = moecheck_reference::gemm::case::offsets(group_sizes)
        .iter()
        .map(|&o| i32::try_from(o).map_err(|_| CudaError::Driver("rows exceed i32".into())))
        .collect::<Result<_, _>>()?;
    let qs = upload(&dev, q)?;
    let os = upload(&dev, &offs)?;
    let mut qt = dev.stream.alloc_zeros::<u8>(q.len().max(1))?;
    if let Some((blocks, threads)) = super::plan::grid_1d(used * cols, 256, 1 << 16) {
        let f = dev.function(KernelModule::Fp8, "fp8_transpose_groups_u8")?;
        let (c, g) = (cols as i64, group_sizes.len() as i32);
        let mut b = dev.stream.launch_builder(&f);
        // fp8_transpose_groups_u8(q [device u8, rows*cols], cols, offsets [device i32, G+1],
        //                         groups, qt [device u8, rows*cols])
        b.arg(&qs).arg(&c).arg(&os).arg(&g).arg(&mut qt);
        // SAFETY: the kernel reads q[i] and writes one qt byte per i < offsets[G]*cols, inside
        // both buffers (checked above).
        unsafe { b.launch(launch_cfg((blocks, 1), threads)) }?;
    }
    let mut v = dev.stream.clone_dtoh(&qt)?;
    v.truncate(q.len());
    Ok(v)
}

/// One pass of the FP8 grouped GEMM, operands already quantised (see kernels/fp8.cu):
///
/// | pass  | `a`                                   | `b`                               | `sinv_a` | `sinv_b` | output |
/// |-------|---------------------------------------|-----------------------------------|----------|----------|--------|
/// | fwd   | lhs E4M3 row-wise `(M, K)`            | rhs E4M3 `(G, K, N)`              | lhs, per group | rhs, per expert | `(M, N)` |
/// | dgrad | dout E5M2 row-wise `(M, N)`           | rhs E4M3 `(G, K, N)`              | dout, per group | rhs, per expert | `(M, K)` |
/// | wgrad | lhs E4M3 column-wise (`M·K` bytes)    | dout E5M2 column-wise (`M·N`)     | lhs, per group | dout, per group | `(G, K, N)` |
///
/// `out = fl32(fl32(Σ qa·qb) · sinv_a[g]) · sinv_b[g]`, f32 accumulation in order; tails and
/// empty experts are exact zeros. Scale arrays have one entry per group (`G`), never compacted.
#[allow(clippy::too_many_arguments)]
pub fn fp8_grouped_gemm(
    pass: moecheck_reference::gemm::Pass,
    a: &[u8],
    b: &[u8],
    sinv_a: &[f32],
    sinv_b: &[f32],
    group_sizes: &[usize],
    m: usize,
    k: usize,
    n: usize,
) -> Result<Vec<f32>, CudaError> {
    use moecheck_reference::gemm::Pass;
    let g = group_sizes.len();
    let (a_len, b_len, out_len, name) = match pass {
        Pass::Fwd => (m * k, g * k * n, m * n, "fp8_grouped_gemm_fwd_e4m3_e4m3"),
        Pass::Dgrad => (m * n, g * k * n, m * k, "fp8_grouped_gemm_dgrad_e5m2_e4m3"),
        Pass::Wgrad => (m * k, m * n, g * k * n, "fp8_grouped_gemm_wgrad_e4m3_e5m2"),
    };
    if a.len() != a_len || b.len() != b_len || sinv_a.len() != g || sinv_b.len() != g {
        return Err(CudaError::Driver(format!(
            "fp8_grouped_gemm {pass}: got a {} b {} scales {}/{}, want a {a_len} b {b_len} scales {g}",
            a.len(),
            b.len(),
            sinv_a.len(),
            sinv_b.len()
        )));
    }
    let plan = super::plan::plan_tiles(pass, group_sizes, m, k, n)
        .map_err(|e| CudaError::Driver(e.to_string()))?;
    let dev = device()?;
    let mut out = super::gemm::poisoned_output(&dev, out_len)?;
    if let Some((gx, gy)) = plan.grid() {
        let (da, db) = (upload(&dev, a)?, upload(&dev, b)?);
        let (sa, sb) = (upload(&dev, sinv_a)?, upload(&dev, sinv_b)?);
        let offs: Vec<i32> = moecheck_reference::gemm::case::offsets(group_sizes)
            .iter()
            .map(|&o| o as i32) // plan_tiles checked that M fits i32
            .collect();
        let os = upload(&dev, &offs)?;
        let tiles = upload(&dev, &plan.flat())?;
        let f = dev.function(KernelModule::Fp8, name)?;
        let nt = plan.tiles.len() as i32;
        let (mi, ki, ni, gi) = (m as i64, k as i64, n as i64, g as i32);
        let mut lb = dev.stream.launch_builder(&f);
        // (a [device u8], b [device u8], sinv_a [device f32, G], sinv_b [device f32, G],
        //  out [device f32, out_len], offsets [device i32, G+1], tiles [device i32, nt*3],
        //  num_tiles, M, K, N (i64), G)
        lb.arg(&da)
            .arg(&db)
            .arg(&sa)
            .arg(&sb)
            .arg(&mut out)
            .arg(&os)
            .arg(&tiles);
        lb.arg(&nt).arg(&mi).arg(&ki).arg(&ni).arg(&gi);
        // SAFETY: buffers have the lengths checked above; the schedule covers only in-range
        // output elements and the kernel bounds-checks every access against M, K, N, G.
        super::device::timed(&dev, || {
            unsafe { lb.launch(launch_cfg((gx, gy), super::plan::TILED_THREADS)) }?;
            Ok(())
        })?;
    }
    if out_len == 0 {
        return Ok(Vec::new());
    }
    let mut v = dev.stream.clone_dtoh(&out)?;
    v.truncate(out_len);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::check_bounds;

    #[test]
    fn scope_bounds_are_checked_before_any_launch() {
        assert!(check_bounds(&[0, 3, 3, 5], 5).is_ok());
        assert!(check_bounds(&[0], 5).is_err());
        assert!(check_bounds(&[1, 5], 5).is_err());
        assert!(check_bounds(&[0, 4, 2], 5).is_err());
        assert!(check_bounds(&[0, 6], 5).is_err());
    }
}
