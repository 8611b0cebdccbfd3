//! `moecheck moe`: generate a whole MoE-layer case, run an implementation, and check the
//! output and every gradient against the f64 reference within the derived layer bound.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

use moecheck::impls::exec::Program;
use moecheck::impls::moe_emulate::{MoeBug, MoeEmulate};
use moecheck::impls::moe_exec::MoeExec;
use moecheck::moe_report::MoeReport;
use moecheck_properties::moe::MoeArgs;
use moecheck_reference::format::Format;
use moecheck_reference::moe::{forward, tie_guard, verify_layer, MoeLayer, ReferenceLayer};
use moecheck_reference::routing::{RoutingConfig, NORM_EPS};

use super::route::{capacity, group_limit, DropArg, ScoreArg};

/// Most cases drawn while looking for one without a near tie.
const MAX_DRAWS: usize = 64;

#[derive(Debug, Args)]
pub struct MoeArgsCli {
    /// Number of routed experts E.
    #[arg(long, default_value_t = 8)]
    pub experts: usize,
    /// Experts per token k.
    #[arg(long, default_value_t = 2)]
    pub topk: usize,
    /// Tokens T.
    #[arg(long, default_value_t = 64)]
    pub tokens: usize,
    /// Hidden size H.
    #[arg(long, default_value_t = 32)]
    pub hidden: usize,
    /// Expert FFN width F.
    #[arg(long, default_value_t = 16)]
    pub ffn: usize,
    /// Shared-expert FFN width (0: no shared expert).
    #[arg(long, default_value_t = 0)]
    pub shared_ffn: usize,
    /// Score function.
    #[arg(long, value_enum, default_value = "topk-softmax")]
    pub score: ScoreArg,
    /// Group-limited selection: number of expert groups (DeepSeek-V3 n_group).
    #[arg(long, requires = "topk_groups")]
    pub groups: Option<usize>,
    /// Groups kept per token (DeepSeek-V3 topk_group).
    #[arg(long, requires = "groups")]
    pub topk_groups: Option<usize>,
    /// Add a per-expert selection bias (DeepSeek-V3 e_score_correction_bias).
    #[arg(long)]
    pub bias: bool,
    /// Normalise the top-k weights by their sum (always on for sigmoid).
    #[arg(long)]
    pub norm_topk: bool,
    /// routed_scaling_factor.
    #[arg(long, default_value_t = 1.0)]
    pub scaling_factor: f64,
    /// Capacity factor (enables dropping; needs --drop-policy).
    #[arg(long, requires = "drop_policy")]
    pub capacity_factor: Option<f64>,
    /// Which assignments survive capacity: position (MaxText) or probs (Megatron).
    #[arg(long, value_enum, requires = "capacity_factor")]
    pub drop_policy: Option<DropArg>,
    /// Tokens per sequence for --drop-policy position (default: all tokens).
    #[arg(long, requires = "drop_policy")]
    pub seq_len: Option<usize>,
    /// Input dtype: every input value is exactly representable in it (bf16 or f32).
    #[arg(long, default_value = "bf16", value_parser = super::parse_format)]
    pub dtype: Format,
    /// Declared compute format of an exec: implementation (every operation, GEMM
    /// accumulation included).
    #[arg(long, default_value = "f32", value_parser = super::parse_format)]
    pub compute: Format,
    /// Declared output format of an exec: implementation.
    #[arg(long, default_value = "f32", value_parser = super::parse_format)]
    pub out_dtype: Format,
    /// Seed of the generated case.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Implementation under test: reference | emulate | exec:CMD (op moe_layer,
    /// docs/protocol.md).
    #[arg(long = "impl", default_value = "emulate")]
    pub implementation: String,
    /// Planted layer bug for --impl emulate (see `moecheck selftest`).
    #[arg(long)]
    pub inject: Option<String>,
    /// Timeout in seconds for exec: implementations.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    /// Write the case and the implementation's outputs to DIR (protocol layout).
    #[arg(long)]
    pub dump: Option<PathBuf>,
    /// Machine-readable report on stdout, with a top-level "verdict".
    #[arg(long)]
    pub json: bool,
}

fn routing_config(a: &MoeArgsCli) -> RoutingConfig {
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

fn build_impl(a: &MoeArgsCli) -> anyhow::Result<Box<dyn MoeLayer>> {
    let name = a.implementation.as_str();
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
        "reference" => Box::new(ReferenceLayer),
        "emulate" => {
            let inject = a
                .inject
                .as_deref()
                .map(|b| {
                    b.parse::<MoeBug>()
                        .map_err(|e| anyhow::anyhow!("--inject {b}: {e}"))
                })
                .transpose()?;
            Box::new(MoeEmulate { inject })
        }
        _ => match name.strip_prefix("exec:") {
            Some(cmd) if !cmd.trim().is_empty() => Box::new(MoeExec {
                exec: Program {
                    command: cmd.to_string(),
                    timeout: Duration::from_secs_f64(a.timeout),
                },
                compute: a.compute,
                output: a.out_dtype,
            }),
            _ => bail!("--impl {name}: expected reference, emulate or exec:CMD"),
        },
    })
}

/// splitmix64, for the per-draw value seeds.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

pub fn run(a: MoeArgsCli) -> anyhow::Result<ExitCode> {
    for (flag, v) in [
        ("--experts", a.experts),
        ("--tokens", a.tokens),
        ("--hidden", a.hidden),
        ("--ffn", a.ffn),
    ] {
        if v == 0 {
            bail!("{flag} must be at least 1");
        }
    }
    if !matches!(a.dtype, Format::Bf16 | Format::F32 | Format::F16) {
        bail!("--dtype {}: expected bf16, f16 or f32", a.dtype);
    }
    if !(a.scaling_factor.is_finite() && a.scaling_factor > 0.0) {
        bail!(
            "--scaling-factor {} must be finite and > 0",
            a.scaling_factor
        );
    }
    let routing = routing_config(&a);
    routing
        .validate(a.tokens, a.experts)
        .map_err(anyhow::Error::msg)?;
    let imp = build_impl(&a)?;
    let progress = Progress::new((a.tokens * a.topk * a.hidden * a.ffn) as u64);
    let mut args = MoeArgs {
        tokens: a.tokens,
        hidden: a.hidden,
        experts: a.experts,
        ffn: a.ffn,
        shared_ffn: a.shared_ffn,
        routing,
        bias: a.bias,
        dtype: a.dtype,
        value_seed: 0,
    };
    let mut found = None;
    for draw in 0..MAX_DRAWS {
        progress.message(&format!("drawing a case without a near tie ({})", draw + 1));
        args.value_seed = mix(a.seed ^ mix(draw as u64));
        let case = args.build();
        let precision = imp.precision(&case);
        if tie_guard(&case, &precision)
            .context("generated case")?
            .is_none()
        {
            found = Some((case, draw + 1));
            break;
        }
    }
    let Some((case, draws)) = found else {
        bail!(
            "no case without a top-k/group/capacity near tie in {MAX_DRAWS} draws; change --seed or the shape"
        );
    };
    progress.message(&format!("running {} and the f64 reference", imp.name()));
    let fwd = forward(&case).context("generated case")?;
    let verdict = verify_layer(imp.as_ref(), &case).context("generated case")?;
    if let Some(dir) = &a.dump {
        std::fs::create_dir_all(dir).with_context(|| format!("--dump {}", dir.display()))?;
        moecheck::protocol::moe::write_moe_case(dir, &case)
            .with_context(|| format!("--dump {}", dir.display()))?;
        if let Ok(got) = imp.run(&case) {
            moecheck::protocol::moe::write_moe_outputs(dir, &got)
                .with_context(|| format!("--dump {}", dir.display()))?;
        }
    }
    progress.done();
    let report = MoeReport::new(
        imp.name(),
        imp.is_model(),
        &case,
        &fwd,
        imp.precision(&case),
        draws,
        &verdict,
    );
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(if report.verdict == "pass" {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(super::EXIT_FAIL)
    })
}

/// A spinner on stderr for large layers when stderr is a terminal.
struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    fn new(work: u64) -> Progress {
        use std::io::IsTerminal;
        if work < 20_000_000 || !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_style(
            indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                .expect("valid template"),
        );
        pb.enable_steady_tick(Duration::from_millis(120));
        Progress(Some(pb))
    }
    fn message(&self, msg: &str) {
        if let Some(pb) = &self.0 {
            pb.set_message(msg.to_string());
        }
    }
    fn done(&self) {
        if let Some(pb) = &self.0 {
            pb.finish_and_clear();
        }
    }
}
