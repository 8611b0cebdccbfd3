//! The grouped GEMM kernels of kernels/grouped_gemm.cu on the CPU, as an implementation of
//! the grouped GEMM: the tiled kernels (f32, bf16, f16) and the tensor-core kernels (mma
//! emulated) under every GEMM property, and a planted kernel bug that the check must catch.

use std::ffi::c_void;

use moecheck::cuda::plan::{grid_1d, plan_tiles};
use moecheck_properties::{check, PropertyOp, RunConfig};
use moecheck_reference::format::{round_to, Format, Overflow};
use moecheck_reference::gemm::{
    Accumulator, Gemm, GemmOutputs, GroupedGemmCase, Pass, Passes, Precision, TailContract,
};
use moecheck_reference::op::{verify, Implementation, RunError};
use ndarray::{Array2, Array3};

use crate::harness::{library, planted_library, skip, sym};

/// `mc_grouped_gemm_tiled` / `mc_grouped_gemm_mma` (driver.cpp): pass (0 fwd, 1 dgrad,
/// 2 wgrad), dtype (0 f32, 1 bf16, 2 f16), a, b (host, storage format, shapes as in
/// grouped_gemm.cu), out (host f32, overwritten where a tile writes), offsets (G+1), tiles
/// (flat plan), tile count, M, K, N, G, grid x, grid y; returns 0, or -1 for an unknown
/// pass/dtype.
type GemmFn = unsafe extern "C" fn(
    i32,
    i32,
    *const c_void,
    *const c_void,
    *mut f32,
    *const i32,
    *const i32,
    i32,
    i64,
    i64,
    i64,
    i32,
    u32,
    u32,
) -> i32;
/// `mc_fill_f32` (driver.cpp): p (host f32, n elements) set to value, over `blocks` blocks.
type FillFn = unsafe extern "C" fn(*mut f32, i64, f32, u32);

/// Non-empty storage (one zero element for an empty array), like src/cuda's `upload`.
fn storage<T: Copy + Default>(v: Vec<T>) -> Vec<T> {
    if v.is_empty() {
        vec![T::default()]
    } else {
        v
    }
}

/// The kernel source on the CPU, as an implementation (a model).
struct HostKernels {
    lib: &'static libloading::Library,
    /// The tensor-core kernels (mma emulated) for bf16/f16, as `--impl cuda` picks on sm_80+.
    mma: bool,
}

impl HostKernels {
    /// The tiled kernels as written (`--impl cuda` below sm_80, and for f32).
    fn tiled() -> HostKernels {
        HostKernels {
            lib: library(),
            mma: false,
        }
    }

    /// The tensor-core kernels as written, for bf16/f16 (f32 still runs the tiled ones).
    fn mma() -> HostKernels {
        HostKernels {
            lib: library(),
            mma: true,
        }
    }

    /// The tiled kernels with the planted bug (see [`planted_library`]).
    fn planted() -> HostKernels {
        HostKernels {
            lib: planted_library(),
            mma: false,
        }
    }
}

impl Implementation<Gemm> for HostKernels {
    fn name(&self) -> String {
        "cuda-kernels-on-cpu".into()
    }
    fn is_model(&self) -> bool {
        true
    }
    fn precision(&self, case: &GroupedGemmCase) -> Precision {
        Precision {
            input: case.dtype,
            accumulator: Accumulator::any_order(Format::F32),
            output: case.out_dtype,
        }
    }
    fn run(&self, case: &GroupedGemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
        let gemm = if self.mma && case.dtype != Format::F32 {
            sym!(self.lib, "mc_grouped_gemm_mma", GemmFn)
        } else {
            sym!(self.lib, "mc_grouped_gemm_tiled", GemmFn)
        };
        let fill = sym!(self.lib, "mc_fill_f32", FillFn);
        let (m, k, n, g) = (case.m(), case.k(), case.n(), case.groups());
        let dt = match case.dtype {
            Format::F32 => 0,
            Format::Bf16 => 1,
            Format::F16 => 2,
            other => return Err(RunError::new(format!("dtype {} unsupported", other.name()))),
        };
        // Inputs in storage format: f32 as bits, bf16/f16 as raw u16 bits.
        let conv = |a: &mut dyn Iterator<Item = &f32>| -> (Vec<u32>, Vec<u16>) {
            match dt {
                0 => (storage(a.map(|x| x.to_bits()).collect()), vec![]),
                1 => (
                    vec![],
                    storage(a.map(|&x| half::bf16::from_f32(x).to_bits()).collect()),
                ),
                _ => (
                    vec![],
                    storage(a.map(|&x| half::f16::from_f32(x).to_bits()).collect()),
                ),
            }
        };
        let ptr = |s: &(Vec<u32>, Vec<u16>)| -> *const c_void {
            if dt == 0 {
                s.0.as_ptr() as *const c_void
            } else {
                s.1.as_ptr() as *const c_void
            }
        };
        let lhs = conv(&mut case.lhs.iter());
        let rhs = conv(&mut case.rhs.f32().iter());
        let dout = case.dout.as_ref().map(|d| conv(&mut d.iter()));
        let offs: Vec<i32> = case.offsets().iter().map(|&o| o as i32).collect();
        let mut result = GemmOutputs::default();
        for pass in passes.iter() {
            let plan = plan_tiles(pass, &case.group_sizes, m, k, n)
                .map_err(|e| RunError::new(e.to_string()))?;
            let len = match pass {
                Pass::Fwd => m * n,
                Pass::Dgrad => m * k,
                Pass::Wgrad => g * k * n,
            };
            let mut out = vec![0.0f32; len.max(1)];
            let (blocks, _) = grid_1d(out.len(), 256, 1 << 20).expect("non-empty");
            // SAFETY: `out` has out.len() floats.
            unsafe { fill(out.as_mut_ptr(), out.len() as i64, f32::NAN, blocks) };
            if let Some((gx, gy)) = plan.grid() {
                let (a, b) = match pass {
                    Pass::Fwd => (ptr(&lhs), ptr(&rhs)),
                    Pass::Dgrad => (
                        ptr(dout.as_ref().ok_or(RunError::new("no dout"))?),
                        ptr(&rhs),
                    ),
                    Pass::Wgrad => (
                        ptr(&lhs),
                        ptr(dout.as_ref().ok_or(RunError::new("no dout"))?),
                    ),
                };
                let tiles = plan.flat();
                let p = match pass {
                    Pass::Fwd => 0,
                    Pass::Dgrad => 1,
                    Pass::Wgrad => 2,
                };
                // SAFETY: same arguments as the GPU launch in src/cuda/gemm.rs, host memory.
                let rc = unsafe {
                    gemm(
                        p,
                        dt,
                        a,
                        b,
                        out.as_mut_ptr(),
                        offs.as_ptr(),
                        tiles.as_ptr(),
                        plan.tiles.len() as i32,
                        m as i64,
                        k as i64,
                        n as i64,
                        g as i32,
                        gx,
                        gy,
                    )
                };
                assert_eq!(rc, 0);
            }
            let v: Vec<f64> = out[..len]
                .iter()
                .map(|&x| round_to(x as f64, case.out_dtype, Overflow::Ieee))
                .collect();
            match pass {
                Pass::Fwd => result.out = Some(Array2::from_shape_vec((m, n), v).unwrap().into()),
                Pass::Dgrad => {
                    result.dlhs = Some(Array2::from_shape_vec((m, k), v).unwrap().into())
                }
                Pass::Wgrad => {
                    result.drhs = Some(Array3::from_shape_vec((g, k, n), v).unwrap().into())
                }
            }
        }
        Ok(result)
    }
}

/// Every grouped GEMM property holds on `kernels` (`what` names them in a failure), over at
/// most `max_cases` cases from `seed`: a launch is 256 OS threads here, so keep it modest.
fn every_property_holds(kernels: &HostKernels, what: &str, max_cases: u32, seed: u64) {
    let config = RunConfig::new(RunConfig::default().cases.min(max_cases), seed);
    for p in Gemm::properties() {
        let o = check(&p, kernels, &config);
        assert!(o.passed(), "{} fails on the {what}: {o:?}", p.name);
    }
}

#[test]
fn every_property_holds_on_the_tiled_kernel_source() {
    if skip() {
        return;
    }
    every_property_holds(&HostKernels::tiled(), "kernel source", 10, 0x5eed);
}

#[test]
fn every_property_holds_on_the_mma_kernel_source() {
    if skip() {
        return;
    }
    // The mma instruction itself is emulated from the PTX fragment layout; everything around
    // it (staging, fragment loads, bounds, stores, tails) is the kernel's own code.
    every_property_holds(&HostKernels::mma(), "mma kernel source", 8, 0x3a3a);
}

/// The harness can fail: a kernel that skips the partial K block is caught on a case with
/// K = 20 (one full 16-wide block and a partial one), and the same case passes unplanted.
#[test]
fn a_planted_kernel_bug_is_caught() {
    if skip() {
        return;
    }
    let (m, k, n) = (9usize, 20usize, 5usize);
    let v = |i: usize| ((i * 7 % 9) as f32) - 4.0;
    let case = GroupedGemmCase {
        lhs: Array2::from_shape_fn((m, k), |(r, c)| v(r * k + c)),
        rhs: Array3::from_shape_fn((2, k, n), |(g, r, c)| v(g * 31 + r * n + c + 1)).into(),
        group_sizes: vec![4, 3],
        dout: None,
        dtype: Format::Bf16,
        out_dtype: Format::F32,
        tail: TailContract::Zero,
    };
    let good = verify(&HostKernels::tiled(), &case, Passes::FWD).verdict;
    assert!(good.passed(), "{:?}", good.failure());
    let bad = verify(&HostKernels::planted(), &case, Passes::FWD).verdict;
    assert!(!bad.passed(), "the planted partial-K bug went unnoticed");
}
