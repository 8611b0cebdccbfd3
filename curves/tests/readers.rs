//! Every log reader on a realistic sample of its format (fixtures/curves/, written by hand in
//! the documented line formats; the TensorBoard files by tensorboardX through
//! fixtures/curves/gen_tensorboard.py) and on malformed input, which must name the line.

use std::path::{Path, PathBuf};

use moecheck_curves::{
    read, read_pattern, CurveError, LinePattern, LogFormat, Metric, ReadWarning,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/curves")
        .join(name)
}

/// Reads a fixture (format detected) and returns `(format, loss steps, loss values, precision)`.
fn loss_of(name: &str) -> (LogFormat, Vec<u64>, Vec<f64>, f64) {
    let c = read(&fixture(name), None).unwrap_or_else(|e| panic!("{name}: {e}"));
    let s = &c.metrics[&Metric::Loss];
    (
        c.format,
        s.iter().map(|x| x.step).collect(),
        s.iter().map(|x| x.value).collect(),
        c.precision(Metric::Loss),
    )
}

#[test]
fn seed_maxtext_logs_parse_with_every_metric() {
    for (name, first, last) in [("native.log", 12.269, 8.270), ("te.log", 12.271, 8.085)] {
        let c = read(&fixture(name), None).unwrap();
        assert_eq!(c.format, LogFormat::MaxtextStdout);
        assert_eq!(
            c.metrics_found(),
            ["loss", "step_time_s", "tokens_per_s", "tflops"]
        );
        let loss = &c.metrics[&Metric::Loss];
        assert_eq!(loss.len(), 15);
        assert_eq!((loss[0].value, loss[14].value), (first, last));
        assert_eq!(c.precision(Metric::Loss), 1e-3);
    }
    let native = read(&fixture("native.log"), None).unwrap();
    assert_eq!(native.metrics[&Metric::StepTimeS][7].value, 10.892);
    assert_eq!(native.metrics[&Metric::Tflops][2].value, 180.994);
}

#[test]
fn maxtext_stdout_with_a_logging_prefix_skips_other_lines() {
    let (f, steps, loss, p) = loss_of("maxtext_prefixed.log");
    assert_eq!(f, LogFormat::MaxtextStdout);
    assert_eq!(steps, (0..12).collect::<Vec<_>>());
    assert_eq!(loss[0], 10.5);
    assert_eq!(p, 1e-3);
    // The eval line (`eval metrics after step: 5, loss=...`) is not a training loss.
    assert!(!loss.contains(&4.321));
}

#[test]
fn maxtext_metrics_jsonl() {
    let c = read(&fixture("maxtext_metrics.jsonl"), None).unwrap();
    assert_eq!(c.format, LogFormat::MaxtextJsonl);
    let loss = &c.metrics[&Metric::Loss];
    assert_eq!(loss.len(), 10);
    assert_eq!((loss[0].step, loss[0].value), (0, 10.5));
    assert_eq!(c.metrics[&Metric::StepTimeS][3].value, 1.843);
    // f32 on device: the quantum is the f32 spacing, not a decimal.
    assert!(c.precision(Metric::Loss) > 0.0 && c.precision(Metric::Loss) < 1e-5);
    // perf/per_device_tflops_per_sec wins over the older perf/per_device_tflops.
    assert!((c.metrics[&Metric::Tflops][0].value - 120.0 / 1.84).abs() < 1e-9);
}

#[test]
fn megatron_stdout_with_rank_prefix_skips_validation_lines() {
    let c = read(&fixture("megatron.log"), None).unwrap();
    assert_eq!(c.format, LogFormat::MegatronStdout);
    let loss = &c.metrics[&Metric::Loss];
    assert_eq!(
        loss.iter().map(|s| s.step).collect::<Vec<_>>(),
        (1..=10).collect::<Vec<_>>()
    );
    assert_eq!(loss[0].value, 1.010841e1);
    // `{:.6E}`: quantum 1e-5 for `1.010841E+01`, 1e-6 for the nine losses below 10; the log's
    // precision is the median.
    assert!((loss[0].quantum - 1e-5).abs() < 1e-18);
    assert!((c.precision(Metric::Loss) - 1e-6).abs() < 1e-19);
    // ms converted to s.
    assert!((c.metrics[&Metric::StepTimeS][0].value - 13.4785).abs() < 1e-12);
    assert_eq!(c.metrics[&Metric::Tflops][0].value, 201.5);
}

#[test]
fn megatron_golden_values_in_both_layouts() {
    let (f, steps, loss, _) = loss_of("megatron_golden.json");
    assert_eq!(f, LogFormat::MegatronGolden);
    assert_eq!(steps, (1..=10).collect::<Vec<_>>());
    assert_eq!(loss[0], 10.8);
    let c = read(&fixture("megatron_golden.json"), None).unwrap();
    assert!(
        c.metrics[&Metric::StepTimeS][0].value.is_nan(),
        "\"nan\" strings are NaN"
    );
    let (f, steps, loss, _) = loss_of("megatron_golden_list.json");
    assert_eq!(f, LogFormat::MegatronGolden);
    assert_eq!(steps, (0..10).map(|i| 5 * i).collect::<Vec<_>>());
    assert_eq!(loss[9], 9.7);
}

/// Megatron-Bridge's golden values are keyed by step (`{"1": {"lm loss": ...}, ...}`) with
/// run-wide figures beside the steps (`alloc`, `max_alloc`). See: issue 15.
#[test]
fn megatron_bridge_golden_values_keyed_by_step() {
    let c = read(&fixture("megatron_bridge_golden.json"), None).unwrap();
    assert_eq!(c.format, LogFormat::MegatronBridgeGolden);
    assert_eq!(c.metrics_found(), ["loss", "step_time_s", "tflops"]);
    let loss = &c.metrics[&Metric::Loss];
    // Sorted by step as a number ("10" after "9"), `alloc` and `max_alloc` not read.
    assert_eq!(
        loss.iter().map(|s| s.step).collect::<Vec<_>>(),
        (1..=40).collect::<Vec<_>>()
    );
    assert_eq!(loss[0].value, 10.327713012695312);
    assert_eq!(loss[39].value, 3.3641655445098877);
    // Line of the step's key: `"2": {` is line 7 of the pretty-printed file.
    assert_eq!(loss[1].line, 7);
    // JSON floats: the f32 spacing (2^-20 near 10).
    assert_eq!(loss[0].quantum, 2f64.powi(-20));
    // ms converted to s; "GPU utilization" is TFLOP/s per GPU.
    assert!((c.metrics[&Metric::StepTimeS][0].value - 9.3124).abs() < 1e-12);
    assert_eq!(c.metrics[&Metric::Tflops][1].value, 411.9);
    for m in c.metrics.values() {
        assert!(m
            .iter()
            .all(|s| s.value != 51234.5625 && s.value != 61877.0));
    }
    // The older layout keeps its own reader.
    let old = read(&fixture("megatron_golden.json"), None).unwrap();
    assert_eq!(old.format, LogFormat::MegatronGolden);
}

#[test]
fn megatron_bridge_golden_values_refuse_bad_steps_and_values() {
    let ok = "{\n  \"1\": {\"lm loss\": 10.5},\n  \"2\": {\"lm loss\": NaN},\n  \"alloc\": 3.0,\n";
    // Python's bare NaN is a NaN sample; a string that is not a number is refused.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("golden_values_dev.json");
    std::fs::write(&p, format!("{ok}  \"3\": {{\"lm loss\": 10.4}}\n}}\n")).unwrap();
    let c = read(&p, None).unwrap();
    assert_eq!(c.format, LogFormat::MegatronBridgeGolden);
    let loss = &c.metrics[&Metric::Loss];
    assert!(loss[1].value.is_nan() && loss[1].step == 2);
    assert_eq!((loss[2].step, loss[2].line), (3, 5));
    for (name, last, line, reason) in [
        (
            "v.json",
            "  \"3\": {\"lm loss\": \"ten\"}\n}\n",
            5,
            "step \"3\": \"lm loss\" is \"ten\", not a number",
        ),
        (
            "s.json",
            "  \"18446744073709551616\": {\"lm loss\": 1.0}\n}\n",
            5,
            "step key \"18446744073709551616\" is not a whole number",
        ),
        (
            "o.json",
            "  \"3\": {\"lm loss\": 1.0},\n  \"4\": 9.5\n}\n",
            6,
            "step \"4\": 9.5 is not an object of metrics",
        ),
    ] {
        let e = error_of(name, format!("{ok}{last}").as_bytes(), None);
        assert_eq!(line_of(&e), line, "{name}: {e}");
        assert!(
            e.to_string().contains(&format!("{name}:{line}: {reason}")),
            "{e}"
        );
    }
    // Broken JSON named as this format: serde's line.
    let e = error_of(
        "b.json",
        b"{\n \"1\": {\"lm loss\": 10.5},\n \"2\": {\"lm loss\": 10.4,,}\n}\n",
        Some(LogFormat::MegatronBridgeGolden),
    );
    assert_eq!(line_of(&e), 3, "{e}");
}

/// modded-nanogpt records: the script's source and nvidia-smi first, then `step:N/M
/// train_loss:X` every step and `step:N/M val_loss:X` every 10. See: issue 15.
#[test]
fn nanogpt_train_and_val_losses() {
    let c = read(&fixture("nanogpt.txt"), None).unwrap();
    assert_eq!(c.format, LogFormat::Nanogpt);
    assert_eq!(c.metrics_found(), ["loss", "val_loss"]);
    let train = &c.metrics[&Metric::Loss];
    assert_eq!(
        train.iter().map(|s| s.step).collect::<Vec<_>>(),
        (1..=60).collect::<Vec<_>>()
    );
    assert_eq!((train[0].value, train[59].value), (10.1957, 3.3410));
    // The script's own `print0(f"step:{step}/...")` lines (above line 27) are not steps.
    assert_eq!(train[0].line, 28);
    let val = &c.metrics[&Metric::ValLoss];
    assert_eq!(
        val.iter().map(|s| s.step).collect::<Vec<_>>(),
        (0..=6).map(|i| 10 * i).collect::<Vec<_>>()
    );
    assert_eq!((val[0].value, val[6].value), (10.8272, 3.3265));
    assert_eq!(c.precision(Metric::Loss), 1e-4);
    assert_eq!(c.precision(Metric::ValLoss), 1e-4);
    // Later records print no train_loss: their only loss is val_loss.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("record.txt");
    std::fs::write(
        &p,
        "step:0/1393 val_loss:10.8258 train_time:0ms step_avg:nanms\n\
         step:1/1393 train_time:29360ms step_avg:nanms\n\
         step:125/1393 val_loss:4.3879 train_time:16224ms step_avg:141.08ms\n",
    )
    .unwrap();
    let c = read(&p, None).unwrap();
    assert_eq!(c.format, LogFormat::Nanogpt);
    assert_eq!(c.metrics_found(), ["val_loss"]);
    assert_eq!(c.metrics[&Metric::ValLoss][1].step, 125);
}

#[test]
fn nanogpt_malformed_lines_name_the_line() {
    let ok = "step:1/10 train_loss:9.4594 train_time:283ms step_avg:nanms\n";
    for (name, bad, reason) in [
        (
            "n1.txt",
            "step:2/10 train_loss:9.45x4 train_time:1ms step_avg:nanms\n",
            "`train_loss:` value `9.45x4` is not a number",
        ),
        (
            "n2.txt",
            "step:10/10 val_loss: train_time:1ms step_avg:nanms\n",
            "`val_loss:` value `train_time:1ms` is not a number",
        ),
        (
            "n3.txt",
            "step:9007199254740993/10 train_loss:9.1\n",
            "step `9007199254740993` is not a whole number",
        ),
    ] {
        let e = error_of(name, format!("{ok}{bad}").as_bytes(), None);
        assert_eq!(line_of(&e), 2, "{name}: {e}");
        assert!(
            e.to_string().contains(&format!("{name}:2: {reason}")),
            "{e}"
        );
    }
}

/// `--pattern`: any log, read line by line with named groups `step` and `value`. See: issue 15.
#[test]
fn a_line_pattern_reads_any_log() {
    let log = fixture("custom_trainer.log");
    let pat = LinePattern::new(r"\| it\s+(?P<step>\d+)/\d+ \| loss=(?P<value>\S+)").unwrap();
    let c = read_pattern(&log, &pat, Metric::Loss).unwrap();
    assert_eq!(c.format, LogFormat::Pattern);
    let loss = &c.metrics[&Metric::Loss];
    // 48 step lines; the `eval after it 16 | loss=` lines and the prose do not match.
    assert_eq!(
        loss.iter().map(|s| s.step).collect::<Vec<_>>(),
        (1..=48).collect::<Vec<_>>()
    );
    assert_eq!((loss[0].value, loss[0].line), (10.25745, 4));
    assert_eq!(loss[47].value, 3.34704);
    assert_eq!(c.precision(Metric::Loss), 1e-5);
    // The values are the metric the caller names; thousands separators are read.
    let tps = LinePattern::new(r"it\s+(?<step>\d+)/.*tok/s=(?<value>[\d,]+)").unwrap();
    let c = read_pattern(&log, &tps, Metric::TokensPerS).unwrap();
    assert_eq!(c.metrics_found(), ["tokens_per_s"]);
    assert_eq!(c.metrics[&Metric::TokensPerS][0].value, 61080.0);
    // No line matches: the file and the pattern are named.
    let none = LinePattern::new(r"step=(?P<step>\d+) loss=(?P<value>\S+)").unwrap();
    let e = read_pattern(&log, &none, Metric::Loss)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(&format!(
            "{}: no line matched the pattern (--pattern `step=",
            log.display()
        )),
        "{e}"
    );
}

#[test]
fn a_line_pattern_refuses_what_its_groups_capture_badly() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("run.log");
    std::fs::write(&p, "it 1 loss 2.5\nwarming up\nit 2 loss 2.4x\n").unwrap();
    let pat = LinePattern::new(r"it (?P<step>\S+) loss (?P<value>\S+)").unwrap();
    let e = read_pattern(&p, &pat, Metric::Loss).unwrap_err();
    assert_eq!(line_of(&e), 3, "{e}");
    assert!(
        e.to_string()
            .ends_with("run.log:3: --pattern group `value` captured `2.4x`, not a number"),
        "{e}"
    );
    std::fs::write(&p, "it 1 loss 2.5\nit -2 loss 2.4\n").unwrap();
    let e = read_pattern(&p, &pat, Metric::Loss).unwrap_err();
    assert!(
        e.to_string().ends_with(
            "run.log:2: --pattern group `step` captured `-2`, not a whole number from 0 to 2^53"
        ),
        "{e}"
    );
    // A group inside `(...)?` that took no part in the match.
    let opt = LinePattern::new(r"it (?P<step>\d+)(?: loss (?P<value>\S+))?").unwrap();
    std::fs::write(&p, "it 1 loss 2.5\nit 2\n").unwrap();
    let e = read_pattern(&p, &opt, Metric::Loss).unwrap_err();
    assert_eq!(line_of(&e), 2, "{e}");
    assert!(
        e.to_string()
            .contains("group `value` took no part in the match"),
        "{e}"
    );
    // A pattern without its groups, or one that does not compile, names --pattern.
    for (bad, why) in [
        (r"it (\d+) loss (\S+)", "it has no `step` and no `value`"),
        (r"it (?P<step>\d+ loss", "does not compile: unclosed group"),
    ] {
        let e = LinePattern::new(bad).unwrap_err();
        assert!(matches!(e, CurveError::Pattern { .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.starts_with("--pattern `") && text.contains(why),
            "{text}"
        );
        assert_eq!(text.lines().count(), 1, "{text}");
    }
    // Naming the pattern format without an expression is refused, not a panic.
    let e = read(&p, Some(LogFormat::Pattern)).unwrap_err();
    assert!(e.to_string().contains("--pattern"), "{e}");
}

#[test]
fn torchtitan_stdout_with_ansi_colours() {
    let c = read(&fixture("torchtitan.log"), None).unwrap();
    assert_eq!(c.format, LogFormat::TorchtitanStdout);
    let loss = &c.metrics[&Metric::Loss];
    assert_eq!(loss.len(), 10, "the evaluation line is skipped");
    assert_eq!((loss[0].step, loss[0].value), (1, 9.5498));
    assert_eq!(c.precision(Metric::Loss), 1e-4);
    assert_eq!(c.metrics[&Metric::TokensPerS][0].value, 12355.0);
    assert_eq!(c.metrics[&Metric::Tflops][0].value, 231.5);
}

#[test]
fn hf_trainer_state_reads_training_losses_only() {
    let (f, steps, loss, p) = loss_of("trainer_state.json");
    assert_eq!(f, LogFormat::HfTrainerState);
    assert_eq!(steps, (1..=10).map(|i| 10 * i).collect::<Vec<_>>());
    assert_eq!(loss[0], 4.3364);
    assert_eq!(p, 1e-4);
    assert!(
        !loss.contains(&2.3456),
        "eval_loss is not the training loss"
    );
    assert!(
        !loss.contains(&2.5),
        "train_loss (the run's mean) is not a step's loss"
    );
}

#[test]
fn plain_space_csv_and_tsv() {
    for (name, p) in [("loss.txt", 1e-6), ("loss.csv", 1e-5), ("loss.tsv", 1e-4)] {
        let (f, steps, loss, prec) = loss_of(name);
        assert_eq!(f, LogFormat::Plain, "{name}");
        assert_eq!(steps, (0..10).collect::<Vec<_>>(), "{name}");
        assert_eq!(loss[0], 4.0, "{name}");
        assert!((prec - p).abs() < p * 1e-9, "{name}: {prec}");
    }
    let c = read(&fixture("loss.csv"), None).unwrap();
    assert_eq!(c.metrics[&Metric::StepTimeS][9].value, 0.259);
}

#[test]
fn tensorboard_simple_value_and_tensor_scalars() {
    for name in [
        "simple.tfevents",
        "tensor_float.tfevents",
        "tensor_double.tfevents",
    ] {
        let c = read(&fixture(&format!("tensorboard/{name}")), None).unwrap();
        assert_eq!(c.format, LogFormat::Tensorboard, "{name}");
        let loss = &c.metrics[&Metric::Loss];
        assert_eq!(loss.len(), 20, "{name}");
        let want = |s: f64| 2.0 + 10.0 * (-s / 10.0).exp() + s / 1000.0;
        for x in loss {
            let tol = if name.contains("double") { 1e-12 } else { 1e-6 };
            assert!(
                (x.value - want(x.step as f64)).abs() < tol,
                "{name} step {}: {}",
                x.step,
                x.value
            );
        }
        assert_eq!(c.metrics[&Metric::StepTimeS].len(), 20, "{name}");
    }
}

#[test]
fn tensorboard_is_detected_by_framing_without_the_name() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("run.bin");
    std::fs::copy(fixture("tensorboard/simple.tfevents"), &p).unwrap();
    assert_eq!(read(&p, None).unwrap().format, LogFormat::Tensorboard);
}

/// Writes `text` to a temporary file and returns the reader's error.
fn error_of(name: &str, text: &[u8], format: Option<LogFormat>) -> CurveError {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    read(&p, format).expect_err("malformed input must be refused")
}

fn line_of(e: &CurveError) -> usize {
    match e {
        CurveError::Malformed { line, .. } => *line,
        other => panic!("expected a malformed-line error, got {other}"),
    }
}

#[test]
fn malformed_text_logs_name_the_line() {
    let ok = "completed step: 0, seconds: 1.000, TFLOP/s/device: 1.000, Tokens/s/device: 1.000, total_weights: 1, loss: 9.000\n";
    let cases: Vec<(&str, String, Option<LogFormat>, usize)> = vec![
        ("mt.log", format!("{ok}{}", ok.replace("9.000", "9.0x0")), None, 2),
        ("mt2.log", format!("{ok}completed step: 1, seconds: 1.000\n"), None, 2),
        ("mt3.log", format!("{ok}completed step: one, loss: 1.0\n"), None, 2),
        ("m.jsonl", "{\"step\": 0.0, \"learning/loss\": 9.1}\n\n{\"step\": 1.0, \"learning/loss\": 9.0\n".into(), Some(LogFormat::MaxtextJsonl), 3),
        ("m2.jsonl", "{\"step\": 0.5, \"learning/loss\": 9.1}\n".into(), Some(LogFormat::MaxtextJsonl), 1),
        ("meg.log", " iteration        1/     10 | lm loss: 1.000000E+01 |\n iteration        2/     10 | lm loss: 1.0000O0E+01 |\n".into(), None, 2),
        ("tt.log", "step:  1  loss:  9.1234  tps: 1,000\nstep:  2  loss:  9.1x34  tps: 1,000\n".into(), None, 2),
        ("p.txt", "0 1.5\n1 1.4\n2 1,4x\n".into(), Some(LogFormat::Plain), 3),
        ("p2.csv", "step,loss\n0,1.5\n1\n".into(), Some(LogFormat::Plain), 3),
        ("p3.txt", "0 1.5\n-1 1.4\n".into(), Some(LogFormat::Plain), 2),
    ];
    for (name, text, fmt, line) in cases {
        let e = error_of(name, text.as_bytes(), fmt);
        assert_eq!(line_of(&e), line, "{name}: {e}");
        assert!(e.to_string().contains(&format!("{name}:{line}: ")), "{e}");
    }
}

#[test]
fn malformed_json_documents_name_the_line() {
    let golden = "{\n  \"lm loss\": {\n    \"start_step\": 1,\n    \"values\": {\"1\": 10.0, \"2\": \"ten\"}\n  }\n}\n";
    assert_eq!(line_of(&error_of("g.json", golden.as_bytes(), None)), 2);
    let broken = "{\n  \"lm loss\": {\n    \"values\": {\"1\": 10.0,,}\n  }\n}\n";
    assert_eq!(
        line_of(&error_of(
            "g2.json",
            broken.as_bytes(),
            Some(LogFormat::MegatronGolden)
        )),
        3
    );
    let hf = "{\n \"log_history\": [\n  {\"loss\": 2.5, \"step\": 10},\n  {\"loss\": \"x\", \"step\": 20}\n ]\n}\n";
    assert_eq!(
        line_of(&error_of("trainer_state.json", hf.as_bytes(), None)),
        4
    );
}

#[test]
fn corrupt_tensorboard_files_name_the_record() {
    let good = std::fs::read(fixture("tensorboard/simple.tfevents")).unwrap();
    // Flip a byte inside the third record's payload: its data checksum no longer matches.
    let mut flipped = good.clone();
    let mut at = 0;
    for _ in 0..2 {
        let len = u64::from_le_bytes(flipped[at..at + 8].try_into().unwrap()) as usize;
        at += 12 + len + 4;
    }
    flipped[at + 14] ^= 0x40;
    let e = error_of("events.out.tfevents.1", &flipped, None);
    assert_eq!(line_of(&e), 3, "{e}");
    assert!(e.to_string().contains("checksum"), "{e}");
    // Cut inside the first record: there is nothing whole to read.
    let e = error_of("events.out.tfevents.2", &good[..20], None);
    assert!(e.to_string().contains("no whole record"), "{e}");
    // Not TensorBoard at all, but named as if it were.
    let e = error_of(
        "events.out.tfevents.3",
        b"hello world, this is text\n",
        None,
    );
    assert_eq!(line_of(&e), 1, "{e}");
}

#[test]
fn windows_line_endings_and_a_byte_order_mark_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "loss.csv",
        "trainer_state.json",
        "native.log",
        "megatron.log",
    ] {
        let text = std::fs::read_to_string(fixture(name)).unwrap();
        let mut bytes = b"\xEF\xBB\xBF".to_vec();
        bytes.extend_from_slice(text.replace('\n', "\r\n").as_bytes());
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let want = read(&fixture(name), None).unwrap();
        let got = read(&p, None).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got.format, want.format, "{name}");
        let values = |c: &moecheck_curves::Curve| -> Vec<(u64, f64)> {
            c.metrics[&Metric::Loss]
                .iter()
                .map(|s| (s.step, s.value))
                .collect()
        };
        assert_eq!(values(&got), values(&want), "{name}");
    }
}

#[test]
fn unrecognised_text_asks_for_format() {
    let e = error_of("notes.txt", b"hello\nworld\n", None);
    assert!(matches!(e, CurveError::Unrecognised { .. }), "{e}");
    assert!(e.to_string().contains("--format"));
}

/// Byte offsets at which each record of a TFRecord file starts.
fn record_starts(bytes: &[u8]) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        starts.push(at);
        at += 16 + u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
    }
    starts
}

/// A run still writing (or one that crashed) leaves its last record cut short: the records
/// before it are read and a warning names the record and its byte offset. See: issue 16,
/// item 17 (the whole file used to be refused).
#[test]
fn a_truncated_last_tensorboard_record_is_skipped_with_a_warning() {
    let good = std::fs::read(fixture("tensorboard/simple.tfevents")).unwrap();
    let whole = read(&fixture("tensorboard/simple.tfevents"), None).unwrap();
    let starts = record_starts(&good);
    let last = *starts.last().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Cut inside the last record's data, then inside its 12-byte header.
    for (cut, needs) in [
        (good.len() - 3, Some((good.len() - last) as u64)),
        (last + 5, None),
    ] {
        let p = dir.path().join("events.out.tfevents.live");
        std::fs::write(&p, &good[..cut]).unwrap();
        let c = read(&p, None).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        assert_eq!(
            c.warnings,
            [ReadWarning::TruncatedRecord {
                record: starts.len(),
                offset: last as u64,
                bytes_left: (cut - last) as u64,
                needs,
            }]
        );
        let text = c.warnings[0].to_string();
        assert!(text.contains(&format!("at byte {last}")), "{text}");
        // Every sample of the whole records, and none of the cut one.
        for (m, samples) in &whole.metrics {
            let kept: Vec<_> = samples.iter().filter(|s| s.line < starts.len()).collect();
            let got: Vec<_> = c.metrics.get(m).into_iter().flatten().collect();
            assert_eq!(got, kept, "{m:?}");
        }
    }
    // A file cut at a record boundary is whole: no warning.
    let p = dir.path().join("events.out.tfevents.boundary");
    std::fs::write(&p, &good[..last]).unwrap();
    assert!(read(&p, None).unwrap().warnings.is_empty());
    // A checksum mismatch in the last record is corruption, not truncation.
    let mut bad = good.clone();
    bad[good.len() - 6] ^= 1;
    let e = error_of("events.out.tfevents.bad", &bad, None);
    assert!(e.to_string().contains("checksum"), "{e}");
}

/// Semicolon-separated values (a spreadsheet's CSV where `,` is the decimal mark) are read
/// under a header naming the columns, and refused with the reason otherwise. See: issue 16,
/// item 17 (they were "format not recognised").
#[test]
fn semicolon_separated_values_need_a_header() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("loss_de.csv");
    std::fs::write(&p, "step;loss;tps\n0;2,345;1000\n1;2,340;1010\n2;2.3;990\n").unwrap();
    let c = read(&p, None).unwrap();
    assert_eq!(c.format, LogFormat::Plain);
    let loss = &c.metrics[&Metric::Loss];
    let got: Vec<(u64, f64, f64)> = loss.iter().map(|s| (s.step, s.value, s.quantum)).collect();
    assert_eq!(got, [(0, 2.345, 1e-3), (1, 2.34, 1e-3), (2, 2.3, 0.1)]);
    assert_eq!(c.metrics[&Metric::TokensPerS][1].value, 1010.0);
    let e = error_of("bare.csv", b"0;2,5\n1;2,4\n", None);
    assert_eq!(line_of(&e), 1, "{e}");
    assert!(
        e.to_string().contains(
            "semicolon-separated values are read only under a first line naming the columns"
        ),
        "{e}"
    );
    let e = error_of("both.csv", b"step;loss\n0;1.234,5\n", None);
    assert_eq!(line_of(&e), 2, "{e}");
    assert!(e.to_string().contains("`1.234,5` is ambiguous"), "{e}");
}

/// An empty file says so, with or without `--format`. See: issue 16, item 17.
#[test]
fn empty_files_are_called_empty() {
    for (bytes, blank) in [
        (&b""[..], false),
        (b"\n  \r\n\t\n", true),
        (b"\xEF\xBB\xBF", false),
    ] {
        for format in [None, Some(LogFormat::Plain), Some(LogFormat::Tensorboard)] {
            let e = error_of("events.out.tfevents.empty", bytes, format);
            assert!(
                matches!(e, CurveError::Empty { blank: b, .. } if b == blank),
                "{e}"
            );
            assert!(
                e.to_string()
                    .ends_with("events.out.tfevents.empty: empty file")
                    != blank,
                "{e}"
            );
        }
    }
}
