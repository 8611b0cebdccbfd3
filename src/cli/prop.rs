//! `moecheck prop`: the flags of a property campaign; the campaign is `moecheck::prop`'s.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::builder::PossibleValuesParser;
use clap::Args;

use moecheck::contract::{Contract, Section};
use moecheck::ops;
use moecheck::prop::campaign::{self, Campaign, DEFAULT_CASES, DEFAULT_MAX_SHRINK, DEFAULT_OUT};
use moecheck::prop::junit;
use moecheck::registry::Declared;
use moecheck::report;
use moecheck::user_file;
use moecheck_reference::format::Format;

use super::ImplFlags;

#[derive(Debug, Args)]
#[command(mut_arg("implementation", |a| a.required(true).help(IMPL_HELP)))]
pub struct PropFlags {
    /// The operation whose properties run.
    #[arg(long, value_parser = PossibleValuesParser::new(ops::names()))]
    pub op: String,
    #[command(flatten)]
    pub imp: ImplFlags,
    /// Accumulator format an exec: grouped GEMM declares [default: f32].
    #[arg(long, value_parser = super::format_in(super::FLOATS))]
    pub acc: Option<Format>,
    /// K-block size of an exec: grouped GEMM's accumulator; omit for "any order".
    #[arg(long)]
    pub acc_block: Option<usize>,
    /// Compute format an exec: routing or MoE layer declares [default: f32].
    #[arg(long, value_parser = super::format_in(super::FLOATS))]
    pub compute: Option<Format>,
    /// Router compute format an exec: MoE layer declares where it is not --compute's (Hugging
    /// Face's routers: f32 in an f64 module) [default: --compute's].
    #[arg(long, value_parser = super::format_in(super::FLOATS))]
    pub router_compute: Option<Format>,
    /// Output format an exec: MoE layer declares [default: f32], or the format an exec:
    /// grouped GEMM rounds its outputs to whatever each case asks [default: each case's];
    /// `input` for a grouped GEMM that writes its input dtype (torch's grouped_mm, bf16 for
    /// bf16): cases are then drawn with outputs in their input dtype.
    #[arg(long, value_name = "FORMAT|input", value_parser = parse_out_dtype)]
    pub out_dtype: Option<OutDtype>,
    /// Tail rule of a grouped GEMM: zero (rows past sum(group_sizes) of out and dlhs are
    /// exactly 0) or ignored (never written: not checked; drhs must still ignore tail dout).
    #[arg(long, value_parser = ["zero", "ignored"], help_heading = CONTRACT)]
    pub tail: Option<String>,
    /// Passes a grouped GEMM implements (fwd,dgrad,wgrad or a subset): properties of the
    /// others are not applicable, the rest ask only for these.
    #[arg(long, value_name = "LIST", help_heading = CONTRACT)]
    pub passes: Option<String>,
    /// Routing convention of a router or MoE layer (maxtext, megatron, deepseek-v3, or a
    /// Hugging Face family: hf-deepseek-v3, hf-qwen2-moe, hf-qwen3-moe, hf-mixtral, hf-gpt-oss): its group
    /// score, sigmoid normalisation, tie rule and drop policy; a family also fixes the score
    /// function, the slot order and (moe) the shared expert and its gate.
    #[arg(long, value_parser = ["maxtext", "megatron", "deepseek-v3", "hf-deepseek-v3", "hf-qwen2-moe", "hf-qwen3-moe", "hf-mixtral", "hf-gpt-oss"], help_heading = CONTRACT)]
    pub convention: Option<String>,
    /// Score functions a router or MoE layer supports (softmax, topk-softmax, sigmoid; a
    /// comma-separated list): cases are drawn with these only.
    #[arg(long, value_name = "LIST", help_heading = CONTRACT)]
    pub score: Option<String>,
    /// How a group is scored (top2, top-k-per-group, max); default: the convention's.
    #[arg(long, value_parser = ["top2", "top-k-per-group", "max"], help_heading = CONTRACT)]
    pub group_score: Option<String>,
    /// Sigmoid weights divided by their sum: always, skip-k1 (not at K = 1) or never;
    /// default: the convention's.
    #[arg(long, value_parser = ["always", "skip-k1", "never"], help_heading = CONTRACT)]
    pub sigmoid_norm: Option<String>,
    /// Exact ties: lower-index or any (any choice among equal values is valid;
    /// ties-to-lower-index is then not applicable); default: the convention's.
    #[arg(long, value_parser = ["lower-index", "any"], help_heading = CONTRACT)]
    pub ties: Option<String>,
    /// Order of a router's slots: score (largest first) or any (a token's experts as a set;
    /// torch.topk(sorted=False)); default: the convention's.
    #[arg(long, value_parser = ["score", "any"], help_heading = CONTRACT)]
    pub slot_order: Option<String>,
    /// What the implementation supports, as the greeting's "supports" keys
    /// (docs/protocol.md): dtypes=f32,bf16, k_min=1, k_multiple=8, capacity=false, ...
    /// Repeatable; each replaces the greeting's value for its key.
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_supports, help_heading = CONTRACT)]
    pub supports: Vec<(String, serde_json::Value)>,
    /// Fail the campaign when a property could not run, stopped on refusals, or an edge class
    /// (K = 0, an empty expert, tail rows, f16, ...) was never exercised (for CI).
    #[arg(long)]
    pub strict: bool,
    /// Cases per property.
    #[arg(long, default_value_t = DEFAULT_CASES)]
    pub cases: u32,
    /// Seed of the cases (the same seed draws the same cases).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Most shrink steps per failure (each runs the implementation; the MoE layer caps it at 32).
    #[arg(long, default_value_t = DEFAULT_MAX_SHRINK)]
    pub max_shrink: u32,
    /// Run only this property (repeatable); `moecheck selftest` lists them.
    #[arg(long = "property", value_name = "NAME")]
    pub properties: Vec<String>,
    /// Where minimal cases are written: DIR/<op>-<property>-seed-<seed>/ (replaced when the
    /// property fails again).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_OUT)]
    pub out: PathBuf,
    /// Machine-readable report on stdout, with a top-level "verdict".
    #[arg(long)]
    pub json: bool,
    /// Also write the result as JUnit XML to FILE (one test case per property).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
}

/// `--impl` of `moecheck prop`.
const IMPL_HELP: &str = "Implementation under test: reference | emulate (the op's CPU model; with --inject BUG a planted bug) | exec:CMD (any program, one process per case, docs/protocol.md) | worker:CMD (the same program started once, one JSON line per case: much faster for Python adapters; --timeout and the declaration flags describe both) | a GPU implementation of the op (cuda, cublas, ...)";

/// The help heading of the contract flags.
const CONTRACT: &str = "Contract (each replaces the worker greeting's key)";

/// `--out-dtype`: a format, or `input`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutDtype {
    Format(Format),
    Input,
}

fn parse_out_dtype(s: &str) -> Result<OutDtype, String> {
    match s {
        "input" => Ok(OutDtype::Input),
        s => super::format_in(super::FLOATS)(s)
            .map(OutDtype::Format)
            .map_err(|e| format!("{e} (or input)")),
    }
}

/// `--supports KEY=VALUE`: the value as JSON when it is (`1`, `false`, `["f32"]`), else as a
/// string (`f32,bf16`: a list where the key takes one).
fn parse_supports(s: &str) -> Result<(String, serde_json::Value), String> {
    let (key, value) = s
        .split_once('=')
        .ok_or_else(|| format!("'{s}': expected KEY=VALUE (k_min=1, dtypes=f32,bf16)"))?;
    let value = serde_json::from_str(value.trim())
        .unwrap_or_else(|_| serde_json::Value::String(value.trim().to_string()));
    Ok((key.trim().to_string(), value))
}

/// The contract the flags declare, and the flags as words (for the reproduce line).
fn contract_of(a: &PropFlags) -> (Contract, Vec<String>) {
    let mut c = Contract::default();
    let mut words = Vec::new();
    let mut set = |section, key: &str, value: serde_json::Value, flag: &str, word: String| {
        c.set(section, key, value, flag);
        words.extend([flag.to_string(), word]);
    };
    let declared = [
        ("--tail", "tail", &a.tail),
        ("--convention", "convention", &a.convention),
        ("--group-score", "group_score", &a.group_score),
        ("--sigmoid-norm", "sigmoid_norm", &a.sigmoid_norm),
        ("--ties", "ties", &a.ties),
        ("--slot-order", "slot_order", &a.slot_order),
    ];
    for (flag, key, value) in declared {
        if let Some(v) = value {
            set(Section::Declared, key, v.clone().into(), flag, v.clone());
        }
    }
    if a.out_dtype == Some(OutDtype::Input) {
        set(
            Section::Declared,
            "out_dtype",
            "input".into(),
            "--out-dtype",
            "input".into(),
        );
    }
    for (flag, key, value) in [
        ("--passes", "passes", &a.passes),
        ("--score", "scores", &a.score),
    ] {
        if let Some(v) = value {
            set(Section::Supports, key, v.clone().into(), flag, v.clone());
        }
    }
    for (key, value) in &a.supports {
        let word = match value {
            serde_json::Value::String(s) => format!("{key}={s}"),
            v => format!("{key}={v}"),
        };
        set(Section::Supports, key, value.clone(), "--supports", word);
    }
    (c, words)
}

pub fn run(a: PropFlags) -> anyhow::Result<ExitCode> {
    if let Some(file) = &a.junit {
        user_file::check(file, "--junit")?;
    }
    let declared = Declared {
        acc: a.acc,
        acc_block: a.acc_block,
        compute: a.compute,
        out_dtype: match a.out_dtype {
            Some(OutDtype::Format(f)) => Some(f),
            _ => None,
        },
        router_compute: a.router_compute,
    };
    let (flags, flag_words) = contract_of(&a);
    let c = Campaign {
        choice: a.imp.choice(declared),
        cases: a.cases,
        seed: a.seed,
        max_shrink: a.max_shrink,
        out: a.out,
        only: a.properties,
        flags,
        flag_words,
        strict: a.strict,
    };
    let report = campaign::run_named(&a.op, &c)?;
    // Written before the report is printed, whose exit status stands only when every file
    // the campaign writes was written.
    let written = match &a.junit {
        Some(file) => user_file::write(file, "--junit", junit::document(&report).as_bytes()),
        None => Ok(()),
    };
    let code = report::finish(&report, a.json)?;
    if let Some(e) = report.properties.iter().find_map(|p| p.unwritten.as_ref()) {
        anyhow::bail!("{e}");
    }
    written.map(|()| code)
}
