//! `moecheck prop`: the flags of a property campaign; the campaign is `moecheck::prop`'s.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::builder::PossibleValuesParser;
use clap::Args;

use moecheck::ops;
use moecheck::prop::campaign::{self, Campaign, DEFAULT_CASES, DEFAULT_MAX_SHRINK, DEFAULT_OUT};
use moecheck::prop::junit;
use moecheck::registry::Declared;
use moecheck::report;
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
    /// Output format an exec: MoE layer declares [default: f32], or the format an exec:
    /// grouped GEMM rounds its outputs to whatever each case asks [default: each case's]. One
    /// format for every drawn case: a kernel that writes its input type (torch's grouped_mm,
    /// bf16 for bf16) cannot be declared for cases of mixed input types this way.
    #[arg(long, value_parser = super::format_in(super::FLOATS))]
    pub out_dtype: Option<Format>,
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

pub fn run(a: PropFlags) -> anyhow::Result<ExitCode> {
    if let Some(file) = &a.junit {
        junit::check_target(file)?;
    }
    let declared = Declared {
        acc: a.acc,
        acc_block: a.acc_block,
        compute: a.compute,
        out_dtype: a.out_dtype,
    };
    let c = Campaign {
        choice: a.imp.choice(declared),
        cases: a.cases,
        seed: a.seed,
        max_shrink: a.max_shrink,
        out: a.out,
        only: a.properties,
    };
    let report = campaign::run_named(&a.op, &c)?;
    if let Some(file) = &a.junit {
        junit::write_atomic(file, &junit::document(&report))?;
    }
    report::finish(&report, a.json)
}
