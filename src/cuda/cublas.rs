//! `cublas` and `cublas-grouped`: NVIDIA's cuBLAS as implementations under test.
//!
//! Both run the per-expert column-major GEMMs of [`plan_blas`] (see there for the
//! row-major/column-major mapping), with inputs in the case dtype, f32 output
//! (`CUDA_R_32F`) and `CUBLAS_COMPUTE_32F`, alpha 1 and beta 0; tails, `K = 0` and empty
//! experts are zero fills (memset), never cuBLAS calls; outputs are NaN-poisoned first.
//!
//! * `cublas`: one `cublasGemmEx` per expert.
//! * `cublas-grouped`: one `cublasGemmGroupedBatchedEx` (CUDA 12.5+) for all experts, through
//!   cudarc's sys layer, one cuBLAS "group" of one problem per expert. cuBLAS documents the
//!   `Aarray`/`Barray`/`Carray` pointer arrays as device memory while every other array is on
//!   the host; cudarc 0.19's safe `grouped_gemm` passes host pointer arrays. We pass device
//!   arrays by default; `MOECHECK_CUBLAS_GROUPED_PTRS=host` switches to host arrays so the GPU
//!   script can find out which one cuBLAS accepts (scripts/gpu-check reports both).
//!   Whether cuBLAS accepts an f32 output (`Ctype = CUDA_R_32F`) with bf16/f16 inputs in the
//!   grouped call is probed once per dtype on a 16×16×16 problem
//!   ([`grouped_f32_output_supported`]); where it does not, the grouped call writes the input
//!   type (`Ctype = Atype`, as cudarc's wrapper does) and [`Cublas::precision`] declares that
//!   output format, so the bound stays honest.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::sys as cb;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, DevicePtr};
use moecheck_reference::format::Format;
use moecheck_reference::gemm::Gemm;
use moecheck_reference::gemm::{
    Accumulator, GemmOutputs, GroupedGemmCase, Pass, Passes, Precision,
};
use moecheck_reference::op::{Implementation, RunError};
use ndarray::{Array2, Array3};

use super::device::{device, timed, CudaError, Device};
use super::gemm::{
    download, elements, par_map, poisoned_output, run_err, upload, upload_values, upload_weights,
};
use super::libs::{ensure, Found, Lib};
use super::plan::{grouped_arrays, plan_blas, BlasCall, Input, Output};

/// The cuBLAS handle on the device's stream, created once per process (cublasCreate is slow
/// and the property suite runs thousands of cases).
fn blas_handle(dev: &Arc<Device>) -> Result<&'static CudaBlas, CudaError> {
    use std::sync::OnceLock;
    static BLAS: OnceLock<Result<CudaBlas, CudaError>> = OnceLock::new();
    BLAS.get_or_init(|| {
        CudaBlas::new(dev.stream.clone())
            .map_err(|e| CudaError::Driver(format!("cublasCreate: {e:?}")))
    })
    .as_ref()
    .map_err(|e| e.clone())
}

/// Where `cublas-grouped` keeps its pointer arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PtrArrays {
    Device,
    Host,
}

impl PtrArrays {
    /// From `MOECHECK_CUBLAS_GROUPED_PTRS` (`host` or `device`, default device).
    pub fn from_env() -> PtrArrays {
        match std::env::var("MOECHECK_CUBLAS_GROUPED_PTRS").as_deref() {
            Ok("host") => PtrArrays::Host,
            _ => PtrArrays::Device,
        }
    }
}

/// cuBLAS on device 0: per-expert calls, or one grouped call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cublas {
    pub grouped: bool,
    pub ptr_arrays: PtrArrays,
}

fn data_type(dtype: Format) -> Result<cb::cudaDataType_t, CudaError> {
    match dtype {
        Format::F32 => Ok(cb::cudaDataType_t::CUDA_R_32F),
        Format::Bf16 => Ok(cb::cudaDataType_t::CUDA_R_16BF),
        Format::F16 => Ok(cb::cudaDataType_t::CUDA_R_16F),
        other => Err(CudaError::Driver(format!(
            "cuBLAS input dtype {} is not supported here (f32, bf16, f16)",
            other.name()
        ))),
    }
}

fn op(t: bool) -> cb::cublasOperation_t {
    if t {
        cb::cublasOperation_t::CUBLAS_OP_T
    } else {
        cb::cublasOperation_t::CUBLAS_OP_N
    }
}

fn check(what: &str, s: cb::cublasStatus_t) -> Result<(), CudaError> {
    if s == cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Driver(format!("{what}: {s:?}")))
    }
}

impl Implementation<Gemm> for Cublas {
    fn name(&self) -> String {
        match (self.grouped, self.ptr_arrays) {
            (false, _) => "cublas".into(),
            (true, PtrArrays::Device) => "cublas-grouped".into(),
            (true, PtrArrays::Host) => "cublas-grouped[host-ptrs]".into(),
        }
    }
    fn is_model(&self) -> bool {
        false
    }
    fn precision(&self, case: &GroupedGemmCase) -> Precision {
        Precision {
            input: case.dtype,
            accumulator: Accumulator::any_order(Format::F32),
            output: if self.half_output(case.dtype) {
                case.dtype
            } else {
                super::gemm::declared_output(case.out_dtype)
            },
        }
    }
    fn run(&self, case: &GroupedGemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
        let dev = device().map_err(run_err)?;
        if let Found::Missing(why) = ensure(Lib::Cublas) {
            return Err(run_err(CudaError::MissingLibrary {
                lib: "libcublas",
                why,
            }));
        }
        // SAFETY: only checks that the library loads (ensured above, so no panic).
        if !unsafe { cb::is_culib_present() } {
            return Err(RunError::new("libcublas found but not loadable by cudarc"));
        }
        self.run_on(&dev, case, passes).map_err(run_err)
    }
}

impl Cublas {
    /// Whether this run writes a bf16/f16 output (the grouped call without f32 output).
    fn half_output(&self, dtype: Format) -> bool {
        self.grouped
            && matches!(dtype, Format::Bf16 | Format::F16)
            && !grouped_f32_output_supported(dtype)
    }

    fn run_on(
        &self,
        dev: &Arc<Device>,
        case: &GroupedGemmCase,
        passes: Passes,
    ) -> Result<GemmOutputs, CudaError> {
        let (m, k, n, g) = (case.m(), case.k(), case.n(), case.groups());
        let blas = blas_handle(dev)?;
        let ty = data_type(case.dtype)?;
        let in_bytes: u64 = if case.dtype == Format::F32 { 4 } else { 2 };
        let lhs = upload_values(dev, &elements(&case.lhs), case.dtype)?;
        let rhs = upload_weights(dev, &case.rhs, case.dtype)?;
        let dout = match (&case.dout, passes.needs_dout()) {
            (Some(d), true) => Some(upload_values(dev, &elements(d), case.dtype)?),
            (None, true) => return Err(CudaError::Driver("dout is missing".into())),
            _ => None,
        };
        let base = |i: Input| -> u64 {
            match i {
                Input::Lhs => lhs.ptr(dev),
                Input::Rhs => rhs.ptr(dev),
                // plan_blas only names dout for dgrad/wgrad, where it was uploaded.
                Input::Dout => dout.as_ref().map(|d| d.ptr(dev)).unwrap_or(0),
            }
        };
        let mut result = GemmOutputs::default();
        for pass in passes.iter() {
            let plan = plan_blas(pass, &case.group_sizes, m, k, n)
                .map_err(|e| CudaError::Driver(e.to_string()))?;
            let len = match pass {
                Pass::Fwd => m * n,
                Pass::Dgrad => m * k,
                Pass::Wgrad => g * k * n,
            };
            let v = if self.half_output(case.dtype) {
                // Grouped call writing the input type (see the module docs).
                let mut out = poisoned_u16(dev, len)?;
                timed(dev, || {
                    for z in &plan.zeros {
                        let mut view = out.slice_mut(z.offset..z.offset + z.len);
                        dev.stream.memset_zeros(&mut view)?;
                    }
                    let out_ptr = out.device_ptr(&dev.stream).0;
                    if !plan.calls.is_empty() {
                        grouped_call(
                            dev,
                            blas,
                            &plan.calls,
                            ty,
                            in_bytes,
                            &base,
                            out_ptr,
                            ty,
                            self.ptr_arrays,
                        )?;
                    }
                    Ok(())
                })?;
                download_u16(dev, &out, len, case.dtype, case.out_dtype)?
            } else {
                let mut out = poisoned_output(dev, len)?;
                timed(dev, || {
                    for z in &plan.zeros {
                        let mut view = out.slice_mut(z.offset..z.offset + z.len);
                        dev.stream.memset_zeros(&mut view)?;
                    }
                    let out_ptr = out.device_ptr(&dev.stream).0;
                    if !plan.calls.is_empty() {
                        if self.grouped {
                            let f32_out = cb::cudaDataType_t::CUDA_R_32F;
                            grouped_call(
                                dev,
                                blas,
                                &plan.calls,
                                ty,
                                in_bytes,
                                &base,
                                out_ptr,
                                f32_out,
                                self.ptr_arrays,
                            )?;
                        } else {
                            for c in &plan.calls {
                                gemm_ex(blas, c, ty, &base, in_bytes, out_ptr)?;
                            }
                        }
                    }
                    Ok(())
                })?;
                download(dev, &out, len, case.out_dtype)?
            };
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
        drop((lhs, rhs, dout));
        Ok(result)
    }
}

/// One `cublasGemmGroupedBatchedEx` over `calls`, output type `ctype` at `out_ptr`.
#[allow(clippy::too_many_arguments)]
fn grouped_call(
    dev: &Device,
    blas: &CudaBlas,
    calls: &[BlasCall],
    ty: cb::cudaDataType_t,
    in_bytes: u64,
    base: &dyn Fn(Input) -> u64,
    out_ptr: u64,
    ctype: cb::cudaDataType_t,
    ptr_arrays: PtrArrays,
) -> Result<(), CudaError> {
    let out_bytes = if ctype == cb::cudaDataType_t::CUDA_R_32F {
        4
    } else {
        2
    };
    let arr = grouped_arrays(calls, base, in_bytes, |_: Output| out_ptr, out_bytes);
    let count = arr.m.len();
    let ta: Vec<cb::cublasOperation_t> = arr.trans_a.iter().map(|&t| op(t)).collect();
    let tb: Vec<cb::cublasOperation_t> = arr.trans_b.iter().map(|&t| op(t)).collect();
    let alpha = vec![1.0f32; count];
    let beta = vec![0.0f32; count];
    // Pointer arrays: device copies (cuBLAS's documented contract) or the host vectors.
    let dev_arrays: Option<[CudaSlice<u64>; 3]> = match ptr_arrays {
        PtrArrays::Device => Some([
            upload(dev, &arr.a_ptrs)?,
            upload(dev, &arr.b_ptrs)?,
            upload(dev, &arr.c_ptrs)?,
        ]),
        PtrArrays::Host => None,
    };
    let (pa, pb, pc) = match &dev_arrays {
        Some([a, b, c]) => (
            a.device_ptr(&dev.stream).0 as usize as *const *const c_void,
            b.device_ptr(&dev.stream).0 as usize as *const *const c_void,
            c.device_ptr(&dev.stream).0 as usize as *const *mut c_void,
        ),
        None => (
            arr.a_ptrs.as_ptr() as *const *const c_void,
            arr.b_ptrs.as_ptr() as *const *const c_void,
            arr.c_ptrs.as_ptr() as *const *mut c_void,
        ),
    };
    // SAFETY: every host array (trans, m, n, k, ld*, alpha, beta, group_size) has `count`
    // entries and lives until the call returns; pa/pb/pc point at `count` device addresses
    // (in device memory or on the host, see PtrArrays), each the start of an operand block
    // whose extent plan_blas derived from the case's shapes (tested on the CPU); the output
    // buffer holds elements of `ctype`.
    let s = unsafe {
        cb::cublasGemmGroupedBatchedEx(
            *blas.handle(),
            ta.as_ptr(),
            tb.as_ptr(),
            arr.m.as_ptr(),
            arr.n.as_ptr(),
            arr.k.as_ptr(),
            alpha.as_ptr() as *const c_void,
            pa,
            ty,
            arr.lda.as_ptr(),
            pb,
            ty,
            arr.ldb.as_ptr(),
            beta.as_ptr() as *const c_void,
            pc,
            ctype,
            arr.ldc.as_ptr(),
            count as i32,
            arr.group_size.as_ptr(),
            cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        )
    };
    check("cublasGemmGroupedBatchedEx", s)?;
    dev.stream.synchronize()?;
    drop(dev_arrays);
    Ok(())
}

/// Whether cuBLAS's grouped call accepts `dtype` inputs with an f32 output, probed once per
/// dtype on a 16×16×16 problem (true for f32 inputs, and when no device is there to ask).
pub fn grouped_f32_output_supported(dtype: Format) -> bool {
    use std::sync::OnceLock;
    static BF16: OnceLock<bool> = OnceLock::new();
    static F16: OnceLock<bool> = OnceLock::new();
    let cell = match dtype {
        Format::Bf16 => &BF16,
        Format::F16 => &F16,
        _ => return true,
    };
    *cell.get_or_init(|| probe_f32_output(dtype).unwrap_or(true))
}

/// `Some(accepted)` from a real grouped call, `None` when there is no device or cuBLAS.
fn probe_f32_output(dtype: Format) -> Option<bool> {
    let dev = device().ok()?;
    if !ensure(Lib::Cublas).is_present() {
        return None;
    }
    let blas = blas_handle(&dev).ok()?;
    let ty = data_type(dtype).ok()?;
    let a = upload(&dev, &[0u16; 256]).ok()?;
    let out = upload(&dev, &[0f32; 256]).ok()?;
    let calls = plan_blas(Pass::Fwd, &[16], 16, 16, 16).ok()?.calls;
    let a_ptr = a.device_ptr(&dev.stream).0;
    let out_ptr = out.device_ptr(&dev.stream).0;
    let r = grouped_call(
        &dev,
        blas,
        &calls,
        ty,
        2,
        &|_| a_ptr,
        out_ptr,
        cb::cudaDataType_t::CUDA_R_32F,
        PtrArrays::from_env(),
    );
    Some(r.is_ok())
}

/// A NaN-poisoned 16-bit output (0xffff is NaN in bf16 and f16), at least one element.
fn poisoned_u16(dev: &Device, len: usize) -> Result<CudaSlice<u16>, CudaError> {
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    // SAFETY: fully written by fill_u16 below before anything reads it.
    let mut out = unsafe { dev.stream.alloc::<u16>(len.max(1)) }?;
    let f = dev.function(super::kernels::KernelModule::GroupedGemm, "fill_u16")?;
    if let Some((blocks, threads)) = super::plan::grid_1d(len.max(1), 256, 1 << 20) {
        let (n, bits) = (len.max(1) as i64, 0xffffu16);
        let mut b = dev.stream.launch_builder(&f);
        // fill_u16(uint16_t* p [device, n], idx_t n, uint16_t bits)
        b.arg(&mut out).arg(&n).arg(&bits);
        // SAFETY: `out` holds n u16; the kernel writes p[i] for i < n only.
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

/// Copies a 16-bit output back: bits of `stored` (bf16/f16), rounded to `out_dtype`, held in
/// f32 (every such value is an f32).
fn download_u16(
    dev: &Device,
    buf: &CudaSlice<u16>,
    len: usize,
    stored: Format,
    out_dtype: Format,
) -> Result<Vec<f32>, CudaError> {
    use moecheck_reference::format::{round_to, Overflow};
    if len == 0 {
        return Ok(Vec::new());
    }
    let v = dev.stream.clone_dtoh(buf)?;
    Ok(par_map(&v[..len], |&b| {
        let x = if stored == Format::Bf16 {
            half::bf16::from_bits(b).to_f64()
        } else {
            half::f16::from_bits(b).to_f64()
        };
        round_to(x, out_dtype, Overflow::Ieee) as f32
    }))
}

fn gemm_ex(
    blas: &CudaBlas,
    c: &BlasCall,
    ty: cb::cudaDataType_t,
    base: &dyn Fn(Input) -> u64,
    in_bytes: u64,
    out_ptr: u64,
) -> Result<(), CudaError> {
    let alpha = 1.0f32;
    let beta = 0.0f32;
    let a = base(c.a.0) + c.a.1 as u64 * in_bytes;
    let b = base(c.b.0) + c.b.1 as u64 * in_bytes;
    let cp = out_ptr + c.c.1 as u64 * 4;
    // SAFETY: a, b, cp are device addresses inside the uploaded operands / the f32 output at
    // the offsets plan_blas computed; m, n, k, lda, ldb, ldc satisfy cuBLAS's rules (checked
    // by plan_tests) so every element touched lies inside its buffer; alpha/beta are host f32
    // (pointer mode host) matching CUBLAS_COMPUTE_32F.
    let s = unsafe {
        cb::cublasGemmEx(
            *blas.handle(),
            op(c.trans_a),
            op(c.trans_b),
            c.m,
            c.n,
            c.k,
            &alpha as *const f32 as *const c_void,
            a as usize as *const c_void,
            ty,
            c.lda,
            b as usize as *const c_void,
            ty,
            c.ldb,
            &beta as *const f32 as *const c_void,
            cp as usize as *mut c_void,
            cb::cudaDataType_t::CUDA_R_32F,
            c.ldc,
            cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    };
    check("cublasGemmEx", s)
}
