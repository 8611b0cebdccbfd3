//! The CUDA kernels of kernels/ executed on the CPU: the same source compiled as host C++
//! (tests/host_kernels/shim.hpp: threads for a block, a barrier for `__syncthreads`), launched
//! with the grids and arguments src/cuda/ computes. This is a model of the GPU run (the
//! tensor-core path and the GPU's compiler are not exercised), never a GPU result; what it
//! checks without a GPU is the kernels' indexing, tiling, tails, empty groups, FP8 bit
//! patterns and routing rules.
//!
//! Needs a C++20 compiler (`$CXX`, else `g++`/`c++`). Without one the tests fail, unless
//! `MOECHECK_SKIP_HOST_CXX=1` (then one SKIPPED line).
#![cfg(feature = "cuda")]

use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::OnceLock;

use moecheck::cuda::plan::{grid_1d, plan_tiles};
use moecheck_properties::{check, PropertyOp, RunConfig};
use moecheck_reference::format::{decode_fp8, encode_fp8, round_to, Format, Overflow};
use moecheck_reference::gemm::Gemm;
use moecheck_reference::gemm::{
    Accumulator, GemmOutputs, GroupedGemmCase, Pass, Passes, Precision,
};
use moecheck_reference::op::{Implementation, RunError};
use ndarray::{Array2, Array3};

fn skip() -> bool {
    std::env::var("MOECHECK_SKIP_HOST_CXX").is_ok_and(|v| v == "1")
}

/// Compiles tests/host_kernels/driver.cpp (with the kernels) with `defines`.
fn build(tag: &str, defines: &[&str]) -> libloading::Library {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("tests/host_kernels/driver.cpp");
    let out = std::env::temp_dir().join(format!(
        "moecheck-host-kernels-{tag}-{}.so",
        std::process::id()
    ));
    let compilers: Vec<String> = std::env::var("CXX")
        .ok()
        .into_iter()
        .chain(["g++".to_string(), "c++".to_string()])
        .collect();
    let mut errors = Vec::new();
    for cxx in &compilers {
        let r = std::process::Command::new(cxx)
            .args([
                "-std=c++20",
                "-O2",
                "-ffp-contract=off",
                "-fPIC",
                "-shared",
                "-pthread",
            ])
            .args(["-Wall", "-Wno-unknown-pragmas", "-Werror"])
            .args(defines.iter().map(|d| format!("-D{d}")))
            .arg("-o")
            .arg(&out)
            .arg(&src)
            .output();
        match r {
            Ok(o) if o.status.success() => {
                // SAFETY: our own freshly built library; its initialisers are trivial.
                return unsafe { libloading::Library::new(&out) }.expect("load the host kernels");
            }
            Ok(o) => errors.push(format!("{cxx}: {}", String::from_utf8_lossy(&o.stderr))),
            Err(e) => errors.push(format!("{cxx}: {e}")),
        }
    }
    panic!(
        "cannot build the host kernels (need a C++20 compiler, or MOECHECK_SKIP_HOST_CXX=1):\n{}",
        errors.join("\n")
    );
}

/// The kernels as written.
fn library() -> &'static libloading::Library {
    static LIB: OnceLock<libloading::Library> = OnceLock::new();
    LIB.get_or_init(|| build("plain", &[]))
}

/// The kernels with a planted bug: the last partial K block is skipped.
fn planted_library() -> &'static libloading::Library {
    static LIB: OnceLock<libloading::Library> = OnceLock::new();
    LIB.get_or_init(|| build("planted", &["MC_PLANT_SKIP_PARTIAL_K"]))
}

macro_rules! sym {
    ($name:literal, $ty:ty) => {
        sym!(library(), $name, $ty)
    };
    ($lib:expr, $name:literal, $ty:ty) => {{
        // SAFETY: the symbol is defined in driver.cpp with exactly this C signature.
        let s: libloading::Symbol<$ty> = unsafe { $lib.get($name.as_bytes()) }.expect($name);
        *s
    }};
}

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
type FillFn = unsafe extern "C" fn(*mut f32, i64, f32, u32);
type EncodeFn = unsafe extern "C" fn(i32, f32) -> u8;
type DecodeFn = unsafe extern "C" fn(i32, u8) -> f32;
type QuantFn = unsafe extern "C" fn(
    i32,
    *const f32,
    *const i64,
    i32,
    *mut f32,
    *mut f32,
    *mut f32,
    *mut u8,
    u32,
);
type TransposeFn = unsafe extern "C" fn(*const u8, i64, *const i32, i32, *mut u8, u32);
type Fp8GemmFn = unsafe extern "C" fn(
    i32,
    *const u8,
    *const u8,
    *const f32,
    *const f32,
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
);
type RoutingFn = unsafe extern "C" fn(
    *const f32,
    *const f32,
    i32,
    i32,
    i32,
    i32,
    i32,
    i32,
    i32,
    *mut i32,
    *mut f32,
    *mut u8,
    *mut i32,
    *mut i32,
    *mut i32,
);

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
            other => return Err(RunError(format!("dtype {} unsupported", other.name()))),
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
        let rhs = conv(&mut case.rhs.iter());
        let dout = case.dout.as_ref().map(|d| conv(&mut d.iter()));
        let offs: Vec<i32> = case.offsets().iter().map(|&o| o as i32).collect();
        let mut result = GemmOutputs::default();
        for pass in passes.iter() {
            let plan = plan_tiles(pass, &case.group_sizes, m, k, n)
                .map_err(|e| RunError(e.to_string()))?;
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
                        ptr(dout.as_ref().ok_or(RunError("no dout".into()))?),
                        ptr(&rhs),
                    ),
                    Pass::Wgrad => (
                        ptr(&lhs),
                        ptr(dout.as_ref().ok_or(RunError("no dout".into()))?),
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
                Pass::Fwd => result.out = Some(Array2::from_shape_vec((m, n), v).unwrap()),
                Pass::Dgrad => result.dlhs = Some(Array2::from_shape_vec((m, k), v).unwrap()),
                Pass::Wgrad => result.drhs = Some(Array3::from_shape_vec((g, k, n), v).unwrap()),
            }
        }
        Ok(result)
    }
}

#[test]
fn every_property_holds_on_the_tiled_kernel_source() {
    if skip() {
        println!("host kernels: SKIPPED — MOECHECK_SKIP_HOST_CXX=1");
        return;
    }
    // A launch is 256 OS threads here: keep the case count modest.
    let cases = RunConfig::default().cases.min(10);
    for p in Gemm::properties() {
        let o = check(
            &p,
            &HostKernels {
                lib: library(),
                mma: false,
            },
            &RunConfig::new(cases, 0x5eed),
        );
        assert!(o.passed(), "{} fails on the kernel source: {o:?}", p.name);
    }
}

#[test]
fn every_property_holds_on_the_mma_kernel_source() {
    if skip() {
        println!("host kernels: SKIPPED — MOECHECK_SKIP_HOST_CXX=1");
        return;
    }
    // The mma instruction itself is emulated from the PTX fragment layout; everything around
    // it (staging, fragment loads, bounds, stores, tails) is the kernel's own code.
    let cases = RunConfig::default().cases.min(8);
    for p in Gemm::properties() {
        let o = check(
            &p,
            &HostKernels {
                lib: library(),
                mma: true,
            },
            &RunConfig::new(cases, 0x3a3a),
        );
        assert!(
            o.passed(),
            "{} fails on the mma kernel source: {o:?}",
            p.name
        );
    }
}

/// The harness can fail: a kernel that skips the partial K block is caught on a case with
/// K = 20 (one full 16-wide block and a partial one), and the same case passes unplanted.
#[test]
fn a_planted_kernel_bug_is_caught() {
    if skip() {
        return;
    }
    use moecheck_reference::gemm::TailContract;
    use moecheck_reference::op::verify;
    let (m, k, n) = (9usize, 20usize, 5usize);
    let v = |i: usize| ((i * 7 % 9) as f32) - 4.0;
    let case = GroupedGemmCase {
        lhs: Array2::from_shape_fn((m, k), |(r, c)| v(r * k + c)),
        rhs: Array3::from_shape_fn((2, k, n), |(g, r, c)| v(g * 31 + r * n + c + 1)),
        group_sizes: vec![4, 3],
        dout: None,
        dtype: Format::Bf16,
        out_dtype: Format::F32,
        tail: TailContract::Zero,
    };
    let good = verify(
        &HostKernels {
            lib: library(),
            mma: false,
        },
        &case,
        Passes::FWD,
    )
    .verdict;
    assert!(good.passed(), "{:?}", good.failure());
    let bad = verify(
        &HostKernels {
            lib: planted_library(),
            mma: false,
        },
        &case,
        Passes::FWD,
    )
    .verdict;
    assert!(!bad.passed(), "the planted partial-K bug went unnoticed");
}

fn fmt_id(f: Format) -> i32 {
    if f == Format::E4m3 {
        0
    } else {
        1
    }
}

#[test]
fn fp8_casts_match_the_reference_bit_for_bit() {
    if skip() {
        return;
    }
    let enc = sym!("mc_encode", EncodeFn);
    let dec = sym!("mc_decode", DecodeFn);
    for f in [Format::E4m3, Format::E5m2] {
        for q in 0..=255u8 {
            // SAFETY: plain value function.
            let got = unsafe { dec(fmt_id(f), q) } as f64;
            let want = decode_fp8(q, f);
            assert!(
                got == want || (got.is_nan() && want.is_nan()),
                "{f:?} decode {q:#04x}: {got} vs {want}"
            );
        }
        // Every bf16 bit pattern (as f32), then a deterministic sweep of f32 patterns.
        let mut inputs: Vec<f32> = (0..=u16::MAX)
            .map(|b| f32::from_bits((b as u32) << 16))
            .collect();
        let mut z: u64 = 0x1234_5678;
        for _ in 0..400_000 {
            z = z
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            inputs.push(f32::from_bits((z >> 32) as u32));
        }
        for x in inputs {
            // SAFETY: plain value function.
            let got = unsafe { enc(fmt_id(f), x) };
            let want = encode_fp8(x as f64, f, Overflow::Saturate);
            assert_eq!(got, want, "{f:?} encode {x:e} ({:#010x})", x.to_bits());
        }
    }
}

/// The recipe as reference/src/fp8 documents it, per scope, in f32.
fn recipe(x: &[f32], f: Format) -> (f32, f32, f32, Vec<u8>) {
    let amax = x.iter().fold(0.0f32, |m, v| {
        if m.is_nan() || v.is_nan() {
            f32::NAN
        } else {
            m.max(v.abs())
        }
    });
    let fmax = if f == Format::E4m3 { 448.0f32 } else { 57344.0 };
    let mut scale = if amax.is_nan() || amax <= 0.0 || !amax.is_finite() {
        1.0
    } else {
        fmax / amax
    };
    if scale.is_infinite() {
        scale = f32::MAX;
    }
    let q = x
        .iter()
        .map(|&v| encode_fp8((v * scale) as f64, f, Overflow::Saturate))
        .collect();
    (amax, scale, 1.0 / scale, q)
}

#[test]
fn fp8_quantize_follows_the_recipe_per_scope() {
    if skip() {
        return;
    }
    let quant = sym!("mc_fp8_quantize", QuantFn);
    // Scopes: normal, empty, with a NaN, all zeros, a tiny amax (scale overflow), an outlier,
    // and one longer than a block.
    let scopes: Vec<Vec<f32>> = vec![
        vec![1.5, -3.25, 0.125, 7.0],
        vec![],
        vec![2.0, f32::NAN, -1.0],
        vec![0.0, -0.0, 0.0],
        vec![1e-39, -3e-40],
        vec![1e-3, 2e-3, -65000.0, 1e-6, f32::INFINITY],
        (0..700)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.37)
            .collect(),
    ];
    let x: Vec<f32> = scopes.iter().flatten().copied().collect();
    let mut bounds = vec![0i64];
    for s in &scopes {
        bounds.push(bounds.last().unwrap() + s.len() as i64);
    }
    for f in [Format::E4m3, Format::E5m2] {
        let n = scopes.len();
        let (mut amax, mut scale, mut sinv) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        let mut q = vec![0xaau8; x.len()];
        let widest = scopes.iter().map(Vec::len).max().unwrap();
        let (blocks, _) = grid_1d(widest, 256, 4096).unwrap();
        // SAFETY: arrays sized as the kernels expect (x and q: len; per-scope arrays: n).
        unsafe {
            quant(
                fmt_id(f),
                x.as_ptr(),
                bounds.as_ptr(),
                n as i32,
                amax.as_mut_ptr(),
                scale.as_mut_ptr(),
                sinv.as_mut_ptr(),
                q.as_mut_ptr(),
                blocks,
            )
        };
        for (s, vals) in scopes.iter().enumerate() {
            let (a, sc, si, qq) = recipe(vals, f);
            assert!(
                a.to_bits() == amax[s].to_bits() || (a.is_nan() && amax[s].is_nan()),
                "{f:?} scope {s} amax"
            );
            assert_eq!(sc.to_bits(), scale[s].to_bits(), "{f:?} scope {s} scale");
            assert_eq!(si.to_bits(), sinv[s].to_bits(), "{f:?} scope {s} scale_inv");
            let lo = bounds[s] as usize;
            assert_eq!(&q[lo..lo + vals.len()], &qq[..], "{f:?} scope {s} bytes");
        }
    }
}

/// FP8 grouped GEMM on small integers (exact f32 sums): fwd, dgrad, and wgrad through the
/// column-wise copies made by the transpose kernel; bit-exact against the f32 formula
/// `((Σ qa·qb) · sinv_a[g]) · sinv_b[g]`, zeros in tails and empty experts.
#[test]
fn fp8_grouped_gemm_passes_match_the_formula_exactly() {
    if skip() {
        return;
    }
    let gemm = sym!("mc_fp8_gemm", Fp8GemmFn);
    let transpose = sym!("mc_fp8_transpose", TransposeFn);
    let sizes = [3usize, 0, 70, 1, 0];
    let tail = 5;
    let (k, n) = (67usize, 9usize);
    let g = sizes.len();
    let used: usize = sizes.iter().sum();
    let m = used + tail;
    let off: Vec<usize> = std::iter::once(0)
        .chain(sizes.iter().scan(0, |a, s| {
            *a += s;
            Some(*a)
        }))
        .collect();
    let offs: Vec<i32> = off.iter().map(|&o| o as i32).collect();
    let int = |i: usize, f: Format| -> u8 {
        encode_fp8(((i * 2654435761) % 17) as f64 - 8.0, f, Overflow::Saturate)
    };
    let lhs: Vec<u8> = (0..m * k)
        .map(|i| {
            if i < used * k {
                int(i, Format::E4m3)
            } else {
                0
            }
        })
        .collect();
    let rhs: Vec<u8> = (0..g * k * n).map(|i| int(i + 7, Format::E4m3)).collect();
    let dout: Vec<u8> = (0..m * n)
        .map(|i| {
            if i < used * n {
                int(i + 3, Format::E5m2)
            } else {
                0
            }
        })
        .collect();
    let s_lhs: Vec<f32> = (0..g).map(|i| 0.5f32.powi(i as i32) / 3.0).collect();
    let s_rhs: Vec<f32> = (0..g).map(|i| 1.7f32 * (i + 1) as f32).collect();
    let s_dout: Vec<f32> = (0..g).map(|i| 0.01f32 + i as f32).collect();
    let d4 = |q: u8| decode_fp8(q, Format::E4m3) as f32;
    let d5 = |q: u8| decode_fp8(q, Format::E5m2) as f32;
    // Column-wise copies by the kernel.
    let colwise = |q: &[u8], cols: usize| -> Vec<u8> {
        let mut qt = vec![0u8; q.len()];
        if let Some((blocks, _)) = grid_1d(used * cols, 256, 4096) {
            // SAFETY: q and qt hold m*cols bytes; offsets G+1 entries.
            unsafe {
                transpose(
                    q.as_ptr(),
                    cols as i64,
                    offs.as_ptr(),
                    g as i32,
                    qt.as_mut_ptr(),
                    blocks,
                )
            };
        }
        qt
    };
    let lhs_col = colwise(&lhs, k);
    let dout_col = colwise(&dout, n);
    for (gi, w) in off.windows(2).enumerate() {
        let s = w[1] - w[0];
        for r in 0..s {
            for c in 0..k {
                assert_eq!(
                    lhs_col[w[0] * k + c * s + r],
                    lhs[(w[0] + r) * k + c],
                    "transpose g{gi}"
                );
            }
        }
    }
    for (p, pass) in Pass::ALL.iter().enumerate() {
        let plan = plan_tiles(*pass, &sizes, m, k, n).unwrap();
        let (gx, gy) = plan.grid().unwrap();
        let (a, b, sa, sb, len) = match pass {
            Pass::Fwd => (&lhs, &rhs, &s_lhs, &s_rhs, m * n),
            Pass::Dgrad => (&dout, &rhs, &s_dout, &s_rhs, m * k),
            Pass::Wgrad => (&lhs_col, &dout_col, &s_lhs, &s_dout, g * k * n),
        };
        let mut out = vec![f32::NAN; len];
        let tiles = plan.flat();
        // SAFETY: as the GPU launch; all arrays are sized per kernels/fp8.cu.
        unsafe {
            gemm(
                p as i32,
                a.as_ptr(),
                b.as_ptr(),
                sa.as_ptr(),
                sb.as_ptr(),
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
        let scaled = |acc: f32, gi: usize, red: usize| {
            if red == 0 {
                0.0
            } else {
                (acc * sa[gi]) * sb[gi]
            }
        };
        for gi in 0..g {
            let (lo, hi) = (off[gi], off[gi + 1]);
            match pass {
                Pass::Fwd | Pass::Dgrad => {
                    let (cols, red) = if *pass == Pass::Fwd { (n, k) } else { (k, n) };
                    for r in lo..hi {
                        for c in 0..cols {
                            let acc: f32 = (0..red)
                                .map(|i| {
                                    if *pass == Pass::Fwd {
                                        d4(lhs[r * k + i]) * d4(rhs[gi * k * n + i * n + c])
                                    } else {
                                        d5(dout[r * n + i]) * d4(rhs[gi * k * n + c * n + i])
                                    }
                                })
                                .fold(0.0f32, |s, x| s + x);
                            let want = scaled(acc, gi, red);
                            assert_eq!(
                                out[r * cols + c].to_bits(),
                                want.to_bits(),
                                "{pass} r{r} c{c}"
                            );
                        }
                    }
                }
                Pass::Wgrad => {
                    for kk in 0..k {
                        for c in 0..n {
                            let acc: f32 = (lo..hi)
                                .map(|r| d4(lhs[r * k + kk]) * d5(dout[r * n + c]))
                                .fold(0.0f32, |s, x| s + x);
                            let want = scaled(acc, gi, hi - lo);
                            assert_eq!(
                                out[gi * k * n + kk * n + c].to_bits(),
                                want.to_bits(),
                                "wgrad g{gi} k{kk} n{c}"
                            );
                        }
                    }
                }
            }
        }
        if *pass != Pass::Wgrad {
            let cols = if *pass == Pass::Fwd { n } else { k };
            assert!(
                out[used * cols..].iter().all(|&v| v.to_bits() == 0),
                "{pass}: tail not exactly +0"
            );
        }
    }
}

/// Group-limited top-k (lower index wins ties), position-policy capacity, group sizes and
/// the stable permutation, against a direct statement of each rule.
#[test]
fn routing_kernels_follow_the_rules() {
    if skip() {
        return;
    }
    let routing = sym!("mc_routing", RoutingFn);
    let (t, e, k, groups, topk_groups, seq, cap) =
        (37usize, 16usize, 3usize, 4usize, 2usize, 10usize, 2usize);
    // Scores on a coarse grid so that ties are frequent.
    let scores: Vec<f32> = (0..t * e)
        .map(|i| (((i * 2654435761usize) >> 5) % 7) as f32 * 0.125)
        .collect();
    let bias: Vec<f32> = (0..e)
        .map(|i| if i % 5 == 0 { 0.25 } else { 0.0 })
        .collect();
    let mut idx = vec![0i32; t * k];
    let mut w = vec![0f32; t * k];
    let mut kept = vec![0u8; t * k];
    let mut sizes = vec![0i32; e];
    let mut offs = vec![0i32; e + 1];
    let mut pos = vec![-1i32; t * k];
    // SAFETY: arrays sized T*K, E, E+1 as the kernels expect.
    unsafe {
        routing(
            scores.as_ptr(),
            bias.as_ptr(),
            t as i32,
            e as i32,
            k as i32,
            groups as i32,
            topk_groups as i32,
            seq as i32,
            cap as i32,
            idx.as_mut_ptr(),
            w.as_mut_ptr(),
            kept.as_mut_ptr(),
            sizes.as_mut_ptr(),
            offs.as_mut_ptr(),
            pos.as_mut_ptr(),
        )
    };
    let per = e / groups;
    for tok in 0..t {
        let sel = |x: usize| scores[tok * e + x] + bias[x];
        // Group scores: sum of the top two; best groups by (score desc, index asc).
        let mut gs: Vec<(f32, usize)> = (0..groups)
            .map(|g| {
                let mut v: Vec<f32> = (g * per..(g + 1) * per).map(sel).collect();
                v.sort_by(|a, b| b.partial_cmp(a).unwrap());
                (v[0] + v[1], g)
            })
            .collect();
        gs.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
        let allowed: Vec<usize> = gs[..topk_groups].iter().map(|x| x.1).collect();
        let mut cand: Vec<usize> = (0..e).filter(|x| allowed.contains(&(x / per))).collect();
        cand.sort_by(|&a, &b| sel(b).partial_cmp(&sel(a)).unwrap().then(a.cmp(&b)));
        for j in 0..k {
            assert_eq!(idx[tok * k + j], cand[j] as i32, "token {tok} slot {j}");
            assert_eq!(
                w[tok * k + j],
                scores[tok * e + cand[j]],
                "weights are pre-bias scores"
            );
        }
    }
    // Capacity: per sequence and expert, the first `cap` assignments (token-major) survive.
    let mut count = vec![0usize; e * t.div_ceil(seq)];
    for a in 0..t * k {
        let c = &mut count[(a / k / seq) * e + idx[a] as usize];
        assert_eq!(kept[a], (*c < cap) as u8, "assignment {a}");
        *c += 1;
    }
    // Sizes, then a stable sort by expert with the dropped ones at the tail in order.
    for (x, &size) in sizes.iter().enumerate() {
        let want = (0..t * k)
            .filter(|&a| kept[a] == 1 && idx[a] == x as i32)
            .count();
        assert_eq!(size as usize, want, "expert {x}");
    }
    let mut order: Vec<usize> = (0..t * k).collect();
    order.sort_by_key(|&a| {
        if kept[a] == 1 {
            (0, idx[a], a)
        } else {
            (1, 0, a)
        }
    });
    for (p, &a) in order.iter().enumerate() {
        assert_eq!(pos[a], p as i32, "assignment {a}");
    }
}
