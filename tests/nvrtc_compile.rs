//! Every kernel module compiles with NVRTC for sm_80, sm_89 and sm_90 — to PTX, and on to a
//! CUBIN so that ptxas checks the inline PTX — and exports every entry point the host side
//! names. Needs no GPU: NVRTC comes from the PyPI wheel
//! `nvidia-cuda-nvrtc` (requirements.txt, installed by .ci/run), found by
//! `moecheck::cuda::libs` without any environment variable.
//!
//! Set `MOECHECK_SKIP_NVRTC=1` to skip on a machine without the wheel (it then prints one
//! SKIPPED line); by default a missing NVRTC is a failure, so CI cannot pass vacuously.
#![cfg(feature = "cuda")]

use moecheck::cuda::kernels::{compile_cubin, compile_ptx, KernelModule};
use moecheck::cuda::libs::{ensure, Found, Lib};

const ARCHS: [&str; 3] = ["sm_80", "sm_89", "sm_90"];

#[test]
fn every_kernel_compiles_for_every_arch() {
    if std::env::var("MOECHECK_SKIP_NVRTC").is_ok_and(|v| v == "1") {
        println!("NVRTC compile test: SKIPPED — MOECHECK_SKIP_NVRTC=1");
        return;
    }
    match ensure(Lib::Nvrtc) {
        Found::Missing(why) => panic!(
            "NVRTC not found ({why}); install it with `pip install -r requirements.txt` \
             (nvidia-cuda-nvrtc) or set MOECHECK_SKIP_NVRTC=1"
        ),
        found => println!("NVRTC: {}", found.describe()),
    }
    let mut failures = Vec::new();
    for module in KernelModule::ALL {
        for arch in ARCHS {
            // All the way to SASS: ptxas checks the inline PTX (mma.sync, cvt) for this arch.
            match compile_cubin(module, arch) {
                Ok(c) if !c.starts_with(b"\x7fELF") => failures.push(format!(
                    "{} {arch}: the CUBIN is not an ELF image",
                    module.file()
                )),
                Ok(c) => {
                    // Each entry point is a NUL-terminated name in the ELF string table (and
                    // a name no module defines is not found: the check can fail).
                    let absent = b"\0grouped_gemm_fwd_tiled_e4m3\0";
                    if c.windows(absent.len()).any(|w| w == absent) {
                        failures.push(format!("{} {arch}: symbol check is vacuous", module.file()));
                    }
                    for entry in module.entry_points() {
                        let sym = [b"\0", entry.as_bytes(), b"\0"].concat();
                        if !c.windows(sym.len()).any(|w| w == sym.as_slice()) {
                            failures
                                .push(format!("{} {arch}: no entry point {entry}", module.file()));
                        }
                    }
                    println!(
                        "assembled {} for {arch}: {} bytes of CUBIN",
                        module.file(),
                        c.len()
                    );
                }
                Err(log) => failures.push(format!("{} {arch}: {log}", module.file())),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "NVRTC failures:\n{}",
        failures.join("\n")
    );
}

/// The mma path really uses tensor cores where it is compiled for sm_80+.
#[test]
fn the_mma_kernels_emit_mma_sync() {
    if std::env::var("MOECHECK_SKIP_NVRTC").is_ok_and(|v| v == "1")
        || !ensure(Lib::Nvrtc).is_present()
    {
        println!("NVRTC mma test: SKIPPED — no NVRTC");
        return;
    }
    let ptx = compile_ptx(KernelModule::GroupedGemm, "sm_90").expect("compiles");
    // The PTX fallback exports the same entry points.
    for entry in KernelModule::GroupedGemm.entry_points() {
        assert!(
            ptx.contains(&format!(".entry {entry}(")),
            "PTX lacks {entry}"
        );
    }
    assert!(ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
    assert!(ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"));
}
