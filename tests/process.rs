//! Programs that try to make moecheck hang (issue 16, items 8 and 9): every `exec:` program
//! runs in its own process group, `--timeout` ends the whole group, and moecheck never waits
//! on a pipe that a leftover process holds open.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use moecheck::impls::exec::Program;

/// Whether process `pid` is gone (a zombie waiting for a reaper that this container may not
/// have counts as gone: it runs nothing and holds nothing).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Polls `gone` for up to two seconds (the group's TERM has a short grace).
fn goes(pid: u32) -> bool {
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        if gone(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    gone(pid)
}

fn read_pid(path: &Path) -> u32 {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            Instant::now() < until,
            "{} was never written",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Ends a process this test started, by its id, if it is still there.
fn end(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}

fn program(command: String, timeout_s: f64) -> Program {
    // The failed cases it keeps go to this test binary's own $TMPDIR.
    common::own_tmpdir();
    Program {
        command,
        timeout: Duration::from_secs_f64(timeout_s),
        kept: Default::default(),
        compact: false,
    }
}

/// Item 8: `--timeout` used to kill only the `sh -c` wrapper. A program whose child would
/// outlive it is ended with it, child and all, at the timeout.
#[test]
fn a_timeout_ends_the_program_and_every_child_it_started() {
    let scratch = tempfile::tempdir().unwrap();
    let pidfile = scratch.path().join("child.pid");
    let p = program(
        format!("sleep 300 & echo $! > {}; sleep 300 #", pidfile.display()),
        1.0,
    );
    let start = Instant::now();
    let e = p.run_in(scratch.path()).unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(
        e.message
            .contains("timed out after 1.0 s (its process group was ended)"),
        "{e}"
    );
    let child = read_pid(&pidfile);
    let ended = goes(child);
    end(child);
    assert!(ended, "the child {child} outlived its program's timeout");
}

/// ... and a child left behind by a program that exits is ended with it too.
#[test]
fn a_child_left_running_by_a_finished_program_is_ended() {
    let scratch = tempfile::tempdir().unwrap();
    let pidfile = scratch.path().join("child.pid");
    let p = program(
        format!(
            "sleep 300 >/dev/null 2>&1 & echo $! > {}; exit 0 #",
            pidfile.display()
        ),
        30.0,
    );
    p.run_in(scratch.path()).expect("the program exits 0");
    let child = read_pid(&pidfile);
    let ended = goes(child);
    end(child);
    assert!(ended, "the child {child} outlived its program");
}

/// Item 9: a grandchild that keeps stderr open (`( sleep 300 ) & exit 0`) made moecheck wait
/// for the end of the pipe indefinitely, past `--timeout`. Through the binary, as the issue
/// ran it: the case fails at once (no outputs), well within the timeout.
#[test]
fn a_grandchild_holding_stderr_does_not_hold_moecheck() {
    let start = Instant::now();
    let out = common::moecheck()
        .arg("gemm")
        .args(common::SMALL_GEMM)
        .args(["--impl", "exec:( sleep 300 ) & exit 0 #"])
        .args(["--timeout", "5"])
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    let took = start.elapsed();
    assert!(took < Duration::from_secs(6), "took {took:?}");
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("run failed: "), "{text}");
}

/// A process that left the group (`setsid`) cannot be ended with it; if it keeps stderr
/// open, moecheck stops reading it a short grace after the program exits.
#[test]
fn a_process_that_escaped_the_group_and_holds_stderr_is_not_waited_for() {
    let scratch = tempfile::tempdir().unwrap();
    let pidfile = scratch.path().join("escaped.pid");
    let p = program(
        format!(
            "echo 'ValueError: from the program' >&2; setsid sleep 300 & echo $! > {}; exit 4 #",
            pidfile.display()
        ),
        30.0,
    );
    let start = Instant::now();
    let e = p.run_in(scratch.path()).unwrap_err();
    let took = start.elapsed();
    end(read_pid(&pidfile));
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(
        e.message
            .contains("exited with status 4: ValueError: from the program"),
        "{e}"
    );
}

/// The failure names the program's exception line, not the boilerplate printed after it,
/// and keeps the last lines of its stderr.
#[test]
fn a_failure_shows_the_exception_line_and_the_stderr_tail() {
    let scratch = tempfile::tempdir().unwrap();
    let script = scratch.path().join("fails.py");
    std::fs::write(
        &script,
        "import sys\nprint('loading', file=sys.stderr)\ntry:\n    raise ValueError('the shapes differ')\nexcept ValueError as e:\n    e.add_note('--------------------\\nFor simplicity, JAX has removed its internal frames.')\n    raise\n",
    )
    .unwrap();
    let p = program(format!("python3 {}", script.display()), 30.0);
    let e = p.run_in(scratch.path()).unwrap_err().message;
    let first = e.lines().next().unwrap();
    assert!(
        first.ends_with("exited with status 1: ValueError: the shapes differ"),
        "{e}"
    );
    assert!(
        e.contains("  | loading") && e.contains("  | Traceback"),
        "{e}"
    );
    assert!(e.contains("For simplicity"), "{e}");
    // The whole stderr is in the case directory.
    let kept = std::fs::read_to_string(scratch.path().join("stderr.txt")).unwrap();
    assert!(kept.starts_with("loading\nTraceback"), "{kept}");
    assert!(kept.contains("ValueError: the shapes differ"), "{kept}");
}

/// The program is out of the terminal's foreground group, so Ctrl-C reaches moecheck alone:
/// moecheck forwards it to the program's group before it ends, and leaves nothing running.
#[test]
fn an_interrupted_moecheck_ends_the_program_it_was_running() {
    let scratch = tempfile::tempdir().unwrap();
    let pidfile = scratch.path().join("child.pid");
    let mut moecheck = signals_at_default()
        .arg("gemm")
        .args(common::SMALL_GEMM)
        .arg("--impl")
        .arg(format!(
            "exec:sleep 300 & echo $! > {}; wait #",
            pidfile.display()
        ))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let child = read_pid(&pidfile);
    let interrupted = std::process::Command::new("kill")
        .args(["-INT", &moecheck.id().to_string()])
        .status()
        .unwrap();
    assert!(interrupted.success());
    let status = moecheck.wait().unwrap();
    let ended = goes(child);
    end(child);
    assert!(
        !status.success(),
        "moecheck ended as SIGINT says: {status:?}"
    );
    assert!(ended, "the program's child {child} outlived moecheck");
}

/// The names in `dir` (a run's `$TMPDIR`).
fn left_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Waits (up to 60 s) for `path` to exist.
fn appears(path: &Path) {
    let until = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        assert!(Instant::now() < until, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 42, item 5: `signal` sent to moecheck running `args` (whose program touches
/// `started` in its working directory, then sleeps) while the program holds a case: moecheck
/// ends as the signal says, and its `$TMPDIR` is left empty (no case directory with inputs).
fn interrupted_run_leaves_tmpdir_empty(args: &[String], signal: &str) {
    let root = tempfile::tempdir().unwrap();
    let tmp = root.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let mut moecheck = signals_at_default()
        .args(args)
        .current_dir(root.path())
        .env("TMPDIR", &tmp)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    appears(&root.path().join("started"));
    assert!(
        !left_in(&tmp).is_empty(),
        "the case directory is in $TMPDIR"
    );
    let sent = std::process::Command::new("kill")
        .args([signal, &moecheck.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = moecheck.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert!(status.signal().is_some(), "{args:?} {signal}: {status:?}");
    assert_eq!(left_in(&tmp), Vec::<String>::new(), "{args:?} {signal}");
}

/// The moecheck binary, started with SIGINT, SIGTERM and SIGHUP at their default actions: a
/// test run from a shell whose background jobs ignore SIGINT (`nohup cargo test &`) would
/// otherwise pass that on, and moecheck keeps an ignored signal ignored
/// (src/impls/interrupt.rs), so these tests would wait out the program's `sleep 300`.
fn signals_at_default() -> std::process::Command {
    use std::os::unix::process::CommandExt as _;
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_moecheck"));
    // SAFETY: between fork and exec only `signal`, which is async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(s, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    c
}

fn strings(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

#[test]
fn an_interrupted_exec_run_leaves_tmpdir_empty() {
    let mut args = strings(&["gemm", "--impl", "exec:touch started; sleep 300 #"]);
    args.extend(strings(&common::SMALL_GEMM));
    interrupted_run_leaves_tmpdir_empty(&args, "-INT");
    let mut args = strings(&["prop", "--op", "gemm", "--cases", "3", "--impl"]);
    args.push("exec:touch started; sleep 300 #".into());
    interrupted_run_leaves_tmpdir_empty(&args, "-TERM");
}

#[test]
fn an_interrupted_worker_run_leaves_tmpdir_empty() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("worker.sh");
    std::fs::write(
        &script,
        "echo '{\"protocol\": 2, \"ops\": [\"grouped_gemm\"]}'\nread line\ntouch started\nsleep 300\n",
    )
    .unwrap();
    let imp = format!("worker:sh {}", script.display());
    let mut args = strings(&["gemm", "--impl", &imp]);
    args.extend(strings(&common::SMALL_GEMM));
    interrupted_run_leaves_tmpdir_empty(&args, "-TERM");
    let args = strings(&["prop", "--op", "gemm", "--cases", "3", "--impl", &imp]);
    interrupted_run_leaves_tmpdir_empty(&args, "-INT");
}
