//! `--impl worker:CMD` (protocol v2) against workers that misbehave: one that crashes on its
//! 3rd case, one that hangs, one that prints garbage, one that speaks another protocol
//! version. Each fails the affected case only, as the implementation failing, and the next
//! case runs on a fresh worker: several cases go through one `Worker` built by the registry,
//! as a property campaign drives it.
//!
//! The workers are tiny Python scripts that speak the protocol themselves (so the Rust side
//! is tested, not the helper) and compute with the shipped numpy adapter's handler.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use moecheck::generate::gemm::{generate, GemmSpec, Spread};
use moecheck::reference::format::Format;
use moecheck::reference::gemm::{Gemm, GroupedGemmCase, Passes, TailContract};
use moecheck::reference::op::{verify, Implementation, Verdict};
use moecheck::registry::{build, Choice};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A small GEMM case (tail rows, empty experts), different per seed.
fn case(seed: u64) -> GroupedGemmCase {
    generate(&GemmSpec {
        experts: 4,
        tokens: 8,
        topk: 2,
        hidden: 8,
        ffn: 4,
        dtype: Format::F32,
        out_dtype: Format::F32,
        spread: Spread::Uniform,
        empty: 1,
        drop_frac: 0.1,
        seed,
        tail: TailContract::Zero,
        passes: Passes::ALL,
    })
}

/// A worker in `dir` that greets with `greeting`, logs each start to `dir/starts`, and runs
/// `misbehave` (Python, with `n` the case number in this process) before answering.
fn worker(dir: &Path, greeting: &str, misbehave: &str) -> String {
    let script = format!(
        r#"import json, os, sys, time
sys.path[:0] = [{adapters:?}, {python:?}]
from numpy_grouped_gemm import handler
from moecheck.adapter import run_case
with open(os.path.join({dir:?}, "starts"), "a") as f:
    f.write(f"{{os.getpid()}}\n")
print({greeting}, flush=True)
n = 0
for line in sys.stdin:
    n += 1
    d = json.loads(line)["case"]
    run_case(handler, d)
{misbehave}
    print(json.dumps({{"ok": True}}), flush=True)
"#,
        adapters = repo().join("examples/adapters").display().to_string(),
        python = repo().join("python").display().to_string(),
        dir = dir.display().to_string(),
    );
    let path = dir.join("worker.py");
    std::fs::write(&path, script).unwrap();
    format!("worker:python3 {}", path.display())
}

const HELLO: &str = r#"json.dumps({"protocol": 2, "ops": ["grouped_gemm"]})"#;

fn starts(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("starts"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

fn built(name: &str, timeout: f64) -> Box<dyn Implementation<Gemm>> {
    // The failed cases the worker keeps go to this test binary's own $TMPDIR.
    common::own_tmpdir();
    build::<Gemm>(&Choice {
        timeout: Some(timeout),
        ..Choice::named(name)
    })
    .expect("worker:CMD builds")
}

/// Runs cases 1..=n through `imp`: `None` for a pass, `Some(run error)` for a failed run
/// (anything else is a test failure).
fn campaign(imp: &dyn Implementation<Gemm>, n: u64) -> Vec<Option<String>> {
    (1..=n)
        .map(|seed| match verify(imp, &case(seed), Passes::ALL).verdict {
            Verdict::Pass(_) => None,
            Verdict::RunFailed(e) => Some(e.message),
            other => panic!("case {seed}: {:?}", other.failure()),
        })
        .collect()
}

/// Whether process `pid` is gone (or a zombie), waiting up to two seconds.
fn goes(pid: u32) -> bool {
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        let gone = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        });
        if gone || Instant::now() >= until {
            return gone;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_worker_that_crashes_on_its_third_case_fails_that_case_only() {
    let dir = tempfile::tempdir().unwrap();
    let cmd = worker(
        dir.path(),
        HELLO,
        "    if n == 3:\n        raise RuntimeError('crashed on case 3')",
    );
    let imp = built(&cmd, 60.0);
    let got = campaign(imp.as_ref(), 5);
    assert!(got[0].is_none() && got[1].is_none(), "{got:?}");
    let e = got[2].as_deref().expect("case 3 fails");
    assert!(
        e.lines()
            .next()
            .unwrap()
            .ends_with("exited with status 1 on this case: RuntimeError: crashed on case 3"),
        "{e}"
    );
    assert!(e.contains("| Traceback"), "{e}");
    // The campaign goes on, on a fresh worker (whose own 3rd case would be the 6th).
    assert!(got[3].is_none() && got[4].is_none(), "{got:?}");
    assert_eq!(starts(dir.path()).len(), 2);
}

#[test]
fn a_worker_that_hangs_is_ended_with_its_children_at_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let child = dir.path().join("child");
    let misbehave = format!(
        "    if n == 2:\n        import subprocess\n        p = subprocess.Popen(['sleep', '300'])\n        open({:?}, 'w').write(str(p.pid))\n        time.sleep(300)",
        child.display().to_string()
    );
    let cmd = worker(dir.path(), HELLO, &misbehave);
    let imp = built(&cmd, 2.0);
    let start = Instant::now();
    let got = campaign(imp.as_ref(), 3);
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    assert!(got[0].is_none() && got[2].is_none(), "{got:?}");
    let e = got[1].as_deref().expect("case 2 fails");
    assert!(
        e.contains("did not answer within 2.0 s (its process group was ended)"),
        "{e}"
    );
    let pids = starts(dir.path());
    assert_eq!(pids.len(), 2);
    let sleeper: u32 = std::fs::read_to_string(&child).unwrap().parse().unwrap();
    assert!(goes(pids[0]), "the hung worker {} is still there", pids[0]);
    assert!(
        goes(sleeper),
        "the hung worker's child {sleeper} is still there"
    );
}

#[test]
fn a_worker_that_prints_garbage_fails_that_case_and_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let cmd = worker(
        dir.path(),
        HELLO,
        "    if n == 2:\n        print('Compiling kernels... done', flush=True)\n        continue",
    );
    let imp = built(&cmd, 60.0);
    // The fresh worker's own 2nd case would be the 4th.
    let got = campaign(imp.as_ref(), 3);
    assert!(got[0].is_none() && got[2].is_none(), "{got:?}");
    let e = got[1].as_deref().expect("case 2 fails");
    assert!(
        e.contains("answered 'Compiling kernels... done' where {\"ok\": true}"),
        "{e}"
    );
    assert!(e.contains("print nothing else there"), "{e}");
    assert_eq!(starts(dir.path()).len(), 2);
}

/// A worker that fails to start on the first case (here: it greets with another protocol
/// version) is refused with the reason and not started again: later cases fail at once with
/// the same reason, and `broken()` says so (a campaign stops there).
#[test]
fn a_worker_that_speaks_another_protocol_version_is_refused_and_not_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let cmd = worker(
        dir.path(),
        r#"json.dumps({"protocol": 3, "ops": ["grouped_gemm"]})"#,
        "",
    );
    let imp = built(&cmd, 60.0);
    assert!(imp.broken().is_none());
    let got = campaign(imp.as_ref(), 3);
    for e in &got {
        let e = e.as_deref().expect("every case fails");
        assert!(
            e.contains("speaks protocol 3; this moecheck speaks worker protocol 2"),
            "{e}"
        );
    }
    assert_eq!(starts(dir.path()).len(), 1);
    let why = imp.broken().expect("a worker that never started is broken");
    assert!(why.message.contains("speaks protocol 3"), "{}", why.message);
}

/// A worker that started once and later fails to start again (here: the second start greets
/// with another version) is not given up: each failed start fails its case only.
#[test]
fn a_worker_that_greeted_once_is_restarted_after_a_failed_start() {
    let dir = tempfile::tempdir().unwrap();
    // Crashes on its first case; the second start speaks version 3, later ones version 2.
    let greeting = format!(
        r#"json.dumps({{"protocol": 3 if len(open({s:?}).read().split()) == 2 else 2, "ops": ["grouped_gemm"]}})"#,
        s = dir.path().join("starts").display().to_string()
    );
    let cmd = worker(dir.path(), &greeting, "    if n == 1 and len(open(os.path.join(os.path.dirname(__file__), 'starts')).read().split()) == 1:\n        sys.exit(5)");
    let imp = built(&cmd, 60.0);
    let got = campaign(imp.as_ref(), 3);
    assert!(
        got[0].as_deref().is_some_and(|e| e.contains("status 5")),
        "{got:?}"
    );
    assert!(
        got[1]
            .as_deref()
            .is_some_and(|e| e.contains("speaks protocol 3")),
        "{got:?}"
    );
    assert!(got[2].is_none(), "{got:?}");
    assert!(imp.broken().is_none());
    assert_eq!(starts(dir.path()).len(), 3);
}

#[test]
fn a_worker_for_another_op_or_one_that_exits_before_greeting_fails_the_case() {
    let dir = tempfile::tempdir().unwrap();
    let cmd = worker(
        dir.path(),
        r#"json.dumps({"protocol": 2, "ops": ["route"]})"#,
        "",
    );
    let got = campaign(built(&cmd, 60.0).as_ref(), 1);
    let e = got[0].as_deref().unwrap();
    assert!(
        e.contains(r#"serves ops ["route"]; this case is op grouped_gemm"#),
        "{e}"
    );
    // An exec:-style adapter started as a worker by mistake.
    let got = campaign(
        built("worker:echo 'usage: x.py CASE_DIR' >&2; exit 2", 60.0).as_ref(),
        1,
    );
    let e = got[0].as_deref().unwrap();
    assert!(
        e.contains("exited with status 2 before its greeting: usage: x.py CASE_DIR"),
        "{e}"
    );
}

/// An `{"ok": false}` answer (the helper's, for a handler that raised) fails the case and
/// keeps the worker; dropping the `Worker` ends it.
#[test]
fn an_ok_false_answer_fails_the_case_and_keeps_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("adapter.py");
    std::fs::write(
        &script,
        format!(
            r#"import os, sys
sys.path[:0] = [{adapters:?}]
import _checkout
from moecheck.adapter import serve
from numpy_grouped_gemm import handler
with open(os.path.join({dir:?}, "starts"), "a") as f:
    f.write(f"{{os.getpid()}}\n")
n = 0
def flaky(case):
    global n
    n += 1
    print("a stray print goes to stderr")
    if n == 2:
        raise ValueError("no kernel for this shape")
    return handler(case)
serve(flaky, ops=["grouped_gemm"])
"#,
            adapters = repo().join("examples/adapters").display().to_string(),
            dir = dir.path().display().to_string(),
        ),
    )
    .unwrap();
    let imp = built(&format!("worker:python3 {}", script.display()), 60.0);
    let got = campaign(imp.as_ref(), 3);
    assert!(got[0].is_none() && got[2].is_none(), "{got:?}");
    let e = got[1].as_deref().unwrap();
    assert!(
        e.lines()
            .next()
            .unwrap()
            .ends_with("failed the case: ValueError: no kernel for this shape"),
        "{e}"
    );
    assert!(e.contains("| a stray print goes to stderr"), "{e}");
    // The failed case is kept with the worker's stderr for that case.
    let kept = e
        .lines()
        .find_map(|l| l.trim().strip_prefix("case kept in "))
        .and_then(|rest| rest.split(", its stderr in stderr.txt").next())
        .unwrap_or_else(|| panic!("no kept case in {e}"));
    let kept = std::path::Path::new(kept);
    let stderr = std::fs::read_to_string(kept.join("stderr.txt")).unwrap();
    assert!(
        stderr.contains("Traceback") && stderr.contains("ValueError: no kernel for this shape"),
        "{stderr}"
    );
    assert!(kept.join("case.json").exists());
    std::fs::remove_dir_all(kept).unwrap();
    let pids = starts(dir.path());
    assert_eq!(pids.len(), 1);
    drop(imp);
    assert!(goes(pids[0]), "the worker outlived its Worker");
}

/// Issue 42 item 13: a worker that exits (status 7) while a background child it started keeps
/// its stdout open used to be waited for until `--timeout` and reported as "did not answer".
/// The process is watched as well as the pipe: the case fails at once, with the exit.
#[test]
fn a_worker_that_exits_while_its_child_holds_stdout_fails_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("worker.sh");
    std::fs::write(
        &script,
        "echo '{\"protocol\": 2, \"ops\": [\"grouped_gemm\"]}'\nread line\nsleep 300 &\nexit 7\n",
    )
    .unwrap();
    let imp = built(&format!("worker:sh {}", script.display()), 30.0);
    let start = Instant::now();
    let failed = campaign(imp.as_ref(), 1);
    let took = start.elapsed();
    let e = failed[0].as_deref().expect("the case fails");
    assert!(took < Duration::from_secs(10), "{took:?}: {e}");
    assert!(e.contains("exited with status 7"), "{e}");
}
