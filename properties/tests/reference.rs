//! The properties hold for the reference and fail for deliberately wrong implementations.

use moecheck_properties::gemm::{any_case, case_args, Require};
use moecheck_properties::{check, verified, Outcome, PropertyOp, RunConfig};
use moecheck_reference::gemm::{Gemm, GemmOutputs, GroupedGemmCase, Passes, Precision};
use moecheck_reference::op::{Implementation, Reference, RunError};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// The macro form, so proptest persists regressions under `proptest-regressions/`.
    #[test]
    fn reference_matches_itself_on_every_pass(args in any_case()) {
        let case = args.build();
        let r = verified::<Gemm>(&Reference, &case, Passes::ALL);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }

    #[test]
    fn generated_cases_are_valid(args in case_args(Require { tail: true, empty_expert: true, ..Require::default() })) {
        let case = args.build();
        prop_assert!(case.validate(Passes::ALL).is_ok());
        prop_assert!(case.m() > case.rows_used());
        prop_assert!(case.group_sizes.contains(&0));
    }
}

fn config() -> RunConfig {
    RunConfig::new(24, 7)
}

#[test]
fn every_property_passes_on_the_reference() {
    for p in Gemm::properties() {
        let o = check(&p, &Reference, &config());
        assert!(o.passed(), "{} failed on the reference: {o:?}", p.name);
    }
}

/// The reference, then `f` applied to every output.
struct Wrong {
    name: &'static str,
    f: fn(&GroupedGemmCase, &mut GemmOutputs),
}

impl Implementation<Gemm> for Wrong {
    fn name(&self) -> String {
        self.name.into()
    }
    fn is_model(&self) -> bool {
        true
    }
    fn precision(&self, case: &GroupedGemmCase) -> Precision {
        Implementation::<Gemm>::precision(&Reference, case)
    }
    fn run(&self, case: &GroupedGemmCase, passes: Passes) -> Result<GemmOutputs, RunError> {
        let mut o = Implementation::<Gemm>::run(&Reference, case, passes)?;
        (self.f)(case, &mut o);
        Ok(o)
    }
}

/// Adds garbage to every element (including the exact zeros): 8 units in the last place of the
/// output format, above the reference's own bound (one rounding to that format), and more to
/// rows past `Σ size_g`'s `dout` so that `drhs` depends on the tail.
fn add_garbage(case: &GroupedGemmCase, o: &mut GemmOutputs) {
    let u = case.out_dtype.info().unit_roundoff();
    let bump = |x: &mut f64| *x += x.abs() * 8.0 * u + 1e-30;
    o.out
        .iter_mut()
        .flat_map(|a| a.f64_mut().iter_mut())
        .for_each(bump);
    o.dlhs
        .iter_mut()
        .flat_map(|a| a.f64_mut().iter_mut())
        .for_each(bump);
    if let (Some(d), Some(dout)) = (o.drhs.as_mut(), case.dout.as_ref()) {
        let used = case.rows_used();
        let tail: f64 = dout
            .rows()
            .into_iter()
            .skip(used)
            .flatten()
            .map(|v| *v as f64)
            .sum();
        d.f64_mut()
            .iter_mut()
            .for_each(|x| *x += x.abs() * 8.0 * u + 1e-30 + tail);
    }
}

fn nan_tails(case: &GroupedGemmCase, o: &mut GemmOutputs) {
    let used = case.rows_used();
    for a in o.out.iter_mut().chain(o.dlhs.iter_mut()) {
        for ((r, _), v) in a.f64_mut().indexed_iter_mut() {
            if r >= used {
                *v = f64::NAN;
            }
        }
    }
}

fn failure<A>(o: Outcome<A>) -> (String, String) {
    match o {
        Outcome::Failed {
            reason,
            minimal_case,
            ..
        } => (reason, minimal_case),
        Outcome::Passed { .. } => panic!("expected a failure"),
        Outcome::NotApplicable { reason }
        | Outcome::NotRun { reason }
        | Outcome::Inconclusive { reason, .. } => panic!("expected a failure, got: {reason}"),
    }
}

#[test]
fn every_property_fails_on_garbage() {
    let imp = Wrong {
        name: "garbage",
        f: add_garbage,
    };
    for p in Gemm::properties() {
        let o = check(&p, &imp, &config());
        assert!(!o.passed(), "{} did not catch garbage", p.name);
        let (reason, minimal) = failure(o);
        assert!(!reason.is_empty() && !minimal.is_empty(), "{}", p.name);
        assert!(
            minimal.len() < 2000,
            "{}: minimal case too long: {minimal}",
            p.name
        );
    }
}

#[test]
fn nan_tails_are_caught() {
    let imp = Wrong {
        name: "nan-tails",
        f: nan_tails,
    };
    for name in [
        "fwd-matches-reference",
        "dgrad-matches-reference",
        "tail-contract",
    ] {
        let p = moecheck_properties::by_name(name).unwrap();
        let o = check(&p, &imp, &config());
        assert!(!o.passed(), "{name} did not catch NaN tails");
    }
    let p = moecheck_properties::by_name("wgrad-matches-reference").unwrap();
    assert!(check(&p, &imp, &config()).passed());
}

/// Tail rows (and empty experts' `drhs`) holding 1e-50 instead of exact zeros: far below
/// every output format's smallest subnormal, so only an exact `== 0` check catches it. (The
/// f32-output case, where such values used to pass, is `tests/cli.rs`'s
/// `exact_zeros_are_exact_in_float64_output_files`; here the precision is the reference's.)
fn tiny_zeros(case: &GroupedGemmCase, o: &mut GemmOutputs) {
    let used = case.rows_used();
    for a in o.out.iter_mut().chain(o.dlhs.iter_mut()) {
        for ((r, _), v) in a.f64_mut().indexed_iter_mut() {
            if r >= used {
                *v = 1e-50;
            }
        }
    }
    if let Some(d) = o.drhs.as_mut() {
        for (g, &size) in case.group_sizes.iter().enumerate() {
            if size == 0 {
                d.f64_mut().index_axis_mut(ndarray::Axis(0), g).fill(1e-50);
            }
        }
    }
}

#[test]
fn exact_zeros_are_exact() {
    let imp = Wrong {
        name: "tiny-zeros",
        f: tiny_zeros,
    };
    for name in [
        "fwd-matches-reference",
        "dgrad-matches-reference",
        "wgrad-matches-reference",
        "tail-contract",
        "empty-expert-wgrad-zero",
    ] {
        let p = moecheck_properties::by_name(name).unwrap();
        let (reason, _) = failure(check(&p, &imp, &config()));
        assert!(reason.contains("1e-50"), "{name}: {reason}");
    }
}

#[test]
fn checks_are_deterministic_for_a_seed() {
    let imp = Wrong {
        name: "garbage",
        f: add_garbage,
    };
    let p = moecheck_properties::by_name("fwd-matches-reference").unwrap();
    assert_eq!(check(&p, &imp, &config()), check(&p, &imp, &config()));
}

#[test]
fn run_errors_are_failures() {
    struct Broken;
    impl Implementation<Gemm> for Broken {
        fn name(&self) -> String {
            "broken".into()
        }
        fn is_model(&self) -> bool {
            true
        }
        fn precision(&self, case: &GroupedGemmCase) -> Precision {
            Implementation::<Gemm>::precision(&Reference, case)
        }
        fn run(&self, _: &GroupedGemmCase, _: Passes) -> Result<GemmOutputs, RunError> {
            Err(RunError::new("boom"))
        }
    }
    for p in Gemm::properties() {
        let (reason, _) = failure(check(&p, &Broken, &config()));
        assert!(reason.contains("boom"), "{}: {reason}", p.name);
    }
}

/// The strategies reach `N = 0` and f16 outputs, and f16-output cases stay finite in f16
/// (every reference value below 65504, so a correct kernel never overflows).
#[test]
fn strategies_reach_n_zero_and_finite_f16_outputs() {
    use moecheck_reference::format::Format;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let strategy = any_case();
    let (mut n_zero, mut f16_out) = (0, 0);
    for _ in 0..400 {
        let args = strategy.new_tree(&mut runner).unwrap().current();
        n_zero += usize::from(args.n == 0);
        if args.out_dtype == Format::F16 {
            f16_out += 1;
            let case = args.build();
            let o = Implementation::<Gemm>::run(&Reference, &case, Passes::ALL).unwrap();
            let arrays = [
                o.out.map(|a| a.into_f64().into_dyn()),
                o.dlhs.map(|a| a.into_f64().into_dyn()),
            ];
            let largest = arrays
                .into_iter()
                .flatten()
                .chain(o.drhs.map(|a| a.into_f64().into_dyn()))
                .flat_map(|a| a.into_iter())
                .fold(0.0f64, |m, v| m.max(v.abs()));
            // Rounded to f16, the largest finite output is 65504.
            assert!(
                largest.is_finite(),
                "f16 output overflows: {largest} in {args:?}"
            );
        }
    }
    assert!(n_zero > 0, "no N = 0 case in 400 draws");
    assert!(f16_out > 0, "no f16-output case in 400 draws");
}

/// Shrinking stops quietly at the step budget and the minimal case says so; with the default
/// budget the garbage implementation shrinks all the way (no note).
#[test]
fn shrink_budget_ends_shrinking_and_is_reported() {
    let imp = Wrong {
        name: "garbage",
        f: add_garbage,
    };
    let p = &Gemm::properties()[0];
    let tight = RunConfig {
        max_shrink_iters: 1,
        ..config()
    };
    let (_, minimal) = failure(check(p, &imp, &tight));
    assert!(
        minimal.ends_with("(shrinking stopped after 1 steps, the budget)"),
        "{minimal}"
    );
    let (_, minimal) = failure(check(p, &imp, &config()));
    assert!(!minimal.contains("shrinking stopped"), "{minimal}");
}

/// A failure hands back its minimal arguments: they print as the minimal case, fail the
/// property again, and a per-pass property writes its case asking for that pass only. The
/// observer hears of every passed case and shrink step, in order.
#[test]
fn a_failure_hands_back_its_minimal_arguments() {
    use moecheck_properties::{check_observed, Step};
    use moecheck_reference::gemm::Pass;
    let imp = Wrong {
        name: "garbage",
        f: add_garbage,
    };
    for p in Gemm::properties() {
        let mut steps = Vec::new();
        let outcome = check_observed(&p, &imp, &config(), &mut |s| steps.push(s));
        let Outcome::Failed {
            reason,
            minimal_case,
            minimal: Some(args),
            passed,
        } = outcome
        else {
            panic!("{} did not catch garbage with a minimal case", p.name);
        };
        assert_eq!(minimal_case, format!("{args:?}"), "{}", p.name);
        assert!((p.test)(&imp, &args) != moecheck_properties::CaseResult::Pass);
        let failed_at = steps.iter().position(|s| *s == Step::Failed).unwrap();
        assert_eq!(failed_at as u32, passed, "{}: {reason}", p.name);
        assert!(steps[failed_at + 1..]
            .iter()
            .enumerate()
            .all(|(i, s)| *s == Step::Shrunk(i as u32 + 1)));
        let (_, ask) = p.case_of(&args);
        let want = match p.name {
            "fwd-matches-reference" => Passes::only(Pass::Fwd),
            "dgrad-matches-reference" => Passes::only(Pass::Dgrad),
            "wgrad-matches-reference" | "empty-expert-wgrad-zero" => Passes::only(Pass::Wgrad),
            _ => Passes::ALL,
        };
        assert_eq!(ask, want, "{}", p.name);
    }
}
