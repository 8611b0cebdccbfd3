//! `moecheck route`: the reference routing of given (or generated) logits, written as `.npy`,
//! and optionally an implementation checked against it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use moecheck::impls::exec::Program;
use moecheck::impls::exec_route::ExecRouter;
use moecheck::impls::route_emulate::{RouteBug, RouteEmulate};
use moecheck::protocol::route::{read_bias, read_logits, write_route_case, write_route_outputs};
use moecheck_reference::format::Format;
use moecheck_reference::routing::{
    compare_routing, route, Capacity, DropPolicy, GroupLimit, ReferenceRouter, RouteReport, Router,
    Routing, RoutingCase, RoutingConfig, ScoreFunction, NORM_EPS,
};

#[derive(Debug, Args)]
pub struct RouteArgs {
    /// Router logits (T, E), float32 or float64 .npy. Without it, logits are generated from
    /// --tokens, --experts and --seed on a grid (multiples of 1/64 in [-4, 4)): exact ties
    /// happen, near-ties that a reduced-precision implementation could order either way do not.
    #[arg(long)]
    pub logits: Option<PathBuf>,
    /// Per-expert selection bias (E,), float32 or float64 .npy (DeepSeek-V3's correction bias:
    /// moves the choice of experts, never the weights).
    #[arg(long)]
    pub bias: Option<PathBuf>,
    /// Experts per token K.
    #[arg(long)]
    pub topk: usize,
    /// Score function.
    #[arg(long, value_enum)]
    pub score: ScoreArg,
    /// Group-limited selection: number of expert groups G (divides E).
    #[arg(long, requires = "topk_groups")]
    pub groups: Option<usize>,
    /// Groups kept per token TG (ranked by the sum of their top-2 scores).
    #[arg(long, requires = "groups")]
    pub topk_groups: Option<usize>,
    /// Normalise the gates by their sum (norm_topk_prob; sigmoid always normalises).
    #[arg(long)]
    pub norm_topk: bool,
    /// routed_scaling_factor: the weights are multiplied by it.
    #[arg(long, default_value_t = 1.0)]
    pub scaling_factor: f64,
    /// Capacity factor: drop assignments over each expert's capacity.
    #[arg(long, requires = "drop_policy")]
    pub capacity_factor: Option<f64>,
    /// Which assignments survive: position (MaxText: per sequence, earlier wins) or probs
    /// (Megatron: per expert, larger weight wins).
    #[arg(long, value_enum, requires = "capacity_factor")]
    pub drop_policy: Option<DropArg>,
    /// Tokens per sequence for --drop-policy position (default: all tokens are one sequence).
    #[arg(long, requires = "drop_policy")]
    pub seq_len: Option<usize>,
    /// Write indices.npy, weights.npy, kept.npy and group_sizes.npy (the reference's) to DIR.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write the routing case directory (protocol op route: case.json, logits.npy, bias.npy)
    /// to DIR, for running an implementation by hand.
    #[arg(long)]
    pub dump: Option<PathBuf>,
    /// Tokens T of generated logits (without --logits).
    #[arg(long, conflicts_with = "logits", default_value_t = 1024)]
    pub tokens: usize,
    /// Experts E of generated logits (without --logits).
    #[arg(long, conflicts_with = "logits", default_value_t = 64)]
    pub experts: usize,
    /// Seed of generated logits.
    #[arg(long, conflicts_with = "logits", default_value_t = 0)]
    pub seed: u64,
    /// Also run an implementation and check it against the reference: reference | emulate |
    /// exec:CMD (CMD gets a routing case directory, docs/protocol.md "Op route").
    /// `cuda`: the routing kernels (GPU; f32, index near-ties may legitimately differ;
    /// without a device the run fails saying "no CUDA device").
    #[arg(long = "impl")]
    pub implementation: Option<String>,
    /// Planted routing bug for --impl emulate (see `moecheck selftest`).
    #[arg(long)]
    pub inject: Option<String>,
    /// The format an exec: implementation computes scores and weights in (the weight bound
    /// is derived from it).
    #[arg(long, default_value = "f32", value_parser = super::parse_format)]
    pub compute: Format,
    /// Timeout in seconds for exec: implementations.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    /// Machine-readable report on stdout, with a top-level "verdict".
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ScoreArg {
    Softmax,
    TopkSoftmax,
    Sigmoid,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum DropArg {
    Position,
    Probs,
}

/// The JSON report of `moecheck route`.
#[derive(Debug, Clone, Serialize)]
pub struct RouteCliReport {
    /// `pass`, `fail` (an implementation differs or failed) or `done` (reference only).
    pub verdict: String,
    pub tokens: usize,
    pub experts: usize,
    pub topk: usize,
    pub config: RoutingConfig,
    /// The expert capacity, with dropping.
    pub capacity: Option<usize>,
    /// Dropped assignments.
    pub dropped: usize,
    /// Kept assignments per expert.
    pub group_sizes: Vec<usize>,
    /// Seconds the reference routing took.
    pub reference_seconds: f64,
    pub implementation: Option<String>,
    /// The implementation is a CPU model (never a GPU result).
    pub is_model: bool,
    pub comparison: Option<RouteReport>,
    pub run_error: Option<String>,
}

impl From<ScoreArg> for ScoreFunction {
    fn from(s: ScoreArg) -> Self {
        match s {
            ScoreArg::Softmax => ScoreFunction::Softmax,
            ScoreArg::TopkSoftmax => ScoreFunction::TopkSoftmax,
            ScoreArg::Sigmoid => ScoreFunction::Sigmoid,
        }
    }
}

/// `--groups G --topk-groups TG` (clap requires both or neither).
pub(super) fn group_limit(groups: Option<usize>, topk_groups: Option<usize>) -> Option<GroupLimit> {
    Some(GroupLimit {
        groups: groups?,
        topk_groups: topk_groups?,
    })
}

/// `--capacity-factor CF --drop-policy P [--seq-len S]` (clap requires the first two together).
pub(super) fn capacity(
    factor: Option<f64>,
    policy: Option<DropArg>,
    seq_len: Option<usize>,
) -> Option<Capacity> {
    Some(Capacity {
        factor: factor?,
        policy: match policy? {
            DropArg::Position => DropPolicy::Position,
            DropArg::Probs => DropPolicy::Probs,
        },
        seq_len,
    })
}

fn config(a: &RouteArgs) -> RoutingConfig {
    RoutingConfig {
        topk: a.topk,
        score: a.score.into(),
        groups: group_limit(a.groups, a.topk_groups),
        norm_topk: a.norm_topk,
        scaling_factor: a.scaling_factor,
        norm_eps: NORM_EPS,
        capacity: capacity(a.capacity_factor, a.drop_policy, a.seq_len),
    }
}

fn generated_logits(tokens: usize, experts: usize, seed: u64) -> ndarray::Array2<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    ndarray::Array2::from_shape_simple_fn((tokens, experts), || {
        rng.random_range(-256i32..256) as f64 / 64.0
    })
}

fn build_router(a: &RouteArgs, name: &str) -> anyhow::Result<Box<dyn Router>> {
    if a.inject.is_some() && name != "emulate" {
        bail!("--inject needs --impl emulate (got --impl {name})");
    }
    if !(a.timeout > 0.0 && a.timeout.is_finite()) {
        bail!(
            "--timeout {} must be a positive number of seconds",
            a.timeout
        );
    }
    Ok(match name {
        "reference" => Box::new(ReferenceRouter),
        "emulate" => {
            let inject = a
                .inject
                .as_deref()
                .map(|b| {
                    b.parse::<RouteBug>()
                        .map_err(|e| anyhow::anyhow!("--inject {b}: {e}"))
                })
                .transpose()?;
            Box::new(RouteEmulate { inject })
        }
        "cuda" => cuda_router(a)?,
        _ => match name.strip_prefix("exec:") {
            Some(cmd) if !cmd.trim().is_empty() => Box::new(ExecRouter {
                exec: Program {
                    command: cmd.to_string(),
                    timeout: Duration::from_secs_f64(a.timeout),
                },
                compute: a.compute,
            }),
            _ => bail!("--impl {name}: expected reference, emulate, cuda or exec:CMD"),
        },
    })
}

/// `--impl cuda`: the routing kernels (without a device the run fails, "no CUDA device").
#[cfg(feature = "cuda")]
fn cuda_router(a: &RouteArgs) -> anyhow::Result<Box<dyn Router>> {
    if matches!(a.drop_policy, Some(DropArg::Probs)) {
        bail!("--drop-policy probs: --impl cuda implements the position policy only");
    }
    Ok(Box::new(moecheck::cuda::route_impl::CudaRouter))
}

#[cfg(not(feature = "cuda"))]
fn cuda_router(_a: &RouteArgs) -> anyhow::Result<Box<dyn Router>> {
    bail!("--impl cuda: moecheck was built without the `cuda` feature")
}

/// Names the input file in a reference validation error about `logits` or `bias`.
fn name_file(e: moecheck_reference::Error, a: &RouteArgs) -> anyhow::Error {
    use moecheck_reference::Error::InvalidRouting;
    match (&e, &a.logits, &a.bias) {
        (
            InvalidRouting {
                what: "logits",
                reason,
            },
            Some(p),
            _,
        ) => {
            anyhow::anyhow!("{}: {reason}", p.display())
        }
        (
            InvalidRouting {
                what: "bias",
                reason,
            },
            _,
            Some(p),
        ) => {
            anyhow::anyhow!("{}: {reason}", p.display())
        }
        _ => anyhow::Error::new(e),
    }
}

pub fn run(a: RouteArgs) -> anyhow::Result<ExitCode> {
    let logits = match &a.logits {
        Some(p) => read_logits(p)?.0,
        None => {
            if a.experts == 0 {
                bail!("--experts must be at least 1");
            }
            generated_logits(a.tokens, a.experts, a.seed)
        }
    };
    let bias = match &a.bias {
        Some(p) => Some(read_bias(p, logits.ncols())?),
        None => None,
    };
    let case = RoutingCase {
        logits,
        bias,
        config: config(&a),
    };
    case.validate().map_err(|e| name_file(e, &a))?;
    let imp = a
        .implementation
        .as_deref()
        .map(|n| build_router(&a, n))
        .transpose()?;
    if imp.is_none() && a.inject.is_some() {
        bail!("--inject needs --impl emulate");
    }
    let start = Instant::now();
    let want = route(&case).map_err(|e| name_file(e, &a))?;
    let reference_seconds = start.elapsed().as_secs_f64();
    if let Some(dir) = &a.out {
        write_outputs(dir, &want)?;
    }
    if let Some(dir) = &a.dump {
        std::fs::create_dir_all(dir).with_context(|| format!("--dump {}", dir.display()))?;
        write_route_case(dir, &case).with_context(|| format!("--dump {}", dir.display()))?;
    }
    let mut report = RouteCliReport {
        verdict: "done".into(),
        tokens: case.tokens(),
        experts: case.experts(),
        topk: case.config.topk,
        config: case.config,
        capacity: want.capacity,
        dropped: want.kept.iter().filter(|k| !**k).count(),
        group_sizes: want.group_sizes.clone(),
        reference_seconds,
        implementation: None,
        is_model: false,
        comparison: None,
        run_error: None,
    };
    if let Some(imp) = imp {
        report.implementation = Some(imp.name());
        report.is_model = imp.is_model();
        match imp.route(&case) {
            Ok(got) => {
                let cmp = compare_routing(&case, &want, &got, imp.precision(&case));
                report.verdict = if cmp.passed() { "pass" } else { "fail" }.into();
                report.comparison = Some(cmp);
            }
            Err(e) => {
                report.verdict = "fail".into();
                report.run_error = Some(e.to_string());
            }
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report, a.out.as_deref()));
    }
    Ok(if report.verdict == "fail" {
        ExitCode::from(super::EXIT_FAIL)
    } else {
        ExitCode::SUCCESS
    })
}

fn write_outputs(dir: &Path, r: &Routing) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("--out {}", dir.display()))?;
    write_route_outputs(dir, r).with_context(|| format!("--out {}", dir.display()))
}

fn render(r: &RouteCliReport, out: Option<&Path>) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let c = &r.config;
    let _ = write!(
        s,
        "route: T = {}, E = {}, K = {}, score {}",
        r.tokens, r.experts, r.topk, c.score
    );
    if let Some(g) = c.groups {
        let _ = write!(s, ", {} groups keep {}", g.groups, g.topk_groups);
    }
    if c.normalises() {
        let _ = write!(s, ", normalised (eps {:e})", c.norm_eps);
    }
    if c.scaling_factor != 1.0 {
        let _ = write!(s, ", scaling {}", c.scaling_factor);
    }
    s.push('\n');
    if let (Some(cap), Some(k)) = (c.capacity, r.capacity) {
        let _ = writeln!(
            s,
            "capacity: {} policy, factor {}, C = {k}{}: {} of {} assignments dropped",
            cap.policy.name(),
            cap.factor,
            if cap.policy == DropPolicy::Position {
                format!(" per sequence of {}", cap.seq_len.unwrap_or(r.tokens))
            } else {
                String::new()
            },
            r.dropped,
            r.tokens * r.topk
        );
    }
    let (min, max) = r
        .group_sizes
        .iter()
        .fold((usize::MAX, 0), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let empty = r.group_sizes.iter().filter(|v| **v == 0).count();
    let _ = writeln!(
        s,
        "group sizes: min {}, max {max}, {empty} empty experts; reference took {:.3} s",
        if r.group_sizes.is_empty() { 0 } else { min },
        r.reference_seconds
    );
    if let Some(dir) = out {
        let _ = writeln!(
            s,
            "wrote indices.npy, weights.npy, kept.npy, group_sizes.npy to {}",
            dir.display()
        );
    }
    if let Some(name) = &r.implementation {
        let _ = writeln!(
            s,
            "implementation: {name}{}",
            if r.is_model {
                " (a CPU model, not a GPU result)"
            } else {
                ""
            }
        );
        if let Some(e) = &r.run_error {
            let _ = writeln!(s, "run failed: {e}");
        }
        if let Some(cmp) = &r.comparison {
            let _ = writeln!(
                s,
                "indices: {} tokens differ; kept: {} differ; group_sizes: {} experts differ; \
                 weights: {} outside bound (max |err| {:.3e}, max err/bound {:.3})",
                cmp.index_mismatch_tokens,
                cmp.kept_mismatches,
                cmp.group_size_mismatches,
                cmp.weight_failures,
                cmp.max_weight_abs_err,
                cmp.max_weight_err_ratio
            );
            for m in &cmp.mismatches {
                let _ = writeln!(s, "  {}{:?}: {}", m.what, m.at, m.detail);
            }
            if cmp.near_tie_assignments > 0 {
                let _ = writeln!(
                    s,
                    "near-ties: {} assignments decided the other way at a probs capacity \
                     boundary between weights equal within rounding (not failures)",
                    cmp.near_tie_assignments
                );
                for m in &cmp.near_ties {
                    let _ = writeln!(s, "  {}{:?}: {}", m.what, m.at, m.detail);
                }
            }
        }
        let _ = writeln!(
            s,
            "verdict: {}",
            if r.verdict == "pass" { "PASS" } else { "FAIL" }
        );
    }
    s
}
