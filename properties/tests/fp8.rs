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
