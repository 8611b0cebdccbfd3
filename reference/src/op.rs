//! The one vocabulary every checked operation speaks: [`Op`], [`Implementation`], [`Verdict`]
//! and [`verify`].
//!
//! moecheck checks several operations — the grouped GEMM ([`crate::gemm::Gemm`]), the FP8
//! grouped GEMM ([`crate::fp8::Fp8Gemm`]), routing ([`crate::routing::Route`]) and the whole
//! MoE layer ([`crate::moe::MoeLayer`]). Each is an [`Op`]: a type that names its case, what an
//! implementation is asked for and declares, its outputs, the reference it is compared with
//! and the report of that comparison. Everything that is the same for every operation — the
//! implementation trait, the reference as an implementation, the verdict and `verify` — is
//! written once, here.
//!
//! The data flow of one check:
//!
//! ```text
//! case, ask ──> Op::validate ──> Op::expected (the f64 reference, in a Check mode) ─┐
//!      └──────> Implementation::run ──> outputs ──> Op::compare(precision) ──────────┴─> Verdict
//! ```
//!
//! How a case is checked is a mode of its operation ([`Op::Check`]), not another operation:
//! the grouped GEMM checked element by element or by fast verification is one [`Op`], run by
//! the same implementations, with one report type.
//!
//! An invalid case is [`Verdict::BadInput`] (the caller's error: exit 2), a crashed or
//! timed-out implementation is [`Verdict::RunFailed`] (a failed case: exit 1), and otherwise
//! the comparison decides between [`Verdict::Pass`] and [`Verdict::Fail`] — or
//! [`Verdict::Inconclusive`] when every element passed against bounds so loose that an
//! all-zero output would have passed too.

use std::fmt::Debug;

use serde::{Deserialize, Serialize};

use crate::Error;

/// An operation moecheck checks.
///
/// Implementors are marker types (`struct Gemm;`); every method is an associated function of
/// the operation, never of a value.
pub trait Op: Sized + 'static {
    /// The short name of the operation in reports and on the command line (`gemm`, `fp8`,
    /// `route`, `moe`).
    const NAME: &'static str;

    /// A validated-on-use input of one check: what an implementation runs on.
    type Case: Clone + Debug + Send + Sync;
    /// What the caller asks of an implementation besides the case (the passes of a grouped
    /// GEMM); `()` where there is nothing to choose.
    type Ask: Copy + Debug + PartialEq + Send + Sync;
    /// What the user declares about an external implementation's arithmetic (its accumulator,
    /// its compute format), from which [`Op::declared_precision`] derives the precision the
    /// bound is computed for. Built-in implementations declare their own precision.
    type Declaration: Clone + Debug + Default + PartialEq + Send + Sync;
    /// The precision an implementation declares for a case: the error bound is derived from
    /// it.
    type Precision: Clone + Debug + PartialEq + Serialize + Send + Sync;
    /// What an implementation returns: values in f64, or (the grouped GEMMs' outputs) as they
    /// were written, f32 or f64.
    type Outputs: Clone + Debug + Send + Sync;
    /// How moecheck checks a case, where there is more than one way: the grouped GEMMs'
    /// [`crate::gemm::Verify`] (every element, or fast verification); `()` for the operations
    /// checked one way. It is how moecheck checks, not something asked of the implementation:
    /// the same implementations run under every mode, and only [`Op::expected`] (and through
    /// it [`Op::compare`]) reads it.
    type Check: Copy + Debug + Default + PartialEq + Send + Sync;
    /// What the reference computes once per case for the comparison (values, magnitudes,
    /// the reference routing, the layer's forward state, ...), under the mode it was
    /// computed for.
    type Expected: Send + Sync;
    /// The comparison of one implementation's outputs with the reference.
    type Report: Comparison;
    /// What an implementation may expose of its inner steps for the properties that check
    /// them (the FP8 operands it quantised, the MoE layer's permute round trip); `()` for
    /// operations with none.
    type Internals;

    /// Checks that `case` is a legal input for `ask` (shapes, representable values, a routing
    /// configuration that fits). The error names the input and the problem.
    fn validate(case: &Self::Case, ask: Self::Ask) -> Result<(), Error>;

    /// The precision an external implementation declares with `declaration` for `case`.
    fn declared_precision(case: &Self::Case, declaration: &Self::Declaration) -> Self::Precision;

    /// The precision of the f64 reference itself (what [`Reference`] declares).
    fn reference_precision(case: &Self::Case) -> Self::Precision;

    /// Computes the reference for `case` (validating it first), for a check in mode `check`.
    fn expected(
        case: &Self::Case,
        ask: Self::Ask,
        check: Self::Check,
    ) -> Result<Self::Expected, Error>;

    /// The reference's own outputs, as an implementation would return them.
    fn reference_outputs(
        case: &Self::Case,
        ask: Self::Ask,
        expected: Self::Expected,
    ) -> Self::Outputs;

    /// Compares `got` with `expected` for an implementation that declared `precision`, in the
    /// mode `expected` was computed for. `Err` only for an invalid case; a wrong, missing or
    /// ill-shaped output is a failing report.
    fn compare(
        case: &Self::Case,
        ask: Self::Ask,
        precision: &Self::Precision,
        expected: &Self::Expected,
        got: &Self::Outputs,
    ) -> Result<Self::Report, Error>;

    /// The reference's internals, for [`Reference::internals`].
    fn reference_internals(case: &Self::Case, ask: Self::Ask) -> Option<Self::Internals> {
        let _ = (case, ask);
        None
    }
}

/// What every comparison report answers.
pub trait Comparison: Clone + Debug + Serialize + Send + Sync {
    /// Whether every checked element and rule held.
    fn passed(&self) -> bool;
    /// One line on the first (worst) failure, `None` when it passed.
    fn first_failure(&self) -> Option<String>;
    /// When every element passed but the bounds could not have caught a plainly wrong answer
    /// (an all-zero output would have passed too), one line saying where: the verdict is then
    /// [`Verdict::Inconclusive`], never a pass.
    fn inconclusive(&self) -> Option<String> {
        None
    }
}

/// Why an implementation produced no usable result: one line (the first of
/// [`RunError::message`]), naming what went wrong, and which of three kinds of failure it is
/// ([`RunErrorKind`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RunError {
    pub message: String,
    pub kind: RunErrorKind,
}

/// The three ways an implementation can produce no result, each with its own rule in a
/// campaign (`moecheck prop`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunErrorKind {
    /// It ran and failed (an exception, a non-zero exit, a missing or ill-shaped output): a
    /// failed case, shrunk like a wrong answer.
    #[default]
    Failed,
    /// It refused the case: a setting or shape outside what it implements (a worker's
    /// `{"ok": false, "unsupported": ...}`, an `exec:` program's exit 77, a built-in
    /// implementation's `supports`). The case is not applicable: never a failure, never
    /// shrunk; a single-case command exits 2 naming the reason.
    Refused,
    /// It broke the protocol or ran out of time (no greeting, an answer that is not one, a
    /// timeout): a failed case, but never shrunk (each step would pay the same timeout).
    Broken,
}

impl RunError {
    /// A failed run ([`RunErrorKind::Failed`]).
    pub fn new(message: impl Into<String>) -> RunError {
        RunError {
            message: message.into(),
            kind: RunErrorKind::Failed,
        }
    }
    /// A refused case ([`RunErrorKind::Refused`]).
    pub fn refused(reason: impl Into<String>) -> RunError {
        RunError {
            message: reason.into(),
            kind: RunErrorKind::Refused,
        }
    }
    /// A protocol failure or a timeout ([`RunErrorKind::Broken`]).
    pub fn broken(message: impl Into<String>) -> RunError {
        RunError {
            message: message.into(),
            kind: RunErrorKind::Broken,
        }
    }
    pub fn is_refusal(&self) -> bool {
        self.kind == RunErrorKind::Refused
    }
    /// The same kind of failure with another message.
    pub fn with_message(&self, message: String) -> RunError {
        RunError {
            message,
            kind: self.kind,
        }
    }
}

/// An implementation of `O` under test: the reference itself, a CPU model with planted bugs,
/// an external program, a CUDA kernel.
pub trait Implementation<O: Op> {
    /// A short name for reports (`reference`, `emulate`, `emulate[inject=…]`, `exec:CMD`).
    fn name(&self) -> String;

    /// Whether this is a CPU model of a kernel rather than the real thing. Reports say so, and
    /// a model's result is never presented as a GPU result.
    fn is_model(&self) -> bool;

    /// The precision this implementation declares for `case`; the bound is derived from it.
    fn precision(&self, case: &O::Case) -> O::Precision;

    /// `Err(reason)` when this implementation cannot run `case` as declared (a recipe or a
    /// policy it does not implement). Checked before it runs; the reason names the setting.
    fn supports(&self, case: &O::Case, ask: O::Ask) -> Result<(), String> {
        let _ = (case, ask);
        Ok(())
    }

    /// `Some(why)` when this implementation can run no case at all any more (a worker that
    /// failed to start): a campaign stops there instead of failing every case the same way.
    fn broken(&self) -> Option<RunError> {
        None
    }

    /// Whether what it writes for a slice of a case (a shard of consecutive experts of a
    /// grouped GEMM, `crate::gemm::shard`) is what it writes for that slice of the whole case,
    /// so that a case too large to hold with all its outputs may be checked a slice at a
    /// time. True for the in-process models that compute each expert on its own (the
    /// reference, `emulate`); false (the default) for every kernel under test, which is
    /// checked at the size it is given: a bug that only the whole size shows (an offset past
    /// 2^31 elements, the 200th expert's scale) must not be cut away.
    fn shardable(&self) -> bool {
        false
    }

    /// Runs `case` (already validated).
    fn run(&self, case: &O::Case, ask: O::Ask) -> Result<O::Outputs, RunError>;

    /// Its internals for `case`, when it can expose them (a CPU model can; an external program
    /// does not have to). Properties that need them say so when they are missing.
    fn internals(&self, case: &O::Case, ask: O::Ask) -> Option<O::Internals> {
        let _ = (case, ask);
        None
    }
}

/// The f64 reference as an implementation of every operation (a self-check: it must pass
/// every property of every operation).
#[derive(Debug, Clone, Copy, Default)]
pub struct Reference;

impl<O: Op> Implementation<O> for Reference {
    fn name(&self) -> String {
        "reference".into()
    }
    fn is_model(&self) -> bool {
        false
    }
    fn precision(&self, case: &O::Case) -> O::Precision {
        O::reference_precision(case)
    }
    /// Every output element is computed from its own inputs alone.
    fn shardable(&self) -> bool {
        true
    }
    fn run(&self, case: &O::Case, ask: O::Ask) -> Result<O::Outputs, RunError> {
        O::expected(case, ask, O::Check::default())
            .map(|e| O::reference_outputs(case, ask, e))
            .map_err(|e| RunError::new(e.to_string()))
    }
    fn internals(&self, case: &O::Case, ask: O::Ask) -> Option<O::Internals> {
        O::reference_internals(case, ask)
    }
}

/// The outcome of checking one implementation on one case.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict<R> {
    /// Every element inside its bound, every rule held.
    Pass(R),
    /// Every element inside its bound, but a bound that would admit an all-zero output too:
    /// the check could not tell a right answer from a wrong one (exit 3).
    Inconclusive { report: R, reason: String },
    /// The comparison found a failure; `reason` is its one line.
    Fail { report: R, reason: String },
    /// The implementation produced no result (a failed case).
    RunFailed(RunError),
    /// The case itself is invalid (the caller's input error, not the implementation's).
    BadInput(Error),
}

impl<R: Comparison> Verdict<R> {
    /// The verdict of a finished comparison.
    pub fn of(report: R) -> Verdict<R> {
        match report.first_failure() {
            None if report.passed() => match report.inconclusive() {
                Some(reason) => Verdict::Inconclusive { report, reason },
                None => Verdict::Pass(report),
            },
            reason => Verdict::Fail {
                reason: reason.unwrap_or_else(|| "failed (no detail)".into()),
                report,
            },
        }
    }
}

impl<R> Verdict<R> {
    pub fn passed(&self) -> bool {
        matches!(self, Verdict::Pass(_))
    }

    /// One line on why it did not pass, `None` when it passed.
    pub fn failure(&self) -> Option<String> {
        match self {
            Verdict::Pass(_) => None,
            Verdict::Fail { reason, .. } => Some(reason.clone()),
            Verdict::Inconclusive { reason, .. } => Some(format!("inconclusive: {reason}")),
            Verdict::RunFailed(e) if e.is_refusal() => Some(format!("not applicable: {e}")),
            Verdict::RunFailed(e) => Some(format!("run failed: {e}")),
            Verdict::BadInput(e) => Some(format!("invalid case: {e}")),
        }
    }

    /// The comparison, when there was one.
    pub fn report(&self) -> Option<&R> {
        match self {
            Verdict::Pass(r)
            | Verdict::Fail { report: r, .. }
            | Verdict::Inconclusive { report: r, .. } => Some(r),
            Verdict::RunFailed(_) | Verdict::BadInput(_) => None,
        }
    }

    /// The failed run, when the implementation produced nothing.
    pub fn run_error(&self) -> Option<&RunError> {
        match self {
            Verdict::RunFailed(e) => Some(e),
            _ => None,
        }
    }

    /// The same verdict about `f` of the report (a part of it, another view of it).
    pub fn map<S>(&self, f: impl FnOnce(&R) -> S) -> Verdict<S> {
        match self {
            Verdict::Pass(r) => Verdict::Pass(f(r)),
            Verdict::Fail { report, reason } => Verdict::Fail {
                report: f(report),
                reason: reason.clone(),
            },
            Verdict::Inconclusive { report, reason } => Verdict::Inconclusive {
                report: f(report),
                reason: reason.clone(),
            },
            Verdict::RunFailed(e) => Verdict::RunFailed(e.clone()),
            Verdict::BadInput(e) => Verdict::BadInput(e.clone()),
        }
    }

    /// What a report calls this verdict.
    pub fn kind(&self) -> VerdictKind {
        match self {
            Verdict::Pass(_) => VerdictKind::Pass,
            Verdict::Inconclusive { .. } => VerdictKind::Inconclusive,
            Verdict::RunFailed(e) if e.is_refusal() => VerdictKind::Refused,
            Verdict::Fail { .. } | Verdict::RunFailed(_) => VerdictKind::Fail,
            Verdict::BadInput(_) => VerdictKind::BadInput,
        }
    }
}

/// A verdict as reports spell it (`"pass"`, `"fail"`, ...), with the exit status it maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerdictKind {
    /// Exit 0.
    Pass,
    /// A mismatch, or the implementation failed: exit 1.
    Fail,
    /// Nothing was checked (a reference-only run, e.g. `moecheck route` without `--impl`):
    /// exit 0.
    Done,
    /// The input was invalid: exit 2.
    BadInput,
    /// Every element passed, but the bound would have passed an all-zero output too: exit 3.
    Inconclusive,
    /// The implementation refused the case (a setting or shape it does not implement):
    /// nothing was checked, exit 2 with its reason.
    Refused,
}

impl VerdictKind {
    /// The process exit status of this verdict (documented in the README).
    pub fn exit_code(self) -> u8 {
        match self {
            VerdictKind::Pass | VerdictKind::Done => 0,
            VerdictKind::Fail => 1,
            VerdictKind::BadInput | VerdictKind::Refused => 2,
            VerdictKind::Inconclusive => 3,
        }
    }

    /// `PASS`, `FAIL`, `DONE`, `BAD INPUT`, `INCONCLUSIVE`: the last line of a text report.
    pub fn shout(self) -> &'static str {
        match self {
            VerdictKind::Pass => "PASS",
            VerdictKind::Fail => "FAIL",
            VerdictKind::Done => "DONE",
            VerdictKind::BadInput => "BAD INPUT",
            VerdictKind::Inconclusive => "INCONCLUSIVE",
            VerdictKind::Refused => "NOT APPLICABLE",
        }
    }
}

/// What [`verify`] found: the precision the implementation declared, the outputs that were
/// checked (so a dump writes exactly those) and the verdict.
#[derive(Debug, Clone)]
pub struct Verified<O: Op> {
    pub precision: O::Precision,
    /// `None` when the implementation produced nothing (or the case was invalid).
    pub outputs: Option<O::Outputs>,
    pub verdict: Verdict<O::Report>,
}

/// Computes the reference, runs `imp` once and compares, in the operation's default mode
/// (every element).
pub fn verify<O: Op>(imp: &dyn Implementation<O>, case: &O::Case, ask: O::Ask) -> Verified<O> {
    verify_in(imp, case, ask, O::Check::default())
}

/// [`verify`] in mode `check` (a grouped GEMM's fast verification).
pub fn verify_in<O: Op>(
    imp: &dyn Implementation<O>,
    case: &O::Case,
    ask: O::Ask,
    check: O::Check,
) -> Verified<O> {
    match O::expected(case, ask, check) {
        Ok(expected) => verify_against(imp, case, ask, &expected),
        Err(e) => Verified {
            precision: imp.precision(case),
            outputs: None,
            verdict: Verdict::BadInput(e),
        },
    }
}

/// [`verify`] against an already computed reference `expected` of `case`.
pub fn verify_against<O: Op>(
    imp: &dyn Implementation<O>,
    case: &O::Case,
    ask: O::Ask,
    expected: &O::Expected,
) -> Verified<O> {
    let precision = imp.precision(case);
    if let Err(reason) = imp.supports(case, ask) {
        return Verified {
            precision,
            outputs: None,
            verdict: Verdict::RunFailed(RunError::refused(format!(
                "{} does not support this case: {reason}",
                imp.name()
            ))),
        };
    }
    let (outputs, verdict) = match imp.run(case, ask) {
        Err(e) => (None, Verdict::RunFailed(e)),
        Ok(got) => {
            let verdict = match O::compare(case, ask, &precision, expected, &got) {
                Ok(report) => Verdict::of(report),
                Err(e) => Verdict::BadInput(e),
            };
            (Some(got), verdict)
        }
    };
    Verified {
        precision,
        outputs,
        verdict,
    }
}
