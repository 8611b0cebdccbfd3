//! The one progress indicator, on stderr and only when stderr is a terminal: a spinner with
//! the elapsed time and the current stage (shown when the work is large enough to wait for),
//! or a bar over a counted number of steps (benchmark repetitions, the cases of a property
//! campaign with their ETA).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// Work (multiply-adds of the case's GEMMs, or an equivalent count) from which a spinner is
/// shown: below it every command finishes in about a second.
pub const THRESHOLD: u64 = 50_000_000;

/// A stage spinner, or nothing (small work, or stderr is not a terminal).
pub struct Progress(Option<ProgressBar>);

impl Progress {
    /// A spinner for `work` units of work.
    pub fn new(work: u64) -> Progress {
        if work < THRESHOLD || !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let pb = ProgressBar::new_spinner();
        pb.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                .expect("valid template"),
        );
        pb.enable_steady_tick(Duration::from_millis(120));
        Progress(Some(pb))
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
            return Progress(None);
        }
        let pb = ProgressBar::new(len);
        pb.set_style(ProgressStyle::with_template(template).expect("valid template"));
        pb.set_message(msg.to_string());
        Progress(Some(pb))
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
    }

    /// Whether anything is drawn (a terminal, and work large enough).
    pub fn shown(&self) -> bool {
        self.0.is_some()
    }

    /// Clears the spinner.
    pub fn done(&self) {
        if let Some(pb) = &self.0 {
            pb.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.done();
    }
}
