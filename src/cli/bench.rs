//! `moecheck bench`: throughput of the f64 reference grouped GEMM relative to one dense f64
//! GEMM with the same total FLOPs, measured in the same run (interleaved repetitions, median).

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use ndarray::{Array2, Array3};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use moecheck::cases::{group_sizes, GemmSpec, Routing};
use moecheck_reference::format::Format;
use moecheck_reference::gemm::{case::offsets, grouped_fwd, TailContract};

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[arg(long, default_value_t = 256)]
    pub experts: usize,
    /// Rows M (all routed: no tail, so both sides do the same FLOPs).
    #[arg(long, default_value_t = 16384)]
    pub rows: usize,
    #[arg(long, default_value_t = 1024)]
    pub k: usize,
    #[arg(long, default_value_t = 512)]
    pub n: usize,
    /// Empty experts among them.
    #[arg(long, default_value_t = 16)]
    pub empty: usize,
    #[arg(long, value_enum, default_value = "skewed")]
    pub routing: Routing,
    /// Interleaved repetitions of each side; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, serde::Serialize)]
struct BenchReport {
    m: usize,
    k: usize,
    n: usize,
    experts: usize,
    empty_experts: usize,
    smallest_nonempty_group: usize,
    largest_group: usize,
    reps: usize,
    dense_median_s: f64,
    grouped_median_s: f64,
    dense_gflops: f64,
    grouped_gflops: f64,
    /// grouped throughput / dense throughput
    ratio: f64,
}

pub fn run(a: BenchArgs) -> anyhow::Result<ExitCode> {
    if a.reps == 0 || a.experts == 0 || a.empty >= a.experts {
        anyhow::bail!("--reps and --experts must be positive and --empty below --experts");
    }
    let spec = GemmSpec {
        experts: a.experts,
        tokens: a.rows,
        topk: 1,
        hidden: a.k,
        ffn: a.n,
        dtype: Format::F32,
        out_dtype: Format::F32,
        routing: a.routing,
        empty: a.empty,
        drop_frac: 0.0,
        seed: 1,
        tail: TailContract::Zero,
    };
    spec.validate().map_err(anyhow::Error::msg)?;
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let sizes = group_sizes(&spec, &mut rng);
    let off = offsets(&sizes);
    let lhs =
        Array2::<f64>::from_shape_fn((a.rows, a.k), |(i, j)| ((i * 7 + j * 13) % 17) as f64 - 8.0);
    let rhs = Array3::<f64>::from_shape_fn((a.experts, a.k, a.n), |(g, i, j)| {
        ((g + i * 3 + j * 5) % 11) as f64 - 5.0
    });
    let dense_rhs = rhs.index_axis(ndarray::Axis(0), 0).to_owned();
    let mut dense = Vec::new();
    let mut grouped = Vec::new();
    for _ in 0..a.reps {
        let t = Instant::now();
        let out = lhs.dot(&dense_rhs);
        dense.push(t.elapsed().as_secs_f64());
        std::hint::black_box(out);
        let t = Instant::now();
        let out = grouped_fwd(lhs.view(), rhs.view(), &off);
        grouped.push(t.elapsed().as_secs_f64());
        std::hint::black_box(out);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (td, tg) = (median(&mut dense), median(&mut grouped));
    let flops = 2.0 * a.rows as f64 * a.k as f64 * a.n as f64;
    let r = BenchReport {
        m: a.rows,
        k: a.k,
        n: a.n,
        experts: a.experts,
        empty_experts: sizes.iter().filter(|s| **s == 0).count(),
        smallest_nonempty_group: sizes.iter().copied().filter(|s| *s > 0).min().unwrap_or(0),
        largest_group: sizes.iter().copied().max().unwrap_or(0),
        reps: a.reps,
        dense_median_s: td,
        grouped_median_s: tg,
        dense_gflops: flops / td / 1e9,
        grouped_gflops: flops / tg / 1e9,
        ratio: td / tg,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "M={} K={} N={} experts={} ({} empty, groups {}..{} rows), {} reps, median:",
            r.m,
            r.k,
            r.n,
            r.experts,
            r.empty_experts,
            r.smallest_nonempty_group,
            r.largest_group,
            r.reps
        );
        println!(
            "  dense f64 GEMM      {:>8.3} s  {:>7.1} GFLOP/s",
            r.dense_median_s, r.dense_gflops
        );
        println!(
            "  grouped f64 (ref)   {:>8.3} s  {:>7.1} GFLOP/s",
            r.grouped_median_s, r.grouped_gflops
        );
        println!("  ratio grouped/dense {:>8.3}x", r.ratio);
    }
    Ok(ExitCode::SUCCESS)
}
