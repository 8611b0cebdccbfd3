//! The Hugging Face family presets (`--convention hf-deepseek-v3|hf-qwen2-moe|hf-qwen3-moe|
//! hf-mixtral`): what each resolves to in `route` and `moe` (score, norm_topk_prob, sigmoid
//! normalisation, ties, slot order, the shared expert's gate, the router's format), and that
//! explicit flags override them.

mod common;

use assert_cmd::Command;

fn moecheck() -> Command {
    common::moecheck()
}

/// `route --json` under `args`: the resolved routing configuration.
fn route_config(args: &[&str]) -> serde_json::Value {
    let route = [
        "route",
        "--tokens",
        "16",
        "--experts",
        "8",
        "--topk",
        "2",
        "--json",
    ];
    common::json_ok(moecheck().args(route).args(args))["config"].clone()
}

/// `moe --json` on the small layer under `args`: the report.
fn moe_json(args: &[&str]) -> serde_json::Value {
    common::json_ok(
        moecheck()
            .arg("moe")
            .args(common::SMALL_MOE)
            .args(args)
            .arg("--json"),
    )
}

#[test]
fn each_family_resolves_to_its_upstream_router() {
    // (preset, score, norm_topk, sigmoid_norm, slot_order)
    let want = [
        ("hf-deepseek-v3", "sigmoid", true, "always", "any"),
        ("hf-qwen2-moe", "softmax", false, "always", "score"),
        ("hf-qwen3-moe", "softmax", false, "always", "score"),
        ("hf-mixtral", "softmax", true, "always", "score"),
        ("hf-gpt-oss", "topk-softmax", false, "always", "score"),
    ];
    for (preset, score, norm, sigmoid_norm, slots) in want {
        let c = route_config(&["--convention", preset]);
        assert_eq!(c["score"], score, "{preset}: {c}");
        assert_eq!(c["norm_topk"], norm, "{preset}: {c}");
        assert_eq!(c["sigmoid_norm"], sigmoid_norm, "{preset}: {c}");
        assert_eq!(c["ties"], "any", "{preset}: {c}");
        assert_eq!(c["slot_order"], slots, "{preset}: {c}");
        assert_eq!(c["group_score"], "top2", "{preset}: {c}");
    }
    // The other conventions set no score: route still needs one.
    let out = moecheck()
        .args(["route", "--tokens", "4", "--experts", "4", "--topk", "2"])
        .args(["--convention", "deepseek-v3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--score"));
}

#[test]
fn hf_deepseek_v3_ties_sigmoid_normalisation_to_norm_topk_prob() {
    let c = route_config(&["--convention", "hf-deepseek-v3", "--no-norm-topk"]);
    assert_eq!(
        (c["norm_topk"].clone(), c["sigmoid_norm"].clone()),
        (false.into(), "never".into())
    );
    // Explicit flags override the preset.
    let c = route_config(&[
        "--convention",
        "hf-deepseek-v3",
        "--no-norm-topk",
        "--sigmoid-norm",
        "always",
        "--slot-order",
        "score",
        "--score",
        "softmax",
    ]);
    assert_eq!(c["sigmoid_norm"], "always");
    assert_eq!(c["slot_order"], "score");
    assert_eq!(c["score"], "softmax");
    let c = route_config(&["--convention", "hf-qwen3-moe", "--norm-topk"]);
    assert_eq!(c["norm_topk"], true);
}

#[test]
fn the_moe_presets_set_the_layer() {
    let doc = moe_json(&["--convention", "hf-qwen2-moe", "--shared-ffn", "4"]);
    assert_eq!(doc["shape"]["shared_gate"], true, "{doc}");
    let names: Vec<&str> = doc["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tensor"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"dshared_gate"), "{names:?}");
    // Qwen2-MoE always has a shared expert: without its width the preset is refused.
    let out = moecheck()
        .args(["moe", "--convention", "hf-qwen2-moe"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--shared-ffn"));
    // An f64 module of a Hugging Face family: the router is declared f32 (JAX's f64 layer
    // passes the looser router bound too).
    let doc = moe_json(&[
        "--convention",
        "hf-mixtral",
        "--impl",
        "exec:python3 examples/adapters/jax_moe_layer.py --f64",
        "--compute",
        "f64",
        "--out-dtype",
        "f64",
    ]);
    assert_eq!(doc["precision"]["router"], "f32", "{doc}");
}

/// What a family's module cannot be is refused, naming the flag; what it may be is
/// overridable.
#[test]
fn a_preset_refuses_what_its_module_cannot_be() {
    for (args, needle) in [
        (
            vec!["--convention", "hf-mixtral", "--no-norm-topk"],
            "--no-norm-topk",
        ),
        (vec!["--convention", "hf-deepseek-v3"], "--shared-ffn"),
    ] {
        let out = moecheck().arg("moe").args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(needle),
            "{args:?}"
        );
    }
    let doc = moe_json(&["--convention", "hf-gpt-oss", "--no-expert-bias"]);
    assert_eq!(doc["shape"]["expert_bias"], false);
    assert_eq!(doc["shape"]["router_bias"], true);
}
