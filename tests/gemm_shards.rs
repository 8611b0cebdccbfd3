//! `moecheck gemm --shards N`: a case checked a shard of consecutive experts at a time
//! reports what the whole case reports (full verification: the same report; fast: the same
//! verdicts), for the clean model and every planted bug it may run; implementations that
//! must see the whole case, dumps and the FP8 GEMM refuse it.

use assert_cmd::Command;
use serde_json::Value;

mod common;
use common::with_defaults;

use moecheck::impls::gemm::emulate::Bug;
use moecheck::impls::PlantedBug;

/// The tests' small case with a partial K block (40 is not a multiple of the model's 32).
const CASE: [&str; 10] = [
    "--experts",
    "6",
    "--tokens",
    "40",
    "--hidden",
    "40",
    "--ffn",
    "16",
    "--empty",
    "2",
];

fn gemm(extra: &[&str]) -> Command {
    with_defaults(&["gemm"], &CASE, extra)
}

/// The JSON report of `gemm(args)` and its exit status; timings are left out.
fn report(args: &[&str]) -> (Value, i32) {
    let out = gemm(&[args, &["--json"]].concat()).output().unwrap();
    let mut v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.retain(|k, _| !k.contains("seconds"));
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    (v, out.status.code().unwrap_or(-1))
}

#[test]
fn shards_report_what_the_whole_case_reports() {
    let bugs: Vec<Option<Bug>> = std::iter::once(None)
        .chain(
            Bug::ALL
                .iter()
                .copied()
                .filter(|b| *b != Bug::GroupOffsetAfterEmpty)
                .map(Some),
        )
        .collect();
    for bug in bugs {
        let mut args = vec![];
        if let Some(b) = bug {
            args.extend(["--inject", b.name()]);
        }
        if bug == Some(Bug::KZeroGarbage) {
            args.extend(["--hidden", "0"]);
        }
        let (whole, code) = report(&args);
        // Every planted bug shows at this size, and the clean model passes.
        assert_eq!(code, if bug.is_some() { 1 } else { 0 }, "{bug:?}");
        for parts in ["2", "3", "6"] {
            let (sharded, c) = report(&[args.as_slice(), &["--shards", parts]].concat());
            assert_eq!(c, code, "{bug:?}, {parts} shards");
            assert_eq!(sharded, whole, "{bug:?}, {parts} shards");
        }
        // Fast verification draws its samples per shard: the same verdict.
        let (fast, c) = report(&[args.as_slice(), &["--verify", "fast", "--shards", "3"]].concat());
        assert_eq!(c, code, "{bug:?}, fast: {}", fast["failure"]);
        assert_eq!(fast["verdict"], whole["verdict"], "{bug:?}, fast");
    }
}

#[test]
fn what_must_be_checked_whole_refuses_shards() {
    let dump = tempfile::tempdir().unwrap();
    let dump_dir = dump.path().join("case");
    let dump_arg = dump_dir.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (&["--impl", "exec:true"], "checked whole"),
        (&["--inject", "group-offset-after-empty"], "checked whole"),
        (&["--dump", dump_arg], "--dump"),
        (&["--dtype", "fp8"], "FP8"),
        (
            &["--experts", "2", "--empty", "0"],
            "more shards than experts",
        ),
    ];
    for (args, needle) in cases {
        let out = gemm(&[args, &["--shards", "3"]].concat()).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--shards") && err.contains(needle),
            "{args:?}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
    assert!(!dump_dir.exists(), "nothing is dumped");
    // One shard is the whole case: allowed for everything.
    let out = gemm(&["--impl", "reference", "--shards", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
}
