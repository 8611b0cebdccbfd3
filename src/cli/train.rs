//! `moecheck train`: the flags of a training run through an implementation (module docs of
//! `moecheck::train`), alone or compared with the reference path's loss curve.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};

use moecheck::progress::Progress;
use moecheck::registry::{Choice, Declared};
use moecheck::train::compare::{compare, CompareError, TrainComparison};
use moecheck::train::experts::{self, GemmDtype};
use moecheck::train::log::LogWriter;
use moecheck::train::model::Shape;
use moecheck::train::{train, TrainConfig, TrainError, TrainRun};
use moecheck::{out, outln};
use moecheck_curves::diff::Verdict;
use moecheck_reference::routing::ScoreFunction;

use super::routing_flags::RoutingFlags;
use super::ImplFlags;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DtypeArg {
    F32,
    Bf16,
    Fp8,
}

impl From<DtypeArg> for GemmDtype {
    fn from(d: DtypeArg) -> GemmDtype {
        match d {
            DtypeArg::F32 => GemmDtype::F32,
            DtypeArg::Bf16 => GemmDtype::Bf16,
            DtypeArg::Fp8 => GemmDtype::Fp8,
        }
    }
}

#[derive(Debug, Args)]
#[command(
    mut_arg("topk", |a| a.default_value("2")),
    mut_arg("score", |a| a.help("Score function [default: the --convention's, else softmax]")),
    mut_arg("implementation", |a| a.help("Implementation of the expert GEMMs: reference | emulate (a CPU model of a grouped-GEMM kernel, never a GPU result; --inject plants a bug) | exec:CMD | worker:CMD (op gemm, or op fp8 with --dtype fp8; docs/protocol.md) | cuda | cublas | cublas-grouped [default: emulate]")),
    after_help = "A small MoE language model (embeddings of a fixed context window, MoE SwiGLU layers with residuals, output projection, softmax cross-entropy, Adam) trained on a seeded Markov chain whose entropy rate, the best achievable loss, is printed. The expert GEMMs (forward, dgrad, wgrad) run through the implementation; everything else is f64.\n\n--compare runs the reference GEMMs (init seed S, and S+1 for the seed noise) and the implementation (init seed S) on the same data and gives the verdict of `moecheck curves diff base.log test.log --baseline2 base2.log` (when stderr is not a terminal, one line there as each run ends; when every run diverges, the verdict says so).\n\nExit status: 0 done (with --compare: PASS), 1 the implementation failed or the run diverged (with --compare: FAIL), 3 with --compare: INCONCLUSIVE, 2 bad flags."
)]
pub struct TrainFlags {
    /// Training steps.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: u64,
    /// Routed experts E per layer.
    #[arg(long, default_value_t = 16)]
    pub experts: usize,
    /// Hidden size H.
    #[arg(long, default_value_t = 64)]
    pub hidden: usize,
    /// Expert FFN width F.
    #[arg(long, default_value_t = 128)]
    pub ffn: usize,
    /// MoE layers.
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Vocabulary size V of the synthetic language.
    #[arg(long, default_value_t = 32)]
    pub vocab: usize,
    /// Context window C (tokens the model sees before the one it predicts).
    #[arg(long, default_value_t = 2)]
    pub context: usize,
    /// Predicted tokens per step.
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
    /// Adam learning rate.
    #[arg(long, default_value_t = 0.01)]
    pub lr: f64,
    #[command(flatten)]
    pub routing: RoutingFlags,
    /// Operands of the expert GEMMs: f32, bf16 (rounded to nearest even; outputs in the same
    /// format) or fp8 (TE's current scaling: E4M3 activations and weights, E5M2 gradients).
    #[arg(long, value_enum, default_value = "bf16")]
    pub dtype: DtypeArg,
    /// Seed of the data and of the initial weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Seed of the initial weights alone [default: --seed] (a second baseline: the same data,
    /// another initialisation).
    #[arg(long, conflicts_with = "compare")]
    pub init_seed: Option<u64>,
    #[command(flatten)]
    pub imp: ImplFlags,
    /// Write the loss log here (`step loss tokens_per_s`; MaxText JSONL for a name ending in
    /// .jsonl). Replaces only a log moecheck train wrote.
    #[arg(long, conflicts_with = "compare")]
    pub log: Option<PathBuf>,
    /// Also train with the reference GEMMs and give the curves verdict (see below).
    #[arg(long)]
    pub compare: bool,
    /// With --compare: the reference arm's operand format [default: --dtype].
    #[arg(long, value_enum, requires = "compare")]
    pub base_dtype: Option<DtypeArg>,
    /// With --compare: no second reference seed (the margin then has no seed-noise part).
    #[arg(long, requires = "compare")]
    pub no_baseline2: bool,
    /// With --compare: write base.log, base2.log and test.log here [default: a temporary
    /// directory, removed after].
    #[arg(long, requires = "compare")]
    pub out: Option<PathBuf>,
    /// Machine-readable report on stdout (no progress lines).
    #[arg(long)]
    pub json: bool,
}

impl TrainFlags {
    fn config(&self) -> anyhow::Result<TrainConfig> {
        let positive = [
            ("--experts", self.experts),
            ("--hidden", self.hidden),
            ("--ffn", self.ffn),
            ("--layers", self.layers),
            ("--context", self.context),
            ("--batch", self.batch),
        ];
        if let Some((flag, _)) = positive.iter().find(|(_, v)| *v == 0) {
            bail!("{flag} 0: must be at least 1");
        }
        if self.vocab < 2 {
            bail!("--vocab {}: must be at least 2", self.vocab);
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            bail!("--lr {}: must be a positive number", self.lr);
        }
        let routing = self.routing.config(Some(ScoreFunction::Softmax))?;
        routing
            .validate(self.batch, self.experts)
            .context("routing flags")?;
        Ok(TrainConfig {
            shape: Shape {
                vocab: self.vocab,
                context: self.context,
                hidden: self.hidden,
                ffn: self.ffn,
                experts: self.experts,
                layers: self.layers,
            },
            routing,
            batch: self.batch,
            steps: self.steps,
            lr: self.lr,
            init_seed: self.init_seed.unwrap_or(self.seed),
            data_seed: self.seed,
        })
    }

    fn choice(&self) -> Choice {
        self.imp.choice(Declared::default())
    }
}

/// What a run prints every this many steps (text mode).
const PRINT_EVERY: u64 = 50;

fn describe(c: &TrainConfig, dtype: GemmDtype) -> String {
    format!(
        "vocab {}, context {}, hidden {}, ffn {}, {} experts top-{} {}, {} layer(s), batch {}, lr {}, {} GEMMs",
        c.shape.vocab,
        c.shape.context,
        c.shape.hidden,
        c.shape.ffn,
        c.shape.experts,
        c.routing.topk,
        c.routing.score.name(),
        c.shape.layers,
        c.batch,
        c.lr,
        dtype.name()
    )
}

fn summary(role: &str, r: &TrainRun, batch: usize, steps: u64) -> String {
    let tail = (steps as usize / 10).max(1);
    let model = if r.is_model {
        " (CPU model, not a GPU result)"
    } else {
        ""
    };
    let diverged = match (r.diverged_at, &r.diverged_because) {
        (Some(s), Some(why)) => format!(", DIVERGED at step {s}: {why}"),
        (Some(s), None) => format!(", DIVERGED at step {s}"),
        _ => String::new(),
    };
    format!(
        "{role}: impl {}{model}: final loss {:.4} (mean of the last {tail} steps; floor {:.4}), {:.0} tokens/s, {:.1} s{diverged}",
        r.implementation,
        r.final_loss(tail),
        r.loss_floor,
        r.tokens_per_s(batch),
        r.wall_s
    )
}

pub fn run(a: TrainFlags) -> anyhow::Result<ExitCode> {
    let config = a.config()?;
    let dtype: GemmDtype = a.dtype.into();
    let test = experts::build(&a.choice(), dtype).map_err(anyhow::Error::msg)?;
    if a.compare {
        return run_compare(&a, &config, dtype, test.as_ref());
    }
    let mut log = a
        .log
        .as_deref()
        .map(|p| LogWriter::create(p, "--log", &describe(&config, dtype)))
        .transpose()?;
    if !a.json {
        outln!("moecheck train: {}", describe(&config, dtype));
    }
    let progress = Progress::steps(config.steps, "steps");
    let mut write_err = None;
    let result = train(&config, test.as_ref(), |s| {
        progress.step();
        progress.stage(&format!(
            "loss {:.4}, {:.0} tokens/s",
            s.loss, s.tokens_per_s
        ));
        if let Some(l) = &mut log {
            if write_err.is_none() {
                write_err = l.write(s).err();
            }
        }
        // On a terminal the bar shows every step; otherwise a line every PRINT_EVERY steps.
        let due = s.step % PRINT_EVERY == 0 || s.step + 1 == config.steps;
        if !a.json && !progress.shown() && due {
            outln!(
                "step {:>5}  loss {:.4}  {:.0} tokens/s",
                s.step,
                s.loss,
                s.tokens_per_s
            );
        }
    });
    progress.done();
    let r = match result {
        Ok(r) => r,
        Err(TrainError::Refused(why)) => bail!("--impl {}: {why}", test.name()),
        Err(e @ TrainError::Failed { .. }) => {
            eprintln!("moecheck: train: {e}");
            return write_err.map_or(Ok(ExitCode::from(super::EXIT_FAIL)), Err);
        }
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        outln!("{}", summary("run", &r, config.batch, config.steps));
        if let (Some(p), None) = (&a.log, &write_err) {
            outln!("log: {}", p.display());
        }
    }
    // The report first: a log that could not be written loses no result.
    if let Some(e) = write_err {
        return Err(e);
    }
    Ok(if r.diverged_at.is_some() {
        ExitCode::from(super::EXIT_FAIL)
    } else {
        ExitCode::SUCCESS
    })
}

fn run_compare(
    a: &TrainFlags,
    config: &TrainConfig,
    dtype: GemmDtype,
    test: &dyn experts::ExpertGemm,
) -> anyhow::Result<ExitCode> {
    let base_dtype: GemmDtype = a.base_dtype.map_or(dtype, Into::into);
    let base =
        experts::build(&Choice::named("reference"), base_dtype).map_err(anyhow::Error::msg)?;
    let tmp;
    let dir = match &a.out {
        Some(d) => {
            moecheck::user_file::check_dir(d, "--out")?;
            std::fs::create_dir_all(d).with_context(|| format!("--out {}", d.display()))?;
            d.clone()
        }
        None => {
            tmp = moecheck::impls::scratch::Scratch::new("moecheck-train-")
                .context("a temporary directory for the logs")?;
            tmp.path().to_path_buf()
        }
    };
    if !a.json {
        outln!("moecheck train --compare: {}", describe(config, dtype));
    }
    let arms = if a.no_baseline2 { 2 } else { 3 };
    let progress = Progress::steps(config.steps * arms, "steps");
    // Without a terminal (piped, CI) there is no bar: one line per phase on stderr instead.
    let lines = !progress.shown();
    let (mut phase, mut started) = (0, std::time::Instant::now());
    let result = compare(
        config,
        base.as_ref(),
        test,
        !a.no_baseline2,
        &dir,
        |role, s| {
            progress.step();
            progress.stage(&format!("{role}: loss {:.4}", s.loss));
            if lines && s.step + 1 == config.steps {
                phase += 1;
                eprintln!(
                    "moecheck train --compare: run {phase}/{arms} ({role}) done: {} steps in {:.1} s, last loss {:.4}",
                    config.steps,
                    started.elapsed().as_secs_f64(),
                    s.loss
                );
                started = std::time::Instant::now();
            }
        },
    );
    progress.done();
    if lines {
        if let Ok(c) = &result {
            eprintln!(
                "moecheck train --compare: curves verdict {}",
                c.curves.verdict.label()
            );
        }
    }
    let c: TrainComparison = match result {
        Ok(c) => c,
        Err(CompareError::Train {
            role,
            source: TrainError::Refused(why),
        }) => bail!("{role} run: {why}"),
        Err(e @ CompareError::Train { .. }) => {
            eprintln!("moecheck: train: {e}");
            return Ok(ExitCode::from(super::EXIT_FAIL));
        }
        Err(CompareError::Io(e)) => return Err(e),
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&c)?);
    } else {
        for arm in &c.arms {
            outln!(
                "{}",
                summary(arm.role, &arm.run, config.batch, config.steps)
            );
        }
        out!("{}", moecheck_curves::render::text(&c.curves));
        if a.out.is_some() {
            let log = |r: &str| dir.join(format!("{r}.log")).display().to_string();
            let b2 = if a.no_baseline2 {
                String::new()
            } else {
                format!(" --baseline2 {}", log("base2"))
            };
            outln!(
                "reproduce the verdict: moecheck curves diff {} {}{b2}",
                log("base"),
                log("test")
            );
        }
    }
    Ok(match c.curves.verdict {
        Verdict::Pass => ExitCode::SUCCESS,
        Verdict::Fail => ExitCode::from(super::EXIT_FAIL),
        Verdict::Inconclusive => ExitCode::from(super::curves::EXIT_INCONCLUSIVE),
    })
}
