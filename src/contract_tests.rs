use super::*;
use moecheck_reference::gemm::Gemm;
use serde_json::json;

fn greeting(v: Value) -> Contract {
    Contract::from_greeting("grouped_gemm", Some(&v)).unwrap()
}

#[test]
fn a_greeting_is_read_into_the_domain_and_the_declaration() {
    let c = greeting(json!({
        "declared": {"tail": "ignored", "out_dtype": "input", "acc": "bf16", "acc_block": 32},
        "supports": {"dtypes": ["f32", "bf16"], "passes": ["fwd", "wgrad"], "k_min": 1,
                     "n_min": 1, "k_multiple": 8, "m_multiple": 128, "max_experts": 64}
    }));
    let (d, declared) = Gemm::read_contract(&c).unwrap();
    assert_eq!(d.tail, TailContract::Ignored);
    assert!(d.out_is_input);
    assert_eq!(d.dtypes, Some(vec![Format::F32, Format::Bf16]));
    assert_eq!(d.passes, Passes::parse("fwd,wgrad").unwrap());
    assert_eq!((d.k_min, d.n_min, d.k_multiple, d.n_multiple), (1, 1, 8, 1));
    assert_eq!((d.m_multiple, d.max_experts), (128, Some(64)));
    assert_eq!(declared.acc, Some(Format::Bf16));
    assert_eq!(declared.acc_block, Some(32));
    assert_eq!(declared.out_dtype, None);
    let (d, declared) = Gemm::read_contract(&Contract::default()).unwrap();
    assert_eq!((d, declared), (GemmDomain::default(), Declared::default()));
}

#[test]
fn flags_replace_the_greeting_key_by_key() {
    let c = greeting(json!({"declared": {"tail": "ignored", "out_dtype": "bf16"}}));
    let mut flags = Contract::default();
    flags.set(Section::Declared, "tail", json!("zero"), "--tail");
    let (d, declared) = Gemm::read_contract(&c.overridden_by(&flags)).unwrap();
    assert_eq!(d.tail, TailContract::Zero);
    assert_eq!(declared.out_dtype, Some(Format::Bf16));
}

#[test]
fn a_router_greeting_and_flags() {
    use moecheck_reference::routing::Route;
    let c = Contract::from_greeting(
        "route",
        Some(&json!({
            "declared": {"compute": "f32", "convention": "megatron", "ties": "any"},
            "supports": {"scores": ["softmax", "sigmoid"], "capacity": true,
                         "drop_policies": ["probs", "token-order"], "bias": false}
        })),
    )
    .unwrap();
    let mut flags = Contract::default();
    flags.set(Section::Supports, "scores", json!("sigmoid"), "--score");
    let (d, declared) = Route::read_contract(&c.overridden_by(&flags)).unwrap();
    assert_eq!(d.convention, Some(Convention::Megatron));
    assert_eq!(d.ties, Some(Ties::Any));
    assert_eq!(d.scores, Some(vec![ScoreFunction::Sigmoid]));
    assert_eq!(
        d.drop_policies,
        Some(vec![DropPolicy::Probs, DropPolicy::TokenOrder])
    );
    assert_eq!(
        (d.capacity, d.bias, d.groups),
        (Some(true), Some(false), None)
    );
    assert_eq!(declared.compute, Some(Format::F32));
    let mut bad = Contract::default();
    bad.set(Section::Declared, "convention", json!("hf"), "--convention");
    let e = Route::read_contract(&bad).unwrap_err();
    assert!(
        e.ends_with(
            "expected one of maxtext, megatron, deepseek-v3, hf-deepseek-v3, hf-qwen2-moe, \
             hf-qwen3-moe, hf-mixtral, hf-gpt-oss"
        ),
        "{e}"
    );
    let mut tail = Contract::default();
    tail.set(Section::Declared, "tail", json!("ignored"), "--tail");
    let e = Route::read_contract(&tail).unwrap_err();
    assert!(
        e.starts_with("--tail: contract.route.declared.tail: op route has no such key"),
        "{e}"
    );
}

#[test]
fn errors_name_the_key_and_its_source() {
    let e = Gemm::read_contract(&greeting(json!({"supports": {"dtypes": ["fp8"]}}))).unwrap_err();
    assert!(
        e.starts_with("the worker's greeting: contract.grouped_gemm.supports.dtypes = [\"fp8\"]"),
        "{e}"
    );
    let mut flags = Contract::default();
    flags.set(Section::Declared, "tail", json!("sometimes"), "--tail");
    let e = Gemm::read_contract(&flags).unwrap_err();
    assert!(
        e.starts_with("--tail: contract.grouped_gemm.declared.tail")
            && e.ends_with("expected zero or ignored"),
        "{e}"
    );
    let e =
        Gemm::read_contract(&greeting(json!({"supports": {"scores": ["softmax"]}}))).unwrap_err();
    assert!(
        e.contains("supports.scores: op grouped_gemm has no such key (it reads dtypes, passes"),
        "{e}"
    );
    let e = Gemm::read_contract(&greeting(json!({"supports": {"k_multiple": 0}}))).unwrap_err();
    assert!(e.ends_with("expected an integer of at least 1"), "{e}");
    let e = Contract::from_greeting("route", Some(&json!({"declare": {}}))).unwrap_err();
    assert!(
        e.contains("contract.route.declare: expected \"declared\" or \"supports\""),
        "{e}"
    );
}

#[test]
fn an_external_layer_opts_into_the_newer_layer_features() {
    use moecheck_reference::moe::MoeLayer;
    let g = Contract::from_greeting(
        "moe_layer",
        Some(&json!({"supports": {"activations": ["clamped-swiglu"], "router_bias": true}})),
    )
    .unwrap();
    let (d, _) = MoeLayer::read_contract(&g).unwrap();
    let d = MoeLayer::external(d);
    assert_eq!(d.activations, Some(vec![Activation::ClampedSwiglu]));
    assert_eq!((d.router_bias, d.expert_bias), (Some(true), Some(false)));
    assert_eq!(d.shared_gate, Some(false));
    // Declared nothing: none of them; moecheck's own implementations keep the default (all).
    let (d, _) = MoeLayer::read_contract(&Contract::default()).unwrap();
    assert_eq!(d.activations, None);
    let d = MoeLayer::external(d);
    assert_eq!(d.activations, Some(vec![Activation::Swiglu]));
    // A declared Hugging Face family declares its layer: nothing of it is turned off.
    let qwen2 = Contract::from_greeting(
        "moe_layer",
        Some(&json!({"declared": {"convention": "hf-qwen2-moe"}})),
    )
    .unwrap();
    let (d, _) = MoeLayer::read_contract(&qwen2).unwrap();
    let d = MoeLayer::external(d);
    assert_eq!((d.shared_gate, d.activations.clone()), (None, None));
    let bad = Contract::from_greeting(
        "moe_layer",
        Some(&json!({"supports": {"activations": ["gelu"]}})),
    )
    .unwrap();
    assert!(MoeLayer::read_contract(&bad)
        .unwrap_err()
        .contains("activations"));
}
