//! Host wrapper of kernels/fp8.cu's recipe kernels on plain slices (device 0): current-tensor
//! scaling of one array over contiguous scopes. The FP8 grouped GEMM kernels
//! (`fp8_grouped_gemm_*`) and the routing kernels have no wrapper yet: they wait for the FP8
//! case type (issue 4) and the routing API (issue 3).

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
