//! The one progress indicator, on stderr: on a terminal a spinner with the elapsed time and
//! the current stage (shown when the work is large enough to wait for), or a bar over a
//! counted number of steps (benchmark repetitions, the cases of a property campaign with their
//! ETA). When stderr is not a terminal (a CI log), a run of [`LINES_THRESHOLD`] or more work
//! writes one line per stage instead (`moecheck: [0:01:23] running ...`), so a long run's log
//! says where it is.
//!
//! While a stage runs the parallel loops of the reference ([`moecheck_reference::par`]: the
//! implementation's experts, the check's groups, pass by pass), the spinner adds how far the
//! current loop is and its time left, estimated from its rate so far.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moecheck_reference::par::{meter, Meter};

use indicatif::{ProgressBar, ProgressStyle};

/// Work (multiply-adds of the case's GEMMs, or an equivalent count) from which a spinner is
/// shown: below it every command finishes in about a second.
pub const THRESHOLD: u64 = 50_000_000;

/// Work from which a run whose stderr is not a terminal writes a line per stage: DeepSeek-V3's
/// expert GEMM is 1.4·10^12; the cases tests and campaigns run are far below.
pub const LINES_THRESHOLD: u64 = 10_000_000_000;

/// A stage spinner, stage lines (stderr not a terminal, large work), or nothing.
pub struct Progress(Option<ProgressBar>, Option<Ticker>, Option<Lines>);

/// Stage lines: when the run started and the last stage written.
struct Lines {
    start: std::time::Instant,
    last: Mutex<String>,
}

/// The thread that adds the parallel loop's progress to a spinner's stage.
struct Ticker {
    stage: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    /// Joined by [`Progress::done`], so nothing draws after the spinner is cleared.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// `" — 42% of this step, about 1m 05s left"` once a loop has run a second and done
/// something; empty before (no rate to go by yet) and when it is complete.
pub fn meter_suffix(m: Meter) -> String {
    if m.total == 0 || m.done == 0 || m.done >= m.total || m.elapsed < Duration::from_secs(1) {
        return String::new();
    }
    let fraction = m.done as f64 / m.total as f64;
    format!(
        " — {:.0}% of this step, about {} left",
        100.0 * fraction,
        time_left(fraction, m.elapsed)
    )
}

/// The time left when `fraction` of the work took `elapsed`, at the same rate: `42s`,
/// `1m 05s`.
fn time_left(fraction: f64, elapsed: Duration) -> String {
    let left = (elapsed.as_secs_f64() * (1.0 - fraction) / fraction).round() as u64;
    if left >= 60 {
        format!("{}m {:02}s", left / 60, left % 60)
    } else {
        format!("{left}s")
    }
}

/// `what (i of n, about 1m 05s left)` for the `i`-th of `n` steps of a phase (1-based), the
/// time left at the rate of the `i - 1` done in `elapsed` (none before the first is done).
pub fn phase_step(what: &str, i: usize, n: usize, elapsed: Duration) -> String {
    let done = i.saturating_sub(1);
    if done == 0 || n == 0 {
        return format!("{what} ({i} of {n})");
    }
    let left = time_left(done as f64 / n as f64, elapsed);
    format!("{what} ({i} of {n}, about {left} left)")
}

impl Progress {
    /// A spinner for `work` units of work.
    pub fn new(work: u64) -> Progress {
        if !std::io::stderr().is_terminal() {
            let lines = (work >= LINES_THRESHOLD).then(|| Lines {
                start: std::time::Instant::now(),
                last: Mutex::new(String::new()),
            });
            return Progress(None, None, lines);
        }
        if work < THRESHOLD {
            return Progress(None, None, None);
        }
        let pb = ProgressBar::new_spinner();
        pb.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                .expect("valid template"),
        );
        pb.enable_steady_tick(Duration::from_millis(120));
        let stage = Arc::new(Mutex::new(String::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp, bar) = (stage.clone(), stop.clone(), pb.clone());
        let thread = std::thread::spawn(move || loop {
            std::thread::park_timeout(Duration::from_millis(250));
            if sp.load(Ordering::Relaxed) {
                break;
            }
            let base = st.lock().unwrap_or_else(|e| e.into_inner()).clone();
            bar.set_message(format!(
                "{base}{}",
                meter().map(meter_suffix).unwrap_or_default()
            ));
        });
        let ticker = Ticker {
            stage,
            stop,
            thread: Mutex::new(Some(thread)),
        };
        Progress(Some(pb), Some(ticker), None)
    }

    /// A bar counting `len` steps (repetitions of a benchmark), on a terminal.
    pub fn steps(len: u64, what: &str) -> Progress {
        Progress::bar(len, "[{elapsed_precise}] {bar:30} {pos}/{len} {msg}", what)
    }

    /// A bar over the `len` cases of a property campaign (`moecheck prop`: cases × properties)
    /// with the time left, on a terminal; [`Progress::stage`] names the current property.
    pub fn cases(len: u64) -> Progress {
        Progress::bar(
            len,
            "[{elapsed_precise}] {bar:30} {pos}/{len} cases, ETA {eta} {msg}",
            "",
        )
    }

    fn bar(len: u64, template: &str, msg: &str) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress(None, None, None);
        }
        let pb = ProgressBar::new(len);
        pb.set_style(ProgressStyle::with_template(template).expect("valid template"));
        pb.set_message(msg.to_string());
        Progress(Some(pb), None, None)
    }

    /// One step done.
    pub fn step(&self) {
        if let Some(pb) = &self.0 {
            pb.inc(1);
        }
    }

    /// `pos` steps done in all (steps that will not run count as done: a property that fails
    /// skips the rest of its cases).
    pub fn set_position(&self, pos: u64) {
        if let Some(pb) = &self.0 {
            pb.set_position(pos);
        }
    }

    /// Shows what is being done now.
    pub fn stage(&self, msg: &str) {
        if let Some(pb) = &self.0 {
            pb.set_message(msg.to_string());
        }
        if let Some(t) = &self.1 {
            *t.stage.lock().unwrap_or_else(|e| e.into_inner()) = msg.to_string();
        }
        if let Some(l) = &self.2 {
            let mut last = l.last.lock().unwrap_or_else(|e| e.into_inner());
            if *last != msg {
                eprintln!("moecheck: {}", stage_line(l.start.elapsed(), msg));
                *last = msg.to_string();
            }
        }
    }

    /// Shows step `i` of `n` (1-based, `step` naming it) of the phase `what` that began
    /// `elapsed` ago, with the time left ([`phase_step`]); stage lines write one line per
    /// phase (at its first step), not one per step.
    pub fn phase(&self, what: &str, step: &str, i: usize, n: usize, elapsed: Duration) {
        match &self.2 {
            Some(_) if i <= 1 => self.stage(&format!("{what} ({n} steps)")),
            Some(_) => {}
            None => self.stage(&phase_step(&format!("{what}: {step}"), i, n, elapsed)),
        }
    }

    /// Whether anything is drawn (a terminal, and work large enough).
    pub fn shown(&self) -> bool {
        self.0.is_some()
    }

    /// Clears the spinner.
    pub fn done(&self) {
        if let Some(t) = &self.1 {
            t.stop.store(true, Ordering::Relaxed);
            let thread = t.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(thread) = thread {
                thread.thread().unpark();
                let _ = thread.join();
            }
        }
        if let Some(pb) = &self.0 {
            pb.finish_and_clear();
        }
    }
}

/// `[h:mm:ss] msg`, the time since the run started.
fn stage_line(elapsed: Duration, msg: &str) -> String {
    let s = elapsed.as_secs();
    format!("[{}:{:02}:{:02}] {msg}", s / 3600, s / 60 % 60, s % 60)
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.done();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(done: u64, total: u64, secs: u64) -> String {
        meter_suffix(Meter {
            done,
            total,
            elapsed: Duration::from_secs(secs),
        })
    }

    #[test]
    fn stage_lines_carry_the_time_since_the_start() {
        assert_eq!(
            stage_line(Duration::from_secs(83), "running x"),
            "[0:01:23] running x"
        );
        assert_eq!(stage_line(Duration::from_secs(3725), "y"), "[1:02:05] y");
    }

    #[test]
    fn the_suffix_is_the_share_done_and_the_time_left_at_the_rate_so_far() {
        assert_eq!(at(25, 100, 10), " — 25% of this step, about 30s left");
        assert_eq!(at(1, 3, 65), " — 33% of this step, about 2m 10s left");
        // Nothing to say yet, or any more.
        assert_eq!(at(0, 100, 10), "");
        assert_eq!(at(50, 100, 0), "");
        assert_eq!(at(100, 100, 10), "");
        assert_eq!(at(0, 0, 10), "");
    }
}
