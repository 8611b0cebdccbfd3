//! Routing conventions from the command line: each flag value, the presets, what case.json
//! carries, and a Megatron-style router (examples/adapters/numpy_megatron_route.py: group
//! score top `topk/topk_groups`, higher-index ties, no sigmoid normalisation at K = 1,
//! Megatron's position policy) that passes under `--convention megatron` and fails under the
//! default MaxText conventions, each failure saying which convention to declare.

mod common;

use common::moecheck;

const MEGATRON: &str = "worker:python3 examples/adapters/numpy_megatron_route.py";

/// `moecheck route` on generated logits with `args`, its exit code and stdout.
fn route(args: &[&str]) -> (i32, String) {
    let out = moecheck()
        .args(["route", "--tokens", "128", "--seed", "3"])
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// DeepSeek-V3-like groups where Megatron's group score (the top 6/2 = 3) keeps other groups
/// than the top-2 sum.
const GROUPED: [&str; 10] = [
    "--topk",
    "6",
    "--score",
    "sigmoid",
    "--experts",
    "64",
    "--groups",
    "8",
    "--topk-groups",
    "2",
];
const K1_SIGMOID: [&str; 6] = ["--topk", "1", "--score", "sigmoid", "--experts", "8"];
const POSITION: [&str; 10] = [
    "--topk",
    "2",
    "--score",
    "softmax",
    "--experts",
    "16",
    "--capacity-factor",
    "1",
    "--drop-policy",
    "position",
];

#[test]
fn a_megatron_router_passes_under_its_convention_and_fails_under_maxtext() {
    for (name, case) in [
        ("groups", &GROUPED[..]),
        ("k1", &K1_SIGMOID[..]),
        ("position", &POSITION[..]),
    ] {
        let (code, text) =
            route(&[case, &["--convention", "megatron", "--impl", MEGATRON]].concat());
        assert_eq!(code, 0, "{name} under megatron:\n{text}");
        assert!(text.contains("verdict: PASS"), "{name}:\n{text}");
        let (code, text) = route(&[case, &["--impl", MEGATRON]].concat());
        // MaxText's per-sequence position policy is refused (not applicable: exit 2), the
        // other conventions fail.
        let want = if name == "position" { 2 } else { 1 };
        assert_eq!(code, want, "{name} under maxtext:\n{text}");
        let hint = match name {
            "groups" => "--group-score",
            "k1" => "--sigmoid-norm",
            _ => "Megatron's policies are probs and token-order",
        };
        assert!(
            text.contains(hint),
            "{name} under maxtext names {hint}:\n{text}"
        );
    }
}

/// Each Megatron convention alone: the router passes once all three of its conventions are
/// declared and fails when any one of them is MaxText's.
#[test]
fn each_megatron_convention_is_needed() {
    let all = [
        "--group-score",
        "top-k-per-group",
        "--ties",
        "any",
        "--impl",
        MEGATRON,
    ];
    let (code, text) = route(&[&GROUPED[..], &all].concat());
    assert_eq!(code, 0, "{text}");
    for (flag, maxtext) in [("--group-score", "top2"), ("--ties", "lower-index")] {
        let mut args = all.to_vec();
        let i = args.iter().position(|a| *a == flag).unwrap();
        args[i + 1] = maxtext;
        let (code, text) = route(&[&GROUPED[..], &args].concat());
        assert_eq!(code, 1, "{flag} {maxtext}:\n{text}");
    }
    // The preset with one convention overridden back to MaxText's fails.
    let (code, _) = route(
        &[
            &GROUPED[..],
            &[
                "--convention",
                "megatron",
                "--ties",
                "lower-index",
                "--impl",
                MEGATRON,
            ],
        ]
        .concat(),
    );
    assert_eq!(code, 1);
    let (code, text) = route(
        &[
            &K1_SIGMOID[..],
            &["--sigmoid-norm", "skip-k1", "--impl", MEGATRON],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{text}");
    let (code, _) = route(
        &[
            &K1_SIGMOID[..],
            &["--sigmoid-norm", "always", "--impl", MEGATRON],
        ]
        .concat(),
    );
    assert_eq!(code, 1);
    // Megatron's position is token-order; its ties among an expert's tokens need `any`.
    let token_order = [&POSITION[..POSITION.len() - 1], &["token-order"]].concat();
    let (code, text) = route(&[&token_order[..], &["--ties", "any", "--impl", MEGATRON]].concat());
    assert_eq!(code, 0, "{text}");
    let (code, text) = route(&[&token_order[..], &["--impl", MEGATRON]].concat());
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("token-order keeps an expert's lowest token indices"),
        "{text}"
    );
}

/// A router breaking exact ties toward the higher index (the emulation's planted bug) fails
/// by default, naming the tie, and passes under `--ties any`; a real bug still fails there.
#[test]
fn ties_any_accepts_the_higher_index_and_nothing_wrong() {
    let base = [
        "--topk",
        "2",
        "--score",
        "softmax",
        "--experts",
        "16",
        "--impl",
        "emulate",
    ];
    let (code, text) = route(&[&base[..], &["--inject", "tie-toward-higher-index"]].concat());
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("exact tie") && text.contains("--ties any accepts either"),
        "{text}"
    );
    let (code, text) = route(
        &[
            &base[..],
            &["--inject", "tie-toward-higher-index", "--ties", "any"],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{text}");
    for bug in ["renormalise-survivors", "capacity-off-by-one"] {
        let (code, text) = route(
            &[
                &base[..],
                &[
                    "--inject",
                    bug,
                    "--ties",
                    "any",
                    "--capacity-factor",
                    "1",
                    "--drop-policy",
                    "probs",
                ],
            ]
            .concat(),
        );
        assert_eq!(code, 1, "{bug} under --ties any:\n{text}");
    }
}

/// The resolved conventions are in the text, the `--json` config and the dumped case.json;
/// `--group-score max` and `--convention deepseek-v3` change what is checked.
#[test]
fn conventions_are_reported_and_dumped() {
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("case");
    let (code, text) = route(
        &[
            &GROUPED[..],
            &[
                "--convention",
                "megatron",
                "--drop-policy",
                "position",
                "--capacity-factor",
                "1.5",
            ],
            &["--dump", dump.to_str().unwrap()],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("scored by top-k-per-group") && text.contains("ties any"),
        "{text}"
    );
    assert!(text.contains("token-order policy"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dump.join("case.json")).unwrap()).unwrap();
    assert_eq!(json["group_score"], "top-k-per-group");
    assert_eq!(json["sigmoid_norm"], "skip-k1");
    assert_eq!(json["ties"], "any");
    assert_eq!(json["drop_policy"], "token-order");
    let out = moecheck()
        .args([
            "route",
            "--tokens",
            "16",
            "--json",
            "--convention",
            "deepseek-v3",
        ])
        .args(GROUPED)
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["config"]["group_score"], "top2");
    assert_eq!(doc["config"]["ties"], "any");
    assert_eq!(doc["config"]["sigmoid_norm"], "always");
    // The group score decides the reference: max and top2 route these logits differently.
    let max = moecheck()
        .args(["route", "--tokens", "64", "--json", "--group-score", "max"])
        .args(GROUPED)
        .output()
        .unwrap();
    let top2 = moecheck()
        .args(["route", "--tokens", "64", "--json"])
        .args(GROUPED)
        .output()
        .unwrap();
    let sizes = |o: &std::process::Output| {
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["group_sizes"].clone()
    };
    assert_ne!(sizes(&max), sizes(&top2));
}

/// A case.json without the convention fields (written before they existed) reads with
/// MaxText's; an unknown value is exit 2 naming case.json.
#[test]
fn case_json_conventions_default_and_bad_values_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("case");
    let (code, text) = route(
        &[
            &K1_SIGMOID[..],
            &["--dump", case.to_str().unwrap(), "--impl", "reference"],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{text}");
    let path = case.join("case.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for field in ["group_score", "sigmoid_norm", "ties"] {
        json.as_object_mut().unwrap().remove(field);
    }
    std::fs::write(&path, json.to_string()).unwrap();
    let out = moecheck()
        .args(["check", case.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json["group_score"] = "top3".into();
    std::fs::write(&path, json.to_string()).unwrap();
    let out = moecheck()
        .args(["check", case.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("case.json") && err.lines().count() == 1,
        "{err}"
    );
}

#[test]
fn bad_convention_flags_exit_2() {
    for args in [
        &[
            "--topk",
            "2",
            "--score",
            "softmax",
            "--convention",
            "mixtral",
        ][..],
        &["--topk", "2", "--score", "softmax", "--ties", "random"],
        &[
            "--topk",
            "1",
            "--score",
            "softmax",
            "--experts",
            "8",
            "--groups",
            "4",
            "--topk-groups",
            "2",
            "--group-score",
            "top-k-per-group",
        ],
        &[
            "--topk",
            "1",
            "--score",
            "softmax",
            "--capacity-factor",
            "1",
            "--drop-policy",
            "probs",
            "--seq-len",
            "8",
        ],
    ] {
        let (code, text) = route(args);
        assert_eq!(code, 2, "{args:?}:\n{text}");
        assert_eq!(text.trim().lines().count(), 1, "{args:?}:\n{text}");
    }
}

/// The layer's outputs do not say which of an expert's tokens `token-order` kept, so `moe`
/// refuses `--ties any` with it (exit 2 naming `--ties`) and checks it under `lower-index`;
/// the other Megatron conventions change the layer's reference.
#[test]
fn moe_takes_the_conventions_and_refuses_what_it_cannot_follow() {
    let moe = |extra: &[&str]| {
        moecheck()
            .args([
                "moe",
                "--tokens",
                "16",
                "--experts",
                "4",
                "--hidden",
                "8",
                "--ffn",
                "8",
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    let megatron_position = [
        "--convention",
        "megatron",
        "--capacity-factor",
        "1",
        "--drop-policy",
        "position",
    ];
    let out = moe(&megatron_position);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--ties") && err.trim().lines().count() == 1,
        "{err}"
    );
    let out = moe(&[
        &megatron_position[..],
        &["--ties", "lower-index", "--impl", "emulate"],
    ]
    .concat());
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Sigmoid at K = 1: the layer's reference follows --sigmoid-norm. Outputs checked under
    // skip-k1 fail once the dumped case.json says always.
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("case");
    let k1 = [
        "--topk",
        "1",
        "--score",
        "sigmoid",
        "--sigmoid-norm",
        "skip-k1",
        "--impl",
        "reference",
    ];
    let out = moe(&[&k1[..], &["--dump", case.to_str().unwrap()]].concat());
    assert_eq!(out.status.code(), Some(0));
    let check = || {
        moecheck()
            .args(["check", case.to_str().unwrap()])
            .output()
            .unwrap()
    };
    assert_eq!(check().status.code(), Some(0));
    let path = case.join("case.json");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"skip-k1\""), "{text}");
    std::fs::write(&path, text.replace("\"skip-k1\"", "\"always\"")).unwrap();
    let out = check();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Hugging Face DeepSeek-V3's router without `norm_topk_prob`: `--sigmoid-norm never` and
/// `--slot-order any` are recorded in case.json and the report; the model passes under
/// `never` and its planted `normalise-sigmoid-despite-never` fails there; `--no-norm-topk`
/// turns off an earlier `--norm-topk`; `--slot-order any` with the position drop policy
/// exits 2 naming the flag.
#[test]
fn sigmoid_norm_never_and_slot_order_any_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("case");
    let hf = [
        "--sigmoid-norm",
        "never",
        "--slot-order",
        "any",
        "--scaling-factor",
        "2.5",
    ];
    let (code, text) = route(
        &[
            &GROUPED[..],
            &hf[..],
            &["--impl", "emulate", "--dump", dump.to_str().unwrap()],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dump.join("case.json")).unwrap()).unwrap();
    assert_eq!(json["sigmoid_norm"], "never");
    assert_eq!(json["slot_order"], "any");
    let (code, text) = route(
        &[
            &GROUPED[..],
            &hf[..],
            &[
                "--impl",
                "emulate",
                "--inject",
                "normalise-sigmoid-despite-never",
            ],
        ]
        .concat(),
    );
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("--sigmoid-norm"), "{text}");
    // --no-norm-topk after --norm-topk: softmax weights are not normalised.
    let weights = |extra: &[&str]| {
        let out = moecheck()
            .args([
                "route", "--tokens", "4", "--topk", "2", "--score", "softmax",
            ])
            .args(["--experts", "8", "--json"])
            .args(extra)
            .output()
            .unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        doc["config"]["norm_topk"].clone()
    };
    assert_eq!(weights(&["--norm-topk"]), true);
    assert_eq!(weights(&["--norm-topk", "--no-norm-topk"]), false);
    let (code, text) = route(&[&POSITION[..], &["--slot-order", "any"]].concat());
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--slot-order"), "{text}");
}
