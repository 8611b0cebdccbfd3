//! The files a user names for moecheck to write (`--junit`, `--plot`, `--log`, `--dump`,
//! `--out`), driven through the real binary: a special file is written in place and never
//! replaced, a symbolic link is refused and its target left alone, a new file's mode follows
//! the umask, a file that cannot be written is refused before the run, and a write that fails
//! after the run (a full disk) still prints the report, then exits 2 naming the flag.
//! See: issue 42, items 1, 2, 7, 12, 17, and "train --compare --out FILE".

mod common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;

use common::moecheck;

/// A short passing campaign: one property, two cases.
const PROP: [&str; 10] = [
    "prop",
    "--op",
    "gemm",
    "--impl",
    "emulate",
    "--property",
    "k-zero",
    "--cases",
    "2",
    "--seed",
];

fn prop(junit: &Path, dir: &Path) -> Output {
    moecheck()
        .current_dir(dir)
        .args(PROP)
        .arg("1")
        .arg("--junit")
        .arg(junit)
        .output()
        .unwrap()
}

/// `moecheck ARGS` in `dir` on a "full disk": no regular file may grow (`ulimit -f 0`, with
/// `SIGXFSZ` ignored so that a write fails with `EFBIG` instead of killing the process).
fn on_a_full_disk(args: &[&str], dir: &Path) -> Output {
    std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -f 0 && trap '' XFSZ && exec \"$@\"")
        .arg("sh")
        .arg(assert_cmd::cargo::cargo_bin("moecheck"))
        .args(args)
        .current_dir(dir)
        .env("TMPDIR", dir)
        .output()
        .unwrap()
}

/// A FIFO at `path` and a thread that reads it whole (what was written through it).
fn fifo(path: &Path) -> std::thread::JoinHandle<Vec<u8>> {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success());
    let p = path.to_path_buf();
    std::thread::spawn(move || std::fs::read(p).unwrap())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// This process's umask (Linux), which the binary inherits.
fn umask() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Umask:")).unwrap();
    u32::from_str_radix(line["Umask:".len()..].trim(), 8).unwrap()
}

#[test]
fn junit_to_a_fifo_is_written_in_place_not_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let pipe = tmp.path().join("report.pipe");
    let reader = fifo(&pipe);
    let o = prop(&pipe, tmp.path());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(std::fs::symlink_metadata(&pipe)
        .unwrap()
        .file_type()
        .is_fifo());
    let xml = text(&reader.join().unwrap());
    assert!(
        xml.contains("<testsuite name=\"moecheck prop gemm\""),
        "{xml}"
    );
}

#[test]
fn junit_through_a_symbolic_link_is_refused_and_its_target_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("mine.xml");
    std::fs::write(&target, "mine").unwrap();
    let link = tmp.path().join("link.xml");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let o = prop(&link, tmp.path());
    let stderr = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--junit") && stderr.contains("symbolic link"),
        "{stderr}"
    );
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "mine");
}

#[test]
fn a_new_junit_file_has_the_umask_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("report.xml");
    let o = prop(&file, tmp.path());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o666 & !umask(), "mode {mode:o}");
}

#[test]
fn an_unwritable_junit_directory_is_refused_before_the_campaign_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("ran");
    // Nobody, root included, may create a file in /proc/self.
    let o = moecheck()
        .current_dir(tmp.path())
        .args(["prop", "--op", "gemm", "--cases", "1", "--impl"])
        .arg(format!("exec:touch {}", marker.display()))
        .args(["--junit", "/proc/self/report.xml"])
        .output()
        .unwrap();
    let stderr = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--junit /proc/self/report.xml"), "{stderr}");
    assert!(
        !marker.exists(),
        "the campaign ran before --junit was refused"
    );
}

#[test]
fn a_full_disk_still_prints_the_prop_report_then_exits_2() {
    let tmp = tempfile::tempdir().unwrap();
    let mut args: Vec<&str> = PROP.to_vec();
    args.extend(["1", "--junit", "report.xml"]);
    let o = on_a_full_disk(&args, tmp.path());
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stdout.contains("verdict: PASS"), "{stdout}");
    assert!(stderr.contains("--junit report.xml"), "{stderr}");
    // A minimal case under --out that cannot be written loses no report either.
    let o = on_a_full_disk(
        &[
            "prop",
            "--op",
            "gemm",
            "--impl",
            "emulate",
            "--inject",
            "k-zero-garbage",
            "--property",
            "k-zero",
            "--cases",
            "8",
            "--seed",
            "5",
            "--json",
        ],
        tmp.path(),
    );
    let stderr = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["verdict"], "fail");
    assert!(stderr.contains("--out"), "{stderr}");
}

#[test]
fn a_full_disk_still_prints_the_gemm_verdict_then_exits_2() {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = vec!["gemm", "--impl", "reference", "--dump", "case"];
    args.extend(common::SMALL_GEMM);
    let o = on_a_full_disk(&args, tmp.path());
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stdout.contains("verdict: PASS"), "{stdout}");
    assert!(stderr.contains("--dump case"), "{stderr}");
}

#[test]
fn plot_through_a_symbolic_link_is_refused_before_reading() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("mine.png");
    std::fs::write(&target, "mine").unwrap();
    let link = tmp.path().join("gap.png");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let fixture = |n: &str| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/curves")
            .join(n)
    };
    let o = moecheck()
        .args(["curves", "diff"])
        .arg(fixture("native.log"))
        .arg(fixture("te.log"))
        .arg("--plot")
        .arg(&link)
        .output()
        .unwrap();
    let stderr = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--plot") && stderr.contains("symbolic link"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "mine");
}

const TRAIN: [&str; 15] = [
    "train",
    "--experts",
    "4",
    "--hidden",
    "8",
    "--ffn",
    "8",
    "--vocab",
    "8",
    "--batch",
    "32",
    "--layers",
    "1",
    "--steps",
    "2",
];

#[test]
fn an_empty_train_log_left_by_an_interrupt_is_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    // What a run stopped before its first step leaves (Ctrl-C, a full disk).
    let log = tmp.path().join("run.jsonl");
    std::fs::write(&log, "").unwrap();
    let o = moecheck()
        .args(TRAIN)
        .args(["--impl", "reference", "--log"])
        .arg(&log)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let written = std::fs::read_to_string(&log).unwrap();
    assert_eq!(written.lines().count(), 2, "{written}");
}

#[test]
fn train_compare_out_naming_a_file_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "mine").unwrap();
    let o = moecheck()
        .args(TRAIN)
        .args(["--impl", "reference", "--compare", "--out"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--out") && stderr.contains("is not a directory"),
        "{stderr}"
    );
    assert!(!stderr.contains("os error"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
}

/// Issue 42 item 6: two `gemm --dump DIR` at once used to leave, about one try in 13, one
/// run's `case.json` and outputs beside the other's inputs, which `check` then judged. Each
/// run now writes its directory beside DIR and renames it over DIR: whichever wins, DIR is one
/// whole run, and `check` passes it.
#[test]
fn two_dumps_at_once_leave_one_whole_case() {
    // Same shapes, other values: the runs write at the same moments.
    const ROUNDS: usize = 40;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("case");
    let run = |tokens: &str, seed: &str| {
        let mut c = std::process::Command::new(assert_cmd::cargo::cargo_bin("moecheck"));
        c.args([
            "gemm",
            "--impl",
            "reference",
            "--experts",
            "8",
            "--hidden",
            "64",
        ])
        .args(["--ffn", "64", "--tokens", tokens, "--seed", seed, "--dump"])
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
        c.spawn().unwrap()
    };
    for round in 0..ROUNDS {
        let (mut a, mut b) = (run("300", "1"), run("300", "2"));
        assert!(a.wait().unwrap().success() && b.wait().unwrap().success());
        let o = moecheck().arg("check").arg(&dir).output().unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "round {round}: {}{}",
            text(&o.stdout),
            text(&o.stderr)
        );
    }
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "nothing but the case is left beside it");
}
