//! The FP8 properties hold for the recipe itself (the f64 [`Reference`] of [`Fp8Gemm`]), and
//! the FP8 strategies generate the edges they promise.

use moecheck_properties::fp8::fp8_case_args;
use moecheck_properties::{check, PropertyOp, RunConfig};
use moecheck_reference::fp8::{fp8_reference, quantize_operands, Fp8Gemm};
use moecheck_reference::gemm::Passes;
use moecheck_reference::op::Reference;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Generated FP8 cases are valid, and the recipe's own scales follow its definition:
    /// per scope `scale · amax` is within one f32 rounding of fp8_max, or 1 for a zero scope.
    #[test]
    fn generated_fp8_cases_are_valid(args in fp8_case_args(false)) {
        let case = args.build();
        prop_assert!(fp8_reference(&case, Passes::ALL).is_ok());
        let ops = quantize_operands(&case, Passes::ALL);
        for q in [&ops.lhs, &ops.rhs] {
            for (a, s) in q.amax.iter().zip(&q.scale) {
                if case.given_scales.is_some() {
                    continue;
                }
                if *a == 0.0 {
                    prop_assert_eq!(*s, 1.0);
                } else {
                    let r = (*a as f64) * (*s as f64) / 448.0;
                    prop_assert!((r - 1.0).abs() <= 2f64.powi(-23), "amax {} scale {}", a, s);
                }
            }
        }
    }
}

#[test]
fn every_fp8_property_holds_for_the_recipe_itself() {
    let config = RunConfig::new(24, 11);
    for p in Fp8Gemm::properties() {
        let out = check(&p, &Reference, &config);
        assert!(out.passed(), "{}: {out:?}", p.name);
    }
}

/// The block strategy's cases are valid and reach the edges it promises, in 300 seeded
/// draws: K shorter than a block, a K tail after full blocks, a non-empty group smaller than
/// a block, a group that is not a multiple of its block with rows after it, an empty group,
/// both block kinds, and every block size.
#[test]
fn block_cases_are_valid_and_reach_their_edges() {
    use moecheck_properties::fp8::{fp8_block_case_args, FP8_BLOCK_SIZES};
    use moecheck_reference::fp8::block_gemm::block_expected;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let strategy = fp8_block_case_args();
    let mut runner = TestRunner::deterministic();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..300 {
        let a = strategy.new_tree(&mut runner).unwrap().current();
        let case = a.build();
        assert!(case.recipe.has_block_scope() || a.k_ramp > 0);
        if case.recipe.has_block_scope() {
            block_expected(&case, Passes::ALL).unwrap();
        }
        let c = a.k_ramp;
        seen.insert(format!("block {c}"));
        let sizes = &a.group_sizes;
        let marks = [
            ("k shorter than a block", a.k < c),
            ("k tail after full blocks", a.k > c && a.k % c != 0),
            (
                "group smaller than a block",
                sizes.iter().any(|&s| s > 0 && s < c),
            ),
            (
                "group not a multiple of its block, rows after it",
                sizes.windows(2).any(|w| w[0] % c != 0 && w[1] > 0),
            ),
            ("empty group", sizes.contains(&0)),
            (
                "mx",
                format!("{:?}", case.recipe.lhs.scope).starts_with("mx:"),
            ),
            (
                "deepgemm",
                format!("{:?}", case.recipe.rhs.scope).starts_with("block:"),
            ),
        ];
        for (name, hit) in marks {
            if hit {
                seen.insert(name.to_string());
            }
        }
    }
    for c in FP8_BLOCK_SIZES {
        assert!(seen.contains(&format!("block {c}")), "{seen:?}");
    }
    assert_eq!(seen.len(), FP8_BLOCK_SIZES.len() + 7, "{seen:?}");
}
