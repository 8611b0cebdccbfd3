//! The plot's layout, checked on the boxes it computes (from the embedded font's metrics, the
//! very glyphs the rasteriser draws): no two texts overlap, no text overlaps a legend swatch,
//! and every text lies inside the image — with torchtitan-long file names, every verdict, a
//! NaN marker, and (as a property) random names, magnitudes and step ranges. See: issue 16,
//! "Also:" (the two legend entries and the verdict were drawn on top of each other).

use std::path::Path;

use moecheck_curves::diff::{diff, Criterion, Diff, Verdict};
use moecheck_curves::plot::{render, scene, text_box, Colour, Kind, Rect, Shape, HEIGHT, WIDTH};
use moecheck_curves::{Curve, LogFormat, Metric, Sample};
use proptest::prelude::*;

/// A curve at `path` with `values` at `steps` (4 decimals).
fn curve(path: &str, steps: &[u64], values: &[f64]) -> Curve {
    let mut c = Curve::new(Path::new(path), LogFormat::Plain);
    for (i, (&step, &value)) in steps.iter().zip(values).enumerate() {
        c.push(
            Metric::Loss,
            Sample {
                step,
                value,
                line: i + 1,
                quantum: 1e-4,
            },
        );
    }
    c
}

/// What the layout promises, on the scene of `d`; returns the texts by their content.
fn check_layout(d: &Diff) -> Vec<(String, Rect)> {
    let image = Rect {
        x0: 0.0,
        y0: 0.0,
        x1: WIDTH as f64,
        y1: HEIGHT as f64,
    };
    let shapes = scene(d);
    let texts: Vec<(String, Rect)> = shapes
        .iter()
        .filter_map(|s| match s {
            Shape::Text { text, .. } => Some((text.clone(), text_box(s).unwrap())),
            _ => None,
        })
        .collect();
    let swatches: Vec<Rect> = shapes
        .iter()
        .filter_map(|s| match s {
            Shape::Rect {
                x,
                y,
                w,
                h,
                fill: Colour::Base | Colour::Test,
            } => Some(Rect {
                x0: *x,
                y0: *y,
                x1: x + w,
                y1: y + h,
            }),
            _ => None,
        })
        .collect();
    assert_eq!(swatches.len(), 2, "one swatch per legend entry");
    for (i, (a, ra)) in texts.iter().enumerate() {
        assert!(ra.inside(&image), "`{a}` {ra:?} leaves the image");
        for (b, rb) in &texts[i + 1..] {
            assert!(!ra.overlaps(rb), "`{a}` {ra:?} overlaps `{b}` {rb:?}");
        }
        for s in &swatches {
            assert!(!ra.overlaps(s), "`{a}` {ra:?} overlaps a swatch {s:?}");
        }
    }
    let entry = |p: &str| {
        texts
            .iter()
            .filter(|t| t.0.starts_with(p) && t.0.ends_with(".log"))
            .count()
    };
    assert_eq!(
        (entry("BASE "), entry("TEST ")),
        (1, 1),
        "a legend entry each"
    );
    let verdict = d.report.verdict.label();
    assert_eq!(
        texts.iter().filter(|t| t.0 == verdict).count(),
        1,
        "the verdict"
    );
    texts
}

const LONG_BASE: &str = "/data/runs/torchtitan/tests/integration_tests/reference/\
    llama3_8b_fsdp2_tp2_cp1_float8_rowwise_compile_bf16_reduce_seed0_steps1000_warmup200_lr3e-4_\
    batch64_seq8192_loss_reference.log";
const LONG_TEST: &str = "/data/runs/torchtitan/tests/integration_tests/candidate/\
    llama3_8b_fsdp2_tp2_cp1_float8_rowwise_compile_bf16_reduce_seed0_steps1000_warmup200_lr3e-4_\
    batch64_seq8192_loss_candidate_grouped_gemm.log";

#[test]
fn long_file_names_and_the_verdict_do_not_collide() {
    let steps: Vec<u64> = (0..40).collect();
    let base: Vec<f64> = steps
        .iter()
        .map(|s| 10.0 * (-(*s as f64) / 30.0).exp() + 2.0)
        .collect();
    let off: Vec<f64> = base.iter().map(|v| v * 1.05).collect();
    let mut nan = base.clone();
    nan[25] = f64::NAN;
    let b = curve(LONG_BASE, &steps, &base);
    for (test, want) in [
        (curve(LONG_TEST, &steps, &base), Verdict::Pass),
        (curve(LONG_TEST, &steps, &off), Verdict::Fail),
        (curve(LONG_TEST, &steps[..3], &base), Verdict::Inconclusive),
        (curve(LONG_TEST, &steps, &nan), Verdict::Fail),
    ] {
        let d = diff(&b, &test, &[], Metric::Loss, &Criterion::default()).unwrap();
        assert_eq!(d.report.verdict, want);
        let texts = check_layout(&d);
        // The names were shortened in the middle, keeping their ends.
        for (prefix, end) in [
            ("BASE llama3", "reference.log"),
            ("TEST llama3", "gemm.log"),
        ] {
            let (t, _) = texts.iter().find(|t| t.0.starts_with(prefix)).unwrap();
            assert!(t.contains('…') && t.ends_with(end), "{t}");
        }
        // Both outputs still render.
        assert!(render(&d, Kind::Png).starts_with(b"\x89PNG"));
        let svg = String::from_utf8(render(&d, Kind::Svg)).unwrap();
        assert!(
            svg.contains("textLength="),
            "SVG text is fitted to the measured width"
        );
    }
}

#[test]
fn short_names_share_one_line() {
    let steps: Vec<u64> = (0..20).collect();
    let v: Vec<f64> = steps.iter().map(|s| 5.0 - 0.1 * *s as f64).collect();
    let d = diff(
        &curve("native.log", &steps, &v),
        &curve("te.log", &steps, &v),
        &[],
        Metric::Loss,
        &Criterion::default(),
    )
    .unwrap();
    let texts = check_layout(&d);
    let row = |p: &str| texts.iter().find(|t| t.0.starts_with(p)).unwrap().1;
    assert_eq!(row("BASE native.log").y0, row("TEST te.log").y0);
}

/// File names of any length and script, values of any magnitude, steps anywhere up to 2^53.
#[derive(Debug, Clone)]
struct PlotArgs {
    base_name: String,
    test_name: String,
    first_step: u64,
    steps: usize,
    stride: u64,
    level: f64,
    gap: f64,
}

fn plot_args() -> impl Strategy<Value = PlotArgs> {
    (
        "[a-zA-Z0-9_./é中-]{0,160}",
        "[a-zA-Z0-9_./é中-]{0,160}",
        0u64..(1u64 << 52),
        1usize..60,
        1u64..1_000_000,
        -300i32..300,
        -3.0f64..3.0,
    )
        .prop_map(|(b, t, first_step, steps, stride, exp, gap)| PlotArgs {
            base_name: format!("{b}.log"),
            test_name: format!("{t}.log"),
            first_step,
            steps,
            stride,
            level: 10f64.powi(exp),
            gap,
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        rng_seed: proptest::test_runner::RngSeed::Fixed(16),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn no_text_collides_or_leaves_the_image(a in plot_args()) {
        let steps: Vec<u64> = (0..a.steps as u64).map(|i| a.first_step + i * a.stride).collect();
        let base: Vec<f64> = (0..a.steps).map(|i| a.level * (2.0 + (i as f64).sin())).collect();
        let test: Vec<f64> = base.iter().map(|v| v * (1.0 + a.gap)).collect();
        let d = diff(
            &curve(&a.base_name, &steps, &base),
            &curve(&a.test_name, &steps, &test),
            &[],
            Metric::Loss,
            &Criterion::default(),
        )
        .unwrap();
        check_layout(&d);
    }
}
