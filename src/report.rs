//! Every command's result is a [`Report`]: a readable text, a `--json` document and an exit
//! status. [`finish`] prints one and returns its status; [`RunReport`] is the report of one
//! checked (or reference-only) run of any operation, whose text and document the operation
//! itself defines ([`Reported`]).

use std::process::ExitCode;

use moecheck_reference::op::VerdictKind;
use moecheck_reference::report::{Reported, RunInfo};

/// A command's result.
pub trait Report {
    /// The readable report.
    fn text(&self) -> String;
    /// The `--json` document, pretty-printed, with a top-level `"verdict"`.
    fn json(&self) -> serde_json::Result<String>;
    /// The process exit status (0 pass, 1 fail, ...: see the README).
    fn exit_code(&self) -> u8;
}

/// Prints `report` as JSON or as text on stdout and returns its exit status.
pub fn finish(report: &dyn Report, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        crate::outln!("{}", report.json()?);
    } else {
        crate::out!("{}", report.text());
    }
    Ok(ExitCode::from(report.exit_code()))
}

/// The report of one run of operation `O`.
pub struct RunReport<O: Reported> {
    pub document: O::Document,
    pub verdict: VerdictKind,
}

impl<O: Reported> RunReport<O> {
    pub fn new(run: &RunInfo<O>) -> RunReport<O> {
        RunReport {
            document: O::document(run),
            verdict: run.verdict_kind(),
        }
    }
}

impl<O: Reported> Report for RunReport<O> {
    fn text(&self) -> String {
        O::render(&self.document)
    }
    fn json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(&self.document)
    }
    fn exit_code(&self) -> u8 {
        self.verdict.exit_code()
    }
}
