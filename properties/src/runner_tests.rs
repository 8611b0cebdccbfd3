use std::cell::Cell;

use super::*;
use moecheck_reference::op::RunError;

fn config(cases: u32) -> RunConfig {
    RunConfig::new(cases, 7)
}

fn numbers() -> BoxedStrategy<u32> {
    (0u32..1000).boxed()
}

fn scope_run(
    test: impl Fn(&u32) -> CaseResult,
    fit: &dyn Fn(&u32) -> Result<u32, String>,
    cases: u32,
) -> (Outcome<u32>, Coverage) {
    let edges = |x: &u32| {
        if x.is_multiple_of(2) {
            vec!["even"]
        } else {
            vec!["odd"]
        }
    };
    let scope = Scope { fit, edges: &edges };
    run_property_in(&numbers(), test, &config(cases), 0, &scope, &mut |_| {})
}

/// Refused cases are counted and redrawn, never shrunk; a failure among applied cases is
/// shrunk only through candidates that are applied.
#[test]
fn refusals_are_redrawn_and_never_shrunk() {
    let runs = Cell::new(0u32);
    let (outcome, cov) = scope_run(
        |&x| {
            runs.set(runs.get() + 1);
            if x % 3 == 0 {
                CaseResult::Refused(format!("{x} is a multiple of 3"))
            } else if x >= 500 {
                CaseResult::Fail(format!("{x} too large"))
            } else {
                CaseResult::Pass
            }
        },
        &|&x| Ok(x),
        200,
    );
    let Outcome::Failed {
        minimal, reason, ..
    } = outcome
    else {
        panic!("{outcome:?}")
    };
    // Shrunk to (about: refused candidates read as passing) the smallest failing value.
    let minimal = minimal.unwrap();
    assert!(
        (500..=502).contains(&minimal) && minimal % 3 != 0,
        "{minimal}: {reason}"
    );
    assert!(cov.applied > 0, "{cov:?}");
    // Planted: a loop that treats a refusal as a failure would stop at the first one.
    let (outcome, cov) = scope_run(
        |&x| {
            if x % 3 == 0 {
                CaseResult::Refused("no".into())
            } else {
                CaseResult::Pass
            }
        },
        &|&x| Ok(x),
        50,
    );
    assert_eq!(outcome, Outcome::Passed { cases: 50 });
    assert_eq!(cov.applied, 50);
    assert!(cov.refused > 0);
    assert_eq!(cov.last_refusal.as_deref(), Some("no"));
    assert_eq!(cov.edges.len(), 2);
}

/// More than 10 refusals per asked case stop the property: not run with none applied,
/// passed (and said so) with some.
#[test]
fn refusals_are_capped() {
    let (outcome, cov) = scope_run(|_| CaseResult::Refused("never".into()), &|&x| Ok(x), 4);
    let Outcome::NotRun { reason } = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(cov.refused, 4 * REFUSALS_PER_CASE + 1);
    assert!(
        reason.contains("41 refused") && reason.ends_with("(last: never)"),
        "{reason}"
    );
    let (outcome, cov) = scope_run(
        |&x| {
            if x < 30 {
                CaseResult::Pass
            } else {
                CaseResult::Refused("big".into())
            }
        },
        &|&x| Ok(x),
        50,
    );
    assert!(
        matches!(outcome, Outcome::Passed { cases } if cases < 50),
        "{outcome:?}"
    );
    assert!(cov
        .stopped
        .unwrap()
        .starts_with("stopped after 501 refused"));
}

/// A case outside the domain never reaches the test; the fitted case is what runs, is
/// counted for edges and is the minimal case.
#[test]
fn the_domain_fits_or_excludes_cases() {
    let seen = Cell::new(0u32);
    let (outcome, cov) = scope_run(
        |&x| {
            assert!(x % 2 == 0 && x % 5 != 0, "{x} reached the test");
            seen.set(seen.get() + 1);
            if x >= 100 {
                CaseResult::Fail("big".into())
            } else {
                CaseResult::Pass
            }
        },
        &|&x| {
            if x % 5 == 0 {
                Err(format!("{x} ends in 0 or 5"))
            } else {
                Ok(x * 2)
            }
        },
        100,
    );
    let Outcome::Failed {
        minimal, reason, ..
    } = outcome
    else {
        panic!("{outcome:?}")
    };
    // The minimal case is a fitted one (doubled, never a multiple of 5), still failing.
    let minimal = minimal.unwrap();
    assert!(minimal % 2 == 0 && minimal >= 100, "{minimal}: {reason}");
    assert_ne!((minimal / 2) % 5, 0, "{minimal}");
    assert_eq!(cov.refused, 0, "{cov:?}");
    assert_eq!(cov.edges.iter().copied().collect::<Vec<_>>(), ["even"]);
    // Everything outside: not run, cheaply.
    let (outcome, cov) = scope_run(|_| CaseResult::Pass, &|_| Err("nothing fits".into()), 3);
    assert!(matches!(outcome, Outcome::NotRun { .. }), "{outcome:?}");
    assert_eq!(cov.outside, OUTSIDE_BASE + 3 * OUTSIDE_PER_CASE + 1);
    assert_eq!(cov.applied, 0);
}

/// A failure noted inconclusive is an inconclusive case: counted, the run goes on, the
/// outcome is inconclusive when nothing failed. A failure noted broken is not shrunk.
#[test]
fn inconclusive_and_broken_cases() {
    let (outcome, cov) = scope_run(
        |&x| {
            if x % 4 == 0 {
                note_inconclusive("loose");
                CaseResult::Fail("inconclusive: loose".into())
            } else {
                CaseResult::Pass
            }
        },
        &|&x| Ok(x),
        40,
    );
    assert_eq!(
        outcome,
        Outcome::Inconclusive {
            reason: "loose".into(),
            cases: 40
        }
    );
    assert!(cov.inconclusive > 0);
    let runs = Cell::new(0u32);
    let (outcome, _) = scope_run(
        |&x| {
            runs.set(runs.get() + 1);
            if x > 10 {
                note_run_error(&RunError::broken("timed out"));
                CaseResult::Fail("run failed: timed out".into())
            } else {
                CaseResult::Pass
            }
        },
        &|&x| Ok(x),
        40,
    );
    let Outcome::Failed { minimal_case, .. } = outcome else {
        panic!("{outcome:?}")
    };
    assert!(minimal_case.contains("not shrunk"), "{minimal_case}");
    let after_first_failure = runs.get();
    assert!(
        after_first_failure < 5,
        "{after_first_failure} runs: it was shrunk"
    );
    // A refusal noted by the implementation wins over the property's failure line.
    let (outcome, cov) = scope_run(
        |_| {
            note_run_error(&RunError::refused("K = 0"));
            CaseResult::Fail("run failed: K = 0".into())
        },
        &|&x| Ok(x),
        1,
    );
    assert!(matches!(outcome, Outcome::NotRun { .. }), "{outcome:?}");
    assert_eq!(cov.refused, REFUSALS_PER_CASE + 1);
}
