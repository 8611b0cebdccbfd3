//! `moecheck route`: the flags of a routing run: the reference routing of given (or
//! generated) logits, written as `.npy`, and optionally an implementation checked against it.
//! The work is the pipeline's.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use moecheck::generate::route::{Bias, Logits, RouteSpec};
use moecheck::registry::{self, Choice, Declared};
use moecheck::{pipeline, report};
use moecheck_reference::format::Format;
use moecheck_reference::op::Op;
use moecheck_reference::routing::Route;

use super::routing_flags::RoutingFlags;
use super::ImplFlags;

#[derive(Debug, Args)]
#[command(
    mut_arg("topk", |a| a.required(true)),
    mut_arg("score", |a| a.required_unless_present("convention").help("Score function (required unless --convention is a Hugging Face family, which sets it)")),
    mut_arg("implementation", |a| a.help("Also run an implementation and check it against the reference: reference | emulate (a CPU model with planted bugs) | exec:CMD (CMD gets a routing case directory, docs/protocol.md \"Op route\") | worker:CMD (the same, CMD started once) | cuda (the routing kernels, f32; index near-ties may legitimately differ; without a device the run fails saying \"no CUDA device\"). Without --impl: the reference only"))
)]
pub struct RouteFlags {
    /// Router logits (T, E), float32 or float64 .npy. Without it, logits are generated from
    /// --tokens, --experts and --seed on a grid (multiples of 1/64 in [-4, 4)): exact ties
    /// happen, near-ties that a reduced-precision implementation could order either way do not.
    #[arg(long)]
    pub logits: Option<PathBuf>,
    /// Per-expert selection bias (DeepSeek-V3's correction bias: moves the choice of experts,
    /// never the weights): a (E,) float32 or float64 .npy FILE, or without one a generated
    /// bias (multiples of 1/8 in [-1, 1] from --seed; seed 0 with --logits). Added to the
    /// scores, it can bring two experts' selection scores within rounding of each other: the
    /// report then names the near-tie.
    #[arg(long, value_name = "FILE", num_args = 0..=1)]
    pub bias: Option<Option<PathBuf>>,
    #[command(flatten)]
    pub routing: RoutingFlags,
    /// Write indices.npy, weights.npy (float32), kept.npy and group_sizes.npy (the
    /// reference's) to DIR.
    /// Refused when DIR holds other files (a case directory, say), when a file to be
    /// written there is an input, or is a symbolic link.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write into --out although it holds other files or one of them is an input (a
    /// symbolic link there is replaced, never written through).
    #[arg(long, requires = "out")]
    pub force: bool,
    /// Write the routing case directory (protocol op route: case.json, logits.npy, bias.npy)
    /// to DIR and, with --impl, the outputs that were checked (`moecheck check DIR`
    /// re-verifies them).
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
    #[command(flatten)]
    pub imp: ImplFlags,
    /// The format an exec: or worker: implementation computes scores and weights in (the weight bound
    /// is derived from it) [default: f32]. Built-in implementations declare their own.
    #[arg(long, value_parser = super::format_in(super::FLOATS))]
    pub compute: Option<Format>,
    /// Machine-readable report on stdout, with a top-level "verdict".
    #[arg(long)]
    pub json: bool,
}

impl RouteFlags {
    /// The case spec.
    fn spec(&self) -> anyhow::Result<RouteSpec> {
        Ok(RouteSpec {
            logits: match &self.logits {
                Some(p) => Logits::File(p.clone()),
                None => Logits::Generated {
                    tokens: self.tokens,
                    experts: self.experts,
                    seed: self.seed,
                },
            },
            bias: self.bias.as_ref().map(|p| match p {
                Some(p) => Bias::File(p.clone()),
                None => Bias::Generated,
            }),
            config: self.routing.config(None)?,
        })
    }

    /// `--impl` and its flags; `None` without `--impl` (the reference only), where the
    /// implementation flags have nothing to apply to.
    fn choice(&self) -> anyhow::Result<Option<Choice>> {
        if self.imp.implementation.is_none() {
            let given = [
                (self.imp.inject.is_some(), "--inject needs --impl emulate"),
                (
                    self.imp.timeout.is_some(),
                    "--timeout applies to exec: and worker: implementations (--impl exec:CMD or worker:CMD)",
                ),
                (
                    self.compute.is_some(),
                    "--compute declares the compute format of an exec: or worker: implementation (--impl exec:CMD or worker:CMD)",
                ),
            ];
            if let Some((_, why)) = given.iter().find(|(g, _)| *g) {
                anyhow::bail!("{why}");
            }
            return Ok(None);
        }
        Ok(Some(self.imp.choice(Declared {
            compute: self.compute,
            ..Declared::default()
        })))
    }
}

pub fn run(a: RouteFlags) -> anyhow::Result<ExitCode> {
    if let (Some(out), Some(dump)) = (&a.out, &a.dump) {
        let same = out == dump
            || matches!(
                (std::fs::canonicalize(out), std::fs::canonicalize(dump)),
                (Ok(x), Ok(y)) if x == y
            );
        if same {
            anyhow::bail!(
                "--out and --dump name the same directory {}: the reference's outputs would replace the checked ones",
                out.display()
            );
        }
    }
    if let Some(out) = &a.out {
        let inputs: Vec<&std::path::Path> = a
            .logits
            .iter()
            .chain(a.bias.iter().flatten())
            .map(|p| p.as_path())
            .collect();
        pipeline::prepare_out_dir(
            out,
            &["indices.npy", "weights.npy", "kept.npy", "group_sizes.npy"],
            &inputs,
            a.force,
            "--out",
        )?;
    }
    let spec = a.spec()?;
    let imp = match a.choice()? {
        Some(c) => Some(registry::build::<Route>(&c).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let mut run = pipeline::run(&spec, imp.as_deref(), a.dump.as_deref(), ())?;
    let mut out = Ok(());
    if let Some(dir) = &a.out {
        let case = &run.generated.case;
        let reference = Route::reference_outputs(case, (), run.expected.clone());
        out = pipeline::write_outputs::<Route>(dir, &reference.with_f32_weights(), "--out");
    }
    let mut report = pipeline::report(&run);
    report.document.wrote_to = a
        .out
        .as_ref()
        .filter(|_| out.is_ok())
        .map(|d| d.display().to_string());
    // The report first: a file that could not be written loses no verdict.
    let code = report::finish(&report, a.json)?;
    run.written()?;
    out.map(|()| code)
}
