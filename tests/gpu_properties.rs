//! Every property (properties/) against the GPU implementations `cuda`, `cuda-tiled`,
//! `cublas` and `cublas-grouped`.
//!
//! Without a usable CUDA device this prints one loud line,
//! `GPU properties: SKIPPED — no CUDA device (<reason>)`, and asserts nothing: it is counted
//! as nothing anywhere (README, selftest). The GPU suite has been run only where
//! docs/ holds a GPU report (scripts/gpu-check).
#![cfg(feature = "cuda")]

use moecheck::cuda::{build, unavailable_reason, IMPL_NAMES};
use moecheck_properties::{all, check, RunConfig};

#[test]
fn every_property_holds_on_every_gpu_implementation() {
    if let Some(why) = unavailable_reason() {
        println!("GPU properties: SKIPPED — no CUDA device ({why})");
        eprintln!("GPU properties: SKIPPED — no CUDA device ({why})");
        return;
    }
    let config = RunConfig::default();
    let mut failures = Vec::new();
    for name in IMPL_NAMES {
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
