//! A property campaign against workers that break the protocol (issue "Reliability round 2",
//! items 4 and 9): a worker that greets and then never answers, or answers garbage, fails the
//! property at its first case without shrinking (each shrink step would pay the same timeout),
//! and says so; a worker that writes a stray stdout line after each answer fails the next
//! case, every time, naming the line, and is restarted.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A grouped-GEMM worker in `dir` that greets, then for each case runs `body` (Python, with
/// `d` the case directory, `handler`, `read_case` and `write_outputs` at hand).
fn worker(dir: &Path, body: &str) -> String {
    let script = format!(
        r#"import json, sys, time
sys.path[:0] = [{adapters:?}, {python:?}]
from numpy_grouped_gemm import handler
from moecheck.case import read_case, write_outputs
print(json.dumps({{"protocol": 2, "ops": ["grouped_gemm"]}}), flush=True)
for line in sys.stdin:
    d = json.loads(line)["case"]
{body}
"#,
        adapters = repo().join("examples/adapters").display().to_string(),
        python = repo().join("python").display().to_string(),
    );
    let path = dir.join("worker.py");
    std::fs::write(&path, script).unwrap();
    format!("worker:python3 {}", path.display())
}

/// `moecheck prop --op gemm` on one property against `imp`: (exit code, stdout, seconds).
fn campaign(imp: &str, cases: &str) -> (Option<i32>, String, f64) {
    let start = Instant::now();
    let out = common::moecheck()
        .args([
            "prop",
            "--op",
            "gemm",
            "--property",
            "fwd-matches-reference",
        ])
        .args(["--cases", cases, "--timeout", "1", "--impl", imp])
        .timeout(Duration::from_secs(240))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code(), text, start.elapsed().as_secs_f64())
}

#[test]
fn a_silent_or_garbled_worker_fails_without_shrinking() {
    let dir = tempfile::tempdir().unwrap();
    for (name, body) in [
        ("silent", "    time.sleep(3600)"),
        (
            "garbage",
            "    print('Compiling kernels... done', flush=True)",
        ),
    ] {
        let d = dir.path().join(name);
        std::fs::create_dir(&d).unwrap();
        let (code, text, secs) = campaign(&worker(&d, body), "8");
        assert_eq!(code, Some(1), "{name}: {text}");
        assert!(
            text.contains("not shrunk: the implementation broke the protocol or timed out"),
            "{name}: {text}"
        );
        // One case's timeout (1 s) and a worker start or two, not one timeout per shrink step.
        assert!(secs < 30.0, "{name}: {secs:.1} s");
    }
}

#[test]
fn a_stray_line_after_each_answer_fails_the_next_case_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let body = "    write_outputs(d, handler(read_case(d)))\n    print(json.dumps({'ok': True}), flush=True)\n    print('cache warm', flush=True)";
    let imp = worker(dir.path(), body);
    // Several runs: the verdict must not depend on when the stray line arrives.
    for _ in 0..3 {
        let (code, text, _) = campaign(&imp, "6");
        assert_eq!(code, Some(1), "{text}");
        assert!(text.contains("'cache warm'"), "{text}");
        assert!(
            text.contains("between cases") || text.contains("answered 'cache warm'"),
            "{text}"
        );
    }
}

/// Answers a fuzzer would try, live: a line past the reader's limit, half an answer and then
/// exit, an answer full of terminal escapes. Each fails its case at once (no timeout), and
/// the message is one line without control characters.
#[test]
fn huge_partial_and_escaped_answers_fail_the_case_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    for (name, body) in [
        ("huge", "    print('x' * (3 << 20), flush=True)"),
        (
            "partial",
            "    sys.stdout.write('{\"ok\": tr'); sys.stdout.flush(); sys.exit(0)",
        ),
        (
            "escapes",
            "    print('\\x1b[2J\\x1b[31mdone\\x00', flush=True)",
        ),
    ] {
        let d = dir.path().join(name);
        std::fs::create_dir(&d).unwrap();
        let start = Instant::now();
        let out = common::moecheck()
            .args([
                "gemm",
                "--experts",
                "4",
                "--tokens",
                "16",
                "--hidden",
                "8",
                "--ffn",
                "8",
            ])
            .args(["--timeout", "60", "--impl", &worker(&d, body)])
            .timeout(Duration::from_secs(120))
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(1), "{name}: {text}");
        assert!(
            start.elapsed() < Duration::from_secs(50),
            "{name}: waited for the timeout"
        );
        assert!(text.contains("run failed"), "{name}: {text}");
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{name}: a control character reached the report"
        );
        assert!(
            text.len() < 20_000,
            "{name}: {} bytes of report",
            text.len()
        );
    }
}
