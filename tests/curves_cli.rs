//! Drives the real `moecheck curves` binary: the seed's logs with a plot, JSON, exit codes
//! 0/1/3, and exit 2 with `file:line` for malformed logs and bad flags.

mod common;

use std::path::{Path, PathBuf};

use predicates::prelude::*;

use common::moecheck;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/curves")
        .join(name)
}

/// Decodes a PNG (the `png` crate's decoder checks the signature and every chunk's CRC) and
/// returns (width, height), checking it is 8-bit RGB with every pixel there.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .expect("a PNG header");
    let mut buf = vec![0; reader.output_buffer_size().expect("a size")];
    let info = reader.next_frame(&mut buf).expect("the image decodes");
    assert_eq!(info.color_type, png::ColorType::Rgb);
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    assert_eq!(info.buffer_size(), (info.width * info.height * 3) as usize);
    (info.width, info.height)
}

#[test]
fn seed_logs_give_a_verdict_a_table_and_a_png() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("gap.png");
    moecheck()
        .args(["curves", "diff"])
        .arg(fixture("native.log"))
        .arg(fixture("te.log"))
        .arg("--plot")
        .arg(&png)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("verdict: FAIL"))
        .stdout(predicate::str::contains("steps compared               13"))
        .stdout(predicate::str::contains(
            "speed-up (BASE/TEST)         1.039x",
        ));
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(png_size(&bytes), (960, 680));
}

#[test]
fn svg_plot_holds_both_curves_and_the_band() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("gap.svg");
    moecheck()
        .args(["curves", "diff"])
        .arg(fixture("native.log"))
        .arg(fixture("te.log"))
        .arg("--plot")
        .arg(&svg)
        .assert()
        .code(1);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"));
    assert!(
        text.matches("<polyline").count() >= 5,
        "frames, two curves and the gap"
    );
    assert!(text.contains("band ±δ = 0.0098"));
}

#[test]
fn json_report_has_the_verdict_and_numbers() {
    let out = moecheck()
        .args(["curves", "diff", "--json"])
        .arg(fixture("native.log"))
        .arg(fixture("te.log"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verdict"], "fail");
    assert_eq!(v["alignment"]["steps_compared"], 13);
    assert_eq!(v["margin"]["set_by"], "rel");
    assert_eq!(
        v["throughput"]["base_outlier_steps"],
        serde_json::json!([4, 7])
    );
    assert_eq!(v["base"]["format"], "maxtext-stdout");
}

#[test]
fn pass_and_inconclusive_exit_codes() {
    // A log against itself: every gap is 0.
    moecheck()
        .args(["curves", "diff"])
        .arg(fixture("native.log"))
        .arg(fixture("native.log"))
        .assert()
        .code(0)
        .stdout(predicate::str::contains("verdict: PASS"));
    // Different formats of the same curve compare too (CSV with 5 decimals vs TSV with 4): the
    // gaps are rounding only, far inside δ over 9 one-step windows: PASS.
    moecheck()
        .args(["curves", "diff"])
        .arg(fixture("loss.csv"))
        .arg(fixture("loss.tsv"))
        .assert()
        .code(0);
    // Only 3 steps: fewer windows than the criterion needs.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("short.txt");
    std::fs::write(&p, "0 5.0\n1 4.0\n2 3.0\n").unwrap();
    moecheck()
        .args(["curves", "diff"])
        .arg(&p)
        .arg(&p)
        .assert()
        .code(3)
        .stdout(predicate::str::contains("verdict: INCONCLUSIVE"))
        .stdout(predicate::str::contains(
            "suggestion: log at least 4 common steps (now 3)",
        ));
}

#[test]
fn exact_flag_compares_bitwise() {
    moecheck()
        .args(["curves", "diff", "--exact"])
        .arg(fixture("native.log"))
        .arg(fixture("te.log"))
        .assert()
        .code(1)
        .stdout(predicate::str::contains("first at step 0"));
}

#[test]
fn malformed_log_exits_2_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("broken.log");
    let good = std::fs::read_to_string(fixture("native.log")).unwrap();
    let broken = good.replacen("loss: 11.585", "loss: 11.5.85", 1);
    std::fs::write(&p, broken).unwrap();
    moecheck()
        .args(["curves", "diff"])
        .arg(fixture("native.log"))
        .arg(&p)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "broken.log:4: `loss:` value `11.5.85` is not a number",
        ))
        .stderr(predicate::function(|s: &str| s.lines().count() == 1));
}

#[test]
fn bad_flags_and_missing_files_exit_2() {
    for args in [
        vec!["--warmup", "1.5"],
        vec!["--confidence", "1"],
        vec!["--rel", "-0.1"],
        vec!["--window", "0"],
        vec!["--metric", "accuracy"],
        vec!["--format", "wandb"],
        vec!["--plot", "gap.jpg"],
    ] {
        moecheck()
            .args(["curves", "diff"])
            .arg(fixture("native.log"))
            .arg(fixture("te.log"))
            .args(&args)
            .assert()
            .code(2);
    }
    moecheck()
        .args(["curves", "diff", "/nonexistent/a.log"])
        .arg(fixture("te.log"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("/nonexistent/a.log: cannot read"));
    // A metric one log lacks.
    moecheck()
        .args(["curves", "diff", "--metric", "step_time_s"])
        .arg(fixture("trainer_state.json"))
        .arg(fixture("trainer_state.json"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no step_time_s values"));
}

#[test]
fn read_reports_every_format() {
    for (name, format) in [
        ("native.log", "maxtext-stdout"),
        ("maxtext_metrics.jsonl", "maxtext-jsonl"),
        ("megatron.log", "megatron-stdout"),
        ("megatron_golden.json", "megatron-golden"),
        ("megatron_bridge_golden.json", "megatron-bridge-golden"),
        ("nanogpt.txt", "nanogpt"),
        ("torchtitan.log", "torchtitan-stdout"),
        ("trainer_state.json", "hf-trainer-state"),
        ("loss.csv", "plain"),
        ("tensorboard/tensor_float.tfevents", "tensorboard"),
    ] {
        let out = moecheck()
            .args(["curves", "read", "--json"])
            .arg(fixture(name))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{name}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["format"], format, "{name}");
        assert_eq!(v["metrics"][0]["metric"], "loss", "{name}");
    }
}

/// Issue 16, item 15: `curves read` printed the file's header line and then refused it (a
/// log with no metric, or a malformed one): on an error stdout stays empty and the exit
/// status is 2, with the reason on stderr.
#[test]
fn read_prints_nothing_before_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let quiet = dir.path().join("quiet.log");
    std::fs::write(&quiet, "loading checkpoint\nnothing logged yet\n").unwrap();
    let golden = dir.path().join("golden.json");
    std::fs::write(
        &golden,
        "{\"lm loss\": {\"start_step\": 0, \"step_interval\": -1, \"values\": [10.0, 9.0]}}\n",
    )
    .unwrap();
    let empty = dir.path().join("empty.log");
    std::fs::write(&empty, "").unwrap();
    for (log, format, reason) in [
        (&quiet, Some("maxtext-stdout"), "quiet.log: no metric found"),
        (
            &golden,
            None,
            "golden.json:1: \"lm loss\": \"step_interval\" is -1",
        ),
        (&empty, None, "empty.log: empty file"),
    ] {
        for json in [false, true] {
            let mut cmd = moecheck();
            cmd.args(["curves", "read"]).arg(log);
            if let Some(f) = format {
                cmd.args(["--format", f]);
            }
            if json {
                cmd.arg("--json");
            }
            cmd.assert()
                .code(2)
                .stdout(predicate::str::is_empty())
                .stderr(predicate::str::contains(reason));
        }
    }
    // The same refusals in `diff`.
    moecheck()
        .args(["curves", "diff"])
        .arg(&golden)
        .arg(&golden)
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("\"step_interval\" is -1"));
}

/// Issue 16, item 17: a TensorBoard file whose last record is cut short (a live or crashed
/// run) is read up to it; stderr warns, naming the file and the record's byte offset.
#[test]
fn a_truncated_tensorboard_file_is_read_with_a_warning() {
    let good = std::fs::read(fixture("tensorboard/simple.tfevents")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("events.out.tfevents.live");
    std::fs::write(&p, &good[..good.len() - 3]).unwrap();
    let out = moecheck()
        .args(["curves", "read", "--json"])
        .arg(&p)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!("warning: {}: the last record (", p.display()))
            && stderr.contains("at byte ")
            && stderr.contains("is truncated"),
        "{stderr}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["format"], "tensorboard");
    // diff warns too, and its report carries the warning as a note.
    let out = moecheck()
        .args(["curves", "diff", "--json"])
        .arg(fixture("tensorboard/simple.tfevents"))
        .arg(&p)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("is truncated"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let notes = v["notes"].as_array().unwrap();
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().unwrap().starts_with("TEST: the last record")),
        "{notes:?}"
    );
}

/// Issue 15: Megatron-Bridge golden values and nanoGPT logs are read without options.
#[test]
fn megatron_bridge_golden_values_diff_without_options() {
    let base = fixture("megatron_bridge_golden.json");
    moecheck()
        .args(["curves", "diff"])
        .arg(&base)
        .arg(&base)
        .assert()
        .code(0)
        .stdout(predicate::str::contains("verdict: PASS"));
    // The FP8 run: every loss after step 2 is 0.025 higher (0.5% of the mean), 4% faster.
    let out = moecheck()
        .args(["curves", "diff", "--json"])
        .arg(&base)
        .arg(fixture("megatron_bridge_golden_fp8.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verdict"], "fail");
    assert_eq!(v["base"]["format"], "megatron-bridge-golden");
    assert_eq!(v["alignment"]["steps_compared"], 36);
    assert!(
        (v["gap"]["mean"].as_f64().unwrap() - 0.025).abs() < 1e-5,
        "{}",
        v["gap"]
    );
    let speedup = v["throughput"]["speedup"].as_f64().unwrap();
    assert!((speedup - 1.0 / 0.96).abs() < 0.005, "{speedup}");
}

#[test]
fn nanogpt_logs_diff_without_options() {
    let base = fixture("nanogpt.txt");
    moecheck()
        .args(["curves", "diff"])
        .arg(&base)
        .arg(&base)
        .assert()
        .code(0)
        .stdout(predicate::str::contains("metric: loss"))
        .stdout(predicate::str::contains("steps compared               54"))
        .stdout(predicate::str::contains("verdict: PASS"));
    // val_loss, every 10 steps, through --metric.
    moecheck()
        .args(["curves", "diff", "--metric", "val_loss"])
        .arg(&base)
        .arg(&base)
        .assert()
        .code(0)
        .stdout(predicate::str::contains("metric: val_loss"))
        .stdout(predicate::str::contains("steps compared               6 ("))
        .stdout(predicate::str::contains("verdict: PASS"));
    // A run whose late training losses are 0.1 higher.
    let dir = tempfile::tempdir().unwrap();
    let test = dir.path().join("worse.txt");
    let text = std::fs::read_to_string(&base).unwrap();
    std::fs::write(&test, text.replace("train_loss:3.3", "train_loss:3.4")).unwrap();
    moecheck()
        .args(["curves", "diff"])
        .arg(&base)
        .arg(&test)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("verdict: FAIL"));
}

const TRAINER_PATTERN: &str = r"\| it\s+(?P<step>\d+)/\d+ \| loss=(?P<value>\S+)";

/// Issue 15: `--pattern REGEX` reads a log no reader knows, in `diff` and `read`.
#[test]
fn a_pattern_reads_a_log_no_reader_knows() {
    let log = fixture("custom_trainer.log");
    moecheck()
        .args(["curves", "diff"])
        .arg(&log)
        .arg(&log)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("format not recognised"));
    let out = moecheck()
        .args(["curves", "diff", "--json", "--pattern", TRAINER_PATTERN])
        .arg(&log)
        .arg(&log)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verdict"], "pass");
    assert_eq!(v["base"]["format"], "pattern");
    assert_eq!(v["alignment"]["steps_compared"], 43);
    // A pattern's values compared with a detected log's: each log is read the same way, so
    // the nanoGPT log is read with the pattern too, and matches nothing.
    moecheck()
        .args(["curves", "diff", "--pattern", TRAINER_PATTERN])
        .arg(&log)
        .arg(fixture("nanogpt.txt"))
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains(
            "nanogpt.txt: no line matched the pattern (--pattern `",
        ));
    // `read`, with --metric naming the values.
    let out = moecheck()
        .args(["curves", "read", "--json", "--metric", "tokens_per_s"])
        .args(["--pattern", r"it\s+(?P<step>\d+)/.*tok/s=(?P<value>[\d,]+)"])
        .arg(&log)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["format"], "pattern");
    assert_eq!(v["metrics"][0]["metric"], "tokens_per_s");
    assert_eq!(v["metrics"][0]["samples"], 48);
    assert_eq!(v["metrics"][0]["first_value"], 61080.0);
}

#[test]
fn a_bad_pattern_exits_2_with_one_line_naming_pattern() {
    let log = fixture("custom_trainer.log");
    for (pattern, reason) in [
        (r"it (\d+) loss=(\S+)", "it has no `step` and no `value`"),
        (r"it (?P<step>\d+) loss=(\S+)", "it has no `value`"),
        (
            r"it (?P<step>\d+ loss=(?P<value>\S+)",
            "does not compile: unclosed group",
        ),
    ] {
        for cmd in ["diff", "read"] {
            let mut c = moecheck();
            c.args(["curves", cmd, "--pattern", pattern]).arg(&log);
            if cmd == "diff" {
                c.arg(&log);
            }
            c.assert()
                .code(2)
                .stdout(predicate::str::is_empty())
                .stderr(predicate::str::contains(format!("--pattern `{pattern}`: ")))
                .stderr(predicate::str::contains(reason))
                .stderr(predicate::function(|s: &str| s.lines().count() == 1));
        }
    }
    // A matched line whose value is not a number names the file and line.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("run.log");
    let text = std::fs::read_to_string(&log).unwrap();
    std::fs::write(&p, text.replacen("loss=9.80127", "loss=9.8o127", 1)).unwrap();
    moecheck()
        .args(["curves", "diff", "--pattern", TRAINER_PATTERN])
        .arg(&log)
        .arg(&p)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "run.log:5: --pattern group `value` captured `9.8o127`, not a number",
        ));
    // --pattern replaces --format; --metric on `read` only names a pattern's values.
    moecheck()
        .args([
            "curves",
            "diff",
            "--format",
            "plain",
            "--pattern",
            TRAINER_PATTERN,
        ])
        .arg(&log)
        .arg(&log)
        .assert()
        .code(2);
    moecheck()
        .args(["curves", "read", "--metric", "loss"])
        .arg(&log)
        .assert()
        .code(2);
}
