//! `moecheck bench`: throughput of the f64 reference grouped GEMM (forward) relative to one
//! dense f64 GEMM with the same total FLOPs, measured in the same run: each repetition times
//! both back to back (alternating which goes first) and the report gives the median of the
//! per-repetition ratios, with their spread.

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use ndarray::{Array2, Array3};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use moecheck::generate::gemm::{group_sizes, GemmSpec, Spread};
use moecheck_reference::format::Format;
use moecheck_reference::gemm::{case::offsets, grouped_fwd, grouped_fwd_into, TailContract};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Experts E (groups), sized by --routing.
    #[arg(long, default_value_t = 256)]
    pub experts: usize,
    /// Rows M (all routed: no tail, so both sides do the same FLOPs).
    #[arg(long, default_value_t = 16384)]
    pub rows: usize,
    /// Shared dimension K (hidden size).
    #[arg(long, default_value_t = 1024)]
    pub k: usize,
    /// Output columns N (FFN size).
    #[arg(long, default_value_t = 512)]
    pub n: usize,
    /// Empty experts among them.
    #[arg(long, default_value_t = DEFAULT_EMPTY)]
    pub empty: usize,
    #[arg(long, value_enum, default_value = "skewed")]
    pub routing: Spread,
    /// Interleaved repetitions of each side; the median ratio is reported.
    #[arg(long, default_value_t = 7)]
    pub reps: usize,
    /// Time the allocating calls (`lhs.dot(rhs)` against `grouped_fwd`, each also paying for
    /// first-touching a fresh (M, N) output) instead of GEMMs into preallocated outputs.
    #[arg(long)]
    pub alloc: bool,
    /// Instead of the kernel benchmark: whole `moecheck gemm` runs, each in its own process,
    /// with wall time, peak memory and verdict, beside three dense f64 GEMMs of the mid-size
    /// case's FLOPs timed in the same run. By default the sizes with targets (E=64
    /// M=4096 K=2048 N=1024; DeepSeek-V3's 256 x 7168 x 2048 at 4096 tokens x top-8, emulate
    /// and FP8); a case refused by the memory guard shows its reason.
    #[arg(long)]
    pub end_to_end: bool,
    /// With --end-to-end: a moecheck command line to run instead of the defaults
    /// (repeatable), e.g. --case "gemm --experts 8 --impl emulate".
    #[arg(long = "case", value_name = "ARGS")]
    pub cases: Vec<String>,
    /// With --end-to-end: run each case this many times in a row and report the median run
    /// (every run's wall time is listed).
    #[arg(long, value_name = "N")]
    pub runs: Option<usize>,
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
    /// Whether the timed calls allocate their outputs (`--alloc`).
    alloc: bool,
    /// 1-minute load average before and after (Linux `/proc/loadavg`; -1 if unknown).
    load_before: f64,
    load_after: f64,
    dense_median_s: f64,
    grouped_median_s: f64,
    dense_gflops: f64,
    grouped_gflops: f64,
    /// Median over repetitions of (dense time / grouped time), i.e. grouped throughput
    /// relative to dense; the spread is the smallest and largest per-repetition ratio.
    ratio: f64,
    ratio_min: f64,
    ratio_max: f64,
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(-1.0)
}

/// Empty experts when `--empty` is not given.
const DEFAULT_EMPTY: usize = 16;

pub fn run(a: BenchArgs) -> anyhow::Result<ExitCode> {
    if a.end_to_end {
        let cases = if a.cases.is_empty() {
            super::bench_e2e::default_cases()
        } else {
            // Split as a shell would (quotes keep a path with spaces whole).
            a.cases
                .iter()
                .map(|c| match shlex::split(c) {
                    Some(args) => Ok(super::bench_e2e::E2eCase {
                        args,
                        target: "-".into(),
                    }),
                    None => Err(anyhow::anyhow!(
                        "--case {c:?}: unbalanced quotes or a trailing backslash"
                    )),
                })
                .collect::<anyhow::Result<Vec<_>>>()?
        };
        if let Some(c) = cases.iter().find(|c| c.args.is_empty()) {
            anyhow::bail!("--case {:?}: empty command line", c.args.join(" "));
        }
        let runs = a.runs.unwrap_or(1);
        if runs == 0 {
            anyhow::bail!("--runs must be at least 1");
        }
        super::bench_e2e::run(&cases, runs, a.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    if !a.cases.is_empty() {
        anyhow::bail!("--case needs --end-to-end");
    }
    if a.runs.is_some() {
        anyhow::bail!("--runs needs --end-to-end (the kernel benchmark repeats with --reps)");
    }
    if a.reps == 0 {
        anyhow::bail!("--reps must be at least 1");
    }
    if a.experts == 0 {
        anyhow::bail!("--experts must be at least 1");
    }
    if a.empty >= a.experts {
        anyhow::bail!(
            "--empty {} must be below --experts {} (at least one expert gets rows; --empty defaults to {DEFAULT_EMPTY})",
            a.empty,
            a.experts
        );
    }
    let spec = GemmSpec {
        experts: a.experts,
        tokens: a.rows,
        topk: 1,
        hidden: a.k,
        ffn: a.n,
        dtype: Format::F32,
        out_dtype: Format::F32,
        spread: a.routing,
        passes: moecheck_reference::gemm::Passes::ALL,
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
    let mut dense_out = Array2::<f64>::zeros((a.rows, a.n));
    let mut grouped_out = Array2::<f64>::zeros((a.rows, a.n));
    let mut time_dense = || {
        let t = Instant::now();
        if a.alloc {
            std::hint::black_box(lhs.dot(&dense_rhs));
        } else {
            ndarray::linalg::general_mat_mul(1.0, &lhs, &dense_rhs, 0.0, &mut dense_out);
        }
        t.elapsed().as_secs_f64()
    };
    let mut time_grouped = || {
        let t = Instant::now();
        if a.alloc {
            std::hint::black_box(grouped_fwd(lhs.view(), rhs.view(), &off));
        } else {
            grouped_fwd_into(lhs.view(), rhs.view(), &off, grouped_out.view_mut());
        }
        t.elapsed().as_secs_f64()
    };
    let load_before = load_average();
    let bar = moecheck::progress::Progress::steps(a.reps as u64, "repetitions");
    let (mut dense, mut grouped, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..a.reps {
        let (td, tg) = if rep % 2 == 0 {
            let td = time_dense();
            (td, time_grouped())
        } else {
            let tg = time_grouped();
            (time_dense(), tg)
        };
        dense.push(td);
        grouped.push(tg);
        ratios.push(td / tg);
        bar.step();
    }
    bar.done();
    let load_after = load_average();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (td, tg) = (median(&mut dense), median(&mut grouped));
    let ratio = median(&mut ratios);
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
        alloc: a.alloc,
        load_before,
        load_after,
        dense_median_s: td,
        grouped_median_s: tg,
        dense_gflops: flops / td / 1e9,
        grouped_gflops: flops / tg / 1e9,
        ratio,
        ratio_min: ratios[0],
        ratio_max: ratios[ratios.len() - 1],
    };
    if a.json {
        moecheck::outln!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        moecheck::outln!(
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
        moecheck::outln!(
            "  dense f64 GEMM      {:>8.3} s  {:>7.1} GFLOP/s",
            r.dense_median_s,
            r.dense_gflops
        );
        moecheck::outln!(
            "  grouped f64 (ref)   {:>8.3} s  {:>7.1} GFLOP/s",
            r.grouped_median_s,
            r.grouped_gflops
        );
        moecheck::outln!(
            "  ratio grouped/dense {:>8.3}x  (median of per-rep ratios; spread {:.3}..{:.3})",
            r.ratio,
            r.ratio_min,
            r.ratio_max
        );
        moecheck::outln!(
            "  outputs {}, load average {:.2} before, {:.2} after",
            if r.alloc {
                "allocated per call"
            } else {
                "preallocated"
            },
            r.load_before,
            r.load_after
        );
    }
    Ok(ExitCode::SUCCESS)
}
