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

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::sys as cb;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, DevicePtr};
use moecheck_reference::format::Format;
use moecheck_reference::gemm::{
    Accumulator, GemmOutputs, GroupedGemmCase, Pass, Passes, Precision,
};
use moecheck_reference::implementation::{GroupedGemm, RunError};
use ndarray::{Array2, Array3};

use super::device::{device, timed, CudaError, Device};
use super::gemm::{download, poisoned_output, run_err, upload, upload_values};
use super::libs::{ensure, Found, Lib};
use super::plan::{grouped_arrays, plan_blas, BlasCall, Input, Output};

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

impl GroupedGemm for Cublas {
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
            output: case.out_dtype,
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
            return Err(RunError(
                "libcublas found but not loadable by cudarc".into(),
            ));
        }
        self.run_on(&dev, case, passes).map_err(run_err)
    }
}

impl Cublas {
    fn run_on(
        &self,
        dev: &Arc<Device>,
        case: &GroupedGemmCase,
        passes: Passes,
    ) -> Result<GemmOutputs, CudaError> {
        let (m, k, n, g) = (case.m(), case.k(), case.n(), case.groups());
        let blas = CudaBlas::new(dev.stream.clone())
            .map_err(|e| CudaError::Driver(format!("cublasCreate: {e:?}")))?;
        let ty = data_type(case.dtype)?;
        let in_bytes: u64 = if case.dtype == Format::F32 { 4 } else { 2 };
        let lhs = upload_values(dev, case.lhs.iter(), case.dtype)?;
        let rhs = upload_values(dev, case.rhs.iter(), case.dtype)?;
        let dout = match (&case.dout, passes.needs_dout()) {
            (Some(d), true) => Some(upload_values(dev, d.iter(), case.dtype)?),
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
            let mut out = poisoned_output(dev, len)?;
            timed(dev, || {
                for z in &plan.zeros {
                    let mut view = out.slice_mut(z.offset..z.offset + z.len);
                    dev.stream.memset_zeros(&mut view)?;
                }
                let out_ptr = out.device_ptr(&dev.stream).0;
                let out_base = |_: Output| out_ptr;
                if !plan.calls.is_empty() {
                    if self.grouped {
                        self.grouped_call(dev, &blas, &plan.calls, ty, in_bytes, &base, &out_base)?;
                    } else {
                        for c in &plan.calls {
                            gemm_ex(&blas, c, ty, &base, in_bytes, out_ptr)?;
                        }
                    }
                }
                Ok(())
            })?;
            let v = download(dev, &out, len, case.out_dtype)?;
            let shape_err = |e: ndarray::ShapeError| CudaError::Driver(e.to_string());
            match pass {
                Pass::Fwd => {
                    result.out = Some(Array2::from_shape_vec((m, n), v).map_err(shape_err)?)
                }
                Pass::Dgrad => {
                    result.dlhs = Some(Array2::from_shape_vec((m, k), v).map_err(shape_err)?)
                }
                Pass::Wgrad => {
                    result.drhs = Some(Array3::from_shape_vec((g, k, n), v).map_err(shape_err)?)
                }
            }
        }
        drop((lhs, rhs, dout));
        Ok(result)
    }

    #[allow(clippy::too_many_arguments)]
    fn grouped_call(
        &self,
        dev: &Device,
        blas: &CudaBlas,
        calls: &[BlasCall],
        ty: cb::cudaDataType_t,
        in_bytes: u64,
        base: &dyn Fn(Input) -> u64,
        out_base: &dyn Fn(Output) -> u64,
    ) -> Result<(), CudaError> {
        let arr = grouped_arrays(calls, base, in_bytes, out_base, 4);
        let count = arr.m.len();
        let ta: Vec<cb::cublasOperation_t> = arr.trans_a.iter().map(|&t| op(t)).collect();
        let tb: Vec<cb::cublasOperation_t> = arr.trans_b.iter().map(|&t| op(t)).collect();
        let alpha = vec![1.0f32; count];
        let beta = vec![0.0f32; count];
        // Pointer arrays: device copies (cuBLAS's documented contract) or the host vectors.
        let dev_arrays: Option<[CudaSlice<u64>; 3]> = match self.ptr_arrays {
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
        // SAFETY: every host array (trans, m, n, k, ld*, alpha, beta, group_size) has
        // `count` entries and lives until the call returns; pa/pb/pc point at `count`
        // device addresses (in device memory or on the host, see PtrArrays), each the start
        // of an operand block whose extent plan_blas derived from the case's shapes
        // (tested on the CPU); the output is f32 (CUDA_R_32F) as allocated.
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
                cb::cudaDataType_t::CUDA_R_32F,
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
