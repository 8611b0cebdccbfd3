//! The grouped-GEMM properties: agreement with the f64 reference per pass, and the contract's
//! exact rules (tail rows, empty experts, `K = 0`) checked from the outputs themselves.

use moecheck_reference::gemm::{Gemm, GemmOutputs, GroupedGemmCase, OutArray2, Pass, Passes};
use moecheck_reference::op::Implementation;
use proptest::strategy::BoxedStrategy;

use super::strategies::{case_args, GemmArgs, Require};
use crate::property::{verified, Property, PropertyOp};
use crate::runner::CaseResult;

impl PropertyOp for Gemm {
    type Args = GemmArgs;

    fn properties() -> Vec<Property<Gemm>> {
        vec![
            Property {
                name: "fwd-matches-reference",
                description: "out is inside the error bound of the f64 reference, tails exactly 0",
                strategy: any,
                test: |imp, a| pass_matches(imp, a, Pass::Fwd),
                case: Some(|a| only(a, Pass::Fwd)),
            },
            Property {
                name: "dgrad-matches-reference",
                description: "dlhs is inside the error bound of the f64 reference, tails exactly 0",
                strategy: any,
                test: |imp, a| pass_matches(imp, a, Pass::Dgrad),
                case: Some(|a| only(a, Pass::Dgrad)),
            },
            Property {
                name: "wgrad-matches-reference",
                description: "drhs is inside the error bound of the f64 reference",
                strategy: any,
                test: |imp, a| pass_matches(imp, a, Pass::Wgrad),
                case: Some(|a| only(a, Pass::Wgrad)),
            },
            Property {
                name: "tail-contract",
                description:
                    "tail rows of out/dlhs are exactly 0 and tail dout does not change drhs",
                strategy: with_tail,
                test: |imp, a| tail_contract(imp, a).into(),
                case: None,
            },
            Property {
                name: "empty-expert-wgrad-zero",
                description: "drhs of every empty expert is exactly 0",
                strategy: with_empty_expert,
                test: |imp, a| empty_expert_wgrad_zero(imp, a).into(),
                case: Some(|a| only(a, Pass::Wgrad)),
            },
            Property {
                name: "k-zero",
                description: "with K = 0, out is exactly 0 and every pass matches the reference",
                strategy: k_zero,
                test: |imp, a| k_zero_test(imp, a).into(),
                case: None,
            },
        ]
    }

    fn case_of(args: &GemmArgs) -> (GroupedGemmCase, Passes) {
        (args.build(), Passes::ALL)
    }
}

fn any() -> BoxedStrategy<GemmArgs> {
    case_args(Require::default())
}
fn with_tail() -> BoxedStrategy<GemmArgs> {
    case_args(Require {
        tail: true,
        ..Require::default()
    })
}
fn with_empty_expert() -> BoxedStrategy<GemmArgs> {
    case_args(Require {
        empty_expert: true,
        nonempty_weights: true,
        ..Require::default()
    })
}
fn k_zero() -> BoxedStrategy<GemmArgs> {
    case_args(Require {
        k_zero: true,
        ..Require::default()
    })
}

type Imp<'a> = &'a dyn Implementation<Gemm>;

/// The case of `args` asking for `pass` only (what a per-pass property checks).
fn only(args: &GemmArgs, pass: Pass) -> (GroupedGemmCase, Passes) {
    (args.build(), Passes::only(pass))
}

fn pass_matches(imp: Imp, args: &GemmArgs, pass: Pass) -> CaseResult {
    let (case, ask) = only(args, pass);
    verified(imp, &case, ask).into()
}

fn run_all(imp: Imp, case: &GroupedGemmCase) -> Result<GemmOutputs, String> {
    imp.run(case, Passes::ALL)
        .map_err(|e| format!("run failed: {e}"))
}

/// `Err` naming the first element of rows `from..` of `a` that is not exactly 0.
fn rows_zero(what: &str, a: Option<&OutArray2>, from: usize) -> Result<(), String> {
    let a = a.ok_or_else(|| format!("the implementation returned no {what}"))?;
    for ((r, c), v) in a.f64().indexed_iter() {
        if r >= from && *v != 0.0 {
            return Err(format!(
                "{what}[{r}, {c}] = {v:e} in a tail row, want exactly 0"
            ));
        }
    }
    Ok(())
}

fn tail_contract(imp: Imp, args: &GemmArgs) -> Result<(), String> {
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
    let (a, b) = (a.f64(), b.f64());
    for (((g, k, n), x), y) in a.indexed_iter().zip(b.iter()) {
        if x.to_bits() != y.to_bits() {
            return Err(format!(
                "drhs[{g}, {k}, {n}] changed from {x:e} to {y:e} when only tail dout changed"
            ));
        }
    }
    Ok(())
}

fn empty_expert_wgrad_zero(imp: Imp, args: &GemmArgs) -> Result<(), String> {
    let (case, ask) = only(args, Pass::Wgrad);
    let out = imp
        .run(&case, ask)
        .map_err(|e| format!("run failed: {e}"))?;
    let drhs = out
        .drhs
        .ok_or("the implementation returned no drhs")?
        .into_f64();
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

fn k_zero_test(imp: Imp, args: &GemmArgs) -> Result<(), String> {
    let case = args.build();
    let out = run_all(imp, &case)?;
    rows_zero("out", out.out.as_ref(), 0)?;
    rows_zero("dlhs", out.dlhs.as_ref(), 0)?;
    verified(imp, &case, Passes::ALL)
}
