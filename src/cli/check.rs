//! `moecheck check DIR`: re-verify a case directory holding inputs and outputs, whatever
//! operation wrote it (`case.json` says).

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use moecheck::ops::{self, Operation, Visit};
use moecheck::protocol::CaseHeader;
use moecheck::registry::{self, Declared};
use moecheck::report::Report;
use moecheck::{pipeline, protocol, report};
use moecheck_reference::format::Format;
use moecheck_reference::gemm::Verify;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The case directory (case.json, inputs, and the outputs: out.npy / dlhs.npy /
    /// drhs.npy for a grouped GEMM). An FP8 case (case.json with an `fp8` object) is checked
    /// recipe-exact.
    pub dir: PathBuf,
    /// Declared accumulator format of the implementation that wrote the outputs (grouped
    /// GEMM) [default: what case.json records under "declared", else f32]. An FP8 case
    /// declares its accumulation in case.json.
    #[arg(long, value_parser = super::format_in(super::FLOATS))]
    pub acc: Option<Format>,
    /// Declared K-block size of the accumulator; omit for what case.json records, else "any
    /// order".
    #[arg(long)]
    pub acc_block: Option<usize>,
    /// Declared compute format of the implementation that wrote the outputs (routing, MoE
    /// layer) [default: what case.json records, else f32].
    #[arg(long, value_parser = super::format_in(super::FLOATS))]
    pub compute: Option<Format>,
    /// Declared output format of the implementation that wrote the outputs: MoE layer
    /// [default: what case.json records, else f32]; grouped GEMM, where the kernel rounds to
    /// another format than the case's out_dtype (cuBLAS's grouped GEMM writes bf16 for bf16
    /// inputs) [default: what case.json records, else the case's].
    #[arg(long, value_parser = super::format_in(super::FLOATS))]
    pub out_dtype: Option<Format>,
    /// Declared compute format of the router alone, where it is not --compute's (MoE layer)
    /// [default: what case.json records, else --compute's].
    #[arg(long, value_parser = super::format_in(super::FLOATS))]
    pub router_compute: Option<Format>,
    /// How a grouped GEMM's outputs are checked (plain or FP8): full (every element
    /// against its own bound) or fast (projections, sampled rows and columns, NaN/inf and
    /// exact zeros everywhere; see docs/commands.md) [default: full]. Routing and the MoE
    /// layer are checked one way.
    #[arg(long, value_name = "full|fast", value_parser = Verify::parse)]
    pub verify: Option<Verify>,
    /// Machine-readable report with a top-level "verdict".
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: CheckArgs) -> anyhow::Result<ExitCode> {
    let header = protocol::read_header(&a.dir)?;
    let flags = Declared {
        acc: a.acc,
        acc_block: a.acc_block,
        compute: a.compute,
        out_dtype: a.out_dtype,
        router_compute: a.router_compute,
    };
    let mut check = CheckAs {
        dir: &a.dir,
        header: &header,
        flags,
        verify: a.verify,
        result: None,
    };
    ops::each(&mut check);
    let report = check.result.unwrap_or_else(|| {
        Err(anyhow::anyhow!(
            "{}: op '{}' is not supported (expected grouped_gemm, route or moe_layer)",
            a.dir.join("case.json").display(),
            header.op
        ))
    })?;
    report::finish(report.as_ref(), a.json)
}

/// Checks the directory as the first operation that reads it.
struct CheckAs<'a> {
    dir: &'a Path,
    header: &'a CaseHeader,
    /// The declaration flags given here.
    flags: Declared,
    verify: Option<Verify>,
    result: Option<anyhow::Result<Box<dyn Report>>>,
}

impl Visit for CheckAs<'_> {
    fn visit<O: Operation>(&mut self, _: &'static str) -> ControlFlow<()> {
        if !ops::reads::<O>(self.header) {
            return ControlFlow::Continue(());
        }
        let run = || -> anyhow::Result<Box<dyn Report>> {
            // A flag given here wins; the rest come from what the dump recorded.
            let declared = self.flags.or(self.header.declared);
            let declaration = registry::declaration::<O>(&declared).map_err(|e| {
                match registry::declaration::<O>(&self.flags) {
                    // The flags alone are fine: what case.json records is refused, so the
                    // reason names its keys, not flags nobody gave.
                    Ok(_) => anyhow::anyhow!(
                        "{}: \"declared\": {}",
                        self.dir.join("case.json").display(),
                        recorded_keys(&e)
                    ),
                    Err(_) => anyhow::Error::msg(e),
                }
            })?;
            let mode = O::check_mode(self.verify).map_err(anyhow::Error::msg)?;
            let report = pipeline::check_dir::<O>(self.dir, &declaration, mode)?;
            Ok(Box::new(report))
        };
        self.result = Some(run());
        ControlFlow::Break(())
    }
}

/// `reason` with each declaration flag written as the `case.json` key it was read from
/// (`--acc-block 0: ...` -> `acc_block 0: ...`).
fn recorded_keys(reason: &str) -> String {
    [
        "--acc-block",
        "--acc",
        "--compute",
        "--out-dtype",
        "--router-compute",
    ]
    .iter()
    .fold(reason.to_string(), |r, flag| {
        r.replace(flag, &flag[2..].replace('-', "_"))
    })
}
