//! What an MoE layer declares about the cases it runs ([`MoeDomain`]): its router's
//! conventions and features ([`RouteDomain`]), the dtypes it runs and whether it has a
//! shared expert.

use moecheck_reference::format::Format;
use moecheck_reference::moe::ffn::Activation;
use moecheck_reference::routing::{Convention, ScoreFunction};

use super::strategies::MoeArgs;
use crate::coverage::{dtype_declared, edges_hit};
use crate::routing::RouteDomain;

/// An MoE layer's declared contract; the default declares nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MoeDomain {
    /// Its router's conventions and features.
    pub route: RouteDomain,
    /// The input dtypes it runs (`None`: every drawn one).
    pub dtypes: Option<Vec<Format>>,
    /// Whether it has a shared expert (`None`: either).
    pub shared_expert: Option<bool>,
    /// Whether its shared expert is gated by `σ(x·g)` (`None`: either). Drawn cases with a
    /// shared expert take the declared gate.
    pub shared_gate: Option<bool>,
    /// The activations it runs (`None`: both); a drawn case with another takes the first.
    pub activations: Option<Vec<Activation>>,
    /// Whether it has per-expert biases / a router-logit bias (`None`: either; `false`:
    /// drawn cases lose them).
    pub expert_bias: Option<bool>,
    pub router_bias: Option<bool>,
}

impl MoeDomain {
    /// `args` inside this domain, or why not.
    /// A Hugging Face family's layer has a shared expert or not (DeepSeek-V3 and Qwen2-MoE:
    /// one, Qwen2-MoE's gated; Qwen3-MoE, Mixtral and gpt-oss: none): `(shared, gated)`.
    fn family_layer(&self) -> Option<(bool, bool)> {
        match self.route.convention? {
            Convention::HfDeepSeekV3 => Some((true, false)),
            Convention::HfQwen2Moe => Some((true, true)),
            Convention::HfQwen3Moe | Convention::HfMixtral | Convention::HfGptOss => {
                Some((false, false))
            }
            _ => None,
        }
    }

    /// What an implementation that runs outside moecheck and declares nothing of them gets:
    /// none of the layer features added after the protocol's first version (a gated shared
    /// expert, the clamped activation, expert and router biases), since a program that does
    /// not read their `case.json` keys would compute another layer without noticing.
    /// A declared Hugging Face family declares its layer: its features stay as the family
    /// has them.
    pub fn external(self) -> MoeDomain {
        if self.family_layer().is_some() {
            return self;
        }
        MoeDomain {
            shared_gate: self.shared_gate.or(Some(false)),
            activations: self.activations.or(Some(vec![Activation::Swiglu])),
            expert_bias: self.expert_bias.or(Some(false)),
            router_bias: self.router_bias.or(Some(false)),
            ..self
        }
    }

    /// `args` inside this domain, or why not. A declared convention of a Hugging Face
    /// family gives drawn cases its layer (a shared expert of the drawn FFN width where it
    /// has one, gated as it is); a declared `shared_expert` refuses the others.
    pub fn fit(&self, args: &MoeArgs) -> Result<MoeArgs, String> {
        dtype_declared(args.dtype, &self.dtypes)?;
        let mut args = args.clone();
        if let Some((shared, gated)) = self.family_layer() {
            args.shared_ffn = match (shared, args.shared_ffn) {
                (false, _) => 0,
                (true, 0) => args.ffn,
                (true, fs) => fs,
            };
            args.shared_gate = gated;
            // gpt-oss's layer: the clamped activation, expert and router biases; the others'
            // have none of them.
            let oss = self.route.convention == Some(Convention::HfGptOss);
            args.activation = if oss {
                Activation::ClampedSwiglu
            } else {
                Activation::Swiglu
            };
            (args.expert_bias, args.router_bias) = (oss, oss);
        }
        if let Some(acts) = &self.activations {
            if !acts.contains(&args.activation) {
                args.activation = acts.first().copied().unwrap_or_default();
            }
        }
        args.expert_bias &= self.expert_bias != Some(false);
        args.router_bias &= self.router_bias != Some(false);
        match (self.shared_expert, args.shared_ffn > 0) {
            (Some(false), true) => return Err("a shared expert (declared: none)".into()),
            (Some(true), false) => return Err("no shared expert (declared: one)".into()),
            _ => {}
        }
        let routing = self
            .route
            .fit_config(&args.routing, args.experts, args.bias)?;
        Ok(MoeArgs {
            routing,
            shared_gate: args.shared_ffn > 0 && self.shared_gate.unwrap_or(args.shared_gate),
            ..args
        })
    }

    /// Why the layer property `name` does not apply here.
    pub fn relaxed(&self, name: &str) -> Option<String> {
        match name {
            "dropped-contribute-zero" if self.route.capacity == Some(false) => {
                Some("the implementation declares no capacity dropping".into())
            }
            _ => None,
        }
    }
}

/// The MoE layer's edge classes, in report order.
const N_EDGES: usize = 14;

/// The edge classes, in report order.
pub const EDGES: &[&str; N_EDGES] = &[
    "one-expert",
    "k-equals-e",
    "empty-expert",
    "shared-expert",
    "shared-gate",
    "clamped-swiglu",
    "capacity-dropping",
    "groups",
    "bias",
    "score-softmax",
    "score-topk-softmax",
    "score-sigmoid",
    "dtype-bf16",
    "dtype-f32",
];

/// The edge classes `a` exercises.
pub fn edges(a: &MoeArgs) -> Vec<&'static str> {
    let r = &a.routing;
    let conditions = [
        a.experts == 1,
        r.topk == a.experts,
        a.tokens * r.topk < a.experts,
        a.shared_ffn > 0,
        a.shared_ffn > 0 && a.shared_gate,
        a.activation == Activation::ClampedSwiglu,
        r.capacity.is_some(),
        r.groups.is_some(),
        a.bias,
        r.score == ScoreFunction::Softmax,
        r.score == ScoreFunction::TopkSoftmax,
        r.score == ScoreFunction::Sigmoid,
        a.dtype == Format::Bf16,
        a.dtype == Format::F32,
    ];
    edges_hit(EDGES, conditions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::strategies::any_case;
    use moecheck_reference::routing::{SigmoidNorm, Ties};
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::TestRunner;

    #[test]
    fn a_declared_layer_draws_inside_its_domain() {
        let d = MoeDomain {
            route: RouteDomain {
                convention: Some(Convention::Megatron),
                scores: Some(vec![ScoreFunction::Sigmoid]),
                capacity: Some(false),
                ..RouteDomain::default()
            },
            dtypes: Some(vec![Format::F32]),
            shared_expert: Some(false),
            ..MoeDomain::default()
        };
        let mut runner = TestRunner::deterministic();
        let s = any_case();
        let mut inside = 0;
        for _ in 0..600 {
            let a = s.new_tree(&mut runner).unwrap().current();
            if let Ok(f) = d.fit(&a) {
                inside += 1;
                assert_eq!((f.dtype, f.shared_ffn), (Format::F32, 0));
                let r = &f.routing;
                assert_eq!(r.score, ScoreFunction::Sigmoid);
                assert!(r.capacity.is_none());
                assert_eq!((r.sigmoid_norm, r.ties), (SigmoidNorm::SkipK1, Ties::Any));
            }
        }
        assert!(inside > 5, "{inside} inside");
        // A declared gate is what every drawn shared expert gets.
        for gate in [false, true] {
            let g = MoeDomain {
                shared_gate: Some(gate),
                ..MoeDomain::default()
            };
            let mut with_shared = 0;
            for _ in 0..200 {
                let a = s.new_tree(&mut runner).unwrap().current();
                let f = g.fit(&a).unwrap();
                assert_eq!(f.shared_gate, gate && a.shared_ffn > 0);
                with_shared += usize::from(a.shared_ffn > 0);
            }
            assert!(with_shared > 10, "{with_shared} with a shared expert");
        }
        let a = s.new_tree(&mut runner).unwrap().current();
        assert_eq!(MoeDomain::default().fit(&a), Ok(a));
        assert!(d.relaxed("dropped-contribute-zero").is_some());
        assert_eq!(
            MoeDomain::default().relaxed("dropped-contribute-zero"),
            None
        );
    }

    #[test]
    fn a_hugging_face_family_gives_drawn_cases_its_layer_and_router() {
        let mut runner = TestRunner::deterministic();
        let s = any_case();
        for (conv, shared, gated, score) in [
            (Convention::HfQwen2Moe, true, true, ScoreFunction::Softmax),
            (Convention::HfQwen3Moe, false, false, ScoreFunction::Softmax),
            (
                Convention::HfDeepSeekV3,
                true,
                false,
                ScoreFunction::Sigmoid,
            ),
        ] {
            let d = MoeDomain {
                route: RouteDomain {
                    convention: Some(conv),
                    ..RouteDomain::default()
                },
                ..MoeDomain::default()
            };
            let mut inside = 0;
            for _ in 0..300 {
                let a = s.new_tree(&mut runner).unwrap().current();
                let Ok(f) = d.fit(&a) else { continue };
                inside += 1;
                assert_eq!(
                    (f.shared_ffn > 0, f.shared_gate),
                    (shared, gated),
                    "{conv:?}"
                );
                assert_eq!(f.routing.score, score, "{conv:?}");
                assert_eq!(f.routing.ties, Ties::Any, "{conv:?}");
                if conv == Convention::HfDeepSeekV3 {
                    let want = if f.routing.norm_topk {
                        SigmoidNorm::Always
                    } else {
                        SigmoidNorm::Never
                    };
                    assert_eq!(f.routing.sigmoid_norm, want);
                }
            }
            assert!(inside > 20, "{conv:?}: {inside} inside");
        }
    }
}
