//! The MoE layer case, its forward pass, and the outputs an implementation returns.

use ndarray::{Array1, Array2, Array3, ArrayD, ArrayView2, Axis};
use serde::{Deserialize, Serialize};

pub use super::ffn::{
    ffn_forward, sigmoid, silu, silu_grad, Activation, ExpertBias, FfnForward, FfnSpec,
};
use super::permute::Permutation;
use crate::format::Format;
use crate::routing::{route, DropPolicy, Routing, RoutingCase, RoutingConfig, Ties};
use crate::Error;

/// The shared expert (DeepSeek-V3 `shared_experts`): one dense SwiGLU FFN on every token,
/// optionally scaled per token by a sigmoid gate (Qwen2-MoE `shared_expert_gate`:
/// `σ(x·g) ⊙ shared(x)`).
#[derive(Debug, Clone, PartialEq)]
pub struct SharedExpert {
    /// `(H, Fs)`
    pub w0: Array2<f64>,
    /// `(H, Fs)`
    pub w1: Array2<f64>,
    /// `(Fs, H)`
    pub wo: Array2<f64>,
    /// `g (H,)`: the gate's weight (a bias-free `Linear(H, 1)`), if the shared expert is gated.
    pub gate: Option<Array1<f64>>,
}

/// The per-token gate `σ(x·g)` of a gated shared expert.
pub fn shared_gate_values(x: ArrayView2<f64>, g: &Array1<f64>) -> Array1<f64> {
    x.dot(g).mapv(sigmoid)
}

/// One MoE-layer problem: inputs, weights, the output gradient and the routing.
///
/// Values are f64 but, in generated cases, exactly representable in `dtype` (the format an
/// implementation reads them in).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeCase {
    /// `(T, H)`
    pub x: Array2<f64>,
    /// `(H, E)`
    pub wr: Array2<f64>,
    /// `(E,)`: selection-only bias.
    pub bias: Option<Array1<f64>>,
    /// `(E,)`: a learned bias added to the router logits, `z = x·W_r + b_r` (gpt-oss's router
    /// `Linear` has one): it moves selection and weights alike and has a gradient.
    pub router_bias: Option<Array1<f64>>,
    /// `(E, H, F)`
    pub w0: Array3<f64>,
    /// `(E, H, F)`
    pub w1: Array3<f64>,
    /// `(E, F, H)`
    pub wo: Array3<f64>,
    pub shared: Option<SharedExpert>,
    /// The experts' biases (gpt-oss).
    pub expert_bias: Option<ExpertBias>,
    /// The experts' and the shared expert's activation.
    pub activation: Activation,
    /// `(T, H)`: the gradient of the loss with respect to `out`.
    pub dout: Array2<f64>,
    pub routing: RoutingConfig,
    /// The format every input value is representable in.
    pub dtype: Format,
}

impl MoeCase {
    pub fn tokens(&self) -> usize {
        self.x.nrows()
    }
    pub fn hidden(&self) -> usize {
        self.x.ncols()
    }
    pub fn experts(&self) -> usize {
        self.wr.ncols()
    }
    pub fn ffn(&self) -> usize {
        self.w0.shape()[2]
    }
    pub fn topk(&self) -> usize {
        self.routing.topk
    }

    /// Checks every shape against `x (T, H)`, `W_r (H, E)` and `W0 (E, H, F)`, that every
    /// value is finite, and the routing configuration. The error names the array.
    pub fn validate(&self) -> Result<(), Error> {
        let (t, h) = self.x.dim();
        let e = self.wr.ncols();
        let f = self.w0.shape()[2];
        let shape = |what: &'static str, got: &[usize], want: Vec<usize>| {
            if got == want.as_slice() {
                Ok(())
            } else {
                Err(Error::ShapeMismatch {
                    op: "moe_layer",
                    what,
                    expected: want,
                    got: got.to_vec(),
                })
            }
        };
        shape("w_router", self.wr.shape(), vec![h, e])?;
        shape("w0", self.w0.shape(), vec![e, h, f])?;
        shape("w1", self.w1.shape(), vec![e, h, f])?;
        shape("wo", self.wo.shape(), vec![e, f, h])?;
        shape("dout", self.dout.shape(), vec![t, h])?;
        if let Some(b) = &self.bias {
            shape("bias", b.shape(), vec![e])?;
        }
        if let Some(b) = &self.router_bias {
            shape("router_bias", b.shape(), vec![e])?;
        }
        if let Some(eb) = &self.expert_bias {
            shape("expert_b0", eb.b0.shape(), vec![e, f])?;
            shape("expert_b1", eb.b1.shape(), vec![e, f])?;
            shape("expert_bo", eb.bo.shape(), vec![e, h])?;
        }
        if let Some(s) = &self.shared {
            let fs = s.w0.ncols();
            shape("shared_w0", s.w0.shape(), vec![h, fs])?;
            shape("shared_w1", s.w1.shape(), vec![h, fs])?;
            shape("shared_wo", s.wo.shape(), vec![fs, h])?;
            if let Some(g) = &s.gate {
                shape("shared_gate", g.shape(), vec![h])?;
            }
        }
        for (what, a) in self.named_inputs() {
            if let Some((i, v)) = a.indexed_iter().find(|(_, v)| !v.is_finite()) {
                return Err(Error::NonFinite {
                    what,
                    index: ndarray::Dimension::slice(&i).to_vec(),
                    value: *v,
                });
            }
        }
        let token_order = matches!(
            self.routing.capacity,
            Some(c) if c.policy == DropPolicy::TokenOrder
        );
        if token_order && self.routing.ties == Ties::Any {
            return Err(Error::InvalidRouting {
                what: "ties",
                reason: "any cannot be checked with the token-order drop policy in the MoE \
                         layer: under it every token of an expert ties, and the layer's outputs \
                         do not show which were kept (declare --ties lower-index, or check the \
                         router alone with moecheck route)"
                    .into(),
            });
        }
        self.routing.validate(t, e)
    }

    /// Every input array with its protocol name (`x`, `w_router`, `bias`, `w0`, …, `dout`).
    pub fn named_inputs(&self) -> Vec<(&'static str, ArrayD<f64>)> {
        let mut v: Vec<(&'static str, ArrayD<f64>)> = vec![
            ("x", self.x.clone().into_dyn()),
            ("w_router", self.wr.clone().into_dyn()),
            ("w0", self.w0.clone().into_dyn()),
            ("w1", self.w1.clone().into_dyn()),
            ("wo", self.wo.clone().into_dyn()),
            ("dout", self.dout.clone().into_dyn()),
        ];
        if let Some(b) = &self.bias {
            v.push(("bias", b.clone().into_dyn()));
        }
        if let Some(b) = &self.router_bias {
            v.push(("router_bias", b.clone().into_dyn()));
        }
        if let Some(eb) = &self.expert_bias {
            v.push(("expert_b0", eb.b0.clone().into_dyn()));
            v.push(("expert_b1", eb.b1.clone().into_dyn()));
            v.push(("expert_bo", eb.bo.clone().into_dyn()));
        }
        if let Some(s) = &self.shared {
            v.push(("shared_w0", s.w0.clone().into_dyn()));
            v.push(("shared_w1", s.w1.clone().into_dyn()));
            v.push(("shared_wo", s.wo.clone().into_dyn()));
            if let Some(g) = &s.gate {
                v.push(("shared_gate", g.clone().into_dyn()));
            }
        }
        v
    }

    /// The router logits `z = x·W_r (+ b_r)` in f64.
    pub fn logits(&self) -> Array2<f64> {
        let mut z = self.x.dot(&self.wr);
        if let Some(b) = &self.router_bias {
            z += b;
        }
        z
    }

    /// The experts' FFN spec: activation and biases.
    pub fn experts_spec(&self) -> FfnSpec<'_> {
        FfnSpec {
            act: self.activation,
            bias: self.expert_bias.as_ref(),
        }
    }

    /// The shared expert's FFN spec: the activation, no bias.
    pub fn shared_spec(&self) -> FfnSpec<'_> {
        FfnSpec {
            act: self.activation,
            bias: None,
        }
    }

    /// The routing problem of this case with the given logits.
    pub fn routing_case(&self, logits: Array2<f64>) -> RoutingCase {
        RoutingCase {
            logits,
            bias: self.bias.clone(),
            config: self.routing,
        }
    }
}

/// Which output of the layer (forward value or gradient).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorId {
    /// `out (T, H)`
    Out,
    /// `dx (T, H)`
    Dx,
    /// `dw_router (H, E)`
    DwRouter,
    /// `dw0 (E, H, F)`
    Dw0,
    /// `dw1 (E, H, F)`
    Dw1,
    /// `dwo (E, F, H)`
    Dwo,
    /// `dshared_w0 (H, Fs)`
    DsharedW0,
    /// `dshared_w1 (H, Fs)`
    DsharedW1,
    /// `dshared_wo (Fs, H)`
    DsharedWo,
    /// `dshared_gate (H,)`
    DsharedGate,
    /// `drouter_bias (E,)`
    DrouterBias,
    /// `dexpert_b0 (E, F)`
    DexpertB0,
    /// `dexpert_b1 (E, F)`
    DexpertB1,
    /// `dexpert_bo (E, H)`
    DexpertBo,
}

impl TensorId {
    pub const ALL: [TensorId; 14] = [
        TensorId::Out,
        TensorId::Dx,
        TensorId::DwRouter,
        TensorId::Dw0,
        TensorId::Dw1,
        TensorId::Dwo,
        TensorId::DsharedW0,
        TensorId::DsharedW1,
        TensorId::DsharedWo,
        TensorId::DsharedGate,
        TensorId::DrouterBias,
        TensorId::DexpertB0,
        TensorId::DexpertB1,
        TensorId::DexpertBo,
    ];

    /// The file stem in a case directory (`out`, `dx`, `dw_router`, …).
    pub fn name(self) -> &'static str {
        match self {
            TensorId::Out => "out",
            TensorId::Dx => "dx",
            TensorId::DwRouter => "dw_router",
            TensorId::Dw0 => "dw0",
            TensorId::Dw1 => "dw1",
            TensorId::Dwo => "dwo",
            TensorId::DsharedW0 => "dshared_w0",
            TensorId::DsharedW1 => "dshared_w1",
            TensorId::DsharedWo => "dshared_wo",
            TensorId::DsharedGate => "dshared_gate",
            TensorId::DrouterBias => "drouter_bias",
            TensorId::DexpertB0 => "dexpert_b0",
            TensorId::DexpertB1 => "dexpert_b1",
            TensorId::DexpertBo => "dexpert_bo",
        }
    }

    /// Whether the leading axis is the expert (per-expert statistics in reports).
    pub fn per_expert(self) -> bool {
        matches!(
            self,
            TensorId::Dw0
                | TensorId::Dw1
                | TensorId::Dwo
                | TensorId::DexpertB0
                | TensorId::DexpertB1
                | TensorId::DexpertBo
        )
    }

    pub fn is_shared(self) -> bool {
        matches!(
            self,
            TensorId::DsharedW0 | TensorId::DsharedW1 | TensorId::DsharedWo | TensorId::DsharedGate
        )
    }

    /// The tensors a case has (the shared-expert gradients only with a shared expert, the
    /// gate's only with a gated one).
    pub fn of_case(case: &MoeCase) -> Vec<TensorId> {
        let gated = case.shared.as_ref().is_some_and(|s| s.gate.is_some());
        TensorId::ALL
            .into_iter()
            .filter(|t| match t {
                TensorId::DsharedGate => gated,
                TensorId::DrouterBias => case.router_bias.is_some(),
                TensorId::DexpertB0 | TensorId::DexpertB1 | TensorId::DexpertBo => {
                    case.expert_bias.is_some()
                }
                _ => !t.is_shared() || case.shared.is_some(),
            })
            .collect()
    }

    /// The shape this tensor has for `case`.
    pub fn shape(self, case: &MoeCase) -> Vec<usize> {
        let (t, h, e, f) = (case.tokens(), case.hidden(), case.experts(), case.ffn());
        let fs = case.shared.as_ref().map_or(0, |s| s.w0.ncols());
        match self {
            TensorId::Out | TensorId::Dx => vec![t, h],
            TensorId::DwRouter => vec![h, e],
            TensorId::Dw0 | TensorId::Dw1 => vec![e, h, f],
            TensorId::Dwo => vec![e, f, h],
            TensorId::DsharedW0 | TensorId::DsharedW1 => vec![h, fs],
            TensorId::DsharedWo => vec![fs, h],
            TensorId::DsharedGate => vec![h],
            TensorId::DrouterBias => vec![e],
            TensorId::DexpertB0 | TensorId::DexpertB1 => vec![e, f],
            TensorId::DexpertBo => vec![e, h],
        }
    }
}

impl std::fmt::Display for TensorId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The layer output and every gradient, widened to f64. The shared-expert gradients are
/// `None` without a shared expert, the gate's without a gated one.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeOutputs {
    pub out: Array2<f64>,
    pub dx: Array2<f64>,
    pub dw_router: Array2<f64>,
    pub dw0: Array3<f64>,
    pub dw1: Array3<f64>,
    pub dwo: Array3<f64>,
    pub dshared: Option<[Array2<f64>; 3]>,
    /// `(H,)`
    pub dshared_gate: Option<Array1<f64>>,
    /// `(E,)`, with a router bias.
    pub drouter_bias: Option<Array1<f64>>,
    /// `[db0 (E, F), db1 (E, F), dbo (E, H)]`, with expert biases.
    pub dexpert_bias: Option<[Array2<f64>; 3]>,
}

impl MoeOutputs {
    /// The tensor `id` (dynamic shape), `None` for an absent shared gradient.
    pub fn get(&self, id: TensorId) -> Option<ArrayD<f64>> {
        Some(match id {
            TensorId::Out => self.out.clone().into_dyn(),
            TensorId::Dx => self.dx.clone().into_dyn(),
            TensorId::DwRouter => self.dw_router.clone().into_dyn(),
            TensorId::Dw0 => self.dw0.clone().into_dyn(),
            TensorId::Dw1 => self.dw1.clone().into_dyn(),
            TensorId::Dwo => self.dwo.clone().into_dyn(),
            TensorId::DsharedW0 => self.dshared.as_ref()?[0].clone().into_dyn(),
            TensorId::DsharedW1 => self.dshared.as_ref()?[1].clone().into_dyn(),
            TensorId::DsharedWo => self.dshared.as_ref()?[2].clone().into_dyn(),
            TensorId::DsharedGate => self.dshared_gate.as_ref()?.clone().into_dyn(),
            TensorId::DrouterBias => self.drouter_bias.as_ref()?.clone().into_dyn(),
            TensorId::DexpertB0 => self.dexpert_bias.as_ref()?[0].clone().into_dyn(),
            TensorId::DexpertB1 => self.dexpert_bias.as_ref()?[1].clone().into_dyn(),
            TensorId::DexpertBo => self.dexpert_bias.as_ref()?[2].clone().into_dyn(),
        })
    }
}

/// The shared expert's weights as one-group grouped weights `(1, ·, ·)`.
pub fn shared_as_group(s: &SharedExpert) -> [Array3<f64>; 3] {
    [
        s.w0.clone().insert_axis(Axis(0)),
        s.w1.clone().insert_axis(Axis(0)),
        s.wo.clone().insert_axis(Axis(0)),
    ]
}

/// Everything the forward computes, kept for the backward.
#[derive(Debug, Clone, PartialEq)]
pub struct Forward {
    /// `z = x·W_r (T, E)`
    pub logits: Array2<f64>,
    pub routing: Routing,
    pub perm: Permutation,
    /// `xp (T·k, H)`
    pub xp: Array2<f64>,
    /// The experts' FFN over the permuted rows.
    pub ffn: FfnForward,
    /// The shared expert's FFN over all tokens.
    pub shared: Option<FfnForward>,
    /// The gated shared expert's per-token gate `σ(x·g) (T,)`.
    pub shared_gate: Option<Array1<f64>>,
    /// `out (T, H)`
    pub out: Array2<f64>,
}

/// The layer forward in f64 (module documentation, steps 1–6). Validates `case`.
pub fn forward(case: &MoeCase) -> Result<Forward, Error> {
    case.validate()?;
    forward_with_logits(case, case.logits())
}

/// The forward from given logits (the caller computed `z = x·W_r`).
pub(crate) fn forward_with_logits(case: &MoeCase, logits: Array2<f64>) -> Result<Forward, Error> {
    let routing = route(&case.routing_case(logits.clone()))?;
    let perm = Permutation::new(&routing.indices, &routing.kept, case.experts())?;
    let off = perm.offsets();
    let xp = perm.permute(case.x.view());
    let ffn = ffn_forward(
        xp.view(),
        case.w0.view(),
        case.w1.view(),
        case.wo.view(),
        &off,
        case.experts_spec(),
    );
    let mut out = perm.combine(ffn.y.view(), routing.combine.view());
    let shared = case.shared.as_ref().map(|s| {
        let [w0, w1, wo] = shared_as_group(s);
        ffn_forward(
            case.x.view(),
            w0.view(),
            w1.view(),
            wo.view(),
            &[0, case.tokens()],
            case.shared_spec(),
        )
    });
    let shared_gate = case
        .shared
        .as_ref()
        .and_then(|s| s.gate.as_ref())
        .map(|g| shared_gate_values(case.x.view(), g));
    if let Some(s) = &shared {
        match &shared_gate {
            Some(g) => out += &(&s.y * &g.view().insert_axis(Axis(1))),
            None => out += &s.y,
        }
    }
    Ok(Forward {
        logits,
        routing,
        perm,
        xp,
        ffn,
        shared,
        shared_gate,
        out,
    })
}
