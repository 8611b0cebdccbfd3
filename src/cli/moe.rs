//! `moecheck moe`: the flags of a whole-layer check (generate a case, run an implementation,
//! check the output and every gradient within the derived layer bound). The work is the
//! pipeline's.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use moecheck::generate::moe::MoeSpec;
use moecheck::registry::{self, Choice, Declared};
use moecheck::{memory, pipeline, report};
use moecheck_reference::format::Format;
use moecheck_reference::moe::ffn::Activation;
use moecheck_reference::moe::MoeLayer;
use moecheck_reference::routing::{Convention, ScoreFunction};

use super::routing_flags::RoutingFlags;
use super::ImplFlags;

#[derive(Debug, Args)]
#[command(
    mut_arg("topk", |a| a.default_value("2")),
    mut_arg("score", |a| a.help("Score function [default: the --convention's, else topk-softmax]")),
    mut_arg("implementation", |a| a.help("Implementation under test: reference | emulate (a CPU model of a fused layer kernel, never a GPU result) | exec:CMD (op moe_layer, docs/protocol.md) | worker:CMD (the same, CMD started once for every case) [default: emulate]"))
)]
pub struct MoeFlags {
    /// Number of routed experts E.
    #[arg(long, default_value_t = 8)]
    pub experts: usize,
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
    /// The shared expert's gate: none (DeepSeek-V3: out += shared(x)) or sigmoid (Qwen2-MoE's
    /// shared_expert_gate: out += sigmoid(x·g)·shared(x), g an (H,) input whose gradient
    /// dshared_gate is checked too). Needs --shared-ffn. Default: none, or sigmoid under
    /// --convention hf-qwen2-moe.
    #[arg(long, value_parser = ["none", "sigmoid"])]
    pub shared_gate: Option<String>,
    /// The experts' activation: swiglu (silu(a)·b) or clamped-swiglu (gpt-oss:
    /// (clamp(b, -7, 7) + 1)·g·sigmoid(1.702·g), g = min(a, 7)). Default: swiglu, or
    /// clamped-swiglu under --convention hf-gpt-oss.
    #[arg(long, value_parser = ["swiglu", "clamped-swiglu"])]
    pub activation: Option<String>,
    /// Per-expert biases on the gate, up and down projections (gpt-oss's gate_up_proj_bias and
    /// down_proj_bias), checked with their gradients dexpert_b0/b1/bo. On under hf-gpt-oss.
    #[arg(long, overrides_with = "no_expert_bias")]
    pub expert_bias: bool,
    /// No expert biases (turns off hf-gpt-oss's, or an earlier --expert-bias).
    #[arg(long, overrides_with = "expert_bias")]
    pub no_expert_bias: bool,
    /// A learned bias added to the router logits (gpt-oss's router Linear): it moves selection
    /// and weights, and its gradient drouter_bias is checked. Not --bias, which is selection
    /// only and has no gradient. On under hf-gpt-oss.
    #[arg(long, overrides_with = "no_router_bias")]
    pub router_bias: bool,
    /// No router-logit bias (turns off hf-gpt-oss's, or an earlier --router-bias).
    #[arg(long, overrides_with = "router_bias")]
    pub no_router_bias: bool,
    #[command(flatten)]
    pub routing: RoutingFlags,
    /// Add a per-expert selection bias (DeepSeek-V3 e_score_correction_bias).
    #[arg(long)]
    pub bias: bool,
    /// Input dtype: every input value is exactly representable in it (bf16, f16 or f32).
    #[arg(long, default_value = "bf16", value_parser = super::format_in(super::INPUTS))]
    pub dtype: Format,
    /// Declared compute format of an exec: or worker: implementation (every operation, GEMM
    /// accumulation included) [default: f32]. Built-in implementations declare their own.
    #[arg(long, value_parser = super::format_in(super::FLOATS))]
    pub compute: Option<Format>,
    /// Declared output format of an exec: or worker: implementation [default: f32].
    #[arg(long, value_parser = super::format_in(super::FLOATS))]
    pub out_dtype: Option<Format>,
    /// Declared compute format of the router alone (its logits GEMM, scores, gates, weights
    /// and their gradients) where it is not --compute's: Hugging Face's routers compute in
    /// f32 even in an f64 module (--compute f64 --router-compute f32) [default: --compute,
    /// or f32 under a Hugging Face --convention but hf-gpt-oss when --compute f64 is given
    /// here; a worker's greeting declares its own].
    #[arg(long, value_parser = super::format_in(super::FLOATS))]
    pub router_compute: Option<Format>,
    /// Seed of the generated case.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub imp: ImplFlags,
    /// Write the case and the outputs that were checked to DIR (protocol layout).
    #[arg(long)]
    pub dump: Option<PathBuf>,
    /// Machine-readable report on stdout, with a top-level "verdict".
    #[arg(long)]
    pub json: bool,
    /// Run even when the case's estimated memory exceeds what this machine has available
    /// (without it such a case is refused with exit 2).
    #[arg(long)]
    pub allow_large: bool,
}

impl MoeFlags {
    fn spec(&self) -> anyhow::Result<MoeSpec> {
        Ok(MoeSpec {
            tokens: self.tokens,
            hidden: self.hidden,
            experts: self.experts,
            ffn: self.ffn,
            shared_ffn: self.shared_ffn,
            shared_gate: self.shared_gate()?,
            activation: match self.activation.as_deref() {
                Some("clamped-swiglu") => Activation::ClampedSwiglu,
                Some(_) => Activation::Swiglu,
                None if self.gpt_oss() => Activation::ClampedSwiglu,
                None => Activation::Swiglu,
            },
            expert_bias: self.expert_bias || (self.gpt_oss() && !self.no_expert_bias),
            router_bias: self.router_bias || (self.gpt_oss() && !self.no_router_bias),
            routing: self.routing.config(Some(ScoreFunction::TopkSoftmax))?,
            bias: self.bias,
            dtype: self.dtype,
            seed: self.seed,
        })
    }

    /// Whether `--convention hf-gpt-oss` sets the layer.
    fn gpt_oss(&self) -> bool {
        self.routing.convention() == Convention::HfGptOss
    }

    /// Whether the shared expert is gated: `--shared-gate`, else the convention's layer
    /// (Qwen2-MoE's is gated and always has a shared expert).
    fn shared_gate(&self) -> anyhow::Result<bool> {
        let convention = self.routing.convention();
        let qwen2 = convention == Convention::HfQwen2Moe;
        match self.shared_gate.as_deref() {
            Some(g) => Ok(g == "sigmoid"),
            None if qwen2 && self.shared_ffn == 0 => anyhow::bail!(
                "--convention hf-qwen2-moe: the Qwen2-MoE layer has a gated shared expert; give its width with --shared-ffn (or --shared-gate none to check the layer without one)"
            ),
            None if convention == Convention::HfDeepSeekV3 && self.shared_ffn == 0 => anyhow::bail!(
                "--convention hf-deepseek-v3: the DeepSeek-V3 layer has a shared expert; give its width with --shared-ffn (moe_intermediate_size x n_shared_experts)"
            ),
            None => Ok(qwen2),
        }
    }

    /// The router's declared format: `--router-compute`, else f32 for a Hugging Face family
    /// declared `--compute f64` (transformers' routers score in f32 in an f64 module; not
    /// gpt-oss's).
    fn router_compute(&self) -> Option<Format> {
        let hf = self.routing.convention().router_in_f32();
        self.router_compute
            .or((hf && self.compute == Some(Format::F64)).then_some(Format::F32))
    }

    /// `--impl` and its flags, with `--compute` and `--out-dtype` as the declaration.
    fn choice(&self) -> Choice {
        self.imp.choice(Declared {
            compute: self.compute,
            out_dtype: self.out_dtype,
            router_compute: self.router_compute(),
            ..Declared::default()
        })
    }
}

pub fn run(a: MoeFlags) -> anyhow::Result<ExitCode> {
    if let Some(r) = a.router_compute {
        // The bound takes the router's inputs as exact (moecheck_reference::moe::bound).
        if !r.holds(a.dtype) {
            anyhow::bail!(
                "--router-compute {r}: the router must read the {} inputs exactly (--dtype {}); declare a format that holds them",
                a.dtype, a.dtype
            );
        }
    }
    let spec = a.spec()?;
    let mut need = memory::moe_bytes(a.tokens, a.hidden, a.experts, a.ffn, a.shared_ffn);
    let name = a.imp.implementation.as_deref().unwrap_or("").trim();
    if name.starts_with("exec:") || name.starts_with("worker:") {
        need = need.saturating_add(moecheck::disk::moe_external_bytes(
            a.tokens,
            a.hidden,
            a.experts,
            a.ffn,
            a.shared_ffn,
        ));
    }
    memory::guard(
        "--tokens/--hidden/--experts/--ffn/--shared-ffn",
        need,
        memory::available(),
        a.allow_large,
    )
    .map_err(anyhow::Error::msg)?;
    if name.starts_with("exec:") || name.starts_with("worker:") {
        // The case directory in $TMPDIR (checked after memory, which refuses first).
        let disk =
            moecheck::disk::moe_case_bytes(a.tokens, a.hidden, a.experts, a.ffn, a.shared_ffn);
        moecheck::disk::guard_tmp(disk, a.allow_large).map_err(anyhow::Error::msg)?;
    }
    let imp = registry::build::<MoeLayer>(&a.choice()).map_err(anyhow::Error::msg)?;
    let mut run = pipeline::run(&spec, Some(imp.as_ref()), a.dump.as_deref(), ())?;
    let code = report::finish(&pipeline::report(&run), a.json)?;
    run.written().map(|()| code)
}
