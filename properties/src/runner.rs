//! The one property loop: draws cases deterministically from a seed, runs a test on each,
//! redraws rejected cases, and shrinks the first failure quietly within a step budget. Every
//! property of every operation runs through [`run_property_observed`]; the minimal arguments
//! come back in the [`Outcome`], and an observer hears of every case and shrink step (for a
//! progress bar) without anything being printed.

use proptest::strategy::{BoxedStrategy, Strategy, ValueTree};

use crate::coverage::{as_drawn, no_edges, take_notes, Notes};
pub use crate::coverage::{
    note_inconclusive, note_run_error, Coverage, Scope, OUTSIDE_BASE, OUTSIDE_PER_CASE,
    REFUSALS_PER_CASE,
};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// How many cases, from which seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunConfig {
    pub cases: u32,
    pub seed: u64,
    /// Most shrink steps after a failure (each step runs the property once). When they run
    /// out, the run stops quietly and the minimal case says so; nothing goes to stderr
    /// (`tests/cli.rs` checks the selftest's stderr).
    pub max_shrink_iters: u32,
}

/// Cases when `PROPTEST_CASES` is not set.
pub const DEFAULT_CASES: u32 = 64;
/// Seed when none is given.
pub const DEFAULT_SEED: u64 = 0x6d6f_6563_6865_636b; // "moecheck"
/// Shrink steps after a failure when none are given: enough for a grouped-GEMM failure to
/// shrink all the way (to one row, `K = 1`, `N = 1` for most planted bugs; 256 steps stop at
/// about a dozen rows, `K = 6`, `N = 9`).
pub const DEFAULT_MAX_SHRINK_ITERS: u32 = 1024;

impl RunConfig {
    pub fn new(cases: u32, seed: u64) -> RunConfig {
        RunConfig {
            cases,
            seed,
            max_shrink_iters: DEFAULT_MAX_SHRINK_ITERS,
        }
    }
}

impl Default for RunConfig {
    /// `PROPTEST_CASES` (or 64) cases from [`DEFAULT_SEED`].
    fn default() -> Self {
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(DEFAULT_CASES);
        RunConfig::new(cases, DEFAULT_SEED)
    }
}

/// The result of checking one property whose cases are built from arguments `A`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<A> {
    Passed {
        cases: u32,
    },
    Failed {
        /// The failure's one line, on the minimal case.
        reason: String,
        /// The minimal arguments as text (their `Debug`), saying so when the shrink budget
        /// ran out; empty when the run was aborted.
        minimal_case: String,
        /// The minimal arguments themselves; `None` when the run was aborted (too many
        /// rejected cases, or no case could be drawn).
        minimal: Option<A>,
        /// Cases that passed before the first failing one.
        passed: u32,
    },
    /// The property cannot be checked against this implementation: it checks something the
    /// implementation does not expose (its quantised operands, its permutation), or its
    /// declaration relaxes the rule the property checks. Nothing was checked; it is neither a
    /// pass nor a failure.
    NotApplicable {
        /// Why, naming the implementation and what it does not expose.
        reason: String,
    },
    /// No case failed, but at least one was inconclusive: every element inside bounds so
    /// loose that an all-zero output would have passed too.
    Inconclusive {
        /// The first inconclusive case's reason.
        reason: String,
        /// Cases checked (passed or inconclusive).
        cases: u32,
    },
    /// No case could be applied: every drawn case was outside the declared domain or refused
    /// by the implementation (a `K = 0` property against a kernel that refuses `K = 0`).
    NotRun {
        /// Why, with the last refusal.
        reason: String,
    },
}

impl<A> Outcome<A> {
    pub fn passed(&self) -> bool {
        matches!(self, Outcome::Passed { .. })
    }
}

/// What the loop has just done, as an observer hears it ([`run_property_observed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A drawn case passed (one of [`RunConfig::cases`]).
    Passed,
    /// A drawn case was rejected and another is drawn.
    Rejected,
    /// A drawn case was refused by the implementation, or fell outside the declared domain:
    /// not applicable, another is drawn.
    Refused,
    /// A case failed: shrinking starts.
    Failed,
    /// One shrink step ran (the `n`-th).
    Shrunk(u32),
}

/// The 32-byte ChaCha seed for `seed`.
pub(crate) fn seed_bytes(seed: u64) -> [u8; 32] {
    let mut b = [0u8; 32];
    for (i, chunk) in b.chunks_mut(8).enumerate() {
        let v = seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// A property's verdict on one case.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum CaseResult {
    Pass,
    /// The implementation violates the property.
    Fail(String),
    /// The case cannot test the property (near a non-differentiable boundary, or lacking what
    /// the property needs): draw another. While shrinking, a rejected case counts as not failing.
    Reject(String),
    /// The implementation does not expose what the property checks (an external program has
    /// no internals to show): the whole run ends as [`Outcome::NotApplicable`]. While
    /// shrinking, it counts as not failing.
    NotApplicable(String),
    /// The implementation refused the case (not applicable: counted, redrawn, never shrunk).
    Refused(String),
    /// Every element passed inside bounds that would have passed an all-zero output too.
    Inconclusive(String),
    /// The implementation broke the protocol or timed out: a failure that is not shrunk.
    Broken(String),
}

impl CaseResult {
    /// The result of a case whose checks returned `self` while noting `notes`.
    fn with_notes(self, notes: Notes) -> CaseResult {
        match (self, notes) {
            (CaseResult::NotApplicable(r), _) => CaseResult::NotApplicable(r),
            (
                _,
                Notes {
                    refused: Some(r), ..
                },
            ) => CaseResult::Refused(r),
            (CaseResult::Fail(r), Notes { broken: true, .. }) => CaseResult::Broken(r),
            (
                CaseResult::Fail(_),
                Notes {
                    inconclusive: Some(r),
                    ..
                },
            ) => CaseResult::Inconclusive(r),
            (result, _) => result,
        }
    }
}

impl From<Result<(), String>> for CaseResult {
    fn from(r: Result<(), String>) -> CaseResult {
        match r {
            Ok(()) => CaseResult::Pass,
            Err(reason) => CaseResult::Fail(reason),
        }
    }
}

/// Runs `test` on `config.cases` values drawn deterministically from `config.seed` and shrinks
/// the first failure within [`RunConfig::max_shrink_iters`] steps, silently.
///
/// Shrinking is proptest's own walk (`simplify` after a failing case, `complicate` after a
/// passing one), driven here rather than by `TestRunner::run` so that its step budget ends it
/// silently: when the budget runs out the minimal case says so, instead of proptest printing
/// "Aborting shrinking" to stderr. A panic inside the implementation counts as a failure of
/// the case.
/// Every property family (grouped GEMM, FP8, routing, MoE layer) runs through this one loop.
pub fn run_property<A: std::fmt::Debug + Clone>(
    strategy: &BoxedStrategy<A>,
    test: impl Fn(&A) -> Result<(), String>,
    config: &RunConfig,
) -> Outcome<A> {
    let test = |args: &A| match test(args) {
        Ok(()) => CaseResult::Pass,
        Err(reason) => CaseResult::Fail(reason),
    };
    run_property_with_rejects(strategy, test, config, 0)
}

/// [`run_property`] for properties that may reject a case: a rejected case is redrawn and does
/// not count; more than `max_rejects` rejections in all end the run as a failure ("aborted"),
/// so a property that rejects everything cannot pass vacuously.
pub fn run_property_with_rejects<A: std::fmt::Debug + Clone>(
    strategy: &BoxedStrategy<A>,
    test: impl Fn(&A) -> CaseResult,
    config: &RunConfig,
    max_rejects: u32,
) -> Outcome<A> {
    run_property_observed(strategy, test, config, max_rejects, &mut |_| {})
}

/// [`run_property_with_rejects`], telling `observe` of every case and shrink step as it goes
/// (the loop itself prints nothing).
pub fn run_property_observed<A: std::fmt::Debug + Clone>(
    strategy: &BoxedStrategy<A>,
    test: impl Fn(&A) -> CaseResult,
    config: &RunConfig,
    max_rejects: u32,
    observe: &mut dyn FnMut(Step),
) -> Outcome<A> {
    let scope = Scope {
        fit: &as_drawn::<A>,
        edges: &no_edges::<A>,
    };
    run_property_in(strategy, test, config, max_rejects, &scope, observe).0
}

/// [`run_property_observed`] with the cases drawn in `scope`, returning how they met the
/// implementation's contract beside the outcome.
///
/// A drawn case outside the scope's domain is redrawn without running anything; one the
/// implementation refuses ([`CaseResult::Refused`]) is counted and redrawn, never shrunk.
/// After more than [`REFUSALS_PER_CASE`] refusals per asked case (or [`OUTSIDE_BASE`] +
/// [`OUTSIDE_PER_CASE`] per asked case outside the domain) the property stops: passed on the
/// cases it applied ([`Coverage::stopped`] says so), or [`Outcome::NotRun`] when it applied
/// none. An inconclusive case is counted and the run goes on; a failure of a broken protocol
/// or a timeout ([`CaseResult::Broken`]) is reported unshrunk. While shrinking, a candidate
/// outside the domain, refused, inconclusive or broken counts as not failing.
pub fn run_property_in<A: std::fmt::Debug + Clone>(
    strategy: &BoxedStrategy<A>,
    test: impl Fn(&A) -> CaseResult,
    config: &RunConfig,
    max_rejects: u32,
    scope: &Scope<'_, A>,
    observe: &mut dyn FnMut(Step),
) -> (Outcome<A>, Coverage) {
    let mut coverage = Coverage::default();
    let outcome = run_loop(
        strategy,
        test,
        config,
        max_rejects,
        scope,
        observe,
        &mut coverage,
    );
    (outcome, coverage)
}

fn run_loop<A: std::fmt::Debug + Clone>(
    strategy: &BoxedStrategy<A>,
    test: impl Fn(&A) -> CaseResult,
    config: &RunConfig,
    max_rejects: u32,
    scope: &Scope<'_, A>,
    observe: &mut dyn FnMut(Step),
    coverage: &mut Coverage,
) -> Outcome<A> {
    let aborted = |reason: String, passed: u32| Outcome::Failed {
        reason,
        minimal_case: String::new(),
        minimal: None,
        passed,
    };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes(config.seed));
    let cfg = Config {
        cases: config.cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(cfg, rng);
    let test = |drawn: &A| -> (CaseResult, Option<A>) {
        let args = match (scope.fit)(drawn) {
            Ok(args) => args,
            Err(why) => {
                return (
                    CaseResult::Refused(format!("outside the declared domain: {why}")),
                    None,
                )
            }
        };
        take_notes();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(&args)))
            .unwrap_or_else(|panic| {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".into());
                CaseResult::Fail(format!("panicked: {msg}"))
            });
        (result.with_notes(take_notes()), Some(args))
    };
    let refusal_cap = config.cases.saturating_mul(REFUSALS_PER_CASE);
    let outside_cap = OUTSIDE_BASE.saturating_add(config.cases.saturating_mul(OUTSIDE_PER_CASE));
    let (mut passed, mut rejects) = (0u32, 0u32);
    let mut first_inconclusive: Option<String> = None;
    while passed < config.cases {
        let mut tree = match strategy.new_tree(&mut runner) {
            Ok(tree) => tree,
            Err(reason) => return aborted(format!("aborted: {reason}"), passed),
        };
        let (result, fitted) = test(&tree.current());
        let ran = !matches!(
            result,
            CaseResult::Refused(_) | CaseResult::Reject(_) | CaseResult::NotApplicable(_)
        );
        if let (Some(args), true) = (&fitted, ran) {
            coverage.applied += 1;
            coverage.edges.extend((scope.edges)(args));
        }
        let mut reason = match result {
            CaseResult::Pass => {
                passed += 1;
                observe(Step::Passed);
                continue;
            }
            CaseResult::Inconclusive(why) => {
                passed += 1;
                coverage.inconclusive += 1;
                first_inconclusive.get_or_insert(why);
                observe(Step::Passed);
                continue;
            }
            CaseResult::Refused(why) => {
                if fitted.is_some() {
                    coverage.refused += 1;
                } else {
                    coverage.outside += 1;
                }
                coverage.last_refusal = Some(why);
                observe(Step::Refused);
                if coverage.refused > refusal_cap || coverage.outside > outside_cap {
                    let last = coverage.last_refusal.clone().unwrap_or_default();
                    if passed == 0 {
                        let reason = format!(
                            "no case could be applied: {} refused, {} outside the domain (last: {last})",
                            coverage.refused, coverage.outside
                        );
                        return Outcome::NotRun { reason };
                    }
                    let why = format!(
                        "stopped after {} refused and {} out-of-domain cases with {passed} of {} applied (last: {last})",
                        coverage.refused, coverage.outside, config.cases
                    );
                    coverage.stopped = Some(why);
                    break;
                }
                continue;
            }
            CaseResult::Broken(reason) => {
                observe(Step::Failed);
                let minimal = fitted.unwrap_or_else(|| tree.current());
                return Outcome::Failed {
                    reason,
                    minimal_case: format!(
                        "{minimal:?} (not shrunk: the implementation broke the protocol or timed out)"
                    ),
                    minimal: Some(minimal),
                    passed,
                };
            }
            CaseResult::Reject(why) => {
                rejects += 1;
                observe(Step::Rejected);
                if rejects > max_rejects {
                    return aborted(
                        format!(
                            "aborted: {rejects} cases rejected after {passed} passed (last: {why})"
                        ),
                        passed,
                    );
                }
                continue;
            }
            CaseResult::NotApplicable(reason) => return Outcome::NotApplicable { reason },
            CaseResult::Fail(reason) => reason,
        };
        observe(Step::Failed);
        let mut minimal = fitted.unwrap_or_else(|| tree.current());
        let mut steps = 0u32;
        let mut more = tree.simplify();
        while more {
            if steps >= config.max_shrink_iters {
                return Outcome::Failed {
                    reason,
                    minimal_case: format!(
                        "{minimal:?} (shrinking stopped after {steps} steps, the budget)"
                    ),
                    minimal: Some(minimal),
                    passed,
                };
            }
            steps += 1;
            observe(Step::Shrunk(steps));
            match test(&tree.current()) {
                (CaseResult::Fail(r), Some(args)) => {
                    (reason, minimal) = (r, args);
                    more = tree.simplify();
                }
                _ => more = tree.complicate(),
            }
        }
        return Outcome::Failed {
            reason,
            minimal_case: format!("{minimal:?}"),
            minimal: Some(minimal),
            passed,
        };
    }
    if let Some(reason) = first_inconclusive {
        return Outcome::Inconclusive {
            reason,
            cases: passed,
        };
    }
    Outcome::Passed { cases: passed }
}

#[cfg(test)]
#[path = "runner_tests.rs"]
mod tests;
