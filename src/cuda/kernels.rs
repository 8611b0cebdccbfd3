//! The kernel modules (kernels/*.cu), embedded in the binary, and their entry-point names.
//!
//! Each module is one `.cu` file; `#include "common.cuh"` is expanded here (NVRTC gets one
//! self-contained source and needs no include path). Entry points are `extern "C"` and named
//! `op_dtype`; [`kernel_name`] is the one place the Rust side builds such a name.

use moecheck_reference::format::Format;

/// The shared headers, inlined into the modules that include them.
pub const HEADERS: [(&str, &str); 2] = [
    ("common.cuh", include_str!("../../kernels/common.cuh")),
    ("gemm_tile.cuh", include_str!("../../kernels/gemm_tile.cuh")),
];

/// A kernel module: one `.cu` file, compiled on first use and cached per device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelModule {
    /// `kernels/grouped_gemm.cu`: fwd/dgrad/wgrad, tiled (f32, bf16, f16) and mma (bf16, f16).
    GroupedGemm,
    /// `kernels/fp8.cu`: amax, scale, saturating casts, transpose, FP8 grouped GEMM.
    Fp8,
    /// `kernels/routing.cu`: scores, group-limited top-k, capacity, permute/unpermute.
    Routing,
}

impl KernelModule {
    pub const ALL: [KernelModule; 3] = [
        KernelModule::GroupedGemm,
        KernelModule::Fp8,
        KernelModule::Routing,
    ];

    /// The file name under kernels/.
    pub fn file(self) -> &'static str {
        match self {
            KernelModule::GroupedGemm => "grouped_gemm.cu",
            KernelModule::Fp8 => "fp8.cu",
            KernelModule::Routing => "routing.cu",
        }
    }

    fn raw(self) -> &'static str {
        match self {
            KernelModule::GroupedGemm => include_str!("../../kernels/grouped_gemm.cu"),
            KernelModule::Fp8 => include_str!("../../kernels/fp8.cu"),
            KernelModule::Routing => include_str!("../../kernels/routing.cu"),
        }
    }

    /// The self-contained source handed to NVRTC: each `#include "x.cuh"` line is replaced by
    /// the header's text the first time and dropped after (what `#pragma once` means).
    pub fn source(self) -> String {
        let mut seen = Vec::new();
        expand(self.raw(), &mut seen)
    }

    /// Every `extern "C"` entry point this module must export (checked by the NVRTC test
    /// against the compiled PTX).
    pub fn entry_points(self) -> Vec<String> {
        let mut v = Vec::new();
        match self {
            KernelModule::GroupedGemm => {
                for pass in ["fwd", "dgrad", "wgrad"] {
                    for dt in [Format::F32, Format::Bf16, Format::F16] {
                        v.push(kernel_name(&format!("grouped_gemm_{pass}_tiled"), dt));
                    }
                    for dt in [Format::Bf16, Format::F16] {
                        v.push(kernel_name(&format!("grouped_gemm_{pass}_mma"), dt));
                    }
                }
                v.push("fill_f32".into());
                v.push("fill_u16".into());
            }
            KernelModule::Fp8 => {
                v.push("fp8_amax_f32".into());
                v.push("fp8_scale_f32".into());
                for dt in [Format::E4m3, Format::E5m2] {
                    v.push(kernel_name("fp8_cast", dt));
                    v.push(kernel_name("fp8_decode", dt));
                }
                v.push("fp8_transpose_groups_u8".into());
                for name in [
                    "fp8_grouped_gemm_fwd_e4m3_e4m3",
                    "fp8_grouped_gemm_dgrad_e5m2_e4m3",
                    "fp8_grouped_gemm_wgrad_e4m3_e5m2",
                ] {
                    v.push(name.into());
                }
            }
            KernelModule::Routing => {
                for s in [
                    "routing_scores",
                    "routing_topk",
                    "routing_capacity_position",
                ] {
                    v.push(s.into());
                }
                for s in [
                    "routing_group_sizes",
                    "routing_permute_index",
                    "routing_gather_rows_f32",
                    "routing_combine_f32",
                ] {
                    v.push(s.into());
                }
            }
        }
        v
    }
}

fn expand(src: &str, seen: &mut Vec<&'static str>) -> String {
    let mut out = String::with_capacity(src.len());
    for line in src.lines() {
        let t = line.trim();
        if t == "#pragma once" {
            continue;
        }
        if let Some(rest) = t.strip_prefix("#include \"") {
            let name = rest.trim_end_matches('"');
            if let Some((n, text)) = HEADERS.iter().find(|(n, _)| *n == name) {
                if !seen.contains(n) {
                    seen.push(n);
                    out.push_str(&expand(text, seen));
                }
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Compiles `module` for `arch` (`sm_90`) with NVRTC and returns the PTX text, or NVRTC's log.
/// Loads libnvrtc first ([`super::libs::ensure`]); never panics when it is missing.
#[cfg(feature = "cuda")]
pub fn compile_ptx(module: KernelModule, arch: &str) -> Result<String, String> {
    use super::libs::{ensure, Lib};
    let found = ensure(Lib::Nvrtc);
    if let super::libs::Found::Missing(why) = found {
        return Err(format!("NVRTC unavailable: {why}"));
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: nvrtc_options(arch),
        name: Some(module.file().to_string()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(module.source(), opts)
        .map(|p| p.to_src())
        .map_err(|e| format!("{} for {arch}: {e:?}", module.file()))
}

/// Compiles `module` for the real arch `arch` (`sm_90`) all the way to a CUBIN (NVRTC runs
/// ptxas, so the inline PTX — `mma.sync`, `cvt` — is assembled and checked too) and returns it,
/// or NVRTC's log. No GPU needed. The device loads this CUBIN (no driver JIT, so an NVRTC newer
/// than the driver still works); PTX is the fallback.
#[cfg(feature = "cuda")]
pub fn compile_cubin(module: KernelModule, arch: &str) -> Result<Vec<u8>, String> {
    use cudarc::nvrtc::{result, sys};
    use std::ffi::CString;
    if let super::libs::Found::Missing(why) = super::libs::ensure(super::libs::Lib::Nvrtc) {
        return Err(format!("NVRTC unavailable: {why}"));
    }
    let src = CString::new(module.source()).map_err(|e| e.to_string())?;
    let name = CString::new(module.file()).map_err(|e| e.to_string())?;
    let prog = result::create_program(&src, Some(&name)).map_err(|e| format!("{e:?}"))?;
    // SAFETY: `prog` was created above and is destroyed once below; `src` and `name` outlive
    // it; the size is written to a valid host location.
    let out = unsafe {
        let r = match result::compile_program(prog, &nvrtc_options(arch)) {
            Ok(()) => {
                let mut size = 0usize;
                match sys::nvrtcGetCUBINSize(prog, &mut size) {
                    sys::nvrtcResult::NVRTC_SUCCESS => {
                        let mut buf = vec![0u8; size];
                        match sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut std::ffi::c_char) {
                            sys::nvrtcResult::NVRTC_SUCCESS => Ok(buf),
                            e => Err(format!("no CUBIN for {arch}: {e:?}")),
                        }
                    }
                    e => Err(format!("no CUBIN for {arch}: {e:?}")),
                }
            }
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(|l| {
                        let bytes: Vec<u8> =
                            l.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
                        String::from_utf8_lossy(&bytes).into_owned()
                    })
                    .unwrap_or_default();
                Err(format!("{} for {arch}: {e:?}\n{log}", module.file()))
            }
        };
        let _ = result::destroy_program(prog);
        r
    };
    out
}

/// The suffix of a dtype in entry-point names.
pub fn dtype_suffix(dtype: Format) -> &'static str {
    match dtype {
        Format::F64 => "f64",
        Format::F32 => "f32",
        Format::Bf16 => "bf16",
        Format::F16 => "f16",
        Format::E4m3 => "e4m3",
        Format::E5m2 => "e5m2",
    }
}

/// `op_dtype`, the name the kernel macros generate (`grouped_gemm_fwd_tiled_bf16`).
pub fn kernel_name(op: &str, dtype: Format) -> String {
    format!("{op}_{}", dtype_suffix(dtype))
}

/// NVRTC options for `arch` (`sm_90`): no FMA contraction (the FP8 recipe's products must be
/// rounded as written; the GEMM kernels call `fmaf` explicitly), IEEE division and sqrt.
pub fn nvrtc_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--fmad=false".into(),
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
        "--std=c++17".into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_macro_convention() {
        assert_eq!(
            kernel_name("grouped_gemm_fwd_tiled", Format::Bf16),
            "grouped_gemm_fwd_tiled_bf16"
        );
        assert_eq!(kernel_name("fp8_cast", Format::E5m2), "fp8_cast_e5m2");
    }

    #[test]
    fn sources_inline_the_header_and_name_every_entry_point() {
        for m in KernelModule::ALL {
            let src = m.source();
            assert!(
                !src.contains("#include"),
                "{} still includes a file",
                m.file()
            );
            assert!(
                src.contains("fp8_encode_sat"),
                "{} lacks common.cuh",
                m.file()
            );
            assert_eq!(
                src.matches("#define MC_DEVICE").count(),
                1,
                "{}: common.cuh inlined more than once",
                m.file()
            );
            for e in m.entry_points() {
                // Either spelled out or produced by a macro from its stem.
                let stem = e.rsplit_once('_').map(|(s, _)| s).unwrap_or(&e);
                assert!(
                    src.contains(&e) || src.contains(stem),
                    "{}: no trace of entry point {e}",
                    m.file()
                );
            }
        }
    }
}
