//! `moecheck check DIR`: re-verify a case directory holding inputs and outputs.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use moecheck::report::GemmReport;
use moecheck_reference::format::Format;
use moecheck_reference::gemm::{compare_outputs, reference, Accumulator, Precision};
use moecheck_reference::implementation::Verdict;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The case directory (case.json, inputs, and the outputs out.npy / dlhs.npy / drhs.npy).
    /// An FP8 case (case.json with an `fp8` object) is checked recipe-exact.
    pub dir: PathBuf,
    /// Declared accumulator format of the implementation that wrote the outputs.
    #[arg(long, default_value = "f32", value_parser = super::gemm::parse_format)]
    pub acc: Format,
    /// Declared K-block size of the accumulator; omit for "any order".
    #[arg(long)]
    pub acc_block: Option<usize>,
    /// Machine-readable report with a top-level "verdict".
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: CheckArgs) -> anyhow::Result<ExitCode> {
    if let Some((case, passes)) = moecheck::protocol::fp8::read_fp8_case(&a.dir)? {
        return super::gemm_fp8::check(&a.dir, case, passes, a.json);
    }
    let (case, passes) = moecheck::protocol::read_case(&a.dir)?;
    let got = moecheck::protocol::read_outputs(&a.dir, &case, passes)?;
    let want = reference(&case, passes)?;
    let precision = Precision {
        input: case.dtype,
        accumulator: Accumulator {
            format: a.acc,
            block: a.acc_block,
        },
        output: case.out_dtype,
    };
    let verdict = Verdict::Compared(compare_outputs(&case, passes, &precision, &want, &got));
    let name = format!("outputs in {}", a.dir.display());
    let report = GemmReport::new(name, false, &case, precision, &verdict);
    super::finish(&report, a.json)
}
