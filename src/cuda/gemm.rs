//! `cuda`: moecheck's own grouped GEMM kernels (kernels/grouped_gemm.cu) as an implementation.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits};
use moecheck_reference::format::{round_to, Format, Overflow};
use moecheck_reference::gemm::Gemm;
use moecheck_reference::gemm::{
    Accumulator, GemmOutputs, GroupedGemmCase, Pass, Passes, Precision, Weights,
};
use moecheck_reference::op::{Implementation, RunError};
use ndarray::{Array2, Array3};

use super::device::{device, timed, CudaError, Device};
use super::kernels::{kernel_name, KernelModule};
use super::plan::{grid_1d, plan_tiles, MMA_THREADS, TILED_THREADS};

/// Which kernel family runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// mma.sync tensor cores for bf16/f16 on sm_80+, the tiled kernel otherwise.
    Auto,
    /// Always the shared-memory SIMT kernel.
    Tiled,
}

/// Our kernels on device 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaGemm {
    pub variant: Variant,
}

impl CudaGemm {
    pub fn name_for(variant: Variant) -> &'static str {
        match variant {
            Variant::Auto => "cuda",
            Variant::Tiled => "cuda-tiled",
        }
    }
}

/// The output format our kernels and the f32-output cuBLAS calls really deliver for a case
/// that asks `out_dtype`: the f32 result rounded once to `out_dtype`, except that an f64
/// output is still only f32-accurate (so f32 is declared).
pub fn declared_output(out_dtype: Format) -> Format {
    match out_dtype {
        Format::F64 => Format::F32,
        other => other,
    }
}

pub(crate) fn run_err(e: CudaError) -> RunError {
    RunError::new(e.to_string())
}

/// The case's values in the storage of `dtype` (bf16/f16 as raw bits), uploaded.
pub(crate) enum DevInput {
    F32(CudaSlice<f32>),
    Half(CudaSlice<u16>),
}

impl DevInput {
    pub fn ptr(&self, dev: &Device) -> u64 {
        use cudarc::driver::DevicePtr;
        match self {
            DevInput::F32(s) => s.device_ptr(&dev.stream).0,
            DevInput::Half(s) => s.device_ptr(&dev.stream).0,
        }
    }
}

/// Uploads `data`; an empty array becomes one zero element so that every kernel argument is
/// a valid device pointer (it is never read: its extent is zero).
pub(crate) fn upload<T: DeviceRepr + ValidAsZeroBits + Copy + Default>(
    dev: &Device,
    data: &[T],
) -> Result<CudaSlice<T>, CudaError> {
    if data.is_empty() {
        return Ok(dev.stream.clone_htod(&[T::default()])?);
    }
    Ok(dev.stream.clone_htod(data)?)
}

/// `f` applied to every element of `src`, in parallel chunks on all cores (the host side of
/// DeepSeek-V3-sized uploads and downloads: billions of elements).
pub(crate) fn par_map<A: Sync, B: Send + Default + Clone>(
    src: &[A],
    f: impl Fn(&A) -> B + Sync,
) -> Vec<B> {
    let mut out = vec![B::default(); src.len()];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = src.len().div_ceil(threads).max(1 << 16);
    std::thread::scope(|s| {
        for (o, i) in out.chunks_mut(chunk).zip(src.chunks(chunk)) {
            let f = &f;
            s.spawn(move || {
                for (o, i) in o.iter_mut().zip(i) {
                    *o = f(i);
                }
            });
        }
    });
    out
}

/// Uploads `values` (a standard-layout array's elements) in the storage of `dtype`.
pub(crate) fn upload_values(
    dev: &Device,
    values: &[f32],
    dtype: Format,
) -> Result<DevInput, CudaError> {
    Ok(match dtype {
        Format::F32 => DevInput::F32(upload(dev, values)?),
        // Values are representable in dtype (the case is validated), so these are exact.
        Format::Bf16 => DevInput::Half(upload(
            dev,
            &par_map(values, |&v| half::bf16::from_f32(v).to_bits()),
        )?),
        Format::F16 => DevInput::Half(upload(
            dev,
            &par_map(values, |&v| half::f16::from_f32(v).to_bits()),
        )?),
        other => {
            return Err(CudaError::Driver(format!(
                "input dtype {} is not supported by this backend (f32, bf16, f16)",
                other.name()
            )))
        }
    })
}

/// The weights on the device in `dtype`: bf16 weights held in bf16 go up as their bits,
/// without an f32 copy on the host.
pub(crate) fn upload_weights(
    dev: &Device,
    w: &Weights,
    dtype: Format,
) -> Result<DevInput, CudaError> {
    match w {
        Weights::Bf16(a) if dtype == Format::Bf16 => {
            let bits: Vec<u16> = a.iter().map(|v| v.to_bits()).collect();
            Ok(DevInput::Half(upload(dev, &bits)?))
        }
        _ => upload_values(dev, &elements(&w.f32()), dtype),
    }
}

/// The elements of an array in row-major order, without a copy when it is already standard.
pub(crate) fn elements<D: ndarray::Dimension>(
    a: &ndarray::Array<f32, D>,
) -> std::borrow::Cow<'_, [f32]> {
    match a.as_slice() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(a.iter().copied().collect()),
    }
}

/// A NaN-poisoned f32 output of `len` elements (at least one).
pub(crate) fn poisoned_output(dev: &Device, len: usize) -> Result<CudaSlice<f32>, CudaError> {
    // SAFETY: the buffer is fully written by fill_f32 below before anything reads it.
    let mut out = unsafe { dev.stream.alloc::<f32>(len.max(1)) }?;
    let f = dev.function(KernelModule::GroupedGemm, "fill_f32")?;
    if let Some((blocks, threads)) = grid_1d(len.max(1), 256, 1 << 20) {
        let n = len.max(1) as i64;
        let nan = f32::NAN;
        let mut b = dev.stream.launch_builder(&f);
        // fill_f32(float* p [device, n floats], idx_t n, float value)
        b.arg(&mut out).arg(&n).arg(&nan);
        // SAFETY: `out` holds n floats; the kernel writes p[i] for i < n only.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            })
        }?;
    }
    Ok(out)
}

/// Copies `len` floats back, rounded to `out_dtype` (the kernels write f32; rounding an f32
/// to bf16/f16 here is the same RNE a kernel epilogue does), held in f32: every value is one.
pub(crate) fn download(
    dev: &Device,
    buf: &CudaSlice<f32>,
    len: usize,
    out_dtype: Format,
) -> Result<Vec<f32>, CudaError> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let v = dev.stream.clone_dtoh(buf)?;
    Ok(par_map(&v[..len], |&x| {
        round_to(x as f64, out_dtype, Overflow::Ieee) as f32
    }))
}

impl Implementation<Gemm> for CudaGemm {
    fn name(&self) -> String {
        Self::name_for(self.variant).into()
    }
    fn is_model(&self) -> bool {
        false
    }
    fn precision(&self, case: &GroupedGemmCase) -> Precision {
        Precision {
            input: case.dtype,
            accumulator: Accumulator::any_order(Format::F32),
            output: declared_output(case.out_dtype),
        }
    }
    fn run(&self, case: &GroupedGemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
        let dev = device().map_err(run_err)?;
        self.run_on(&dev, case, passes).map_err(run_err)
    }
}

impl CudaGemm {
    fn run_on(
        &self,
        dev: &Arc<Device>,
        case: &GroupedGemmCase,
        passes: Passes,
    ) -> Result<GemmOutputs, CudaError> {
        let (m, k, n, g) = (case.m(), case.k(), case.n(), case.groups());
        let dtype = case.dtype;
        let mma = self.variant == Variant::Auto
            && dev.has_mma()
            && matches!(dtype, Format::Bf16 | Format::F16);
        let lhs = upload_values(dev, &elements(&case.lhs), dtype)?;
        let rhs = upload_weights(dev, &case.rhs, dtype)?;
        let dout = match (&case.dout, passes.needs_dout()) {
            (Some(d), true) => Some(upload_values(dev, &elements(d), dtype)?),
            (None, true) => return Err(CudaError::Driver("dout is missing".into())),
            _ => None,
        };
        let offs: Vec<i32> = case.offsets().iter().map(|&o| o as i32).collect();
        let offs = upload(dev, &offs)?;
        let mut result = GemmOutputs::default();
        for pass in passes.iter() {
            let plan = plan_tiles(pass, &case.group_sizes, m, k, n)
                .map_err(|e| CudaError::Driver(e.to_string()))?;
            let len = match pass {
                Pass::Fwd => m * n,
                Pass::Dgrad => m * k,
                Pass::Wgrad => g * k * n,
            };
            let mut out = poisoned_output(dev, len)?;
            if let Some((gx, gy)) = plan.grid() {
                let kind = if mma { "mma" } else { "tiled" };
                let name = kernel_name(&format!("grouped_gemm_{}_{kind}", pass.name()), dtype);
                let f = dev.function(KernelModule::GroupedGemm, &name)?;
                let tiles = upload(dev, &plan.flat())?;
                let (a, b) = match pass {
                    Pass::Fwd => (&lhs, &rhs),
                    Pass::Dgrad => (dout.as_ref().expect("checked above"), &rhs),
                    Pass::Wgrad => (&lhs, dout.as_ref().expect("checked above")),
                };
                let (a_ptr, b_ptr) = (a.ptr(dev), b.ptr(dev));
                let num_tiles = plan.tiles.len() as i32;
                let (mi, ki, ni, gi) = (m as i64, k as i64, n as i64, g as i32);
                let mut lb = dev.stream.launch_builder(&f);
                // Arguments: a, b (device, dtype storage: fwd lhs (M,K) & rhs (G,K,N); dgrad
                // dout (M,N) & rhs; wgrad lhs & dout), out (device f32, `len`), offsets
                // (device int32, G+1), tiles (device int32, num_tiles*3), num_tiles, M, K, N
                // (host i64), G (host i32).
                lb.arg(&a_ptr)
                    .arg(&b_ptr)
                    .arg(&mut out)
                    .arg(&offs)
                    .arg(&tiles)
                    .arg(&num_tiles)
                    .arg(&mi)
                    .arg(&ki)
                    .arg(&ni)
                    .arg(&gi);
                let threads = if mma { MMA_THREADS } else { TILED_THREADS };
                timed(dev, || {
                    // SAFETY: the pointers are live device buffers of the shapes documented
                    // above (kept alive until the synchronising download below); the schedule
                    // covers only in-range elements (plan_tiles, tested) and the kernels
                    // bounds-check every access against M, K, N, G.
                    unsafe {
                        lb.launch(LaunchConfig {
                            grid_dim: (gx, gy, 1),
                            block_dim: (threads, 1, 1),
                            shared_mem_bytes: 0,
                        })
                    }?;
                    Ok(())
                })?;
            }
            let v = download(dev, &out, len, case.out_dtype)?;
            let shape_err = |e: ndarray::ShapeError| CudaError::Driver(e.to_string());
            match pass {
                Pass::Fwd => {
                    result.out = Some(Array2::from_shape_vec((m, n), v).map_err(shape_err)?.into())
                }
                Pass::Dgrad => {
                    result.dlhs = Some(Array2::from_shape_vec((m, k), v).map_err(shape_err)?.into())
                }
                Pass::Wgrad => {
                    result.drhs = Some(
                        Array3::from_shape_vec((g, k, n), v)
                            .map_err(shape_err)?
                            .into(),
                    )
                }
            }
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::par_map;

    #[test]
    fn an_f64_output_is_declared_f32() {
        use moecheck_reference::format::Format;
        assert_eq!(super::declared_output(Format::F64), Format::F32);
        assert_eq!(super::declared_output(Format::Bf16), Format::Bf16);
    }

    #[test]
    fn par_map_keeps_order_and_length() {
        for n in [0usize, 1, 65_535, 65_537, 300_001] {
            let src: Vec<u32> = (0..n as u32).collect();
            let got = par_map(&src, |&x| x as u64 * 3 + 1);
            assert_eq!(got.len(), n);
            assert!(got.iter().enumerate().all(|(i, &v)| v == i as u64 * 3 + 1));
        }
    }
}
