//! The properties: each a named check of one implementation over generated cases.

use moecheck_reference::gemm::{GemmOutputs, GroupedGemmCase, Pass, Passes};
use moecheck_reference::implementation::{verify, GroupedGemm};
use proptest::strategy::{BoxedStrategy, Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::strategies::{case_args, CaseArgs, Require};

/// A property of a grouped-GEMM implementation.
#[derive(Clone, Copy)]
pub struct Property {
    /// Kebab-case name (`fwd-matches-reference`, …).
    pub name: &'static str,
    /// One line on what it checks.
    pub description: &'static str,
    /// The cases it runs on.
    pub strategy: fn() -> BoxedStrategy<CaseArgs>,
    /// The check of one case: `Err(reason)` when `imp` violates the property.
    pub test: fn(&dyn GroupedGemm, &CaseArgs) -> Result<(), String>,
}

impl std::fmt::Debug for Property {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Property")
            .field("name", &self.name)
            .finish()
    }
}

/// Every property, in a fixed order.
pub fn all() -> Vec<Property> {
    vec![
        Property {
            name: "fwd-matches-reference",
            description: "out is inside the error bound of the f64 reference, tails exactly 0",
            strategy: any,
            test: fwd_matches_reference,
        },
        Property {
            name: "dgrad-matches-reference",
            description: "dlhs is inside the error bound of the f64 reference, tails exactly 0",
            strategy: any,
            test: dgrad_matches_reference,
        },
        Property {
            name: "wgrad-matches-reference",
            description: "drhs is inside the error bound of the f64 reference",
            strategy: any,
            test: wgrad_matches_reference,
        },
        Property {
            name: "tail-contract",
            description: "tail rows of out/dlhs are exactly 0 and tail dout does not change drhs",
            strategy: with_tail,
            test: tail_contract,
        },
        Property {
            name: "empty-expert-wgrad-zero",
            description: "drhs of every empty expert is exactly 0",
            strategy: with_empty_expert,
            test: empty_expert_wgrad_zero,
        },
        Property {
            name: "k-zero",
            description: "with K = 0, out is exactly 0 and every pass matches the reference",
            strategy: k_zero,
            test: k_zero_test,
        },
    ]
}

/// The property called `name`.
pub fn by_name(name: &str) -> Option<Property> {
    all().into_iter().find(|p| p.name == name)
}

fn any() -> BoxedStrategy<CaseArgs> {
    case_args(Require::default())
}
fn with_tail() -> BoxedStrategy<CaseArgs> {
    case_args(Require {
        tail: true,
        ..Require::default()
    })
}
fn with_empty_expert() -> BoxedStrategy<CaseArgs> {
    case_args(Require {
        empty_expert: true,
        nonempty_weights: true,
        ..Require::default()
    })
}
fn k_zero() -> BoxedStrategy<CaseArgs> {
    case_args(Require {
        k_zero: true,
        ..Require::default()
    })
}

/// Verifies `passes` of `case` against the reference; the failure line on a miss.
pub fn verify_passes(
    imp: &dyn GroupedGemm,
    case: &GroupedGemmCase,
    passes: Passes,
) -> Result<(), String> {
    let v = verify(imp, case, passes).map_err(|e| format!("invalid generated case: {e}"))?;
    match v.failure() {
        None if v.passed() => Ok(()),
        None => Err("failed (no detail)".into()),
        Some(f) => Err(f),
    }
}

fn run_all(imp: &dyn GroupedGemm, case: &GroupedGemmCase) -> Result<GemmOutputs, String> {
    imp.run(case, Passes::ALL)
        .map_err(|e| format!("run failed: {e}"))
}

fn fwd_matches_reference(imp: &dyn GroupedGemm, args: &CaseArgs) -> Result<(), String> {
    verify_passes(imp, &args.build(), Passes::only(Pass::Fwd))
}
fn dgrad_matches_reference(imp: &dyn GroupedGemm, args: &CaseArgs) -> Result<(), String> {
    verify_passes(imp, &args.build(), Passes::only(Pass::Dgrad))
}
fn wgrad_matches_reference(imp: &dyn GroupedGemm, args: &CaseArgs) -> Result<(), String> {
    verify_passes(imp, &args.build(), Passes::only(Pass::Wgrad))
}

/// `Err` naming the first element of rows `from..` of `a` that is not exactly 0.
fn rows_zero(what: &str, a: Option<&ndarray::Array2<f64>>, from: usize) -> Result<(), String> {
    let a = a.ok_or_else(|| format!("the implementation returned no {what}"))?;
    for ((r, c), v) in a.indexed_iter() {
        if r >= from && *v != 0.0 {
            return Err(format!(
                "{what}[{r}, {c}] = {v:e} in a tail row, want exactly 0"
            ));
        }
    }
    Ok(())
}

fn tail_contract(imp: &dyn GroupedGemm, args: &CaseArgs) -> Result<(), String> {
    let case = args.build();
    let used = case.rows_used();
    let first = run_all(imp, &case)?;
    rows_zero("out", first.out.as_ref(), used)?;
    rows_zero("dlhs", first.dlhs.as_ref(), used)?;
    // Different, large tail dout: drhs must be bit-identical.
    let other = args.with_tail_dout(&case, |r, c| {
        let s = if (r + c) % 2 == 0 { 1.0 } else { -1.0 };
        s * (64.0 + ((r * 7 + c * 3) % 29) as f32)
    });
    let second = run_all(imp, &other)?;
    let (a, b) = match (&first.drhs, &second.drhs) {
        (Some(a), Some(b)) => (a, b),
        _ => return Err("the implementation returned no drhs".into()),
    };
    if a.shape() != b.shape() {
        return Err("drhs shape changed with tail dout".into());
    }
    for (((g, k, n), x), y) in a.indexed_iter().zip(b.iter()) {
        if x.to_bits() != y.to_bits() {
            return Err(format!(
                "drhs[{g}, {k}, {n}] changed from {x:e} to {y:e} when only tail dout changed"
            ));
        }
    }
    Ok(())
}

fn empty_expert_wgrad_zero(imp: &dyn GroupedGemm, args: &CaseArgs) -> Result<(), String> {
    let case = args.build();
    let out = imp
        .run(&case, Passes::only(Pass::Wgrad))
        .map_err(|e| format!("run failed: {e}"))?;
    let drhs = out.drhs.ok_or("the implementation returned no drhs")?;
    if drhs.shape() != [case.groups(), case.k(), case.n()] {
        return Err(format!("drhs has shape {:?}", drhs.shape()));
    }
    for (g, &size) in case.group_sizes.iter().enumerate() {
        if size != 0 {
            continue;
        }
        for ((k, n), v) in drhs.index_axis(ndarray::Axis(0), g).indexed_iter() {
            if *v != 0.0 {
                return Err(format!(
                    "expert {g} is empty but drhs[{g}, {k}, {n}] = {v:e}, want exactly 0"
                ));
            }
        }
    }
    Ok(())
}

fn k_zero_test(imp: &dyn GroupedGemm, args: &CaseArgs) -> Result<(), String> {
    let case = args.build();
    let out = run_all(imp, &case)?;
    rows_zero("out", out.out.as_ref(), 0)?;
    rows_zero("dlhs", out.dlhs.as_ref(), 0)?;
    verify_passes(imp, &case, Passes::ALL)
}

/// How many cases, from which seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunConfig {
    pub cases: u32,
    pub seed: u64,
    /// Most shrink steps after a failure (each step runs the property once). When they run
    /// out, [`check`] stops quietly and the minimal case says so; nothing goes to stderr
    /// (`tests/cli.rs` checks the selftest's stderr).
    pub max_shrink_iters: u32,
}

/// Cases when `PROPTEST_CASES` is not set.
pub const DEFAULT_CASES: u32 = 64;
/// Seed when none is given.
pub const DEFAULT_SEED: u64 = 0x6d6f_6563_6865_636b; // "moecheck"

impl RunConfig {
    pub fn new(cases: u32, seed: u64) -> RunConfig {
        RunConfig {
            cases,
            seed,
            max_shrink_iters: 1024,
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

/// The result of checking one property.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Passed {
        cases: u32,
    },
    Failed {
        reason: String,
        minimal_case: String,
    },
}

impl Outcome {
    pub fn passed(&self) -> bool {
        matches!(self, Outcome::Passed { .. })
    }
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

/// Checks `prop` on `config.cases` cases drawn deterministically from `config.seed`; a
/// failure is shrunk and reported with the minimal case.
///
/// Shrinking is proptest's own walk (`simplify` after a failing case, `complicate` after a
/// passing one), driven here rather than by `TestRunner::run` so that its step budget,
/// [`RunConfig::max_shrink_iters`], ends it silently: when the budget runs out the minimal
/// case says so, instead of proptest printing "Aborting shrinking" to stderr. A panic inside
/// the implementation counts as a failure of the case.
pub fn check(prop: &Property, imp: &dyn GroupedGemm, config: &RunConfig) -> Outcome {
    run_property(&(prop.strategy)(), |args| (prop.test)(imp, args), config)
}

/// A property's verdict on one case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaseResult {
    Pass,
    /// The implementation violates the property.
    Fail(String),
    /// The case cannot test the property (near a non-differentiable boundary, or lacking what
    /// the property needs): draw another. While shrinking, a rejected case counts as not failing.
    Reject(String),
}

/// Runs `test` on `config.cases` values drawn deterministically from `config.seed` and shrinks
/// the first failure within [`RunConfig::max_shrink_iters`] steps, silently (see [`check`]).
/// Every property family (grouped GEMM, FP8, routing, MoE layer) runs through this one loop.
pub fn run_property<A: std::fmt::Debug>(
    strategy: &BoxedStrategy<A>,
    test: impl Fn(&A) -> Result<(), String>,
    config: &RunConfig,
) -> Outcome {
    let test = |args: &A| match test(args) {
        Ok(()) => CaseResult::Pass,
        Err(reason) => CaseResult::Fail(reason),
    };
    run_property_with_rejects(strategy, test, config, 0)
}

/// [`run_property`] for properties that may reject a case: a rejected case is redrawn and does
/// not count; more than `max_rejects` rejections in all end the run as a failure ("aborted"),
/// so a property that rejects everything cannot pass vacuously.
pub fn run_property_with_rejects<A: std::fmt::Debug>(
    strategy: &BoxedStrategy<A>,
    test: impl Fn(&A) -> CaseResult,
    config: &RunConfig,
    max_rejects: u32,
) -> Outcome {
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes(config.seed));
    let cfg = Config {
        cases: config.cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(cfg, rng);
    let test = |args: &A| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(args))).unwrap_or_else(
            |panic| {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".into());
                CaseResult::Fail(format!("panicked: {msg}"))
            },
        )
    };
    let (mut passed, mut rejects) = (0u32, 0u32);
    while passed < config.cases {
        let mut tree = match strategy.new_tree(&mut runner) {
            Ok(tree) => tree,
            Err(reason) => {
                return Outcome::Failed {
                    reason: format!("aborted: {reason}"),
                    minimal_case: String::new(),
                }
            }
        };
        let mut reason = match test(&tree.current()) {
            CaseResult::Pass => {
                passed += 1;
                continue;
            }
            CaseResult::Reject(why) => {
                rejects += 1;
                if rejects > max_rejects {
                    return Outcome::Failed {
                        reason: format!(
                            "aborted: {rejects} cases rejected after {passed} passed (last: {why})"
                        ),
                        minimal_case: String::new(),
                    };
                }
                continue;
            }
            CaseResult::Fail(reason) => reason,
        };
        let mut minimal = tree.current();
        let mut steps = 0u32;
        let mut more = tree.simplify();
        while more {
            if steps >= config.max_shrink_iters {
                return Outcome::Failed {
                    reason,
                    minimal_case: format!(
                        "{minimal:?} (shrinking stopped after {steps} steps, the budget)"
                    ),
                };
            }
            steps += 1;
            match test(&tree.current()) {
                CaseResult::Fail(r) => {
                    (reason, minimal) = (r, tree.current());
                    more = tree.simplify();
                }
                CaseResult::Pass | CaseResult::Reject(_) => more = tree.complicate(),
            }
        }
        return Outcome::Failed {
            reason,
            minimal_case: format!("{minimal:?}"),
        };
    }
    Outcome::Passed {
        cases: config.cases,
    }
}

/// Makes the strategy type nameable for callers that want to run a property themselves.
pub fn strategy_of(prop: &Property) -> impl Strategy<Value = CaseArgs> {
    (prop.strategy)()
}
