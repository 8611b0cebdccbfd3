//! `moecheck bench --end-to-end`: whole `moecheck gemm` runs as a user starts them, each in
//! its own process, with wall time, peak memory (the child's maximum resident set, from
//! `wait4`) and verdict, beside three dense f64 GEMMs of the mid-size case's FLOPs measured in
//! the same run. The default cases are the sizes issue 13 sets targets for; `--case` replaces
//! them.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Instant;

use ndarray::Array2;

/// One end-to-end case: a `moecheck` command line and the target it is held to.
#[derive(Debug, Clone, serde::Serialize)]
pub struct E2eCase {
    pub args: Vec<String>,
    pub target: String,
}

/// The mid size of issue 13: E = 64, M = 4096 rows, K = 2048, N = 1024.
const MID: &str = "gemm --experts 64 --tokens 512 --topk 8 --hidden 2048 --ffn 1024";
/// DeepSeek-V3's expert GEMM: 256 experts, 4096 tokens × top-8, 7168 × 2048 weights.
const DEEPSEEK: &str = "gemm --experts 256 --tokens 4096 --topk 8 --hidden 7168 --ffn 2048";

/// The cases of issue 13's targets.
pub fn default_cases() -> Vec<E2eCase> {
    let case = |base: &str, more: &str, target: &str| E2eCase {
        args: format!("{base} {more}")
            .split_whitespace()
            .map(String::from)
            .collect(),
        target: target.into(),
    };
    vec![
        case(
            MID,
            "--impl reference --verify full",
            "<= 4x three dense GEMMs, <= 1.5 GB",
        ),
        case(MID, "--impl emulate --verify full", "-"),
        case(MID, "--impl emulate --verify fast", "-"),
        case(MID, "--dtype fp8 --impl emulate --verify full", "-"),
        case(MID, "--dtype fp8 --impl emulate --verify fast", "-"),
        case(
            DEEPSEEK,
            "--impl emulate --verify fast",
            "<= 90 s, <= 16 GiB",
        ),
        case(
            DEEPSEEK,
            "--impl emulate --verify full",
            "<= 6 min, <= 16 GiB",
        ),
        case(
            DEEPSEEK,
            "--dtype fp8 --impl emulate --verify fast",
            "<= 5 min",
        ),
        // What fits on a 24 GiB machine today: the forward pass alone, checked in full.
        case(DEEPSEEK, "--impl emulate --passes fwd --verify fast", "-"),
        case(DEEPSEEK, "--impl emulate --passes fwd --verify full", "-"),
    ]
}

/// What one case did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct E2eResult {
    pub command: String,
    pub target: String,
    /// The exit status (2: refused, e.g. by the memory guard).
    pub exit: Option<i32>,
    /// PASS / FAIL / INCONCLUSIVE from the report, or why there is none.
    pub verdict: String,
    /// The median of the runs' wall times; the run it comes from gives the exit, verdict and
    /// CPU times.
    pub wall_s: f64,
    /// Every run's wall time, in order (`--runs`).
    pub runs_s: Vec<f64>,
    /// CPU time the child spent in user space and in the kernel (on a virtual machine, much
    /// of the latter is the host providing memory touched for the first time).
    pub user_s: f64,
    pub sys_s: f64,
    /// The child's peak resident memory in bytes (the largest over the runs).
    pub peak_bytes: u64,
    /// `wall_s` over the three dense GEMMs' time (timed after every case ran).
    pub dense_ratio: f64,
}

/// Runs `case` as a child of this executable and measures it.
fn run_case(case: &E2eCase) -> anyhow::Result<E2eResult> {
    let exe = std::env::current_exe()?;
    let start = Instant::now();
    let mut child = Command::new(exe)
        .args(&case.args)
        .arg("--json")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let err = drain(Box::new(child.stderr.take().expect("piped")));
    let (status, peak, user_s, sys_s) = match wait_with_peak(child.id()) {
        Ok(waited) => waited,
        Err(e) => {
            // Not left running behind us.
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    let wall_s = start.elapsed().as_secs_f64();
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    let verdict = serde_json::from_str::<serde_json::Value>(&out)
        .ok()
        .and_then(|v| v.get("verdict")?.as_str().map(str::to_uppercase))
        .unwrap_or_else(|| {
            let last = err.trim().lines().last().unwrap_or("no report").trim();
            format!("none: {last}")
        });
    Ok(E2eResult {
        command: format!(
            "moecheck {}",
            shlex::try_join(case.args.iter().map(String::as_str))
                .unwrap_or_else(|_| case.args.join(" "))
        ),
        target: case.target.clone(),
        exit: status,
        verdict,
        wall_s,
        runs_s: vec![wall_s],
        user_s,
        sys_s,
        peak_bytes: peak,
        dense_ratio: f64::NAN,
    })
}

/// Runs `case` `runs` times (at least once): the median run by wall time, with every run's
/// wall time and the largest peak.
fn run_repeated(case: &E2eCase, runs: usize) -> anyhow::Result<E2eResult> {
    let mut all = (0..runs.max(1))
        .map(|_| run_case(case))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let walls: Vec<f64> = all.iter().map(|r| r.wall_s).collect();
    let peak = all.iter().map(|r| r.peak_bytes).max().unwrap_or(0);
    all.sort_by(|a, b| a.wall_s.total_cmp(&b.wall_s));
    let mut median = all.swap_remove(all.len() / 2);
    median.runs_s = walls;
    median.peak_bytes = peak;
    Ok(median)
}

/// Waits for process `pid` (a child of this one): its exit code (None when killed by a
/// signal), peak resident set in bytes, and user and system CPU seconds.
fn wait_with_peak(pid: u32) -> anyhow::Result<(Option<i32>, u64, f64, f64)> {
    let mut status = 0;
    // SAFETY: plain FFI call with valid out-pointers; `pid` is our own unwaited child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        let r = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
        if r >= 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        // Interrupted by a signal whose handler returned: wait again.
        if e.kind() != std::io::ErrorKind::Interrupted {
            anyhow::bail!("wait4: {e}");
        }
    }
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    // Linux reports ru_maxrss in KiB.
    Ok((
        code,
        (usage.ru_maxrss.max(0) as u64) * 1024,
        secs(usage.ru_utime),
        secs(usage.ru_stime),
    ))
}

/// Seconds for three dense f64 GEMMs `(M × K)·(K × N)` (the FLOPs of the three passes of a
/// grouped GEMM with every row routed): three times the median of five timed calls.
pub fn dense_three(m: usize, k: usize, n: usize) -> f64 {
    let a = Array2::<f64>::from_shape_fn((m, k), |(i, j)| ((i * 7 + j * 13) % 17) as f64 - 8.0);
    let b = Array2::<f64>::from_shape_fn((k, n), |(i, j)| ((i * 3 + j * 5) % 11) as f64 - 5.0);
    let mut c = Array2::<f64>::zeros((m, n));
    let mut times: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            ndarray::linalg::general_mat_mul(1.0, &a, &b, 0.0, &mut c);
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    3.0 * times[2]
}

/// Runs every case, then times the dense GEMMs (after the cases: a child's peak memory
/// counts what this process held when it started the child), and prints the table (or the
/// whole document with `json`).
///
/// With `runs > 1` each case runs that many times in a row and its row is the median run
/// (the machines are shared and noisy: one run can be off by half).
pub fn run(cases: &[E2eCase], runs: usize, json: bool) -> anyhow::Result<()> {
    let mut results = Vec::new();
    let bar = moecheck::progress::Progress::steps(cases.len() as u64, "cases");
    for case in cases {
        bar.stage(&format!("moecheck {}", case.args.join(" ")));
        results.push(run_repeated(case, runs)?);
        bar.step();
    }
    bar.done();
    let dense3 = dense_three(4096, 2048, 1024);
    for r in &mut results {
        r.dense_ratio = r.wall_s / dense3;
    }
    if json {
        let doc = serde_json::json!({ "dense_three_s": dense3, "runs": runs, "cases": results });
        moecheck::outln!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    moecheck::outln!(
        "three dense f64 GEMMs of 4096 x 2048 x 1024 (the mid case's FLOPs): {dense3:.2} s"
    );
    moecheck::outln!(
        "{:>9} {:>8} {:>8} {:>9} {:>8}  {:<12} {:<36} command",
        "wall s",
        "user s",
        "sys s",
        "peak GiB",
        "x dense",
        "verdict",
        "target"
    );
    for r in &results {
        moecheck::outln!(
            "{:>9.1} {:>8.1} {:>8.1} {:>9.2} {:>8.1}  {:<12} {:<36} {}",
            r.wall_s,
            r.user_s,
            r.sys_s,
            r.peak_bytes as f64 / (1u64 << 30) as f64,
            r.dense_ratio,
            short(&r.verdict),
            r.target,
            r.command
        );
        if r.runs_s.len() > 1 {
            let walls: Vec<String> = r.runs_s.iter().map(|w| format!("{w:.1}")).collect();
            moecheck::outln!("          runs: {} s", walls.join(" / "));
        }
        if r.verdict.starts_with("none") {
            moecheck::outln!("          {}", r.verdict);
        }
    }
    Ok(())
}

/// The verdict column: the verdict, or `refused`/`error` when there is none.
fn short(verdict: &str) -> &str {
    if verdict.starts_with("none") {
        "no verdict"
    } else {
        verdict
    }
}
