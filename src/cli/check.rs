//! `moecheck check DIR`: re-verify a case directory holding inputs and outputs, whatever
//! operation wrote it (`case.json` says).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use moecheck::{pipeline, protocol, report};
use moecheck_reference::format::Format;
use moecheck_reference::fp8::Fp8Gemm;
use moecheck_reference::gemm::{Accumulator, Gemm};
use moecheck_reference::moe::{LayerFormats, MoeLayer};
use moecheck_reference::routing::{ComputeFormat, Route};

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The case directory (case.json, inputs, and the outputs: out.npy / dlhs.npy /
    /// drhs.npy for a grouped GEMM). An FP8 case (case.json with an `fp8` object) is checked
    /// recipe-exact.
    pub dir: PathBuf,
    /// Declared accumulator format of the implementation that wrote the outputs (grouped
    /// GEMM) [default: f32]. An FP8 case declares its accumulation in case.json.
    #[arg(long, value_parser = super::parse_format)]
    pub acc: Option<Format>,
    /// Declared K-block size of the accumulator; omit for "any order".
    #[arg(long)]
    pub acc_block: Option<usize>,
    /// Declared compute format of the implementation that wrote the outputs (routing, MoE
    /// layer) [default: f32].
    #[arg(long, value_parser = super::parse_format)]
    pub compute: Option<Format>,
    /// Declared output format of the implementation that wrote the outputs (MoE layer)
    /// [default: f32].
    #[arg(long, value_parser = super::parse_format)]
    pub out_dtype: Option<Format>,
    /// Machine-readable report with a top-level "verdict".
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: CheckArgs) -> anyhow::Result<ExitCode> {
    let header = protocol::read_header(&a.dir)?;
    // Before the grouped GEMM: an FP8 case is a grouped-GEMM case marked by its `fp8` object.
    if header.is::<Fp8Gemm>() {
        super::gemm_fp8::refuse_acc_flags(
            a.acc.is_some(),
            a.acc_block.is_some(),
            "an FP8 case declares its accumulation in case.json (fp8.accumulation)",
        )?;
        return report::finish(&pipeline::check_dir::<Fp8Gemm>(&a.dir, &())?, a.json);
    }
    if header.is::<Gemm>() {
        a.only("grouped_gemm", &["--acc", "--acc-block"])?;
        if a.acc_block == Some(0) {
            anyhow::bail!("--acc-block 0: a K block holds at least one product");
        }
        let acc = Accumulator {
            format: a.acc.unwrap_or(Format::F32),
            block: a.acc_block,
        };
        return report::finish(&pipeline::check_dir::<Gemm>(&a.dir, &acc)?, a.json);
    }
    if header.is::<Route>() {
        a.only("route", &["--compute"])?;
        let compute = ComputeFormat(a.compute.unwrap_or(Format::F32));
        return report::finish(&pipeline::check_dir::<Route>(&a.dir, &compute)?, a.json);
    }
    if header.is::<MoeLayer>() {
        a.only("moe_layer", &["--compute", "--out-dtype"])?;
        let formats = LayerFormats {
            compute: a.compute.unwrap_or(Format::F32),
            output: a.out_dtype.unwrap_or(Format::F32),
        };
        return report::finish(&pipeline::check_dir::<MoeLayer>(&a.dir, &formats)?, a.json);
    }
    anyhow::bail!(
        "{}: op '{}' is not supported (expected grouped_gemm, route or moe_layer)",
        a.dir.join("case.json").display(),
        header.op
    )
}

impl CheckArgs {
    /// Refuses a declaration flag that op `op` does not read (exit 2), so none is silently
    /// ignored.
    fn only(&self, op: &str, reads: &[&str]) -> anyhow::Result<()> {
        let given = [
            ("--acc", self.acc.is_some()),
            ("--acc-block", self.acc_block.is_some()),
            ("--compute", self.compute.is_some()),
            ("--out-dtype", self.out_dtype.is_some()),
        ];
        match given.iter().find(|(f, g)| *g && !reads.contains(f)) {
            Some((flag, _)) => anyhow::bail!(
                "{flag} does not apply to op {op} (it declares {})",
                reads.join(", ")
            ),
            None => Ok(()),
        }
    }
}
