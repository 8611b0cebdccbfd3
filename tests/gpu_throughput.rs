//! Throughput of `cuda`, `cublas` and `cublas-grouped` at DeepSeek-V3 MoE sizes (256 experts,
//! 4096 tokens, top-8, hidden 7168, ffn 2048, bf16): a measurement for scripts/gpu-check,
//! not a test. `#[ignore]`d so that `cargo test` never runs it; run it with `--ignored` on a
//! GPU machine. Without a device it prints SKIPPED.
//!
//! Measured, best of `MOECHECK_BENCH_REPS` (default 3) runs after `MOECHECK_BENCH_WARMUP`
//! (default 1) untimed ones:
//! * device time of the pass's compute, from CUDA events around it
//!   (`moecheck::cuda::device::last_compute_ms`): our kernel launch; cuBLAS's zero fills and
//!   per-expert calls; cuBLAS grouped's zero fills, pointer-array upload and grouped call.
//!   TFLOP/s = 2 · rows_used · K · N / time.
//! * wall time of the whole `Implementation::run` (uploads, NaN poison, download, conversion to
//!   f64 included), for scale.
//!
//! `MOECHECK_BENCH_PASSES=wgrad` and `MOECHECK_BENCH_IMPLS=cublas-grouped` (comma-separated)
//! restrict the table to some rows (a rerun within a short device lease: at DeepSeek-V3's
//! size a wgrad run holds 15 GB of f32 output on the host, about 30 s of wall each).
#![cfg(feature = "cuda")]

use std::time::Instant;

use moecheck::cuda::device::last_compute_ms;
use moecheck::cuda::{build, unavailable_reason};
use moecheck::generate::gemm::{generate, GemmSpec, Spread};
use moecheck_reference::format::Format;
use moecheck_reference::gemm::{Pass, Passes, TailContract};

/// Whether `name` is in the comma-separated list in `var` (every name when it is unset).
fn selected(var: &str, name: &str) -> bool {
    std::env::var(var).map_or(true, |v| v.split(',').any(|s| s.trim() == name))
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
#[ignore = "GPU measurement for scripts/gpu-check"]
fn throughput_table() {
    if let Some(why) = unavailable_reason() {
        println!("GPU throughput: SKIPPED — no CUDA device ({why})");
        return;
    }
    let spec = GemmSpec {
        experts: env_usize("MOECHECK_BENCH_EXPERTS", 256),
        tokens: env_usize("MOECHECK_BENCH_TOKENS", 4096),
        topk: 8,
        hidden: env_usize("MOECHECK_BENCH_HIDDEN", 7168),
        ffn: env_usize("MOECHECK_BENCH_FFN", 2048),
        dtype: Format::Bf16,
        out_dtype: Format::F32,
        spread: Spread::Skewed,
        empty: 2,
        drop_frac: 0.05,
        seed: 0,
        tail: TailContract::Zero,
        passes: Passes::ALL,
    };
    let reps = env_usize("MOECHECK_BENCH_REPS", 3).max(1);
    let warmup = env_usize("MOECHECK_BENCH_WARMUP", 1);
    let case = generate(&spec);
    let used = case.rows_used() as f64;
    let flops = 2.0 * used * case.k() as f64 * case.n() as f64;
    println!(
        "| pass | impl | device ms | TFLOP/s | wall s (incl. transfers) |\n|---|---|---|---|---|"
    );
    for pass in Pass::ALL
        .into_iter()
        .filter(|p| selected("MOECHECK_BENCH_PASSES", &p.to_string()))
    {
        for name in ["cuda", "cublas", "cublas-grouped"]
            .into_iter()
            .filter(|n| selected("MOECHECK_BENCH_IMPLS", n))
        {
            let imp = build(name).expect("builds");
            let (mut best_wall, mut best_ms) = (f64::INFINITY, f64::INFINITY);
            let mut err = None;
            for rep in 0..warmup + reps {
                let t = Instant::now();
                match imp.run(&case, Passes::only(pass)) {
                    // The warm-ups absorb NVRTC compiles and cuBLAS's first-call setup.
                    Ok(_) if rep >= warmup => {
                        best_wall = best_wall.min(t.elapsed().as_secs_f64());
                        best_ms = best_ms.min(last_compute_ms().unwrap_or(f64::INFINITY));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        err = Some(e.to_string());
                        break;
                    }
                }
            }
            match err {
                None => println!(
                    "| {pass} | {name} | {best_ms:.2} | {:.1} | {best_wall:.2} |",
                    flops / (best_ms / 1e3) / 1e12
                ),
                Some(e) => println!("| {pass} | {name} | failed: {e} | - | - |"),
            }
        }
    }
}
