//! Drives the real `moecheck curves diff` with several baseline seeds and with diverging
//! windows (issue 41): `--baseline2` repeated, the JSON keys `sigma_seed` and
//! `diverging_windows`, the plot's marked windows, and exit 2 naming a missing baseline file.

use std::path::{Path, PathBuf};

use assert_cmd::Command;

fn moecheck() -> Command {
    Command::cargo_bin("moecheck").expect("binary built")
}

fn log(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/curves/train")
        .join(name)
}

fn json(args: &[PathBuf], code: i32) -> serde_json::Value {
    let out = moecheck()
        .args(["curves", "diff", "--json"])
        .args(args)
        .assert()
        .code(code)
        .get_output()
        .stdout
        .clone();
    serde_json::from_slice(&out).unwrap()
}

/// Two runs of the same code with two baseline seeds: PASS, σ_seed from all three reference
/// runs with its interval and degrees of freedom, one input summary per baseline.
#[test]
fn baseline2_repeats_and_sigma_seed_has_its_interval_and_dof() {
    let b2 = PathBuf::from("--baseline2");
    let v = json(
        &[
            log("seed_00.log"),
            log("seed_01.log"),
            b2.clone(),
            log("seed_02.log"),
            b2,
            log("seed_03.log"),
        ],
        0,
    );
    assert_eq!(v["verdict"], "pass", "{v}");
    assert_eq!(v["baseline2"].as_array().unwrap().len(), 2);
    let s = &v["sigma_seed"];
    let (value, dof) = (s["value"].as_f64().unwrap(), s["dof"].as_f64().unwrap());
    let [lo, hi] = [0, 1].map(|i| s["interval"][i].as_f64().unwrap());
    assert!(lo < value && value < hi, "{s}");
    assert_eq!(s["baselines"], 2);
    // Two baselines: at least 2 degrees of freedom, at most 2 per window.
    let windows = s["windows"].as_f64().unwrap();
    assert!((2.0..=2.0 * windows).contains(&dof), "{s}");
    assert_eq!(v["diverging_windows"], serde_json::json!([]));
    let m = &v["margin"];
    assert!(m["delta_fail"].as_f64().unwrap() >= m["delta"].as_f64().unwrap());
}

/// Another learning rate: FAIL, the diverging windows in the JSON with their steps, gap and
/// interval, the steps in the table's reason, and the windows shaded in the SVG plot.
#[test]
fn diverging_windows_are_named_in_json_text_and_plot() {
    let (base, test) = (log("seed_00.log"), log("lr_0.03.log"));
    let v = json(
        &[
            base.clone(),
            test.clone(),
            "--baseline2".into(),
            log("seed_01.log"),
        ],
        1,
    );
    let w = &v["diverging_windows"][0];
    assert_eq!(w["steps"], serde_json::json!([20, 37]), "{v}");
    let gap = w["gap"].as_f64().unwrap();
    let [lo, hi] = [0, 1].map(|i| w["interval"][i].as_f64().unwrap());
    assert!(lo < gap && gap < hi && lo > v["margin"]["delta_fail"].as_f64().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("gap.svg");
    let out = moecheck()
        .args(["curves", "diff"])
        .args([&base, &test])
        .arg("--plot")
        .arg(&svg)
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("steps 20–"), "{text}");
    assert!(text.contains("diverging window"), "{text}");
    let plot = std::fs::read_to_string(&svg).unwrap();
    // The diverging colour (PALETTE[Diverging]), once per window and panel, and the caption.
    assert!(plot.matches("#fad4d4").count() >= 2, "no shaded window");
    assert!(plot.contains("red: diverging windows"));
}

#[test]
fn a_missing_baseline_exits_2_naming_it() {
    let missing = Path::new("/nonexistent/seed_99.log");
    let out = moecheck()
        .args(["curves", "diff"])
        .arg(log("seed_00.log"))
        .arg(log("seed_01.log"))
        .args(["--baseline2"])
        .arg(log("seed_02.log"))
        .args(["--baseline2"])
        .arg(missing)
        .assert()
        .code(2)
        .get_output()
        .stderr
        .clone();
    let err = String::from_utf8_lossy(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("seed_99.log"), "{err}");
}
