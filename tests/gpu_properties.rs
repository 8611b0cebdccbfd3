//! Every property (properties/) against the GPU implementations `cuda`, `cuda-tiled`,
//! `cublas` and `cublas-grouped`.
//!
//! Without a usable CUDA device this prints one loud line,
//! `GPU properties: SKIPPED — no CUDA device (<reason>)`, and asserts nothing: it is counted
//! as nothing anywhere (README, selftest). The GPU suite has been run only where
//! docs/ holds a GPU report (scripts/gpu-check).
//!
//! `MOECHECK_GPU_IMPLS=cuda,cublas` restricts the implementations (scripts/gpu-check runs each
//! in its own process, so that a crash in one cannot hide the others' results).
#![cfg(feature = "cuda")]

use moecheck::cuda::{build, unavailable_reason, IMPL_NAMES};
use moecheck_properties::{all, check, RunConfig};
use moecheck_reference::format::Format;

#[test]
fn every_property_holds_on_every_gpu_implementation() {
    let probe = moecheck::cuda::device::probe();
    if probe.devices.is_empty() {
        let why = unavailable_reason().unwrap_or_default();
        println!("GPU properties: SKIPPED — no CUDA device ({why})");
        eprintln!("GPU properties: SKIPPED — no CUDA device ({why})");
        return;
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
        return;
    }
    if !has("libcublas") {
        println!("GPU properties: cublas, cublas-grouped SKIPPED — libcublas not found");
        names.retain(|n| !n.starts_with("cublas"));
        if names.is_empty() {
            return;
        }
    }
    assert!(
        !names.is_empty(),
        "MOECHECK_GPU_IMPLS={only:?} names no implementation"
    );
    for dt in [Format::Bf16, Format::F16] {
        println!(
            "cublas-grouped accepts an f32 output with {} inputs: {}",
            dt.name(),
            moecheck::cuda::cublas::grouped_f32_output_supported(dt)
        );
    }
    println!("{} cases per property", config.cases);
    let mut failures = Vec::new();
    for name in names {
        let imp = build(name).expect("every IMPL_NAMES entry builds");
        for p in all() {
            let o = check(&p, imp.as_ref(), &config);
            println!(
                "{name:16} {:28} {}",
                p.name,
                if o.passed() { "pass" } else { "FAIL" }
            );
            if !o.passed() {
                failures.push(format!("{name}: {}: {o:?}", p.name));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "GPU property failures:\n{}",
        failures.join("\n")
    );
}
