//! Every property (properties/) against the GPU implementations `cuda`, `cuda-tiled`,
//! `cublas` and `cublas-grouped`.
//!
//! A `harness = false` test (Cargo.toml): without a usable CUDA device it prints one loud line,
//! `GPU properties: SKIPPED — no CUDA device (<reason>)`, and exits 0 without reporting any test
//! as passed, so it is counted as nothing anywhere (cargo's totals, README, selftest). With a
//! device it prints one line per (implementation, property) and a closing
//! `gpu properties: N passed, M failed`, and exits 1 when anything failed. Arguments
//! (`--nocapture` and the like, passed by cargo or scripts/gpu-check) are ignored. The GPU suite has been run only where
//! docs/ holds a GPU report (scripts/gpu-check).
//!
//! `MOECHECK_GPU_IMPLS=cuda,cublas` restricts the implementations (scripts/gpu-check runs each
//! in its own process, so that a crash in one cannot hide the others' results).

#[cfg(feature = "cuda")]
use moecheck::cuda::{build, unavailable_reason, IMPL_NAMES};
#[cfg(feature = "cuda")]
use moecheck_properties::{check, PropertyOp, RunConfig};
#[cfg(feature = "cuda")]
use moecheck_reference::format::Format;

#[cfg(not(feature = "cuda"))]
fn main() {
    println!("GPU properties: SKIPPED — built without the `cuda` feature");
}

#[cfg(feature = "cuda")]
fn main() -> std::process::ExitCode {
    let failures = every_property_on_every_gpu_implementation();
    if failures.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        eprintln!("GPU property failures:\n{}", failures.join("\n"));
        std::process::ExitCode::FAILURE
    }
}

/// Runs the suite; returns one line per failing (implementation, property).
#[cfg(feature = "cuda")]
fn every_property_on_every_gpu_implementation() -> Vec<String> {
    let probe = moecheck::cuda::device::probe();
    if probe.devices.is_empty() {
        let why = unavailable_reason().unwrap_or_default();
        println!("GPU properties: SKIPPED — no CUDA device ({why})");
        return Vec::new();
    }
    let has = |lib: &str| probe.libraries.iter().any(|l| l.name == lib && l.found);
    let config = RunConfig::default();
    let only = std::env::var("MOECHECK_GPU_IMPLS").ok();
    let mut names: Vec<&str> = IMPL_NAMES
        .into_iter()
        .filter(|n| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|x| x.trim() == *n))
        })
        .collect();
    if !has("libnvrtc") {
        println!(
            "GPU properties: SKIPPED — libnvrtc not found (every GPU implementation needs it)"
        );
        return Vec::new();
    }
    if !has("libcublas") {
        println!("GPU properties: cublas, cublas-grouped SKIPPED — libcublas not found");
        names.retain(|n| !n.starts_with("cublas"));
        if names.is_empty() {
            return Vec::new();
        }
    }
    if names.is_empty() {
        return vec![format!(
            "MOECHECK_GPU_IMPLS={only:?} names no implementation"
        )];
    }
    for dt in [Format::Bf16, Format::F16] {
        println!(
            "cublas-grouped accepts an f32 output with {} inputs: {}",
            dt.name(),
            moecheck::cuda::cublas::grouped_f32_output_supported(dt)
        );
    }
    println!("{} cases per property", config.cases);
    let (mut passed, mut failures) = (0usize, Vec::new());
    for name in names {
        let imp = build(name).expect("every IMPL_NAMES entry builds");
        for p in moecheck_reference::gemm::Gemm::properties() {
            let o = check(&p, imp.as_ref(), &config);
            println!(
                "{name:16} {:28} {}",
                p.name,
                if o.passed() { "pass" } else { "FAIL" }
            );
            if o.passed() {
                passed += 1;
            } else {
                failures.push(format!("{name}: {}: {o:?}", p.name));
            }
        }
    }
    println!("gpu properties: {passed} passed, {} failed", failures.len());
    failures
}
